/**
 * Command-line flags of `bun apps/llm`, parsed with `node:util` `parseArgs` (as apps/cli does) and
 * checked: every bad value is a TpError E_ARG that names the flag, the value and the valid range.
 * Numbers are decimal (`0x10`, `Infinity` are refused); numeric flags take negative values as the next
 * argument (`--repeat-last-n -1`), which node's parseArgs alone would call ambiguous.
 * Flag names follow llama.cpp's `llama-cli` (`-n`, `--temp`, `--top-k`, `--top-p`, `--min-p`,
 * `--repeat-penalty`, `--seed`, `--ctx`, `--threads`); see ../shared/spec/llm.md §9.
 */
import { ARCHITECTURES, DEFAULT_SAMPLING, type SamplingParams, visionUnsupported } from "@tp/llm";
// The CLIs' one flag parser (unknown flags get a "did you mean"); it imports node:util and @tp/tensor only.
import { parseFlags, TpError } from "@tp/tensor";
import {
  MEMORY_OPTIONS,
  MEMORY_USAGE,
  type MemoryArgs,
  memoryArgs,
  memoryShortFlags,
} from "./memory-args.ts";

/** The architectures @tp/llm runs (its registry), one per line: name and description. */
const ARCHITECTURE_LINES = Object.values(ARCHITECTURES)
  .map((a) => `  ${a.name.padEnd(22)} ${a.description}`)
  .join("\n");

/** Usage text (printed by --help). */
export const USAGE = `usage: bun apps/llm --model FILE [--prompt TEXT] [options]

  --model, -m FILE        a GGUF file, a safetensors checkpoint with config.json and
                          tokenizer.json, or a ComfyUI Qwen3-VL text encoder .safetensors
                          (architectures below)
  --model, -m ORG/NAME[:TAG]
                          a GGUF repository on the Hugging Face Hub (llama.cpp's -hf):
                          TAG picks the .gguf files whose name contains it, any case
                          (Qwen/Qwen3-0.6B-GGUF:Q8_0 -> *Q8_0*.gguf); no TAG: Q4_K_M if
                          there, else the first; a split model: all its shards. Downloaded
                          with resume into the Hub cache ($HF_HOME/hub; HF_ENDPOINT,
                          HF_TOKEN), pinned to one commit; nothing fetched when present.
                          An existing local path is always a path.
  --mmproj FILE           a vision projector: not supported yet (vision input is a later step)
  --prompt, -p TEXT       answer one message and exit; without it: interactive chat (REPL)
  --system TEXT           system message
  --raw                   no chat template: the prompt is plain text to continue
                          (the default for files without a template)
  --think / --no-think    Qwen3 thinking on / off (templates with enable_thinking only)
  -n, --n-predict N       most new tokens per answer (default 256)
  --temp T                temperature; 0 = greedy (default ${DEFAULT_SAMPLING.temperature})
  --top-k K               0 = off (default ${DEFAULT_SAMPLING.topK})
  --top-p P               0 … 1; 1 = off, 0 = the most likely token only (default ${DEFAULT_SAMPLING.topP})
  --min-p P               0 = off (default ${DEFAULT_SAMPLING.minP})
  --repeat-penalty R      1 = off (default ${DEFAULT_SAMPLING.repeatPenalty})
  --repeat-last-n N       tokens the penalty scans; 0 = off, -1 = all (default ${DEFAULT_SAMPLING.repeatLastN})
  --seed S                base seed, 0 … 2^64-1 (default: the clock; printed in the banner
                          and as "seed" by --json: pass it back to reproduce a run)
  --ctx N                 context window in tokens (default: the model's, at most 131072)
  --threads N             CPU threads (default: all cores)
  --backend NAME          cpu | vulkan | ptx | cuda (default cpu)
${MEMORY_USAGE}
  --spec-type T           speculative decoding: none | ngram | draft | eagle3 (llama.cpp's
                          ngram-simple, ngram-cache, ngram-map-k, ngram-map-k4v, ngram-mod
                          are the n-gram drafter); default: draft with -md, ngram with
                          --spec-k or --draft-max, else none
  -md, --model-draft FILE draft model of the same vocabulary (--spec-type draft)
  --draft-max N, --spec-k N
                          most drafts per verify step, 1 … 16 (default 16; adapted down
                          while drafts are rejected)
  --draft-min N           drop proposals shorter than N (default 0)
  --draft-p-min P         draft model: stop drafting below this probability (default 0.75)
  --eagle FILE            EAGLE-3 head (--spec-type eagle3): AngelSlim tensor names
                          (fc, midlayer.*, norm, lm_head, d2t) in a .safetensors (or
                          .gguf); reads the target's hidden states at three depths
  --json                  with --prompt: print one JSON object (prompt_ids, ids, text,
                          prompt_tokens_per_second, tokens_per_second, peak_rss_bytes, …)
  -h, --help              this text

REPL: one message per line; /reset clears the conversation, /exit (or Ctrl-D) quits,
Ctrl-C stops the current answer.

Architectures (GGUF general.architecture, config.json model_type):
${ARCHITECTURE_LINES}`;

