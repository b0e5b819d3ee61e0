/*
 * Scaled dot-product attention with grouped-query heads, tiled with an online softmax
 * (FlashAttention: Dao et al. 2022, arXiv:2205.14135, Algorithm 1; the running-max rescaling of
 * Milakov & Gimelshein 2018, arXiv:1805.02867). Memory is O(tile) per task, never O(seq²).
 *
 * A task owns one (batch, kv head, query tile). Its rows are the queries of the tile for every
 * query head of the kv head's group (GQA: Ainslie et al. 2023; query head h uses kv head
 * h / group), so a K/V block is loaded once for the whole group — during decoding (one query) the
 * tile is the group's heads. For each block of TP_ATTN_BK keys:
 *   1. kt = the block of K transposed to [d][BK] (zero columns past the last key), vb = the block of
 *      V with rows padded to a multiple of TP_ATTN_DV_ALIGN columns;
 *   2. S = (q · scale) · kt (micro-kernel `scores`);
 *   3. per row: softcap, the mask (−inf), block max, m_new = max(m, block max),
 *      P = exp(S − m_new), l = l · e^(m − m_new) + ΣP, o = o · e^(m − m_new);
 *   4. o += P · vb (micro-kernel `pv`).
 * At the end out = o / l (zeros for a row that saw no key). Key j is visible to the query at position
 * p when j < full_prefix, or without causal, or when j <= p and (window == 0 or j > p − window).
 * Blocks no row of the tile can see are skipped.
 *
 * Tasks are b × kv_heads × tiles; with a causal mask later tiles cost more, so tasks are visited in
 * a strided order (a stride coprime with their count) to spread cheap and dear ones over threads.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

/* Rows (query × head) per tile, before rounding up to whole groups. */
#define ATTN_TILE_ROWS 64

typedef struct attn_job {
  const tp_vec_kernels *vec;
  const tp_attn_kernels *mk;
  const float *q, *k, *v;
  float *out;
  uint64_t heads, kv_heads, sq, skv, d, dv;
  uint64_t group, tile_q, tiles, n_tasks, stride;
  float scale, softcap;
  int64_t q_offset, window, full_prefix;
  int causal;
  int oom;
} attn_job;

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

static int visible(const attn_job *j, int64_t p, int64_t key) {
  if (key < j->full_prefix || !j->causal) return 1;
  return key <= p && (j->window == 0 || key > p - j->window);
}

