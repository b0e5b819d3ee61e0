/*
 * Nearest-neighbour upsampling by an integer factor f on the last two dimensions:
 * y[p, i, j] = x[p, i / f, j / f] (torch.nn.functional.interpolate(mode="nearest"), which equals
 * "nearest-exact" for integer factors). Each input row is widened once and the result copied f times.
 */
#include <string.h>

#include "ops.h"

typedef struct up_job {
  const float *x;
  float *y;
  uint64_t rows, w; /* input rows (planes × h) */
  uint64_t f;
} up_job;

static void up_task(void *arg, int64_t task, int64_t n_tasks) {
  const up_job *j = arg;
  const uint64_t r0 = (uint64_t)task * j->rows / (uint64_t)n_tasks;
  const uint64_t r1 = (uint64_t)(task + 1) * j->rows / (uint64_t)n_tasks;
  const uint64_t ow = j->w * j->f;
  for (uint64_t r = r0; r < r1; r++) {
    const float *x = j->x + r * j->w;
    float *y = j->y + r * j->f * ow;
    for (uint64_t c = 0; c < j->w; c++)
      for (uint64_t k = 0; k < j->f; k++) y[c * j->f + k] = x[c];
    for (uint64_t k = 1; k < j->f; k++) memcpy(y + k * ow, y, (size_t)ow * sizeof(float));
  }
}

tp_status tp_cpu_upsample_nearest2d_f32(tp_ctx *ctx, const float *x, float *y, uint64_t planes, uint64_t h,
                                        uint64_t w, int32_t factor) {
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  const char *name = "tp_cpu_upsample_nearest2d_f32";
  if (factor < 1) return tp_op_error(ctx, TP_ERR_ARG, "%s: factor %d must be >= 1", name, (int)factor);
  uint64_t rows, n;
  if (!tp_mul_ok(planes, h, &rows) || !tp_mul_ok(rows, w, &n) || !tp_mul_ok(n, (uint64_t)factor * (uint64_t)factor, &n))
    return tp_op_error(ctx, TP_ERR_ARG, "%s: the shape is too large", name);
  if (n == 0) return TP_OK;
  if (x == NULL || y == NULL) return tp_op_error(ctx, TP_ERR_ARG, "%s: x or y is NULL", name);
  up_job job = {.x = x, .y = y, .rows = rows, .w = w, .f = (uint64_t)factor};
  int64_t tasks = tp_task_count(ctx, n, 1u << 15, 4);
  if ((uint64_t)tasks > rows) tasks = (int64_t)rows;
  tp_run_tasks(ctx, tasks, up_task, &job);
  return TP_OK;
}