/** Parsed, checked flags. */
export interface LlmArgs {
  model: string;
  prompt: string | undefined;
  system: string | undefined;
  raw: boolean;
  /** undefined: the template's default. */
  think: boolean | undefined;
  nPredict: number;
  sampling: SamplingParams;
  seed: bigint | undefined;
  ctx: number | undefined;
  threads: number | undefined;
  backend: string;
  json: boolean;
  help: boolean;
  /** Speculative decoding (none unless a --spec-* / --draft-* / -md flag asks for it). */
  speculative: SpeculativeArgs;
  /** Layer placement and memory budgets (./memory-args.ts). */
  memory: MemoryArgs;
}

/** The speculative-decoding flags, checked. */
export interface SpeculativeArgs {
  type: "none" | "ngram" | "draft" | "eagle3";
  /** -md FILE (type "draft"). */
  modelDraft: string | undefined;
  /** --eagle FILE (type "eagle3"). */
  eagle: string | undefined;
  draftMax: number | undefined;
  draftMin: number | undefined;
  pMin: number | undefined;
}

/** --spec-type values (llama.cpp's n-gram modes all select the prompt-lookup drafter). */
const SPEC_TYPES: Readonly<Record<string, SpeculativeArgs["type"]>> = {
  none: "none",
  ngram: "ngram",
  "ngram-simple": "ngram",
  "ngram-cache": "ngram",
  "ngram-map-k": "ngram",
  "ngram-map-k4v": "ngram",
  "ngram-mod": "ngram",
  draft: "draft",
  eagle3: "eagle3",
  eagle: "eagle3",
};

/** Decimal numbers only (no hex, no `Infinity`, no blank): `-1`, `0.8`, `.5`, `1e-3`. */
const DECIMAL = /^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/;
/** Decimal integers only. */
const INTEGER = /^[+-]?\d+$/;

/**
 * A number flag: decimal (integers only when `integer`), finite, and `ok`; else E_ARG naming the flag,
 * the valid range and the value given.
 */
function num(
  flag: string,
  v: string | undefined,
  ok: (x: number) => boolean,
  range: string,
  integer = false,
): number | undefined {
  if (v === undefined) return undefined;
  const t = v.trim();
  const x = (integer ? INTEGER : DECIMAL).test(t) ? Number(t) : Number.NaN;
  if (!Number.isFinite(x) || (integer && !Number.isSafeInteger(x)) || !ok(x))
    throw new TpError("E_ARG", `${flag} must be ${range}, got '${v}'`);
  return x;
}

/** An integer flag (decimal); see {@link num}. */
const int = (flag: string, v: string | undefined, ok: (x: number) => boolean, range: string) =>
  num(flag, v, ok, range, true);

/**
 * llama.cpp's multi-letter short flags, which node's parseArgs cannot declare: `-ngl` / `-ncmoe`
 * ({@link memoryShortFlags}) and `-md` to their long names; the rest unchanged (a negative number
 * after a flag is its value: parseFlags joins it).
 */
function llamaShortFlags(argv: readonly string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = memoryShortFlags(argv[i] as string);
    if (a === "--") {
      out.push(...argv.slice(i));
      break;
    }
    out.push(a === "-md" ? "--model-draft" : a.startsWith("-md=") ? `--model-draft=${a.slice(4)}` : a);
  }
  return out;
}

