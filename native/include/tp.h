/*
 * TensorPencil native CPU library: the plain C ABI that @tp/backend-cpu loads with bun:ffi.
 *
 * Conventions (see ../shared/STYLE.md §4):
 *   - Every entry point that can fail returns a tp_status (0 = TP_OK). The message of the last
 *     failure on a context is read with tp_ctx_error().
 *   - JavaScript owns every buffer passed in; native code never keeps a pointer after a call
 *     returns, and never reads or writes outside [ptr, ptr + the byte count implied by n).
 *   - No hidden global state: the thread pool and the chosen instruction-set level live in a
 *     tp_ctx that the caller creates and destroys.
 */
#ifndef TP_H
#define TP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TP_API __attribute__((visibility("default")))

/* Status codes. TypeScript maps them onto TpError codes (E_ARG, E_OOM, E_UNSUPPORTED, E_INTERNAL). */
typedef int32_t tp_status;
#define TP_OK 0
#define TP_ERR_ARG 1         /* a bad argument: null pointer, unknown dtype, n too large */
#define TP_ERR_OOM 2         /* an allocation failed */
#define TP_ERR_UNSUPPORTED 3 /* a valid request this build cannot serve (e.g. a dtype pair) */
#define TP_ERR_INTERNAL 4    /* a native failure (thread creation, ...) */

/* Element types of the conversion kernels. The numbers are part of the ABI: ffi.ts mirrors them. */
typedef enum tp_dtype {
  TP_F32 = 0,
  TP_F16 = 1,       /* IEEE 754 binary16 */
  TP_BF16 = 2,      /* bfloat16: the upper 16 bits of an f32 */
  TP_F8_E4M3FN = 3, /* OCP FP8 E4M3 (bias 7, no infinities, S.1111.111 = NaN, max 448) */
  TP_F8_E5M2 = 4    /* OCP FP8 E5M2 (bias 15, IEEE-like infinities and NaNs, max 57344) */
} tp_dtype;

/* Instruction-set levels the kernels are compiled for; chosen at run time (tp_ctx_create). */
typedef enum tp_isa { TP_ISA_SCALAR = 0, TP_ISA_AVX2 = 1, TP_ISA_AVX512 = 2 } tp_isa;

/* CPU feature bits reported by tp_cpu_features(). */
#define TP_CPU_AVX2 (1u << 0)
#define TP_CPU_FMA (1u << 1)
#define TP_CPU_F16C (1u << 2)
#define TP_CPU_AVX512F (1u << 3)
#define TP_CPU_AVX512BW (1u << 4)
#define TP_CPU_AVX512VL (1u << 5)
#define TP_CPU_AVX512VNNI (1u << 6)
#define TP_CPU_AVX512BF16 (1u << 7)
#define TP_CPU_AVXVNNI (1u << 8)
#define TP_CPU_AVX512VBMI (1u << 9)

/* Flags of tp_cpu_cast. */
#define TP_CAST_SATURATE (1u << 0) /* f32 -> fp8: clamp overflow and +-inf to +-max finite */

/* ABI version; ffi.ts refuses a library whose version differs. */
#define TP_ABI_VERSION 1
TP_API int32_t tp_abi_version(void);

/* Feature bits of the CPU this process runs on (cpuid + xgetbv: OS support for the registers). */
TP_API uint32_t tp_cpu_features(void);

/* Number of online logical CPUs (sysconf), at least 1. */
TP_API int32_t tp_cpu_count(void);

typedef struct tp_ctx tp_ctx;

/*
 * Create a context: a pool of n_threads - 1 worker threads (the caller's thread is the n-th) and
 * the instruction-set level min(max_isa, best the CPU supports). n_threads <= 0 means
 * tp_cpu_count(). n_threads is clamped to [1, 256]. Returns NULL when threads cannot be started.
 */
TP_API tp_ctx *tp_ctx_create(int32_t n_threads, int32_t max_isa);
TP_API void tp_ctx_destroy(tp_ctx *ctx);
TP_API int32_t tp_ctx_threads(const tp_ctx *ctx);
TP_API int32_t tp_ctx_isa(const tp_ctx *ctx);
/* NUL-terminated message of the last failure on ctx ("" if none); valid until the next call on ctx. */
TP_API const char *tp_ctx_error(const tp_ctx *ctx);

