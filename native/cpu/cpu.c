/*
 * The public entry points of tp.h: ABI version, CPU feature detection, contexts (thread pool +
 * instruction-set level + error buffer), aligned host memory, and tp_cpu_cast's argument checks,
 * work split and kernel dispatch. The kernels themselves live in cast_*.c.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* madvise, MADV_HUGEPAGE */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define TP_X86 1
#else
#define TP_X86 0
#endif

/* TP_NO_X86_KERNELS: set by the build on non-x86 hosts, where cast_avx2.c / cast_avx512.c are not compiled. */
#if TP_X86 && !defined(TP_NO_X86_KERNELS)
#define TP_HAVE_X86_KERNELS 1
#else
#define TP_HAVE_X86_KERNELS 0
#endif

/* Below this many elements a cast runs on the calling thread: waking workers costs more. */
#define TP_PARALLEL_MIN_ELEMENTS 32768
/* Parallel chunks are whole multiples of this many elements (64 bytes of f8 output at least). */
#define TP_CHUNK_ALIGN_ELEMENTS 64

int32_t tp_abi_version(void) { return TP_ABI_VERSION; }

/* ---- CPU features ------------------------------------------------------------------------ */

#if TP_X86
/* XCR0, the register-state components the OS saves on a context switch (XGETBV with ECX = 0). */
static uint64_t read_xcr0(void) {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}
#endif

/*
 * Source: Intel SDM vol. 2A, CPUID leaf 01H (ECX bits: 12 FMA, 27 OSXSAVE, 28 AVX, 29 F16C) and
 * leaf 07H (sub-leaf 0 EBX: 5 AVX2, 16 AVX512F, 30 AVX512BW, 31 AVX512VL; ECX: 11 AVX512_VNNI;
 * sub-leaf 1 EAX: 4 AVX-VNNI, 5 AVX512_BF16); vol. 1 §13.3, XCR0 bits 1-2 (SSE, AVX state) and
 * 5-7 (opmask, ZMM_Hi256, Hi16_ZMM state). A feature counts only if the OS saves its registers.
 */
uint32_t tp_cpu_features(void) {
  uint32_t features = 0;
#if TP_X86
  unsigned int eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return 0;
  const unsigned int leaf1_ecx = ecx;
  const int osxsave = (leaf1_ecx >> 27) & 1;
  const int avx = (leaf1_ecx >> 28) & 1;
  if (!osxsave || !avx) return 0; /* no AVX state at all: every level here needs YMM */

  const uint64_t xcr0 = read_xcr0();
  const int ymm_saved = (xcr0 & 0x6u) == 0x6u;    /* XMM (bit 1) and YMM upper halves (bit 2) */
  const int zmm_saved = (xcr0 & 0xE0u) == 0xE0u;  /* opmask, ZMM_Hi256, Hi16_ZMM (bits 5-7) */
  if (!ymm_saved) return 0;

  if ((leaf1_ecx >> 12) & 1) features |= TP_CPU_FMA;
  if ((leaf1_ecx >> 29) & 1) features |= TP_CPU_F16C;

  if (__get_cpuid_max(0, NULL) >= 7) {
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    const unsigned int max_subleaf = eax;
    if ((ebx >> 5) & 1) features |= TP_CPU_AVX2;
    if (zmm_saved) {
      if ((ebx >> 16) & 1) features |= TP_CPU_AVX512F;
      if ((ebx >> 30) & 1) features |= TP_CPU_AVX512BW;
      if ((ebx >> 31) & 1) features |= TP_CPU_AVX512VL;
      if ((ecx >> 11) & 1) features |= TP_CPU_AVX512VNNI;
      if ((ecx >> 1) & 1) features |= TP_CPU_AVX512VBMI;
    }
    if (max_subleaf >= 1) {
      __cpuid_count(7, 1, eax, ebx, ecx, edx);
      if ((eax >> 4) & 1) features |= TP_CPU_AVXVNNI;
      if (zmm_saved && ((eax >> 5) & 1)) features |= TP_CPU_AVX512BF16;
    }
  }
#endif
  return features;
}

int32_t tp_cpu_count(void) {
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : (n > INT32_MAX ? INT32_MAX : (int32_t)n);
}

