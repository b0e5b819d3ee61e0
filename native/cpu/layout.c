/*
 * tp_cpu_copy: an n-dimensional strided copy of elements of 1, 2, 4 or 8 bytes, dst[i] = src[i]
 * over an index space `shape`. It materialises any view (permute, transpose, slice, broadcast) and,
 * with a strided destination, writes one input of a concat into its place. Dimensions of size 1
 * are dropped and adjacent dimensions merged where both sides are contiguous across them; rows of
 * the last dimension that are contiguous on both sides are one memcpy.
 */
#include <string.h>

#include "ops.h"

#define COPY_MIN_TASK (1u << 16) /* bytes below which a copy runs on the calling thread */

typedef struct copy_job {
  const uint8_t *src;
  uint8_t *dst;
  int64_t ss[TP_MAX_RANK], ds[TP_MAX_RANK], shape[TP_MAX_RANK];
  int rank;
  size_t eb;
  uint64_t rows, inner;
} copy_job;

static void copy_row(const copy_job *j, const uint8_t *s, uint8_t *d) {
  const int64_t si = j->ss[j->rank - 1], di = j->ds[j->rank - 1];
  const size_t n = (size_t)j->inner;
  if (si == 1 && di == 1) {
    memcpy(d, s, n * j->eb);
    return;
  }
  switch (j->eb) {
    case 1:
      for (size_t i = 0; i < n; i++) d[(int64_t)i * di] = s[(int64_t)i * si];
      break;
    case 2:
      for (size_t i = 0; i < n; i++) ((uint16_t *)d)[(int64_t)i * di] = ((const uint16_t *)s)[(int64_t)i * si];
      break;
    case 4:
      for (size_t i = 0; i < n; i++) ((uint32_t *)d)[(int64_t)i * di] = ((const uint32_t *)s)[(int64_t)i * si];
      break;
    default:
      for (size_t i = 0; i < n; i++) ((uint64_t *)d)[(int64_t)i * di] = ((const uint64_t *)s)[(int64_t)i * si];
      break;
  }
}

static void copy_task(void *arg, int64_t task, int64_t n_tasks) {
  const copy_job *j = arg;
  const uint64_t r0 = (uint64_t)task * j->rows / (uint64_t)n_tasks;
  const uint64_t r1 = (uint64_t)(task + 1) * j->rows / (uint64_t)n_tasks;
  if (r0 >= r1) return;
  const int outer = j->rank - 1;
  int64_t idx[TP_MAX_RANK];
  int64_t so = 0, dof = 0;
  uint64_t rem = r0;
  for (int d = outer - 1; d >= 0; d--) {
    idx[d] = (int64_t)(rem % (uint64_t)j->shape[d]);
    rem /= (uint64_t)j->shape[d];
    so += idx[d] * j->ss[d];
    dof += idx[d] * j->ds[d];
  }
  const int64_t eb = (int64_t)j->eb;
  for (uint64_t r = r0; r < r1; r++) {
    copy_row(j, j->src + so * eb, j->dst + dof * eb);
    for (int d = outer - 1; d >= 0; d--) {
      idx[d]++;
      so += j->ss[d];
      dof += j->ds[d];
      if (idx[d] < j->shape[d]) break;
      so -= j->ss[d] * j->shape[d];
      dof -= j->ds[d] * j->shape[d];
      idx[d] = 0;
    }
  }
}

/* Largest element offset a view reaches, or an error message. */
static int reach(const int64_t *shape, const int64_t *strides, int rank, uint64_t *last) {
  *last = 0;
  for (int d = 0; d < rank; d++) {
    if (strides[d] < 0) return 0;
    uint64_t r;
    if (!tp_mul_ok((uint64_t)(shape[d] - 1), (uint64_t)strides[d], &r) || *last + r < *last) return 0;
    *last += r;
  }
  return 1;
}

