// Qwen-Image-2.1's registry row on ../shared/testdata/qwen-image-tiny: both folder layouts resolve to
// their files (a partial folder is one line naming what is missing) and give the same image; the DiT
// picks the row; the quantize-on-load cache is built once beside the weights, mapped later, rebuilt
// when a file changes; the velocity error of each width against f32 (case 1 of the DiT goldens); the
// whole pipeline from the prompt against ComfyUI's cfg1 image, float modes pinned, the defaults measured.
import { afterAll, describe, expect, test } from "bun:test";
import {
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
  utimesSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createBackend } from "@tp/backend-cpu";
import { isTpError, type Tensor } from "@tp/tensor";
import { loadQwenImage } from "../models/qwen-image.ts";
import { pipelineForCheckpoint } from "../registry.ts";
import { readF32, relErr, SHARED } from "../testing/fixtures.ts";
import { loadQwenImageDit, QWEN_IMAGE_PIPELINE, qwenImageModelFiles } from "./qwen-image-pipeline.ts";

const DIR = join(SHARED, "testdata/qwen-image-tiny");
const DIFF = join(DIR, "diffusers");
const COMFY = join(DIR, "comfyui");
const missing = [join(DIFF, "model_index.json"), join(COMFY, "vae"), join(DIR, "dit/out_case1.bin")].filter(
  (p) => !existsSync(p),
);
const note = missing.length === 0 ? "" : ` [skipped: shared fixture missing: ${missing.join(", ")}]`;
const run = missing.length === 0 ? describe : describe.skip;

const tmp = mkdtempSync(join(tmpdir(), "tp-qimage-"));
const backend = missing.length === 0 ? createBackend({ threads: 2 }) : null;
afterAll(() => {
  backend?.dispose();
  rmSync(tmp, { recursive: true, force: true });
});

/** A ComfyUI folder of links to the tiny files, with the two files the product takes from the Qwen repo. */
function comfyFolder(name: string, dit: "int8_convrot" | "bf16" | "both", extras = true): string {
  const root = join(tmp, name);
  for (const d of ["diffusion_models", "text_encoders", "vae", "processor"])
    mkdirSync(join(root, d), { recursive: true });
  for (const v of dit === "both" ? ["int8_convrot", "bf16"] : [dit]) {
    const f = `qwen_image_2.1_tiny_${v}.safetensors`;
    symlinkSync(join(COMFY, "diffusion_models", f), join(root, "diffusion_models", f));
  }
  symlinkSync(
    join(COMFY, "text_encoders/qwen3vl_8b_tiny_bf16.safetensors"),
    join(root, "text_encoders/qwen3vl_8b_tiny_bf16.safetensors"),
  );
  symlinkSync(
    join(COMFY, "vae/qwen_image_2.1_vae_tiny_bf16.safetensors"),
    join(root, "vae/qwen_image_2.1_vae_tiny_bf16.safetensors"),
  );
  if (extras) {
    symlinkSync(join(DIFF, "processor/tokenizer.json"), join(root, "processor/tokenizer.json"));
    symlinkSync(join(DIFF, "vae/config.json"), join(root, "vae/config.json"));
  }
  return root;
}

async function errorOf(f: () => unknown): Promise<string> {
  try {
    await f();
  } catch (e) {
    return isTpError(e) ? `${e.code}: ${e.message}` : String(e);
  }
  return "no error";
}