static void attn_task(void *arg, int64_t task, int64_t n_tasks) {
  (void)n_tasks;
  attn_job *j = arg;
  const uint64_t u = ((uint64_t)task * j->stride) % j->n_tasks;
  const uint64_t tile = u % j->tiles;
  const uint64_t kvh = (u / j->tiles) % j->kv_heads;
  const uint64_t b = u / j->tiles / j->kv_heads;
  const uint64_t i0 = tile * j->tile_q;
  const uint64_t nq = j->sq - i0 < j->tile_q ? j->sq - i0 : j->tile_q;
  const size_t d = (size_t)j->d, dv = (size_t)j->dv;
  const size_t rows = (size_t)(j->group * nq), rp = round_up(rows, TP_ATTN_MR);
  const size_t dvp = round_up(dv, TP_ATTN_DV_ALIGN), bk = TP_ATTN_BK;

  const size_t floats = rp * d + d * bk + bk * dvp + rp * bk + rp * dvp + rp;
  float *mem = calloc(floats, sizeof(float));
  double *l = calloc(rp, sizeof(double));
  if (mem == NULL || l == NULL) {
    free(mem);
    free(l);
    __atomic_store_n(&j->oom, 1, __ATOMIC_RELAXED);
    return;
  }
  float *qs = mem, *kt = qs + rp * d, *vb = kt + d * bk, *s = vb + bk * dvp, *o = s + rp * bk, *m = o + rp * dvp;

  /* row r = g · nq + i: query i0 + i of head kvh · group + g, scaled once */
  for (size_t r = 0; r < rows; r++) {
    const uint64_t h = kvh * j->group + r / nq, i = i0 + r % nq;
    j->vec->scale(j->q + ((b * j->heads + h) * j->sq + i) * d, qs + r * d, d, j->scale);
    m[r] = -INFINITY;
  }

  /* keys any row can see: the prefix, and with causal [p_min − window + 1, p_max] */
  const int64_t p_min = j->q_offset + (int64_t)i0, p_max = p_min + (int64_t)nq - 1;
  int64_t lo = 0, hi = (int64_t)j->skv - 1;
  if (j->causal) {
    if (j->window > 0 && p_min - j->window + 1 > lo) lo = p_min - j->window + 1;
    if (p_max < hi) hi = p_max;
  }
  const float *kbase = j->k + (b * j->kv_heads + kvh) * j->skv * d;
  const float *vbase = j->v + (b * j->kv_heads + kvh) * j->skv * dv;

  for (uint64_t j0 = 0; j0 < j->skv; j0 += bk) {
    const size_t nk = j->skv - j0 < bk ? (size_t)(j->skv - j0) : bk;
    const int64_t first = (int64_t)j0, last = (int64_t)j0 + (int64_t)nk - 1;
    if (first >= j->full_prefix && (last < lo || first > hi)) continue;

    for (size_t jj = 0; jj < nk; jj++) {
      const float *kr = kbase + (j0 + jj) * d;
      for (size_t t = 0; t < d; t++) kt[t * bk + jj] = kr[t];
      memcpy(vb + jj * dvp, vbase + (j0 + jj) * dv, dv * sizeof(float));
    }
    if (nk < bk) { /* the last block: zero what the micro-kernels read past the keys */
      for (size_t t = 0; t < d; t++) memset(kt + t * bk + nk, 0, (bk - nk) * sizeof(float));
      memset(vb + nk * dvp, 0, (bk - nk) * dvp * sizeof(float));
    }
    j->mk->scores(qs, kt, s, rp, d);

    for (size_t r = 0; r < rows; r++) {
      float *sr = s + r * bk;
      const int64_t p = j->q_offset + (int64_t)(i0 + r % nq);
      if (j->softcap > 0) {
        j->vec->scale(sr, sr, nk, 1.0f / j->softcap);
        j->vec->tanh(sr, sr, nk);
        j->vec->scale(sr, sr, nk, j->softcap);
      }
      const int all = !j->causal || last < j->full_prefix || (last <= p && (j->window == 0 || first > p - j->window));
      if (!all)
        for (size_t jj = 0; jj < nk; jj++)
          if (!visible(j, p, first + (int64_t)jj)) sr[jj] = -INFINITY;
      const float bm = j->vec->max(sr, nk);
      if (bm == -INFINITY) { /* nothing visible in this block for this row */
        memset(sr, 0, bk * sizeof(float));
        continue;
      }
      const float m_new = (bm != bm || bm > m[r]) ? bm : m[r];
      const float corr = expf(m[r] - m_new); /* 0 on the first visible block (m = −inf) */
      const double bs = j->vec->exp_sum(sr, sr, nk, m_new);
      if (nk < bk) memset(sr + nk, 0, (bk - nk) * sizeof(float));
      l[r] = l[r] * corr + bs;
      if (corr != 1.0f) j->vec->scale(o + r * dvp, o + r * dvp, dvp, corr);
      m[r] = m_new;
    }
    for (size_t r = rows; r < rp; r++) memset(s + r * bk, 0, bk * sizeof(float)); /* padding rows */
    j->mk->pv(s, vb, o, rp, nk, dvp);
  }

  for (size_t r = 0; r < rows; r++) {
    const uint64_t h = kvh * j->group + r / nq, i = i0 + r % nq;
    float *dst = j->out + ((b * j->heads + h) * j->sq + i) * dv;
    if (l[r] > 0)
      j->vec->scale(o + r * dvp, dst, dv, (float)(1.0 / l[r]));
    else if (l[r] != l[r])
      for (size_t c = 0; c < dv; c++) dst[c] = NAN;
    else
      memset(dst, 0, dv * sizeof(float));
  }
  free(mem);
  free(l);
}

