// The Krea 2 pipeline end to end against ComfyUI's KSampler run in
// ../shared/testdata/krea2-tiny/sampling/turbo_cfg1 (tiny bf16 DiT run in fp32, context_pos.bin, seed 42
// noise of torch's scalar kernel, 4 Euler steps, cfg 1, 128×96, the tiny Wan 2.1 VAE): every step's
// state, the final latent in both spaces and the 8-bit image. Then CFG (zeroed and text negatives, checked
// against DiT calls made by hand), sizes, settings errors, the conditioning / latent files and the
// parameters text. CPU backend.
//
// Error measure: max |ours − ref| / max |ref| over the tensor.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CpuBackend } from "@tp/backend-cpu";
import { isTpError } from "@tp/tensor";
import type { HostConditioning } from "../conditioning.ts";
import { loadKrea2, readKrea2DitConfig } from "../models/krea2.ts";
import {
  KREA2_MAX_TEXT_TOKENS,
  loadKrea2TextEncoder,
  readKrea2TextEncoderWidth,
} from "../models/krea2-text.ts";
import { loadWanVae } from "../models/wan-vae.ts";
import { randn } from "../noise.ts";
import { AURAFLOW_MAX_SHIFT, FLUX_MAX_SHIFT, krea2Sigmas } from "../schedule.ts";
import { expectComfyRun, KREA2_TINY, readF32, relErr, TURBO_CFG1 } from "../testing/fixtures.ts";
import { TINY_KREA2_TEXT_CONFIG, writeRandomQwen3VlText } from "../testing/random-text-encoder.ts";
import {
  CONDITIONING_FORMAT,
  readConditioning,
  readLatent,
  writeConditioning,
  writeLatent,
} from "./files.ts";
import {
  checkKrea2Conditioning,
  checkKrea2Latent,
  decodeKrea2Latent,
  generateKrea2,
  KREA2_DEFAULTS,
  type Krea2GenerateOptions,
  krea2MaxShift,
  krea2Parameters,
  krea2Size,
} from "./krea2.ts";

/**
 * Latents vs ComfyUI: the DiT alone is within ~1e-6 of torch per forward (models/krea2.test.ts), the
 * loop multiplies by 1/σ instead of dividing (sampler.test.ts); 4 steps compound both. Measured 3.2e-7
 * (model space) and 2.9e-7 (VAE space); every step's state ≤ 3.2e-7.
 */
const LATENT_TOL = 1e-5;
/**
 * 8-bit image: truncation turns a 1e-7 difference into one level where a value sits on a boundary.
 * Measured: 1 byte of 36,864 off by one.
 */
const MAX_BYTES_OFF_BY_ONE = 8;
/** CFG vs the same arithmetic done by hand from DiT calls: same ops in the same order. */
const CFG_TOL = 1e-6;

const DIR = KREA2_TINY; // ../shared/testdata/krea2-tiny beside the repository root
const RUN = join(DIR, "sampling/turbo_cfg1");
const DIT = join(DIR, "checkpoints/krea2_tiny_bf16.safetensors");
const VAE = join(DIR, "checkpoints/wan21_vae_tiny_f32.safetensors");
const needed = [DIT, VAE, join(RUN, "context_pos.bin"), join(RUN, "decoded_image01.bin")];
const missing = needed.filter((p) => !existsSync(p));
const skip = missing.length > 0;
const note = skip ? ` [skipped: shared fixture missing: ${missing.join(", ")}]` : "";

