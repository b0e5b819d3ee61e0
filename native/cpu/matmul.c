/*
 * Entry points of the weight kernels (tp.h): tp_weight_row_bytes, tp_cpu_matmul, tp_cpu_matmul_id, tp_cpu_get_rows,
 * tp_cpu_quantize_act, tp_cpu_convrot_quantize. Each checks its arguments (writing a message for
 * tp_ctx_error), prepares the activations once (llm.md §2.6, krea2.md §1.7–1.8), splits the output
 * columns over the context's threads, and dispatches on the ISA level and CPU features:
 *
 *   level / features              GGUF                  ConvRot                  f32, f16        bf16, fp8
 *   scalar                        matmul_scalar.c       matmul_scalar.c          matmul_scalar.c matmul_scalar.c
 *   AVX2 (+FMA, F16C)             matmul_ggml_avx2.c    matmul_avx2.c            matmul_avx2.c   matmul_avx2.c
 *   AVX-512 F/BW/VL + VNNI        matmul_ggml_avx512vnni.c  matmul_avx512vnni.c  matmul_avx512vnni.c  (+ BF16: matmul_avx512vnni.c,
 *                                                                                                    else matmul_avx2.c)
 *   AVX-512 without VNNI: the AVX2 kernels.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "matmul.h"

#if (defined(__x86_64__) || defined(__i386__)) && !defined(TP_NO_X86_KERNELS)
#define TP_MM_X86 1
#else
#define TP_MM_X86 0
#endif

/* Columns per task are a multiple of this (whole micro-tiles; 64 output floats = 4 cache lines). */
#define TP_MM_COL_ALIGN 64
/* Below this many multiply-adds a matmul runs on the calling thread: waking workers costs more. */
#define TP_MM_PARALLEL_MIN_MACS 32768
/*
 * A GEMV (m below TP_MM_GEMV_M) splits its columns into this many tasks per thread: the pool hands
 * tasks out as threads come (pool.c), so when the OS has descheduled one thread the others take its
 * columns in pieces, and the caller waits at most for one small piece already started. A column's sums
 * do not depend on the split (ranges stay multiples of TP_MM_COL_ALIGN). The tasks are claimed in
 * stripes (col_job.stripes): claims 0, 1, … go to the first column block of stripe 0, 1, …, then the
 * second, so a thread that takes every n-th claim reads one contiguous stretch of weights and the
 * hardware prefetcher keeps its stream from one task to the next. Two per thread: one leaves no one to
 * share a slow thread's columns of a large weight, more start too many new weight streams
 * (docs/performance.md, "GEMV").
 */
#define TP_MM_GEMV_M 16
/*
 * A GEMV over fewer weight bytes than this takes one column range per thread instead (a model's layer
 * matmuls; the LM head and larger keep two): once the pool's workers started a job within half a
 * microsecond (pool.c TP_POOL_SPIN_TIGHT_NS), the second range's two new weight streams cost more than
 * the balance it buys on a call of a few MB (Qwen3-0.6B's layer weights are 1.1–3.3 MB, its LM head
 * 88–165 MB).
 */
#ifndef TP_MM_GEMV_SMALL_BYTES
#define TP_MM_GEMV_SMALL_BYTES ((uint64_t)8 << 20)
#endif
#ifndef TP_MM_GEMV_TASKS_PER_THREAD
#define TP_MM_GEMV_TASKS_PER_THREAD 2
#endif
/*
 * A larger matmul (m ≥ TP_MM_GEMV_M) gives each thread one contiguous share of the columns, in chunks
 * of TP_MM_STEAL_COLS (one GEMM panel, NC in matmul_avx512vnni.c): a thread runs its own chunks from
 * the front and, when they are done, takes the chunks other threads have not started from the back
 * of their shares (col_task). Threads that run at different speeds — the OS or the hypervisor runs
 * something else on one CPU — then finish together, and two threads meet only at the very end, so
 * they rarely write neighbouring parts of y at once (small tasks shared out in order were slower).
 * Measurements: docs/performance.md, "Float and ConvRot GEMM".
 */
#ifndef TP_MM_STEAL
#define TP_MM_STEAL 1
#endif
#define TP_MM_STEAL_COLS TP_MM_NC

const tp_wformat_info tp_wformats[TP_W_COUNT] = {
    [TP_W_F32] = {"f32", 1, 4, TP_ACT_F32},
    [TP_W_F16] = {"f16", 1, 2, TP_ACT_F32},
    [TP_W_BF16] = {"bf16", 1, 2, TP_ACT_BF16},
    [TP_W_F8_E4M3FN] = {"f8_e4m3fn", 1, 1, TP_ACT_BF16},
    [TP_W_F8_E5M2] = {"f8_e5m2", 1, 1, TP_ACT_BF16},
    [TP_W_INT8_CONVROT] = {"int8_convrot", 1, 1, TP_ACT_CONVROT},
    [TP_W_INT4_CONVROT] = {"int4_convrot", 2, 1, TP_ACT_CONVROT},
    [TP_W_Q4_0] = {"q4_0", 32, 18, TP_ACT_Q8_0},
    [TP_W_Q4_1] = {"q4_1", 32, 20, TP_ACT_Q8_1},
    [TP_W_Q5_0] = {"q5_0", 32, 22, TP_ACT_Q8_0},
    [TP_W_Q5_1] = {"q5_1", 32, 24, TP_ACT_Q8_1},
    [TP_W_Q8_0] = {"q8_0", 32, 34, TP_ACT_Q8_0},
    [TP_W_Q2_K] = {"q2_k", 256, 84, TP_ACT_Q8_K},
    [TP_W_Q3_K] = {"q3_k", 256, 110, TP_ACT_Q8_K},
    [TP_W_Q4_K] = {"q4_k", 256, 144, TP_ACT_Q8_K},
    [TP_W_Q5_K] = {"q5_k", 256, 176, TP_ACT_Q8_K},
    [TP_W_Q6_K] = {"q6_k", 256, 210, TP_ACT_Q8_K},
    [TP_W_IQ4_NL] = {"iq4_nl", 32, 18, TP_ACT_Q8_0},
    [TP_W_IQ4_XS] = {"iq4_xs", 256, 136, TP_ACT_Q8_K},
};

/* Largest element count / byte size the entry points accept (keeps every product below 2^63). */
#define TP_MM_MAX ((int64_t)1 << 40)

int64_t tp_row_bytes(int32_t format, int64_t k) {
  if (format < 0 || format >= TP_W_COUNT || k < 0 || k > TP_MM_MAX) return -1;
  const tp_wformat_info *f = &tp_wformats[format];
  if (k % f->block != 0) return -1;
  return k / f->block * f->block_bytes;
}

int64_t tp_weight_row_bytes(int32_t format, int64_t k) { return tp_row_bytes(format, k); }

static tp_status mm_error(tp_ctx *ctx, tp_status status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static tp_status mm_error(tp_ctx *ctx, tp_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx->error, sizeof ctx->error, fmt, ap);
  va_end(ap);
  return status;
}

/* True when [a, a + an) and [b, b + bn) share a byte. */
static int overlaps(const void *a, uint64_t an, const void *b, uint64_t bn) {
  if (a == NULL || b == NULL || an == 0 || bn == 0) return 0;
  const uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
  return a0 < b0 + bn && b0 < a0 + an;
}

/*
 * Checks shared by matmul and get_rows: format, k, the weight's bytes, scales and group. On success
 * *row holds the bytes of one weight row.
 */
