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
 * Tasks are b × kv_heads × tiles (× key splits); with a causal mask later tiles cost more, so tasks
 * are visited in a strided order (a stride coprime with their count) to spread cheap and dear ones
 * over threads.
 *
 * Layouts: q, k, v and out are read and written through element strides for batch, head and row
 * (the last dimension has unit stride), so a KV cache [capacity, kv_heads, head_dim] sliced to
 * [1, kv_heads, len, head_dim] by a permute is read in place, with no copy per token.
 *
 * Decoding (few rows per task): S is computed from the K rows in place (micro-kernel `scores_rows`,
 * one dot product per key) instead of transposing the block, and V rows are read in place when
 * head_dim_v is a multiple of TP_ATTN_DV_ALIGN. When (batch × kv_heads × tiles) gives the threads too
 * few tasks, the keys are split into chunks of whole blocks (flash-decoding, Dao et al. 2023,
 * "Flash-Decoding for long-context inference"): each chunk keeps its own m, l and o, and the chunks
 * are merged at the end with the same rescaling (m = max m_c, l = Σ l_c·e^(m_c − m), o likewise).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

/* Rows (query × head) per tile, before rounding up to whole groups. */
#define ATTN_TILE_ROWS 64
/* Rows per task up to which S comes from K in place (scores_rows) rather than a transposed block. */
#define ATTN_DIRECT_ROWS 8
/* Key splits: at least this many keys per chunk, and enough chunks for 2 tasks per thread. */
#define ATTN_SPLIT_MIN_KEYS 512
#define ATTN_TASKS_PER_THREAD 2

