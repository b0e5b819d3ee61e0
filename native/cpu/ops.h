/*
 * Internal declarations shared by the op files of native/cpu (everything except cast and matmul):
 * error reporting, the ISA choice, the table of vector primitives each ISA level provides
 * (vec_scalar.c, vec_avx2.c, vec_avx512.c), and the micro-kernels of attention and conv2d.
 *
 *   ops_common.c                 tp_op_error, task counts
 *   vec_{scalar,avx2,avx512}.c   elementwise maths, row reductions, exp / tanh / erf
 *   elementwise.c                silu, gelu, sigmoid, swiglu, scale, add / sub / mul, modulate
 *   norm.c  softmax.c  rope.c    rms_norm, layer_norm, group_norm; softmax; rope
 *   attention{,_avx2,_avx512}.c  tiled online-softmax attention and its micro-kernels
 *   conv2d{,_avx2,_avx512}.c     im2col + blocked f32 GEMM and its micro-kernels
 *   layout.c  upsample.c         strided copy (copy / slice / concat), upsample_nearest2d
 *   sample.c                     argmax, top_k
 *   numeric.c                    count_nonfinite
 *
 * Nothing here is exported (-fvisibility=hidden); the entry points are declared in tp.h.
 */
#ifndef TP_CPU_OPS_H
#define TP_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

/* The same rule as cpu.c: ISA files exist only on x86 builds (the build defines TP_NO_X86_KERNELS elsewhere). */
#if (defined(__x86_64__) || defined(__i386__)) && !defined(TP_NO_X86_KERNELS)
#define TP_OPS_X86 1
#else
#define TP_OPS_X86 0
#endif

/* Highest rank of the strided entry points (copy, add / sub / mul, modulate). */
#define TP_MAX_RANK 16

