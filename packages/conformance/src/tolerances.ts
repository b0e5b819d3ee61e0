/**
 * Per-op tolerances of the conformance suite, each a named constant with the reason for its size.
 * Outputs are compared with the reference (f64 unless said) in one of three ways:
 * - exact: every element equal (NaN equals NaN; +0 equals −0);
 * - close: |actual − expected| ≤ atol + rtol·|expected| for every element;
 * - nmse: Σ(actual − expected)² / Σ expected² ≤ max, the normalised mean squared error of llama.cpp's
 *   `tests/test-backend-ops.cpp` (default 1e-7, mul_mat 5e-4), for ops that sum many products.
 */

/** How an output is compared with its reference. */
export type Tolerance =
  | { readonly kind: "exact"; readonly why: string }
  | { readonly kind: "close"; readonly atol: number; readonly rtol: number; readonly why: string }
  | { readonly kind: "nmse"; readonly max: number; readonly why: string };

/** Data movement, integer results, and single correctly rounded f32 operations (+, −, ×, casts). */
export const EXACT: Tolerance = {
  kind: "exact",
  why: "moves bits, or one IEEE f32 rounding of an exact result: every backend gets the same bits",
};

/** silu, sigmoid, swiglu: e^x in f32. */
export const SIGMOID_FAMILY: Tolerance = {
  kind: "close",
  atol: 1e-7,
  rtol: 4e-6,
  why: "f32 exp (libm or a degree-7 polynomial, ≤ 2 ulp) plus a divide and a multiply: a few ulp",
};

/** gelu (erf and tanh forms). */
export const GELU: Tolerance = {
  kind: "close",
  atol: 1e-6,
  rtol: 4e-6,
  why: "½x(1 + erf): f32 erf is off by a few ulp of 1 (2.4e-7) near −1, times ½|x| ≤ 2.8 before erf saturates",
};

/** x · (1 + scale) + shift. */
export const MODULATE: Tolerance = {
  kind: "close",
  atol: 1e-6,
  rtol: 1e-6,
  why: "three f32 roundings (1 + s, ×, +) or fused; + shift can cancel, so an absolute term at |x| ~ 4",
};

/** softmax along any dimension. */
export const SOFTMAX: Tolerance = {
  kind: "close",
  atol: 1e-8,
  rtol: 5e-6,
  why: "f32 exp per element (≤ 2 ulp) and an f32 or f64 row sum over up to 1000 terms",
};

/** rms_norm, layer_norm, group_norm. */
export const NORM: Tolerance = {
  kind: "close",
  atol: 1e-6,
  rtol: 5e-6,
  why: "f32 statistics (blocked sums) and three f32 roundings per output; eps rounded to f32",
};

/** rope (every mode). */
export const ROPE: Tolerance = {
  kind: "close",
  atol: 2e-6,
  rtol: 2e-6,
  why: "cos / sin rounded to f32 (angles up to 4e4 rad computed in f64), two f32 products and a sum",
};

/** attention (every mask). */
export const ATTENTION: Tolerance = {
  kind: "nmse",
  max: 1e-7,
  why: "sums of up to 200 products in f32, f32 exp, the online softmax's rescaling: llama.cpp's default",
};

/** conv2d. */
export const CONV2D: Tolerance = {
  kind: "nmse",
  max: 1e-7,
  why: "sums of up to 400 f32 products (im2col GEMM order): llama.cpp's default",
};

/** matmul, every weight format. */
export const MATMUL: Tolerance = {
  kind: "nmse",
  max: 5e-4,
  why: "llama.cpp's mul_mat limit: bf16 / fp8 activation rounding, blockwise integer sums vs f64",
};

/** embedding (get_rows): dequantized rows. */
export const EMBEDDING: Tolerance = {
  kind: "close",
  atol: 0,
  rtol: 1e-6,
  why: "dequantization is one or two f32 roundings per value (ggml's float order); allow one ulp",
};

/** The torch vectors of op_vectors.json (printed with 9 significant digits). */
export const TORCH_VECTORS: Tolerance = {
  kind: "close",
  atol: 2e-6,
  rtol: 0,
  why: "torch 2.6 f32 values; the fixture notes deviations up to 8e-7 from f64 formulas",
};

/** softplus: log1p(e^x) in f64, rounded once. */
export const SOFTPLUS: Tolerance = {
  kind: "close",
  atol: 1e-7,
  rtol: 4e-6,
  why: "log1p(e^x) in f64 or f32 libm (a few ulp), rounded to f32; x itself above 20",
};

/** ssm_conv: K products per output. */
export const SSM_CONV: Tolerance = {
  kind: "close",
  atol: 1e-6,
  rtol: 1e-5,
  why: "a sum of K (4) f32 products in f32: K roundings; an absolute term where the products cancel",
};

/** gated_delta_net: the recurrence over n tokens, its outputs and the final state. */
export const DELTA_NET: Tolerance = {
  kind: "nmse",
  max: 1e-9,
  why: "f32 state rounded after every token (sequential form) or every chunk (chunked, f64 inside), Dk-long f32 dot products; the decay (≤ 1) and the delta rule's correction keep the errors from growing",
};