/* 64-byte-aligned host memory for tensors. tp_alloc returns NULL on failure or bytes == 0. */
TP_API void *tp_alloc(uint64_t bytes);
TP_API void tp_free(void *p);

/*
 * cast: convert n elements from src (src_dtype) to dst (dst_dtype), bit-exact, element i to i.
 * Supported pairs: F32 <-> F16, F32 <-> BF16, F32 <-> F8_E4M3FN, F32 <-> F8_E5M2, and any dtype
 * to itself (a copy). Rounding is to nearest, ties to even. NaN rules (same as @tp/tensor convert.ts):
 *   f16 -> f32: payload kept, quiet bit set (as x86 VCVTPH2PS)
 *   f32 -> f16: sign | 0x7E00 | mantissa >> 13 (as x86 VCVTPS2PH)
 *   bf16 -> f32: bits << 16, exactly
 *   f32 -> bf16: sign | upper payload | quiet bit 0x0040
 *   f32 -> fp8: S.1111.111 (e4m3fn) / S.11111.11 (e5m2)
 *   e5m2 -> f32: payload kept, quiet bit set (S.11111.mm -> sign | 0x7FC00000 | mm << 21)
 *   e4m3fn -> f32: S.1111.111 -> sign | 0x7FC00000 (torch c10 gives sign | 0x7FF00000)
 * fp8 -> f32 and f16/bf16 -> f32 are exact (every value, subnormals included, is an f32).
 * Overflow to fp8 without TP_CAST_SATURATE: e4m3fn -> NaN (torch float8_e4m3fn), e5m2 -> +-inf;
 * with TP_CAST_SATURATE: +-max finite (also for +-inf), as CUDA's __NV_SATFINITE.
 * Source and destination must not overlap. Work is split over the context's threads.
 */
TP_API tp_status tp_cpu_cast(tp_ctx *ctx, const void *src, int32_t src_dtype, void *dst, int32_t dst_dtype,
                             uint64_t n, uint32_t flags);

/*
 * ---- weights: matmul, get_rows, dequantization (native/cpu/matmul.h lists the files) -----------
 * A weight is [n, k] (n output rows, k input columns, y = x · Wᵀ) stored row by row in one of the
 * formats below; `w_bytes` is checked against n rows of the format's row size. Formats with scales
 * take them in `scale` / `n_scale`: ConvRot one f32 per row (n_scale = n), fp8 optionally one f32
 * for the tensor (n_scale = 1; 0: raw fp8); the rest none (n_scale = 0). `group` is the ConvRot
 * rotation group (a power of 4 dividing k; 0 for other formats). Weight bytes need no alignment.
 */

/* Weight formats (the numbers are part of the ABI: ffi.ts mirrors them). */
typedef enum tp_wformat {
  TP_W_F32 = 0,
  TP_W_F16 = 1,
  TP_W_BF16 = 2,
  TP_W_F8_E4M3FN = 3,
  TP_W_F8_E5M2 = 4,
  TP_W_INT8_CONVROT = 5, /* int8 codes of the Hadamard-rotated rows, f32 scale per row (krea2.md §1.7) */
  TP_W_INT4_CONVROT = 6, /* the same with two signed nibbles per byte, element 2i low (krea2.md §1.8) */
  TP_W_Q4_0 = 7,         /* GGUF block types (llm.md §2.2–2.3) */
  TP_W_Q4_1 = 8,
  TP_W_Q5_0 = 9,
  TP_W_Q5_1 = 10,
  TP_W_Q8_0 = 11,
  TP_W_Q2_K = 12,
  TP_W_Q3_K = 13,
  TP_W_Q4_K = 14,
  TP_W_Q5_K = 15,
  TP_W_Q6_K = 16,
  TP_W_IQ4_NL = 17,      /* ggml's non-linear 4-bit grid kvalues_iq4nl (llm.md §2.4) */
  TP_W_IQ4_XS = 18
} tp_wformat;

