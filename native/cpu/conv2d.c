/*
 * 2-D convolution as torch.nn.functional.conv2d computes it (cross-correlation, zero padding):
 *   y[b, co, oh, ow] = bias[co] + Σ_{ci, dy, dx} w[co, ci, dy, dx] · x[b, ci, oh·sh − ph + dy, ow·sw − pw + dx]
 * as a GEMM: Y[b] (c_out × P) = W (c_out × K) · col (K × P), K = c_in·kh·kw, P = oh·ow, where col
 * is the im2col matrix (Chellapilla et al. 2006). The weight is used as stored ([c_out, K]
 * row-major). col is never built whole (a VAE stage would need gigabytes): a task owns one batch
 * item and a chunk of CONV_NC output positions, and builds col for that chunk one block of CONV_KC
 * rows at a time, already packed in panels of nr columns ([panel][kc][nr]) for the micro-kernel.
 *
 * Loop nest per task (Goto & van de Geijn 2008, "Anatomy of high-performance matrix
 * multiplication", without the A packing): for each K block: pack col; for each panel (kept in L1):
 * for each block of mr output channels: tile = W[rows, block] · panel (micro-kernel, conv2d_*.c),
 * then y += tile (the first K block writes bias + tile).
 */
#include <stdlib.h>
#include <string.h>

#include "ops.h"

#define CONV_KC 256 /* rows of col per block: a panel of 256 × 32 f32 is 32 KiB */
#define CONV_NC 256 /* output positions per task */

typedef struct conv_job {
  const tp_conv_kernels *mk;
  const float *x, *w, *bias;
  float *y;
  uint64_t c_in, h, wd, c_out, kh, kw, oh, ow, k, p, chunks;
  int64_t sh, sw, ph, pw;
  int oom;
} conv_job;

static void conv_task(void *arg, int64_t task, int64_t n_tasks) {
  (void)n_tasks;
  conv_job *j = arg;
  const size_t mr = j->mk->mr, nr = j->mk->nr;
  const uint64_t b = (uint64_t)task / j->chunks;
  const uint64_t p0 = ((uint64_t)task % j->chunks) * CONV_NC;
  const size_t nc = (size_t)(j->p - p0 < CONV_NC ? j->p - p0 : CONV_NC);
  const size_t panels = (nc + nr - 1) / nr;

  float *packed = malloc(panels * CONV_KC * nr * sizeof(float));
  float *zeros = calloc(CONV_KC, sizeof(float));
  int64_t *pos = malloc(2 * nc * sizeof(int64_t)); /* (oh·sh − ph, ow·sw − pw) of each position */
  if (packed == NULL || zeros == NULL || pos == NULL) {
    free(packed);
    free(zeros);
    free(pos);
    __atomic_store_n(&j->oom, 1, __ATOMIC_RELAXED);
    return;
  }
  for (size_t c = 0; c < nc; c++) {
    const uint64_t q = p0 + c;
    pos[2 * c] = (int64_t)(q / j->ow) * j->sh - j->ph;
    pos[2 * c + 1] = (int64_t)(q % j->ow) * j->sw - j->pw;
  }
  const float *xb = j->x + b * j->c_in * j->h * j->wd;
  float *yb = j->y + b * j->c_out * j->p;
  float tile[TP_CONV_MR_MAX * TP_CONV_NR_MAX];
  const float *a_rows[TP_CONV_MR_MAX];

  for (uint64_t k0 = 0; k0 < j->k; k0 += CONV_KC) {
    const size_t kc = (size_t)(j->k - k0 < CONV_KC ? j->k - k0 : CONV_KC);
    /* im2col of rows [k0, k0 + kc) for this chunk, packed as [panel][kk][lane]; zero past nc */
    for (size_t kk = 0; kk < kc; kk++) {
      const uint64_t kidx = k0 + kk;
      const uint64_t ci = kidx / (j->kh * j->kw), dy = (kidx / j->kw) % j->kh, dx = kidx % j->kw;
      const float *plane = xb + ci * j->h * j->wd;
      for (size_t c = 0; c < panels * nr; c++) {
        float v = 0.0f;
        if (c < nc) {
          const int64_t ih = pos[2 * c] + (int64_t)dy, iw = pos[2 * c + 1] + (int64_t)dx;
          if (ih >= 0 && ih < (int64_t)j->h && iw >= 0 && iw < (int64_t)j->wd) v = plane[(uint64_t)ih * j->wd + (uint64_t)iw];
        }
        packed[((c / nr) * kc + kk) * nr + c % nr] = v;
      }
    }
    for (size_t pn = 0; pn < panels; pn++) {
      const float *bp = packed + pn * kc * nr;
      const size_t cols = nc - pn * nr < nr ? nc - pn * nr : nr;
      for (uint64_t m0 = 0; m0 < j->c_out; m0 += mr) {
        const size_t rows = (size_t)(j->c_out - m0 < mr ? j->c_out - m0 : mr);
        for (size_t r = 0; r < mr; r++) a_rows[r] = r < rows ? j->w + (m0 + r) * j->k + k0 : zeros;
        j->mk->tile(a_rows, bp, kc, tile);
        for (size_t r = 0; r < rows; r++) {
          float *yr = yb + (m0 + r) * j->p + p0 + pn * nr;
          const float *tr = tile + r * nr;
          if (k0 == 0) {
            const float bias = j->bias != NULL ? j->bias[m0 + r] : 0.0f;
            for (size_t c = 0; c < cols; c++) yr[c] = bias + tr[c];
          } else {
            for (size_t c = 0; c < cols; c++) yr[c] += tr[c];
          }
        }
      }
    }
  }
  free(packed);
  free(zeros);
  free(pos);
}

