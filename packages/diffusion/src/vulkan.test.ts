// Krea 2 end to end on the Vulkan backend (issue 6), against the goldens of ../shared/testdata/krea2-tiny
// (ComfyUI / comfy-kitchen, PyTorch CPU fp32) that the cpu backend matches (models/krea2.test.ts,
// models/wan-vae.test.ts, pipelines/krea2.test.ts), with the same model code and the same tolerances:
// the DiT's whole-model output in every float mode and in the ConvRot W8A8 / W4A4 modes, single ConvRot
// linears bit for bit against the cpu backend, the Wan 2.1 VAE decode, and the turbo_cfg1 sampling run
// through generateKrea2 (every step, both latents, the 8-bit image).
// Skipped with the reason when ../shared is absent or no Vulkan device starts. On Mesa's llvmpipe
// (2 cores) the file takes about 20–30 s, most of it the first use of each kernel (pipeline compiles).
//
// Error measure: max |ours − ref| / max |ref| over the tensor ("normalised max error").
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { createBackend as createCpu } from "@tp/backend-cpu";
import { createBackend as createVulkan } from "@tp/backend-vulkan";
import type { Backend, Tensor } from "@tp/tensor";
import { startBackend } from "@tp/tensor/testing";
import { type Krea2Dit, type Krea2Mode, loadKrea2 } from "./models/krea2.ts";
import { image01, loadWanVae } from "./models/wan-vae.ts";
import { generateKrea2 } from "./pipelines/krea2.ts";
import { expectComfyRun, KREA2_TINY, readF32, relErr, TURBO_CFG1 } from "./testing/fixtures.ts";

/** Float modes: f32 products summed in another order than torch (measured ≤ 6e-7 here). */
const FLOAT_TOL = 1e-5;
/**
 * Whole-model W8A8 / W4A4: an activation code on a rounding boundary flips with a 1e-7 difference and
 * the model amplifies it (models/krea2.test.ts). Measured here: W8A8 3.4e-3, W4A4 7e-7.
 */
const CHAOTIC_TOL = 5e-2;
/**
 * `native` mode: the cpu backend rounds x to bf16 before bf16 / fp8 products (2e-2 there); the Vulkan
 * matmul keeps f32 x, so native bf16 is the float result here (measured 5.4e-7) — the same bound.
 */
const BF16_ACT_TOL = 2e-2;
/** VAE decode vs torch (models/wan-vae.test.ts; measured 5.1e-6 here). */
const VAE_TOL = 5e-5;
/** Sampling latents vs ComfyUI (pipelines/krea2.test.ts; 4 steps compound the DiT's ~1e-6). */
const LATENT_TOL = 1e-5;
/** 8-bit image: truncation turns a 1e-7 difference into one level on a boundary. */
const MAX_BYTES_OFF_BY_ONE = 8;

const DIR = KREA2_TINY; // ../shared/testdata/krea2-tiny beside the repository root
const RUN = join(DIR, "sampling/turbo_cfg1");
const ckpt = (v: string) => join(DIR, "checkpoints", `krea2_tiny_${v}.safetensors`);
const VAE = join(DIR, "checkpoints/wan21_vae_tiny_f32.safetensors");
const VARIANTS = ["bf16", "fp8_e4m3fn", "fp8_scaled", "int8_convrot", "int4_convrot"] as const;
const needed = [
  join(DIR, "dit/inputs/case1_x.bin"),
  join(DIR, "linear"),
  join(DIR, "vae/wan21_z.bin"),
  join(RUN, "context_pos.bin"),
  join(RUN, "decoded_image01.bin"),
  VAE,
  ...VARIANTS.map(ckpt),
];
const missing = needed.filter((p) => !existsSync(p));

const vk = missing.length === 0 ? startBackend(() => createVulkan()) : {};
const SKIP =
  missing.length > 0
    ? `skipped: shared fixture missing: ${missing.join(", ")}`
    : vk.backend === undefined
      ? `skipped: no Vulkan device starts (${vk.reason})`
      : "";
const backend = vk.backend as Backend;

const fixture = (rel: string) => readF32(join(DIR, rel));

async function take(t: Tensor): Promise<Float32Array> {
  const b = t.backend;
  const a = (await b.read(t)) as Float32Array;
  b.free(t);
  return a;
}

const models = new Map<string, Krea2Dit>();
function model(variant: string, mode: Krea2Mode): Krea2Dit {
  const key = `${variant}/${mode}`;
  let m = models.get(key);
  if (!m) {
    m = loadKrea2(ckpt(variant), { backend, mode });
    models.set(key, m);
  }
  return m;
}
afterAll(() => {
  for (const m of models.values()) m.dispose();
  backend?.dispose();
});

