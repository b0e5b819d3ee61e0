/**
 * Weight placement for sampling under a device memory budget (`--vram-budget N|min`): a dry run of one
 * sampling step with every weight streamed counts the working peak through the backend's accounting,
 * @tp/tensor's {@link planResidency} decides which weights stay resident, and the budget is then set on
 * the backend's account, so any allocation past it during the run is E_OOM naming the budget.
 *
 * Streamed weights are copied from the mapping into a ring of two device buffers where the backend has
 * one ({@link WeightStreaming}: the copy of one weight overlaps the work on the one before, two weights
 * in flight), else into a per-op buffer freed when the op returns; resident ones are uploaded once (the
 * backend's `makeResident`, see {@link WeightResidency}). The ring is sized for the largest weight in the
 * dry run and for the largest streamed one after planning (never larger, so the peak stays within the
 * plan). What runs after sampling (the VAE decode) is counted by a second dry run with the DiT's
 * weights evicted and the ring freed, and the budget must cover it as well.
 *
 * Source: ../shared/ARCHITECTURE.md "Weights and memory"; issue 26.
 */
import {
  type Backend,
  planResidency,
  type ResidencyPlan,
  residentBytesOf,
  TpError,
  type VramBudget,
  type Weight,
  weightResidency,
  weightStreaming,
} from "@tp/tensor";

/** Slots of the stream ring: double buffering (one weight uploads while the one before computes). */
export const STREAM_RING_SLOTS = 2;

/** The ring slot that holds any of `weights`: the largest data and the largest row scales, in bytes. */
function slotFor(weights: readonly Weight[]): { data: number; scale: number } {
  let data = 0;
  let scale = 0;
  for (const w of weights) {
    data = Math.max(data, w.data.byteLength);
    if (w.scale?.kind === "row") scale = Math.max(scale, w.scale.values.byteLength);
  }
  return { data, scale };
}

/** A placement in force: its plan and how to undo it. */
export interface Placement {
  readonly plan: ResidencyPlan;
  /** The weights that stay resident (plan.resident, as weights). */
  readonly resident: readonly Weight[];
  /** Evict the resident weights and free the stream ring (the budget stays until {@link restore}). */
  evict(): void;
  /** Evict, and put the backend's budget back as it was. */
  restore(): void;
}

/**
 * Count a step's working peak with `dryRun` (nothing resident), plan, set the budget, upload the
 * resident weights.
 * @param weights the weights of one step in order of use
 * @param dryRun  one sampling step exactly as the run will do it, freeing what it makes
 * @param dryLater what runs after sampling (the VAE decode) exactly as the run will do it, freeing what
 *   it makes; run with every weight evicted and no ring
 * @param counted the peaks an earlier placement of the same step counted (its plan's workingPeak and
 *   laterPeak): no dry run then
 * @throws TpError E_UNSUPPORTED on a backend that reads weights from the mapping (no makeResident);
 *   E_OOM when the budget is below what a step needs with every weight streamed (the bytes named)
 *   or below the backend's own budget's use; E_STATE when the uploads reserve other bytes than planned
 */
export async function placeWeights(
  b: Backend,
  weights: readonly { readonly name: string; readonly weight: Weight }[],
  budget: VramBudget,
  dryRun: () => Promise<void>,
  flag = "--vram-budget",
  dryLater?: () => Promise<void>,
  counted?: { readonly workingPeak: number; readonly laterPeak: number },
): Promise<Placement> {
  const residency = weightResidency(b);
  if (residency === null) {
    throw new TpError(
      "E_UNSUPPORTED",
      `${flag}: backend ${b.name} reads weights from their mapping (nothing is uploaded); the budget applies to device backends such as vulkan`,
    );
  }
  for (const { weight } of weights) residency.evict(weight); // a weight made resident elsewhere would skew the count
  const streaming = weightStreaming(b);
  const setRing = (ws: readonly Weight[]) => {
    const slot = slotFor(ws);
    streaming?.setStreamRing(ws.length === 0 ? 0 : STREAM_RING_SLOTS, slot.data, slot.scale);
  };
  const count = async (run: () => Promise<void>): Promise<number> => {
    const end = b.memory.peakWindow();
    try {
      await run();
    } finally {
      end();
    }
    return end();
  };
  let workingPeak: number;
  let laterPeak = 0;
  try {
    if (counted !== undefined) {
      workingPeak = counted.workingPeak;
      laterPeak = counted.laterPeak;
    } else {
      if (dryLater !== undefined) laterPeak = await count(dryLater);
      // The ring for every weight streamed: what min needs; planning can only shrink it.
      setRing(weights.map((w) => w.weight));
      workingPeak = await count(dryRun);
    }
  } catch (e) {
    streaming?.setStreamRing(0, 0, 0);
    throw e;
  }
  let plan: ResidencyPlan;
  try {
    plan = planResidency({
      budget,
      weights: weights.map((w) => ({ name: w.name, bytes: residentBytesOf(w.weight) })),
      workingPeak,
      laterPeak,
      flag,
    });
  } catch (e) {
    streaming?.setStreamRing(0, 0, 0);
    throw e;
  }
  const previous = b.memory.budget;
  const resident = plan.resident.map((i) => (weights[i] as { weight: Weight }).weight);
  const evict = () => {
    for (const w of resident) residency.evict(w);
    streaming?.setStreamRing(0, 0, 0);
  };
  const restore = () => {
    evict();
    b.memory.setBudget(previous);
  };
  // The tighter of the two budgets holds.
  b.memory.setBudget(previous === null ? plan.budget : Math.min(previous, plan.budget));
  try {
    // The ring for the streamed weights only (none: no ring), before the resident uploads.
    setRing(plan.streamed.map((i) => (weights[i] as { weight: Weight }).weight));
  } catch (e) {
    restore();
    throw e;
  }
  const before = b.memory.current;
  try {
    for (const w of resident) residency.makeResident(w);
    if (b.memory.current - before !== plan.residentBytes) {
      throw new TpError(
        "E_STATE",
        `${flag}: backend ${b.name} reserved ${b.memory.current - before} bytes for ${resident.length} resident weights, the plan ${plan.residentBytes}`,
      );
    }
  } catch (e) {
    restore();
    throw e;
  }
  return { plan, resident, evict, restore };
}
