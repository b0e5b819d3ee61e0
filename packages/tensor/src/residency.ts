/**
 * The residency planner: which weights stay on the device and which are streamed from the mapping
 * each pass, under a device memory budget (`--vram-budget N|min`). One planner for every pipeline.
 *
 * The plan rests on one counted number, `workingPeak`: the most bytes the backend's account held during
 * a dry run of one pass with no weight resident (activations, scratch and the streamed weights'
 * per-op copies, plus whatever was already held). Making a weight resident adds its bytes for the whole
 * pass and removes its per-op copy, so at every instant the use is at most
 * `residentBytes + workingPeak`; the planner keeps that sum within the budget, and the backend's
 * account (which refuses an allocation past its budget with E_OOM) proves it during the run.
 *
 * `min` keeps no weight resident: every weight is streamed (through the backend's ring of two slots
 * where it has one, see {@link WeightStreaming}: two weights in flight), so the need is exactly
 * `workingPeak` (or the later phases' peak, the VAE decode, when that is larger).
 *
 * Source: ../shared/ARCHITECTURE.md "Weights and memory"; issue 26.
 */

import type { Backend } from "./backend.ts";
import { TpError } from "./errors.ts";
import { formatBytes } from "./memory.ts";
import type { Weight } from "./weight.ts";

/** A device memory budget: bytes, or `"min"` (the least the pass needs: nothing resident). */
export type VramBudget = number | "min";

/** One weight the planner places, in order of use. */
export interface PlannedWeight {
  /** Checkpoint name (for the plan's report). */
  readonly name: string;
  /** Bytes the backend reserves to keep it resident (data and scales). */
  readonly bytes: number;
}

/** What {@link planResidency} needs. */
export interface ResidencyInput {
  /** The budget. */
  readonly budget: VramBudget;
  /** The weights of one pass, in order of use; each is used once per pass. */
  readonly weights: readonly PlannedWeight[];
  /**
   * Peak bytes of the account during one pass with nothing resident (counted by a dry run through
   * the backend's accounting), including what was already held.
   */
  readonly workingPeak: number;
  /**
   * Peak bytes of the account during what runs after the passes with every weight evicted (the VAE
   * decode), counted by a dry run the same way; default 0. The budget must cover it too.
   */
  readonly laterPeak?: number;
  /** Flag or option named in errors; default `--vram-budget`. */
  readonly flag?: string;
}

/** A residency plan. Byte counts are exact (the account's units). */
export interface ResidencyPlan {
  /** The budget in bytes (for `min`: {@link minBytes}). */
  readonly budget: number;
  /** Whether the budget was `min`. */
  readonly min: boolean;
  /** The least budget that works: the larger of the working peak and the later peak. */
  readonly minBytes: number;
  /** {@link ResidencyInput.workingPeak}: a pass with nothing resident. */
  readonly workingPeak: number;
  /** {@link ResidencyInput.laterPeak} (0 when not given). */
  readonly laterPeak: number;
  /** Indices into the input weights that stay resident. */
  readonly resident: readonly number[];
  /** Indices into the input weights that are streamed each pass. */
  readonly streamed: readonly number[];
  readonly residentBytes: number;
  /** Bytes copied from the mapping to the device per pass (the streamed weights, once each). */
  readonly streamedBytesPerPass: number;
  /** Upper bound of the peak: max(residentBytes + workingPeak, laterPeak) ≤ budget. */
  readonly expectedPeak: number;
}

/**
 * Bytes a backend reserves to keep `w` resident: its data (1 byte for an empty weight, which still
 * gets a buffer) plus ConvRot's f32 row scales.
 */
export function residentBytesOf(w: Weight): number {
  const data = Math.max(1, w.data.byteLength);
  return w.scale?.kind === "row" ? data + w.scale.values.byteLength : data;
}

/**
 * Decide which weights stay resident: first-fit in order of use into `budget − workingPeak`.
 * @returns the plan (indices into `weights`)
 * @throws TpError E_OOM when the budget is below `workingPeak` (what `min` needs), naming the flag, the
 *   budget and the bytes needed; E_ARG for a negative or non-integer byte count
 */
