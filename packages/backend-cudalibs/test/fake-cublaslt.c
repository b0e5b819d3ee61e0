/* A stand-in libcublasLt.so for the bun:ffi test (./../src/ffi.test.ts): the entry points this package
 * declares, with cublasLt.h's prototypes written out, computing a bf16 TN GEMM with f32 output (and
 * bias) on host memory, so that the marshalling of every argument (handles, host pointers, 64-bit
 * sizes and leading dimensions, "device" addresses as integers) is checked end to end. Test code only.
 * The enum values are the ones of ../src/nvidia-h.ts. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int st_t;
typedef struct { int type; uint64_t rows, cols; int64_t ld; } layout_t;
typedef struct { int compute, scale, transa, transb; uint32_t epilogue; const float *bias; } desc_t;

static int live;
st_t cublasLtCreate(void **h) { *h = (void *)0x1234; return 0; }
st_t cublasLtDestroy(void *h) { return h == (void *)0x1234 ? 0 : 7; }
size_t cublasLtGetVersion(void) { return 130002; }
const char *cublasLtGetStatusString(st_t s) { return s == 7 ? "fake: an invalid value" : "fake: other"; }
st_t cublasLtMatmulDescCreate(desc_t **d, int compute, int scale) {
  *d = calloc(1, sizeof(desc_t)); (*d)->compute = compute; (*d)->scale = scale; live++; return 0;
}
st_t cublasLtMatmulDescDestroy(desc_t *d) { free(d); live--; return 0; }
st_t cublasLtMatmulDescSetAttribute(desc_t *d, int attr, const void *buf, size_t n) {
  if (attr == 3 && n == 4) d->transa = *(const int32_t *)buf;
  else if (attr == 4 && n == 4) d->transb = *(const int32_t *)buf;
  else if (attr == 7 && n == 4) d->epilogue = *(const uint32_t *)buf;
  else if (attr == 8 && n == 8) d->bias = *(const float *const *)buf;
  else return 7;
  return 0;
}
st_t cublasLtMatrixLayoutCreate(layout_t **l, int type, uint64_t rows, uint64_t cols, int64_t ld) {
  if (rows > (1u << 20) || ld < (int64_t)rows) return 7;
  *l = malloc(sizeof(layout_t)); (*l)->type = type; (*l)->rows = rows; (*l)->cols = cols; (*l)->ld = ld; live++;
  return 0;
}
st_t cublasLtMatrixLayoutDestroy(layout_t *l) { free(l); live--; return 0; }
st_t cublasLtMatmulPreferenceCreate(void **p) { *p = malloc(8); live++; return 0; }
st_t cublasLtMatmulPreferenceDestroy(void *p) { free(p); live--; return 0; }
st_t cublasLtMatmulPreferenceSetAttribute(void *p, int attr, const void *buf, size_t n) {
  return attr == 1 && n == 8 && *(const uint64_t *)buf == (32u << 20) ? 0 : 7;
}
typedef struct { uint64_t algo[8]; size_t workspaceSize; st_t state; float waves; int reserved[4]; } result_t;
st_t cublasLtMatmulAlgoGetHeuristic(void *h, desc_t *d, layout_t *a, layout_t *b, layout_t *c, layout_t *o,
                                    void *p, int requested, result_t *r, int *count) {
  if (requested < 1) return 7;
  memset(r, 0, sizeof *r); r->algo[0] = 0xA160; r->workspaceSize = 256; r->state = 0; *count = 1;
  return 0;
}
static float bf16(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
st_t cublasLtMatmul(void *h, desc_t *d, const float *alpha, const uint16_t *A, layout_t *la, const uint16_t *B,
                    layout_t *lb, const float *beta, float *C, layout_t *lc, float *D, layout_t *ld,
                    const result_t *algo, void *ws, size_t wsBytes, void *stream) {
  if (la->type != 14 || lb->type != 14 || ld->type != 0 || d->transa != 1 || d->transb != 0) return 15;
  if (algo->algo[0] != 0xA160 || wsBytes < 256 || stream != (void *)0x5 || C != D || *beta != 0) return 7;
  uint64_t m = la->cols, k = la->rows, n = lb->cols;
  if (lb->rows != k || ld->rows != m || ld->cols != n) return 7;
  for (uint64_t i = 0; i < m; i++)
    for (uint64_t j = 0; j < n; j++) {
      double s = 0;
      for (uint64_t l = 0; l < k; l++) s += (double)bf16(A[l + i * la->ld]) * bf16(B[l + j * lb->ld]);
      s *= *alpha;
      if (d->epilogue == 4) s += d->bias[i];
      D[i + j * ld->ld] = (float)s;
    }
  return 0;
}
int tp_fake_live(void) { return live; }
