/*
 * Elementwise entry points of tp.h: silu, sigmoid, gelu, scale, swiglu (contiguous), and the
 * broadcasting add / sub / mul / modulate over strided inputs. The maths is in the vector
 * primitives (vec_*.c); this file checks arguments, walks strides and splits work over threads.
 *
 * Strided walk: dimensions of size 1 are dropped and adjacent dimensions merged where every operand
 * is contiguous across them, so a broadcast of [rows, 1] against [rows, cols] runs as rows calls of
 * a broadcast row kernel; the last (merged) dimension is the row each primitive call handles.
 */
#include <string.h>

#include "ops.h"

/* Contiguous elements below which a call runs on the calling thread (waking workers costs more). */
#define EW_MIN_TASK 8192
/* Chunk boundaries are multiples of this many elements (whole cache lines of f32). */
#define EW_ALIGN 16

/* ---- contiguous unary / binary ---------------------------------------------------------------- */

typedef enum { EW_SILU, EW_SIGMOID, EW_GELU_ERF, EW_GELU_TANH, EW_SCALE, EW_SWIGLU } ew_kind;

typedef struct ew_job {
  ew_kind kind;
  const tp_vec_kernels *vec;
  const float *x, *x2;
  float *y;
  size_t n, chunk;
  float s;
} ew_job;

static void ew_task(void *arg, int64_t task, int64_t n_tasks) {
  (void)n_tasks;
  const ew_job *j = arg;
  const size_t begin = (size_t)task * j->chunk;
  if (begin >= j->n) return;
  const size_t count = j->n - begin < j->chunk ? j->n - begin : j->chunk;
  const float *x = j->x + begin;
  float *y = j->y + begin;
  switch (j->kind) {
    case EW_SILU: j->vec->silu(x, y, count); break;
    case EW_SIGMOID: j->vec->sigmoid(x, y, count); break;
    case EW_GELU_ERF: j->vec->gelu_erf(x, y, count); break;
    case EW_GELU_TANH: j->vec->gelu_tanh(x, y, count); break;
    case EW_SCALE: j->vec->scale(x, y, count, j->s); break;
    case EW_SWIGLU: j->vec->swiglu(x, j->x2 + begin, y, count); break;
  }
}

static tp_status run_ew(tp_ctx *ctx, const char *op, ew_kind kind, const float *x, const float *x2, float *y,
                        uint64_t n, float s) {
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  if (n == 0) return TP_OK;
  if (x == NULL || y == NULL || (kind == EW_SWIGLU && x2 == NULL))
    return tp_op_error(ctx, TP_ERR_ARG, "%s: a NULL buffer with n = %llu", op, (unsigned long long)n);
  if (n > ((uint64_t)1 << 60)) return tp_op_error(ctx, TP_ERR_ARG, "%s: n = %llu is too large", op, (unsigned long long)n);
  ew_job job = {.kind = kind, .vec = tp_vec_for(ctx), .x = x, .x2 = x2, .y = y, .n = (size_t)n, .chunk = (size_t)n, .s = s};
  const int64_t tasks = tp_task_count(ctx, n, EW_MIN_TASK, 1);
  if (tasks > 1) {
    size_t chunk = (job.n + (size_t)tasks - 1) / (size_t)tasks;
    job.chunk = (chunk + EW_ALIGN - 1) / EW_ALIGN * EW_ALIGN;
  }
  tp_run_tasks(ctx, tasks, ew_task, &job);
  return TP_OK;
}

tp_status tp_cpu_silu_f32(tp_ctx *ctx, const float *x, float *y, uint64_t n) {
  return run_ew(ctx, "tp_cpu_silu_f32", EW_SILU, x, NULL, y, n, 0);
}

tp_status tp_cpu_sigmoid_f32(tp_ctx *ctx, const float *x, float *y, uint64_t n) {
  return run_ew(ctx, "tp_cpu_sigmoid_f32", EW_SIGMOID, x, NULL, y, n, 0);
}

tp_status tp_cpu_gelu_f32(tp_ctx *ctx, const float *x, float *y, uint64_t n, int32_t approximate) {
  if (ctx != NULL && approximate != 0 && approximate != 1)
    return tp_op_error(ctx, TP_ERR_ARG, "tp_cpu_gelu_f32: approximate must be 0 (erf) or 1 (tanh), got %d",
                       (int)approximate);
  return run_ew(ctx, "tp_cpu_gelu_f32", approximate ? EW_GELU_TANH : EW_GELU_ERF, x, NULL, y, n, 0);
}

tp_status tp_cpu_scale_f32(tp_ctx *ctx, const float *x, float *y, uint64_t n, float s) {
  return run_ew(ctx, "tp_cpu_scale_f32", EW_SCALE, x, NULL, y, n, s);
}

