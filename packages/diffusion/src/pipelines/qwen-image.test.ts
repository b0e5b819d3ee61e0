// Qwen-Image-2.1 sampling against ../shared/testdata/qwen-image-tiny/sampling (ComfyUI's KSampler,
// euler / simple / cfg 1, 8 steps, seed 42 on the tiny checkpoints, PyTorch CPU fp32): the noise, the
// schedules, every step's state, the final latents, the RGBA image; the diffusers schedule against the
// spec's f64 reference values; text K/V reuse on and off give the same run.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { createBackend } from "@tp/backend-cpu";
import { isTpError } from "@tp/tensor";
import { loadQwenImage } from "../models/qwen-image.ts";
import { loadQwenImageVae } from "../models/qwen-image-vae.ts";
import { randn } from "../noise.ts";
import { readF32, relErr, SHARED } from "../testing/fixtures.ts";
import {
  generateQwenImage,
  qwenImageComfySigmas,
  qwenImageSigmas,
  qwenImageSize,
  readQwenImageScheduler,
} from "./qwen-image.ts";

const DIR = join(SHARED, "testdata/qwen-image-tiny");
const RUN = join(DIR, "sampling/cfg1");
const DIT = join(DIR, "comfyui/diffusion_models/qwen_image_2.1_tiny_bf16.safetensors");
const VAE = join(DIR, "comfyui/vae/qwen_image_2.1_vae_tiny_bf16.safetensors");
const VAE_CONFIG = join(DIR, "diffusers/vae/config.json");
const missing = [DIT, VAE, VAE_CONFIG, join(RUN, "step7_x.bin")].filter((p) => !existsSync(p));
const note = missing.length === 0 ? "" : ` [skipped: shared fixture missing: ${missing.join(", ")}]`;
const run = missing.length === 0 ? describe : describe.skip;

/** The README's bound for an fp32 engine's sampled latent (rel_l2 ≤ 1e-4; we measure max-relative). */
const LATENT_TOL = 1e-4;

const backend = missing.length === 0 ? createBackend({ threads: 2 }) : null;
afterAll(() => backend?.dispose());
const f32 = (rel: string) => readF32(join(DIR, rel));

describe("Qwen-Image-2.1 schedules and sizes", () => {
  test("diffusers schedule: the spec's f64 reference values (20 steps at 256 and 1024 tokens)", () => {
    const want256 = [
      1, 0.967053, 0.932756, 0.897026, 0.859769, 0.820886, 0.780269, 0.737798, 0.693345, 0.646765, 0.597904,
      0.54659, 0.492632, 0.435822, 0.375927, 0.312689, 0.245819, 0.174996, 0.099859, 0.02, 0,
    ];
    const want1024 = [
      1, 0.968167, 0.93495, 0.900257, 0.863988, 0.826033, 0.786272, 0.744572, 0.700787, 0.654759, 0.606309,
      0.555242, 0.501339, 0.444358, 0.384026, 0.320041, 0.252059, 0.179693, 0.102506, 0.02, 0,
    ];
    for (const [seq, want] of [
      [256, want256],
      [1024, want1024],
    ] as const) {
      const got = qwenImageSigmas(20, seq);
      expect(got.length).toBe(21);
      for (let i = 0; i < 21; i++)
        expect(Math.abs((got[i] as number) - (want[i] as number))).toBeLessThan(1e-6);
    }
    const s40 = qwenImageSigmas(40, 4096);
    expect([s40[1], s40[2], s40[37], s40[38], s40[39]].map((v) => Number((v as number).toFixed(6)))).toEqual([
      0.986964, 0.973593, 0.113533, 0.067881, 0.02,
    ]);
  });

  test("diffusers schedule: 1 step is E_ARG (0/0 in the stretch)", () => {
    let err: unknown;
    try {
      qwenImageSigmas(1, 256);
    } catch (e) {
      err = e;
    }
    expect(isTpError(err) && err.code === "E_ARG").toBe(true);
  });

  test("sizes floor to multiples of 32 with a notice", () => {
    expect(qwenImageSize(256, 256).notice).toBeUndefined();
    const s = qwenImageSize(300, 270);
    expect([s.width, s.height, s.latentWidth, s.latentHeight]).toEqual([288, 256, 18, 16]);
    expect(s.notice).toContain("288x256");
  });

  const sched = join(DIR, "sampling/schedules");
  (existsSync(sched) ? test : test.skip)(
    "ComfyUI schedule: μ 0.69 'simple' equals ComfyUI's tables bit for bit",
    () => {
      for (const n of [1, 5, 8, 20, 25, 40]) {
        expect(Array.from(qwenImageComfySigmas(n))).toEqual(
          Array.from(readF32(join(sched, `simple_${n}.bin`))),
        );
      }
      expect(
        readQwenImageScheduler(join(DIR, "diffusers/scheduler/scheduler_config.json")).shift_terminal,
      ).toBe(0.02);
    },
  );
});

