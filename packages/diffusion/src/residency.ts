/**
 * Weight placement for sampling under a device memory budget (`--vram-budget N|min`): a dry run of one
 * sampling step with every weight streamed counts the working peak through the backend's accounting,
 * @tp/tensor's {@link planResidency} decides which weights stay resident, and the budget is then set on
 * the backend's account, so any allocation past it during the run is E_OOM naming the budget.
 *
 * Streamed weights are copied from the mapping into a per-op device buffer that the backend frees when
 * the op returns (one weight in flight); resident ones are uploaded once (the backend's `makeResident`, see {@link WeightResidency}).
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
} from "@tp/tensor";

/** A placement in force: its plan and how to undo it. */
export interface Placement {
  readonly plan: ResidencyPlan;
  /** The weights that stay resident (plan.resident, as weights). */
  readonly resident: readonly Weight[];
  /** Evict the resident weights (the budget stays until {@link restore}). */
  evict(): void;
  /** Evict, and put the backend's budget back as it was. */
  restore(): void;
}

/**
 * Count a step's working peak with `dryRun` (nothing resident), plan, set the budget, upload the
 * resident weights.
 * @param weights the weights of one step in order of use
 * @param dryRun  one sampling step exactly as the run will do it, freeing what it makes
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
): Promise<Placement> {
  const residency = weightResidency(b);
  if (residency === null) {
    throw new TpError(
      "E_UNSUPPORTED",
      `${flag}: backend ${b.name} reads weights from their mapping (nothing is uploaded); the budget applies to device backends such as vulkan`,
    );
  }
  for (const { weight } of weights) residency.evict(weight); // a weight made resident elsewhere would skew the count
  const end = b.memory.peakWindow();
  let workingPeak: number;
  try {
    await dryRun();
  } finally {
    workingPeak = end();
  }
  const plan = planResidency({
    budget,
    weights: weights.map((w) => ({ name: w.name, bytes: residentBytesOf(w.weight) })),
    workingPeak,
    flag,
  });
  const previous = b.memory.budget;
  const resident = plan.resident.map((i) => (weights[i] as { weight: Weight }).weight);
  const evict = () => {
    for (const w of resident) residency.evict(w);
  };
  const restore = () => {
    evict();
    b.memory.setBudget(previous);
  };
  // The tighter of the two budgets holds.
  b.memory.setBudget(previous === null ? plan.budget : Math.min(previous, plan.budget));
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