const tmp = mkdtempSync(join(tmpdir(), "tp-krea2-pipeline-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

async function errorOf(f: () => unknown): Promise<string> {
  try {
    await f();
  } catch (e) {
    return isTpError(e) ? `${e.code}: ${e.message}` : `not a TpError: ${String(e)}`;
  }
  return "ok";
}

/** The fixture's positive conditioning [1, 7, 960]. */
const contextPos = (): HostConditioning => ({
  data: readF32(join(RUN, "context_pos.bin")),
  shape: [1, 7, 960],
});

/** Load the fixture models on a fresh 2-thread CPU backend. */
function models(mode: "upcast" | "native" = "upcast") {
  const b = new CpuBackend({ threads: 2 });
  const dit = loadKrea2(DIT, { backend: b, mode });
  const vae = loadWanVae(b, VAE);
  return {
    b,
    dit,
    vae,
    close() {
      dit.dispose();
      vae.dispose();
      expect(b.memory.current).toBe(0); // nothing left behind
      b.dispose();
    },
  };
}

describe(`Krea 2 pipeline vs ComfyUI turbo_cfg1${note}`, () => {
  test.skipIf(skip)("every step, the final latent in both spaces, and the 8-bit image", async () => {
    const m = models("upcast"); // bf16 weights upcast, fp32 compute: ComfyUI on the CPU
    const states: Float32Array[] = [];
    const steps: number[] = [];
    const r = await generateKrea2({
      dit: m.dit,
      vae: m.vae,
      conditioning: { positive: contextPos() },
      ...TURBO_CFG1,
      onStep: async (s) => {
        steps.push(s.step);
        expect(s.stepMs).toBeGreaterThan(0);
        states.push((await m.b.read(s.x)) as Float32Array);
      },
    });
    expect(steps).toEqual([0, 1, 2, 3]);
    expect(r.latentShape).toEqual([1, 16, 1, 12, 16]);
    expect([r.width, r.height, r.rgb.length]).toEqual([128, 96, 128 * 96 * 3]);
    expectComfyRun(RUN, r, states, { latent: LATENT_TOL, bytesOffByOne: MAX_BYTES_OFF_BY_ONE });
    expect(r.settings).toEqual({
      steps: 4,
      cfg: 1,
      seed: 42n,
      shift: 1.15,
      schedule: "simple",
      negative: "none",
    });
    expect(r.timings.stepMs.length).toBe(4);
    expect(r.notice).toBeUndefined();
    // decode of the saved VAE-space latent gives the same bytes
    const again = await decodeKrea2Latent(m.vae, { data: r.latent, shape: r.latentShape });
    expect(again.rgb).toEqual(r.rgb);
    m.close();
  });

  test.skipIf(skip)("the native mode (bf16 activations) stays close", async () => {
    const m = models("native");
    const r = await generateKrea2({
      dit: m.dit,
      vae: m.vae,
      conditioning: { positive: contextPos() },
      ...TURBO_CFG1,
    });
    // x rounded to bf16 before each bf16 matmul (measured 1.5e-3)
    expect(relErr(r.modelLatent, readF32(join(RUN, "final_latent_model_space.bin")))).toBeLessThanOrEqual(
      1e-2,
    );
    m.close();
  });

  test.skipIf(skip)(
    "CFG: zeroed negative (default), text negative of another length, cfg 1 skips it",
    async () => {
      const m = models("upcast");
      const pos = contextPos();
      const run = (steps: number, cfg: number, conditioning: Krea2GenerateOptions["conditioning"]) =>
        generateKrea2({ dit: m.dit, vae: m.vae, width: 32, height: 40, seed: 5n, steps, cfg, conditioning });
      // One step from σ = 1 to 0 gives x = den exactly, so the result is the CFG mix itself.
      const neg: HostConditioning = { data: pos.data.slice(0, 3 * 960).map((v) => -v), shape: [1, 3, 960] };
      const byHand = async (negative: HostConditioning, cfg: number): Promise<Float32Array> => {
        const b = m.b;
        const x = b.upload(randn(5, [1, 16, 1, 5, 4]), [1, 16, 1, 5, 4], "f32");
        const v = async (c: HostConditioning) => {
          const ctx = b.upload(c.data, [...c.shape], "f32");
          const out = m.dit.forward(x, 1, ctx);
          const host = (await b.read(out)) as Float32Array;
          b.free(out);
          b.free(ctx);
          return host;
        };
        const vc = await v(pos);
        const vu = await v(negative);
        const xs = (await b.read(x)) as Float32Array;
        b.free(x);
        const f = Math.fround;
        return xs.map((xi, i) => {
          const dc = f(xi - f(vc[i] as number)); // den = x − v·σ, σ = 1
          const du = f(xi - f(vu[i] as number));
          const den = f(du + f(f(dc - du) * f(cfg)));
          return f(xi + f(f(f(xi - den) * 1) * -1)); // x + (x − den)/σ · (0 − σ)
        });
      };
      const zero = await run(1, 3, { positive: pos });
      expect(zero.settings.negative).toBe("zero");
      const zeros: HostConditioning = { data: new Float32Array(pos.data.length), shape: pos.shape };
      expect(relErr(zero.modelLatent, await byHand(zeros, 3))).toBeLessThanOrEqual(CFG_TOL);
      const text = await run(1, 3, { positive: pos, negative: neg });
      expect(text.settings.negative).toBe("text");
      expect(relErr(text.modelLatent, await byHand(neg, 3))).toBeLessThanOrEqual(CFG_TOL);
      // cfg 1: the negative is not used at all
      const a = await run(2, 1, { positive: pos, negative: neg });
      const c = await run(2, 1, { positive: pos });
      expect(a.settings.negative).toBe("none");
      expect(a.rgb).toEqual(c.rgb);
      m.close();
    },
  );

  test.skipIf(skip)(
    "sizes round down to multiples of 8 (odd latents pad inside the DiT); AuraFlow",
    async () => {
      const m = models("upcast");
      const r = await generateKrea2({
        dit: m.dit,
        vae: m.vae,
        conditioning: { positive: contextPos() },
        width: 45,
        height: 63,
        steps: 2,
        schedule: "auraflow",
      });
      expect([r.width, r.height]).toEqual([40, 56]);
      expect(r.latentShape).toEqual([1, 16, 1, 7, 5]);
      expect(r.notice).toBe(
        "size 45x63 is not a multiple of 8: generating 40x56 (latent 5x7), as ComfyUI does",
      );
      expect(Array.from(r.sigmas)).toEqual(Array.from(krea2Sigmas(2, { sampling: "auraflow", shift: 1.15 })));
      expect(r.settings.seed).toBe(0n);
      m.close();
    },
  );

  test.skipIf(skip)("errors: conditioning that does not fit, bad settings; nothing leaks", async () => {
    const m = models("upcast");
    const pos = contextPos();
    const run = (o: object) => () =>
      generateKrea2({ dit: m.dit, vae: m.vae, conditioning: { positive: pos }, width: 32, height: 32, ...o });
    expect(
      await errorOf(
        run({ conditioning: { positive: { data: new Float32Array(7 * 192), shape: [1, 7, 192] } } }),
      ),
    ).toBe(
      "E_SHAPE: the positive conditioning is [1, 7, 192]; this DiT takes [1, seq ≥ 1, 12×80 = 960] (12 tapped text-encoder layers of width 80)",
    );
    expect(
      await errorOf(
        run({
          cfg: 2,
          conditioning: { positive: pos, negative: { data: new Float32Array(5), shape: [1, 1, 5] } },
        }),
      ),
    ).toStartWith("E_SHAPE: the negative conditioning is [1, 1, 5]");
    expect(await errorOf(run({ steps: 0 }))).toBe("E_ARG: steps must be an integer from 1 to 1000, got 0");
    expect(await errorOf(run({ steps: 1001 }))).toBe(
      "E_ARG: steps must be an integer from 1 to 1000, got 1001",
    );
    expect(await errorOf(run({ cfg: Number.NaN }))).toBe("E_ARG: cfg must be a finite number, got NaN");
    expect(await errorOf(run({ shift: 0 }))).toBe(
      "E_ARG: shift must be a positive number up to 88.72283905206835 for the simple schedule, got 0",
    );
    // e^89 overflows float32 (the sigmas would be NaN); AuraFlow takes shifts up to the f32 maximum.
    expect(await errorOf(run({ shift: 89 }))).toBe(
      "E_ARG: shift must be a positive number up to 88.72283905206835 for the simple schedule, got 89",
    );
    expect(await errorOf(run({ shift: 4e38, schedule: "auraflow" }))).toBe(
      "E_ARG: shift must be a positive number up to 3.4028234663852886e+38 for the auraflow schedule, got 4e+38",
    );
    expect(await errorOf(run({ schedule: "karras" }))).toBe(
      "E_ARG: unknown schedule 'karras'; expected one of: simple, auraflow",
    );
    expect(await errorOf(run({ seed: -1 }))).toBe("E_ARG: seed must be an integer in [0, 2^64), got -1");
    expect(await errorOf(run({ width: 8 }))).toBe(
      "E_UNSUPPORTED: width 8 is outside the sizes Krea 2 runs at (16 to 16384 pixels per side)",
    );
    expect(
      await errorOf(() =>
        decodeKrea2Latent(m.vae, { data: new Float32Array(4 * 16), shape: [1, 4, 1, 4, 4] }),
      ),
    ).toBe(
      "E_SHAPE: the latent is [1, 4, 1, 4, 4]; Krea 2 decodes [1, 16, 1, h, w] f32 with h and w from 2 to 2048 (images of 16 to 16384 pixels per side)",
    );
    expect(
      await errorOf(() =>
        decodeKrea2Latent(m.vae, { data: new Float32Array(16 * 2100), shape: [1, 16, 1, 1, 2100] }),
      ),
    ).toStartWith("E_SHAPE: the latent is [1, 16, 1, 1, 2100]; Krea 2 decodes");
    m.close();
  });
});

describe("Krea 2 pipeline pieces (no fixtures needed)", () => {
  test("the text encoder's width from its tensor shapes; too many prompt tokens fail before encoding", async () => {
    const te = join(tmp, "te-random.safetensors");
    writeRandomQwen3VlText(te, TINY_KREA2_TEXT_CONFIG, { seed: 4 });
    expect(readKrea2TextEncoderWidth(te)).toEqual({ taps: 12, hidden: 80, width: 960 });
    const notTe = join(tmp, "not-te.safetensors");
    writeLatent(notTe, { data: new Float32Array(64), shape: [1, 16, 1, 2, 2] });
    expect(await errorOf(() => readKrea2TextEncoderWidth(notTe))).toStartWith(
      `E_FORMAT: ${notTe} is not a Qwen3-VL text encoder`,
    );
    expect(await errorOf(() => readKrea2DitConfig(notTe))).toStartWith(
      `E_FORMAT: ${notTe} is not a Krea 2 DiT`,
    );
    const backend = new CpuBackend({ threads: 1 });
    const encoder = loadKrea2TextEncoder(te, { backend });
    try {
      const ids = encoder.ids("a cat");
      const long = [...ids.slice(0, 34), ...new Array(KREA2_MAX_TEXT_TOKENS).fill(64), ...ids.slice(-5)];
      expect(await errorOf(() => encoder.encodeIds(long))).toBe(
        `E_ARG: the prompt is ${KREA2_MAX_TEXT_TOKENS + 5} tokens in Krea 2's template; Krea 2 runs take at most ${KREA2_MAX_TEXT_TOKENS}`,
      );
    } finally {
      encoder.dispose();
      backend.dispose();
    }
  });

  test("limits: latent shapes, conditioning tokens, shifts per schedule", async () => {
    for (const shape of [
      [1, 16, 1, 1, 2100], // 8 × 16800 pixels
      [1, 16, 1, 0, 8], // empty
      [1, 16, 1, 2, 2049], // 16392 pixels wide
      [1, 16, 2, 2, 2], // two frames
      [1, 12, 1, 2, 2], // not 16 channels
      [16, 2, 2], // rank 3
    ]) {
      expect(
        await errorOf(() => checkKrea2Latent(shape, undefined, { file: "z.safetensors", tensor: "latent" })),
      ).toBe(
        `E_SHAPE: the latent is [${shape.join(", ")}]; Krea 2 decodes [1, 16, 1, h, w] f32 with h and w from 2 to 2048 (images of 16 to 16384 pixels per side) (file z.safetensors, tensor latent)`,
      );
    }
    checkKrea2Latent([1, 16, 1, 2, 2048], 16 * 4096);
    checkKrea2Latent([1, 16, 2, 2], 64);
    expect(await errorOf(() => checkKrea2Latent([1, 16, 1, 2, 2], 3))).toBe(
      "E_SHAPE: the latent holds 3 values, not [1, 16, 1, 2, 2]",
    );
    // readLatent refuses a latent of another size before reading its data, naming file and tensor.
    const big = join(tmp, "latent-big.safetensors");
    writeLatent(big, { data: new Float32Array(16 * 2100), shape: [1, 16, 1, 1, 2100] });
    expect(await errorOf(() => readLatent(big))).toBe(
      `E_SHAPE: the latent is [1, 16, 1, 1, 2100]; Krea 2 decodes [1, 16, 1, h, w] f32 with h and w from 2 to 2048 (images of 16 to 16384 pixels per side) (file ${big}, tensor latent)`,
    );

    const dit = { config: { txtlayers: 12, txtdim: 4 } };
    const cond = (seq: number): HostConditioning => ({
      data: new Float32Array(seq * 48),
      shape: [1, seq, 48],
    });
    checkKrea2Conditioning(cond(KREA2_MAX_TEXT_TOKENS), dit);
    expect(
      await errorOf(() => checkKrea2Conditioning(cond(KREA2_MAX_TEXT_TOKENS + 1), dit, "the positive")),
    ).toBe(
      `E_SHAPE: the positive conditioning has ${KREA2_MAX_TEXT_TOKENS + 1} tokens; Krea 2 runs take at most ${KREA2_MAX_TEXT_TOKENS}`,
    );

    // The flux table's e^μ is finite in float32 up to ln(f32 max); beyond it ComfyUI's table is NaN.
    expect(krea2MaxShift("simple")).toBe(FLUX_MAX_SHIFT);
    expect(krea2MaxShift("auraflow")).toBe(AURAFLOW_MAX_SHIFT);
    expect(Number.isFinite(Math.fround(Math.exp(FLUX_MAX_SHIFT)))).toBe(true);
    expect(Math.fround(Math.exp(FLUX_MAX_SHIFT + 1e-6))).toBe(Number.POSITIVE_INFINITY);
    for (const s of krea2Sigmas(8, { shift: FLUX_MAX_SHIFT })) expect(Number.isNaN(s)).toBe(false);
    expect(await errorOf(() => krea2Sigmas(8, { shift: 89 }))).toStartWith(
      "E_ARG: fluxSigmaTable: shift 89 is above 88.72283905206835",
    );
    for (const s of krea2Sigmas(8, { sampling: "auraflow", shift: 1e38 }))
      expect(Number.isNaN(s)).toBe(false);
    expect(await errorOf(() => krea2Sigmas(8, { sampling: "auraflow", shift: 4e38 }))).toStartWith(
      "E_ARG: auraFlowSigmaTable: shift 4e+38 is above 3.4028234663852886e+38",
    );
  });

  test("defaults of spec §6.3 and the size rule of §6.2", async () => {
    expect(KREA2_DEFAULTS).toEqual({
      width: 1024,
      height: 1024,
      steps: 8,
      cfg: 1,
      seed: 0,
      shift: 1.15,
      schedule: "simple",
    });
    expect(krea2Size(1024, 1024)).toEqual({ width: 1024, height: 1024, latentWidth: 128, latentHeight: 128 });
    expect(krea2Size(1122, 1683)).toEqual({
      width: 1120,
      height: 1680,
      latentWidth: 140,
      latentHeight: 210,
      notice: "size 1122x1683 is not a multiple of 8: generating 1120x1680 (latent 140x210), as ComfyUI does",
    });
    expect(krea2Size(16, 16384).latentHeight).toBe(2048);
    expect(await errorOf(() => krea2Size(15, 64))).toStartWith("E_UNSUPPORTED: width 15 is outside");
    expect(await errorOf(() => krea2Size(64, 16392))).toStartWith("E_UNSUPPORTED: height 16392 is outside");
    expect(await errorOf(() => krea2Size(64.5, 64))).toBe(
      "E_ARG: width must be a whole number of pixels, got 64.5",
    );
  });

  test("parameters text in A1111's format", () => {
    const base = {
      steps: 8,
      cfg: 1,
      seed: 42n,
      width: 1024,
      height: 768,
      shift: 1.15,
      schedule: "simple",
    } as const;
    expect(krea2Parameters({ prompt: "a cat", ...base, model: "krea2_turbo", vae: "qwen_image_vae" })).toBe(
      "a cat\nSteps: 8, Sampler: Euler, Schedule type: Simple, CFG scale: 1.0, Seed: 42, Size: 1024x768, Shift: 1.15, Model: krea2_turbo, VAE: qwen_image_vae, Version: TensorPencil",
    );
    expect(
      krea2Parameters({
        prompt: "two\nlines",
        negative: "blurry, dark",
        ...base,
        cfg: 3.5,
        schedule: "auraflow",
        negativeMode: "text",
        model: "a,b",
      }),
    ).toBe(
      'two\nlines\nNegative prompt: blurry, dark\nSteps: 8, Sampler: Euler, Schedule type: Simple (AuraFlow shift), CFG scale: 3.5, Seed: 42, Size: 1024x768, Shift: 1.15, Model: "a,b", Version: TensorPencil',
    );
    expect(krea2Parameters({ prompt: "p", ...base, cfg: 2, negativeMode: "zero" })).toContain(
      "CFG scale: 2.0, Seed: 42, Size: 1024x768, Shift: 1.15, Negative: ConditioningZeroOut,",
    );
  });

  test("conditioning and latent files round-trip; wrong files say what they are", async () => {
    const pos: HostConditioning = {
      data: Float32Array.from({ length: 2 * 6 }, (_, i) => i / 3),
      shape: [1, 2, 6],
    };
    const neg: HostConditioning = { data: new Float32Array(3 * 6).fill(-1), shape: [1, 3, 6] };
    const c = join(tmp, "cond.safetensors");
    writeConditioning(c, { positive: pos, negative: neg }, { prompt: "a cat", negative_prompt: "dog" });
    const back = readConditioning(c);
    expect(back.positive).toEqual(pos);
    expect(back.negative).toEqual(neg);
    expect(back.metadata).toEqual({ format: CONDITIONING_FORMAT, prompt: "a cat", negative_prompt: "dog" });
    const only = join(tmp, "cond1.safetensors");
    writeConditioning(only, { positive: pos });
    expect(readConditioning(only).negative).toBeUndefined();
    expect(
      await errorOf(() =>
        writeConditioning(c, { positive: pos, negative: { data: new Float32Array(4), shape: [1, 1, 4] } }),
      ),
    ).toBe("E_SHAPE: negative conditioning width 4 differs from the positive's 6");

    const l = join(tmp, "latent.safetensors");
    const latent = { data: Float32Array.from({ length: 16 * 6 }, (_, i) => i), shape: [1, 16, 1, 2, 3] };
    writeLatent(l, latent, { parameters: "x" });
    const lb = readLatent(l);
    expect(lb.data).toEqual(latent.data);
    expect(lb.shape).toEqual(latent.shape);
    expect(lb.metadata.parameters).toBe("x");

    expect(await errorOf(() => readConditioning(l))).toBe(
      `E_FORMAT: ${l} is not a conditioning file: no tensor 'positive'; it looks like a file with tensors latent (file ${l})`,
    );
    expect(await errorOf(() => readLatent(c))).toStartWith(
      `E_FORMAT: ${c} is not a latent file: no tensor 'latent'`,
    );
    expect(await errorOf(() => readLatent(join(tmp, "nope.safetensors")))).toStartWith(
      "E_IO: cannot open the latent file",
    );
    if (!skip) {
      expect(await errorOf(() => readConditioning(VAE))).toStartWith(
        `E_FORMAT: ${VAE} is not a conditioning file: no tensor 'positive'; it looks like a Wan 2.1-family VAE`,
      );
    }
  });
});
