/**
 * Memory accounting: how many bytes a backend holds now and at most, under an optional budget.
 * Every backend owns one {@link MemoryAccount}; allocations reserve before they allocate, so a budget is
 * enforced before memory is touched, and the CLIs report the peak at the end of a run.
 *
 * Source: ../shared/ARCHITECTURE.md, "Weights and memory" (budgets, peak reporting).
 */

import { readFileSync } from "node:fs";
import { TpError } from "./errors.ts";

/** A snapshot of an account, in bytes. */
export interface MemoryStats {
  /** The account's owner, e.g. the backend name `"cpu"`. */
  readonly owner: string;
  /** Bytes reserved now. */
  readonly current: number;
  /** Most bytes reserved at once since creation or the last `resetPeak`. */
  readonly peak: number;
  /** Budget in bytes, or null for none. */
  readonly budget: number | null;
  /** Live reservations. */
  readonly allocations: number;
}

/** Bytes as people read them: `"1.50 GiB"`, `"512 B"`. */
export function formatBytes(bytes: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = bytes;
  let u = 0;
  while (Math.abs(v) >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return u === 0 ? `${v} B` : `${v.toFixed(2)} ${units[u]}`;
}

/**
 * Current and peak bytes of one owner, with an optional budget.
 *
 * @example
 * const m = new MemoryAccount("cpu", 1 << 30);
 * m.reserve(4096, "activations");  // throws E_OOM past 1 GiB
 * m.release(4096);
 */
export class MemoryAccount {
  readonly owner: string;
  #budget: number | null;
  #current = 0;
  #peak = 0;
  #allocations = 0;
  #windows = new Set<{ peak: number }>();

  /**
   * @param owner  name used in messages (a backend name)
   * @param budget bytes allowed at once, or null for no limit
   * @throws TpError E_ARG for a negative or non-integer budget
   */
  constructor(owner: string, budget: number | null = null) {
    this.owner = owner;
    this.#budget = MemoryAccount.#checkBudget(budget);
  }

  static #checkBudget(budget: number | null): number | null {
    if (budget !== null && (!Number.isSafeInteger(budget) || budget < 0)) {
      throw new TpError("E_ARG", `memory budget must be a non-negative whole number of bytes, got ${budget}`);
    }
    return budget;
  }

  /** Bytes reserved now. */
  get current(): number {
    return this.#current;
  }
  /** Peak bytes reserved at once. */
  get peak(): number {
    return this.#peak;
  }
  /** The budget in bytes, or null. */
  get budget(): number | null {
    return this.#budget;
  }

  /** Change the budget (null removes it). Does not free anything. @throws TpError E_ARG */
  setBudget(budget: number | null): void {
    this.#budget = MemoryAccount.#checkBudget(budget);
  }

  /** True when `bytes` more would fit in the budget. */
  fits(bytes: number): boolean {
    return this.#budget === null || this.#current + bytes <= this.#budget;
  }

  /**
   * Check that `bytes` more fit in the budget, without reserving them (call before allocating; then
   * {@link reserve} once the allocation succeeded, so a failed allocation never counts).
   * @param what what the bytes are for, named in the error (a tensor name, "scratch")
   * @throws TpError E_OOM when the budget would be exceeded, naming owner, request, use and budget;
   *   E_ARG for a negative or non-integer size.
   */
  check(bytes: number, what = "allocation"): void {
    if (!Number.isSafeInteger(bytes) || bytes < 0 || !Number.isSafeInteger(this.#current + bytes)) {
      throw new TpError("E_ARG", `${this.owner}: cannot reserve ${bytes} bytes for ${what}`);
    }
    if (!this.fits(bytes)) {
      throw new TpError(
        "E_OOM",
        `${this.owner}: ${what} needs ${formatBytes(bytes)} but ${formatBytes(this.#current)} of the ` +
          `${formatBytes(this.#budget as number)} budget is in use; raise the budget or free memory`,
      );
    }
  }

  /**
   * Reserve `bytes`: {@link check}, then count them in the current and peak use.
   * @throws TpError as {@link check}
   */
  reserve(bytes: number, what = "allocation"): void {
    this.check(bytes, what);
    this.#current += bytes;
    this.#allocations++;
    if (this.#current > this.#peak) this.#peak = this.#current;
    for (const w of this.#windows) if (this.#current > w.peak) w.peak = this.#current;
  }

  /**
   * Start measuring a peak without disturbing {@link stats}' overall peak (a dry run's working peak).
   * @returns a function that ends the window and returns the most bytes held at once while it was open
   *   (at least the use when it opened)
   */
  peakWindow(): () => number {
    const w = { peak: this.#current };
    this.#windows.add(w);
    return () => {
      this.#windows.delete(w);
      return w.peak;
    };
  }

  /**
   * Give back bytes reserved earlier.
   * @throws TpError E_ARG for a size that is not a non-negative integer; E_STATE when more is released
   *   than is reserved (a double free).
   */
  release(bytes: number): void {
    if (!Number.isSafeInteger(bytes) || bytes < 0) {
      throw new TpError("E_ARG", `${this.owner}: cannot release ${bytes} bytes`);
    }
    if (bytes > this.#current || this.#allocations === 0) {
      throw new TpError("E_STATE", `${this.owner}: release of ${bytes} bytes with ${this.#current} reserved`);
    }
    this.#current -= bytes;
    this.#allocations--;
  }

  /** Start a new peak measurement from the current use. */
  resetPeak(): void {
    this.#peak = this.#current;
  }

  /** A plain-object snapshot. */
  stats(): MemoryStats {
    return {
      owner: this.owner,
      current: this.#current,
      peak: this.#peak,
      budget: this.#budget,
      allocations: this.#allocations,
    };
  }
}

/**
 * This process's peak resident set size in bytes: its own address space's high-water mark (VmHWM of
 * /proc/self/status, proc(5)), else getrusage's ru_maxrss where /proc is absent. Not ru_maxrss on
 * Linux: the kernel carries a parent's peak across fork + exec into it, so a CLI started by a large
 * process (a test runner, a server) would report the parent's peak as its own.
 */
export function peakRssBytes(): number {
  try {
    const m = /^VmHWM:\s+(\d+) kB$/m.exec(readFileSync("/proc/self/status", "utf8"));
    if (m !== null) return Number(m[1]) * 1024;
  } catch {
    // no /proc: fall through
  }
  return process.resourceUsage().maxRSS * 1024;
}
