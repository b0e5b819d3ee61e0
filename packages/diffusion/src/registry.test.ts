// The pipeline registry and Krea 2's row on random-weight checkpoints (no fixtures needed): lookups by
// the DiT file's tensors, the row's generate against generateKrea2 called by hand on the same files,
// encode / decode, and device conditioning (upload, read, zeros, errors).
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CpuBackend } from "@tp/backend-cpu";
import { isTpError } from "@tp/tensor";
import { Conditioning } from "./conditioning.ts";
import { loadKrea2 } from "./models/krea2.ts";
import { loadWanVae } from "./models/wan-vae.ts";
import type { GenerateEvent } from "./pipeline.ts";
import { readConditioning, writeConditioning } from "./pipelines/files.ts";
import { generateKrea2, krea2Parameters } from "./pipelines/krea2.ts";
import { KREA2_PIPELINE } from "./pipelines/krea2-pipeline.ts";
import { PIPELINES, pipelineForCheckpoint, pipelineForComponent } from "./registry.ts";
import {
  randomConditioning,
  TINY_KREA2_CONFIG,
  writeRandomKrea2Dit,
  writeRandomWanVae,
} from "./testing/random-checkpoints.ts";
import { TINY_KREA2_TEXT_CONFIG, writeRandomQwen3VlText } from "./testing/random-text-encoder.ts";

