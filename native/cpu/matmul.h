/*
 * Internal declarations of the weight-format kernels: matmul (x · Wᵀ for every weight format),
 * get_rows (embedding), row dequantization, and the activation quantizers they use.
 *
 *   matmul.c                    entry points of tp.h (argument checks, activation preparation,
 *                               the work split over the pool, dispatch on ISA level + CPU features)
 *   dequant_scalar.c            row dequantizers of every format, the reference (bit-exact with @tp/quant)
 *   dequant_avx512.c            the same for the common formats with AVX-512 (bit-exact)
 *   quantize_act.c              activation quantizers: Q8_0 / Q8_1 / Q8_K (ggml), ConvRot rotate + quantize
 *   quantize_act_avx512.c       the ConvRot rotation and quantization with AVX-512 (bit-exact)
 *   matmul_scalar.c             reference dot products of every format (one weight row · one activation row)
 *   matmul_ggml_avx2.c          GGUF block dot products, AVX2 (maddubs)
 *   matmul_ggml_avx512vnni.c    the same source with AVX-512 VNNI (vpdpbusd)        } matmul_ggml_body.h
 *   matmul_avx2.c               f32 / f16 / bf16 / fp8 / ConvRot row-tile kernels, AVX2 + FMA
 *   matmul_avx512vnni.c         GEMV and packed GEMM micro-kernels with AVX-512 F/BW/VL + VNNI (+ BF16)
 *
 * Nothing here is exported; the entry points are declared in tp.h.
 */
#ifndef TP_CPU_MATMUL_H
#define TP_CPU_MATMUL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "internal.h"

/* Clang contracts a*b+c into an FMA by default; the bit-exact kernels below must round every step. */
#ifdef __clang__
#pragma clang fp contract(off)
#endif

/* ---- weight formats ------------------------------------------------------------------------ */

/* Number of tp_wformat values (tp.h). */
#define TP_W_COUNT 19

/* Elements and bytes of one storage block of a format (1 element for plain types, 2 for packed int4). */
typedef struct tp_wformat_info {
  const char *name;   /* @tp/tensor WeightFormat name */
  int32_t block;      /* elements per block */
  int32_t block_bytes;
  int32_t act;        /* activation type of the dot products (TP_ACT_*) */
} tp_wformat_info;

/* Activation types a matmul prepares x in. */
enum {
  TP_ACT_F32 = 0,     /* x as is (f32, f16 weights) */
  TP_ACT_BF16 = 1,    /* x rounded to bf16, ties to even (bf16, fp8 weights: products are exact in f32) */
  TP_ACT_Q8_0 = 2,    /* ggml block_q8_0 (34 B / 32) */
  TP_ACT_Q8_1 = 3,    /* ggml block_q8_1 (36 B / 32) */
  TP_ACT_Q8_K = 4,    /* ggml block_q8_K (292 B / 256) */
  TP_ACT_CONVROT = 5  /* rotated, per-row int8 / int4 codes + scale */
};

extern const tp_wformat_info tp_wformats[TP_W_COUNT];

/* Bytes of one row of k elements in `format`, or -1 when k is not a whole number of blocks. */
int64_t tp_row_bytes(int32_t format, int64_t k);

/* ---- scalar helpers (exact conversions, unaligned little-endian reads) ---------------------- */

static inline uint16_t tp_rd16(const uint8_t *p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
}
static inline uint32_t tp_rd32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static inline float tp_rdf32(const uint8_t *p) {
  float v;
  memcpy(&v, p, 4);
  return v;
}
static inline float tp_bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline uint32_t tp_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* IEEE binary16 → f32, exact (subnormals included; NaN payload kept, quiet bit set, as VCVTPH2PS). */
static inline float tp_f16_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 31u, m = h & 1023u;
  if (e == 31) return tp_bits_f32(sign | 0x7F800000u | (m << 13) | (m ? 0x00400000u : 0));
  if (e != 0) return tp_bits_f32(sign | ((e + 112) << 23) | (m << 13));
  /* zero or subnormal: m · 2^-24, exact in f32 */
  const float v = (float)m * 5.9604644775390625e-08f;
  return sign ? -v : v;
}
static inline float tp_f16p(const uint8_t *p) { return tp_f16_f32(tp_rd16(p)); }

/* The signed 6-bit scale t (−32..31) of a Q3_K super-block from its 12 packed bytes s (llm.md §2.3 S3). */
static inline int tp_q3k_scale(const uint8_t *s, int t) {
  const int low = t < 8 ? s[t] & 15 : s[t - 8] >> 4;
  const int high = (s[8 + (t & 3)] >> (2 * (t >> 2))) & 3;
  return (low | (high << 4)) - 32;
}

