/*
 * softmax over the middle axis of [outer, dim, inner]: y = exp(x − max) / Σ exp(x − max)
 * (max-subtracted, as torch.softmax). inner = 1 (the last dimension, the common case) runs on the
 * vector primitives row by row; inner > 1 walks columns with a scratch of `inner` maxima and sums.
 */
#include <math.h>
#include <stdlib.h>

#include "ops.h"

#define SOFTMAX_MIN_TASK 16384

typedef struct softmax_job {
  const tp_vec_kernels *vec;
  const float *x;
  float *y;
  uint64_t outer, dim, inner;
  int oom; /* set by a task whose scratch allocation failed */
} softmax_job;

static void softmax_rows(const softmax_job *j, uint64_t r0, uint64_t r1) {
  const size_t d = (size_t)j->dim;
  for (uint64_t r = r0; r < r1; r++) {
    const float *x = j->x + r * j->dim;
    float *y = j->y + r * j->dim;
    const float m = j->vec->max(x, d);
    const double s = j->vec->exp_sum(x, y, d, m);
    j->vec->scale(y, y, d, (float)(1.0 / s));
  }
}

/* One [dim, inner] slab: columns are contiguous along inner, so every loop below runs along it. */
static int softmax_slab(const softmax_job *j, uint64_t o) {
  const size_t d = (size_t)j->dim, in = (size_t)j->inner;
  const float *x = j->x + o * j->dim * j->inner;
  float *y = j->y + o * j->dim * j->inner;
  float *m = malloc(in * sizeof(float));
  double *s = malloc(in * sizeof(double));
  if (m == NULL || s == NULL) {
    free(m);
    free(s);
    return 0;
  }
  for (size_t c = 0; c < in; c++) {
    m[c] = x[c];
    s[c] = 0;
  }
  for (size_t i = 1; i < d; i++)
    for (size_t c = 0; c < in; c++) {
      const float v = x[i * in + c];
      if (v > m[c] || v != v) m[c] = v;
    }
  for (size_t i = 0; i < d; i++) {
    j->vec->binary(TP_BIN_SUB, x + i * in, 1, m, 1, y + i * in, in);
    /* exp in place through the primitive: exp(y − 0) */
    const double unused = j->vec->exp_sum(y + i * in, y + i * in, in, 0.0f);
    (void)unused;
    for (size_t c = 0; c < in; c++) s[c] += y[i * in + c];
  }
  for (size_t c = 0; c < in; c++) m[c] = (float)(1.0 / s[c]);
  for (size_t i = 0; i < d; i++) j->vec->binary(TP_BIN_MUL, y + i * in, 1, m, 1, y + i * in, in);
  free(m);
  free(s);
  return 1;
}

static void softmax_task(void *arg, int64_t task, int64_t n_tasks) {
  softmax_job *j = arg;
  const uint64_t r0 = (uint64_t)task * j->outer / (uint64_t)n_tasks;
  const uint64_t r1 = (uint64_t)(task + 1) * j->outer / (uint64_t)n_tasks;
  if (j->inner == 1) {
    softmax_rows(j, r0, r1);
    return;
  }
  for (uint64_t o = r0; o < r1; o++)
    if (!softmax_slab(j, o)) __atomic_store_n(&j->oom, 1, __ATOMIC_RELAXED);
}

tp_status tp_cpu_softmax_f32(tp_ctx *ctx, const float *x, float *y, uint64_t outer, uint64_t dim, uint64_t inner) {
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  const char *name = "tp_cpu_softmax_f32";
  uint64_t n;
  if (!tp_mul_ok(outer, dim, &n) || !tp_mul_ok(n, inner, &n))
    return tp_op_error(ctx, TP_ERR_ARG, "%s: the shape is too large", name);
  if (n == 0) return TP_OK;
  if (x == NULL || y == NULL) return tp_op_error(ctx, TP_ERR_ARG, "%s: x or y is NULL", name);
  softmax_job job = {.vec = tp_vec_for(ctx), .x = x, .y = y, .outer = outer, .dim = dim, .inner = inner, .oom = 0};
  int64_t tasks = tp_task_count(ctx, n, SOFTMAX_MIN_TASK, 4);
  if ((uint64_t)tasks > outer) tasks = (int64_t)outer;
  tp_run_tasks(ctx, tasks, softmax_task, &job);
  if (job.oom) return tp_op_error(ctx, TP_ERR_OOM, "%s: no memory for a scratch of %llu columns", name, (unsigned long long)inner);
  return TP_OK;
}