typedef struct attn_job {
  const tp_vec_kernels *vec;
  const tp_attn_kernels *mk;
  const float *q, *k, *v;
  float *out;
  /* element strides of batch, head and row: q, k, v, out */
  uint64_t qs[3], ks[3], vs[3], os[3];
  uint64_t heads, kv_heads, sq, skv, d, dv;
  uint64_t group, tile_q, tiles, splits, split_keys, n_tasks, stride;
  float scale, softcap;
  int64_t q_offset, window, full_prefix;
  int causal;
  int oom;
  /* splits > 1: per (batch · heads · sq row, split) the unnormalised o [dv], m and l */
  float *part_o, *part_m;
  double *part_l;
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
  const uint64_t split = u % j->splits;
  const uint64_t tile = (u / j->splits) % j->tiles;
  const uint64_t kvh = (u / j->splits / j->tiles) % j->kv_heads;
  const uint64_t b = u / j->splits / j->tiles / j->kv_heads;
  const uint64_t i0 = tile * j->tile_q;
  const uint64_t nq = j->sq - i0 < j->tile_q ? j->sq - i0 : j->tile_q;
  const size_t d = (size_t)j->d, dv = (size_t)j->dv;
  const size_t rows = (size_t)(j->group * nq), rp = round_up(rows, TP_ATTN_MR);
  const size_t dvp = round_up(dv, TP_ATTN_DV_ALIGN), bk = TP_ATTN_BK;
  const int direct = rows <= ATTN_DIRECT_ROWS;      /* S from K rows in place */
  const int v_in_place = dvp == dv;                  /* pv reads V rows through their stride */
  const uint64_t kbeg = split * j->split_keys;
  const uint64_t kend = kbeg + j->split_keys < j->skv ? kbeg + j->split_keys : j->skv;

  const size_t floats = rp * d + (direct ? 0 : d * bk) + (v_in_place ? 0 : bk * dvp) + rp * bk + rp * dvp + rp;
  float *mem = calloc(floats, sizeof(float));
  double *l = calloc(rp, sizeof(double));
  if (mem == NULL || l == NULL) {
    free(mem);
    free(l);
    __atomic_store_n(&j->oom, 1, __ATOMIC_RELAXED);
    return;
  }
  float *qs = mem, *kt = qs + rp * d, *vb = kt + (direct ? 0 : d * bk), *s = vb + (v_in_place ? 0 : bk * dvp);
  float *o = s + rp * bk, *m = o + rp * dvp;

  /* row r = g · nq + i: query i0 + i of head kvh · group + g, scaled once */
  for (size_t r = 0; r < rows; r++) {
    const uint64_t h = kvh * j->group + r / nq, i = i0 + r % nq;
    j->vec->scale(j->q + b * j->qs[0] + h * j->qs[1] + i * j->qs[2], qs + r * d, d, j->scale);
    m[r] = -INFINITY;
  }

  /* keys any row can see: the prefix, and with causal [p_min − window + 1, p_max] */
  const int64_t p_min = j->q_offset + (int64_t)i0, p_max = p_min + (int64_t)nq - 1;
  int64_t lo = 0, hi = (int64_t)j->skv - 1;
  if (j->causal) {
    if (j->window > 0 && p_min - j->window + 1 > lo) lo = p_min - j->window + 1;
    if (p_max < hi) hi = p_max;
  }
  const float *kbase = j->k + b * j->ks[0] + kvh * j->ks[1];
  const float *vbase = j->v + b * j->vs[0] + kvh * j->vs[1];
  const size_t krs = (size_t)j->ks[2], vrs = (size_t)j->vs[2];

  for (uint64_t j0 = kbeg; j0 < kend; j0 += bk) {
    const size_t nk = kend - j0 < bk ? (size_t)(kend - j0) : bk;
    const int64_t first = (int64_t)j0, last = (int64_t)j0 + (int64_t)nk - 1;
    if (first >= j->full_prefix && (last < lo || first > hi)) continue;

    const float *kblk = kbase + j0 * krs, *vblk = vbase + j0 * vrs;
    if (direct) {
      j->mk->scores_rows(qs, kblk, krs, s, rows, nk, d);
    } else {
      for (size_t jj = 0; jj < nk; jj++) {
        const float *kr = kblk + jj * krs;
        for (size_t t = 0; t < d; t++) kt[t * bk + jj] = kr[t];
      }
      /* the last block: zero what the micro-kernel reads past the keys */
      if (nk < bk)
        for (size_t t = 0; t < d; t++) memset(kt + t * bk + nk, 0, (bk - nk) * sizeof(float));
      j->mk->scores(qs, kt, s, rp, d);
    }
    if (!v_in_place) {
      for (size_t jj = 0; jj < nk; jj++) {
        memcpy(vb + jj * dvp, vblk + jj * vrs, dv * sizeof(float));
        memset(vb + jj * dvp + dv, 0, (dvp - dv) * sizeof(float));
      }
    }

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
    if (v_in_place) j->mk->pv(s, vblk, vrs, o, rp, nk, dvp);
    else j->mk->pv(s, vb, dvp, o, rp, nk, dvp);
  }

  for (size_t r = 0; r < rows; r++) {
    const uint64_t h = kvh * j->group + r / nq, i = i0 + r % nq;
    if (j->splits > 1) { /* a partial result: merged by merge_splits */
      const size_t at = (size_t)(((b * j->heads + h) * j->sq + i) * j->splits + split);
      memcpy(j->part_o + at * dv, o + r * dvp, dv * sizeof(float));
      j->part_m[at] = m[r];
      j->part_l[at] = l[r];
      continue;
    }
    float *dst = j->out + b * j->os[0] + h * j->os[1] + i * j->os[2];
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

/* Splits > 1: out row = Σ_c o_c·e^(m_c − M) / Σ_c l_c·e^(m_c − M), M = max_c m_c (tasks: rows of batch · heads). */
static void merge_task(void *arg, int64_t task, int64_t n_tasks) {
  (void)n_tasks;
  const attn_job *j = arg;
  const uint64_t bh = (uint64_t)task, b = bh / j->heads, h = bh % j->heads;
  const size_t dv = (size_t)j->dv, ns = (size_t)j->splits;
  for (uint64_t i = 0; i < j->sq; i++) {
    const size_t at = (size_t)((bh * j->sq + i) * ns);
    float *dst = j->out + b * j->os[0] + h * j->os[1] + i * j->os[2];
    float mx = -INFINITY;
    int nan = 0;
    for (size_t c = 0; c < ns; c++) {
      const float mc = j->part_m[at + c];
      if (mc != mc || j->part_l[at + c] != j->part_l[at + c]) nan = 1;
      else if (mc > mx) mx = mc;
    }
    double lsum = 0;
    memset(dst, 0, dv * sizeof(float));
    if (!nan && mx != -INFINITY) {
      for (size_t c = 0; c < ns; c++) {
        if (!(j->part_l[at + c] > 0)) continue; /* a chunk that saw no key */
        const float w = expf(j->part_m[at + c] - mx);
        lsum += j->part_l[at + c] * w;
        const float *oc = j->part_o + (at + c) * dv;
        for (size_t t = 0; t < dv; t++) dst[t] += oc[t] * w;
      }
    }
    if (nan)
      for (size_t t = 0; t < dv; t++) dst[t] = NAN;
    else if (lsum > 0)
      j->vec->scale(dst, dst, dv, (float)(1.0 / lsum));
    else
      memset(dst, 0, dv * sizeof(float));
  }
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

/*
 * 1 + the index of the farthest element a view [n0, n1, n2, last] (all ≥ 1) with strides [s0, s1, s2, 1]
 * reaches, in *far; 0 when that overflows 2^62.
 */
static int farthest(uint64_t n0, uint64_t n1, uint64_t n2, uint64_t last, const uint64_t s[3], uint64_t *far) {
  uint64_t a, b, c;
  if (!tp_mul_ok(n0 - 1, s[0], &a) || !tp_mul_ok(n1 - 1, s[1], &b) || !tp_mul_ok(n2 - 1, s[2], &c)) return 0;
  const uint64_t limit = (uint64_t)1 << 62;
  if (a > limit || b > limit || c > limit || last > limit) return 0;
  *far = a + b + c + last; /* < 2^64 */
  return *far <= limit;
}

/*
 * True when no two elements of a view [n0, n1, n2, last] with strides [s0, s1, s2, 1] share an address:
 * with the dimensions of size > 1 sorted by stride, each stride passes the span of the ones inside it.
 */
static int one_to_one(uint64_t n0, uint64_t n1, uint64_t n2, uint64_t last, const uint64_t s[3]) {
  uint64_t n[4] = {last, n0, n1, n2}, st[4] = {1, s[0], s[1], s[2]};
  for (int a = 1; a < 4; a++) /* insertion sort by stride */
    for (int c = a; c > 0 && st[c] < st[c - 1]; c--) {
      uint64_t t = st[c];
      st[c] = st[c - 1];
      st[c - 1] = t;
      t = n[c];
      n[c] = n[c - 1];
      n[c - 1] = t;
    }
  uint64_t span = 0; /* farthest offset of the dimensions so far */
  for (int a = 0; a < 4; a++) {
    if (n[a] <= 1) continue;
    if (st[a] <= span) return 0;
    span += (n[a] - 1) * st[a];
  }
  return 1;
}

static int overlap(const float *a, uint64_t an, const float *b, uint64_t bn) {
  const uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
  return a0 < b0 + bn * sizeof(float) && b0 < a0 + an * sizeof(float);
}

tp_status tp_cpu_attention_strided_f32(tp_ctx *ctx, const float *q, const float *k, const float *v, float *out,
                                       const uint64_t lens[4], const int64_t strides[12], uint64_t batch,
                                       uint64_t heads, uint64_t kv_heads, uint64_t sq, uint64_t skv,
                                       uint64_t head_dim, uint64_t head_dim_v, float scale, int64_t q_offset,
                                       int32_t causal, int64_t window, int64_t full_prefix, float softcap) {
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
  if (lens == NULL || strides == NULL) return tp_op_error(ctx, TP_ERR_ARG, "%s: lens or strides is NULL", name);
  uint64_t n, nk, nv, no;
  if (!tp_mul_ok(batch, heads, &n) || !tp_mul_ok(n, sq, &n) || !tp_mul_ok(n, head_dim, &n) ||
      !tp_mul_ok(batch, kv_heads, &nk) || !tp_mul_ok(nk, skv, &nk) || !tp_mul_ok(nk, head_dim_v, &nv) ||
      !tp_mul_ok(nk, head_dim, &nk) || !tp_mul_ok(batch * heads, sq, &no) || !tp_mul_ok(no, head_dim_v, &no) ||
      head_dim > (1u << 20) || head_dim_v > (1u << 20))
    return tp_op_error(ctx, TP_ERR_ARG, "%s: the shapes are too large", name);
  uint64_t st[12];
  for (int i = 0; i < 12; i++) {
    if (strides[i] < 0 || strides[i] > ((int64_t)1 << 40))
      return tp_op_error(ctx, TP_ERR_ARG, "%s: stride %d = %lld is outside [0, 2^40]", name, i, (long long)strides[i]);
    st[i] = (uint64_t)strides[i];
  }
  if (no == 0) return TP_OK;
  if (q == NULL || out == NULL || (skv > 0 && (k == NULL || v == NULL)))
    return tp_op_error(ctx, TP_ERR_ARG, "%s: a NULL buffer", name);
  /* every view inside what its pointer holds */
  uint64_t fq = 0, fk = 0, fv = 0, fo = 0;
  if ((n > 0 && !farthest(batch, heads, sq, head_dim, st, &fq)) ||
      (nk > 0 && !farthest(batch, kv_heads, skv, head_dim, st + 3, &fk)) ||
      (nv > 0 && !farthest(batch, kv_heads, skv, head_dim_v, st + 6, &fv)) ||
      !farthest(batch, heads, sq, head_dim_v, st + 9, &fo))
    return tp_op_error(ctx, TP_ERR_ARG, "%s: the strides reach too far", name);
  if (fq > lens[0] || fk > lens[1] || fv > lens[2] || fo > lens[3])
    return tp_op_error(ctx, TP_ERR_ARG, "%s: a view reaches past its buffer (q %llu/%llu, k %llu/%llu, v %llu/%llu, out %llu/%llu elements)",
                       name, (unsigned long long)fq, (unsigned long long)lens[0], (unsigned long long)fk,
                       (unsigned long long)lens[1], (unsigned long long)fv, (unsigned long long)lens[2],
                       (unsigned long long)fo, (unsigned long long)lens[3]);
  if (!one_to_one(batch, heads, sq, head_dim_v, st + 9))
    return tp_op_error(ctx, TP_ERR_ARG, "%s: the out strides map two elements to one address", name);
  if (overlap(out, fo, q, fq) || (skv > 0 && (overlap(out, fo, k, fk) || overlap(out, fo, v, fv))))
    return tp_op_error(ctx, TP_ERR_ARG, "%s: out overlaps q, k or v", name);
  if (skv == 0) { /* no keys: every query sees nothing */
    for (uint64_t b = 0; b < batch; b++)
      for (uint64_t h = 0; h < heads; h++)
        for (uint64_t i = 0; i < sq; i++)
          memset(out + b * st[9] + h * st[10] + i * st[11], 0, (size_t)head_dim_v * sizeof(float));
    return TP_OK;
  }

  attn_job job = {.vec = tp_vec_for(ctx), .mk = attn_for(ctx), .q = q, .k = k, .v = v, .out = out, .heads = heads,
                  .kv_heads = kv_heads, .sq = sq, .skv = skv, .d = head_dim, .dv = head_dim_v,
                  .group = heads / kv_heads, .scale = scale, .softcap = softcap, .q_offset = q_offset,
                  .window = window, .full_prefix = full_prefix, .causal = causal, .oom = 0};
  memcpy(job.qs, st, sizeof job.qs);
  memcpy(job.ks, st + 3, sizeof job.ks);
  memcpy(job.vs, st + 6, sizeof job.vs);
  memcpy(job.os, st + 9, sizeof job.os);
  job.tile_q = job.group >= ATTN_TILE_ROWS ? 1 : ATTN_TILE_ROWS / job.group;
  job.tiles = (sq + job.tile_q - 1) / job.tile_q;
  /* too few tasks for the threads (decoding with few kv heads): split the keys into chunks of whole blocks */
  const uint64_t base = batch * kv_heads * job.tiles, want = (uint64_t)ctx->n_threads * ATTN_TASKS_PER_THREAD;
  job.splits = 1;
  job.split_keys = skv;
  if (ctx->n_threads > 1 && base < want && skv >= 2 * ATTN_SPLIT_MIN_KEYS) {
    uint64_t splits = (want + base - 1) / base;
    if (splits > skv / ATTN_SPLIT_MIN_KEYS) splits = skv / ATTN_SPLIT_MIN_KEYS;
    job.split_keys = round_up((size_t)((skv + splits - 1) / splits), TP_ATTN_BK);
    job.splits = (skv + job.split_keys - 1) / job.split_keys;
  }
  job.n_tasks = base * job.splits;
  job.stride = 1;
  if (causal && job.n_tasks > 2) {
    job.stride = job.n_tasks * 618 / 1000;
    while (gcd(job.stride, job.n_tasks) != 1) job.stride++;
  }
  void *parts = NULL;
  if (job.splits > 1) {
    const size_t cells = (size_t)(batch * heads * sq * job.splits);
    parts = malloc(cells * ((size_t)head_dim_v * sizeof(float) + sizeof(float) + sizeof(double)));
    if (parts == NULL) return tp_op_error(ctx, TP_ERR_OOM, "%s: no memory for the key splits' partial results", name);
    job.part_l = parts;
    job.part_m = (float *)(job.part_l + cells);
    job.part_o = job.part_m + cells;
  }
  tp_run_tasks(ctx, (int64_t)job.n_tasks, attn_task, &job);
  if (!job.oom && job.splits > 1) tp_run_tasks(ctx, (int64_t)(batch * heads), merge_task, &job);
  free(parts);
  if (job.oom) return tp_op_error(ctx, TP_ERR_OOM, "%s: no memory for a tile's scratch", name);
  return TP_OK;
}

tp_status tp_cpu_attention_f32(tp_ctx *ctx, const float *q, const float *k, const float *v, float *out,
                               uint64_t batch, uint64_t heads, uint64_t kv_heads, uint64_t sq, uint64_t skv,
                               uint64_t head_dim, uint64_t head_dim_v, float scale, int64_t q_offset, int32_t causal,
                               int64_t window, int64_t full_prefix, float softcap) {
  if (ctx == NULL) return TP_ERR_ARG;
  /*
   * contiguous [batch, heads, seq, dim]: lens of exactly the views; a product that wraps makes a
   * stride or len the strided entry refuses (its own size checks come first)
   */
  const uint64_t lens[4] = {batch * heads * sq * head_dim, batch * kv_heads * skv * head_dim,
                            batch * kv_heads * skv * head_dim_v, batch * heads * sq * head_dim_v};
  const int64_t strides[12] = {
      (int64_t)(heads * sq * head_dim),      (int64_t)(sq * head_dim),  (int64_t)head_dim,
      (int64_t)(kv_heads * skv * head_dim),  (int64_t)(skv * head_dim), (int64_t)head_dim,
      (int64_t)(kv_heads * skv * head_dim_v), (int64_t)(skv * head_dim_v), (int64_t)head_dim_v,
      (int64_t)(heads * sq * head_dim_v),    (int64_t)(sq * head_dim_v), (int64_t)head_dim_v};
  return tp_cpu_attention_strided_f32(ctx, q, k, v, out, lens, strides, batch, heads, kv_heads, sq, skv, head_dim,
                                      head_dim_v, scale, q_offset, causal, window, full_prefix, softcap);
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

static void scores_rows_scalar(const float *q, const float *k, size_t ks, float *s, size_t rows, size_t nk, size_t d) {
  for (size_t r = 0; r < rows; r++)
    for (size_t c = 0; c < nk; c++) {
      float acc = 0.0f;
      for (size_t t = 0; t < d; t++) acc += q[r * d + t] * k[c * ks + t];
      s[r * TP_ATTN_BK + c] = acc;
    }
}

static void pv_scalar(const float *p, const float *v, size_t vs, float *o, size_t rows, size_t nk, size_t dvp) {
  for (size_t r = 0; r < rows; r++) {
    float *orow = o + r * dvp;
    for (size_t jj = 0; jj < nk; jj++) {
      const float pj = p[r * TP_ATTN_BK + jj];
      const float *vr = v + jj * vs;
      for (size_t c = 0; c < dvp; c++) orow[c] += pj * vr[c];
    }
  }
}

const tp_attn_kernels tp_attn_scalar = {.scores = scores_scalar, .scores_rows = scores_rows_scalar, .pv = pv_scalar};
