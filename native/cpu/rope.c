/*
 * Rotary position embedding (RoFormer, arXiv:2104.09864 §3.4) on x [batch, seq, heads, head_dim].
 *
 * The rope_dims/2 rotated pairs are split into sections (one section when there are none); pair k
 * of a section of n pairs, on axis a, turns by  angle = pos[a][s] · freq_scale · theta^(−k/n)
 * (theta^(−2k/D) with D = 2n, the axis' dimension: HF `inv_freq`, Flux / Krea 2 / Qwen-Image's
 * per-axis tables). Angles, cos and sin are computed in f64 and rounded to f32 once, as ComfyUI
 * builds its tables (krea2.md §3.5); the rotation itself is f32:
 *   neox (HF rotate_half):   y[i] = x[i]·c − x[i+h]·s,   y[i+h] = x[i+h]·c + x[i]·s,  h = rope_dims/2
 *   interleaved (GPT-J/Flux): y[2i] = x[2i]·c − x[2i+1]·s, y[2i+1] = x[2i]·s + x[2i+1]·c
 * Dimensions rope_dims..head_dim−1 pass through unchanged.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

typedef struct rope_job {
  const float *x;
  float *y;
  uint64_t batch, seq, heads, head_dim, pairs;
  const int32_t *positions;
  const int32_t *axis_of_pair; /* [pairs] */
  const double *inv_freq;      /* [pairs] */
  double freq_scale;
  float *cs; /* [seq][pairs][2]: cos, sin */
  int mode;
} rope_job;

static void table_task(void *arg, int64_t task, int64_t n_tasks) {
  const rope_job *j = arg;
  const uint64_t s0 = (uint64_t)task * j->seq / (uint64_t)n_tasks;
  const uint64_t s1 = (uint64_t)(task + 1) * j->seq / (uint64_t)n_tasks;
  for (uint64_t s = s0; s < s1; s++)
    for (uint64_t p = 0; p < j->pairs; p++) {
      const double pos = (double)j->positions[(uint64_t)j->axis_of_pair[p] * j->seq + s];
      const double angle = pos * j->freq_scale * j->inv_freq[p];
      j->cs[(s * j->pairs + p) * 2] = (float)cos(angle);
      j->cs[(s * j->pairs + p) * 2 + 1] = (float)sin(angle);
    }
}

/* Task rows are (batch, seq) pairs: heads × head_dim contiguous values each. */
static void rope_task(void *arg, int64_t task, int64_t n_tasks) {
  const rope_job *j = arg;
  const uint64_t rows = j->batch * j->seq;
  const uint64_t r0 = (uint64_t)task * rows / (uint64_t)n_tasks;
  const uint64_t r1 = (uint64_t)(task + 1) * rows / (uint64_t)n_tasks;
  const uint64_t half = j->pairs, hd = j->head_dim;
  for (uint64_t r = r0; r < r1; r++) {
    const float *cs = j->cs + (r % j->seq) * j->pairs * 2;
    for (uint64_t h = 0; h < j->heads; h++) {
      const float *x = j->x + (r * j->heads + h) * hd;
      float *y = j->y + (r * j->heads + h) * hd;
      if (j->mode == TP_ROPE_NEOX) {
        for (uint64_t i = 0; i < half; i++) {
          const float c = cs[2 * i], s = cs[2 * i + 1];
          const float x0 = x[i], x1 = x[i + half];
          y[i] = x0 * c - x1 * s;
          y[i + half] = x1 * c + x0 * s;
        }
      } else {
        for (uint64_t i = 0; i < half; i++) {
          const float c = cs[2 * i], s = cs[2 * i + 1];
          const float x0 = x[2 * i], x1 = x[2 * i + 1];
          y[2 * i] = x0 * c - x1 * s;
          y[2 * i + 1] = x0 * s + x1 * c;
        }
      }
      if (2 * half < hd) memcpy(y + 2 * half, x + 2 * half, (size_t)(hd - 2 * half) * sizeof(float));
    }
  }
}

