/**
 * The native SIGINT / SIGTERM handler of libtp_cpu.so (native/cpu/interrupt.c), in the shape
 * @tp/formats' `installInterruptCleanup` takes: it removes the armed temporary files, prints one line
 * and exits 128 + the signal number at once, even while JavaScript runs a long synchronous stage.
 * Every path and slot is checked here before it crosses bun:ffi.
 */
import { ptr } from "bun:ffi";
import { TpError } from "@tp/tensor";
import { loadCpuLibrary } from "./ffi.ts";
import { CLEANUP, TP_STATUS } from "./symbols.ts";

/** What {@link nativeInterruptHandler} returns (structurally @tp/formats' `NativeInterruptHandler`). */
export interface NativeInterruptCleanup {
  install(signal: "SIGINT" | "SIGTERM"): void;
  arm(path: string): number | null;
  disarm(slot: number): void;
}

const SIGNALS = { SIGINT: 2, SIGTERM: 15 } as const;

/**
 * The native interrupt handler, or null when libtp_cpu.so is not built or cannot be loaded here (the
 * caller falls back to JavaScript handlers).
 * `arm(path)` returns the slot, or null when all {@link CLEANUP} `.slots` are taken or the path is
 * longer than `.path_bytes - 1` UTF-8 bytes (that file is then removed only by the next run's stale
 * cleanup).
 * @throws TpError E_INTERNAL when the library refuses a signal handler (sigaction failed)
 */
export function nativeInterruptHandler(): NativeInterruptCleanup | null {
  let raw: ReturnType<typeof loadCpuLibrary>["raw"];
  try {
    raw = loadCpuLibrary().raw;
  } catch {
    return null;
  }
  const free: number[] = Array.from({ length: CLEANUP.slots }, (_, i) => CLEANUP.slots - 1 - i);
  return {
    install(signal) {
      const status = raw.tp_cleanup_install(SIGNALS[signal]);
      if (status !== TP_STATUS.OK) {
        throw new TpError("E_INTERNAL", `cannot install the ${signal} handler (status ${status})`);
      }
    },
    arm(path) {
      const bytes = new TextEncoder().encode(path);
      if (bytes.length === 0 || bytes.length >= CLEANUP.path_bytes || bytes.includes(0)) return null;
      const slot = free.pop();
      if (slot === undefined) return null;
      if (raw.tp_cleanup_arm(slot, ptr(bytes), bytes.length) !== TP_STATUS.OK) {
        free.push(slot);
        return null;
      }
      return slot;
    },
    disarm(slot) {
      if (!Number.isInteger(slot) || slot < 0 || slot >= CLEANUP.slots) return;
      raw.tp_cleanup_disarm(slot);
      free.push(slot);
    },
  };
}
