/**
 * `bun run bench memory`: seconds per sampling step of the real-shape Krea 2 DiT on the Vulkan backend
 * under `--vram-budget` (issue 26, "Bench"): full residency, then budgets that keep 50 %, 25 % and 10 %
 * of the weights' bytes resident above what `min` needs, and `min` (every weight streamed through the
 * ring of two slots). The peer column is the full-residency step (ratio = full / budgeted: 1 means the
 * streaming costs nothing). Beside each budget: the bytes uploaded per step (measured by the backend's
 * ring counter, checked against the plan) and the account's peak against the budget.
 *
 * - Model: random weights in the real Krea 2 layout (features 6144, 48 / 12 heads of 128, SwiGLU
 *   16384, text fusion 12 taps × 2560; krea2.md §1.3, §3.1), INT8 ConvRot (the 8 linears of every
 *   block; the rest BF16), with MEMORY_BENCH_BLOCKS blocks (default 1, not the real 28: llvmpipe on a
 *   few cores takes tens of seconds per real-shape block, and its heap is 2 GiB), written once into
 *   $TMPDIR/tensorpencil-bench/krea2 (bench/checkpoints.ts's directory). Case names say the count.
 * - Step: one `Krea2Dit.forward` at 256×256 (256 image + 64 text tokens, σ = 0.5, no CFG), read back.
 *   The text side is a random [1, 64, 6144] tensor (encodeText's 12-tap bf16 text fusion takes minutes
 *   on llvmpipe and does not change the step's work). Each budget is placed by @tp/diffusion's
 *   `placeWeights`: the first (full residency) runs the dry step that counts the working peak, later
 *   ones reuse its counts; the placement is the harness's warm-up call, and the timed runs follow. Run it with
 *   `--reruns 0` on a loaded machine (a load above the cores flags every run).
 * - On llvmpipe the "device" is host memory: an upload is a memcpy on the calling thread while
 *   llvmpipe's threads compute the batch before it, so the overlap competes for the same cores. The
 *   figures that count for the copy engine come from a discrete GPU.
 */
import { existsSync, mkdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { createNativeQuantizer } from "@tp/backend-cpu";
import { createBackend, type VulkanBackend } from "@tp/backend-vulkan";
import { type ResidencyPlan, residentBytesOf, TpError, type VramBudget } from "@tp/tensor";
import { type Krea2Dit, loadKrea2 } from "../src/models/krea2.ts";
import { randn } from "../src/noise.ts";
import { type Placement, placeWeights } from "../src/residency.ts";
import { KREA2_CONFIG, writeRandomKrea2DitQuantized } from "../src/testing/random-checkpoints.ts";
import { CHECKPOINT_VERSION, checkpointDir } from "./checkpoints.ts";

/** scripts/bench-harness.ts's BenchCase (packages import no file outside them). */
interface BenchCase {
  case: string;
  metric: string;
  unit: string;
  better: "lower" | "higher";
  runs?: number;
  timed?: boolean;
  ours: () => number | Promise<number>;
  peer?: { name: string; run: () => number | Promise<number> };
}

const SIDE = 256;
const TEXT_TOKENS = 64;
const SIGMA = 0.5;
const RUNS = 2;
const MiB = 2 ** 20;

function blockCount(): number {
  const raw = process.env.MEMORY_BENCH_BLOCKS ?? "1";
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 1 || n > KREA2_CONFIG.layers) {
    throw new TpError(
      "E_ARG",
      `MEMORY_BENCH_BLOCKS must be an integer 1..${KREA2_CONFIG.layers}, got '${raw}'`,
    );
  }
  return n;
}

