/*
 * Interrupt cleanup: on SIGINT / SIGTERM remove the temporary files the program has armed, print one
 * line and _exit(128 + signal). In C because a JavaScript signal handler runs only when the event
 * loop turns, and a long synchronous stage (quantizing, a sampling step, a large write) would hold it
 * off until the stage ends. The slot table is the one process-wide state of this library (a signal
 * handler has no context to be given); @tp/formats' registry of temporary files mirrors into it.
 *
 * Only async-signal-safe calls in the handler (signal-safety(7)): unlink, write, _exit. A slot's path is written while the slot is disarmed, then armed with a release store, so the
 * handler never reads a path being written.
 */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "tp.h"

static char g_paths[TP_CLEANUP_SLOTS][TP_CLEANUP_PATH_BYTES];
static int g_armed[TP_CLEANUP_SLOTS];
static int g_busy;

static size_t append(char *buf, size_t at, size_t cap, const char *s) {
  while (*s != '\0' && at + 1 < cap) buf[at++] = *s++;
  return at;
}

static void on_signal(int sig) {
  if (__atomic_exchange_n(&g_busy, 1, __ATOMIC_ACQ_REL)) return; /* another thread is exiting */
  int removed = 0;
  for (int i = 0; i < TP_CLEANUP_SLOTS; i++) {
    if (__atomic_exchange_n(&g_armed[i], 0, __ATOMIC_ACQ_REL) && unlink(g_paths[i]) == 0) removed++;
  }
  char line[160];
  size_t n = append(line, 0, sizeof line, sig == SIGINT ? "interrupted by SIGINT: " : "interrupted by SIGTERM: ");
  if (removed == 0) {
    n = append(line, n, sizeof line, "no");
  } else {
    char digits[12];
    int d = 0;
    for (int v = removed; v > 0 && d < 11; v /= 10) digits[d++] = (char)('0' + v % 10);
    while (d > 0 && n + 1 < sizeof line) line[n++] = digits[--d];
  }
  n = append(line, n, sizeof line, removed == 1 ? " unfinished output file removed\n" : " unfinished output files removed\n");
  ssize_t w = write(2, line, n);
  (void)w;
  _exit(128 + sig);
}

tp_status tp_cleanup_install(int32_t sig) {
  if (sig != SIGINT && sig != SIGTERM) return TP_ERR_ARG;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGINT);
  sigaddset(&sa.sa_mask, SIGTERM);
  return sigaction(sig, &sa, NULL) == 0 ? TP_OK : TP_ERR_INTERNAL;
}

tp_status tp_cleanup_arm(int32_t slot, const char *path, uint64_t len) {
  if (slot < 0 || slot >= TP_CLEANUP_SLOTS || path == NULL || len == 0 || len >= TP_CLEANUP_PATH_BYTES) {
    return TP_ERR_ARG;
  }
  __atomic_store_n(&g_armed[slot], 0, __ATOMIC_RELEASE);
  memcpy(g_paths[slot], path, (size_t)len);
  g_paths[slot][len] = '\0';
  __atomic_store_n(&g_armed[slot], 1, __ATOMIC_RELEASE);
  return TP_OK;
}

tp_status tp_cleanup_disarm(int32_t slot) {
  if (slot < 0 || slot >= TP_CLEANUP_SLOTS) return TP_ERR_ARG;
  __atomic_store_n(&g_armed[slot], 0, __ATOMIC_RELEASE);
  return TP_OK;
}