/* Write a message for tp_ctx_error and return `status`. */
tp_status tp_op_error(tp_ctx *ctx, tp_status status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/*
 * Number of tasks for `work` units when each task should hold at least `min_per_task` units:
 * 1 on a single thread or for small work, else up to `per_thread` tasks per thread.
 */
int64_t tp_task_count(const tp_ctx *ctx, uint64_t work, uint64_t min_per_task, int64_t per_thread);

/* Run fn over n_tasks on the context's pool (inline for one task). */
void tp_run_tasks(tp_ctx *ctx, int64_t n_tasks, tp_task_fn fn, void *arg);

/* a * b for sizes, or an error when it overflows 2^62 (checked entry points only). */
int tp_mul_ok(uint64_t a, uint64_t b, uint64_t *out);

/* ---- vector primitives, one table per ISA level -------------------------------------------- */

/* Binary op codes of tp_vec_kernels.binary. */
enum { TP_BIN_ADD = 0, TP_BIN_SUB = 1, TP_BIN_MUL = 2 };

/*
 * Row primitives on f32. n may be any count (tails are each kernel's business); strides are in
 * elements and may be 0 (broadcast) or 1 (contiguous) or anything else. Reductions return f64:
 * the vector kernels sum in f32 lanes over blocks of at most 1024 elements and add the block
 * sums in f64, so long rows (group_norm over a whole image, softmax over a vocabulary) stay
 * accurate.
 */
typedef struct tp_vec_kernels {
  const char *name;
  void (*silu)(const float *x, float *y, size_t n);
  void (*sigmoid)(const float *x, float *y, size_t n);
  void (*gelu_erf)(const float *x, float *y, size_t n);
  void (*gelu_tanh)(const float *x, float *y, size_t n);
  void (*tanh)(const float *x, float *y, size_t n);
  void (*swiglu)(const float *gate, const float *up, float *y, size_t n);
  void (*scale)(const float *x, float *y, size_t n, float s);
  /* y[i] = a[i*sa] op b[i*sb] */
  void (*binary)(int op, const float *a, ptrdiff_t sa, const float *b, ptrdiff_t sb, float *y, size_t n);
  /* y[i] = x[i*sx] * (1 + scale[i*ss]) + shift[i*sh] */
  void (*modulate)(const float *x, ptrdiff_t sx, const float *scale, ptrdiff_t ss, const float *shift,
                   ptrdiff_t sh, float *y, size_t n);
  /* max of x[0..n) (NaN if any is NaN; -inf for n = 0) */
  float (*max)(const float *x, size_t n);
  /* Σ (x − c): with c = x[0] the sum of a row far from zero stays accurate (a shifted sum) */
  double (*sum)(const float *x, size_t n, float c);
  /*
   * Σ (x − c)² with c = c_hi + c_lo split in two floats: (x − c_hi) is exact when x is near c_hi
   * (Sterbenz), so a mean far from zero does not cost accuracy; c = 0 for RMSNorm.
   */
  double (*sum_sq_dev)(const float *x, size_t n, float c_hi, float c_lo);
  /* y = exp(x - m), returns Σ y */
  double (*exp_sum)(const float *x, float *y, size_t n, float m);
  /* y = ((x − c_hi) − c_lo) * r * (w ? w + w_offset : 1) + (b ? b : 0) */
  void (*norm_apply)(const float *x, float *y, size_t n, float c_hi, float c_lo, float r, const float *w,
                     float w_offset, const float *b);
  /* y = ((x − c_hi) − c_lo) * a + b (group_norm, per channel) */
  void (*shift_scale)(const float *x, float *y, size_t n, float c_hi, float c_lo, float a, float b);
} tp_vec_kernels;

extern const tp_vec_kernels tp_vec_scalar;
#if TP_OPS_X86
extern const tp_vec_kernels tp_vec_avx2;
extern const tp_vec_kernels tp_vec_avx512;
#endif

/* The primitives for the context's ISA level. */
const tp_vec_kernels *tp_vec_for(const tp_ctx *ctx);

/* ---- attention micro-kernels (attention_*.c) ------------------------------------------------ */

/* Keys per block and the padding unit of query rows and value columns (see attention.c). */
#define TP_ATTN_BK 64
#define TP_ATTN_MR 4
#define TP_ATTN_DV_ALIGN 64

typedef struct tp_attn_kernels {
  /*
   * s[r][c] = Σ_t q[r][t] * kt[t][c] for r < rows (a multiple of TP_ATTN_MR), c < TP_ATTN_BK;
   * q rows have stride d, kt is [d][TP_ATTN_BK], s rows have stride TP_ATTN_BK.
   */
  void (*scores)(const float *q, const float *kt, float *s, size_t rows, size_t d);
  /*
   * The same for few rows, reading K in place: s[r][c] = Σ_t q[r][t] * k[c·ks + t] for r < rows (any
   * count), c < nk (≤ TP_ATTN_BK), t < d; q rows have stride d, s rows stride TP_ATTN_BK; columns
   * [nk, TP_ATTN_BK) of s are not written. For decoding, where transposing K costs more than the dots.
   */
  void (*scores_rows)(const float *q, const float *k, size_t ks, float *s, size_t rows, size_t nk, size_t d);
  /*
   * o[r][c] += Σ_j p[r][j] * v[j·vs + c] for r < rows (a multiple of TP_ATTN_MR), j < nk, c < dvp (a
   * multiple of TP_ATTN_DV_ALIGN); p rows have stride TP_ATTN_BK, o rows stride dvp, v rows stride vs.
   */
  void (*pv)(const float *p, const float *v, size_t vs, float *o, size_t rows, size_t nk, size_t dvp);
} tp_attn_kernels;

extern const tp_attn_kernels tp_attn_scalar;
#if TP_OPS_X86
extern const tp_attn_kernels tp_attn_avx2;
extern const tp_attn_kernels tp_attn_avx512;
#endif

/* ---- conv2d GEMM micro-kernels (conv2d_*.c) -------------------------------------------------- */

/*
 * tile[r][c] = Σ_k a[r][k] * bp[k][c] for r < mr, c < nr, k < kc, where row r starts at a_rows[r]
 * (kc contiguous floats) and bp is a packed panel [kc][nr]; tile rows have stride nr.
 */
typedef struct tp_conv_kernels {
  size_t mr, nr;
  void (*tile)(const float *const *a_rows, const float *bp, size_t kc, float *tile);
} tp_conv_kernels;

extern const tp_conv_kernels tp_conv_scalar;
#if TP_OPS_X86
extern const tp_conv_kernels tp_conv_avx2;
extern const tp_conv_kernels tp_conv_avx512;
#endif

/* Largest mr / nr of any level (scratch sizes). */
#define TP_CONV_MR_MAX 8
#define TP_CONV_NR_MAX 32

#endif /* TP_CPU_OPS_H */
