// Qwen-Image-2.1 transformer against ../shared/testdata/qwen-image-tiny (outputs of ComfyUI's own
// comfy/ldm/qwen_image21/model.py, PyTorch CPU fp32): every intermediate of case 1 and the velocity,
// in f32 mode on the bf16 file (ComfyUI layout) and the diffusers shards; the int8 ConvRot file as
// W8A8; the text K/V reuse against the full forward. Error measure: relErr (max |d| / max |ref|).
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { createBackend } from "@tp/backend-cpu";
import type { Tensor } from "@tp/tensor";
import { readF32, relErr, SHARED } from "../testing/fixtures.ts";
import { loadQwenImage, type QwenImageDit, type QwenImageMode, qwenImagePositions } from "./qwen-image.ts";

const DIR = join(SHARED, "testdata/qwen-image-tiny");
const COMFY = join(DIR, "comfyui/diffusion_models/qwen_image_2.1_tiny_bf16.safetensors");
const INT8 = join(DIR, "comfyui/diffusion_models/qwen_image_2.1_tiny_int8_convrot.safetensors");
const DIFFUSERS = join(DIR, "diffusers/transformer/diffusion_pytorch_model.safetensors.index.json");
const missing = [COMFY, INT8, DIFFUSERS, join(DIR, "dit/out_case1.bin")].filter((p) => !existsSync(p));
const note = missing.length === 0 ? "" : ` [skipped: shared fixture missing: ${missing.join(", ")}]`;
const run = missing.length === 0 ? describe : describe.skip;

/** f32 weights, f32 sums in another order than torch: measured ≤ 2e-6; the task's bound is 1e-4. */
const F32_TOL = 1e-4;

const backend = missing.length === 0 ? createBackend({ threads: 2 }) : null;
const models: QwenImageDit[] = [];
function load(path: string, mode: QwenImageMode): QwenImageDit {
  const m = loadQwenImage(path, { backend: backend as NonNullable<typeof backend>, mode });
  models.push(m);
  return m;
}
afterAll(() => {
  for (const m of models) m.dispose();
  backend?.dispose();
});

const fixture = (rel: string) => readF32(join(DIR, rel));

async function take(t: Tensor): Promise<Float32Array> {
  const a = (await t.backend.read(t)) as Float32Array;
  t.backend.free(t);
  return a;
}

function inputs(): { x: Tensor; ctx: Tensor; t: number } {
  const b = backend as NonNullable<typeof backend>;
  return {
    x: b.upload(fixture("dit/inputs/case1_x.bin"), [1, 64, 16, 16], "f32"),
    ctx: b.upload(fixture("dit/inputs/case1_context.bin"), [1, 7, 8], "f32"),
    t: fixture("dit/inputs/case1_timestep.bin")[0] as number,
  };
}

run(`Qwen-Image-2.1 DiT against ComfyUI${note}`, () => {
  test("RoPE positions: text (k, k, k), image (L, r − 8, c − 8)", () => {
    const ids = fixture("dit/intermediates/case1_rope_ids.bin"); // [1, 263, 3]
    const pos = qwenImagePositions(7, 16, 16); // [3, 263]
    const ours = new Float32Array(263 * 3);
    for (let i = 0; i < 263; i++) for (let a = 0; a < 3; a++) ours[i * 3 + a] = pos[a * 263 + i] as number;
    expect(Array.from(ours)).toEqual(Array.from(ids));
  });

  for (const [what, path] of [
    ["ComfyUI bf16 file", COMFY],
    ["diffusers shards", DIFFUSERS],
  ] as const) {
    test(`f32 mode, ${what}: every intermediate and the velocity within ${F32_TOL}`, async () => {
      const m = load(path, "f32");
      expect([
        m.config.hidden_size,
        m.config.num_attention_heads,
        m.config.num_layers,
        m.config.mlp_hidden,
      ]).toEqual([256, 2, 2, 768]);
      const { x, ctx, t } = inputs();
      const got = new Map<string, Float32Array>();
      const pending: Promise<void>[] = [];
      const v = m.forward(x, t, ctx, {
        capture: (name, tensor) => {
          pending.push(take(tensor).then((a) => void got.set(name, a)));
        },
      });
      await Promise.all(pending);
      const errs: Record<string, number> = {};
      for (const name of ["img_in", "txt_in", "temb", "modulation", "block0", "block1", "norm_out"]) {
        errs[name] = relErr(got.get(name) as Float32Array, fixture(`dit/intermediates/case1_${name}.bin`));
      }
      errs.out = relErr(await take(v), fixture("dit/out_case1.bin"));
      console.log(what, errs);
      for (const e of Object.values(errs)) expect(e).toBeLessThanOrEqual(F32_TOL);
      x.backend.free(x);
      ctx.backend.free(ctx);
    });
  }

  test("text K/V computed once gives the same velocity as the full forward", async () => {
    const m = load(COMFY, "f32");
    const { x, ctx, t } = inputs();
    const full = await take(m.forward(x, t, ctx));
    using kv = m.encodeText(ctx);
    const reused = await take(m.forward(x, t, kv));
    const again = await take(m.forward(x, t, kv));
    expect(relErr(reused, full)).toBeLessThanOrEqual(1e-6);
    expect(Array.from(again)).toEqual(Array.from(reused));
    x.backend.free(x);
    ctx.backend.free(ctx);
  });

  test("int8 ConvRot file (W8A8, native) near ComfyUI's float velocity", async () => {
    const m = load(INT8, "native");
    const { x, ctx, t } = inputs();
    const e = relErr(await take(m.forward(x, t, ctx)), fixture("dit/out_case1.bin"));
    console.log("int8 W8A8 vs float", e);
    expect(e).toBeLessThanOrEqual(5e-2);
    x.backend.free(x);
    ctx.backend.free(ctx);
  });
});