tp_status tp_cpu_swiglu_f32(tp_ctx *ctx, const float *gate, const float *up, float *y, uint64_t n) {
  return run_ew(ctx, "tp_cpu_swiglu_f32", EW_SWIGLU, gate, up, y, n, 0);
}

/* ---- strided, broadcasting ---------------------------------------------------------------------- */

#define MAX_IN 3

typedef struct strided_job {
  int op; /* TP_BIN_* or -1 for modulate */
  int n_in;
  const float *in[MAX_IN];
  int64_t st[MAX_IN][TP_MAX_RANK];
  int64_t shape[TP_MAX_RANK];
  int rank;   /* after merging, >= 1 */
  float *out; /* contiguous */
  uint64_t rows, inner;
  const tp_vec_kernels *vec;
} strided_job;

static void strided_task(void *arg, int64_t task, int64_t n_tasks) {
  const strided_job *j = arg;
  const uint64_t r0 = (uint64_t)task * j->rows / (uint64_t)n_tasks;
  const uint64_t r1 = (uint64_t)(task + 1) * j->rows / (uint64_t)n_tasks;
  if (r0 >= r1) return;
  const int outer = j->rank - 1;
  int64_t idx[TP_MAX_RANK];
  int64_t off[MAX_IN] = {0, 0, 0};
  uint64_t rem = r0;
  for (int d = outer - 1; d >= 0; d--) {
    idx[d] = (int64_t)(rem % (uint64_t)j->shape[d]);
    rem /= (uint64_t)j->shape[d];
    for (int k = 0; k < j->n_in; k++) off[k] += idx[d] * j->st[k][d];
  }
  const int64_t inner = (int64_t)j->inner;
  for (uint64_t r = r0; r < r1; r++) {
    float *y = j->out + r * j->inner;
    if (j->op >= 0)
      j->vec->binary(j->op, j->in[0] + off[0], j->st[0][outer], j->in[1] + off[1], j->st[1][outer], y, (size_t)inner);
    else
      j->vec->modulate(j->in[0] + off[0], j->st[0][outer], j->in[1] + off[1], j->st[1][outer], j->in[2] + off[2],
                       j->st[2][outer], y, (size_t)inner);
    /* odometer over the outer dimensions */
    for (int d = outer - 1; d >= 0; d--) {
      idx[d]++;
      for (int k = 0; k < j->n_in; k++) off[k] += j->st[k][d];
      if (idx[d] < j->shape[d]) break;
      for (int k = 0; k < j->n_in; k++) off[k] -= j->st[k][d] * j->shape[d];
      idx[d] = 0;
    }
  }
}

static const char *const in_names[2][MAX_IN] = {{"a", "b", ""}, {"x", "scale", "shift"}};