tp_status tp_cpu_rope_f32(tp_ctx *ctx, const float *x, float *y, uint64_t batch, uint64_t seq, uint64_t heads,
                          uint64_t head_dim, const int32_t *positions, const int32_t *sections, int32_t n_sections,
                          int32_t rope_dims, int32_t mode, double theta, double freq_scale) {
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  const char *name = "tp_cpu_rope_f32";
  if (mode != TP_ROPE_NEOX && mode != TP_ROPE_INTERLEAVED)
    return tp_op_error(ctx, TP_ERR_ARG, "%s: mode %d is not 0 (neox) or 1 (interleaved)", name, (int)mode);
  if (rope_dims < 0 || (rope_dims & 1) || (uint64_t)rope_dims > head_dim)
    return tp_op_error(ctx, TP_ERR_ARG, "%s: rope_dims %d must be even and at most head_dim %llu", name,
                       (int)rope_dims, (unsigned long long)head_dim);
  if (!(theta > 0) || !isfinite(theta) || !isfinite(freq_scale))
    return tp_op_error(ctx, TP_ERR_ARG, "%s: theta must be positive and freq_scale finite", name);
  if (n_sections < 0 || n_sections > 64 || (n_sections > 0 && sections == NULL))
    return tp_op_error(ctx, TP_ERR_ARG, "%s: n_sections %d must be in [0, 64] with a sections array", name,
                       (int)n_sections);
  const uint64_t pairs = (uint64_t)rope_dims / 2;
  uint64_t total = 0;
  for (int32_t a = 0; a < n_sections; a++) {
    if (sections[a] < 0) return tp_op_error(ctx, TP_ERR_ARG, "%s: sections[%d] is negative", name, (int)a);
    total += (uint64_t)sections[a];
  }
  if (n_sections > 0 && total != pairs)
    return tp_op_error(ctx, TP_ERR_ARG, "%s: sections sum to %llu pairs, rope_dims/2 is %llu", name,
                       (unsigned long long)total, (unsigned long long)pairs);
  uint64_t n;
  if (!tp_mul_ok(batch, seq, &n) || !tp_mul_ok(n, heads, &n) || !tp_mul_ok(n, head_dim, &n))
    return tp_op_error(ctx, TP_ERR_ARG, "%s: the shape is too large", name);
  if (n == 0) return TP_OK;
  if (x == NULL || y == NULL || positions == NULL) return tp_op_error(ctx, TP_ERR_ARG, "%s: a NULL buffer", name);

  uint64_t table;
  if (!tp_mul_ok(seq, pairs * 2, &table)) return tp_op_error(ctx, TP_ERR_ARG, "%s: the table is too large", name);
  float *cs = malloc((size_t)(table == 0 ? 1 : table) * sizeof(float));
  int32_t *axis = malloc((size_t)(pairs == 0 ? 1 : pairs) * sizeof(int32_t));
  double *inv = malloc((size_t)(pairs == 0 ? 1 : pairs) * sizeof(double));
  if (cs == NULL || axis == NULL || inv == NULL) {
    free(cs);
    free(axis);
    free(inv);
    return tp_op_error(ctx, TP_ERR_OOM, "%s: no memory for a table of %llu values", name, (unsigned long long)table);
  }
  /* pair p → (axis, k, n): consecutive sections; one section of all pairs without sections */
  uint64_t p = 0;
  const int32_t axes = n_sections > 0 ? n_sections : 1;
  for (int32_t a = 0; a < axes; a++) {
    const uint64_t size = n_sections > 0 ? (uint64_t)sections[a] : pairs;
    for (uint64_t k = 0; k < size; k++, p++) {
      axis[p] = a;
      inv[p] = pow(theta, -(double)k / (double)size);
    }
  }
  rope_job job = {.x = x, .y = y, .batch = batch, .seq = seq, .heads = heads, .head_dim = head_dim, .pairs = pairs,
                  .positions = positions, .axis_of_pair = axis, .inv_freq = inv, .freq_scale = freq_scale, .cs = cs,
                  .mode = mode};
  int64_t tasks = tp_task_count(ctx, table, 4096, 1);
  if ((uint64_t)tasks > seq) tasks = (int64_t)seq;
  tp_run_tasks(ctx, tasks, table_task, &job);
  tasks = tp_task_count(ctx, n, 16384, 4);
  if ((uint64_t)tasks > batch * seq) tasks = (int64_t)(batch * seq);
  tp_run_tasks(ctx, tasks, rope_task, &job);
  free(cs);
  free(axis);
  free(inv);
  return TP_OK;
}