/* Bytes of one weight row of k elements in `format`; -1 for an unknown format or k not whole blocks. */
TP_API int64_t tp_weight_row_bytes(int32_t format, int64_t k);

/*
 * matmul: y[m, n] = x[m, k] · Wᵀ (+ bias[n]), f32 in and out (bias may be NULL). Activations are
 * prepared per format as llama.cpp / ComfyUI pair them (llm.md §2.6, krea2.md §1.7–1.8): GGUF
 * types quantize x per row to Q8_0 (Q4_0, Q5_0, Q8_0, IQ4_NL), Q8_1 (Q4_1, Q5_1) or Q8_K (k-quants,
 * IQ4_XS) and
 * take integer dot products per block; ConvRot rotates and quantizes x per row (int8 / int4,
 * round half to even) and takes exact int32 dot products, rescaled exactly as @tp/quant's
 * convRotLinear (bit-exact); bf16 and fp8 round x to bf16 (products exact, f32 sums); f32 and f16
 * use x as is with f32 sums. y must not overlap x or the weight.
 */
TP_API tp_status tp_cpu_matmul(tp_ctx *ctx, const float *x, int64_t m, int64_t k, int32_t format, const void *w,
                               uint64_t w_bytes, int64_t n, const float *scale, int64_t n_scale, int32_t group,
                               const float *bias, float *y);

/*
 * matmul_id (ggml mul_mat_id): y[r, :] = x[t, sx == 1 ? 0 : j, :] · W_eᵀ for each row r = t·s + j
 * (t < tokens, j < s slots) with e = ids[r], where the weight holds n_expert experts stacked
 * expert-major ([n_expert · n, k] in `format`: expert e is rows [e·n, (e+1)·n), read in place). x:
 * [t, sx, k] f32 with sx 1 or s; ids: [t, s]; y: [t, s, n]. Each expert's rows are gathered and run as
 * one tp_cpu_matmul over its sub-view (the same numbers as tp_cpu_matmul row for row); experts no row
 * chose are not read. scale: as tp_cpu_matmul for the whole stack (ConvRot: n_expert · n row scales).
 * An id outside [0, n_expert) is TP_ERR_ARG (nothing is written). y must not overlap an input.
 */
TP_API tp_status tp_cpu_matmul_id(tp_ctx *ctx, const float *x, int64_t t, int64_t sx, int64_t k, int32_t format,
                                  const void *w, uint64_t w_bytes, int64_t n_expert, int64_t n, const float *scale,
                                  int64_t n_scale, int32_t group, const int32_t *ids, int64_t s, float *y);

/*
 * Repacked Q8_0 / Q4_0 weights for the GEMV and small batches (rows interleaved 16 at a time; layout
 * in native/cpu/matmul.h). tp_weight_repack_bytes: bytes of the layout for [n, k] (-1 for another
 * format or k not a multiple of 32). tp_cpu_repack_weight: w (n · tp_weight_row_bytes bytes) → out
 * (exactly that many bytes; must not overlap w); TP_ERR_UNSUPPORTED for other formats.
 * tp_cpu_matmul_repacked: y = x · Wᵀ (+ bias) from the repacked bytes, the same numbers as tp_cpu_matmul
 * up to f32 summation order (x quantized to Q8_0 the same way, the same exact int32 block sums);
 * needs the AVX-512 VNNI level (else TP_ERR_UNSUPPORTED).
 */
TP_API int64_t tp_weight_repack_bytes(int32_t format, int64_t n, int64_t k);
TP_API tp_status tp_cpu_repack_weight(tp_ctx *ctx, int32_t format, const void *w, uint64_t w_bytes, int64_t n,
                                      int64_t k, void *out, uint64_t out_bytes);
TP_API tp_status tp_cpu_matmul_repacked(tp_ctx *ctx, const float *x, int64_t m, int64_t k, int32_t format,
                                        const void *packed, uint64_t packed_bytes, int64_t n, const float *bias,
                                        float *y);

