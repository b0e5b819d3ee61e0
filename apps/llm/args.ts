/**
 * Command-line flags of `bun apps/llm`, parsed with `node:util` `parseArgs` (as apps/cli does) and
 * checked: every bad value is a TpError E_ARG that names the flag, the value and the valid range.
 * Flag names follow llama.cpp's `llama-cli` (`-n`, `--temp`, `--top-k`, `--top-p`, `--min-p`,
 * `--repeat-penalty`, `--seed`, `--ctx`, `--threads`); see ../shared/spec/llm.md §9.
 */
import { parseArgs } from "node:util";
import { DEFAULT_SAMPLING, type SamplingParams } from "@tp/llm";
import { TpError } from "@tp/tensor";

/** Usage text (printed by --help). */
export const USAGE = `usage: bun apps/llm --model FILE.gguf [--prompt TEXT] [options]

  --model, -m FILE        GGUF model (llama, qwen3)
  --prompt, -p TEXT       answer one message and exit; without it: interactive chat (REPL)
  --system TEXT           system message
  --raw                   no chat template: the prompt is plain text to continue
                          (the default for files without a template)
  --think / --no-think    Qwen3 thinking on / off (templates with enable_thinking only)
  -n, --n-predict N       most new tokens per answer (default 256)
  --temp T                temperature; 0 = greedy (default ${DEFAULT_SAMPLING.temperature})
  --top-k K               0 = off (default ${DEFAULT_SAMPLING.topK})
  --top-p P               1 = off (default ${DEFAULT_SAMPLING.topP})
  --min-p P               0 = off (default ${DEFAULT_SAMPLING.minP})
  --repeat-penalty R      1 = off (default ${DEFAULT_SAMPLING.repeatPenalty})
  --repeat-last-n N       tokens the penalty scans; 0 = off, -1 = all (default ${DEFAULT_SAMPLING.repeatLastN})
  --seed S                base seed (default: the clock; printed in the banner)
  --ctx N                 context window in tokens (default: the model's, at most 131072)
  --threads N             CPU threads (default: all cores)
  --backend NAME          cpu | vulkan | ptx | cuda (default cpu)
  --json                  with --prompt: print one JSON object (prompt_ids, ids, text,
                          prompt_tokens_per_second, tokens_per_second, peak_rss_bytes, …)
  -h, --help              this text

REPL: one message per line; /reset clears the conversation, /exit (or Ctrl-D) quits,
Ctrl-C stops the current answer.`;

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
}

function num(
  flag: string,
  v: string | undefined,
  ok: (x: number) => boolean,
  range: string,
): number | undefined {
  if (v === undefined) return undefined;
  const x = v.trim() === "" ? Number.NaN : Number(v);
  if (!Number.isFinite(x) || !ok(x)) throw new TpError("E_ARG", `${flag} must be ${range}, got '${v}'`);
  return x;
}

const int = (x: number) => Number.isSafeInteger(x);

/**
 * Parse `argv` (without `bun apps/llm`).
 * @throws TpError E_ARG for an unknown flag, a missing --model, a bad value, --json without --prompt,
 *   or --think together with --no-think
 */
export function parseLlmArgs(argv: string[]): LlmArgs {
  let values: Record<string, string | boolean | undefined>;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        model: { type: "string", short: "m" },
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
        help: { type: "boolean", short: "h", default: false },
      },
      strict: true,
      allowPositionals: false,
    }));
  } catch (e) {
    // node:util parseArgs reports unknown flags as TypeError with code ERR_PARSE_ARGS_*.
    if (e instanceof TypeError && String((e as { code?: string }).code).startsWith("ERR_PARSE_ARGS"))
      throw new TpError("E_ARG", `${e.message.replace(/\s*\n\s*/g, " ")}; see --help`);
    throw e;
  }
  const s = (k: string) => values[k] as string | undefined;
  const help = values.help === true;
  const model = s("model");
  if (model === undefined && !help) throw new TpError("E_ARG", "--model FILE is required; see --help");
  if (values.think === true && values["no-think"] === true)
    throw new TpError("E_ARG", "--think and --no-think exclude each other");
  const prompt = s("prompt");
  if (values.json === true && prompt === undefined)
    throw new TpError("E_ARG", "--json needs --prompt (the REPL prints text)");
  const sampling: SamplingParams = { ...DEFAULT_SAMPLING };
  sampling.temperature = num("--temp", s("temp"), (x) => x >= 0, "a number ≥ 0") ?? sampling.temperature;
  sampling.topK = num("--top-k", s("top-k"), (x) => int(x) && x >= 0, "an integer ≥ 0") ?? sampling.topK;
  sampling.topP = num("--top-p", s("top-p"), (x) => x > 0 && x <= 1, "a number in (0, 1]") ?? sampling.topP;
  sampling.minP = num("--min-p", s("min-p"), (x) => x >= 0 && x <= 1, "a number in [0, 1]") ?? sampling.minP;
  sampling.repeatPenalty =
    num("--repeat-penalty", s("repeat-penalty"), (x) => x > 0, "a number > 0") ?? sampling.repeatPenalty;
  sampling.repeatLastN =
    num("--repeat-last-n", s("repeat-last-n"), (x) => int(x) && x >= -1, "an integer ≥ -1") ??
    sampling.repeatLastN;
  const seedText = s("seed");
  let seed: bigint | undefined;
  if (seedText !== undefined) {
    if (!/^-?\d{1,20}$/.test(seedText.trim()))
      throw new TpError("E_ARG", `--seed must be an integer, got '${seedText}'`);
    seed = BigInt.asUintN(64, BigInt(seedText.trim()));
  }
  return {
    model: model ?? "",
    prompt,
    system: s("system"),
    raw: values.raw === true,
    think: values.think === true ? true : values["no-think"] === true ? false : undefined,
    nPredict: num("-n", s("n-predict"), (x) => int(x) && x >= 1, "an integer ≥ 1") ?? 256,
    sampling,
    seed,
    ctx: num("--ctx", s("ctx"), (x) => int(x) && x >= 2, "an integer ≥ 2"),
    threads: num(
      "--threads",
      s("threads"),
      (x) => int(x) && x >= 0 && x <= 256,
      "an integer from 0 to 256 (0: all CPUs)",
    ),
    backend: s("backend") ?? "cpu",
    json: values.json === true,
    help,
  };
}