export function planResidency(input: ResidencyInput): ResidencyPlan {
  const flag = input.flag ?? "--vram-budget";
  const whole = (v: number, what: string) => {
    if (!Number.isSafeInteger(v) || v < 0)
      throw new TpError("E_ARG", `${flag}: ${what} must be a non-negative whole number of bytes, got ${v}`);
  };
  whole(input.workingPeak, "the working peak");
  const laterPeak = input.laterPeak ?? 0;
  whole(laterPeak, "the later peak");
  for (const w of input.weights) whole(w.bytes, `the size of weight ${w.name}`);
  const need = Math.max(input.workingPeak, laterPeak);
  const min = input.budget === "min";
  const budget = min ? need : (input.budget as number);
  if (!min) whole(budget, "the budget");
  if (budget < need) {
    const what =
      input.workingPeak >= laterPeak
        ? "one step needs with every weight streamed (activations, scratch, the streamed weights in flight"
        : "the decode after sampling needs (its activations and weights with the DiT's evicted";
    throw new TpError(
      "E_OOM",
      `${flag} ${formatBytes(budget)} (${budget} bytes) is below the ${formatBytes(need)} ` +
        `(${need} bytes) ${what}, as counted by a dry run); raise it to at least ${need} bytes or use min`,
    );
  }
  let room = budget - input.workingPeak;
  const resident: number[] = [];
  const streamed: number[] = [];
  let residentBytes = 0;
  let streamedBytes = 0;
  input.weights.forEach((w, i) => {
    if (!min && w.bytes <= room) {
      room -= w.bytes;
      residentBytes += w.bytes;
      resident.push(i);
    } else {
      streamedBytes += w.bytes;
      streamed.push(i);
    }
  });
  return {
    budget,
    min,
    minBytes: need,
    workingPeak: input.workingPeak,
    laterPeak,
    resident,
    streamed,
    residentBytes,
    streamedBytesPerPass: streamedBytes,
    expectedPeak: Math.max(residentBytes + input.workingPeak, laterPeak),
  };
}

const MIB = 1024 * 1024;

/**
 * One line for `--verbose`: budget, resident MiB (count), streamed MiB per pass (count), expected peak.
 * @param passes passes per step (2 with classifier-free guidance), for the transfer per step
 */
export function describeResidencyPlan(plan: ResidencyPlan, passes = 1): string {
  const mib = (b: number) => `${(b / MIB).toFixed(2)} MiB`;
  return (
    `residency: budget ${plan.min ? "min = " : ""}${mib(plan.budget)}; ${plan.resident.length} weights ` +
    `resident (${mib(plan.residentBytes)}), ${plan.streamed.length} streamed (${mib(plan.streamedBytesPerPass * passes)} ` +
    `uploaded per step); working peak ${mib(plan.workingPeak)}` +
    (plan.laterPeak > 0 ? `, decode peak ${mib(plan.laterPeak)}` : "") +
    `, expected peak ≤ ${mib(plan.expectedPeak)}`
  );
}

const UNITS: Record<string, number> = {
  "": 1,
  b: 1,
  k: 1024,
  kb: 1000,
  kib: 1024,
  m: MIB,
  mb: 1e6,
  mib: MIB,
  g: 1024 * MIB,
  gb: 1e9,
  gib: 1024 * MIB,
  t: 1024 * 1024 * MIB,
  tb: 1e12,
  tib: 1024 * 1024 * MIB,
};

/**
 * Parse a size flag: bytes (`1048576`), or a number with a unit (`512MiB`, `1.5G`, `800MB`, `1TiB`;
 * K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB of 1000). A fraction needs a unit (a
 * byte count is whole); a fractional size is rounded down to whole bytes.
 * @returns bytes, a safe integer ≥ 0
 * @throws TpError E_ARG naming the flag for anything else (`what` is the accepted forms in the message)
 */
export function parseByteSize(text: string, flag: string, what = "a size"): number {
  const s = text.trim().toLowerCase();
  const m = /^(\d+(?:\.\d+)?)\s*([a-z]*)$/.exec(s);
  const unit = m ? UNITS[m[2] as string] : undefined;
  if (!m || unit === undefined || (unit === 1 && (m[1] as string).includes("."))) {
    throw new TpError("E_ARG", `${flag} takes ${what} such as 2GiB, 512M or 1048576 bytes, got '${text}'`);
  }
  const bytes = Math.floor(Number(m[1]) * unit);
  if (!Number.isSafeInteger(bytes)) throw new TpError("E_ARG", `${flag}: '${text}' is too large`);
  return bytes;
}

/**
 * Parse a budget flag: `min`, or a size as {@link parseByteSize} reads it.
 * @throws TpError E_ARG naming the flag for anything else
 */
export function parseVramBudget(text: string, flag = "--vram-budget"): VramBudget {
  if (text.trim().toLowerCase() === "min") return "min";
  return parseByteSize(text, flag, "min or a size");
}

