/**
 * The fast random values of the random-weight checkpoints (random-checkpoints.ts, random-text-encoder.ts):
 * real-size checkpoints hold billions of values, which torch-compatible `randn` would take an hour to draw.
 */

/**
 * `n` uniform values with standard deviation `sigma` (U(−√3σ, √3σ)) from a 32-bit LCG (Numerical
 * Recipes' constants) seeded by (seed, index): the same (seed, index) gives the same values.
 */
export function uniform(n: number, sigma: number, seed: number, index: number): Float32Array {
  const step = (Math.sqrt(3) * sigma) / 2 ** 31; // int32 → [−√3σ, √3σ)
  const v = new Float32Array(n);
  let s = (Math.imul(seed + 1, 0x9e3779b1) ^ Math.imul(index + 1, 0x85ebca6b)) | 0;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) | 0;
    v[i] = s * step;
  }
  return v;
}
