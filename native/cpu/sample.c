/*
 * Sampling helpers over rows of f32: argmax and top_k (the k largest, descending). Order: a larger
 * value first, NaN counts as larger than every number (as torch.argmax / torch.topk), and between
 * equal values (or two NaNs) the lower index first. top_k keeps a min-heap of the k best seen so far,
 * O(n log k) per row, then sorts it.
 */
#include <stdlib.h>

#include "ops.h"

typedef struct sample_job {
  const float *x;
  float *values;
  int32_t *indices;
  uint64_t rows, n, k;
  int oom;
} sample_job;

/* 1 when (va, ia) comes before (vb, ib) in the order above */
static int before(float va, int32_t ia, float vb, int32_t ib) {
  const int na = va != va, nb = vb != vb;
  if (na || nb) return na && (!nb || ia < ib);
  return va > vb || (va == vb && ia < ib);
}

static void argmax_task(void *arg, int64_t task, int64_t n_tasks) {
  const sample_job *j = arg;
  const uint64_t r0 = (uint64_t)task * j->rows / (uint64_t)n_tasks;
  const uint64_t r1 = (uint64_t)(task + 1) * j->rows / (uint64_t)n_tasks;
  for (uint64_t r = r0; r < r1; r++) {
    const float *x = j->x + r * j->n;
    float best = x[0];
    int32_t at = 0;
    if (best == best)
      for (uint64_t i = 1; i < j->n; i++) {
        const float v = x[i];
        if (v != v) { /* the first NaN wins */
          at = (int32_t)i;
          break;
        }
        if (v > best) {
          best = v;
          at = (int32_t)i;
        }
      }
    j->indices[r] = at;
  }
}

/* Restore the heap below slot i; the root is the entry that comes last in the order. */
static void sift_down(float *hv, int32_t *hi, uint64_t size, uint64_t i) {
  for (;;) {
    const uint64_t l = 2 * i + 1, r = l + 1;
    uint64_t w = i;
    if (l < size && before(hv[w], hi[w], hv[l], hi[l])) w = l;
    if (r < size && before(hv[w], hi[w], hv[r], hi[r])) w = r;
    if (w == i) return;
    const float tv = hv[i];
    const int32_t ti = hi[i];
    hv[i] = hv[w];
    hi[i] = hi[w];
    hv[w] = tv;
    hi[w] = ti;
    i = w;
  }
}

static void top_k_task(void *arg, int64_t task, int64_t n_tasks) {
  sample_job *j = arg;
  const uint64_t r0 = (uint64_t)task * j->rows / (uint64_t)n_tasks;
  const uint64_t r1 = (uint64_t)(task + 1) * j->rows / (uint64_t)n_tasks;
  for (uint64_t r = r0; r < r1; r++) {
    const float *x = j->x + r * j->n;
    /* the output row is the heap: no scratch needed */
    float *hv = j->values + r * j->k;
    int32_t *hi = j->indices + r * j->k;
    uint64_t size = 0;
    for (uint64_t i = 0; i < j->n; i++) {
      const float v = x[i];
      if (size < j->k) {
        /* sift up */
        uint64_t c = size++;
        while (c > 0) {
          const uint64_t p = (c - 1) / 2;
          if (!before(hv[p], hi[p], v, (int32_t)i)) break;
          hv[c] = hv[p];
          hi[c] = hi[p];
          c = p;
        }
        hv[c] = v;
        hi[c] = (int32_t)i;
      } else if (before(v, (int32_t)i, hv[0], hi[0])) {
        hv[0] = v;
        hi[0] = (int32_t)i;
        sift_down(hv, hi, size, 0);
      }
    }
    /* heap sort: move the last-in-order root to the end, so the row ends up first-in-order first */
    for (uint64_t end = size; end > 1; end--) {
      const float tv = hv[0];
      const int32_t ti = hi[0];
      hv[0] = hv[end - 1];
      hi[0] = hi[end - 1];
      hv[end - 1] = tv;
      hi[end - 1] = ti;
      sift_down(hv, hi, end - 1, 0);
    }
  }
}

static tp_status check_rows(tp_ctx *ctx, const char *name, const float *x, uint64_t rows, uint64_t n) {
  uint64_t total;
  if (n > (uint64_t)INT32_MAX || !tp_mul_ok(rows, n, &total))
    return tp_op_error(ctx, TP_ERR_ARG, "%s: rows of %llu values do not fit i32 indices", name, (unsigned long long)n);
  if (rows > 0 && n == 0) return tp_op_error(ctx, TP_ERR_ARG, "%s: rows of 0 values have no maximum", name);
  if (rows > 0 && x == NULL) return tp_op_error(ctx, TP_ERR_ARG, "%s: x is NULL", name);
  return TP_OK;
}

tp_status tp_cpu_argmax_f32(tp_ctx *ctx, const float *x, int32_t *out, uint64_t rows, uint64_t n) {
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  const tp_status st = check_rows(ctx, "tp_cpu_argmax_f32", x, rows, n);
  if (st != TP_OK || rows == 0) return st;
  if (out == NULL) return tp_op_error(ctx, TP_ERR_ARG, "tp_cpu_argmax_f32: out is NULL");
  sample_job job = {.x = x, .indices = out, .rows = rows, .n = n};
  int64_t tasks = tp_task_count(ctx, rows * n, 1u << 16, 1);
  if ((uint64_t)tasks > rows) tasks = (int64_t)rows;
  tp_run_tasks(ctx, tasks, argmax_task, &job);
  return TP_OK;
}

tp_status tp_cpu_top_k_f32(tp_ctx *ctx, const float *x, float *values, int32_t *indices, uint64_t rows, uint64_t n,
                           uint64_t k) {
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  const char *name = "tp_cpu_top_k_f32";
  if (k > n) return tp_op_error(ctx, TP_ERR_ARG, "%s: k = %llu is larger than the row of %llu", name,
                                (unsigned long long)k, (unsigned long long)n);
  const tp_status st = check_rows(ctx, name, x, rows, n);
  if (st != TP_OK || rows == 0 || k == 0) return st;
  if (values == NULL || indices == NULL) return tp_op_error(ctx, TP_ERR_ARG, "%s: values or indices is NULL", name);
  sample_job job = {.x = x, .values = values, .indices = indices, .rows = rows, .n = n, .k = k};
  int64_t tasks = tp_task_count(ctx, rows * n, 1u << 16, 1);
  if ((uint64_t)tasks > rows) tasks = (int64_t)rows;
  tp_run_tasks(ctx, tasks, top_k_task, &job);
  return TP_OK;
}
