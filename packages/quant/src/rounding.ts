/**
 * The three rounding rules the reference quantizers need, each named after the code it reproduces.
 * All take a JS number that is already an f32 value (the callers round intermediate results with
 * `Math.fround` exactly where the C/torch code rounds to f32) and return an integer-valued number.
 *
 * - {@link roundHalfEven}: torch `round()` / IEEE roundTiesToEven — ComfyUI ConvRot and fp8 quantizers.
 * - {@link nearestInt}: ggml's `nearest_int` (ggml/src/ggml-quants.c), also ties to even, via the
 *   `+ 12582912.f` trick; defined only for |x| ≤ 4194303.
 * - {@link roundHalfAway}: C `roundf` (ties away from zero) — ggml's Q8_0 / Q8_1 quantizers.
 */

/**
 * Round to the nearest integer, ties to even (torch.round, numpy.rint, IEEE 754 roundTiesToEven).
 * @param x finite number
 * @returns the nearest integer; -0 is returned as 0
 */
export function roundHalfEven(x: number): number {
  const r = Math.round(x); // ties toward +inf
  if (r - x === 0.5 && r % 2 !== 0) return r - 1;
  return r === 0 ? 0 : r;
}

/**
 * ggml's `nearest_int(float fval)`: adds 1.5·2^23 in f32 so the FPU's round-to-nearest-even drops the
 * fraction, then reads the integer back from the mantissa bits.
 * Source: ggml-org/llama.cpp ggml/src/ggml-quants.c `nearest_int` (asserts |fval| ≤ 4194303).
 * @param x an f32 value with |x| ≤ 4194303 (larger magnitudes are outside ggml's contract)
 */
export function nearestInt(x: number): number {
  // 12582912 = 1.5 * 2^23: every f32 in [2^23, 2^24) is an integer, so the sum is rounded to one.
  const v = Math.fround(Math.fround(x) + 12582912);
  return v - 12582912;
}

/**
 * C `roundf`: nearest integer, ties away from zero (ggml `quantize_row_q8_0_ref`).
 * @param x finite number
 */
export function roundHalfAway(x: number): number {
  const r = Math.floor(Math.abs(x) + 0.5); // exact in f64 for every f32 input below 2^52
  return x < 0 ? (r === 0 ? 0 : -r) : r;
}