describe.skipIf(SKIP !== "")(
  "Krea 2 DiT on the Vulkan backend: whole-model output of each mode (case1)",
  () => {
    const runs: [string, Krea2Mode, string, number][] = [
      ["bf16", "upcast", "bf16ref", FLOAT_TOL],
      ["bf16", "dequant", "bf16ref", FLOAT_TOL],
      ["fp8_e4m3fn", "upcast", "fp8_e4m3fn_manualcast", FLOAT_TOL],
      ["fp8_scaled", "upcast", "fp8_scaled_dequant", FLOAT_TOL],
      ["int8_convrot", "dequant", "int8_convrot_dequant", FLOAT_TOL],
      ["int4_convrot", "dequant", "int4_convrot_dequant", FLOAT_TOL],
      ["int8_convrot", "upcast", "int8_convrot_w8a8", CHAOTIC_TOL],
      ["int4_convrot", "upcast", "int4_convrot_w4a4", CHAOTIC_TOL],
      ["int8_convrot", "native", "int8_convrot_w8a8", BF16_ACT_TOL],
      ["bf16", "native", "bf16ref", BF16_ACT_TOL],
    ];
    for (const [file, mode, golden, tol] of runs) {
      test(`${file} in ${mode} mode vs out_${golden} (≤ ${tol})`, async () => {
        const m = model(file, mode);
        const before = backend.memory.current;
        const x = backend.upload(fixture("dit/inputs/case1_x.bin"), [1, 16, 16, 16], "f32");
        const ctx = backend.upload(fixture("dit/inputs/case1_context.bin"), [1, 7, 960], "f32");
        const sigma = fixture("dit/inputs/case1_timestep.bin")[0] as number;
        const out = await take(m.forward(x, sigma, ctx));
        backend.free(x);
        backend.free(ctx);
        expect(relErr(out, fixture(`dit/out_${golden}_case1.bin`))).toBeLessThan(tol);
        expect(backend.memory.current).toBe(before); // every temporary freed
      }, 30_000);
    }

    // W8A8 / W4A4 linears: both backends are bit-exact with @tp/quant convRotLinear, so they agree
    // exactly (the golden itself may differ by one activation code: models/krea2.test.ts).
    for (const [layer, k] of [
      ["blocks.0.mlp.down", 768],
      ["blocks.1.attn.wk", 256],
    ] as const) {
      for (const file of ["int8_convrot", "int4_convrot"]) {
        test(`${layer}: ${file} W${file[3]}A${file[3]} linear bit for bit as the cpu backend`, async () => {
          const cpu = createCpu({ threads: 2 });
          try {
            const stem = layer.replaceAll(".", "_");
            const xs = fixture(`linear/${stem}_x.bin`);
            const w = model(file, "upcast").weight(`${layer}.weight`);
            const xv = backend.upload(xs, [2, 5, k], "f32");
            const ours = await take(backend.matmul(xv, w));
            backend.free(xv);
            const xc = cpu.upload(xs, [2, 5, k], "f32");
            const ref = await take(cpu.matmul(xc, w));
            cpu.free(xc);
            expect(ours).toEqual(ref);
          } finally {
            cpu.dispose();
          }
        });
      }
    }
  },
);

describe.skipIf(SKIP !== "")("Wan 2.1 VAE and the Krea 2 pipeline on the Vulkan backend", () => {
  test("VAE: wan21_z → wan21_decoded_raw and image01", async () => {
    const before = backend.memory.current;
    const vae = loadWanVae(backend, VAE);
    try {
      const z = backend.upload(fixture("vae/wan21_z.bin"), [1, 16, 1, 6, 10], "f32");
      const out = vae.decode(z);
      backend.free(z);
      expect(out.shape).toEqual([1, 3, 48, 80]);
      const raw = await take(out);
      expect(relErr(raw, fixture("vae/wan21_decoded_raw.bin"))).toBeLessThanOrEqual(VAE_TOL);
      expect(relErr(image01(raw), fixture("vae/wan21_decoded_image01.bin"))).toBeLessThanOrEqual(VAE_TOL);
    } finally {
      vae.dispose();
    }
    expect(backend.memory.current).toBe(before);
  }, 30_000);

  test("turbo_cfg1: every step, the final latent in both spaces, and the 8-bit image", async () => {
    const before = backend.memory.current;
    const dit = loadKrea2(ckpt("bf16"), { backend, mode: "upcast" }); // ComfyUI's fp32 run
    const vae = loadWanVae(backend, VAE);
    try {
      const states: Float32Array[] = [];
      const r = await generateKrea2({
        dit,
        vae,
        conditioning: { positive: { data: readF32(join(RUN, "context_pos.bin")), shape: [1, 7, 960] } },
        ...TURBO_CFG1,
        onStep: async (s) => {
          states.push((await backend.read(s.x)) as Float32Array);
        },
      });
      expect([r.width, r.height, r.rgb.length]).toEqual([128, 96, 128 * 96 * 3]);
      expectComfyRun(RUN, r, states, { latent: LATENT_TOL, bytesOffByOne: MAX_BYTES_OFF_BY_ONE });
    } finally {
      dit.dispose();
      vae.dispose();
    }
    expect(backend.memory.current).toBe(before);
  }, 60_000);
});

if (SKIP !== "") test.skip(SKIP, () => {});