static uint64_t gcd(uint64_t a, uint64_t b) {
  while (b != 0) {
    const uint64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

static const tp_attn_kernels *attn_for(const tp_ctx *ctx) {
#if TP_OPS_X86
  if (ctx->isa >= TP_ISA_AVX512) return &tp_attn_avx512;
  if (ctx->isa >= TP_ISA_AVX2) return &tp_attn_avx2;
#else
  (void)ctx;
#endif
  return &tp_attn_scalar;
}

tp_status tp_cpu_attention_f32(tp_ctx *ctx, const float *q, const float *k, const float *v, float *out,
                               uint64_t batch, uint64_t heads, uint64_t kv_heads, uint64_t sq, uint64_t skv,
                               uint64_t head_dim, uint64_t head_dim_v, float scale, int64_t q_offset, int32_t causal,
                               int64_t window, int64_t full_prefix, float softcap) {
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  const char *name = "tp_cpu_attention_f32";
  if (kv_heads == 0 || heads % kv_heads != 0)
    return tp_op_error(ctx, TP_ERR_ARG, "%s: heads %llu is not a multiple of kv_heads %llu", name,
                       (unsigned long long)heads, (unsigned long long)kv_heads);
  if (window < 0 || full_prefix < 0 || (causal != 0 && causal != 1))
    return tp_op_error(ctx, TP_ERR_ARG, "%s: window and full_prefix must be >= 0, causal 0 or 1", name);
  if (!isfinite(scale) || !(softcap >= 0) || !isfinite(softcap))
    return tp_op_error(ctx, TP_ERR_ARG, "%s: scale must be finite and softcap >= 0", name);
  if (q_offset < -((int64_t)1 << 52) || q_offset > ((int64_t)1 << 52))
    return tp_op_error(ctx, TP_ERR_ARG, "%s: q_offset %lld is out of range", name, (long long)q_offset);
  uint64_t n, nk, nv, no;
  if (!tp_mul_ok(batch, heads, &n) || !tp_mul_ok(n, sq, &n) || !tp_mul_ok(n, head_dim, &n) ||
      !tp_mul_ok(batch, kv_heads, &nk) || !tp_mul_ok(nk, skv, &nk) || !tp_mul_ok(nk, head_dim_v, &nv) ||
      !tp_mul_ok(nk, head_dim, &nk) || !tp_mul_ok(batch * heads, sq, &no) || !tp_mul_ok(no, head_dim_v, &no) ||
      head_dim > (1u << 20) || head_dim_v > (1u << 20))
    return tp_op_error(ctx, TP_ERR_ARG, "%s: the shapes are too large", name);
  if (no == 0) return TP_OK;
  if (q == NULL || out == NULL || (skv > 0 && (k == NULL || v == NULL)))
    return tp_op_error(ctx, TP_ERR_ARG, "%s: a NULL buffer", name);
  if (skv == 0) { /* no keys: every query sees nothing */
    memset(out, 0, (size_t)no * sizeof(float));
    return TP_OK;
  }

  attn_job job = {.vec = tp_vec_for(ctx), .mk = attn_for(ctx), .q = q, .k = k, .v = v, .out = out, .heads = heads,
                  .kv_heads = kv_heads, .sq = sq, .skv = skv, .d = head_dim, .dv = head_dim_v,
                  .group = heads / kv_heads, .scale = scale, .softcap = softcap, .q_offset = q_offset,
                  .window = window, .full_prefix = full_prefix, .causal = causal, .oom = 0};
  job.tile_q = job.group >= ATTN_TILE_ROWS ? 1 : ATTN_TILE_ROWS / job.group;
  job.tiles = (sq + job.tile_q - 1) / job.tile_q;
  job.n_tasks = batch * kv_heads * job.tiles;
  job.stride = 1;
  if (causal && job.n_tasks > 2) {
    job.stride = job.n_tasks * 618 / 1000;
    while (gcd(job.stride, job.n_tasks) != 1) job.stride++;
  }
  tp_run_tasks(ctx, (int64_t)job.n_tasks, attn_task, &job);
  if (job.oom) return tp_op_error(ctx, TP_ERR_OOM, "%s: no memory for a tile's scratch", name);
  return TP_OK;
}

/* ---- scalar micro-kernels ------------------------------------------------------------------------ */

static void scores_scalar(const float *q, const float *kt, float *s, size_t rows, size_t d) {
  for (size_t r = 0; r < rows; r++) {
    float *sr = s + r * TP_ATTN_BK;
    for (size_t c = 0; c < TP_ATTN_BK; c++) sr[c] = 0.0f;
    for (size_t t = 0; t < d; t++) {
      const float qv = q[r * d + t];
      const float *kr = kt + t * TP_ATTN_BK;
      for (size_t c = 0; c < TP_ATTN_BK; c++) sr[c] += qv * kr[c];
    }
  }
}

static void pv_scalar(const float *p, const float *v, float *o, size_t rows, size_t nk, size_t dvp) {
  for (size_t r = 0; r < rows; r++) {
    float *orow = o + r * dvp;
    for (size_t jj = 0; jj < nk; jj++) {
      const float pj = p[r * TP_ATTN_BK + jj];
      const float *vr = v + jj * dvp;
      for (size_t c = 0; c < dvp; c++) orow[c] += pj * vr[c];
    }
  }
}

const tp_attn_kernels tp_attn_scalar = {.scores = scores_scalar, .pv = pv_scalar};
