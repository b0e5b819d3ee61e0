/**
 * `bun run bench spec`: greedy generation speed with speculative decoding (src/speculative.ts) against
 * vanilla decoding, in one run: the n-gram (prompt lookup) drafter and a draft model — the target's
 * own Q4_0 copy, written with the project's GGUF writer and quantizer (src/testing/block-types.ts
 * `rewriteGguf`) under TP_BENCH_DIR — each on two workloads, a story prompt and a repetitive listing,
 * for two targets: (a) the real trained stories260K (../shared/models/real, f32), tg256; (b) the
 * Qwen3-0.6B-shaped random model of the llm bench (./model.ts, Q8_0), tg128 with 3 runs (a decode step
 * is ~100× dearer on 2 cores). Each side is one in-process `GenerationSession.generate` of TG tokens
 * (the same ids: greedy speculation is lossless, checked on every run); the peer is vanilla, so
 * ratio = speed-up. Acceptance rate and tokens per verify step are rows of their own (from the last
 * run). Default settings (draft-max 16, adaptive: src/draft-policy.ts), 2 CPU threads
 * (TP_BENCH_THREADS).
 *
 * Targets (issue 27): ≥ 1.3× vanilla on the repetitive workload with n-gram; never below 0.95× on any
 * workload with the default settings.
 *
 * What the draft-model rows measure: stories260K's Q4_0 copy agrees with it but one forward of either
 * costs about the same (both are dispatch-bound at 260 K parameters), and the random 0.6B's Q4_0 copy
 * (about 0.55× a Q8_0 step) never reaches --draft-p-min 0.75 (a random model's top probability is
 * tiny; with p-min 0 it agrees on 5% of drafts). So neither pays, and these rows measure the cost
 * rule's fall-back to vanilla: one probe, whose price is the draft's prefill of the prompt.
 */
import { existsSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join, resolve } from "node:path";
import { createBackend } from "@tp/backend-cpu";
import { TpError } from "@tp/tensor";
import { GenerationSession } from "../src/generate.ts";
import { type LoadedModel, loadModel } from "../src/load.ts";
import { type Drafter, DraftModelDrafter, NgramDrafter, type SpeculativeStats } from "../src/speculative.ts";
import { rewriteGguf } from "../src/testing/block-types.ts";
import { benchModel, TOKENIZER_SOURCE } from "./model.ts";

const THREADS = Number(process.env.TP_BENCH_THREADS ?? 2);
const STORIES = resolve(import.meta.dir, "../../../../shared/models/real/stories260K-f32-v3.gguf");
const BENCH_DIR = join(process.env.TP_BENCH_DIR ?? tmpdir(), "tensorpencil-bench");

/** A target of the bench: how to find its file (null: absent, the target is skipped), tokens, runs. */
interface Target {
  name: string;
  /** The target's GGUF path, building it when needed; null when its inputs are absent. */
  path: () => string | null;
  /** Why it is skipped when `path` gives null. */
  absent: string;
  tg: number;
  runs: number;
}

const TARGETS: Target[] = [
  {
    name: "stories260K",
    path: () => (existsSync(STORIES) ? STORIES : null),
    absent: STORIES,
    tg: 256,
    runs: 5,
  },
  {
    name: "qwen3-0.6b-shapes Q8_0",
    path: () => benchModel("Q8_0"),
    absent: TOKENIZER_SOURCE,
    tg: 128,
    runs: 3,
  },
];

const WORKLOADS = [
  { name: "story", prompt: "Once upon a time, there was a little girl named Lily. She" },
  {
    name: "listing",
    prompt:
      "Tom had a red ball, a blue ball, a green ball. Tom had a red ball, a blue ball, a green ball. Tom had a red ball,",
  },
];

let backend: ReturnType<typeof createBackend> | undefined;
/** Loaded pairs by target name; one pair is held at a time (the 0.6B pair is ~1 GB). */
let loaded: { name: string; target: LoadedModel; draft: LoadedModel } | undefined;

function release(): void {
  loaded?.draft.model.dispose();
  loaded?.target.model.dispose();
  loaded = undefined;
}