/*
 * get_rows: out[i, :] = dequantized row ids[i] of the weight [n, k] (i < n_ids), as @tp/quant's
 * dequantizers compute it, bit for bit. ids NULL means rows 0 .. n_ids−1. An id outside [0, n) is
 * TP_ERR_ARG (nothing is written).
 */
TP_API tp_status tp_cpu_get_rows(tp_ctx *ctx, int32_t format, const void *w, uint64_t w_bytes, int64_t n, int64_t k,
                                 const float *scale, int64_t n_scale, int32_t group, const int32_t *ids,
                                 int64_t n_ids, float *out);

/* Activation block types of tp_cpu_quantize_act (ggml block_q8_0, block_q8_1, block_q8_K). */
#define TP_ACT_BLOCK_Q8_0 0
#define TP_ACT_BLOCK_Q8_1 1
#define TP_ACT_BLOCK_Q8_K 2

/*
 * quantize_act: rows [m, k] of x to ggml activation blocks, as ggml's quantize_row_q8_0_ref /
 * q8_1_ref / q8_K_ref (bit-exact with @tp/quant quantizeGgml). out: m · k / 32 · 34 (Q8_0),
 * · 36 (Q8_1) or m · k / 256 · 292 (Q8_K) bytes, out_bytes exactly that.
 */
TP_API tp_status tp_cpu_quantize_act(tp_ctx *ctx, int32_t type, const float *x, int64_t m, int64_t k, void *out,
                                     uint64_t out_bytes);

/*
 * convrot_quantize: rotate each row of x [m, k] per group of `group` columns and quantize it to
 * `bits` (8 or 4) as ComfyUI does before an integer GEMM (@tp/quant quantizeActivationsConvRot,
 * bit-exact): codes [m, k] int8, scales [m] f32.
 */
TP_API tp_status tp_cpu_convrot_quantize(tp_ctx *ctx, const float *x, int64_t m, int64_t k, int32_t bits,
                                         int32_t group, int8_t *codes, float *scales);

/*
 * quantize_weight (native/cpu/quantize_w.c): a dense weight [n, k] of src_dtype TP_F32 / TP_F16 /
 * TP_BF16 (src_bytes = n·k·element size, any alignment) → `format`, bit for bit as @tp/quant's
 * reference quantizers (bytes and f32 scale bits):
 *   TP_W_INT8_CONVROT / TP_W_INT4_CONVROT  quantizeConvRot (f64 rotation in groups of `group`, a power
 *       of 4 dividing k; per-row abs-max scale; round half to even): out n·k / n·k/2 bytes, scales [n]
 *       (n_scales = n); a row holding NaN gets scale NaN (0x7FC00000) and codes 0;
 *   TP_W_F8_E4M3FN  quantizeFp8Scaled (one scale for the whole tensor): out n·k bytes, scales [1];
 *       all-zero → scale 1; NaN in the tensor, or a scale too small to invert, is TP_ERR_ARG;
 *   TP_W_Q8_0 / TP_W_Q4_0 / TP_W_Q4_K / TP_W_Q6_K  quantizeGgml (llama.cpp's reference scale
 *       choices): k a multiple of 32 / 256, out n · tp_weight_row_bytes(format, k), no scales
 *       (n_scales = 0, group = 0).
 * out_bytes must be exactly the size above. Other formats are TP_ERR_UNSUPPORTED. Outputs must not
 * overlap src. Work is split over the context's threads (rows, blocks, or chunks for fp8); the result
 * does not depend on the thread count or the ISA level.
 */
TP_API tp_status tp_cpu_quantize_weight(tp_ctx *ctx, int32_t format, const void *src, int32_t src_dtype,
                                        uint64_t src_bytes, int64_t n, int64_t k, int32_t group, void *out,
                                        uint64_t out_bytes, float *scales, int64_t n_scales);

/*
 * ---- ops on f32 activations (native/cpu/ops.h lists the files) ----------------------------------
 * Common rules: every pointer is to the first element of a buffer the caller owns; buffers are
 * contiguous row-major unless strides are passed; sizes are element counts; outputs never overlap
 * inputs. Strided entry points take `*_len`, the elements available from the pointer onward, and
 * refuse a view that would reach past it. Each entry point checks its sizes and returns
 * TP_ERR_ARG with a message naming the argument. Work is split over the context's threads.
 */