static const tp_conv_kernels *conv_for(const tp_ctx *ctx) {
#if TP_OPS_X86
  if (ctx->isa >= TP_ISA_AVX512) return &tp_conv_avx512;
  if (ctx->isa >= TP_ISA_AVX2) return &tp_conv_avx2;
#else
  (void)ctx;
#endif
  return &tp_conv_scalar;
}

tp_status tp_cpu_conv2d_f32(tp_ctx *ctx, const float *x, const float *weight, const float *bias, float *y,
                            uint64_t batch, uint64_t c_in, uint64_t h, uint64_t w, uint64_t c_out, uint64_t kh,
                            uint64_t kw, int32_t stride_h, int32_t stride_w, int32_t pad_h, int32_t pad_w) {
  if (ctx == NULL) return TP_ERR_ARG;
  ctx->error[0] = '\0';
  const char *name = "tp_cpu_conv2d_f32";
  if (stride_h < 1 || stride_w < 1 || pad_h < 0 || pad_w < 0)
    return tp_op_error(ctx, TP_ERR_ARG, "%s: stride (%d, %d) must be >= 1 and padding (%d, %d) >= 0", name,
                       (int)stride_h, (int)stride_w, (int)pad_h, (int)pad_w);
  if (kh == 0 || kw == 0 || kh > h + 2 * (uint64_t)pad_h || kw > w + 2 * (uint64_t)pad_w)
    return tp_op_error(ctx, TP_ERR_ARG, "%s: kernel %llux%llu does not fit the padded input %llux%llu", name,
                       (unsigned long long)kh, (unsigned long long)kw, (unsigned long long)(h + 2 * (uint64_t)pad_h),
                       (unsigned long long)(w + 2 * (uint64_t)pad_w));
  const uint64_t oh = (h + 2 * (uint64_t)pad_h - kh) / (uint64_t)stride_h + 1;
  const uint64_t ow = (w + 2 * (uint64_t)pad_w - kw) / (uint64_t)stride_w + 1;
  uint64_t k, p, nx, ny, tasks;
  if (!tp_mul_ok(c_in, kh, &k) || !tp_mul_ok(k, kw, &k) || !tp_mul_ok(oh, ow, &p) || !tp_mul_ok(batch, c_in, &nx) ||
      !tp_mul_ok(nx, h, &nx) || !tp_mul_ok(nx, w, &nx) || !tp_mul_ok(batch, c_out, &ny) || !tp_mul_ok(ny, p, &ny) ||
      h > INT32_MAX || w > INT32_MAX)
    return tp_op_error(ctx, TP_ERR_ARG, "%s: the shapes are too large", name);
  if (ny == 0) return TP_OK;
  if (x == NULL || weight == NULL || y == NULL) return tp_op_error(ctx, TP_ERR_ARG, "%s: a NULL buffer", name);
  if (k == 0) { /* no input channels: y = bias */
    for (uint64_t i = 0; i < ny; i++) y[i] = bias != NULL ? bias[(i / p) % c_out] : 0.0f;
    return TP_OK;
  }
  conv_job job = {.mk = conv_for(ctx), .x = x, .w = weight, .bias = bias, .y = y, .c_in = c_in, .h = h, .wd = w,
                  .c_out = c_out, .kh = kh, .kw = kw, .oh = oh, .ow = ow, .k = k, .p = p,
                  .chunks = (p + CONV_NC - 1) / CONV_NC, .sh = stride_h, .sw = stride_w, .ph = pad_h, .pw = pad_w,
                  .oom = 0};
  tasks = batch * job.chunks;
  tp_run_tasks(ctx, (int64_t)tasks, conv_task, &job);
  if (job.oom) return tp_op_error(ctx, TP_ERR_OOM, "%s: no memory for a task's im2col block", name);
  return TP_OK;
}

/* ---- scalar micro-kernel: 4 × 16 (the compiler vectorises the inner loop with SSE2) ---------------- */

static void tile_scalar(const float *const *a_rows, const float *bp, size_t kc, float *tile) {
  enum { MR = 4, NR = 16 };
  float acc[MR][NR] = {{0}};
  for (size_t k = 0; k < kc; k++) {
    const float *b = bp + k * NR;
    for (int r = 0; r < MR; r++) {
      const float a = a_rows[r][k];
      for (int c = 0; c < NR; c++) acc[r][c] += a * b[c];
    }
  }
  memcpy(tile, acc, sizeof acc);
}

const tp_conv_kernels tp_conv_scalar = {.mr = 4, .nr = 16, .tile = tile_scalar};