/* The best tp_isa whose kernels this CPU can run (see the compile flags in native/cpu/README.md). */
static int32_t best_isa(uint32_t features) {
#if TP_HAVE_X86_KERNELS
  const uint32_t avx2 = TP_CPU_AVX2 | TP_CPU_FMA | TP_CPU_F16C;
  const uint32_t avx512 = avx2 | TP_CPU_AVX512F | TP_CPU_AVX512BW | TP_CPU_AVX512VL;
  if ((features & avx512) == avx512) return TP_ISA_AVX512;
  if ((features & avx2) == avx2) return TP_ISA_AVX2;
#else
  (void)features;
#endif
  return TP_ISA_SCALAR;
}

/* ---- contexts ---------------------------------------------------------------------------- */

static void set_error(tp_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error(tp_ctx *ctx, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx->error, sizeof ctx->error, fmt, ap);
  va_end(ap);
}

tp_ctx *tp_ctx_create(int32_t n_threads, int32_t max_isa) {
  if (n_threads <= 0) n_threads = tp_cpu_count();
  if (n_threads > 256) n_threads = 256;
  if (max_isa < TP_ISA_SCALAR) max_isa = TP_ISA_SCALAR;
  const int32_t best = best_isa(tp_cpu_features());

  /* 64-byte aligned: the pool's shared fields each have a cache line of their own (tp_pool) */
  const size_t bytes = (sizeof(tp_ctx) + 63) / 64 * 64;
  tp_ctx *ctx = aligned_alloc(64, bytes);
  if (ctx == NULL) return NULL;
  memset(ctx, 0, bytes);
  ctx->n_threads = n_threads;
  ctx->isa = max_isa < best ? max_isa : best;
  {
    /* the feature bits kernels may use: none below AVX2, no AVX-512 bits below the AVX-512 level */
    const uint32_t all = tp_cpu_features();
    const uint32_t avx512_bits = TP_CPU_AVX512F | TP_CPU_AVX512BW | TP_CPU_AVX512VL | TP_CPU_AVX512VNNI |
                                 TP_CPU_AVX512BF16 | TP_CPU_AVX512VBMI;
    ctx->features = ctx->isa >= TP_ISA_AVX512 ? all : ctx->isa >= TP_ISA_AVX2 ? all & ~avx512_bits : 0;
  }
  ctx->error[0] = '\0';
  if (tp_pool_init(&ctx->pool, n_threads - 1) != 0) {
    free(ctx);
    return NULL;
  }
  return ctx;
}

void tp_ctx_destroy(tp_ctx *ctx) {
  if (ctx == NULL) return;
  tp_pool_destroy(&ctx->pool);
  free(ctx->scratch);
  free(ctx);
}

int32_t tp_ctx_threads(const tp_ctx *ctx) { return ctx == NULL ? 0 : ctx->n_threads; }

int32_t tp_ctx_isa(const tp_ctx *ctx) { return ctx == NULL ? TP_ISA_SCALAR : ctx->isa; }

const char *tp_ctx_error(const tp_ctx *ctx) { return ctx == NULL ? "null context" : ctx->error; }

/* ---- host memory ------------------------------------------------------------------------- */

/*
 * Blocks of at least this many bytes are aligned to it and asked for as transparent huge pages
 * (madvise; Linux's default THP mode is "madvise"): a fresh 4 KiB page costs a fault on its first
 * write (a KV-cache row of Qwen3-0.6B is one page per layer and token), and a 2 MiB page takes one
 * fault for 512 of them.
 */
#define TP_HUGE_BYTES ((uint64_t)2 << 20)

void *tp_alloc(uint64_t bytes) {
  if (bytes == 0 || bytes > (uint64_t)SIZE_MAX - TP_HUGE_BYTES) return NULL;
  if (bytes >= TP_HUGE_BYTES) {
    const size_t rounded = (size_t)((bytes + TP_HUGE_BYTES - 1) & ~(TP_HUGE_BYTES - 1));
    void *p = aligned_alloc((size_t)TP_HUGE_BYTES, rounded);
#ifdef MADV_HUGEPAGE
    if (p != NULL) (void)madvise(p, rounded, MADV_HUGEPAGE); /* a hint: failure only means 4 KiB pages */
#endif
    return p;
  }
  /* C11 aligned_alloc wants a size that is a multiple of the alignment */
  const size_t rounded = (size_t)((bytes + 63) & ~(uint64_t)63);
  return aligned_alloc(64, rounded);
}

