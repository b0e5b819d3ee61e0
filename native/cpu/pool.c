/*
 * The thread pool of a tp_ctx: n_workers persistent pthreads plus the calling thread.
 *
 * tp_parallel_for stores a job (function, argument, task count), resets `claim` to (job, 0), then
 * bumps the generation atomically. Every thread, the caller included, then takes units of tasks one
 * at a time with a compare-and-swap on `claim` (the job number in the high 32 bits makes a late
 * worker's claim on a finished job fail) and counts the units it finished in `finished`; the caller
 * returns when every unit is finished. A worker that the OS has descheduled (the machine runs other
 * work) therefore costs nothing: the threads that run take its units, and the caller waits only for
 * units already started. (With a fixed share per thread, as before, one op waited a whole scheduler
 * time slice — milliseconds — for a preempted worker, hundreds of times per decoded token.)
 * Everything lives in the tp_pool struct; there is no global state.
 *
 * Waiting is spin-then-sleep. A condition-variable wake-up (futex wake + the scheduler) costs as
 * much as a whole small GEMV, so after each job a worker polls the generation (with
 * PAUSE) for TP_POOL_SPIN_NS before it sleeps on `wake`; the caller likewise polls `finished` before it
 * sleeps on `done`. No wake-up is lost: a worker about to sleep increments `sleepers` under `lock` and
 * re-reads the generation before waiting, while the publisher bumps the generation before it reads
 * `sleepers` (and broadcasts under `lock` when it is non-zero); with sequentially consistent atomics
 * one of the two sees the other's write. The caller and the thread finishing the last unit use
 * `caller_sleeping` and `finished` the same way. An idle pool spins for at most TP_POOL_SPIN_NS, then
 * sleeps.
 *
 * What the threads share sits in three cache lines by use (tp_pool, internal.h): the job with the
 * generation idle workers poll, the `claim` counter, and `finished`. The job's fields are published with
 * release stores, which the generation's sequentially consistent store follows (on x86 one xchg, not
 * eight). With everything in the lines of the mutexes, each of the caller's eight xchg had to take the
 * line back from a worker polling it (measurements: docs/performance.md, "The thread pool").
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"

/* Run the tasks of unit u out of n units: [u * n_tasks / n, (u + 1) * n_tasks / n). */
static void run_unit(tp_task_fn fn, void *arg, int64_t n_tasks, int64_t u, int64_t n) {
  const int64_t begin = u * n_tasks / n;
  const int64_t end = (u + 1) * n_tasks / n;
  for (int64_t t = begin; t < end; t++) fn(arg, t, n_tasks);
}

/* Most units per job: the unit index lives in the low 32 bits of `claim`, and UNIT_NONE is above it. */
#define TP_POOL_MAX_UNITS ((int64_t)1 << 30)
#define UNIT_NONE 0xffffffffu

/* How long a thread polls before it sleeps: covers the gap between the ops of one model step. */
#ifndef TP_POOL_SPIN_NS
#define TP_POOL_SPIN_NS 100000
#endif
/* Polls between two reads of the clock, and between two sched_yield calls (which let a thread that
 * waits for this CPU run first: with more runnable threads than CPUs, spinning alone would keep the
 * very thread being waited for off the CPU). */
#define TP_POOL_SPIN_CHECK 64
#define TP_POOL_SPIN_YIELD 64
/*
 * For its first TP_POOL_SPIN_TIGHT_NS a thread polls without yielding: a sched_yield is a system call
 * of about a microsecond, and a worker inside one when the next job came started a short GEMV late.
 * The window must cover a worker that finished early waiting for the caller's last task plus the
 * JavaScript between two ops. Past it, a thread that waits longer yields as before.
 */
#ifndef TP_POOL_SPIN_TIGHT_NS
#define TP_POOL_SPIN_TIGHT_NS 30000
#endif

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static inline int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

#define LOAD(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
/* Release / acquire: what orders a job's fields (plain moves on x86, where a sequentially consistent store is an xchg). */
#define STORE_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)

