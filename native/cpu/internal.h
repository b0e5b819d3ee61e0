/*
 * Internal declarations shared by the files of native/cpu. Nothing here is exported from the
 * library (it is built with -fvisibility=hidden; only TP_API symbols of tp.h are visible).
 *
 *   pool.c          the thread pool a tp_ctx owns (tp_pool_*, tp_parallel_for)
 *   cpu.c           the public entry points of tp.h, CPU feature detection, cast dispatch
 *   cast_scalar.c   reference conversions (every ISA level falls back to them)
 *   cast_avx2.c     f16/bf16 <-> f32 with AVX2 + F16C
 *   cast_avx512.c   f16/bf16 <-> f32 with AVX-512 F/BW/VL + F16C
 *   matmul*.c, dequant*.c, quantize_act*.c   weight formats: matmul, get_rows (matmul.h)
 *   ops.h           the other ops (elementwise, norms, softmax, rope, attention, conv2d, copy,
 *                   sampling): their vector primitives and micro-kernels, declared there
 */
#ifndef TP_CPU_INTERNAL_H
#define TP_CPU_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "tp.h"

/* ---- thread pool (pool.c) ---------------------------------------------------------------- */

/*
 * One unit of a parallel_for: run task `task` of `n_tasks`. `arg` is the pointer given to
 * tp_parallel_for. Tasks must be independent: they may run on any thread, in any order.
 */
typedef void (*tp_task_fn)(void *arg, int64_t task, int64_t n_tasks);

/* One worker thread and its index k in [1, n_workers] (the caller is k = 0). */
typedef struct tp_worker {
  pthread_t thread;
  struct tp_pool *pool;
  int32_t index;
} tp_worker;

/*
 * A persistent pool: n_workers threads plus the caller. A job is published by storing it, resetting
 * `claim` to (job number, 0) and then bumping `generation` (atomically); every thread, the caller
 * included, takes the next unclaimed unit of tasks with a compare-and-swap on `claim` until none is
 * left, and counts the units it finished in `finished`; the caller returns when finished equals the
 * unit count. So a worker that the OS has not scheduled (a loaded machine) leaves its share to the
 * threads that run, instead of holding the caller up; the caller only waits for units already
 * started. Waiting is spin-then-sleep on both sides (pool.c): a worker polls `generation` for
 * TP_POOL_SPIN_NS after its last job before it sleeps on `wake` (announcing itself in `sleepers`),
 * and the caller polls `finished` before it sleeps on `done` (announcing itself in
 * `caller_sleeping`). Everything shared is accessed with __atomic builtins only.
 */
typedef struct tp_pool {
  /*
   * Three cache lines shared between threads, each for one purpose: the job (what idle workers poll
   * and then read: written by the caller once per call, in one burst), the unit counter every thread
   * swaps, and the count of finished units the caller polls. In one line with the mutexes, each of the
   * caller's stores had to take the line back from a worker polling it (pool.c).
   */
  _Alignas(64) uint64_t generation; /* bumped once per job, after its fields; idle workers poll it */
  int shutdown;                     /* set by tp_pool_destroy */
  int32_t sleepers;                 /* workers asleep (or about to sleep) on `wake` */
  int32_t caller_sleeping;          /* 1 while the caller sleeps (or is about to) on `done` */
  /* the current job, valid while units remain unfinished */
  tp_task_fn fn;
  void *arg;
  int64_t n_tasks;
  int64_t n_units;               /* min(n_tasks, 2^30): unit u runs tasks [u·n_tasks/n_units, (u+1)·n_tasks/n_units) */
  _Alignas(64) uint64_t claim;   /* (generation & 0xffffffff) << 32 | next unit to take */
  _Alignas(64) int64_t finished; /* units of the current job done; the caller polls it */
  _Alignas(64) pthread_mutex_t lock;
  pthread_cond_t wake; /* sleeping workers wait here for a new generation or shutdown */
  pthread_cond_t done; /* a sleeping caller waits here for finished == n_units */
  pthread_mutex_t run; /* serializes tp_parallel_for calls on one pool */
  tp_worker *workers;  /* [n_workers] */
  int32_t n_workers;   /* threads started (the caller is not counted) */
} tp_pool;

