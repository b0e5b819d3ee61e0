/**
 * Test helpers shared by @tp/diffusion's tests (test-only: not in `@tp/diffusion/testing`): where ../shared lies (resolved from the repository
 * root, beside the checkout as CI has it), raw little-endian f32 fixture files, the error measure
 * the goldens are compared with, and a sampling run measured against a ComfyUI run's saved files.
 */
import { expect } from "bun:test";
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";

/** ../shared beside the repository root (read-only test data; may be absent). */
export const SHARED = resolve(import.meta.dir, "../../../..", "../shared");
/** The tiny Krea 2 goldens computed by ComfyUI's code (../shared/testdata/krea2-tiny/README.md). */
export const KREA2_TINY = join(SHARED, "testdata/krea2-tiny");

/** A raw little-endian f32 file (the fixtures' format) as a Float32Array (a copy). @throws on I/O errors */
export function readF32(path: string): Float32Array {
  const b = readFileSync(path);
  return new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));
}

/**
 * max |ours − ref| / max |ref| — the relative error the golden tests state tolerances in. A NaN
 * anywhere in `ours` gives +∞ (so no tolerance passes it).
 * @throws Error when the lengths differ
 */
export function relErr(ours: ArrayLike<number>, ref: ArrayLike<number>): number {
  if (ours.length !== ref.length) throw new Error(`relErr: ${ours.length} values against ${ref.length}`);
  let diff = 0;
  let scale = 0;
  for (let i = 0; i < ref.length; i++) {
    const d = Math.abs((ours[i] as number) - (ref[i] as number));
    diff = Number.isNaN(d) ? Number.POSITIVE_INFINITY : Math.max(diff, d);
    scale = Math.max(scale, Math.abs(ref[i] as number));
  }
  return diff / scale;
}

/**
 * The settings of ComfyUI's turbo_cfg1 run (`<KREA2_TINY>/sampling/turbo_cfg1`, cfg 1): 128×96, 4
 * steps, seed 42, and torch's scalar randn kernel, which the fixture machine ran.
 */
export const TURBO_CFG1 = { width: 128, height: 96, steps: 4, seed: 42, noiseKernel: "default" } as const;

/**
 * Expect a Krea 2 sampling run to match the ComfyUI run saved in `dir` (`<KREA2_TINY>/sampling/<run>`):
 * the same sigmas; one step state per step (`states`, as `onStep` read them), each but the last within
 * `tol.latent` (relErr) of `step<i+1>_x.bin`; both final latents (sampler and VAE space) within
 * `tol.latent`; and the 8-bit image against ComfyUI's SaveImage of `decoded_image01.bin`
 * (trunc(f32(255·p)), interleaved): no byte off by more than one, at most `tol.bytesOffByOne` off by one.
 */
export function expectComfyRun(
  dir: string,
  run: {
    readonly sigmas: Float32Array;
    readonly latent: Float32Array;
    readonly modelLatent: Float32Array;
    readonly rgb: Uint8Array;
    readonly width: number;
    readonly height: number;
  },
  states: readonly Float32Array[],
  tol: { readonly latent: number; readonly bytesOffByOne: number },
): void {
  expect(Array.from(run.sigmas)).toEqual(Array.from(readF32(join(dir, "sigmas.bin"))));
  expect(states.length).toBe(run.sigmas.length - 1);
  for (let i = 0; i + 1 < states.length; i++) {
    expect(relErr(states[i] as Float32Array, readF32(join(dir, `step${i + 1}_x.bin`)))).toBeLessThanOrEqual(
      tol.latent,
    );
  }
  expect(relErr(run.modelLatent, readF32(join(dir, "final_latent_model_space.bin")))).toBeLessThanOrEqual(
    tol.latent,
  );
  expect(relErr(run.latent, readF32(join(dir, "final_latent_vae_space.bin")))).toBeLessThanOrEqual(
    tol.latent,
  );
  const img01 = readF32(join(dir, "decoded_image01.bin"));
  const plane = run.width * run.height;
  expect([run.rgb.length, img01.length]).toEqual([plane * 3, plane * 3]);
  let off = 0;
  let maxOff = 0;
  for (let c = 0; c < 3; c++) {
    for (let i = 0; i < plane; i++) {
      const ref = Math.trunc(Math.fround(255 * (img01[c * plane + i] as number)));
      const d = Math.abs(ref - (run.rgb[i * 3 + c] as number));
      if (d > 0) off++;
      maxOff = Math.max(maxOff, d);
    }
  }
  expect(maxOff).toBeLessThanOrEqual(1);
  expect(off).toBeLessThanOrEqual(tol.bytesOffByOne);
}