/* Poll until *p != value or shutdown, for at most TP_POOL_SPIN_NS; returns the last value read. */
static uint64_t spin_while_gen(tp_pool *pool, uint64_t value) {
  const int64_t start = now_ns(), deadline = start + TP_POOL_SPIN_NS;
  int tight = 1;
  for (uint32_t i = 1;; i++) {
    const uint64_t g = LOAD(&pool->generation);
    if (g != value || LOAD(&pool->shutdown)) return g;
    if (i % TP_POOL_SPIN_CHECK == 0) {
      const int64_t t = now_ns();
      if (t > deadline) return g;
      tight = t < start + TP_POOL_SPIN_TIGHT_NS;
    }
    if (!tight && i % TP_POOL_SPIN_YIELD == 0) sched_yield();
    cpu_relax();
  }
}

/*
 * Take and run units of job `g` (the low 32 bits of its generation) until none is left. The job's
 * fields may be read after the job ended (a late worker), even half from the next job: then the
 * compare-and-swap fails, because `claim` changed to the next job before its fields were written.
 */
static void run_units(tp_pool *pool, uint64_t g) {
  const uint64_t tag = (g & 0xffffffffu) << 32;
  const tp_task_fn fn = LOAD_ACQ(&pool->fn);
  void *const arg = LOAD_ACQ(&pool->arg);
  const int64_t n_tasks = LOAD_ACQ(&pool->n_tasks);
  const int64_t n_units = LOAD_ACQ(&pool->n_units);
  uint64_t c = LOAD(&pool->claim);
  for (;;) {
    if ((c & ~(uint64_t)0xffffffffu) != tag) return;
    const int64_t u = (int64_t)(c & 0xffffffffu);
    if (u >= n_units) return;
    if (!__atomic_compare_exchange_n(&pool->claim, &c, c + 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) continue;
    run_unit(fn, arg, n_tasks, u, n_units);
    if (__atomic_add_fetch(&pool->finished, 1, __ATOMIC_SEQ_CST) == n_units && LOAD(&pool->caller_sleeping)) {
      pthread_mutex_lock(&pool->lock);
      pthread_cond_signal(&pool->done);
      pthread_mutex_unlock(&pool->lock);
    }
    c = LOAD(&pool->claim);
  }
}

static void *worker_main(void *p) {
  tp_worker *self = p;
  tp_pool *pool = self->pool;
  uint64_t seen = 0; /* the last generation this worker ran */

  for (;;) {
    uint64_t g = spin_while_gen(pool, seen);
    if (g == seen && !LOAD(&pool->shutdown)) {
      pthread_mutex_lock(&pool->lock);
      __atomic_add_fetch(&pool->sleepers, 1, __ATOMIC_SEQ_CST);
      while ((g = LOAD(&pool->generation)) == seen && !LOAD(&pool->shutdown)) pthread_cond_wait(&pool->wake, &pool->lock);
      __atomic_sub_fetch(&pool->sleepers, 1, __ATOMIC_SEQ_CST);
      pthread_mutex_unlock(&pool->lock);
    }
    if (LOAD(&pool->shutdown)) break;
    seen = g;
    run_units(pool, g);
  }
  return NULL;
}

/* Stop and join the first n_started workers, then release everything init created. */
static void stop_workers(tp_pool *pool, int32_t n_started) {
  pthread_mutex_lock(&pool->lock);
  STORE(&pool->shutdown, 1);
  pthread_cond_broadcast(&pool->wake);
  pthread_mutex_unlock(&pool->lock);
  for (int32_t i = 0; i < n_started; i++) pthread_join(pool->workers[i].thread, NULL);
  free(pool->workers);
  pool->workers = NULL;
  pthread_cond_destroy(&pool->wake);
  pthread_cond_destroy(&pool->done);
  pthread_mutex_destroy(&pool->lock);
  pthread_mutex_destroy(&pool->run);
}

int tp_pool_init(tp_pool *pool, int32_t n_workers) {
  pool->workers = NULL;
  pool->n_workers = 0;
  pool->generation = 0;
  pool->claim = UNIT_NONE;
  pool->finished = 0;
  pool->n_units = 0;
  pool->sleepers = 0;
  pool->caller_sleeping = 0;
  pool->shutdown = 0;
  pool->fn = NULL;
  pool->arg = NULL;
  pool->n_tasks = 0;
  if (n_workers < 0) n_workers = 0;

  pthread_mutex_init(&pool->lock, NULL);
  pthread_mutex_init(&pool->run, NULL);
  pthread_cond_init(&pool->wake, NULL);
  pthread_cond_init(&pool->done, NULL);
  if (n_workers > 0) {
    pool->workers = calloc((size_t)n_workers, sizeof(tp_worker));
    if (pool->workers == NULL) {
      stop_workers(pool, 0);
      return -1;
    }
  }

  /*
   * Workers inherit the creating thread's signal mask: block everything while creating them so
   * that signals meant for the host process (Bun's runtime) are never delivered to a worker.
   */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int32_t started = 0;
  for (; started < n_workers; started++) {
    tp_worker *w = &pool->workers[started];
    w->pool = pool;
    w->index = started + 1; /* the caller is thread 0 */
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) break;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);

  pool->n_workers = started;
  if (started < n_workers) {
    stop_workers(pool, started);
    return -1;
  }
  return 0;
}

