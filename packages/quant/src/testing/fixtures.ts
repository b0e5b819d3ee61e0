/**
 * TEST-ONLY helpers: where the shared, read-only fixtures live, why a test skips, small readers, and a
 * seeded generator. Never used by the package itself.
 *
 * The shared folder sits beside the repository (`../shared` from the repo root), both here and in CI,
 * which clones the repository elsewhere with `shared/` beside it.
 */

import { existsSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";

/** `<repo root>/../shared`. This file is packages/quant/src/testing/, four levels below the root. */
export const SHARED_DIR = resolve(import.meta.dir, "../../../..", "../shared");

/** Absolute path of a file under the shared folder. */
export function sharedPath(...parts: string[]): string {
  return join(SHARED_DIR, ...parts);
}

/**
 * Why a test that needs these shared paths must skip, or null when they all exist. Use as
 * `test.skipIf(reason !== null)(`name${skipNote(reason)}`, ...)` so the reason shows in the output.
 */
export function missingReason(...paths: string[]): string | null {
  const missing = paths.filter((p) => !existsSync(p));
  return missing.length === 0 ? null : `shared fixture missing: ${missing.join(", ")}`;
}

/** " [skipped: reason]" when a reason is given, for test names. */
export function skipNote(reason: string | null): string {
  return reason === null ? "" : ` [skipped: ${reason}]`;
}

/** Read a raw little-endian f32 file. */
export function readF32(path: string): Float32Array {
  const b = readFileSync(path);
  return new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));
}

/** Read a raw byte file. */
export function readU8(path: string): Uint8Array {
  return new Uint8Array(readFileSync(path));
}

/** Seeded PRNG (mulberry32) → uniform [0, 1), so failures reproduce. */
export function uniform(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Seeded standard normal values (Box–Muller), rounded to f32. */
export function gaussian(seed: number, n: number, sigma = 1): Float32Array {
  const u = uniform(seed);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i += 2) {
    const r = Math.sqrt(-2 * Math.log(1 - u()));
    const t = 2 * Math.PI * u();
    out[i] = sigma * r * Math.cos(t);
    if (i + 1 < n) out[i + 1] = sigma * r * Math.sin(t);
  }
  return out;
}

/** Catch a thrown value (for asserting on TpError fields). */
export function thrown(f: () => unknown): unknown {
  try {
    f();
  } catch (e) {
    return e;
  }
  throw new Error("expected the call to throw");
}
