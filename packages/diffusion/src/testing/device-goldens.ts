/**
 * Test helper (test-only: not in `@tp/diffusion/testing`): Krea 2 end to end on one device backend,
 * against the goldens of ../shared/testdata/krea2-tiny (ComfyUI / comfy-kitchen, PyTorch CPU fp32) that
 * the cpu backend matches (models/krea2.test.ts, models/wan-vae.test.ts, pipelines/krea2.test.ts), with
 * the same model code and the same tolerances: the DiT's whole-model output in every float mode and in
 * the ConvRot W8A8 / W4A4 modes, single ConvRot linears bit for bit against the cpu backend, the Wan 2.1
 * VAE decode, and the turbo_cfg1 sampling run through generateKrea2 (every step, both latents, the 8-bit
 * image). {@link describeKrea2Goldens} defines those tests for a backend the caller starts
 * (vulkan.test.ts, ptx-sim.test.ts, gpu.test.ts), skipped with the reason when ../shared is absent or
 * the backend cannot start.
 *
 * Error measure: max |ours − ref| / max |ref| over the tensor ("normalised max error").
 */
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { createBackend as createCpu } from "@tp/backend-cpu";
import type { Backend, Tensor } from "@tp/tensor";
import { type Krea2Dit, type Krea2Mode, loadKrea2 } from "../models/krea2.ts";
import { image01, loadWanVae } from "../models/wan-vae.ts";
import { generateKrea2 } from "../pipelines/krea2.ts";
import { expectComfyRun, KREA2_TINY, readF32, relErr, TURBO_CFG1 } from "./fixtures.ts";

/** Float modes: f32 products summed in another order than torch. */
export const FLOAT_TOL = 1e-5;
/**
 * Whole-model W8A8 / W4A4: an activation code on a rounding boundary flips with a 1e-7 difference and
 * the model amplifies it (models/krea2.test.ts).
 */
export const CHAOTIC_TOL = 5e-2;
/**
 * `native` mode: the cpu backend rounds x to bf16 before bf16 / fp8 products (2e-2 there); a backend
 * whose matmul keeps f32 x gives the float result — the same bound either way.
 */
export const BF16_ACT_TOL = 2e-2;
/** VAE decode vs torch (models/wan-vae.test.ts). */
export const VAE_TOL = 5e-5;
/** Sampling latents vs ComfyUI (pipelines/krea2.test.ts; 4 steps compound the DiT's ~1e-6). */
export const LATENT_TOL = 1e-5;
/** 8-bit image: truncation turns a 1e-7 difference into one level on a boundary. */
export const MAX_BYTES_OFF_BY_ONE = 8;

/** Per-test time limits (ms) before {@link Krea2GoldenOptions.timeScale}: what Mesa's llvmpipe needs with margin. */
const BASE_TIMEOUT_MS = { dit: 30_000, linear: 30_000, vae: 30_000, sampling: 60_000 } as const;

const DIR = KREA2_TINY; // ../shared/testdata/krea2-tiny beside the repository root
const RUN = join(DIR, "sampling/turbo_cfg1");
const ckpt = (v: string) => join(DIR, "checkpoints", `krea2_tiny_${v}.safetensors`);
const VAE = join(DIR, "checkpoints/wan21_vae_tiny_f32.safetensors");
const VARIANTS = ["bf16", "fp8_e4m3fn", "fp8_scaled", "int8_convrot", "int4_convrot"] as const;
const NEEDED = [
  join(DIR, "dit/inputs/case1_x.bin"),
  join(DIR, "linear"),
  join(DIR, "vae/wan21_z.bin"),
  join(RUN, "context_pos.bin"),
  join(RUN, "decoded_image01.bin"),
  VAE,
  ...VARIANTS.map(ckpt),
];

const fixture = (rel: string) => readF32(join(DIR, rel));

async function take(t: Tensor): Promise<Float32Array> {
  const b = t.backend;
  const a = (await b.read(t)) as Float32Array;
  b.free(t);
  return a;
}

/** Options of {@link describeKrea2Goldens}. */
export interface Krea2GoldenOptions {
  /**
   * Factor on every test's time limit (default 1: llvmpipe's limits, 30 s per DiT mode, linear pair
   * and VAE decode, 60 s for the sampling run); the PTX simulator needs several times more.
   */
  timeScale?: number;
}

/**
 * Define the Krea 2 tiny golden tests for one backend: two describe blocks, "Krea 2 DiT on the
 * `label` backend: whole-model output of each mode (case1)" (ten DiT modes, four ConvRot linears bit
 * for bit as the cpu backend) and "Wan 2.1 VAE and the Krea 2 pipeline on the `label` backend" (the VAE
 * decode, the turbo_cfg1 run); the model-level tests also check that the backend's memory returns to
 * where it was.
 * When ../shared/testdata/krea2-tiny lacks a file, or `start` throws, the blocks are skipped and one
 * skipped test names the reason. The backend (and each model loaded) is disposed after the file.
 * Call it at a test file's top level and await it (starting a backend may be asynchronous).
 * @param label the backend as test names spell it ("Vulkan", "ptx (simulated sm_86)")
 * @param start creates the backend (e.g. `() => loadBackend("ptx", { simulate: "sm_86" })`); called
 *   only when every fixture is present
 */
export async function describeKrea2Goldens(
  label: string,
  start: () => Backend | Promise<Backend>,
  options: Krea2GoldenOptions = {},
): Promise<void> {
  const scale = options.timeScale ?? 1;
  const limit = (k: keyof typeof BASE_TIMEOUT_MS) => BASE_TIMEOUT_MS[k] * scale;
  const missing = NEEDED.filter((p) => !existsSync(p));
  let started: Backend | undefined;
  let why = "";
  if (missing.length === 0) {
    try {
      started = await start();
    } catch (e) {
      const m = e instanceof Error ? e.message : String(e);
      why = m.split("\n")[0] ?? m;
    }
  }
  const SKIP =
    missing.length > 0
      ? `skipped: shared fixture missing: ${missing.join(", ")}`
      : started === undefined
        ? `skipped: the ${label} backend cannot start (${why})`
        : "";
  const backend = started as Backend;

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
    started?.dispose();
  });

  describe.skipIf(SKIP !== "")(
    `Krea 2 DiT on the ${label} backend: whole-model output of each mode (case1)`,
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
        test(
          `${file} in ${mode} mode vs out_${golden} (≤ ${tol})`,
          async () => {
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
          },
          limit("dit"),
        );
      }

      // W8A8 / W4A4 linears: both backends are bit-exact with @tp/quant convRotLinear, so they agree
      // exactly (the golden itself may differ by one activation code: models/krea2.test.ts).
      for (const [layer, k] of [
        ["blocks.0.mlp.down", 768],
        ["blocks.1.attn.wk", 256],
      ] as const) {
        for (const file of ["int8_convrot", "int4_convrot"]) {
          test(
            `${layer}: ${file} W${file[3]}A${file[3]} linear bit for bit as the cpu backend`,
            async () => {
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
            },
            limit("linear"),
          );
        }
      }
    },
  );

  describe.skipIf(SKIP !== "")(`Wan 2.1 VAE and the Krea 2 pipeline on the ${label} backend`, () => {
    test(
      "VAE: wan21_z → wan21_decoded_raw and image01",
      async () => {
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
      },
      limit("vae"),
    );

    test(
      "turbo_cfg1: every step, the final latent in both spaces, and the 8-bit image",
      async () => {
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
      },
      limit("sampling"),
    );
  });

  if (SKIP !== "") test.skip(SKIP, () => {});
}