void tp_free(void *p) { free(p); }

/* ---- cast -------------------------------------------------------------------------------- */

static const char *const dtype_names[] = {"f32", "f16", "bf16", "f8_e4m3fn", "f8_e5m2"};
static const size_t dtype_bytes[] = {4, 2, 2, 1, 1};
#define TP_N_DTYPES 5

/* The kernel for (src, dst) at an ISA level; NULL for an unsupported pair. Same dtype: a copy (memcpy). */
static tp_cast_fn pick_cast(int32_t isa, int32_t src, int32_t dst) {
  const int avx512 = TP_HAVE_X86_KERNELS && isa >= TP_ISA_AVX512;
  const int avx2 = TP_HAVE_X86_KERNELS && isa >= TP_ISA_AVX2;
#if !TP_HAVE_X86_KERNELS
  (void)avx512;
  (void)avx2;
#define TP_PICK(scalar, v2, v512) (scalar)
#else
#define TP_PICK(scalar, v2, v512) (avx512 ? (v512) : avx2 ? (v2) : (scalar))
#endif
  if (src == TP_F16 && dst == TP_F32)
    return TP_PICK(tp_cast_f16_to_f32_scalar, tp_cast_f16_to_f32_avx2, tp_cast_f16_to_f32_avx512);
  if (src == TP_F32 && dst == TP_F16)
    return TP_PICK(tp_cast_f32_to_f16_scalar, tp_cast_f32_to_f16_avx2, tp_cast_f32_to_f16_avx512);
  if (src == TP_BF16 && dst == TP_F32)
    return TP_PICK(tp_cast_bf16_to_f32_scalar, tp_cast_bf16_to_f32_avx2, tp_cast_bf16_to_f32_avx512);
  if (src == TP_F32 && dst == TP_BF16)
    return TP_PICK(tp_cast_f32_to_bf16_scalar, tp_cast_f32_to_bf16_avx2, tp_cast_f32_to_bf16_avx512);
#undef TP_PICK
  /* fp8: the scalar code at every level */
  if (src == TP_F8_E4M3FN && dst == TP_F32) return tp_cast_f8_e4m3fn_to_f32_scalar;
  if (src == TP_F32 && dst == TP_F8_E4M3FN) return tp_cast_f32_to_f8_e4m3fn_scalar;
  if (src == TP_F8_E5M2 && dst == TP_F32) return tp_cast_f8_e5m2_to_f32_scalar;
  if (src == TP_F32 && dst == TP_F8_E5M2) return tp_cast_f32_to_f8_e5m2_scalar;
  return NULL;
}

/* One cast split into chunks of `chunk` elements; task t converts [t * chunk, (t + 1) * chunk) ∩ [0, n). */
typedef struct cast_job {
  const uint8_t *src;
  uint8_t *dst;
  size_t n, chunk;
  size_t src_bytes, dst_bytes; /* element sizes */
  tp_cast_fn fn;               /* NULL: same dtype, copy */
  uint32_t flags;
} cast_job;

static void cast_task(void *arg, int64_t task, int64_t n_tasks) {
  (void)n_tasks;
  const cast_job *job = arg;
  const size_t begin = (size_t)task * job->chunk;
  if (begin >= job->n) return;
  const size_t count = job->n - begin < job->chunk ? job->n - begin : job->chunk;
  const uint8_t *s = job->src + begin * job->src_bytes;
  uint8_t *d = job->dst + begin * job->dst_bytes;
  if (job->fn == NULL)
    memcpy(d, s, count * job->src_bytes);
  else
    job->fn(s, d, count, job->flags);
}