/*
 * copy: dst[i] = src[i] over an n-dimensional index space `shape` (rank <= 16), any element size
 * (1, 2, 4 or 8 bytes). Strides are in elements and non-negative (0 broadcasts). Serves copy,
 * slice and concat (a strided destination).
 */
TP_API tp_status tp_cpu_copy(tp_ctx *ctx, const void *src, uint64_t src_len, const int64_t *src_strides, void *dst,
                             uint64_t dst_len, const int64_t *dst_strides, const int64_t *shape, int32_t rank,
                             int32_t elem_bytes);

/* Unary elementwise over n contiguous elements: silu x·σ(x), sigmoid, gelu (approximate 0: erf, 1: tanh). */
TP_API tp_status tp_cpu_silu_f32(tp_ctx *ctx, const float *x, float *y, uint64_t n);
TP_API tp_status tp_cpu_sigmoid_f32(tp_ctx *ctx, const float *x, float *y, uint64_t n);
TP_API tp_status tp_cpu_gelu_f32(tp_ctx *ctx, const float *x, float *y, uint64_t n, int32_t approximate);
/* y = x · s */
TP_API tp_status tp_cpu_scale_f32(tp_ctx *ctx, const float *x, float *y, uint64_t n, float s);
/* y = silu(gate) · up */
TP_API tp_status tp_cpu_swiglu_f32(tp_ctx *ctx, const float *gate, const float *up, float *y, uint64_t n);

/*
 * Broadcasting binary ops: out (contiguous, `shape`) = a ∘ b, where a and b are read with their
 * own element strides over `shape` (0 on broadcast dimensions).
 */
TP_API tp_status tp_cpu_add_f32(tp_ctx *ctx, const float *a, uint64_t a_len, const int64_t *a_strides, const float *b,
                                uint64_t b_len, const int64_t *b_strides, float *out, const int64_t *shape,
                                int32_t rank);
TP_API tp_status tp_cpu_sub_f32(tp_ctx *ctx, const float *a, uint64_t a_len, const int64_t *a_strides, const float *b,
                                uint64_t b_len, const int64_t *b_strides, float *out, const int64_t *shape,
                                int32_t rank);
TP_API tp_status tp_cpu_mul_f32(tp_ctx *ctx, const float *a, uint64_t a_len, const int64_t *a_strides, const float *b,
                                uint64_t b_len, const int64_t *b_strides, float *out, const int64_t *shape,
                                int32_t rank);
/* out = x · (1 + scale) + shift, all three strided as above (adaLN modulation). */
TP_API tp_status tp_cpu_modulate_f32(tp_ctx *ctx, const float *x, uint64_t x_len, const int64_t *x_strides,
                                     const float *scale, uint64_t scale_len, const int64_t *scale_strides,
                                     const float *shift, uint64_t shift_len, const int64_t *shift_strides, float *out,
                                     const int64_t *shape, int32_t rank);

/* softmax over the middle axis of x viewed as [outer, dim, inner], max-subtracted. */
TP_API tp_status tp_cpu_softmax_f32(tp_ctx *ctx, const float *x, float *y, uint64_t outer, uint64_t dim,
                                    uint64_t inner);

/* Flags of tp_cpu_rms_norm_f32. */
#define TP_NORM_UNIT_OFFSET (1u << 0) /* scale by (1 + weight) (Gemma, Krea 2 zero-centred scales) */

/* RMSNorm of `rows` rows of `dim`: y = x / sqrt(mean(x²) + eps) · weight (weight NULL: 1). */
TP_API tp_status tp_cpu_rms_norm_f32(tp_ctx *ctx, const float *x, const float *weight, float *y, uint64_t rows,
                                     uint64_t dim, float eps, uint32_t flags);
/* LayerNorm of rows: y = (x − mean) / sqrt(var + eps) · weight + bias (biased var; weight, bias may be NULL). */
TP_API tp_status tp_cpu_layer_norm_f32(tp_ctx *ctx, const float *x, const float *weight, const float *bias, float *y,
                                       uint64_t rows, uint64_t dim, float eps);