void tp_pool_destroy(tp_pool *pool) { stop_workers(pool, pool->n_workers); }

void tp_parallel_for(tp_pool *pool, int64_t n_tasks, tp_task_fn fn, void *arg) {
  if (n_tasks <= 0) return;
  if (pool->n_workers == 0 || n_tasks == 1) {
    run_unit(fn, arg, n_tasks, 0, 1);
    return;
  }

  pthread_mutex_lock(&pool->run);

  /*
   * Publish the job: first make `claim` refuse every unit (a late worker of the last job must not
   * claim with this job's fields), then the fields, then the first unit, then the generation; wake the
   * workers that sleep.
   */
  const uint64_t g = LOAD(&pool->generation) + 1;
  const uint64_t tag = (g & 0xffffffffu) << 32;
  const int64_t n_units = n_tasks < TP_POOL_MAX_UNITS ? n_tasks : TP_POOL_MAX_UNITS;
  STORE_REL(&pool->claim, tag | UNIT_NONE);
  STORE_REL(&pool->fn, fn);
  STORE_REL(&pool->arg, arg);
  STORE_REL(&pool->n_tasks, n_tasks);
  STORE_REL(&pool->n_units, n_units);
  STORE_REL(&pool->finished, 0);
  STORE_REL(&pool->claim, tag);
  STORE(&pool->generation, g);
  const int woke = LOAD(&pool->sleepers) > 0;
  if (woke) {
    pthread_mutex_lock(&pool->lock);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);
  }

  /* the caller takes units too, until none is left */
  run_units(pool, g);

  /*
   * Wait for the units other threads started: poll, then sleep. Workers that were asleep are often
   * woken onto this CPU (the scheduler's wake-affine placement), where polling would only delay them:
   * then sleep at once.
   */
  const int64_t start = now_ns(), deadline = woke ? 0 : start + TP_POOL_SPIN_NS;
  int tight = !woke;
  for (uint32_t i = 1; LOAD(&pool->finished) < n_units; i++) {
    if (woke || i % TP_POOL_SPIN_CHECK == 0) {
      const int64_t t = now_ns();
      if (t > deadline) {
        pthread_mutex_lock(&pool->lock);
        STORE(&pool->caller_sleeping, 1);
        while (LOAD(&pool->finished) < n_units) pthread_cond_wait(&pool->done, &pool->lock);
        STORE(&pool->caller_sleeping, 0);
        pthread_mutex_unlock(&pool->lock);
        break;
      }
      tight = t < start + TP_POOL_SPIN_TIGHT_NS;
    }
    if (!tight && i % TP_POOL_SPIN_YIELD == 0) sched_yield();
    cpu_relax();
  }

  pthread_mutex_unlock(&pool->run);
}