/** The N-block real-shape INT8 ConvRot checkpoint, written once. */
function checkpoint(blocks: number): string {
  const dir = checkpointDir();
  mkdirSync(dir, { recursive: true });
  const path = join(
    dir,
    `krea2-real-random-${CHECKPOINT_VERSION}-seed0-int8_convrot-${blocks}blocks.safetensors`,
  );
  if (existsSync(path)) return path;
  console.log(`writing ${path} (random weights, real Krea 2 shapes, ${blocks} blocks, int8_convrot) ...`);
  const quantizer = createNativeQuantizer();
  try {
    const r = writeRandomKrea2DitQuantized(
      path,
      { ...KREA2_CONFIG, layers: blocks },
      {
        format: "int8_convrot",
        quantizer,
        seed: 0,
      },
    );
    console.log(`  wrote ${(r.bytesOut / MiB).toFixed(0)} MiB in ${r.seconds.toFixed(0)} s`);
  } finally {
    quantizer.dispose();
  }
  return path;
}

/** A budget of the bench: full residency, min + a fraction of the weights' bytes, or min. */
interface Budget {
  readonly label: string;
  readonly budget: (minBytes: number, weightBytes: number) => VramBudget;
}

const BUDGETS: readonly Budget[] = [
  { label: "full residency", budget: () => Number.MAX_SAFE_INTEGER },
  ...[0.5, 0.25, 0.1].map((f) => ({
    label: `${f * 100}% (min + ${f * 100}% of the weights)`,
    budget: (minBytes: number, weightBytes: number) => minBytes + Math.floor(f * weightBytes),
  })),
  { label: "min (2 weights in flight)", budget: () => "min" as const },
];

const cleanups: (() => void)[] = [];
let summary = "";

