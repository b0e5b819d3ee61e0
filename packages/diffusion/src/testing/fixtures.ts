/**
 * Test helpers shared by @tp/diffusion's tests: where ../shared lies (resolved from the repository
 * root, beside the checkout as CI has it), raw little-endian f32 fixture files, and the error measure
 * the goldens are compared with.
 */
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