const tmp = mkdtempSync(join(tmpdir(), "tp-diffusion-registry-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));
const dit = join(tmp, "dit.safetensors");
const vae = join(tmp, "vae.safetensors");
const te = join(tmp, "te.safetensors");
const cond = join(tmp, "cond.safetensors");
writeRandomKrea2Dit(dit, TINY_KREA2_CONFIG, { seed: 1 });
writeRandomWanVae(vae, undefined, { seed: 2 });
writeRandomQwen3VlText(te, TINY_KREA2_TEXT_CONFIG, { seed: 3 });
writeConditioning(cond, { positive: randomConditioning(4, 960, 3) }, { prompt: "saved prompt" });

async function errorOf(f: () => unknown): Promise<string> {
  try {
    await f();
  } catch (e) {
    if (isTpError(e)) return `${e.code}: ${e.message}`;
    throw e;
  }
  return "no error";
}

/** A test body run on a fresh one-thread cpu backend, disposed after it whatever it does. */
function onCpu(body: (backend: CpuBackend) => Promise<void>): () => Promise<void> {
  return async () => {
    const backend = new CpuBackend({ threads: 1 });
    try {
      await body(backend);
    } finally {
      backend.dispose();
    }
  };
}

describe("the registry", () => {
  test("the DiT's tensors pick the row; other files are E_FORMAT saying what they are", async () => {
    expect(PIPELINES.map((p) => p.id)).toEqual(["krea2", "qwen-image"]);
    expect(pipelineForCheckpoint(dit)).toBe(KREA2_PIPELINE);
    expect(await errorOf(() => pipelineForCheckpoint(vae))).toStartWith(
      `E_FORMAT: ${vae} is not a Krea 2 DiT (no blocks.0.mod.lin + txtfusion.projector.weight) or Qwen-Image-2.1 transformer (no img_in.weight + modulation.1.weight): it looks like a Wan 2.1-family VAE`,
    );
    expect(await errorOf(() => pipelineForCheckpoint(cond))).toStartWith(
      `E_FORMAT: ${cond} is not a Krea 2 DiT or Qwen-Image-2.1 transformer: unknown checkpoint layout`,
    );
    expect(await errorOf(() => pipelineForCheckpoint(join(tmp, "none.safetensors")))).toStartWith("E_IO");
    expect(pipelineForComponent(vae, "vae")).toBe(KREA2_PIPELINE);
    expect(pipelineForComponent(te, "textEncoder")).toBe(KREA2_PIPELINE);
    expect(pipelineForComponent(cond, "vae")).toBe(KREA2_PIPELINE); // the default row's loader reports it
  });

  test("Krea 2's defaults and limits are the pipeline's constants", () => {
    const p = KREA2_PIPELINE;
    expect(p.defaults).toMatchObject({ width: 1024, height: 1024, steps: 8, cfg: 1, seed: 0, shift: 1.15 });
    expect(p.limits).toMatchObject({ minSize: 16, maxSize: 16384, sizeMultiple: 8, maxSteps: 1000 });
    expect(p.limits.maxShift("simple")).toBeCloseTo(Math.log(3.4028234663852886e38), 10);
    expect(p.limits.maxShift("auraflow")).toBe(3.4028234663852886e38);
  });
});

describe("Krea 2's row", () => {
  test(
    "generate from files = generateKrea2 by hand; events in order; conditioning kept; nothing leaks",
    onCpu(async (backend) => {
      const before = backend.memory.current;
      const events: GenerateEvent["kind"][] = [];
      const r = await KREA2_PIPELINE.generate(
        {
          files: { dit, vae, condIn: cond },
          backend,
          width: 50,
          height: 33,
          steps: 2,
          cfg: 2.5,
          seed: 7n,
          keepConditioning: true,
        },
        (e) => events.push(e.kind),
      );
      expect(backend.memory.current).toBe(before);
      expect(events).toEqual(["notice", "start", "step", "step"]);
      expect(r.timings.map(([stage]) => stage)).toEqual([
        "conditioning",
        "load",
        "text",
        "sampling",
        "decode",
      ]);
      expect([r.width, r.height]).toEqual([48, 32]);
      expect(r.conditioning?.positive).toEqual(readConditioning(cond).positive);
      expect(r.conditioning?.negative).toBeUndefined(); // the zeroed negative is not saved
      expect(r.conditioning?.metadata).toEqual({ prompt: "saved prompt" });

      using m = loadKrea2(dit, { backend });
      using v = loadWanVae(backend, vae);
      const ref = await generateKrea2({
        dit: m,
        vae: v,
        conditioning: { positive: readConditioning(cond).positive },
        width: 48,
        height: 32,
        steps: 2,
        cfg: 2.5,
        seed: 7n,
      });
      expect(r.rgb).toEqual(ref.rgb);
      expect(r.latent.data).toEqual(ref.latent);
      expect(r.text.parameters).toBe(
        krea2Parameters({
          prompt: "saved prompt",
          steps: 2,
          cfg: 2.5,
          seed: 7n,
          width: 48,
          height: 32,
          shift: 1.15,
          schedule: "simple",
          negativeMode: "zero",
          model: "dit",
          vae: "vae",
        }),
      );
      expect(JSON.parse(r.text.tensorpencil)).toMatchObject({
        seed: "7",
        negative: "zero",
        conditioning: "cond.safetensors",
      });

      // decode of the saved latent gives the same image; encode gives what generate would use
      const d = await KREA2_PIPELINE.decode({ vae, backend, latent: r.latent });
      expect(d.rgb).toEqual(r.rgb);
      const c = await KREA2_PIPELINE.encode({ textEncoder: te, backend, prompt: "a red kite", negative: "" });
      expect(c.positive.shape[2]).toBe(960);
      expect(c.negative?.shape).toEqual([1, 5, 960]);
      expect(c.metadata).toMatchObject({
        prompt: "a red kite",
        negative_prompt: "",
        text_encoder: "te.safetensors",
      });
    }),
    60_000,
  );

  test(
    "load keeps the networks resident: each image equals the one-shot generate's; dispose frees all",
    onCpu(async (backend) => {
      const before = backend.memory.current;
      const settings = { width: 32, height: 32, steps: 2, cfg: 2, seed: 3n } as const;
      const oneShot = await KREA2_PIPELINE.generate({
        files: { dit, vae, textEncoder: te },
        backend,
        prompt: "a red kite",
        negative: "fog",
        ...settings,
      });
      const saved = await KREA2_PIPELINE.generate({
        files: { dit, vae, condIn: cond },
        backend,
        ...settings,
      });
      using loaded = KREA2_PIPELINE.load({ files: { dit, vae, textEncoder: te }, backend });
      const resident = backend.memory.current;
      for (let i = 0; i < 2; i++) {
        const a = await loaded.generate({ prompt: "a red kite", negative: "fog", ...settings });
        expect(a.rgb).toEqual(oneShot.rgb);
        expect(a.text).toEqual(oneShot.text);
        const b = await loaded.generate({ condIn: cond, ...settings });
        expect(b.rgb).toEqual(saved.rgb);
        expect(backend.memory.current).toBe(resident); // nothing but the networks stays
      }
      loaded.dispose();
      expect(backend.memory.current).toBe(before);
      using noEncoder = KREA2_PIPELINE.load({ files: { dit, vae }, backend });
      expect(await errorOf(() => noEncoder.generate({ prompt: "p", ...settings }))).toStartWith(
        "E_ARG: missing --text-encoder",
      );
    }),
    60_000,
  );

  test(
    "errors before any work: a text encoder that does not fit, no text encoder, a negative nobody encodes",
    onCpu(async (backend) => {
      const wide = join(tmp, "te-64.safetensors");
      writeRandomQwen3VlText(wide, { ...TINY_KREA2_TEXT_CONFIG, hidden_size: 64 }, { seed: 5 });
      const run = (o: object) => () =>
        KREA2_PIPELINE.generate({ files: { dit, vae }, backend, prompt: "p", width: 32, height: 32, ...o });
      expect(await errorOf(run({ files: { dit, vae, textEncoder: wide } }))).toBe(
        `E_SHAPE: the text encoder ${wide} gives conditioning 12×64 = 768 wide; the DiT ${dit} takes 12×80 = 960: pass the text encoder that belongs to this DiT`,
      );
      expect(await errorOf(run({}))).toStartWith("E_ARG: missing --text-encoder");
      expect(await errorOf(run({ files: { dit, vae, condIn: cond }, cfg: 2, negative: "x" }))).toStartWith(
        "E_ARG: --negative needs --text-encoder F (to encode it) or a 'negative' tensor in --cond-in",
      );
      expect(await errorOf(run({ files: { dit, vae, condIn: cond }, ditMode: "fast" }))).toBe(
        "E_ARG: unknown DiT mode 'fast'; expected one of: native, upcast, dequant",
      );
      expect(backend.memory.current).toBe(0);
    }),
    60_000,
  );
});

describe("preview", () => {
  test(
    "with preview, each step event carries its x0 estimate; the last one is the final latent (σ_last = 0)",
    onCpu(async (backend) => {
      const before = backend.memory.current;
      const steps: Extract<GenerateEvent, { kind: "step" }>[] = [];
      const settings = { width: 48, height: 32, steps: 3, cfg: 1, seed: 5n };
      await KREA2_PIPELINE.generate(
        { files: { dit, vae, condIn: cond }, backend, ...settings, preview: true },
        (e) => {
          if (e.kind === "step") steps.push(e);
        },
      );
      expect(backend.memory.current).toBe(before);
      expect(steps.map((e) => [e.step, e.denoised?.shape])).toEqual(
        [1, 2, 3].map((k) => [k, [1, 16, 1, 4, 6]]),
      );
      using m = loadKrea2(dit, { backend });
      using v = loadWanVae(backend, vae);
      const ref = await generateKrea2({
        dit: m,
        vae: v,
        conditioning: { positive: readConditioning(cond).positive },
        ...settings,
      });
      // x_final = x + (x − den)·f32(1/σ)·(0 − σ): den up to a few f32 roundings of |x − den|
      const last = steps[2]?.denoised?.data as Float32Array;
      let err = 0;
      let scale = 0;
      for (let i = 0; i < last.length; i++) {
        err = Math.max(err, Math.abs((last[i] as number) - (ref.modelLatent[i] as number)));
        scale = Math.max(scale, Math.abs(ref.modelLatent[i] as number));
      }
      expect(err / scale).toBeLessThan(1e-5);
      // without preview nothing is read back
      const plain: GenerateEvent[] = [];
      await KREA2_PIPELINE.generate({ files: { dit, vae, condIn: cond }, backend, ...settings }, (e) =>
        plain.push(e),
      );
      expect(plain.filter((e) => e.kind === "step" && e.denoised !== undefined)).toEqual([]);
    }),
    60_000,
  );
});

describe("device conditioning", () => {
  test(
    "upload, read, zeros and dispose; wrong shapes are E_SHAPE",
    onCpu(async (backend) => {
      const host = randomConditioning(3, 8, 1);
      const c = Conditioning.upload(backend, host);
      expect(c.shape).toEqual([1, 3, 8]);
      expect(c.backend).toBe(backend);
      expect(await c.read()).toEqual(host);
      using z = c.zeros();
      expect((await z.read()).data).toEqual(new Float32Array(24));
      c.dispose();
      c.dispose(); // a second dispose is a no-op
      expect(backend.memory.current).toBe(24 * 4);
      expect(
        await errorOf(() => Conditioning.upload(backend, { data: new Float32Array(5), shape: [1, 2, 3] })),
      ).toBe("E_SHAPE: conditioning: 5 values for shape [1, 2, 3]");
      using flat = backend.upload(new Float32Array(6), [2, 3], "f32");
      expect(await errorOf(() => new Conditioning(flat))).toBe(
        "E_SHAPE: conditioning must be f32 [1, seq, width], got f32 [2, 3]",
      );
    }),
  );
});
