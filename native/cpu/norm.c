/*
 * Normalisations: rms_norm, layer_norm (rows of the last dimension) and group_norm. Statistics are
 * accumulated in f64 from f32 partial sums (vec_*.c). Large means do not cost accuracy: the mean is
 * x[0] + Σ(x − x[0]) / n (a shifted sum), it is kept as two floats (hi + lo), and the variance is a
 * second pass over ((x − hi) − lo)², where x − hi is exact for x near the mean (Sterbenz). The output rounding follows torch:
 * RMSNorm `x * rsqrt(mean(x²) + eps) * weight` (HF LlamaRMSNorm, Gemma3RMSNorm with 1 + weight),
 * LayerNorm `(x − mean) * rstd * weight + bias`.
 *
 * Sources: Zhang & Sennrich 2019 (RMSNorm); Ba et al. 2016 (LayerNorm); Wu & He 2018 (GroupNorm).
 */
#include <math.h>

#include "ops.h"

/* Elements below which a norm runs on the calling thread. */
#define NORM_MIN_TASK 16384

typedef struct norm_job {
  const tp_vec_kernels *vec;
  const float *x, *w, *b;
  float *y;
  uint64_t rows, dim;
  float eps, w_offset;
  int layer; /* 1: layer_norm (subtract the mean), 0: rms_norm */
} norm_job;

static void norm_task(void *arg, int64_t task, int64_t n_tasks) {
  const norm_job *j = arg;
  const uint64_t r0 = (uint64_t)task * j->rows / (uint64_t)n_tasks;
  const uint64_t r1 = (uint64_t)(task + 1) * j->rows / (uint64_t)n_tasks;
  const size_t d = (size_t)j->dim;
  for (uint64_t r = r0; r < r1; r++) {
    const float *x = j->x + r * j->dim;
    float *y = j->y + r * j->dim;
    const double mean = j->layer ? (double)x[0] + j->vec->sum(x, d, x[0]) / (double)d : 0.0;
    const float hi = (float)mean, lo = (float)(mean - (double)hi); /* the mean in two floats */
    const float var = (float)(j->vec->sum_sq_dev(x, d, hi, lo) / (double)d);
    const float rstd = 1.0f / sqrtf(var + j->eps);
    j->vec->norm_apply(x, y, d, hi, lo, rstd, j->w, j->w_offset, j->b);
  }
}

static tp_status run_norm(tp_ctx *ctx, const char *name, norm_job *job) {
  if (job->rows == 0 || job->dim == 0) return TP_OK;
  if (job->x == NULL || job->y == NULL) return tp_op_error(ctx, TP_ERR_ARG, "%s: x or y is NULL", name);
  uint64_t n;
  if (!tp_mul_ok(job->rows, job->dim, &n)) return tp_op_error(ctx, TP_ERR_ARG, "%s: rows × dim is too large", name);
  if (!(job->eps >= 0.0f)) return tp_op_error(ctx, TP_ERR_ARG, "%s: eps must be >= 0", name);
  job->vec = tp_vec_for(ctx);
  int64_t tasks = tp_task_count(ctx, n, NORM_MIN_TASK, 4);
  if ((uint64_t)tasks > job->rows) tasks = (int64_t)job->rows;
  tp_run_tasks(ctx, tasks, norm_task, job);
  return TP_OK;
}

tp_status tp_cpu_rms_norm_f32(tp_ctx *ctx, const float *x, const float *weight, float *y, uint64_t rows,
                              uint64_t dim, float eps, uint32_t flags) {
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  if ((flags & ~(uint32_t)TP_NORM_UNIT_OFFSET) != 0)
    return tp_op_error(ctx, TP_ERR_ARG, "tp_cpu_rms_norm_f32: unknown flags 0x%x", (unsigned)flags);
  norm_job job = {.x = x, .w = weight, .b = NULL, .y = y, .rows = rows, .dim = dim, .eps = eps,
                  .w_offset = (flags & TP_NORM_UNIT_OFFSET) ? 1.0f : 0.0f, .layer = 0};
  return run_norm(ctx, "tp_cpu_rms_norm_f32", &job);
}

tp_status tp_cpu_layer_norm_f32(tp_ctx *ctx, const float *x, const float *weight, const float *bias, float *y,
                                uint64_t rows, uint64_t dim, float eps) {
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  norm_job job = {.x = x, .w = weight, .b = bias, .y = y, .rows = rows, .dim = dim, .eps = eps, .w_offset = 0.0f, .layer = 1};
  return run_norm(ctx, "tp_cpu_layer_norm_f32", &job);
}

/* ---- group_norm ---------------------------------------------------------------------------------- */

typedef struct group_job {
  const tp_vec_kernels *vec;
  const float *x, *w, *b;
  float *y;
  uint64_t batch, channels, spatial, groups;
  float eps;
} group_job;

/* Task t normalises group (t % groups) of batch item (t / groups): channels_per_group × spatial contiguous values. */
static void group_task(void *arg, int64_t task, int64_t n_tasks) {
  (void)n_tasks;
  const group_job *j = arg;
  const uint64_t cpg = j->channels / j->groups;
  const uint64_t g = (uint64_t)task % j->groups;
  const uint64_t n = (uint64_t)task / j->groups;
  const uint64_t c0 = g * cpg;
  const size_t count = (size_t)(cpg * j->spatial);
  const float *x = j->x + (n * j->channels + c0) * j->spatial;
  float *y = j->y + (n * j->channels + c0) * j->spatial;
  const double mean = (double)x[0] + j->vec->sum(x, count, x[0]) / (double)count;
  const float hi = (float)mean, lo = (float)(mean - (double)hi); /* the mean in two floats */
  const float var = (float)(j->vec->sum_sq_dev(x, count, hi, lo) / (double)count);
  const float rstd = 1.0f / sqrtf(var + j->eps);
  for (uint64_t c = 0; c < cpg; c++) {
    const float a = j->w != NULL ? rstd * j->w[c0 + c] : rstd;
    const float b = j->b != NULL ? j->b[c0 + c] : 0.0f;
    j->vec->shift_scale(x + c * j->spatial, y + c * j->spatial, (size_t)j->spatial, hi, lo, a, b);
  }
}

tp_status tp_cpu_group_norm_f32(tp_ctx *ctx, const float *x, const float *weight, const float *bias, float *y,
                                uint64_t batch, uint64_t channels, uint64_t spatial, uint64_t groups, float eps) {
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  const char *name = "tp_cpu_group_norm_f32";
  if (groups == 0 || channels % groups != 0)
    return tp_op_error(ctx, TP_ERR_ARG, "%s: %llu channels are not divisible into %llu groups", name,
                       (unsigned long long)channels, (unsigned long long)groups);
  uint64_t n, tasks;
  if (!tp_mul_ok(batch, channels, &n) || !tp_mul_ok(n, spatial, &n) || !tp_mul_ok(batch, groups, &tasks))
    return tp_op_error(ctx, TP_ERR_ARG, "%s: the shape is too large", name);
  if (n == 0) return TP_OK;
  if (x == NULL || y == NULL) return tp_op_error(ctx, TP_ERR_ARG, "%s: x or y is NULL", name);
  if (!(eps >= 0.0f)) return tp_op_error(ctx, TP_ERR_ARG, "%s: eps must be >= 0", name);
  group_job job = {.vec = tp_vec_for(ctx), .x = x, .w = weight, .b = bias, .y = y, .batch = batch,
                   .channels = channels, .spatial = spatial, .groups = groups, .eps = eps};
  tp_run_tasks(ctx, (int64_t)tasks, group_task, &job);
  return TP_OK;
}