/**
 * What a device backend offers for placement: upload a weight once and keep it (accounted in its
 * `memory`) until `evict`; without it, ops copy the weight from its mapping per call (streaming).
 */
export interface WeightResidency {
  /** @throws TpError E_OOM over the budget */
  makeResident(w: Weight): void;
  /** Free the copy (no-op when not resident). */
  evict(w: Weight): void;
}

/** Uploads of streamed weights through a {@link WeightStreaming} ring since the backend started. */
export interface StreamStats {
  /** Weights uploaded into a ring slot. */
  readonly uploads: number;
  /** Their bytes (data and row scales). */
  readonly bytes: number;
}

/**
 * Overlapped streaming a device backend may offer: a ring of `slots` device buffers (accounted in its
 * `memory`) that streamed weights are uploaded into in turn, each upload waiting only for the work that
 * read the slot last, so that the upload of one weight overlaps the work on the one before it (double
 * buffering with 2 slots). Without a ring, each op copies its weight into a buffer of its own.
 */
export interface WeightStreaming {
  /**
   * Reserve the ring: `slots` slots, each holding any weight of at most `dataBytes` bytes of data and
   * `scaleBytes` bytes of row scales; `slots` 0 frees it. A weight that does not fit a slot is copied per op.
   * @throws TpError E_OOM over the budget; E_ARG for a bad count
   */
  setStreamRing(slots: number, dataBytes: number, scaleBytes: number): void;
  /** Bytes the ring holds now (0 without one). */
  readonly streamRingBytes: number;
  /** Uploads through the ring so far. */
  readonly streamStats: StreamStats;
}

/** `b`'s {@link WeightStreaming}, or null where it has none. */
export function weightStreaming(b: Backend): WeightStreaming | null {
  const r = b as Partial<WeightStreaming>;
  return typeof r.setStreamRing === "function" ? (b as unknown as WeightStreaming) : null;
}

/** The device memory a backend reports it may use ({@link DeviceMemoryInfo}). */
export interface DeviceMemoryInfo {
  /** Bytes free for this process: the device's budget less its usage, or the heap size without a report. */
  readonly freeBytes: number;
  /** Size of the device memory heaps. */
  readonly totalBytes: number;
  /** Where freeBytes comes from, e.g. "VK_EXT_memory_budget" or "heap size (no VK_EXT_memory_budget)". */
  readonly source: string;
  /** True when freeBytes is the device's own report of free memory (false: the heap size, a guess). */
  readonly reported: boolean;
}

/** A device backend that reports its free memory. */
export interface DeviceMemoryReport {
  deviceMemory(): DeviceMemoryInfo;
}

/**
 * The default `--vram-budget`: what the backend holds now plus the device's free memory, less a margin
 * of `marginFraction` of the heap (at least `minMarginBytes`) for the driver, other processes and what
 * the device reports late. Null on a backend that reports no device memory (cpu).
 * @returns the budget in bytes (never below what the backend holds now) and a line saying where it comes from
 */
export function defaultVramBudget(
  b: Backend,
  marginFraction = 0.1,
  minMarginBytes = 256 * MIB,
): { bytes: number; note: string } | null {
  const r = b as Partial<DeviceMemoryReport>;
  if (typeof r.deviceMemory !== "function") return null;
  const m = (b as unknown as DeviceMemoryReport).deviceMemory();
  const margin = Math.max(minMarginBytes, Math.floor(m.totalBytes * marginFraction));
  const bytes = b.memory.current + Math.max(0, m.freeBytes - margin);
  const mib = (x: number) => `${(x / MIB).toFixed(0)} MiB`;
  return {
    bytes,
    note:
      `default --vram-budget ${mib(bytes)}: ${mib(m.freeBytes)} free of ${mib(m.totalBytes)} (${m.source}) ` +
      `less a margin of ${mib(margin)} (max(${Math.round(marginFraction * 100)}% of the heap, ${mib(minMarginBytes)}))` +
      (m.reported
        ? ""
        : "; the device does not report its free memory, so memory other processes hold is not seen"),
  };
}

/** `b`'s {@link WeightResidency}, or null where ops read weights from the mapping directly (cpu). */
export function weightResidency(b: Backend): WeightResidency | null {
  const r = b as Partial<WeightResidency>;
  return typeof r.makeResident === "function" && typeof r.evict === "function"
    ? (b as unknown as WeightResidency)
    : null;
}
