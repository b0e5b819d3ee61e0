/*
 * Numeric checks: the number of non-finite elements (NaN, +∞, −∞) of an f32 array, for the stage
 * checks of the pipelines (a 4-byte answer instead of a download of the tensor). A value is non-finite
 * when its exponent bits are all ones (IEEE 754); the test is on the bits, so no compiler flag about
 * floating point can change it.
 */
#include <string.h>

#include "ops.h"

typedef struct nonfinite_job {
  const float *x;
  uint64_t n;
  uint64_t count;
} nonfinite_job;

static void nonfinite_task(void *arg, int64_t task, int64_t n_tasks) {
  nonfinite_job *j = arg;
  const uint64_t i0 = (uint64_t)task * j->n / (uint64_t)n_tasks;
  const uint64_t i1 = (uint64_t)(task + 1) * j->n / (uint64_t)n_tasks;
  uint64_t count = 0;
  for (uint64_t i = i0; i < i1; i++) {
    uint32_t bits;
    memcpy(&bits, j->x + i, sizeof bits);
    count += (bits & 0x7f800000u) == 0x7f800000u;
  }
  if (count != 0) __atomic_fetch_add(&j->count, count, __ATOMIC_RELAXED);
}

tp_status tp_cpu_count_nonfinite_f32(tp_ctx *ctx, const float *x, uint64_t n, int32_t *out) {
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  if (out == NULL) return tp_op_error(ctx, TP_ERR_ARG, "tp_cpu_count_nonfinite_f32: out is NULL");
  if (n > 0 && x == NULL) return tp_op_error(ctx, TP_ERR_ARG, "tp_cpu_count_nonfinite_f32: x is NULL");
  nonfinite_job job = {.x = x, .n = n, .count = 0};
  if (n > 0) tp_run_tasks(ctx, tp_task_count(ctx, n, 1u << 18, 1), nonfinite_task, &job);
  *out = job.count > (uint64_t)INT32_MAX ? INT32_MAX : (int32_t)job.count;
  return TP_OK;
}
