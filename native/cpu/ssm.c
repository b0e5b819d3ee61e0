/*
 * The state-space / linear-attention kernels of Qwen 3.5 / 3.6 (Gated DeltaNet layers) on f32:
 *
 *   softplus         y = log(1 + e^x)  (x > 20: y = x, as ggml's softplus)
 *   ssm_conv         depthwise causal conv over time: out[t][c] = Σ_j w[c][j] · x[t + j][c], x holding the
 *                    K − 1 previous inputs before the T new ones (ggml_ssm_conv; no bias, no activation)
 *   gated_delta_net  the gated delta rule (Yang et al. 2024, "Gated Delta Networks", eq. 10), per value
 *                    head j with key head i = j mod Hk and state S_j [Dk][Dv] updated in place:
 *                      S ← e^{g_t} S;  δ = β_t (v_t − Sᵀk_t);  S ← S + k_t δᵀ;  o_t = scale · Sᵀq_t
 *
 * gated_delta_net runs the recurrence token by token (chunk 0: the decode form, and llama.cpp's CPU
 * form) or chunk by chunk (chunk C > 0: the prefill form). Within a chunk of L tokens, with
 * γ_t = exp(Σ_{s≤t} g_s) and S_0 the state entering the chunk, the recurrence unrolls to
 *   δ_t + Σ_{s<t} β_t (γ_t/γ_s)(k_t·k_s) δ_s = β_t v_t − β_t γ_t S_0ᵀk_t        (solved by forward substitution)
 *   o_t = scale · (γ_t S_0ᵀq_t + Σ_{s≤t} (γ_t/γ_s)(q_t·k_s) δ_s)
 *   S_L = γ_L S_0 + Σ_s (γ_L/γ_s) k_s δ_sᵀ
 * the same function (HF transformers `torch_chunk_gated_delta_rule` vs `torch_recurrent_gated_delta_rule`
 * of modeling_qwen3_5.py); products with the state are matrix products of L rows, and the chunk is
 * computed in f64 (γ_t/γ_s ≤ 1 since g ≤ 0 in the models, so nothing overflows). Value heads are split
 * over threads; each head's tokens stay in order.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

/* ---- softplus ------------------------------------------------------------------------------------ */

typedef struct softplus_job {
  const float *x;
  float *y;
  uint64_t n;
} softplus_job;

static void softplus_task(void *arg, int64_t task, int64_t n_tasks) {
  const softplus_job *j = arg;
  const uint64_t i0 = (uint64_t)task * j->n / (uint64_t)n_tasks;
  const uint64_t i1 = (uint64_t)(task + 1) * j->n / (uint64_t)n_tasks;
  for (uint64_t i = i0; i < i1; i++) {
    const double x = j->x[i];
    j->y[i] = x > 20.0 ? (float)x : (float)log1p(exp(x));
  }
}

tp_status tp_cpu_softplus_f32(tp_ctx *ctx, const float *x, float *y, uint64_t n) {
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  if (n == 0) return TP_OK;
  if (x == NULL || y == NULL) return tp_op_error(ctx, TP_ERR_ARG, "tp_cpu_softplus_f32: a NULL buffer");
  softplus_job job = {x, y, n};
  tp_run_tasks(ctx, tp_task_count(ctx, n, 1 << 14, 1), softplus_task, &job);
  return TP_OK;
}

/* ---- ssm_conv ------------------------------------------------------------------------------------ */

typedef struct conv_job {
  const float *x, *w;
  float *y;
  uint64_t t_out, channels, taps;
} conv_job;

static void ssm_conv_task(void *arg, int64_t task, int64_t n_tasks) {
  const conv_job *j = arg;
  const uint64_t t0 = (uint64_t)task * j->t_out / (uint64_t)n_tasks;
  const uint64_t t1 = (uint64_t)(task + 1) * j->t_out / (uint64_t)n_tasks;
  const uint64_t C = j->channels, K = j->taps;
  for (uint64_t t = t0; t < t1; t++) {
    float *y = j->y + t * C;
    for (uint64_t c = 0; c < C; c++) {
      const float *w = j->w + c * K;
      float s = 0;
      for (uint64_t k = 0; k < K; k++) s += w[k] * j->x[(t + k) * C + c];
      y[c] = s;
    }
  }
}

tp_status tp_cpu_ssm_conv_f32(tp_ctx *ctx, const float *x, const float *w, float *y, uint64_t t_out, uint64_t channels,
                              uint64_t taps) {
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  const char *name = "tp_cpu_ssm_conv_f32";
  uint64_t n;
  if (taps == 0) return tp_op_error(ctx, TP_ERR_ARG, "%s: the kernel has no taps", name);
  if (!tp_mul_ok(t_out + taps, channels, &n) || !tp_mul_ok(channels, taps, &n))
    return tp_op_error(ctx, TP_ERR_ARG, "%s: the shape is too large", name);
  if (t_out == 0 || channels == 0) return TP_OK;
  if (x == NULL || w == NULL || y == NULL) return tp_op_error(ctx, TP_ERR_ARG, "%s: a NULL buffer", name);
  conv_job job = {x, w, y, t_out, channels, taps};
  tp_run_tasks(ctx, tp_task_count(ctx, t_out * channels * taps, 1 << 14, 1), ssm_conv_task, &job);
  return TP_OK;
}