/* GroupNorm of x [batch, channels, spatial]; weight, bias [channels] or NULL. */
TP_API tp_status tp_cpu_group_norm_f32(tp_ctx *ctx, const float *x, const float *weight, const float *bias, float *y,
                                       uint64_t batch, uint64_t channels, uint64_t spatial, uint64_t groups, float eps);

/* Softplus over n contiguous elements: y = log(1 + e^x) (x > 20: y = x, as ggml). */
TP_API tp_status tp_cpu_softplus_f32(tp_ctx *ctx, const float *x, float *y, uint64_t n);

/*
 * Depthwise causal conv over time (ggml_ssm_conv): x [t_out + taps − 1, channels] (the taps − 1
 * previous inputs, then the new ones), w [channels, taps] (tap 0 the oldest) → y [t_out, channels],
 * y[t][c] = Σ_j w[c][j] · x[t + j][c]. No bias, no activation. All contiguous.
 */
TP_API tp_status tp_cpu_ssm_conv_f32(tp_ctx *ctx, const float *x, const float *w, float *y, uint64_t t_out,
                                     uint64_t channels, uint64_t taps);

/*
 * Gated delta rule (Gated DeltaNet; Qwen 3.5 linear attention): q, k [n, k_heads, dk], v, out
 * [n, v_heads, dv], g (log decay), beta [n, v_heads], state [v_heads, dk, dv] read and updated in place.
 * Value head j uses key head j mod k_heads. Per token: S ← e^g S; δ = β(v − Sᵀk); S ← S + kδᵀ;
 * out = scale · Sᵀq. chunk 0: token by token (f32); chunk C > 0: the chunked form over C tokens at a
 * time (f64 inside a chunk), the same function up to rounding. All contiguous.
 */
TP_API tp_status tp_cpu_gated_delta_net_f32(tp_ctx *ctx, const float *q, const float *k, const float *v,
                                            const float *g, const float *beta, float *state, float *out,
                                            uint64_t n_tokens, uint64_t k_heads, uint64_t v_heads, uint64_t dk,
                                            uint64_t dv, float scale, int32_t chunk);

/* Modes of tp_cpu_rope_f32. */
#define TP_ROPE_NEOX 0        /* pairs (i, i + rope_dims/2) */
#define TP_ROPE_INTERLEAVED 1 /* pairs (2i, 2i + 1) */

/*
 * RoPE on x [batch, seq, heads, head_dim]. positions: i32 [n_axes, seq] with n_axes = n_sections (1
 * when n_sections is 0). The rope_dims/2 pairs form consecutive sections (sizes in pairs, summing to
 * rope_dims/2; no sections: one section of all pairs); pair k of a section of n pairs turns by
 * pos_axis · freq_scale · theta^(−k/n). Angles, cos and sin in f64, rounded to f32. Dims past
 * rope_dims are copied.
 */
TP_API tp_status tp_cpu_rope_f32(tp_ctx *ctx, const float *x, float *y, uint64_t batch, uint64_t seq, uint64_t heads,
                                 uint64_t head_dim, const int32_t *positions, const int32_t *sections,
                                 int32_t n_sections, int32_t rope_dims, int32_t mode, double theta,
                                 double freq_scale);

/*
 * Scaled dot-product attention, tiled with an online softmax (memory O(head_dim) per query row).
 * q [batch, heads, sq, head_dim], k [batch, kv_heads, skv, head_dim], v [batch, kv_heads, skv,
 * head_dim_v] → out [batch, heads, sq, head_dim_v]; query head h uses kv head h / (heads / kv_heads).
 * Query i sits at position p = q_offset + i. Key j is visible when j < full_prefix, or when causal
 * is 0, or when j <= p and (window == 0 or j > p − window). softcap > 0: scores ← softcap ·
 * tanh(scores / softcap). A query that sees no key gets zeros.
 */