tp_status tp_cpu_copy(tp_ctx *ctx, const void *src, uint64_t src_len, const int64_t *src_strides, void *dst,
                      uint64_t dst_len, const int64_t *dst_strides, const int64_t *shape, int32_t rank,
                      int32_t elem_bytes) {
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  const char *name = "tp_cpu_copy";
  if (elem_bytes != 1 && elem_bytes != 2 && elem_bytes != 4 && elem_bytes != 8)
    return tp_op_error(ctx, TP_ERR_ARG, "%s: elem_bytes %d is not 1, 2, 4 or 8", name, (int)elem_bytes);
  if (rank < 0 || rank > TP_MAX_RANK)
    return tp_op_error(ctx, TP_ERR_ARG, "%s: rank %d is outside [0, %d]", name, (int)rank, TP_MAX_RANK);
  if (rank > 0 && (shape == NULL || src_strides == NULL || dst_strides == NULL))
    return tp_op_error(ctx, TP_ERR_ARG, "%s: shape or strides is NULL", name);
  uint64_t numel = 1;
  for (int d = 0; d < rank; d++) {
    if (shape[d] < 0) return tp_op_error(ctx, TP_ERR_ARG, "%s: shape[%d] is negative", name, d);
    if (!tp_mul_ok(numel, (uint64_t)shape[d], &numel)) return tp_op_error(ctx, TP_ERR_ARG, "%s: too many elements", name);
  }
  if (numel == 0) return TP_OK;
  if (src == NULL || dst == NULL) return tp_op_error(ctx, TP_ERR_ARG, "%s: src or dst is NULL", name);
  for (int d = 0; d < rank; d++)
    if (dst_strides[d] == 0 && shape[d] > 1)
      return tp_op_error(ctx, TP_ERR_ARG, "%s: dst_strides[%d] is 0 over %lld elements (one element written twice)",
                         name, d, (long long)shape[d]);
  uint64_t s_last, d_last;
  if (!reach(shape, src_strides, rank, &s_last) || !reach(shape, dst_strides, rank, &d_last))
    return tp_op_error(ctx, TP_ERR_ARG, "%s: a stride is negative or a view is too large", name);
  if (s_last >= src_len)
    return tp_op_error(ctx, TP_ERR_ARG, "%s: src's view reaches element %llu but only %llu are given", name,
                       (unsigned long long)s_last, (unsigned long long)src_len);
  if (d_last >= dst_len)
    return tp_op_error(ctx, TP_ERR_ARG, "%s: dst's view reaches element %llu but only %llu are given", name,
                       (unsigned long long)d_last, (unsigned long long)dst_len);

  copy_job job;
  memset(&job, 0, sizeof job);
  job.src = src;
  job.dst = dst;
  job.eb = (size_t)elem_bytes;
  int r = 0;
  for (int d = 0; d < rank; d++) {
    if (shape[d] == 1) continue;
    if (r > 0 && job.ss[r - 1] == src_strides[d] * shape[d] && job.ds[r - 1] == dst_strides[d] * shape[d]) {
      job.shape[r - 1] *= shape[d];
      job.ss[r - 1] = src_strides[d];
      job.ds[r - 1] = dst_strides[d];
      continue;
    }
    job.shape[r] = shape[d];
    job.ss[r] = src_strides[d];
    job.ds[r] = dst_strides[d];
    r++;
  }
  if (r == 0) {
    job.shape[0] = 1;
    job.ss[0] = job.ds[0] = 1;
    r = 1;
  }
  job.rank = r;
  job.inner = (uint64_t)job.shape[r - 1];
  job.rows = numel / job.inner;
  int64_t tasks = tp_task_count(ctx, numel * job.eb, COPY_MIN_TASK, 4);
  if ((uint64_t)tasks > job.rows) tasks = (int64_t)job.rows;
  tp_run_tasks(ctx, tasks, copy_task, &job);
  return TP_OK;
}