/** The target and its Q4_0 copy (written once beside the bench models), on a 2-thread CPU backend. */
function models(t: Target, path: string): { target: LoadedModel; draft: LoadedModel } {
  if (loaded?.name === t.name) return loaded;
  release();
  mkdirSync(BENCH_DIR, { recursive: true });
  const q4 = join(BENCH_DIR, `${basename(path, ".gguf")}.as-Q4_0.gguf`);
  if (!existsSync(q4)) rewriteGguf(path, q4, "Q4_0");
  backend ??= createBackend({ threads: THREADS });
  loaded = {
    name: t.name,
    target: loadModel(path, { backend, maxContext: 512 }),
    draft: loadModel(q4, { backend, maxContext: 512 }),
  };
  return loaded;
}

export default {
  description:
    `speculative decoding on stories260K (real weights, tg256) and the Qwen3-0.6B-shaped random model (Q8_0, tg128), greedy tok/s at ${THREADS} threads: n-gram and ` +
    "the target's Q4_0 copy as draft model vs vanilla decoding (the peer); ratio = speed-up",
  usage:
    "  TP_BENCH_THREADS  threads (default 2)\n  TP_BENCH_DIR      where the Q4_0 drafts (and the 0.6B model) are written",
  cases() {
    const vanillaIds = new Map<string, number[]>();
    const run = async (
      t: Target,
      path: string,
      prompt: string,
      drafter?: (m: { target: LoadedModel; draft: LoadedModel }) => Drafter,
    ): Promise<{ tps: number; stats?: SpeculativeStats }> => {
      const pair = models(t, path);
      const ids = pair.target.tokenizer.encode(prompt, { addSpecial: true });
      const s = new GenerationSession(pair.target.model, pair.target.tokenizer, { seed: 1 });
      const d = drafter?.(pair);
      const r = await s.generate(ids, {
        maxNewTokens: t.tg,
        stopIds: [],
        ...(d === undefined ? {} : { speculative: { drafter: d } }),
      });
      const key = `${t.name}\n${prompt}`;
      if (d === undefined) vanillaIds.set(key, r.ids);
      else {
        const want = vanillaIds.get(key);
        if (want !== undefined && want.join(",") !== r.ids.join(","))
          throw new TpError(
            "E_INTERNAL",
            `speculative (${d.kind}) ids differ from vanilla on ${t.name} '${prompt}'`,
          );
      }
      return {
        tps: r.ids.length / r.genSeconds,
        ...(r.speculative === undefined ? {} : { stats: r.speculative }),
      };
    };
    const drafters: { name: string; make: (m: { target: LoadedModel; draft: LoadedModel }) => Drafter }[] = [
      { name: "ngram", make: () => new NgramDrafter() },
      {
        name: "draft Q4_0",
        make: ({ target: t, draft: d }) => new DraftModelDrafter(d.model, t, { draftTokenizer: d.tokenizer }),
      },
    ];
    return TARGETS.flatMap((t) => {
      const path = t.path();
      if (path === null) {
        console.error(
          `skipped ${t.name}: ${t.absent} is absent (the shared models folder is not beside this checkout)`,
        );
        return [];
      }
      return WORKLOADS.flatMap((w) =>
        drafters.flatMap(({ name, make }) => {
          let last: SpeculativeStats | undefined;
          const label = `${t.name} ${w.name} ${name}`;
          return [
            {
              case: label,
              metric: `tg${t.tg} greedy`,
              unit: "tok/s",
              better: "higher" as const,
              runs: t.runs,
              ours: async () => {
                const r = await run(t, path, w.prompt, make);
                last = r.stats;
                return r.tps;
              },
              peer: { name: "vanilla", run: async () => (await run(t, path, w.prompt)).tps },
            },
            {
              case: `${label} acceptance`,
              metric: "accepted / drafted (last run)",
              unit: "%",
              better: "higher" as const,
              timed: false,
              ours: () => 100 * (last?.acceptanceRate ?? 0),
            },
            {
              case: `${label} tokens per verify`,
              metric: "(accepted + verify steps) / verify steps (last run)",
              unit: "tok",
              better: "higher" as const,
              timed: false,
              ours: () => last?.tokensPerStep ?? 0,
            },
          ];
        }),
      );
    });
  },
  teardown() {
    release();
    backend?.dispose();
  },
};
