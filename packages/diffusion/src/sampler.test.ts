// The Euler/CFG loop against ComfyUI's KSampler run in ../shared/testdata/krea2-tiny/sampling/turbo_cfg1
// (euler, simple, 4 steps, cfg 1, seed 42, latent [1, 16, 1, 12, 16]): the denoiser replays ComfyUI's
// own per-step `denoised`, so the loop arithmetic is checked independently of the DiT. Also the noise
// (initial_noise.bin) and the latent model → VAE space conversion. Runs on @tp/backend-cpu.
import { describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { CpuBackend } from "@tp/backend-cpu";
import { isTpError, type Tensor } from "@tp/tensor";
import { wan21ProcessIn, wan21ProcessOut } from "./models/wan-vae.ts";
import { randn } from "./noise.ts";
import { type CondKind, flowDenoiser, noiseScaling, type StepInfo, sampleEuler } from "./sampler.ts";
import { krea2Sigmas } from "./schedule.ts";
import { readF32, relErr } from "./testing/fixtures.ts";

/**
 * Per-step x: ComfyUI divides (x − den) by σ, we multiply by f32(1/σ) (no division op): ≤ 1 ulp of the
 * quotient per step, then scaled by dt (< 1) and added. Bound on |ours − ref| relative to max |ref|.
 * Measured on turbo_cfg1: 0 after step 0 (σ = 1), 5.9e-8 and 5.2e-8 after steps 1–2 (1-ulp flips).
 */
const STEP_TOL = 2e-7;
/** process_in divides by std (we multiply by 1/std): ≤ 1 ulp relative. */
const PROCESS_IN_TOL = 2e-7;

// <repo root>/../shared; this file is packages/diffusion/src/, three levels below the root.
const SHARED = resolve(import.meta.dir, "../../..", "../shared");
const DIR = join(SHARED, "testdata/krea2-tiny/sampling/turbo_cfg1");
const skip = !existsSync(join(DIR, "step3_denoised_cond.bin"));
const note = skip ? ` [skipped: shared fixture missing: ${DIR}]` : "";
const SHAPE = [1, 16, 1, 12, 16];

const fixture = (rel: string) => readF32(join(DIR, rel));

describe(`Euler sampling vs ComfyUI turbo_cfg1${note}`, () => {
  test.skipIf(skip)("noise, every step's x and denoised, the final latent in both spaces", async () => {
    const b = new CpuBackend({ threads: 2 });
    const noise = randn(42, SHAPE, { capability: "default" }); // the fixture machine ran torch's scalar kernel
    expect(Array.from(noise)).toEqual(Array.from(fixture("initial_noise.bin")));
    const sigmas = krea2Sigmas(4);
    expect(Array.from(sigmas)).toEqual(Array.from(fixture("sigmas.bin")));

    const n = b.upload(noise, SHAPE, "f32", "noise");
    const x0 = noiseScaling(b, n, sigmas[0] as number);
    const calls: [number, CondKind][] = [];
    const xs: Float32Array[] = [];
    const dens: Float32Array[] = [];
    const replay = (x: Tensor, sigma: number, cond: CondKind): Tensor => {
      const i = calls.length;
      calls.push([sigma, cond]);
      expect(x.shape).toEqual(SHAPE);
      return b.upload(fixture(`step${i}_denoised_cond.bin`), SHAPE, "f32", `denoised ${i}`);
    };
    const onStep = async (s: StepInfo): Promise<void> => {
      xs.push((await b.read(s.x)) as Float32Array);
      dens.push((await b.read(s.denoised)) as Float32Array);
    };
    const before = b.memory.current;
    const out = await sampleEuler(b, x0, replay, { sigmas, cfg: 1, onStep });
    expect(calls).toEqual([0, 1, 2, 3].map((i) => [sigmas[i] as number, "positive"]));
    expect(b.memory.current - before).toBe(out.byteLength); // every intermediate freed
    for (let i = 0; i < 4; i++) {
      expect(relErr(dens[i] as Float32Array, fixture(`step${i}_denoised_cfg.bin`))).toBe(0);
      if (i < 3)
        expect(relErr(xs[i] as Float32Array, fixture(`step${i + 1}_x.bin`))).toBeLessThanOrEqual(STEP_TOL);
    }
    const finalModel = (await b.read(out)) as Float32Array;
    expect(relErr(finalModel, fixture("final_latent_model_space.bin"))).toBeLessThanOrEqual(STEP_TOL);

    // model → VAE space (Wan21.process_out): bit-exact on the golden model-space latent
    const ref = b.upload(fixture("final_latent_model_space.bin"), SHAPE, "f32");
    const z = wan21ProcessOut(b, ref);
    expect(relErr((await b.read(z)) as Float32Array, fixture("final_latent_vae_space.bin"))).toBe(0);
    // and back (process_in)
    const back = wan21ProcessIn(b, z);
    expect(
      relErr((await b.read(back)) as Float32Array, fixture("final_latent_model_space.bin")),
    ).toBeLessThanOrEqual(PROCESS_IN_TOL * 4);
    b.dispose();
  });
});

describe("sampleEuler (synthetic)", () => {
  /** The ComfyUI formulas in f32 on the host, for one element. */
  function reference(
    x: number,
    dc: (x: number, s: number) => number,
    du: (x: number, s: number) => number,
    sig: number[],
    cfg: number,
  ): number {
    const f = Math.fround;
    let cur = x;
    for (let i = 0; i + 1 < sig.length; i++) {
      const s = sig[i] as number;
      const c = dc(cur, s);
      const den = cfg === 1 ? c : f(du(cur, s) + f(f(c - du(cur, s)) * f(cfg)));
      const d = f(f(cur - den) * f(1 / s));
      cur = f(cur + f(d * f((sig[i + 1] as number) - s)));
    }
    return cur;
  }

  test("CFG: two calls per step, den_u + (den_c − den_u)·cfg, as the host reference", async () => {
    const b = new CpuBackend({ threads: 1 });
    const xv = Float32Array.from([0.5, -1.25, 2, 0.125, -0.75, 3]);
    const x = b.upload(xv, [1, 6], "f32");
    const sigmas = [1, 0.75, 0.5, 0];
    const kc = Math.fround(0.3);
    const ku = Math.fround(-0.2);
    const calls: CondKind[] = [];
    const den = (t: Tensor, _s: number, cond: CondKind): Tensor => {
      calls.push(cond);
      return b.scale(t, cond === "positive" ? kc : ku);
    };
    const out = (await b.read(await sampleEuler(b, x, den, { sigmas, cfg: 4.5 }))) as Float32Array;
    expect(calls).toEqual(["positive", "negative", "positive", "negative", "positive", "negative"]);
    for (let i = 0; i < xv.length; i++) {
      const r = reference(
        xv[i] as number,
        (v) => Math.fround(v * kc),
        (v) => Math.fround(v * ku),
        sigmas,
        4.5,
      );
      expect(out[i]).toBe(Math.fround(r));
    }
    b.dispose();
  });

  test("flowDenoiser: den = x − v·σ", async () => {
    const b = new CpuBackend({ threads: 1 });
    const x = b.upload(Float32Array.from([1, 2, 3]), [3], "f32");
    const d = flowDenoiser(b, (t) => b.scale(t, 0.5));
    const got = (await b.read(await d(x, 0.75, "positive"))) as Float32Array;
    expect(Array.from(got)).toEqual(
      [1, 2, 3].map((v) => Math.fround(v - Math.fround(Math.fround(v * 0.5) * 0.75))),
    );
    b.dispose();
  });

  test("bad arguments", async () => {
    const b = new CpuBackend({ threads: 1 });
    const x = b.upload(new Float32Array(4), [4], "f32");
    const id = (t: Tensor) => b.copy(t);
    const wrong = () => b.upload(new Float32Array(2), [2], "f32");
    const codeOf = async (p: Promise<unknown>) => {
      try {
        await p;
      } catch (e) {
        return isTpError(e) ? e.code : String(e);
      }
      return "ok";
    };
    expect(await codeOf(sampleEuler(b, x, id, { sigmas: [1] }))).toBe("E_ARG");
    expect(await codeOf(sampleEuler(b, x, id, { sigmas: [1, 0, 0] }))).toBe("E_ARG");
    expect(await codeOf(sampleEuler(b, x, id, { sigmas: [1, 0], cfg: Number.NaN }))).toBe("E_ARG");
    expect(await codeOf(sampleEuler(b, x, wrong, { sigmas: [1, 0] }))).toBe("E_SHAPE");
    b.dispose();
  });
});
