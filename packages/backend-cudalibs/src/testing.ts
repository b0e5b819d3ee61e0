/**
 * Test helpers of the cuda backend (test code only): the float64 reference its matmul tests compare
 * with, computed here independently of cuBLASLt's layouts.
 */

/**
 * y[t, o] = Σ_k x[t, k] · w[o, k] (+ b[o]) in float64: x [T, K], w [N, K] and y [T, N] row-major, b [N]
 * or null (the linear layer y = x·wᵀ + b).
 */
export function referenceLinear(
  x: readonly number[],
  w: readonly number[],
  b: readonly number[] | null,
  T: number,
  K: number,
  N: number,
): number[] {
  const y: number[] = [];
  for (let t = 0; t < T; t++)
    for (let o = 0; o < N; o++) {
      let s = b === null ? 0 : (b[o] as number);
      for (let k = 0; k < K; k++) s += (x[t * K + k] as number) * (w[o * K + k] as number);
      y.push(s);
    }
  return y;
}