/* Start n_workers threads (0 is allowed: everything then runs on the caller). 0 on success. */
int tp_pool_init(tp_pool *pool, int32_t n_workers);

/* Wake, stop and join every worker; free the pool's memory. Only after a successful init. */
void tp_pool_destroy(tp_pool *pool);

/*
 * Run fn(arg, t, n_tasks) for t in [0, n_tasks) over the caller plus the pool's workers and
 * return when all are done. Which thread runs a task is not fixed (threads take the next unit as
 * they come; see tp_pool), so tasks must not depend on it: results are the same whichever thread
 * runs them. Calls on one pool are serialized; fn must not call tp_parallel_for on the same pool
 * (deadlock).
 */
void tp_parallel_for(tp_pool *pool, int64_t n_tasks, tp_task_fn fn, void *arg);

/* ---- context (cpu.c) ---------------------------------------------------------------------- */

#define TP_ERROR_BYTES 512

struct tp_ctx {
  int32_t n_threads;          /* workers + the caller, in [1, 256] */
  int32_t isa;                /* a tp_isa value, chosen at create */
  uint32_t features;          /* TP_CPU_* bits usable at this level (tp_cpu_features() masked by isa) */
  void *scratch;              /* matmul scratch kept between calls (matmul.c; 64-byte aligned), or NULL */
  size_t scratch_bytes;       /* its size */
  char error[TP_ERROR_BYTES]; /* message of the last failure, "" if none */
  tp_pool pool;
};

/* ---- conversion kernels ------------------------------------------------------------------- */

/*
 * Convert n elements from src to dst. Pointers are aligned to their element size (cpu.c checks),
 * n may be any count (tails are the kernel's business). `flags` are the TP_CAST_* bits; only the
 * f32 -> fp8 kernels read them.
 */
typedef void (*tp_cast_fn)(const void *src, void *dst, size_t n, uint32_t flags);

/* cast_scalar.c: the reference, bit-exact as documented in tp.h */
void tp_cast_f16_to_f32_scalar(const void *src, void *dst, size_t n, uint32_t flags);
void tp_cast_f32_to_f16_scalar(const void *src, void *dst, size_t n, uint32_t flags);
void tp_cast_bf16_to_f32_scalar(const void *src, void *dst, size_t n, uint32_t flags);
void tp_cast_f32_to_bf16_scalar(const void *src, void *dst, size_t n, uint32_t flags);
void tp_cast_f8_e4m3fn_to_f32_scalar(const void *src, void *dst, size_t n, uint32_t flags);
void tp_cast_f32_to_f8_e4m3fn_scalar(const void *src, void *dst, size_t n, uint32_t flags);
void tp_cast_f8_e5m2_to_f32_scalar(const void *src, void *dst, size_t n, uint32_t flags);
void tp_cast_f32_to_f8_e5m2_scalar(const void *src, void *dst, size_t n, uint32_t flags);

/* cast_avx2.c (AVX2 + FMA + F16C) */
void tp_cast_f16_to_f32_avx2(const void *src, void *dst, size_t n, uint32_t flags);
void tp_cast_f32_to_f16_avx2(const void *src, void *dst, size_t n, uint32_t flags);
void tp_cast_bf16_to_f32_avx2(const void *src, void *dst, size_t n, uint32_t flags);
void tp_cast_f32_to_bf16_avx2(const void *src, void *dst, size_t n, uint32_t flags);

/* cast_avx512.c (AVX-512 F + BW + VL, F16C) */
void tp_cast_f16_to_f32_avx512(const void *src, void *dst, size_t n, uint32_t flags);
void tp_cast_f32_to_f16_avx512(const void *src, void *dst, size_t n, uint32_t flags);
void tp_cast_bf16_to_f32_avx512(const void *src, void *dst, size_t n, uint32_t flags);
void tp_cast_f32_to_bf16_avx512(const void *src, void *dst, size_t n, uint32_t flags);

#endif /* TP_CPU_INTERNAL_H */