/* f32 → binary16 bits, round to nearest even (the rules of tp.h tp_cpu_cast). */
static inline uint16_t tp_f32_f16(float f) {
  uint16_t h;
  tp_cast_f32_to_f16_scalar(&f, &h, 1, 0);
  return h;
}

/* f32 → bf16 bits, round to nearest even (tp_cpu_cast rules: NaN keeps sign and upper payload, quiet). */
static inline uint16_t tp_f32_bf16(float f) {
  const uint32_t u = tp_f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* fp8 → f32, exact (tp.h cast rules). */
static inline float tp_e4m3_f32(uint8_t b) {
  const uint32_t sign = (uint32_t)(b & 0x80u) << 24;
  const uint32_t mag = b & 0x7Fu;
  if (mag == 0x7F) return tp_bits_f32(sign | 0x7FC00000u);
  /* exponent field e at bits 23..26, mantissa at 20..22; × 2^120 rebiases (7 → 127) and normalizes e = 0 */
  const float v = tp_bits_f32(mag << 20) * 0x1p120f;
  return sign ? -v : v;
}
static inline float tp_e5m2_f32(uint8_t b) { return tp_f16_f32((uint16_t)(b << 8)); }

/* ---- ConvRot ----------------------------------------------------------------------------- */

/* log4(g) for a power of 4 g ≥ 4, else 0. */
int32_t tp_log4(int64_t g);

/* ---- one matmul --------------------------------------------------------------------------- */

/*
 * Everything a matmul kernel needs. The entry point fills the inputs, prepares the activations
 * (`xq` …) once, then calls a family kernel for column ranges [n0, n1) on the pool's threads.
 */
typedef struct tp_mm {
  int32_t fmt;           /* tp_wformat */
  int32_t act;           /* TP_ACT_* of fmt */
  int64_t m, n, k;
  const float *x;        /* [m, k] */
  const uint8_t *w;      /* n rows of w_row bytes */
  size_t w_row;
  const float *w_scale;  /* ConvRot: [n] row scales; else NULL */
  float scale;           /* fp8 per-tensor scale (applied when has_scale) */
  int32_t has_scale;
  int32_t group;         /* ConvRot rotation group */
  const float *bias;     /* [n] or NULL */
  float *y;              /* [m, n] */
  uint32_t features;     /* usable TP_CPU_* bits (masked by the context's ISA level) */
  /*
   * Prepared activations, m rows of xq_row bytes:
   *   TP_ACT_F32: NULL (x is used); TP_ACT_BF16: k bf16 values;
   *   TP_ACT_Q8_*: ggml blocks; TP_ACT_CONVROT: k int8 codes.
   */
  const uint8_t *xq;
  size_t xq_row;
  const float *xs;       /* ConvRot: per-row activation scale [m]; GGUF GEMM: block scales d_a [m, k/32] (Q6_K: [m, k/16]) */
  const int32_t *xsum;   /* ConvRot: per-row Σ codes [m]; GGUF GEMM: per-block Σ codes, likewise */
  size_t task_scratch;   /* bytes of the scratch each task gets (64-byte aligned), TP_MM_TASK_SCRATCH */
  size_t part_bytes;     /* the GEMM's partial-sum buffer in each task's scratch (tp_mm_part_bytes), 0: in y */
} tp_mm;

/*
 * Scratch of one matmul task: the packed weight panel of the GEMM (NC × KC × 4 bytes at most), the
 * rearranged activations of the int4 GEMV (16 rows of k rounded up to 128), or the activations of
 * 16 rows laid out for the AVX-512 GGUF kernels (448 bytes per 128 elements); then, for m ≥ 16, the
 * GEMM's partial sums between K blocks (m rows of TP_MM_NC from tp_mm_part_offset(): tp_mm.part_bytes).
 */
#define TP_MM_NC 256
#define TP_MM_PANEL_BYTES ((size_t)TP_MM_NC * 128 * 4 + 64)
/*
 * Most bytes of GEMM partial-sum buffers one matmul keeps, all tasks together: past it the partial sums
 * stay in y (so that many threads × many rows do not push the scratch past what the context keeps
 * between calls, matmul.c TP_MM_SCRATCH_KEEP).
 */
#define TP_MM_PART_TOTAL_MAX ((size_t)32 << 20)
/* Bytes of each task's GEMM partial-sum buffer for m activation rows and `tasks` tasks (m × TP_MM_NC × 4, or 0). */
static inline size_t tp_mm_part_bytes(int64_t m, int64_t tasks) {
  const size_t b = m >= 16 ? (size_t)m * TP_MM_NC * 4 : 0;
  return tasks > 0 && b <= TP_MM_PART_TOTAL_MAX / (size_t)tasks ? b : 0;
}
/* Where that buffer starts in a task's scratch: after the packed panel. */
static inline size_t tp_mm_part_offset(void) { return (TP_MM_PANEL_BYTES + 63) / 64 * 64; }
/* Bytes of one task's scratch for a product with k inputs and part_bytes of partial sums (64-byte multiple). */
static inline size_t tp_mm_task_scratch(int64_t k, size_t part_bytes) {
  const size_t kp = (size_t)((k + 127) / 128);
  const size_t rows = (size_t)16 * kp * 448;
  const size_t first = ((rows > TP_MM_PANEL_BYTES ? rows : TP_MM_PANEL_BYTES) + 63) / 64 * 64;
  return first + part_bytes;
}

/*
 * Final value of output (row i, column j) of a ConvRot product from the exact integer dot `acc`,
 * exactly as @tp/quant convRotLinear: int8 y = f32(f32(acc) · f32(s_x · s_w)); int4 y =
 * f32(f32(f32(acc) · s_x) · s_w); then + bias in f32.
 */
static inline float tp_convrot_out(int32_t int8, int32_t acc, float sx, float sw, const float *bias, int64_t j) {
  float v = int8 ? (float)acc * (sx * sw) : ((float)acc * sx) * sw;
  if (bias) v = v + bias[j];
  return v;
}

/* ---- kernels by file ---------------------------------------------------------------------- */

/*
 * dequant_scalar.c: dequantize `rows` rows of k elements to f32, out row r from weight row
 * row_ids[r] (or r when row_ids is NULL) at w + row · w_row. scale: fp8 tensor scale [1] or NULL,
 * ConvRot row scales [n]. tmp: k int32 of scratch (ConvRot only; else may be NULL).
 */
void tp_dequant_rows_scalar(int32_t fmt, const uint8_t *w, size_t w_row, int64_t rows, int64_t k,
                            const float *scale, int32_t group, const int64_t *row_ids, float *out, int32_t *tmp);
/* dequant_avx512.c: the same, bit-exact; the scalar code for the formats it lacks. */
void tp_dequant_rows_avx512(int32_t fmt, const uint8_t *w, size_t w_row, int64_t rows, int64_t k,
                            const float *scale, int32_t group, const int64_t *row_ids, float *out, int32_t *tmp);

/* quantize_act.c: one activation row of k values to ggml blocks (Q8_0 / Q8_1: k % 32; Q8_K: k % 256). */
/*
 * A Q8_0 / Q8_1 block (bb = 34 / 36 bytes at o) of non-finite input, as @tp/quant's reference gives it:
 * d = NaN if the block holds a NaN, else +inf; codes 0; Q8_1's s = NaN (quantize_act.c).
 */
/* ggml kvalues_iq4nl: the 16 values of the IQ4_NL / IQ4_XS non-linear 4-bit grid (llm.md §2.4). */
static const int8_t tp_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* The 6-bit scale ls (0..63) of sub-block ib of an IQ4_XS super-block b (value d · (ls − 32) · K[n]). */
static inline int tp_iq4xs_scale(const uint8_t *b, int ib) {
  const int low = (b[4 + (ib >> 1)] >> (4 * (ib & 1))) & 15;
  const int high = (tp_rd16(b + 2) >> (2 * ib)) & 3;
  return low | (high << 4);
}

static inline void tp_q8_nonfinite_block(uint8_t *o, size_t bb, int nan) {
  const uint16_t dh = tp_f32_f16(nan ? NAN : INFINITY), sh = tp_f32_f16(NAN);
  memset(o, 0, bb);
  memcpy(o, &dh, 2);
  if (bb == 36) memcpy(o + 2, &sh, 2);
}

/* A ConvRot row whose rotated values are not all finite: scale NaN (a NaN among them) or +inf, codes 0. */
static inline void tp_convrot_nonfinite_row(int64_t k, int8_t *codes, float *scale, int32_t *sum, int nan) {
  memset(codes, 0, (size_t)k);
  *scale = nan ? NAN : INFINITY;
  *sum = 0;
}

void tp_quantize_q8_0_row(const float *x, int64_t k, uint8_t *out);
void tp_quantize_q8_1_row(const float *x, int64_t k, uint8_t *out);
void tp_quantize_q8_k_row(const float *x, int64_t k, uint8_t *out);
/* quantize_act_avx512.c: the same with AVX-512, bit-exact. */
void tp_quantize_q8_0_row_avx512(const float *x, int64_t k, uint8_t *out);
void tp_quantize_q8_1_row_avx512(const float *x, int64_t k, uint8_t *out);
void tp_quantize_q8_k_row_avx512(const float *x, int64_t k, uint8_t *out);
/*
 * ConvRot activations, one row: rotate x per group of g (f32 butterfly, krea2.md §1.6), then
 * quantize symmetrically to `bits` (8 or 4) → codes[k], *scale, *sum (Σ codes). tmp: k floats.
 */
void tp_convrot_quantize_row_scalar(const float *x, int64_t k, int32_t g, int32_t bits, float *tmp, int8_t *codes,
                                    float *scale, int32_t *sum);
void tp_convrot_quantize_row_avx512(const float *x, int64_t k, int32_t g, int32_t bits, float *tmp, int8_t *codes,
                                    float *scale, int32_t *sum);

/*
 * Family kernels: compute y[0..m) × [n0, n1) of `mm` (activations already prepared), with `scratch`
 * (mm->task_scratch bytes, 64-byte aligned) for the task's own use.
 */
void tp_mm_ggml_scalar(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch);
void tp_mm_ggml_avx2(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch);
void tp_mm_ggml_avx512vnni(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch);
/*
 * matmul_avx512vnni.c: the GGUF GEMM (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) (m ≥ TP_GGML_GEMM_MIN_M), called by tp_mm_ggml_avx512vnni
 * when matmul.c prepared the per-block activation scales (mm->xs) and code sums (mm->xsum), m × k/32 (Q6_K: per 16-element sub-block, m × k/16).
 */
#define TP_GGML_GEMM_MIN_M 16
void tp_mm_ggml_gemm_avx512vnni(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch);
void tp_mm_float_scalar(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch);
void tp_mm_float_avx2(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch);
void tp_mm_float_avx512vnni(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch);
void tp_mm_convrot_scalar(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch);
void tp_mm_convrot_avx2(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch);
void tp_mm_convrot_avx512vnni(const tp_mm *mm, int64_t n0, int64_t n1, uint8_t *scratch);


/* ---- repacked Q8_0 / Q4_0 weights for GEMV and small batches (matmul.c, matmul_repack_avx512vnni.c) ---- */

/*
 * Layout (tp_cpu_repack_weight): rows in groups of TP_RP_ROWS (the last group padded with zero rows of
 * scale 0); per group, per block of 32 columns, one record:
 *   Q8_0 (544 B): codes + 128 as u8 in 8 steps of [16 rows][4 bytes] (step s: columns 4s..4s+3), then
 *                 the 16 rows' f16 scales;
 *   Q4_0 (288 B): the ggml nibble bytes in 4 steps of [16 rows][4 bytes] (step j: bytes 4j..4j+3 of the
 *                 row's qs: low nibbles columns 4j.., high nibbles 16 + 4j..), then the 16 f16 scales.
 * One 512-bit load is then 16 rows × 4 columns: vpdpbusd against 4 activation bytes broadcast, the
 * same exact int32 block sums as the unpacked kernels (Q8_0: −128·Σq_a; Q4_0: −8·Σq_a per block).
 * After llama.cpp's repacked layouts (ggml-cpu/repack.cpp, block_q4_0x8 / block_q8_0x4).
 */
#define TP_RP_ROWS 16
#define TP_RP_Q8_0_REC 544
#define TP_RP_Q4_0_REC 288

/* Activation block of the repacked kernel: the Q8_0 codes, d_a, and the offset term as int32. */
typedef struct tp_rp_act {
  int8_t q[32];
  float d;
  int32_t corr; /* −128·Σq (Q8_0 weights) or −8·Σq (Q4_0) */
} tp_rp_act;

typedef struct tp_mm_rp {
  int32_t fmt;             /* TP_W_Q8_0 or TP_W_Q4_0 */
  int64_t m, n, k;
  const uint8_t *w;        /* ceil(n / 16) groups of k / 32 records */
  size_t rec;              /* record bytes */
  const tp_rp_act *act;    /* [m][k / 32] */
  const float *bias;       /* [n] or NULL */
  float *y;                /* [m, n] */
} tp_mm_rp;

/* y rows [0, m) × row groups [g0, g1) of a repacked weight (AVX-512 BW + VNNI). */
void tp_mm_repacked_avx512vnni(const tp_mm_rp *p, int64_t g0, int64_t g1);

#endif /* TP_CPU_MATMUL_H */