export default {
  get description(): string {
    return (
      summary || "Krea 2 DiT s/step on the Vulkan backend under --vram-budget (real shapes, random weights)"
    );
  },
  usage:
    "  MEMORY_BENCH_BLOCKS=N   DiT blocks of the real-shape checkpoint (default 1; the real model has 28)",
  async cases(): Promise<BenchCase[]> {
    const blocks = blockCount();
    const path = checkpoint(blocks);
    const b = createBackend() as VulkanBackend;
    cleanups.push(() => b.dispose());
    const dit: Krea2Dit = loadKrea2(path, { backend: b, mode: "native" });
    cleanups.unshift(() => dit.dispose());
    // The text side's output [1, tokens, features] at random: its values do not change the step's
    // work, and encodeText (the bf16 text fusion, 12 taps) takes minutes on llvmpipe.
    const txtShape = [1, TEXT_TOKENS, KREA2_CONFIG.features];
    const txt = b.upload(randn(7, txtShape), txtShape, "f32");
    const l = SIDE / 8;
    const x = b.upload(randn(1, [1, 16, l, l]), [1, 16, l, l], "f32");
    cleanups.unshift(() => {
      for (const t of [x, txt]) if (!t.storage.freed) b.free(t);
    });
    const weights = dit.samplingWeights();
    const weightBytes = weights.reduce((s, w) => s + residentBytesOf(w.weight), 0);
    summary = [
      `vulkan: ${b.device}`,
      `Krea 2 DiT real shapes, ${blocks} of 28 blocks, INT8 ConvRot, ${(statSync(path).size / MiB).toFixed(0)} MiB file; ` +
        `${weights.length} sampling weights, ${(weightBytes / MiB).toFixed(0)} MiB`,
      `${SIDE}² (${(SIDE / 16) ** 2} img + ${TEXT_TOKENS} txt tokens), σ = ${SIGMA}`,
    ].join("; ");
    console.log(`# ${summary}`);

    const step = async (): Promise<number> => {
      const t0 = performance.now();
      const v = dit.forward(x, SIGMA, null, { txt });
      await b.read(v);
      const s = (performance.now() - t0) / 1000;
      b.free(v);
      return s;
    };
    // One placement at a time; the first (full residency) plan's min bytes set the fractions' base.
    let active: { label: string; placement: Placement } | null = null;
    let minBytes = 0;
    let counts: { workingPeak: number; laterPeak: number } | undefined;
    const results = new Map<string, { plan: ResidencyPlan; streamed: number[]; peak: number }>();
    /**
     * Place `budget`: the first placement runs the dry step (all weights streamed) and counts the peaks,
     * later ones reuse those counts (the same step). Returns the dry step's seconds (0 without one), or
     * null when `budget` is placed already.
     */
    const place = async (budget: Budget): Promise<number | null> => {
      if (active?.label === budget.label) return null;
      active?.placement.restore();
      active = null;
      let dryStep = 0;
      const p = await placeWeights(
        b,
        weights,
        budget.budget(minBytes, weightBytes),
        async () => {
          const t0 = performance.now();
          b.free(dit.forward(x, SIGMA, null, { txt }));
          await b.synchronize();
          dryStep = (performance.now() - t0) / 1000;
        },
        "--vram-budget",
        undefined,
        counts,
      );
      counts = { workingPeak: p.plan.workingPeak, laterPeak: p.plan.laterPeak };
      active = { label: budget.label, placement: p };
      minBytes = p.plan.minBytes; // the same for every budget (a step with every weight streamed)
      results.set(budget.label, { plan: p.plan, streamed: [], peak: 0 });
      const mib = (v: number) => `${(v / MiB).toFixed(1)} MiB`;
      console.log(
        `  ${budget.label}: budget ${mib(p.plan.budget)}, ${p.plan.resident.length} resident (${mib(p.plan.residentBytes)}), ` +
          `${p.plan.streamed.length} streamed (${mib(p.plan.streamedBytesPerPass)}/step), ring ${mib(b.streamRingBytes)}; ` +
          (dryStep > 0 ? `dry step (all streamed) ${dryStep.toFixed(1)} s` : "the first dry step's counts"),
      );
      return dryStep;
    };
    cleanups.unshift(() => {
      if (active !== null) (active as { placement: Placement }).placement.restore();
    });

    let fullSeconds = Number.NaN;
    const cases: BenchCase[] = [];
    const name = `Krea 2 DiT INT8 ConvRot ${SIDE}² (${blocks} of 28 real-shape blocks) on vulkan`;
    for (const budget of BUDGETS) {
      const full = budget === BUDGETS[0];
      const stepAt = async () => {
        // The first call is the harness's warm-up: the placement (with the first one's dry step)
        // stands in for it (on llvmpipe a real-shape step takes minutes).
        const dry = await place(budget);
        if (dry !== null) return dry;
        const r = results.get(budget.label) as { streamed: number[]; peak: number };
        const before = b.streamStats.bytes;
        const end = b.memory.peakWindow();
        const s = await step();
        r.peak = Math.max(r.peak, end());
        r.streamed.push(b.streamStats.bytes - before);
        if (full) fullSeconds = s;
        return s;
      };
      cases.push({
        case: `${name}, budget ${budget.label}`,
        metric: "s/step",
        unit: "s",
        better: "lower",
        runs: RUNS,
        ours: stepAt,
        peer: { name: "full residency (its last run)", run: () => fullSeconds },
      });
      cases.push({
        case: `${name}, budget ${budget.label}: uploaded per step (ring counter)`,
        metric: "transfer",
        unit: "MiB/step",
        better: "lower",
        timed: false,
        ours: () => {
          const r = results.get(budget.label);
          if (r === undefined) return Number.NaN;
          const want = r.plan.streamedBytesPerPass;
          if (r.streamed.some((v) => v !== want)) {
            throw new TpError(
              "E_STATE",
              `${budget.label}: the ring carried ${r.streamed.join(", ")} bytes per step, the plan ${want}`,
            );
          }
          return want / MiB;
        },
      });
      cases.push({
        case: `${name}, budget ${budget.label}: device memory peak vs budget`,
        metric: "peak",
        unit: "MiB",
        better: "lower",
        timed: false,
        ours: () => (results.get(budget.label)?.peak ?? Number.NaN) / MiB,
        peer: {
          name: "the budget (full: the plan's expected peak)",
          run: () => {
            const p = results.get(budget.label)?.plan;
            if (p === undefined) return Number.NaN;
            return (full ? p.expectedPeak : p.budget) / MiB;
          },
        },
      });
    }
    return cases;
  },
  teardown(): void {
    for (const c of cleanups) c();
  },
};
