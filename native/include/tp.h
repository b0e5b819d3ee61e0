/*
 * TensorPencil native CPU library: the plain C ABI that @tp/backend-cpu loads with bun:ffi.
 *
 * Conventions (see ../shared/STYLE.md §4):
 *   - Every entry point that can fail returns a tp_status (0 = TP_OK). The message of the last
 *     failure on a context is read with tp_ctx_error().
 *   - JavaScript owns every buffer passed in; native code never keeps a pointer after a call
 *     returns, and never reads or writes outside [ptr, ptr + the byte count implied by n).
 *   - No hidden global state: the thread pool and the chosen instruction-set level live in a
 *     tp_ctx that the caller creates and destroys.
 */
#ifndef TP_H
#define TP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TP_API __attribute__((visibility("default")))

/* Status codes. TypeScript maps them onto TpError codes (E_ARG, E_OOM, E_UNSUPPORTED, E_INTERNAL). */
typedef int32_t tp_status;
#define TP_OK 0
#define TP_ERR_ARG 1         /* a bad argument: null pointer, unknown dtype, n too large */
#define TP_ERR_OOM 2         /* an allocation failed */
#define TP_ERR_UNSUPPORTED 3 /* a valid request this build cannot serve (e.g. a dtype pair) */
#define TP_ERR_INTERNAL 4    /* a native failure (thread creation, ...) */

/* Element types of the conversion kernels. The numbers are part of the ABI: ffi.ts mirrors them. */
typedef enum tp_dtype {
  TP_F32 = 0,
  TP_F16 = 1,       /* IEEE 754 binary16 */
  TP_BF16 = 2,      /* bfloat16: the upper 16 bits of an f32 */
  TP_F8_E4M3FN = 3, /* OCP FP8 E4M3 (bias 7, no infinities, S.1111.111 = NaN, max 448) */
  TP_F8_E5M2 = 4    /* OCP FP8 E5M2 (bias 15, IEEE-like infinities and NaNs, max 57344) */
} tp_dtype;

/* Instruction-set levels the kernels are compiled for; chosen at run time (tp_ctx_create). */
typedef enum tp_isa { TP_ISA_SCALAR = 0, TP_ISA_AVX2 = 1, TP_ISA_AVX512 = 2 } tp_isa;

/* CPU feature bits reported by tp_cpu_features(). */
#define TP_CPU_AVX2 (1u << 0)
#define TP_CPU_FMA (1u << 1)
#define TP_CPU_F16C (1u << 2)
#define TP_CPU_AVX512F (1u << 3)
#define TP_CPU_AVX512BW (1u << 4)
#define TP_CPU_AVX512VL (1u << 5)
#define TP_CPU_AVX512VNNI (1u << 6)
#define TP_CPU_AVX512BF16 (1u << 7)
#define TP_CPU_AVXVNNI (1u << 8)

/* Flags of tp_cpu_cast. */
#define TP_CAST_SATURATE (1u << 0) /* f32 -> fp8: clamp overflow and +-inf to +-max finite */

/* ABI version; ffi.ts refuses a library whose version differs. */
#define TP_ABI_VERSION 1
TP_API int32_t tp_abi_version(void);

/* Feature bits of the CPU this process runs on (cpuid + xgetbv: OS support for the registers). */
TP_API uint32_t tp_cpu_features(void);

/* Number of online logical CPUs (sysconf), at least 1. */
TP_API int32_t tp_cpu_count(void);

typedef struct tp_ctx tp_ctx;

/*
 * Create a context: a pool of n_threads - 1 worker threads (the caller's thread is the n-th) and
 * the instruction-set level min(max_isa, best the CPU supports). n_threads <= 0 means
 * tp_cpu_count(). n_threads is clamped to [1, 256]. Returns NULL when threads cannot be started.
 */
TP_API tp_ctx *tp_ctx_create(int32_t n_threads, int32_t max_isa);
TP_API void tp_ctx_destroy(tp_ctx *ctx);
TP_API int32_t tp_ctx_threads(const tp_ctx *ctx);
TP_API int32_t tp_ctx_isa(const tp_ctx *ctx);
/* NUL-terminated message of the last failure on ctx ("" if none); valid until the next call on ctx. */
TP_API const char *tp_ctx_error(const tp_ctx *ctx);

/* 64-byte-aligned host memory for tensors. tp_alloc returns NULL on failure or bytes == 0. */
TP_API void *tp_alloc(uint64_t bytes);
TP_API void tp_free(void *p);

/*
 * cast: convert n elements from src (src_dtype) to dst (dst_dtype), bit-exact, element i to i.
 * Supported pairs: F32 <-> F16, F32 <-> BF16, F32 <-> F8_E4M3FN, F32 <-> F8_E5M2, and any dtype
 * to itself (a copy). Rounding is to nearest, ties to even. NaN rules (same as @tp/tensor convert.ts):
 *   f16 -> f32: payload kept, quiet bit set (as x86 VCVTPH2PS)
 *   f32 -> f16: sign | 0x7E00 | mantissa >> 13 (as x86 VCVTPS2PH)
 *   bf16 -> f32: bits << 16, exactly
 *   f32 -> bf16: sign | upper payload | quiet bit 0x0040
 *   f32 -> fp8: S.1111.111 (e4m3fn) / S.11111.11 (e5m2)
 *   e5m2 -> f32: payload kept, quiet bit set (S.11111.mm -> sign | 0x7FC00000 | mm << 21)
 *   e4m3fn -> f32: S.1111.111 -> sign | 0x7FC00000 (torch c10 gives sign | 0x7FF00000)
 * fp8 -> f32 and f16/bf16 -> f32 are exact (every value, subnormals included, is an f32).
 * Overflow to fp8 without TP_CAST_SATURATE: e4m3fn -> NaN (torch float8_e4m3fn), e5m2 -> +-inf;
 * with TP_CAST_SATURATE: +-max finite (also for +-inf), as CUDA's __NV_SATFINITE.
 * Source and destination must not overlap. Work is split over the context's threads.
 */
TP_API tp_status tp_cpu_cast(tp_ctx *ctx, const void *src, int32_t src_dtype, void *dst, int32_t dst_dtype,
                             uint64_t n, uint32_t flags);

#ifdef __cplusplus
}
#endif
#endif /* TP_H */