static tp_status check_weight(tp_ctx *ctx, const char *fn, int32_t format, const void *w, uint64_t w_bytes, int64_t n,
                              int64_t k, const float *scale, int64_t n_scale, int32_t group, int64_t *row) {
  if (format < 0 || format >= TP_W_COUNT) {
    return mm_error(ctx, TP_ERR_ARG, "%s: unknown weight format %d (expected 0..%d)", fn, (int)format, TP_W_COUNT - 1);
  }
  const tp_wformat_info *f = &tp_wformats[format];
  if (n < 0 || k < 0 || n > TP_MM_MAX || k > TP_MM_MAX) {
    return mm_error(ctx, TP_ERR_ARG, "%s: bad weight shape [%lld, %lld]", fn, (long long)n, (long long)k);
  }
  const int64_t rb = tp_row_bytes(format, k);
  if (rb < 0) {
    return mm_error(ctx, TP_ERR_ARG, "%s: k = %lld is not a whole number of %s blocks of %d elements", fn,
                    (long long)k, f->name, (int)f->block);
  }
  if ((uint64_t)n * (uint64_t)rb != w_bytes) {
    return mm_error(ctx, TP_ERR_ARG, "%s: %s weight [%lld, %lld] needs %llu bytes, got w_bytes = %llu", fn, f->name,
                    (long long)n, (long long)k, (unsigned long long)((uint64_t)n * (uint64_t)rb),
                    (unsigned long long)w_bytes);
  }
  if (w == NULL && w_bytes > 0) return mm_error(ctx, TP_ERR_ARG, "%s: w is NULL", fn);
  const int convrot = format == TP_W_INT8_CONVROT || format == TP_W_INT4_CONVROT;
  const int fp8 = format == TP_W_F8_E4M3FN || format == TP_W_F8_E5M2;
  if (convrot) {
    if (tp_log4(group) == 0 || k % group != 0) {
      return mm_error(ctx, TP_ERR_ARG, "%s: %s group %d is not a power of 4 (>= 4) dividing k = %lld", fn, f->name,
                      (int)group, (long long)k);
    }
    if (n_scale != n || (scale == NULL && n > 0)) {
      return mm_error(ctx, TP_ERR_ARG, "%s: %s needs n = %lld row scales, got n_scale = %lld%s", fn, f->name,
                      (long long)n, (long long)n_scale, scale == NULL ? " (scale is NULL)" : "");
    }
  } else {
    if (group != 0) return mm_error(ctx, TP_ERR_ARG, "%s: group = %d given for %s (ConvRot only)", fn, (int)group, f->name);
    const int64_t allowed = fp8 ? 1 : 0;
    if (n_scale < 0 || n_scale > allowed || (n_scale > 0 && scale == NULL)) {
      return mm_error(ctx, TP_ERR_ARG, "%s: %s takes %s, got n_scale = %lld", fn, f->name,
                      fp8 ? "0 or 1 tensor scale" : "no scale", (long long)n_scale);
    }
  }
  *row = rb;
  return TP_OK;
}

/* ---- activation preparation --------------------------------------------------------------- */

/* One activation row to ggml blocks (TP_ACT_Q8_*), with the kernel of the ISA level (all bit-exact). */
static void quantize_row(int32_t isa, int32_t act, const float *x, int64_t k, uint8_t *q) {
#if TP_MM_X86
  if (isa >= TP_ISA_AVX512) {
    if (act == TP_ACT_Q8_0) tp_quantize_q8_0_row_avx512(x, k, q);
    else if (act == TP_ACT_Q8_1) tp_quantize_q8_1_row_avx512(x, k, q);
    else tp_quantize_q8_k_row_avx512(x, k, q);
    return;
  }
#else
  (void)isa;
#endif
  if (act == TP_ACT_Q8_0) tp_quantize_q8_0_row(x, k, q);
  else if (act == TP_ACT_Q8_1) tp_quantize_q8_1_row(x, k, q);
  else tp_quantize_q8_k_row(x, k, q);
}

/* Inputs per block of the GGUF GEMM for a weight format: Q2_K, Q3_K and Q6_K scale per 16, the others per 32. */
static int64_t gemm_block(int32_t fmt) { return fmt == TP_W_Q6_K || fmt == TP_W_Q3_K || fmt == TP_W_Q2_K ? 16 : 32; }

/*
 * The GGUF GEMM's per-block activation scale d_a (f32) and code sum Σ q_a of one prepared row q, for
 * blocks of `be` inputs: from the Q8_0 / Q8_1 blocks (d f16, [s f16,] 32 codes; be = 32), or from the Q8_K
 * super-blocks (d f32; int16 bsums per 16: two per 32-block, or one per 16-block for Q6_K).
 */
static void block_sums(int32_t act, const uint8_t *q, int64_t k, int64_t be, float *xs, int32_t *xsum) {
  for (int64_t b = 0; b < k / be; b++) {
    if (act == TP_ACT_Q8_0 || act == TP_ACT_Q8_1) {
      const int q81 = act == TP_ACT_Q8_1; /* d, s (f16), 32 codes */
      const uint8_t *blk = q + (size_t)b * (q81 ? 36 : 34);
      int32_t sum = 0;
      for (int e = 0; e < 32; e++) sum += (int8_t)blk[(q81 ? 4 : 2) + e];
      xs[b] = tp_f16p(blk);
      xsum[b] = sum;
    } else {
      const int64_t per = 256 / be; /* blocks per super-block */
      const uint8_t *sb = q + (size_t)(b / per) * 292;
      const int64_t g = (b % per) * (be / 16); /* its first bsum */
      int32_t sum = 0;
      for (int64_t t = 0; t < be / 16; t++) {
        int16_t v;
        memcpy(&v, sb + 260 + 2 * (g + t), 2);
        sum += v;
      }
      xs[b] = tp_rdf32(sb);
      xsum[b] = sum;
    }
  }
}

typedef struct prep_job {
  const tp_mm *mm;
  uint8_t *xq;
  float *xs;
  int32_t *xsum;
  float *tmp; /* per task: k floats (ConvRot) */
  int32_t block_sums; /* Q8_0 / Q8_K: also write per-block d_a to xs and Σ q_a to xsum ([m, k/32]; Q6_K [m, k/16]) */
  int64_t rows_per_task;
  int32_t isa;
} prep_job;

static void prep_task(void *arg, int64_t task, int64_t n_tasks) {
  (void)n_tasks;
  const prep_job *job = arg;
  const tp_mm *mm = job->mm;
  const int64_t r0 = task * job->rows_per_task;
  const int64_t r1 = r0 + job->rows_per_task < mm->m ? r0 + job->rows_per_task : mm->m;
  for (int64_t i = r0; i < r1; i++) {
    const float *x = mm->x + (size_t)i * (size_t)mm->k;
    uint8_t *q = job->xq + (size_t)i * mm->xq_row;
    switch (mm->act) {
      case TP_ACT_BF16:
#if TP_MM_X86
        if (job->isa >= TP_ISA_AVX512) tp_cast_f32_to_bf16_avx512(x, q, (size_t)mm->k, 0);
        else if (job->isa >= TP_ISA_AVX2) tp_cast_f32_to_bf16_avx2(x, q, (size_t)mm->k, 0);
        else
#endif
          tp_cast_f32_to_bf16_scalar(x, q, (size_t)mm->k, 0);
        if (mm->k & 1) memset(q + 2 * mm->k, 0, 2); /* rows hold whole bf16 pairs */
        break;
      case TP_ACT_Q8_0:
      case TP_ACT_Q8_1:
      case TP_ACT_Q8_K:
        quantize_row(job->isa, mm->act, x, mm->k, q);
        if (job->block_sums) {
          const int64_t be = gemm_block(mm->fmt), nb = mm->k / be;
          block_sums(mm->act, q, mm->k, be, job->xs + (size_t)i * (size_t)nb, job->xsum + (size_t)i * (size_t)nb);
        }
        break;
      case TP_ACT_CONVROT: {
        float *tmp = job->tmp + (size_t)task * (size_t)mm->k;
        const int32_t bits = mm->fmt == TP_W_INT8_CONVROT ? 8 : 4;
#if TP_MM_X86
        if (job->isa >= TP_ISA_AVX512)
          tp_convrot_quantize_row_avx512(x, mm->k, mm->group, bits, tmp, (int8_t *)q, &job->xs[i], &job->xsum[i]);
        else
#endif
          tp_convrot_quantize_row_scalar(x, mm->k, mm->group, bits, tmp, (int8_t *)q, &job->xs[i], &job->xsum[i]);
        break;
      }
      default: break;
    }
  }
}