/* ---- gated_delta_net ----------------------------------------------------------------------------- */

typedef struct gdn_job {
  const float *q, *k, *v, *g, *beta;
  float *state, *out;
  uint64_t n, hk, hv, dk, dv, chunk;
  float scale;
  double *scratch; /* per task: `per_task` doubles */
  uint64_t per_task;
} gdn_job;

/* Token by token, in f32 (the state is f32 between tokens, as ggml keeps it). */
static void gdn_sequential(const gdn_job *j, uint64_t h, float *m) {
  const uint64_t dk = j->dk, dv = j->dv, i = h % j->hk;
  float *S = j->state + h * dk * dv;
  float *delta = m + dv, *o = m + 2 * dv;
  for (uint64_t t = 0; t < j->n; t++) {
    const float *q = j->q + (t * j->hk + i) * dk;
    const float *k = j->k + (t * j->hk + i) * dk;
    const float *v = j->v + (t * j->hv + h) * dv;
    const float decay = expf(j->g[t * j->hv + h]);
    const float b = j->beta[t * j->hv + h];
    for (uint64_t c = 0; c < dv; c++) m[c] = 0;
    for (uint64_t a = 0; a < dk; a++) {
      const float ka = k[a];
      const float *row = S + a * dv;
      for (uint64_t c = 0; c < dv; c++) m[c] += row[c] * ka;
    }
    for (uint64_t c = 0; c < dv; c++) {
      delta[c] = b * (v[c] - decay * m[c]);
      o[c] = 0;
    }
    for (uint64_t a = 0; a < dk; a++) {
      const float ka = k[a], qa = q[a];
      float *row = S + a * dv;
      for (uint64_t c = 0; c < dv; c++) {
        row[c] = decay * row[c] + ka * delta[c];
        o[c] += row[c] * qa;
      }
    }
    float *y = j->out + (t * j->hv + h) * dv;
    for (uint64_t c = 0; c < dv; c++) y[c] = j->scale * o[c];
  }
}

/* Chunk by chunk, in f64 (see the file comment for the equations). */
static void gdn_chunked(const gdn_job *j, uint64_t h, double *w) {
  const uint64_t dk = j->dk, dv = j->dv, i = h % j->hk, C = j->chunk;
  float *Sf = j->state + h * dk * dv;
  double *S = w;               /* [dk][dv] */
  double *G = S + dk * dv;     /* [C] cumulative log decay */
  double *KK = G + C;          /* [C][C] β_t (γ_t/γ_s) k_t·k_s, s < t */
  double *QK = KK + C * C;     /* [C][C] (γ_t/γ_s) q_t·k_s, s ≤ t */
  double *D = QK + C * C;      /* [C][dv] δ */
  double *O = D + C * dv;      /* [C][dv] */
  for (uint64_t e = 0; e < dk * dv; e++) S[e] = Sf[e];
  for (uint64_t t0 = 0; t0 < j->n; t0 += C) {
    const uint64_t L = j->n - t0 < C ? j->n - t0 : C;
#define Q_(t) (j->q + ((t0 + (t)) * j->hk + i) * dk)
#define K_(t) (j->k + ((t0 + (t)) * j->hk + i) * dk)
    double acc = 0;
    for (uint64_t t = 0; t < L; t++) {
      acc += j->g[(t0 + t) * j->hv + h];
      G[t] = acc;
    }
    for (uint64_t t = 0; t < L; t++) {
      const float *qt = Q_(t), *kt = K_(t);
      const double bt = j->beta[(t0 + t) * j->hv + h];
      for (uint64_t s = 0; s <= t; s++) {
        const float *ks = K_(s);
        double kk = 0, qk = 0;
        for (uint64_t a = 0; a < dk; a++) {
          kk += (double)kt[a] * ks[a];
          qk += (double)qt[a] * ks[a];
        }
        const double ratio = exp(G[t] - G[s]);
        KK[t * C + s] = bt * ratio * kk;
        QK[t * C + s] = ratio * qk;
      }
      /* rhs: β_t v_t − β_t γ_t S_0ᵀk_t;  O: γ_t S_0ᵀq_t */
      const double gt = exp(G[t]);
      double *d = D + t * dv, *o = O + t * dv;
      for (uint64_t c = 0; c < dv; c++) d[c] = o[c] = 0;
      for (uint64_t a = 0; a < dk; a++) {
        const double ka = kt[a], qa = qt[a];
        const double *row = S + a * dv;
        for (uint64_t c = 0; c < dv; c++) {
          d[c] += row[c] * ka;
          o[c] += row[c] * qa;
        }
      }
      const float *vt = j->v + ((t0 + t) * j->hv + h) * dv;
      for (uint64_t c = 0; c < dv; c++) {
        d[c] = bt * ((double)vt[c] - gt * d[c]);
        o[c] *= gt;
      }
      /* forward substitution: δ_t −= Σ_{s<t} KK[t][s] δ_s */
      for (uint64_t s = 0; s < t; s++) {
        const double f = KK[t * C + s];
        const double *ds = D + s * dv;
        for (uint64_t c = 0; c < dv; c++) d[c] -= f * ds[c];
      }
      for (uint64_t s = 0; s <= t; s++) {
        const double f = QK[t * C + s];
        const double *ds = D + s * dv;
        for (uint64_t c = 0; c < dv; c++) o[c] += f * ds[c];
      }
      float *y = j->out + ((t0 + t) * j->hv + h) * dv;
      for (uint64_t c = 0; c < dv; c++) y[c] = (float)(j->scale * o[c]);
    }
    /* S_L = γ_L S_0 + Σ_s (γ_L/γ_s) k_s δ_sᵀ */
    const double gl = exp(G[L - 1]);
    for (uint64_t e = 0; e < dk * dv; e++) S[e] *= gl;
    for (uint64_t s = 0; s < L; s++) {
      const float *ks = K_(s);
      const double r = exp(G[L - 1] - G[s]);
      const double *ds = D + s * dv;
      for (uint64_t a = 0; a < dk; a++) {
        const double f = r * ks[a];
        double *row = S + a * dv;
        for (uint64_t c = 0; c < dv; c++) row[c] += f * ds[c];
      }
    }
#undef Q_
#undef K_
  }
  for (uint64_t e = 0; e < dk * dv; e++) Sf[e] = (float)S[e];
}

