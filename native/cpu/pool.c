/*
 * The thread pool of a tp_ctx: n_workers persistent pthreads plus the calling thread.
 *
 * Workers sleep on a condition variable between jobs. tp_parallel_for publishes a job (function,
 * argument, task count) and a new generation number under the pool's mutex, wakes every worker,
 * runs share 0 itself, and waits until each worker has finished its share. Shares are fixed by
 * the thread index (no work stealing), so the same call always maps the same tasks to the same
 * thread. Everything lives in the tp_pool struct; there is no global state.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

#include "internal.h"

/* Run the tasks of thread k out of n threads: [k * n_tasks / n, (k + 1) * n_tasks / n). */
static void run_share(tp_task_fn fn, void *arg, int64_t n_tasks, int64_t k, int64_t n) {
  const int64_t begin = k * n_tasks / n;
  const int64_t end = (k + 1) * n_tasks / n;
  for (int64_t t = begin; t < end; t++) fn(arg, t, n_tasks);
}

static void *worker_main(void *p) {
  tp_worker *self = p;
  tp_pool *pool = self->pool;
  uint64_t seen = 0; /* the last generation this worker ran */

  pthread_mutex_lock(&pool->lock);
  for (;;) {
    while (!pool->shutdown && pool->generation == seen) pthread_cond_wait(&pool->wake, &pool->lock);
    if (pool->shutdown) break;
    seen = pool->generation;
    const tp_task_fn fn = pool->fn;
    void *const arg = pool->arg;
    const int64_t n_tasks = pool->n_tasks;
    const int64_t n_threads = (int64_t)pool->n_workers + 1;
    pthread_mutex_unlock(&pool->lock);

    run_share(fn, arg, n_tasks, self->index, n_threads);

    pthread_mutex_lock(&pool->lock);
    if (--pool->pending == 0) pthread_cond_signal(&pool->done);
  }
  pthread_mutex_unlock(&pool->lock);
  return NULL;
}

/* Stop and join the first n_started workers, then release everything init created. */
static void stop_workers(tp_pool *pool, int32_t n_started) {
  pthread_mutex_lock(&pool->lock);
  pool->shutdown = 1;
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
  pool->pending = 0;
  pool->generation = 0;
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
    run_share(fn, arg, n_tasks, 0, 1);
    return;
  }

  pthread_mutex_lock(&pool->run);

  /* publish the job and wake every worker */
  pthread_mutex_lock(&pool->lock);
  pool->fn = fn;
  pool->arg = arg;
  pool->n_tasks = n_tasks;
  pool->pending = pool->n_workers;
  pool->generation++;
  pthread_cond_broadcast(&pool->wake);
  pthread_mutex_unlock(&pool->lock);

  /* the caller is thread 0 */
  run_share(fn, arg, n_tasks, 0, (int64_t)pool->n_workers + 1);

  /* wait for the workers' shares */
  pthread_mutex_lock(&pool->lock);
  while (pool->pending > 0) pthread_cond_wait(&pool->done, &pool->lock);
  pthread_mutex_unlock(&pool->lock);

  pthread_mutex_unlock(&pool->run);
}