tp_status tp_cpu_cast(tp_ctx *ctx, const void *src, int32_t src_dtype, void *dst, int32_t dst_dtype, uint64_t n,
                      uint32_t flags) {
  if (ctx == NULL) return TP_ERR_ARG; /* nowhere to put a message */
  ctx->error[0] = '\0';

  if (src_dtype < 0 || src_dtype >= TP_N_DTYPES) {
    set_error(ctx, "tp_cpu_cast: unknown src_dtype %d (expected 0..4: f32, f16, bf16, f8_e4m3fn, f8_e5m2)",
              (int)src_dtype);
    return TP_ERR_ARG;
  }
  if (dst_dtype < 0 || dst_dtype >= TP_N_DTYPES) {
    set_error(ctx, "tp_cpu_cast: unknown dst_dtype %d (expected 0..4: f32, f16, bf16, f8_e4m3fn, f8_e5m2)",
              (int)dst_dtype);
    return TP_ERR_ARG;
  }
  if ((flags & ~(uint32_t)TP_CAST_SATURATE) != 0) {
    set_error(ctx, "tp_cpu_cast: unknown flags 0x%x (known: TP_CAST_SATURATE = 0x1)", (unsigned)flags);
    return TP_ERR_ARG;
  }
  const tp_cast_fn fn = pick_cast(ctx->isa, src_dtype, dst_dtype);
  if (fn == NULL && src_dtype != dst_dtype) {
    set_error(ctx,
              "tp_cpu_cast: %s -> %s is not supported (supported: f32 <-> f16, bf16, f8_e4m3fn, f8_e5m2, "
              "and any dtype to itself)",
              dtype_names[src_dtype], dtype_names[dst_dtype]);
    return TP_ERR_UNSUPPORTED;
  }
  if (n == 0) return TP_OK; /* nothing is read or written; pointers may be NULL */

  const size_t src_size = dtype_bytes[src_dtype];
  const size_t dst_size = dtype_bytes[dst_dtype];
  if (src == NULL || dst == NULL) {
    set_error(ctx, "tp_cpu_cast: %s is NULL with n = %llu", src == NULL ? "src" : "dst", (unsigned long long)n);
    return TP_ERR_ARG;
  }
  if (n > (uint64_t)(PTRDIFF_MAX / 4)) {
    set_error(ctx, "tp_cpu_cast: n = %llu is too large", (unsigned long long)n);
    return TP_ERR_ARG;
  }
  const uintptr_t s0 = (uintptr_t)src, d0 = (uintptr_t)dst;
  const uintptr_t s1 = s0 + (uintptr_t)n * src_size, d1 = d0 + (uintptr_t)n * dst_size;
  if (s1 < s0 || d1 < d0) {
    set_error(ctx, "tp_cpu_cast: n = %llu runs past the end of the address space", (unsigned long long)n);
    return TP_ERR_ARG;
  }
  if (s0 % src_size != 0 || d0 % dst_size != 0) {
    set_error(ctx, "tp_cpu_cast: %s is not aligned to its element size (%zu bytes)", s0 % src_size ? "src" : "dst",
              s0 % src_size ? src_size : dst_size);
    return TP_ERR_ARG;
  }
  if (s0 < d1 && d0 < s1) {
    set_error(ctx, "tp_cpu_cast: src and dst overlap");
    return TP_ERR_ARG;
  }

  cast_job job = {.src = src,
                  .dst = dst,
                  .n = (size_t)n,
                  .chunk = (size_t)n,
                  .src_bytes = src_size,
                  .dst_bytes = dst_size,
                  .fn = fn,
                  .flags = flags};
  if (n < TP_PARALLEL_MIN_ELEMENTS || ctx->n_threads == 1) {
    cast_task(&job, 0, 1);
    return TP_OK;
  }
  /* one chunk per thread, rounded up to whole TP_CHUNK_ALIGN_ELEMENTS */
  const size_t n_tasks = (size_t)ctx->n_threads;
  size_t chunk = (job.n + n_tasks - 1) / n_tasks;
  chunk = (chunk + TP_CHUNK_ALIGN_ELEMENTS - 1) / TP_CHUNK_ALIGN_ELEMENTS * TP_CHUNK_ALIGN_ELEMENTS;
  job.chunk = chunk;
  tp_parallel_for(&ctx->pool, (int64_t)n_tasks, cast_task, &job);
  return TP_OK;
}
