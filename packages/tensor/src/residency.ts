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
 * `min` keeps no weight resident: each matmul streams its one weight (the backend frees the copy when
 * the op returns), so the need is exactly `workingPeak`.
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
  /** Flag or option named in errors; default `--vram-budget`. */
  readonly flag?: string;
}

/** A residency plan. Byte counts are exact (the account's units). */
export interface ResidencyPlan {
  /** The budget in bytes (for `min`: {@link minBytes}). */
  readonly budget: number;
  /** Whether the budget was `min`. */
  readonly min: boolean;
  /** The least budget that works: {@link ResidencyInput.workingPeak}. */
  readonly minBytes: number;
  /** Indices into the input weights that stay resident. */
  readonly resident: readonly number[];
  /** Indices into the input weights that are streamed each pass. */
  readonly streamed: readonly number[];
  readonly residentBytes: number;
  /** Bytes copied from the mapping to the device per pass (the streamed weights, once each). */
  readonly streamedBytesPerPass: number;
  /** Upper bound of the peak during a pass: residentBytes + workingPeak ≤ budget. */
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
  for (const w of input.weights) whole(w.bytes, `the size of weight ${w.name}`);
  const min = input.budget === "min";
  const budget = min ? input.workingPeak : (input.budget as number);
  if (!min) whole(budget, "the budget");
  if (budget < input.workingPeak) {
    throw new TpError(
      "E_OOM",
      `${flag} ${formatBytes(budget)} (${budget} bytes) is below the ${formatBytes(input.workingPeak)} ` +
        `(${input.workingPeak} bytes) one step needs with every weight streamed (activations, scratch, one ` +
        `weight in flight, as counted by a dry run); raise it to at least ${input.workingPeak} bytes or use min`,
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
    minBytes: input.workingPeak,
    resident,
    streamed,
    residentBytes,
    streamedBytesPerPass: streamedBytes,
    expectedPeak: residentBytes + input.workingPeak,
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
    `uploaded per step); working peak ${mib(plan.minBytes)}, expected peak ≤ ${mib(plan.expectedPeak)}`
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
};

/**
 * Parse a budget flag: `min`, or a size — bytes (`1048576`), or a number with a unit (`512MiB`, `1.5G`,
 * `800MB`; K/M/G and KiB/MiB/GiB are powers of 1024, KB/MB/GB of 1000).
 * @throws TpError E_ARG naming the flag for anything else
 */
export function parseVramBudget(text: string, flag = "--vram-budget"): VramBudget {
  const s = text.trim().toLowerCase();
  if (s === "min") return "min";
  const m = /^(\d+(?:\.\d+)?)\s*([a-z]*)$/.exec(s);
  const unit = m ? UNITS[m[2] as string] : undefined;
  if (!m || unit === undefined) {
    throw new TpError(
      "E_ARG",
      `${flag} takes min or a size such as 2GiB, 512M or 1048576 bytes, got '${text}'`,
    );
  }
  const bytes = Math.floor(Number(m[1]) * unit);
  if (!Number.isSafeInteger(bytes)) throw new TpError("E_ARG", `${flag}: '${text}' is too large`);
  return bytes;
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

/** `b`'s {@link WeightResidency}, or null where ops read weights from the mapping directly (cpu). */
export function weightResidency(b: Backend): WeightResidency | null {
  const r = b as Partial<WeightResidency>;
  return typeof r.makeResident === "function" && typeof r.evict === "function"
    ? (b as unknown as WeightResidency)
    : null;
}
