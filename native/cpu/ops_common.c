/*
 * Shared helpers of the op files (ops.h): error messages, task counts, the ISA choice of the
 * vector primitives.
 */
#include <stdarg.h>
#include <stdio.h>

#include "ops.h"

tp_status tp_op_error(tp_ctx *ctx, tp_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx->error, sizeof ctx->error, fmt, ap);
  va_end(ap);
  return status;
}

int64_t tp_task_count(const tp_ctx *ctx, uint64_t work, uint64_t min_per_task, int64_t per_thread) {
  if (ctx->n_threads <= 1 || work <= min_per_task) return 1;
  const uint64_t most = (uint64_t)ctx->n_threads * (uint64_t)per_thread;
  const uint64_t by_size = work / (min_per_task == 0 ? 1 : min_per_task);
  const uint64_t n = by_size < most ? by_size : most;
  return n < 1 ? 1 : (int64_t)n;
}

void tp_run_tasks(tp_ctx *ctx, int64_t n_tasks, tp_task_fn fn, void *arg) {
  if (n_tasks <= 0) return;
  if (n_tasks == 1 || ctx->n_threads <= 1) {
    for (int64_t t = 0; t < n_tasks; t++) fn(arg, t, n_tasks);
    return;
  }
  tp_parallel_for(&ctx->pool, n_tasks, fn, arg);
}

int tp_mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
  const uint64_t limit = (uint64_t)1 << 62;
  if (a != 0 && b > limit / a) return 0;
  *out = a * b;
  return 1;
}

const tp_vec_kernels *tp_vec_for(const tp_ctx *ctx) {
#if TP_OPS_X86
  if (ctx->isa >= TP_ISA_AVX512) return &tp_vec_avx512;
  if (ctx->isa >= TP_ISA_AVX2) return &tp_vec_avx2;
#else
  (void)ctx;
#endif
  return &tp_vec_scalar;
}