/* Bytes of one prepared activation row. */
static size_t act_row_bytes(int32_t act, int64_t k) {
  switch (act) {
    case TP_ACT_BF16: return (size_t)(k + (k & 1)) * 2; /* whole pairs: the GEMM reads 2 at a time */
    case TP_ACT_Q8_0: return (size_t)(k / 32) * 34;
    case TP_ACT_Q8_1: return (size_t)(k / 32) * 36;
    case TP_ACT_Q8_K: return (size_t)(k / 256) * 292;
    case TP_ACT_CONVROT: return (size_t)k;
    default: return 0;
  }
}

/* ---- the column split --------------------------------------------------------------------- */

typedef void (*mm_fn)(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch);

typedef struct col_job {
  const tp_mm *mm;
  mm_fn fn;
  int64_t cols_per_task;
  int64_t stripes;  /* > 1: claim u runs column block (u % stripes) · (n_tasks / stripes) + u / stripes */
  uint8_t *scratch; /* task t: scratch + t · mm->task_scratch */
  /* non-NULL: task t's share of TP_MM_STEAL_COLS-column chunks, next (high 32 bits) and end (low 32) */
  uint64_t *shares;
} col_job;

/* Take the first (front) or the last chunk left in a share; 0 when it is empty. */
static int take_chunk(uint64_t *share, int front, int64_t *chunk) {
  uint64_t v = __atomic_load_n(share, __ATOMIC_SEQ_CST);
  for (;;) {
    const uint32_t next = (uint32_t)(v >> 32), end = (uint32_t)v;
    if (next >= end) return 0;
    const uint64_t want = front ? (uint64_t)(next + 1) << 32 | end : (uint64_t)next << 32 | (end - 1);
    if (__atomic_compare_exchange_n(share, &v, want, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
      *chunk = front ? next : end - 1;
      return 1;
    }
  }
}

static void run_chunk(const col_job *job, int64_t chunk, uint8_t *scratch) {
  const int64_t n0 = chunk * TP_MM_STEAL_COLS;
  const int64_t n1 = n0 + TP_MM_STEAL_COLS < job->mm->n ? n0 + TP_MM_STEAL_COLS : job->mm->n;
  job->fn(job->mm, n0, n1, scratch);
}

static void col_task(void *arg, int64_t task, int64_t n_tasks) {
  const col_job *job = arg;
  if (job->shares != NULL) {
    uint8_t *scratch = job->scratch + (size_t)task * job->mm->task_scratch;
    int64_t chunk;
    while (take_chunk(&job->shares[task], 1, &chunk)) run_chunk(job, chunk, scratch);
    for (;;) { /* then from the back of the share with the most chunks left */
      int64_t victim = -1;
      uint32_t most = 0;
      for (int64_t t = 0; t < n_tasks; t++) {
        const uint64_t v = __atomic_load_n(&job->shares[t], __ATOMIC_SEQ_CST);
        const uint32_t next = (uint32_t)(v >> 32), end = (uint32_t)v;
        if (next < end && end - next > most) {
          most = end - next;
          victim = t;
        }
      }
      if (victim < 0) return;
      if (take_chunk(&job->shares[victim], 0, &chunk)) run_chunk(job, chunk, scratch);
    }
  }
  if (job->stripes > 1) task = task % job->stripes * (n_tasks / job->stripes) + task / job->stripes;
  const int64_t n0 = task * job->cols_per_task;
  const int64_t n1 = n0 + job->cols_per_task < job->mm->n ? n0 + job->cols_per_task : job->mm->n;
  if (n0 < n1) job->fn(job->mm, n0, n1, job->scratch + (size_t)task * job->mm->task_scratch);
}

/* The kernel family for a format at the context's level (see the table at the top). */
static mm_fn pick_kernel(const tp_ctx *ctx, int32_t fmt) {
  const int32_t act = tp_wformats[fmt].act;
#if TP_MM_X86
  const int avx2 = ctx->isa >= TP_ISA_AVX2;
  const int vnni = ctx->isa >= TP_ISA_AVX512 && (ctx->features & TP_CPU_AVX512VNNI);
  const int bf16 = vnni && (ctx->features & TP_CPU_AVX512BF16);
  switch (act) {
    case TP_ACT_Q8_0:
    case TP_ACT_Q8_1:
    case TP_ACT_Q8_K: return vnni ? tp_mm_ggml_avx512vnni : avx2 ? tp_mm_ggml_avx2 : tp_mm_ggml_scalar;
    case TP_ACT_CONVROT: return vnni ? tp_mm_convrot_avx512vnni : avx2 ? tp_mm_convrot_avx2 : tp_mm_convrot_scalar;
    case TP_ACT_BF16: return bf16 ? tp_mm_float_avx512vnni : avx2 ? tp_mm_float_avx2 : tp_mm_float_scalar;
    default: return vnni ? tp_mm_float_avx512vnni : avx2 ? tp_mm_float_avx2 : tp_mm_float_scalar;
  }
#else
  (void)ctx;
  switch (act) {
    case TP_ACT_Q8_0:
    case TP_ACT_Q8_1:
    case TP_ACT_Q8_K: return tp_mm_ggml_scalar;
    case TP_ACT_CONVROT: return tp_mm_convrot_scalar;
    default: return tp_mm_float_scalar;
  }
#endif
}

/* Run `fn(arg, t, n)` for n tasks: inline for one task, else on the pool. */
static void run_tasks(tp_ctx *ctx, int64_t n, tp_task_fn fn, void *arg) {
  if (n <= 1) fn(arg, 0, 1);
  else tp_parallel_for(&ctx->pool, n, fn, arg);
}

/* Scratch of up to this many bytes stays with the context between calls (fresh pages fault on first touch). */
#define TP_MM_SCRATCH_KEEP ((size_t)64 << 20)

/*
 * The context's scratch, grown to at least `bytes` (64-byte aligned; from 2 MiB on, huge pages as
 * tp_alloc gives them: the GEMM reads the prepared activations a few rows at a time, 6 rows 12 KiB
 * apart for K = 6144 bf16, and on 4 KiB pages that is a new page, and often a TLB miss, per row); NULL
 * when memory runs out.
 */
static uint8_t *ctx_scratch(tp_ctx *ctx, size_t bytes) {
  if (bytes <= ctx->scratch_bytes) return ctx->scratch;
  free(ctx->scratch);
  ctx->scratch_bytes = 0;
  ctx->scratch = tp_alloc((bytes + 63) / 64 * 64);
  if (ctx->scratch != NULL) ctx->scratch_bytes = (bytes + 63) / 64 * 64;
  return ctx->scratch;
}

/* After a call: give back scratch past TP_MM_SCRATCH_KEEP. */
static void ctx_scratch_trim(tp_ctx *ctx) {
  if (ctx->scratch_bytes <= TP_MM_SCRATCH_KEEP) return;
  free(ctx->scratch);
  ctx->scratch = NULL;
  ctx->scratch_bytes = 0;
}

static size_t round64(size_t b) { return (b + 63) / 64 * 64; }

tp_status tp_cpu_matmul(tp_ctx *ctx, const float *x, int64_t m, int64_t k, int32_t format, const void *w,
                        uint64_t w_bytes, int64_t n, const float *scale, int64_t n_scale, int32_t group,
                        const float *bias, float *y) {
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  int64_t rb = 0;
  tp_status st = check_weight(ctx, "tp_cpu_matmul", format, w, w_bytes, n, k, scale, n_scale, group, &rb);
  if (st != TP_OK) return st;
  if (m < 0 || m > TP_MM_MAX || (m > 0 && k > TP_MM_MAX / m) || (m > 0 && n > TP_MM_MAX / m)) {
    return mm_error(ctx, TP_ERR_ARG, "tp_cpu_matmul: bad m = %lld for k = %lld, n = %lld", (long long)m,
                    (long long)k, (long long)n);
  }
  if (m == 0 || n == 0) return TP_OK;
  if (y == NULL) return mm_error(ctx, TP_ERR_ARG, "tp_cpu_matmul: y is NULL");
  if (x == NULL && k > 0) return mm_error(ctx, TP_ERR_ARG, "tp_cpu_matmul: x is NULL");
  const uint64_t y_bytes = (uint64_t)m * (uint64_t)n * 4, x_bytes = (uint64_t)m * (uint64_t)k * 4;
  if (overlaps(y, y_bytes, x, x_bytes) || overlaps(y, y_bytes, w, w_bytes) ||
      overlaps(y, y_bytes, bias, bias ? (uint64_t)n * 4 : 0) || overlaps(y, y_bytes, scale, (uint64_t)n_scale * 4)) {
    return mm_error(ctx, TP_ERR_ARG, "tp_cpu_matmul: y overlaps an input");
  }

  tp_mm mm = {.fmt = format,
              .act = tp_wformats[format].act,
              .m = m,
              .n = n,
              .k = k,
              .x = x,
              .w = w,
              .w_row = (size_t)rb,
              .w_scale = format == TP_W_INT8_CONVROT || format == TP_W_INT4_CONVROT ? scale : NULL,
              .scale = n_scale == 1 && (format == TP_W_F8_E4M3FN || format == TP_W_F8_E5M2) ? scale[0] : 1.0f,
              .has_scale = n_scale == 1 && (format == TP_W_F8_E4M3FN || format == TP_W_F8_E5M2),
              .group = group,
              .bias = bias,
              .y = y,
              .features = ctx->features};

  /* tasks: the activation rows, then the output columns in whole multiples of TP_MM_COL_ALIGN */
  const int64_t threads = ctx->n_threads;
  const int small = (uint64_t)m * (uint64_t)n * (uint64_t)k < TP_MM_PARALLEL_MIN_MACS;
  int64_t prep_tasks = m < threads ? m : threads;
  if (small || (uint64_t)m * (uint64_t)k < TP_MM_PARALLEL_MIN_MACS) prep_tasks = 1;
  /* one column range per thread, or for a GEMV over TP_MM_GEMV_SMALL_BYTES of weights or more, several */
  const int gemv_large = m < TP_MM_GEMV_M && (uint64_t)n * (uint64_t)rb >= TP_MM_GEMV_SMALL_BYTES;
  int64_t tasks = small ? 1 : gemv_large ? threads * TP_MM_GEMV_TASKS_PER_THREAD : threads;
  int64_t per = (n + tasks - 1) / tasks;
  per = (per + TP_MM_COL_ALIGN - 1) / TP_MM_COL_ALIGN * TP_MM_COL_ALIGN;
  tasks = (n + per - 1) / per;

  /* scratch: prepared activations | row scales | row sums | rotation rows | per-task scratch | shares */
  mm.xq_row = act_row_bytes(mm.act, k);
  /* the GGUF kernels keep no partial sums between K blocks: no buffer for them */
  mm.part_bytes = tp_wformats[format].block >= 32 ? 0 : tp_mm_part_bytes(m, tasks);
  mm.task_scratch = tp_mm_task_scratch(k, mm.part_bytes);
  const int convrot = mm.act == TP_ACT_CONVROT;
  /* the GGUF GEMM (AVX-512 VNNI; every GGUF format but IQ4_NL / IQ4_XS) reads per-block activation scales and sums */
#if TP_MM_X86
  const int block_sums = tp_wformats[format].block >= 32 /* GGUF */ && format != TP_W_IQ4_NL &&
                         format != TP_W_IQ4_XS /* the 256-bit body: ggml_ymm */ && m >= TP_GGML_GEMM_MIN_M &&
                         pick_kernel(ctx, format) == tp_mm_ggml_avx512vnni;
#else
  const int block_sums = 0;
#endif
  const size_t xq_bytes = round64((size_t)m * mm.xq_row + 64);
  const size_t xs_bytes = convrot      ? round64((size_t)m * 4)
                          : block_sums ? round64((size_t)m * (size_t)(k / gemm_block(format)) * 4)
                                       : 0;
  const size_t tmp_bytes = convrot ? round64((size_t)prep_tasks * (size_t)k * 4) : 0;
  const size_t shares_bytes = round64((size_t)tasks * 8);
  const size_t total = xq_bytes + 2 * xs_bytes + tmp_bytes + (size_t)tasks * mm.task_scratch + shares_bytes;
  uint8_t *base = ctx_scratch(ctx, total);
  if (base == NULL) {
    return mm_error(ctx, TP_ERR_OOM, "tp_cpu_matmul: no memory for %zu bytes of scratch (prepared activations)", total);
  }
  uint8_t *xq = base;
  float *xs = (float *)(base + xq_bytes);
  int32_t *xsum = (int32_t *)(base + xq_bytes + xs_bytes);
  float *tmp = (float *)(base + xq_bytes + 2 * xs_bytes);
  uint8_t *task_base = base + xq_bytes + 2 * xs_bytes + tmp_bytes;
  uint64_t *shares = (uint64_t *)(task_base + (size_t)tasks * mm.task_scratch);

  if (mm.act != TP_ACT_F32) {
    prep_job pj = {.mm = &mm,
                   .xq = xq,
                   .xs = xs,
                   .xsum = xsum,
                   .tmp = tmp,
                   .block_sums = block_sums,
                   .rows_per_task = (m + prep_tasks - 1) / prep_tasks,
                   .isa = ctx->isa};
    run_tasks(ctx, prep_tasks, prep_task, &pj);
    mm.xq = xq;
    mm.xs = convrot || block_sums ? xs : NULL;
    mm.xsum = convrot || block_sums ? xsum : NULL;
  }

  col_job cj = {.mm = &mm,
                .fn = pick_kernel(ctx, format),
                .cols_per_task = per,
                .stripes = m < TP_MM_GEMV_M && tasks % threads == 0 ? threads : 1,
                .scratch = task_base,
                .shares = NULL};
  const int64_t chunks = (n + TP_MM_STEAL_COLS - 1) / TP_MM_STEAL_COLS;
  if (TP_MM_STEAL && m >= TP_MM_GEMV_M && tasks > 1 && chunks > tasks && chunks < (int64_t)UINT32_MAX) {
    cj.shares = shares;
    for (int64_t t = 0; t < tasks; t++) shares[t] = (uint64_t)(t * chunks / tasks) << 32 | (uint64_t)((t + 1) * chunks / tasks);
  }
  run_tasks(ctx, tasks, col_task, &cj);
  ctx_scratch_trim(ctx);
  return TP_OK;
}

/* ---- matmul_id: one GEMM per expert over its rows of a stacked weight ------------------------- */

/*
 * matmul_id for the GGUF formats in one parallel region: every routed row of x gathered (in expert
 * order) and quantized to the format's activation blocks once, then the column chunks of every chosen
 * expert handed out to the threads from one shared counter — one wake-up of the pool per call instead
 * of one per expert — each chunk a call of the format's kernel on the expert's sub-view of the stack.
 * The numbers are tp_cpu_matmul's row for row (the same activation blocks, the same kernel).
 */
typedef struct id_item {
  int32_t mm;     /* index into id_job.mms */
  int64_t n0, n1; /* columns */
} id_item;

typedef struct id_job {
  const tp_mm *mms;
  const id_item *items;
  int64_t n_items;
  int64_t next; /* the next item to take (atomic) */
  mm_fn fn;
  uint8_t *scratch; /* task t: scratch + t · task_scratch */
  size_t task_scratch;
} id_job;

static void id_task(void *arg, int64_t task, int64_t n_tasks) {
  (void)n_tasks;
  id_job *job = arg;
  uint8_t *scratch = job->scratch + (size_t)task * job->task_scratch;
  for (;;) {
    const int64_t i = __atomic_fetch_add(&job->next, 1, __ATOMIC_RELAXED);
    if (i >= job->n_items) return;
    const id_item *it = &job->items[i];
    job->fn(&job->mms[it->mm], it->n0, it->n1, scratch);
  }
}

/* gathered rows xg [rows, k] (expert order, start[e]..start[e+1] for expert e) → yg [rows, n]. */
static tp_status matmul_id_ggml(tp_ctx *ctx, const float *xg, int64_t rows, int64_t k, int32_t format,
                                const uint8_t *w, size_t rb, int64_t n_expert, int64_t n, const int64_t *start,
                                float *yg) {
  const char *fn = "tp_cpu_matmul_id";
  const int32_t act = tp_wformats[format].act;
  int64_t used = 0, n_items = 0;
  for (int64_t e = 0; e < n_expert; e++) {
    const int64_t m = start[e + 1] - start[e];
    if (m == 0) continue;
    const int64_t ch = m < TP_MM_GEMV_M ? TP_MM_COL_ALIGN : TP_MM_STEAL_COLS;
    used++;
    n_items += (n + ch - 1) / ch;
  }
#if TP_MM_X86
  const int vnni_gemm = format != TP_W_IQ4_NL && format != TP_W_IQ4_XS && pick_kernel(ctx, format) == tp_mm_ggml_avx512vnni;
#else
  const int vnni_gemm = 0;
#endif
  const size_t xq_row = act_row_bytes(act, k);
  const int64_t nb = k / gemm_block(format);
  const int64_t threads = ctx->n_threads;
  const int64_t tasks = (uint64_t)rows * (uint64_t)n * (uint64_t)k < TP_MM_PARALLEL_MIN_MACS ? 1 : threads;
  const size_t task_scratch = tp_mm_task_scratch(k, 0);
  const size_t xq_bytes = round64((size_t)rows * xq_row + 64);
  const size_t xs_bytes = vnni_gemm ? round64((size_t)rows * (size_t)nb * 4) : 0;
  const size_t mms_bytes = round64((size_t)used * sizeof(tp_mm));
  const size_t items_bytes = round64((size_t)n_items * sizeof(id_item));
  const size_t total = xq_bytes + 2 * xs_bytes + mms_bytes + items_bytes + (size_t)tasks * task_scratch;
  uint8_t *base = ctx_scratch(ctx, total);
  if (base == NULL) return mm_error(ctx, TP_ERR_OOM, "%s: no memory for %zu bytes of scratch", fn, total);
  uint8_t *xq = base;
  float *xs = (float *)(base + xq_bytes);
  int32_t *xsum = (int32_t *)(base + xq_bytes + xs_bytes);
  tp_mm *mms = (tp_mm *)(base + xq_bytes + 2 * xs_bytes);
  id_item *items = (id_item *)(base + xq_bytes + 2 * xs_bytes + mms_bytes);
  uint8_t *task_base = base + xq_bytes + 2 * xs_bytes + mms_bytes + items_bytes;

  /* every row's activation blocks (and, for the AVX-512 VNNI GEMM, its block sums) at once */
  tp_mm all = {.fmt = format, .act = act, .m = rows, .n = n, .k = k, .x = xg, .xq_row = xq_row};
  int64_t prep_tasks = rows < threads ? rows : threads;
  if ((uint64_t)rows * (uint64_t)k < TP_MM_PARALLEL_MIN_MACS) prep_tasks = 1;
  prep_job pj = {.mm = &all,
                 .xq = xq,
                 .xs = xs,
                 .xsum = xsum,
                 .tmp = NULL,
                 .block_sums = vnni_gemm,
                 .rows_per_task = (rows + prep_tasks - 1) / prep_tasks,
                 .isa = ctx->isa};
  run_tasks(ctx, prep_tasks, prep_task, &pj);

  int64_t u = 0, it = 0;
  for (int64_t e = 0; e < n_expert; e++) {
    const int64_t r0 = start[e], m = start[e + 1] - start[e];
    if (m == 0) continue;
    const int sums = vnni_gemm && m >= TP_GGML_GEMM_MIN_M;
    mms[u] = (tp_mm){.fmt = format,
                     .act = act,
                     .m = m,
                     .n = n,
                     .k = k,
                     .x = xg + (size_t)r0 * (size_t)k,
                     .w = w + (size_t)e * (size_t)n * rb,
                     .w_row = rb,
                     .scale = 1.0f,
                     .y = yg + (size_t)r0 * (size_t)n,
                     .features = ctx->features,
                     .xq = xq + (size_t)r0 * xq_row,
                     .xq_row = xq_row,
                     .xs = sums ? xs + (size_t)r0 * (size_t)nb : NULL,
                     .xsum = sums ? xsum + (size_t)r0 * (size_t)nb : NULL,
                     .task_scratch = task_scratch,
                     .part_bytes = 0};
    const int64_t ch = m < TP_MM_GEMV_M ? TP_MM_COL_ALIGN : TP_MM_STEAL_COLS;
    for (int64_t n0 = 0; n0 < n; n0 += ch) items[it++] = (id_item){(int32_t)u, n0, n0 + ch < n ? n0 + ch : n};
    u++;
  }
  id_job job = {.mms = mms,
                .items = items,
                .n_items = n_items,
                .next = 0,
                .fn = pick_kernel(ctx, format),
                .scratch = task_base,
                .task_scratch = task_scratch};
  run_tasks(ctx, tasks, id_task, &job);
  ctx_scratch_trim(ctx);
  return TP_OK;
}

tp_status tp_cpu_matmul_id(tp_ctx *ctx, const float *x, int64_t t, int64_t sx, int64_t k, int32_t format,
                           const void *w, uint64_t w_bytes, int64_t n_expert, int64_t n, const float *scale,
                           int64_t n_scale, int32_t group, const int32_t *ids, int64_t s, float *y) {
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  const char *fn = "tp_cpu_matmul_id";
  if (n_expert < 1 || n < 0 || n_expert > TP_MM_MAX || (n > 0 && n_expert > TP_MM_MAX / n)) {
    return mm_error(ctx, TP_ERR_ARG, "%s: bad experts = %lld of n = %lld rows", fn, (long long)n_expert, (long long)n);
  }
  int64_t rb = 0;
  tp_status st = check_weight(ctx, fn, format, w, w_bytes, n_expert * n, k, scale, n_scale, group, &rb);
  if (st != TP_OK) return st;
  if (t < 0 || s < 0 || t > TP_MM_MAX || (t > 0 && s > TP_MM_MAX / t)) {
    return mm_error(ctx, TP_ERR_ARG, "%s: bad tokens = %lld, slots = %lld", fn, (long long)t, (long long)s);
  }
  const int64_t rows = t * s;
  if (sx != 1 && sx != s) {
    return mm_error(ctx, TP_ERR_ARG, "%s: x has %lld slots per token; expected 1 or %lld", fn, (long long)sx,
                    (long long)s);
  }
  if (rows > 0 && (k > TP_MM_MAX / rows || n > TP_MM_MAX / rows)) {
    return mm_error(ctx, TP_ERR_ARG, "%s: %lld rows of k = %lld, n = %lld are too large", fn, (long long)rows,
                    (long long)k, (long long)n);
  }
  if (rows == 0 || n == 0) return TP_OK;
  if (y == NULL || ids == NULL) return mm_error(ctx, TP_ERR_ARG, "%s: %s is NULL", fn, y == NULL ? "y" : "ids");
  if (x == NULL && k > 0) return mm_error(ctx, TP_ERR_ARG, "%s: x is NULL", fn);
  const uint64_t y_bytes = (uint64_t)rows * (uint64_t)n * 4;
  if (overlaps(y, y_bytes, x, (uint64_t)t * (uint64_t)sx * (uint64_t)k * 4) || overlaps(y, y_bytes, w, w_bytes) ||
      overlaps(y, y_bytes, ids, (uint64_t)rows * 4) || overlaps(y, y_bytes, scale, (uint64_t)n_scale * 4)) {
    return mm_error(ctx, TP_ERR_ARG, "%s: y overlaps an input", fn);
  }
  for (int64_t r = 0; r < rows; r++) { /* every id before anything is written */
    if (ids[r] < 0 || ids[r] >= n_expert) {
      return mm_error(ctx, TP_ERR_ARG, "%s: ids[%lld, %lld] = %d is outside [0, %lld)", fn, (long long)(r / s),
                      (long long)(r % s), (int)ids[r], (long long)n_expert);
    }
  }
  /* the rows of each expert, in order (a counting sort): order[start[e] .. start[e + 1]) */
  int64_t *start = calloc((size_t)n_expert + 1, sizeof *start);
  int64_t *order = malloc((size_t)rows * sizeof *order);
  if (start == NULL || order == NULL) {
    free(start);
    free(order);
    return mm_error(ctx, TP_ERR_OOM, "%s: no memory for the routing of %lld rows", fn, (long long)rows);
  }
  for (int64_t r = 0; r < rows; r++) start[ids[r] + 1]++;
  int64_t most = 0;
  for (int64_t e = 0; e < n_expert; e++) {
    if (start[e + 1] > most) most = start[e + 1];
    start[e + 1] += start[e];
  }
  {
    int64_t *next = malloc((size_t)n_expert * sizeof *next);
    if (next == NULL) {
      free(start);
      free(order);
      return mm_error(ctx, TP_ERR_OOM, "%s: no memory for the routing of %lld rows", fn, (long long)rows);
    }
    memcpy(next, start, (size_t)n_expert * sizeof *next);
    for (int64_t r = 0; r < rows; r++) order[next[ids[r]]++] = r;
    free(next);
  }
  const int32_t act = tp_wformats[format].act;
  if (act == TP_ACT_Q8_0 || act == TP_ACT_Q8_1 || act == TP_ACT_Q8_K) { /* GGUF: one parallel region */
    float *xg = malloc((size_t)rows * (size_t)(k > 0 ? k : 1) * 4);
    float *yg = malloc((size_t)rows * (size_t)n * 4);
    if (xg == NULL || yg == NULL) {
      free(xg);
      free(yg);
      free(start);
      free(order);
      return mm_error(ctx, TP_ERR_OOM, "%s: no memory for %lld gathered rows", fn, (long long)rows);
    }
    for (int64_t i = 0; i < rows; i++) {
      const int64_t r = order[i];
      memcpy(xg + (size_t)i * (size_t)k, x + (size_t)((r / s) * sx + (sx == 1 ? 0 : r % s)) * (size_t)k,
             (size_t)k * 4);
    }
    st = matmul_id_ggml(ctx, xg, rows, k, format, w, (size_t)rb, n_expert, n, start, yg);
    if (st == TP_OK)
      for (int64_t i = 0; i < rows; i++) memcpy(y + (size_t)order[i] * (size_t)n, yg + (size_t)i * (size_t)n, (size_t)n * 4);
    free(xg);
    free(yg);
    free(start);
    free(order);
    return st;
  }
  /* other formats, expert by expert: its rows of x gathered, its GEMM into a scratch, scattered into y;
     of one row: the row of x and of y themselves (decoding: no copy) */
  float *xg = NULL, *yg = NULL;
  if (most > 1) {
    xg = malloc((size_t)most * (size_t)(k > 0 ? k : 1) * 4);
    yg = malloc((size_t)most * (size_t)n * 4);
    if (xg == NULL || yg == NULL) {
      free(xg);
      free(yg);
      free(start);
      free(order);
      return mm_error(ctx, TP_ERR_OOM, "%s: no memory for %lld gathered rows", fn, (long long)most);
    }
  }
  const int convrot = format == TP_W_INT8_CONVROT || format == TP_W_INT4_CONVROT;
  const uint8_t *wb = w;
  for (int64_t e = 0; e < n_expert && st == TP_OK; e++) {
    const int64_t m = start[e + 1] - start[e];
    if (m == 0) continue; /* an expert no row chose is not read */
    const void *we = wb + (size_t)e * (size_t)n * (size_t)rb;
    const float *se = convrot ? scale + (size_t)e * (size_t)n : scale;
    const int64_t ns = convrot ? n : n_scale;
    const int64_t *rs = order + start[e];
    if (m == 1) {
      const int64_t r = rs[0];
      const float *xr = x + (size_t)((r / s) * sx + (sx == 1 ? 0 : r % s)) * (size_t)k;
      st = tp_cpu_matmul(ctx, xr, 1, k, format, we, (uint64_t)n * (uint64_t)rb, n, se, ns, group, NULL,
                         y + (size_t)r * (size_t)n);
      continue;
    }
    for (int64_t i = 0; i < m; i++) {
      const int64_t r = rs[i];
      memcpy(xg + (size_t)i * (size_t)k, x + (size_t)((r / s) * sx + (sx == 1 ? 0 : r % s)) * (size_t)k,
             (size_t)k * 4);
    }
    st = tp_cpu_matmul(ctx, xg, m, k, format, we, (uint64_t)n * (uint64_t)rb, n, se, ns, group, NULL, yg);
    if (st != TP_OK) break;
    for (int64_t i = 0; i < m; i++) memcpy(y + (size_t)rs[i] * (size_t)n, yg + (size_t)i * (size_t)n, (size_t)n * 4);
  }
  free(xg);
  free(yg);
  free(start);
  free(order);
  return st;
}

/* ---- get_rows ----------------------------------------------------------------------------- */

typedef struct rows_job {
  int32_t fmt, group, isa;
  const uint8_t *w;
  size_t w_row;
  int64_t k, n_ids, rows_per_task;
  const float *scale;
  const int64_t *ids;
  float *out;
  int32_t *tmp; /* per task: k int32 */
} rows_job;

static void rows_task(void *arg, int64_t task, int64_t n_tasks) {
  (void)n_tasks;
  const rows_job *j = arg;
  const int64_t r0 = task * j->rows_per_task;
  const int64_t r1 = r0 + j->rows_per_task < j->n_ids ? r0 + j->rows_per_task : j->n_ids;
  if (r0 >= r1) return;
  int32_t *tmp = j->tmp ? j->tmp + (size_t)task * (size_t)j->k : NULL;
  float *out = j->out + (size_t)r0 * (size_t)j->k;
#if TP_MM_X86
  if (j->isa >= TP_ISA_AVX512) {
    tp_dequant_rows_avx512(j->fmt, j->w, j->w_row, r1 - r0, j->k, j->scale, j->group, j->ids + r0, out, tmp);
    return;
  }
#endif
  tp_dequant_rows_scalar(j->fmt, j->w, j->w_row, r1 - r0, j->k, j->scale, j->group, j->ids + r0, out, tmp);
}

tp_status tp_cpu_get_rows(tp_ctx *ctx, int32_t format, const void *w, uint64_t w_bytes, int64_t n, int64_t k,
                          const float *scale, int64_t n_scale, int32_t group, const int32_t *ids, int64_t n_ids,
                          float *out) {
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  int64_t rb = 0;
  tp_status st = check_weight(ctx, "tp_cpu_get_rows", format, w, w_bytes, n, k, scale, n_scale, group, &rb);
  if (st != TP_OK) return st;
  if (n_ids < 0 || n_ids > TP_MM_MAX || (n_ids > 0 && k > TP_MM_MAX / n_ids)) {
    return mm_error(ctx, TP_ERR_ARG, "tp_cpu_get_rows: bad n_ids = %lld", (long long)n_ids);
  }
  if (n_ids == 0 || k == 0) return TP_OK;
  if (out == NULL) return mm_error(ctx, TP_ERR_ARG, "tp_cpu_get_rows: out is NULL");
  if (ids == NULL && n_ids > n) {
    return mm_error(ctx, TP_ERR_ARG, "tp_cpu_get_rows: n_ids = %lld rows without ids, but the weight has n = %lld",
                    (long long)n_ids, (long long)n);
  }
  const uint64_t out_bytes = (uint64_t)n_ids * (uint64_t)k * 4;
  if (overlaps(out, out_bytes, w, w_bytes) || overlaps(out, out_bytes, ids, ids ? (uint64_t)n_ids * 4 : 0) ||
      overlaps(out, out_bytes, scale, (uint64_t)n_scale * 4)) {
    return mm_error(ctx, TP_ERR_ARG, "tp_cpu_get_rows: out overlaps an input");
  }
  int64_t *rows = tp_alloc((uint64_t)n_ids * 8);
  if (rows == NULL) return mm_error(ctx, TP_ERR_OOM, "tp_cpu_get_rows: no memory for %lld ids", (long long)n_ids);
  for (int64_t i = 0; i < n_ids; i++) {
    const int64_t id = ids ? ids[i] : i;
    if (id < 0 || id >= n) {
      tp_free(rows);
      return mm_error(ctx, TP_ERR_ARG, "tp_cpu_get_rows: id %lld at index %lld is outside [0, %lld)", (long long)id,
                      (long long)i, (long long)n);
    }
    rows[i] = id;
  }
  const int convrot = format == TP_W_INT8_CONVROT || format == TP_W_INT4_CONVROT;
  int64_t tasks = (uint64_t)n_ids * (uint64_t)k < TP_MM_PARALLEL_MIN_MACS ? 1 : ctx->n_threads;
  if (tasks > n_ids) tasks = n_ids;
  int32_t *tmp = NULL;
  if (convrot) {
    tmp = tp_alloc((uint64_t)tasks * (uint64_t)k * 4);
    if (tmp == NULL) {
      tp_free(rows);
      return mm_error(ctx, TP_ERR_OOM, "tp_cpu_get_rows: no memory for scratch");
    }
  }
  rows_job job = {.fmt = format,
                  .group = group,
                  .isa = ctx->isa,
                  .w = w,
                  .w_row = (size_t)rb,
                  .k = k,
                  .n_ids = n_ids,
                  .rows_per_task = (n_ids + tasks - 1) / tasks,
                  .scale = n_scale > 0 ? scale : NULL,
                  .ids = rows,
                  .out = out,
                  .tmp = tmp};
  run_tasks(ctx, tasks, rows_task, &job);
  tp_free(tmp);
  tp_free(rows);
  return TP_OK;
}

/* ---- activation quantizers, exported for tests -------------------------------------------- */

tp_status tp_cpu_quantize_act(tp_ctx *ctx, int32_t type, const float *x, int64_t m, int64_t k, void *out,
                              uint64_t out_bytes) {
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  static const int32_t block[] = {32, 32, 256}, bytes[] = {34, 36, 292};
  if (type < 0 || type > 2) {
    return mm_error(ctx, TP_ERR_ARG, "tp_cpu_quantize_act: unknown type %d (0: Q8_0, 1: Q8_1, 2: Q8_K)", (int)type);
  }
  if (m < 0 || k < 0 || m > TP_MM_MAX || k > TP_MM_MAX || (m > 0 && k > TP_MM_MAX / m) || k % block[type] != 0) {
    return mm_error(ctx, TP_ERR_ARG, "tp_cpu_quantize_act: bad shape [%lld, %lld] (k must be a multiple of %d)",
                    (long long)m, (long long)k, (int)block[type]);
  }
  const uint64_t row = (uint64_t)(k / block[type]) * (uint64_t)bytes[type];
  if (out_bytes != (uint64_t)m * row) {
    return mm_error(ctx, TP_ERR_ARG, "tp_cpu_quantize_act: out needs %llu bytes, got out_bytes = %llu",
                    (unsigned long long)((uint64_t)m * row), (unsigned long long)out_bytes);
  }
  if (m * k == 0) return TP_OK;
  if (x == NULL || out == NULL) return mm_error(ctx, TP_ERR_ARG, "tp_cpu_quantize_act: %s is NULL", x ? "out" : "x");
  if (overlaps(out, out_bytes, x, (uint64_t)m * (uint64_t)k * 4)) {
    return mm_error(ctx, TP_ERR_ARG, "tp_cpu_quantize_act: out overlaps x");
  }
  for (int64_t i = 0; i < m; i++) {
    const float *xi = x + (size_t)i * (size_t)k;
    uint8_t *o = (uint8_t *)out + (size_t)i * row;
    quantize_row(ctx->isa, type == 0 ? TP_ACT_Q8_0 : type == 1 ? TP_ACT_Q8_1 : TP_ACT_Q8_K, xi, k, o);
  }
  return TP_OK;
}

tp_status tp_cpu_convrot_quantize(tp_ctx *ctx, const float *x, int64_t m, int64_t k, int32_t bits, int32_t group,
                                  int8_t *codes, float *scales) {
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  if (bits != 8 && bits != 4) return mm_error(ctx, TP_ERR_ARG, "tp_cpu_convrot_quantize: bits = %d (8 or 4)", (int)bits);
  if (tp_log4(group) == 0) return mm_error(ctx, TP_ERR_ARG, "tp_cpu_convrot_quantize: group %d is not a power of 4", (int)group);
  if (m < 0 || k < 0 || m > TP_MM_MAX || k > TP_MM_MAX || (m > 0 && k > TP_MM_MAX / m) || k % group != 0) {
    return mm_error(ctx, TP_ERR_ARG, "tp_cpu_convrot_quantize: bad shape [%lld, %lld] for group %d", (long long)m,
                    (long long)k, (int)group);
  }
  if (m == 0) return TP_OK;
  if (x == NULL || codes == NULL || scales == NULL) return mm_error(ctx, TP_ERR_ARG, "tp_cpu_convrot_quantize: NULL pointer");
  const uint64_t xb = (uint64_t)m * (uint64_t)k * 4;
  if (overlaps(codes, (uint64_t)m * (uint64_t)k, x, xb) || overlaps(scales, (uint64_t)m * 4, x, xb) ||
      overlaps(codes, (uint64_t)m * (uint64_t)k, scales, (uint64_t)m * 4)) {
    return mm_error(ctx, TP_ERR_ARG, "tp_cpu_convrot_quantize: outputs overlap");
  }
  float *tmp = tp_alloc((uint64_t)k * 4 + 64);
  if (tmp == NULL) return mm_error(ctx, TP_ERR_OOM, "tp_cpu_convrot_quantize: no memory");
  for (int64_t i = 0; i < m; i++) {
    int32_t sum;
    const float *xi = x + (size_t)i * (size_t)k;
    int8_t *ci = codes + (size_t)i * (size_t)k;
#if TP_MM_X86
    if (ctx->isa >= TP_ISA_AVX512) tp_convrot_quantize_row_avx512(xi, k, group, bits, tmp, ci, &scales[i], &sum);
    else
#endif
      tp_convrot_quantize_row_scalar(xi, k, group, bits, tmp, ci, &scales[i], &sum);
  }
  tp_free(tmp);
  return TP_OK;
}

/* ---- repacked Q8_0 / Q4_0 weights (layout: matmul.h) ------------------------------------------- */

static int64_t rp_rec(int32_t format) {
  return format == TP_W_Q8_0 ? TP_RP_Q8_0_REC : format == TP_W_Q4_0 ? TP_RP_Q4_0_REC : -1;
}

int64_t tp_weight_repack_bytes(int32_t format, int64_t n, int64_t k) {
  const int64_t rec = rp_rec(format);
  if (rec < 0 || n < 0 || k < 0 || n > TP_MM_MAX || k > TP_MM_MAX || k % 32 != 0) return -1;
  return (n + TP_RP_ROWS - 1) / TP_RP_ROWS * (k / 32) * rec;
}

tp_status tp_cpu_repack_weight(tp_ctx *ctx, int32_t format, const void *w, uint64_t w_bytes, int64_t n, int64_t k,
                               void *out, uint64_t out_bytes) {
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  if (rp_rec(format) < 0) {
    return mm_error(ctx, TP_ERR_UNSUPPORTED, "tp_cpu_repack_weight: format %d has no repacked layout (q8_0, q4_0 only)",
                    (int)format);
  }
  int64_t rb = 0;
  tp_status st = check_weight(ctx, "tp_cpu_repack_weight", format, w, w_bytes, n, k, NULL, 0, 0, &rb);
  if (st != TP_OK) return st;
  const int64_t need = tp_weight_repack_bytes(format, n, k);
  if (need < 0 || (uint64_t)need != out_bytes) {
    return mm_error(ctx, TP_ERR_ARG, "tp_cpu_repack_weight: out needs %lld bytes, got out_bytes = %llu", (long long)need,
                    (unsigned long long)out_bytes);
  }
  if (need == 0) return TP_OK;
  if (out == NULL) return mm_error(ctx, TP_ERR_ARG, "tp_cpu_repack_weight: out is NULL");
  if (overlaps(out, out_bytes, w, w_bytes)) return mm_error(ctx, TP_ERR_ARG, "tp_cpu_repack_weight: out overlaps w");
  const int q8 = format == TP_W_Q8_0;
  const size_t rec = (size_t)rp_rec(format), bb = q8 ? 34 : 18, code = q8 ? 512 : 256;
  const int64_t nb = k / 32, groups = (n + TP_RP_ROWS - 1) / TP_RP_ROWS;
  uint8_t *o = out;
  const uint8_t *src = w;
  for (int64_t g = 0; g < groups; g++)
    for (int64_t b = 0; b < nb; b++) {
      uint8_t *r = o + (size_t)(g * nb + b) * rec;
      memset(r, q8 ? 128 : 0, code);
      memset(r + code, 0, 32);
      for (int64_t i = 0; i < TP_RP_ROWS && g * TP_RP_ROWS + i < n; i++) {
        const uint8_t *blk = src + (size_t)(g * TP_RP_ROWS + i) * (size_t)rb + (size_t)b * bb;
        memcpy(r + code + 2 * i, blk, 2); /* f16 d */
        for (int s = 0; s < (q8 ? 8 : 4); s++)
          for (int t = 0; t < 4; t++)
            r[64 * s + 4 * i + t] = q8 ? (uint8_t)(blk[2 + 4 * s + t] ^ 0x80) : blk[2 + 4 * s + t];
      }
    }
  return TP_OK;
}

typedef struct rp_job {
  const tp_mm_rp *p;
  const float *x;        /* [m, k] */
  int32_t isa;
  uint8_t *xq;           /* per task: one row of k / 32 Q8_0 blocks */
  tp_rp_act *act;        /* [m][k / 32] */
  int64_t rows_per_task, groups_per_task;
} rp_job;

/* Activation rows → Q8_0 (bit-exact with the unpacked path), then the kernel's blocks with their offset terms. */
static void rp_prep_task(void *arg, int64_t task, int64_t n_tasks) {
  (void)n_tasks;
  const rp_job *j = arg;
  const tp_mm_rp *p = j->p;
  const int64_t nb = p->k / 32, off = p->fmt == TP_W_Q8_0 ? 128 : 8;
  const int64_t r0 = task * j->rows_per_task, r1 = r0 + j->rows_per_task < p->m ? r0 + j->rows_per_task : p->m;
  uint8_t *xq = j->xq + (size_t)task * (size_t)nb * 34;
  for (int64_t i = r0; i < r1; i++) {
    quantize_row(j->isa, TP_ACT_Q8_0, j->x + (size_t)i * (size_t)p->k, p->k, xq);
    for (int64_t b = 0; b < nb; b++) {
      const uint8_t *blk = xq + (size_t)b * 34;
      tp_rp_act *a = j->act + (size_t)i * (size_t)nb + (size_t)b;
      memcpy(a->q, blk + 2, 32);
      int32_t sum = 0;
      for (int e = 0; e < 32; e++) sum += a->q[e];
      a->d = tp_f16p(blk);
      a->corr = (int32_t)(-off * sum);
    }
  }
}

static void rp_task(void *arg, int64_t task, int64_t n_tasks) {
  (void)n_tasks;
  const rp_job *j = arg;
  const int64_t groups = (j->p->n + TP_RP_ROWS - 1) / TP_RP_ROWS;
  const int64_t g0 = task * j->groups_per_task, g1 = g0 + j->groups_per_task < groups ? g0 + j->groups_per_task : groups;
#if TP_MM_X86
  if (g0 < g1) tp_mm_repacked_avx512vnni(j->p, g0, g1);
#else
  (void)g0;
  (void)g1;
#endif
}

tp_status tp_cpu_matmul_repacked(tp_ctx *ctx, const float *x, int64_t m, int64_t k, int32_t format, const void *packed,
                                 uint64_t packed_bytes, int64_t n, const float *bias, float *y) {
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  const char *fn = "tp_cpu_matmul_repacked";
  if (rp_rec(format) < 0) return mm_error(ctx, TP_ERR_UNSUPPORTED, "%s: format %d is not q8_0 or q4_0", fn, (int)format);
#if TP_MM_X86
  if (!(ctx->isa >= TP_ISA_AVX512 && (ctx->features & TP_CPU_AVX512VNNI)))
#endif
    return mm_error(ctx, TP_ERR_UNSUPPORTED, "%s: needs the AVX-512 VNNI level (this context has not got it)", fn);
  const int64_t need = tp_weight_repack_bytes(format, n, k);
  if (need < 0 || (uint64_t)need != packed_bytes) {
    return mm_error(ctx, TP_ERR_ARG, "%s: weight [%lld, %lld] needs %lld repacked bytes, got %llu", fn, (long long)n,
                    (long long)k, (long long)need, (unsigned long long)packed_bytes);
  }
  if (m < 0 || m > TP_MM_MAX || (m > 0 && k > TP_MM_MAX / m) || (m > 0 && n > TP_MM_MAX / m)) {
    return mm_error(ctx, TP_ERR_ARG, "%s: bad m = %lld for k = %lld, n = %lld", fn, (long long)m, (long long)k,
                    (long long)n);
  }
  if (m == 0 || n == 0) return TP_OK;
  if (y == NULL || packed == NULL || (x == NULL && k > 0)) return mm_error(ctx, TP_ERR_ARG, "%s: a NULL pointer", fn);
  const uint64_t y_bytes = (uint64_t)m * (uint64_t)n * 4, x_bytes = (uint64_t)m * (uint64_t)k * 4;
  if (overlaps(y, y_bytes, x, x_bytes) || overlaps(y, y_bytes, packed, packed_bytes) ||
      overlaps(y, y_bytes, bias, bias ? (uint64_t)n * 4 : 0)) {
    return mm_error(ctx, TP_ERR_ARG, "%s: y overlaps an input", fn);
  }
  const int64_t nb = k / 32, groups = (n + TP_RP_ROWS - 1) / TP_RP_ROWS;
  tp_mm_rp p = {.fmt = format, .m = m, .n = n, .k = k, .w = packed, .rec = (size_t)rp_rec(format), .bias = bias, .y = y};
  const int64_t threads = ctx->n_threads;
  const int small = (uint64_t)m * (uint64_t)n * (uint64_t)k < TP_MM_PARALLEL_MIN_MACS;
  int64_t prep_tasks = small || (uint64_t)m * (uint64_t)k < TP_MM_PARALLEL_MIN_MACS ? 1 : (m < threads ? m : threads);
  const size_t xq_bytes = round64((size_t)prep_tasks * (size_t)nb * 34);
  const size_t act_bytes = round64((size_t)m * (size_t)nb * sizeof(tp_rp_act));
  uint8_t *base = ctx_scratch(ctx, xq_bytes + act_bytes);
  if (base == NULL) return mm_error(ctx, TP_ERR_OOM, "%s: no memory for %zu bytes of scratch", fn, xq_bytes + act_bytes);
  rp_job job = {.p = &p, .x = x, .isa = ctx->isa, .xq = base, .act = (tp_rp_act *)(base + xq_bytes)};
  job.rows_per_task = (m + prep_tasks - 1) / prep_tasks;
  prep_tasks = (m + job.rows_per_task - 1) / job.rows_per_task;
  p.act = job.act;
  run_tasks(ctx, prep_tasks, rp_prep_task, &job);
  /* row groups split evenly over the threads */
  const int64_t tasks = small ? 1 : (groups < threads ? groups : threads);
  job.groups_per_task = (groups + tasks - 1) / tasks;
  run_tasks(ctx, (groups + job.groups_per_task - 1) / job.groups_per_task, rp_task, &job);
  ctx_scratch_trim(ctx);
  return TP_OK;
}