static void gdn_task(void *arg, int64_t task, int64_t n_tasks) {
  const gdn_job *j = arg;
  const uint64_t h0 = (uint64_t)task * j->hv / (uint64_t)n_tasks;
  const uint64_t h1 = (uint64_t)(task + 1) * j->hv / (uint64_t)n_tasks;
  double *w = j->scratch + (uint64_t)task * j->per_task;
  for (uint64_t h = h0; h < h1; h++) {
    if (j->chunk == 0) gdn_sequential(j, h, (float *)w);
    else gdn_chunked(j, h, w);
  }
}

tp_status tp_cpu_gated_delta_net_f32(tp_ctx *ctx, const float *q, const float *k, const float *v, const float *g,
                                     const float *beta, float *state, float *out, uint64_t n_tokens, uint64_t k_heads,
                                     uint64_t v_heads, uint64_t dk, uint64_t dv, float scale, int32_t chunk) {
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  const char *name = "tp_cpu_gated_delta_net_f32";
  if (k_heads == 0 || v_heads == 0 || v_heads % k_heads != 0)
    return tp_op_error(ctx, TP_ERR_ARG, "%s: %llu value heads are not a multiple of %llu key heads", name,
                       (unsigned long long)v_heads, (unsigned long long)k_heads);
  if (chunk < 0 || chunk > 1024)
    return tp_op_error(ctx, TP_ERR_ARG, "%s: chunk %d must be in [0, 1024]", name, (int)chunk);
  uint64_t n;
  if (!tp_mul_ok(n_tokens, v_heads, &n) || !tp_mul_ok(n, dv > dk ? dv : dk, &n) || !tp_mul_ok(v_heads, dk, &n) ||
      !tp_mul_ok(n, dv, &n) || dk > (1u << 16) || dv > (1u << 16))
    return tp_op_error(ctx, TP_ERR_ARG, "%s: the shape is too large", name);
  if (n_tokens == 0 || dv == 0) return TP_OK;
  if (q == NULL || k == NULL || v == NULL || g == NULL || beta == NULL || state == NULL || out == NULL)
    return tp_op_error(ctx, TP_ERR_ARG, "%s: a NULL buffer", name);
  const uint64_t C = (uint64_t)chunk;
  const uint64_t per_task = C == 0 ? (3 * dv + 1) / 2 + 1 : dk * dv + C + 2 * C * C + 2 * C * dv;
  const int64_t n_tasks = tp_task_count(ctx, v_heads, 1, 1);
  double *scratch = malloc((size_t)(per_task * (uint64_t)n_tasks) * sizeof(double));
  if (scratch == NULL)
    return tp_op_error(ctx, TP_ERR_OOM, "%s: no memory for %llu scratch values", name,
                       (unsigned long long)(per_task * (uint64_t)n_tasks));
  gdn_job job = {q, k, v, g, beta, state, out, n_tokens, k_heads, v_heads, dk, dv, C, scale, scratch, per_task};
  tp_run_tasks(ctx, n_tasks, gdn_task, &job);
  free(scratch);
  return TP_OK;
}