run(`Qwen-Image-2.1 registry row${note}`, () => {
  test("both layouts resolve; ComfyUI prefers int8_convrot; the DiT picks the row", () => {
    const d = qwenImageModelFiles(DIFF);
    expect(d.dit.endsWith("transformer/diffusion_pytorch_model.safetensors.index.json")).toBe(true);
    expect(d.textEncoder.endsWith("text_encoder/model.safetensors")).toBe(true);
    expect(d.scheduler?.endsWith("scheduler_config.json")).toBe(true);
    const c = qwenImageModelFiles(comfyFolder("both", "both"));
    expect(c.dit.endsWith("qwen_image_2.1_tiny_int8_convrot.safetensors")).toBe(true);
    expect(pipelineForCheckpoint(d.dit)).toBe(QWEN_IMAGE_PIPELINE);
    expect(pipelineForCheckpoint(c.dit)).toBe(QWEN_IMAGE_PIPELINE);
  });

  test("a partial folder is one line naming what is missing", async () => {
    const partial = comfyFolder("partial", "bf16", false);
    const e = await errorOf(() => qwenImageModelFiles(partial));
    expect(e).toContain("is missing: processor/tokenizer.json, vae/config.json");
    expect(e.includes("\n")).toBe(false);
    const noVae = join(tmp, "novae");
    mkdirSync(join(noVae, "diffusion_models"), { recursive: true });
    mkdirSync(join(noVae, "text_encoders"), { recursive: true });
    expect(await errorOf(() => qwenImageModelFiles(noVae))).toContain(
      "missing: diffusion_models/*.safetensors",
    );
    // a file of the folder given as the folder: named as a file, not parsed as a safetensors header
    const index = join(DIFF, "model_index.json");
    expect(await errorOf(() => qwenImageModelFiles(index))).toBe(
      `E_FORMAT: ${index} is a file, not a Qwen-Image-2.1 folder (diffusers or ComfyUI layout); give its folder, or the files with --dit / --vae / --text-encoder (file ${index})`,
    );
  });

  test("both layouts give the same image (f32, 3 steps, 64x96, cfg 2 with a negative)", async () => {
    const b = backend as NonNullable<typeof backend>;
    const images: Uint8Array[] = [];
    for (const files of [qwenImageModelFiles(DIFF), qwenImageModelFiles(comfyFolder("bf16", "bf16"))]) {
      const events: string[] = [];
      const previews: (readonly number[])[] = [];
      const r = await QWEN_IMAGE_PIPELINE.generate(
        {
          files,
          backend: b,
          prompt: "a red cube on a white table",
          negative: "blurry",
          width: 64,
          height: 96,
          steps: 3,
          cfg: 2,
          seed: 3n,
          ditMode: "f32",
          textEncoderMode: "f32",
          preview: true,
        },
        (e) => {
          events.push(e.kind);
          if (e.kind === "step" && e.denoised) previews.push(e.denoised.shape);
        },
      );
      expect([r.width, r.height, r.rgba?.length, r.rgb.length]).toEqual([64, 96, 64 * 96 * 4, 64 * 96 * 3]);
      expect(events.filter((k) => k === "step").length).toBe(3);
      expect(previews).toEqual([0, 1, 2].map(() => [1, 64, 1, 6, 4]));
      expect(r.text.parameters).toContain("Negative prompt: blurry");
      images.push(r.rgba as Uint8Array);
    }
    expect(Array.from(images[0] as Uint8Array)).toEqual(Array.from(images[1] as Uint8Array));
  }, 60000);

  test("ComfyUI's cfg1 run from the prompt (256², 8 steps, comfy, seed 42): f32 gives its image; the default modes' difference measured", async () => {
    const b = backend as NonNullable<typeof backend>;
    const ref = new Uint8Array(readFileSync(join(DIR, "sampling/cfg1/decoded_u8.bin")));
    const common = {
      backend: b,
      prompt: "a red cube on a white table",
      width: 256,
      height: 256,
      steps: 8,
      cfg: 1,
      seed: 42n,
      schedule: "comfy",
      noise: "default" as const, // the fixture machine's torch randn kernel
    };
    const diff = (rgba: Uint8Array) => {
      let max = 0;
      let sum = 0;
      for (let i = 0; i < ref.length; i++) {
        const d = Math.abs((rgba[i] as number) - (ref[i] as number));
        max = Math.max(max, d);
        sum += d;
      }
      return { max, mean: sum / ref.length };
    };
    const runs: Record<string, { max: number; mean: number }> = {};
    const notes: string[] = [];
    for (const [what, folder, ditMode, textEncoderMode] of [
      ["f32 / f32 (pinned)", comfyFolder("golden-bf16", "bf16"), "f32", "f32"],
      ["DiT f32, text encoder q8", comfyFolder("golden-te8", "bf16"), "f32", "q8"],
      ["int8_convrot DiT, text encoder f32", comfyFolder("golden-dit8", "int8_convrot"), undefined, "f32"],
      [
        "defaults (int8_convrot DiT as stored, text encoder q8)",
        comfyFolder("golden-int8", "int8_convrot"),
        undefined,
        undefined,
      ],
    ] as const) {
      const r = await QWEN_IMAGE_PIPELINE.generate(
        {
          ...common,
          files: qwenImageModelFiles(folder),
          ...(ditMode ? { ditMode } : {}),
          ...(textEncoderMode ? { textEncoderMode } : {}),
        },
        (e) => {
          if (e.kind === "notice") notes.push(e.text);
        },
      );
      expect(r.rgba?.length).toBe(ref.length);
      runs[what] = diff(r.rgba as Uint8Array);
    }
    console.log("RGBA bytes against ComfyUI's cfg1 image (max, mean |Δ|):", runs);
    expect(notes.filter((n) => n.startsWith("text encoder int8 ConvRot cache built")).length).toBe(2);
    expect(notes).toContain(
      "transformer qwen_image_2.1_tiny_int8_convrot.safetensors used as stored (int8_convrot)",
    );
    // the float run is the golden (truncation: ±1 at rounding boundaries, as pipelines/qwen-image.test.ts)
    expect(runs["f32 / f32 (pinned)"]?.max).toBeLessThanOrEqual(1);
    expect(runs["f32 / f32 (pinned)"]?.mean).toBeLessThanOrEqual(1e-2);
    // W8A8 text encoder (conditioning 1.4e-2 off, models/qwen-image-text-quant.test.ts): measured max 1,
    // mean 3.3e-3; the int8 transformer alone: max 3, mean 7.0e-2; both (the defaults): max 5, mean
    // 7.0e-2. Bounds: twice the measured.
    expect(runs["DiT f32, text encoder q8"]?.max).toBeLessThanOrEqual(2);
    expect(runs["DiT f32, text encoder q8"]?.mean).toBeLessThanOrEqual(7e-3);
    expect(runs["defaults (int8_convrot DiT as stored, text encoder q8)"]?.max).toBeLessThanOrEqual(10);
    expect(runs["defaults (int8_convrot DiT as stored, text encoder q8)"]?.mean).toBeLessThanOrEqual(0.14);
  }, 120000);

  test("quantize on load: cache built beside the weights, mapped next time, rebuilt when a file changes; velocity error per width", async () => {
    const b = backend as NonNullable<typeof backend>;
    const dir = join(tmp, "transformer");
    mkdirSync(dir);
    for (const f of readdirSync(join(DIFF, "transformer")))
      copyFileSync(join(DIFF, "transformer", f), join(dir, f));
    const index = join(dir, "diffusion_pytorch_model.safetensors.index.json");
    const x = b.upload(readF32(join(DIR, "dit/inputs/case1_x.bin")), [1, 64, 16, 16], "f32");
    const ctx = b.upload(readF32(join(DIR, "dit/inputs/case1_context.bin")), [1, 7, 8], "f32");
    const t = readF32(join(DIR, "dit/inputs/case1_timestep.bin"))[0] as number;
    const take = async (v: Tensor) => {
      const a = (await b.read(v)) as Float32Array;
      b.free(v);
      return a;
    };
    const ref = readF32(join(DIR, "dit/out_case1.bin"));
    using f32 = loadQwenImage(index, { backend: b, mode: "f32" });
    const vf = await take(f32.forward(x, t, ctx));
    const errs: Record<string, number> = {};
    for (const mode of ["q8", "q4"] as const) {
      const first = loadQwenImageDit(index, b, mode);
      expect(first.note).toContain("cache built");
      errs[mode] = relErr(await take(first.dit.forward(x, t, ctx)), vf);
      first.dit.dispose();
      const again = loadQwenImageDit(index, b, mode);
      expect(again.note).toContain("cache hit");
      again.dit.dispose();
    }
    console.log("velocity error against f32 (max |Δ| / max |v|):", errs, "f32 vs ComfyUI", relErr(vf, ref));
    expect(errs.q8).toBeLessThanOrEqual(2e-2);
    expect(errs.q4).toBeLessThanOrEqual(2e-1);
    expect(errs.q8 as number).toBeLessThan(errs.q4 as number);
    const shard = readdirSync(dir).find((f) => f.endsWith("-00001-of-00002.safetensors")) as string;
    utimesSync(join(dir, shard), new Date(), new Date(Date.now() + 5000));
    const changed = loadQwenImageDit(index, b, "q8");
    expect(changed.note).toContain("cache rebuilt");
    changed.dit.dispose();
    expect(readdirSync(dir).filter((f) => f.includes(".tmp")).length).toBe(0);
    b.free(x);
    b.free(ctx);
  }, 60000);
});