/** The largest seed + 1 (seeds are u64). */
const SEED_LIMIT = 2n ** 64n;

/** `--seed`: a decimal integer in [0, 2^64), as `bun apps/cli generate --seed`. */
function seedFlag(text: string): bigint {
  const t = text.trim();
  if (!/^\+?\d{1,20}$/.test(t) || BigInt(t) >= SEED_LIMIT)
    throw new TpError("E_ARG", `--seed must be an integer from 0 to ${SEED_LIMIT - 1n}, got '${text}'`);
  return BigInt(t);
}

/** The smallest --ctx: the prompt takes at least one token and leaves room for one more. */
export const MIN_CTX = 2;

/** The --ctx range message (also used when the model's trained context turns out smaller). */
export function ctxRange(ceiling?: number): string {
  return `an integer from ${MIN_CTX} to ${ceiling === undefined ? "the model's trained context" : `${ceiling} (the model's trained context)`}`;
}

/**
 * Parse `argv` (without `bun apps/llm`).
 * @throws TpError E_ARG for an unknown flag (with a "did you mean" when one is close), a missing --model, a bad value, --json without --prompt,
 *   or --think together with --no-think
 */
export function parseLlmArgs(argv: string[]): LlmArgs {
  const { values } = parseFlags(
    { command: "bun apps/llm", help: "bun apps/llm --help" },
    {
      args: llamaShortFlags(argv),
      options: {
        model: { type: "string", short: "m" },
        mmproj: { type: "string" },
        prompt: { type: "string", short: "p" },
        system: { type: "string" },
        raw: { type: "boolean", default: false },
        think: { type: "boolean" },
        "no-think": { type: "boolean" },
        "n-predict": { type: "string", short: "n" },
        temp: { type: "string" },
        "top-k": { type: "string" },
        "top-p": { type: "string" },
        "min-p": { type: "string" },
        "repeat-penalty": { type: "string" },
        "repeat-last-n": { type: "string" },
        seed: { type: "string" },
        ctx: { type: "string" },
        threads: { type: "string" },
        backend: { type: "string", default: "cpu" },
        json: { type: "boolean", default: false },
        "spec-type": { type: "string" },
        "model-draft": { type: "string" },
        "draft-model": { type: "string" },
        "draft-max": { type: "string" },
        "spec-k": { type: "string" },
        "draft-min": { type: "string" },
        "draft-p-min": { type: "string" },
        eagle: { type: "string" },
        help: { type: "boolean", short: "h", default: false },
        ...MEMORY_OPTIONS,
      },
      strict: true,
      allowPositionals: false,
    },
  );
  const s = (k: string) => (values as Record<string, string | boolean | undefined>)[k] as string | undefined;
  const help = values.help === true;
  const model = s("model");
  if (model === undefined && !help)
    throw new TpError("E_ARG", "--model FILE (or ORG/NAME[:TAG] from the Hub) is required; see --help");
  const mmproj = s("mmproj");
  if (mmproj !== undefined && !help) throw visionUnsupported(mmproj);
  if (values.think === true && values["no-think"] === true)
    throw new TpError("E_ARG", "--think and --no-think exclude each other");
  const prompt = s("prompt");
  if (values.json === true && prompt === undefined)
    throw new TpError("E_ARG", "--json needs --prompt (the REPL prints text)");
  const sampling: SamplingParams = { ...DEFAULT_SAMPLING };
  sampling.temperature = num("--temp", s("temp"), (x) => x >= 0, "a number ≥ 0") ?? sampling.temperature;
  sampling.topK = int("--top-k", s("top-k"), (x) => x >= 0, "an integer ≥ 0") ?? sampling.topK;
  // 0 keeps only the most likely token, as llama.cpp's and transformers' top-p 0 do.
  sampling.topP =
    num(
      "--top-p",
      s("top-p"),
      (x) => x >= 0 && x <= 1,
      "a number in [0, 1] (0: the most likely token only)",
    ) ?? sampling.topP;
  sampling.minP = num("--min-p", s("min-p"), (x) => x >= 0 && x <= 1, "a number in [0, 1]") ?? sampling.minP;
  sampling.repeatPenalty =
    num("--repeat-penalty", s("repeat-penalty"), (x) => x > 0, "a number > 0") ?? sampling.repeatPenalty;
  sampling.repeatLastN =
    int("--repeat-last-n", s("repeat-last-n"), (x) => x >= -1, "an integer ≥ -1 (-1: all)") ??
    sampling.repeatLastN;
  const speculative = speculativeArgs(s);
  const seedText = s("seed");
  const seed = seedText === undefined ? undefined : seedFlag(seedText);
  return {
    model: model ?? "",
    prompt,
    system: s("system"),
    raw: values.raw === true,
    think: values.think === true ? true : values["no-think"] === true ? false : undefined,
    nPredict: int("-n", s("n-predict"), (x) => x >= 1, "an integer ≥ 1") ?? 256,
    sampling,
    seed,
    ctx: int("--ctx", s("ctx"), (x) => x >= MIN_CTX, ctxRange()),
    threads: int(
      "--threads",
      s("threads"),
      (x) => x >= 0 && x <= 256,
      "an integer from 0 to 256 (0: all CPUs)",
    ),
    backend: s("backend") ?? "cpu",
    json: values.json === true,
    help,
    speculative,
    memory: memoryArgs(s, values["cpu-moe"] === true, s("backend") ?? "cpu"),
  };
}

/** Check the speculative flags; the type follows from them when --spec-type is absent. */
function speculativeArgs(s: (k: string) => string | undefined): SpeculativeArgs {
  const md = s("model-draft") ?? s("draft-model");
  if (s("model-draft") !== undefined && s("draft-model") !== undefined)
    throw new TpError("E_ARG", "-md/--model-draft and --draft-model are the same flag; give one");
  const dmText = s("draft-max");
  const kText = s("spec-k");
  if (dmText !== undefined && kText !== undefined && dmText.trim() !== kText.trim())
    throw new TpError(
      "E_ARG",
      `--draft-max (${dmText}) and --spec-k (${kText}) are the same setting; give one`,
    );
  const flag = kText !== undefined && dmText === undefined ? "--spec-k" : "--draft-max";
  const draftMax = int(flag, dmText ?? kText, (x) => x >= 1 && x <= 16, "an integer from 1 to 16");
  const draftMin = int("--draft-min", s("draft-min"), (x) => x >= 0 && x <= 16, "an integer from 0 to 16");
  if (draftMin !== undefined && draftMin > (draftMax ?? 16))
    throw new TpError("E_ARG", `--draft-min (${draftMin}) must not exceed --draft-max (${draftMax ?? 16})`);
  const pMin = num("--draft-p-min", s("draft-p-min"), (x) => x >= 0 && x <= 1, "a number in [0, 1]");
  const eagle = s("eagle");
  const typeText = s("spec-type");
  let type: SpeculativeArgs["type"];
  if (typeText !== undefined) {
    const t = SPEC_TYPES[typeText.trim()];
    if (t === undefined)
      throw new TpError(
        "E_ARG",
        `--spec-type must be one of ${Object.keys(SPEC_TYPES).join(", ")}, got '${typeText}'`,
      );
    type = t;
  } else if (md !== undefined) type = "draft";
  else if (eagle !== undefined) type = "eagle3";
  else if (draftMax !== undefined || draftMin !== undefined) type = "ngram";
  else type = "none";
  if (type === "draft" && md === undefined)
    throw new TpError("E_ARG", "--spec-type draft needs a draft model: -md FILE");
  if (type !== "draft" && md !== undefined)
    throw new TpError(
      "E_ARG",
      `-md FILE is the draft model of --spec-type draft, not of --spec-type ${type}`,
    );
  if (type === "eagle3" && eagle === undefined)
    throw new TpError("E_ARG", "--spec-type eagle3 needs the head: --eagle FILE");
  if (type !== "eagle3" && eagle !== undefined)
    throw new TpError("E_ARG", `--eagle FILE is the head of --spec-type eagle3, not of --spec-type ${type}`);
  if (pMin !== undefined && type !== "draft")
    throw new TpError("E_ARG", "--draft-p-min applies to a draft model (-md FILE) only");
  return { type, modelDraft: md, eagle, draftMax, draftMin, pMin };
}