static tp_status run_strided(tp_ctx *ctx, const char *op_name, int op, int n_in, const float *const *in,
                             const uint64_t *len, const int64_t *const *strides, float *out, const int64_t *shape,
                             int32_t rank) {
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  const char *const *names = in_names[op < 0 ? 1 : 0];
  if (rank < 0 || rank > TP_MAX_RANK)
    return tp_op_error(ctx, TP_ERR_ARG, "%s: rank %d is outside [0, %d]", op_name, (int)rank, TP_MAX_RANK);
  if (rank > 0 && shape == NULL) return tp_op_error(ctx, TP_ERR_ARG, "%s: shape is NULL", op_name);
  uint64_t numel = 1;
  for (int d = 0; d < rank; d++) {
    if (shape[d] < 0) return tp_op_error(ctx, TP_ERR_ARG, "%s: shape[%d] = %lld is negative", op_name, d, (long long)shape[d]);
    if (!tp_mul_ok(numel, (uint64_t)shape[d], &numel))
      return tp_op_error(ctx, TP_ERR_ARG, "%s: the shape has too many elements", op_name);
  }
  if (numel == 0) return TP_OK;
  if (out == NULL) return tp_op_error(ctx, TP_ERR_ARG, "%s: out is NULL", op_name);
  for (int k = 0; k < n_in; k++) {
    if (in[k] == NULL) return tp_op_error(ctx, TP_ERR_ARG, "%s: %s is NULL", op_name, names[k]);
    if (rank > 0 && strides[k] == NULL) return tp_op_error(ctx, TP_ERR_ARG, "%s: %s_strides is NULL", op_name, names[k]);
    uint64_t last = 0; /* largest element offset the view reaches */
    for (int d = 0; d < rank; d++) {
      const int64_t s = strides[k][d];
      if (s < 0) return tp_op_error(ctx, TP_ERR_ARG, "%s: %s_strides[%d] = %lld is negative", op_name, names[k], d, (long long)s);
      uint64_t reach;
      if (!tp_mul_ok((uint64_t)(shape[d] - 1), (uint64_t)s, &reach) || last + reach < last)
        return tp_op_error(ctx, TP_ERR_ARG, "%s: %s's view is too large", op_name, names[k]);
      last += reach;
    }
    if (last >= len[k])
      return tp_op_error(ctx, TP_ERR_ARG, "%s: %s's view reaches element %llu but only %llu are given", op_name,
                         names[k], (unsigned long long)last, (unsigned long long)len[k]);
  }

  strided_job job;
  memset(&job, 0, sizeof job);
  job.op = op;
  job.n_in = n_in;
  job.out = out;
  job.vec = tp_vec_for(ctx);
  for (int k = 0; k < n_in; k++) job.in[k] = in[k];
  /* drop size-1 dimensions, merge dimension d into d+1 where every operand is contiguous across them */
  int r = 0;
  for (int d = 0; d < rank; d++) {
    if (shape[d] == 1) continue;
    if (r > 0) {
      int merge = 1;
      for (int k = 0; k < n_in; k++)
        if (job.st[k][r - 1] != strides[k][d] * shape[d]) merge = 0;
      if (merge) {
        job.shape[r - 1] *= shape[d];
        for (int k = 0; k < n_in; k++) job.st[k][r - 1] = strides[k][d];
        continue;
      }
    }
    job.shape[r] = shape[d];
    for (int k = 0; k < n_in; k++) job.st[k][r] = strides[k][d];
    r++;
  }
  if (r == 0) { /* a single element */
    job.shape[0] = 1;
    r = 1;
  }
  job.rank = r;
  job.inner = (uint64_t)job.shape[r - 1];
  job.rows = numel / job.inner;
  const int64_t tasks = job.rows < 2 ? 1 : tp_task_count(ctx, numel, EW_MIN_TASK, 4);
  tp_run_tasks(ctx, tasks > (int64_t)job.rows ? (int64_t)job.rows : tasks, strided_task, &job);
  return TP_OK;
}

static tp_status binary_entry(tp_ctx *ctx, const char *name, int op, const float *a, uint64_t a_len,
                              const int64_t *a_strides, const float *b, uint64_t b_len, const int64_t *b_strides,
                              float *out, const int64_t *shape, int32_t rank) {
  const float *in[2] = {a, b};
  const uint64_t len[2] = {a_len, b_len};
  const int64_t *st[2] = {a_strides, b_strides};
  return run_strided(ctx, name, op, 2, in, len, st, out, shape, rank);
}

tp_status tp_cpu_add_f32(tp_ctx *ctx, const float *a, uint64_t a_len, const int64_t *a_strides, const float *b,
                         uint64_t b_len, const int64_t *b_strides, float *out, const int64_t *shape, int32_t rank) {
  return binary_entry(ctx, "tp_cpu_add_f32", TP_BIN_ADD, a, a_len, a_strides, b, b_len, b_strides, out, shape, rank);
}

tp_status tp_cpu_sub_f32(tp_ctx *ctx, const float *a, uint64_t a_len, const int64_t *a_strides, const float *b,
                         uint64_t b_len, const int64_t *b_strides, float *out, const int64_t *shape, int32_t rank) {
  return binary_entry(ctx, "tp_cpu_sub_f32", TP_BIN_SUB, a, a_len, a_strides, b, b_len, b_strides, out, shape, rank);
}

tp_status tp_cpu_mul_f32(tp_ctx *ctx, const float *a, uint64_t a_len, const int64_t *a_strides, const float *b,
                         uint64_t b_len, const int64_t *b_strides, float *out, const int64_t *shape, int32_t rank) {
  return binary_entry(ctx, "tp_cpu_mul_f32", TP_BIN_MUL, a, a_len, a_strides, b, b_len, b_strides, out, shape, rank);
}

tp_status tp_cpu_modulate_f32(tp_ctx *ctx, const float *x, uint64_t x_len, const int64_t *x_strides,
                              const float *scale, uint64_t scale_len, const int64_t *scale_strides,
                              const float *shift, uint64_t shift_len, const int64_t *shift_strides, float *out,
                              const int64_t *shape, int32_t rank) {
  const float *in[3] = {x, scale, shift};
  const uint64_t len[3] = {x_len, scale_len, shift_len};
  const int64_t *st[3] = {x_strides, scale_strides, shift_strides};
  return run_strided(ctx, "tp_cpu_modulate_f32", -1, 3, in, len, st, out, shape, rank);
}