TP_API tp_status tp_cpu_attention_f32(tp_ctx *ctx, const float *q, const float *k, const float *v, float *out,
                                      uint64_t batch, uint64_t heads, uint64_t kv_heads, uint64_t sq, uint64_t skv,
                                      uint64_t head_dim, uint64_t head_dim_v, float scale, int64_t q_offset,
                                      int32_t causal, int64_t window, int64_t full_prefix, float softcap);
/*
 * The same on strided views, read and written in place (a KV cache [capacity, kv_heads, head_dim]
 * permuted to [1, kv_heads, len, head_dim] is not copied). strides: element strides (>= 0, <= 2^40) of
 * batch, head and row of q, k, v and out, in that order (12 values); the last dimension of each has
 * unit stride. lens: elements readable (q, k, v) or writable (out) from each pointer; every view must
 * stay inside its len, out must not overlap q, k or v, and no two out elements may share an address.
 */
TP_API tp_status tp_cpu_attention_strided_f32(tp_ctx *ctx, const float *q, const float *k, const float *v,
                                              float *out, const uint64_t lens[4], const int64_t strides[12],
                                              uint64_t batch, uint64_t heads, uint64_t kv_heads, uint64_t sq,
                                              uint64_t skv, uint64_t head_dim, uint64_t head_dim_v, float scale,
                                              int64_t q_offset, int32_t causal, int64_t window, int64_t full_prefix,
                                              float softcap);

/*
 * 2-D convolution (cross-correlation) x [batch, c_in, h, w] * weight [c_out, c_in, kh, kw] (+ bias
 * [c_out] or NULL) → y [batch, c_out, oh, ow], oh = (h + 2·pad_h − kh) / stride_h + 1 (likewise ow).
 */
TP_API tp_status tp_cpu_conv2d_f32(tp_ctx *ctx, const float *x, const float *weight, const float *bias, float *y,
                                   uint64_t batch, uint64_t c_in, uint64_t h, uint64_t w, uint64_t c_out, uint64_t kh,
                                   uint64_t kw, int32_t stride_h, int32_t stride_w, int32_t pad_h, int32_t pad_w);

/* Nearest upsampling of `planes` planes [h, w] by `factor` → [h·factor, w·factor]. */
TP_API tp_status tp_cpu_upsample_nearest2d_f32(tp_ctx *ctx, const float *x, float *y, uint64_t planes, uint64_t h,
                                               uint64_t w, int32_t factor);

/* Per row of n: index of the largest value (the first on ties; NaN counts as largest), n < 2^31. */
TP_API tp_status tp_cpu_argmax_f32(tp_ctx *ctx, const float *x, int32_t *out, uint64_t rows, uint64_t n);
/* Per row of n: the k largest values in descending order (ties: lower index first) and their indices. */
TP_API tp_status tp_cpu_top_k_f32(tp_ctx *ctx, const float *x, float *values, int32_t *indices, uint64_t rows,
                                  uint64_t n, uint64_t k);

/* The number of NaN / ±∞ values among x[0, n) into *out (saturating at INT32_MAX). */
TP_API tp_status tp_cpu_count_nonfinite_f32(tp_ctx *ctx, const float *x, uint64_t n, int32_t *out);

/*
 * Interrupt cleanup (interrupt.c; the one process-wide state of this library): tp_cleanup_install
 * makes SIGINT (2) or SIGTERM (15) remove every armed path, print "interrupted by SIGINT: N
 * unfinished output files removed" on stderr and _exit(128 + signal). tp_cleanup_arm copies `len`
 * bytes of `path` (no NUL needed; len < TP_CLEANUP_PATH_BYTES) into `slot` (0 <= slot <
 * TP_CLEANUP_SLOTS) and arms it; tp_cleanup_disarm forgets it. TP_ERR_ARG for a bad signal, slot or
 * length.
 */
#define TP_CLEANUP_SLOTS 64
#define TP_CLEANUP_PATH_BYTES 4096
TP_API tp_status tp_cleanup_install(int32_t sig);
TP_API tp_status tp_cleanup_arm(int32_t slot, const char *path, uint64_t len);
TP_API tp_status tp_cleanup_disarm(int32_t slot);

#ifdef __cplusplus
}
#endif
#endif /* TP_H */
