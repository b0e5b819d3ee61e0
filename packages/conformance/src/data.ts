/**
 * Seeded test data, so every failure reproduces: a mulberry32 generator, normal values by
 * Box–Muller, and helpers for integer ids and positions. Values are rounded to f32 (they are uploaded
 * as f32 tensors), so references see exactly what backends see.
 */

/** Uniform [0, 1) from a 32-bit seed (mulberry32, Tommy Ettinger 2017). */
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

/** n standard normal values × sigma (+ mean), rounded to f32. */
export function gaussian(seed: number, n: number, sigma = 1, mean = 0): Float32Array {
  const u = uniform(seed);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i += 2) {
    const r = Math.sqrt(-2 * Math.log(1 - u()));
    const t = 2 * Math.PI * u();
    out[i] = mean + sigma * r * Math.cos(t);
    if (i + 1 < n) out[i + 1] = mean + sigma * r * Math.sin(t);
  }
  return out;
}

/** n values uniform in [lo, hi), rounded to f32. */
export function uniformF32(seed: number, n: number, lo: number, hi: number): Float32Array {
  const u = uniform(seed);
  return Float32Array.from({ length: n }, () => lo + (hi - lo) * u());
}

/** n integers uniform in [lo, hi]. */
export function integers(seed: number, n: number, lo: number, hi: number): Int32Array {
  const u = uniform(seed);
  return Int32Array.from({ length: n }, () => lo + Math.floor(u() * (hi - lo + 1)));
}

/** 0, 1, …, n − 1 (+ start) as i32. */
export function range(n: number, start = 0): Int32Array {
  return Int32Array.from({ length: n }, (_, i) => start + i);
}