run(`Qwen-Image-2.1 sampling against ComfyUI${note}`, () => {
  test("seed 42 noise is torch's randn (the fixture machine ran torch's scalar kernel)", () => {
    const ref = f32("sampling/cfg1/initial_noise.bin");
    expect(Array.from(randn(42, [1, 64, 16, 16], { capability: "default" }))).toEqual(Array.from(ref));
  });

  test(`8 euler steps, cfg 1: every state, both latents within ${LATENT_TOL}, RGBA bytes`, async () => {
    const b = backend as NonNullable<typeof backend>;
    using dit = loadQwenImage(DIT, { backend: b, mode: "f32" });
    using vae = loadQwenImageVae(b, VAE, VAE_CONFIG);
    const ctx = f32("sampling/cfg1/context_pos.bin");
    const noise = f32("sampling/cfg1/initial_noise.bin");
    const states: Float32Array[] = [];
    const res = await generateQwenImage({
      dit,
      vae,
      positive: { data: ctx, shape: [1, ctx.length / 8, 8] },
      width: 256,
      height: 256,
      steps: 8,
      cfg: 1,
      schedule: "comfy",
      initialNoise: noise,
      onStep: async (s) => {
        states.push((await b.read(s.x)) as Float32Array);
      },
    });
    expect(Array.from(res.sigmas)).toEqual(Array.from(f32("sampling/cfg1/sigmas.bin")));
    const errs = states.slice(0, -1).map((s, i) => relErr(s, f32(`sampling/cfg1/step${i + 1}_x.bin`)));
    console.log("step errors", errs);
    for (const e of errs) expect(e).toBeLessThanOrEqual(LATENT_TOL);
    expect(relErr(res.modelLatent, f32("sampling/cfg1/final_latent_model_space.bin"))).toBeLessThanOrEqual(
      LATENT_TOL,
    );
    expect(relErr(res.latent, f32("sampling/cfg1/final_latent_vae_space.bin"))).toBeLessThanOrEqual(
      LATENT_TOL,
    );
    const ref = new Uint8Array(readFileSync(join(RUN, "decoded_u8.bin")));
    expect(res.rgba.length).toBe(ref.length);
    let off = 0;
    for (let i = 0; i < ref.length; i++) {
      const d = Math.abs((res.rgba[i] as number) - (ref[i] as number));
      expect(d).toBeLessThanOrEqual(1);
      off += d;
    }
    console.log("RGBA bytes off by one", off, "of", ref.length);
    expect(off).toBeLessThanOrEqual(ref.length / 100);
  });

  test("text K/V reuse off (text rows rerun every step) gives the same latent", async () => {
    const b = backend as NonNullable<typeof backend>;
    using dit = loadQwenImage(DIT, { backend: b, mode: "f32" });
    using vae = loadQwenImageVae(b, VAE, VAE_CONFIG);
    const ctx = f32("sampling/cfg1/context_pos.bin");
    const common = {
      dit,
      vae,
      positive: { data: ctx, shape: [1, ctx.length / 8, 8] as [number, number, number] },
      steps: 2,
      schedule: "comfy" as const,
      seed: 42,
      noiseKernel: "default" as const,
    };
    const on = await generateQwenImage(common);
    const off = await generateQwenImage({ ...common, reuseTextKv: false });
    expect(relErr(on.modelLatent, off.modelLatent)).toBeLessThanOrEqual(1e-6);
  });
});
