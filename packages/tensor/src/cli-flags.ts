/**
 * Flag parsing for the command lines (`bun apps/cli <command>`, `bun apps/llm`): node:util
 * `parseArgs` with its errors turned into one-line `TpError` E_ARG messages — an unknown flag names
 * the command and, when one of the command's flags is close (edit distance, or a prefix of it),
 * asks "did you mean --xyz?"; other parse errors say which `--help` lists the flags.
 *
 * Shared by both apps (it lives here, beside `runCli`, so neither app reaches into the other).
 */
import { type ParseArgsConfig, type ParseArgsOptionsConfig, parseArgs } from "node:util";
import { TpError } from "./errors.ts";

/** Who parses: `command` names the flags' owner in messages, `help` the command that lists them. */
export interface FlagContext {
  /** e.g. `quantize`, `bun apps/llm`. */
  readonly command: string;
  /** e.g. `bun apps/cli quantize --help`. */
  readonly help: string;
}

/**
 * Optimal string alignment distance (Levenshtein with adjacent transpositions, each edit costing 1;
 * Damerau 1964, Wagner & Fischer 1974): `--thraeds` is 1 away from `--threads`.
 */
export function editDistance(a: string, b: string): number {
  const n = b.length;
  let prev2 = new Array<number>(n + 1).fill(0);
  let prev = Array.from({ length: n + 1 }, (_, j) => j);
  let cur = new Array<number>(n + 1).fill(0);
  for (let i = 1; i <= a.length; i++) {
    cur[0] = i;
    for (let j = 1; j <= n; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let d = Math.min((prev[j] as number) + 1, (cur[j - 1] as number) + 1, (prev[j - 1] as number) + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1])
        d = Math.min(d, (prev2[j - 2] as number) + 1);
      cur[j] = d;
    }
    [prev2, prev, cur] = [prev, cur, prev2];
  }
  return prev[n] as number;
}

/**
 * The known flag an unknown long flag most likely meant, or undefined when none is close: the
 * nearest by {@link editDistance} within 1 (names up to 4 letters), 2 (up to 8) or 3 (longer), ties
 * to the first in `known`; else a known flag of 3+ letters that the unknown one starts with
 * (`--temperature` → `--temp`), or that starts with it (`--thr` → `--threads`).
 * @param unknown the flag as typed, without dashes or `=value` (`thraeds`)
 * @param known   the command's long flag names, without dashes
 */
export function suggestFlag(unknown: string, known: readonly string[]): string | undefined {
  const u = unknown.toLowerCase().replaceAll("_", "-");
  const limit = u.length <= 4 ? 1 : u.length <= 8 ? 2 : 3;
  let best: string | undefined;
  let bestD = limit + 1;
  for (const k of known) {
    const d = editDistance(u, k);
    if (d < bestD) {
      best = k;
      bestD = d;
    }
  }
  if (best !== undefined) return best;
  return known.find((k) => k.length >= 3 && u.length >= 3 && (u.startsWith(k) || k.startsWith(u)));
}

/** The long flag names of an options table, and each short letter's long name. */
function flagNames(options: ParseArgsOptionsConfig): { long: string[]; short: Map<string, string> } {
  const long = Object.keys(options);
  const short = new Map<string, string>();
  for (const name of long) {
    const s = options[name]?.short;
    if (s !== undefined) short.set(s, name);
  }
  return { long, short };
}

/**
 * The one-line E_ARG for a node:util parseArgs error (codes `ERR_PARSE_ARGS_*`), or undefined for any
 * other error.
 * - unknown flag: `unknown flag --thraeds for backends; did you mean --threads?` (or `; see HELP`);
 * - a flag without its value: `--format needs a value; see HELP`;
 * - anything else: node's message on one line, then `; see HELP`.
 */
export function flagError(
  e: unknown,
  options: ParseArgsOptionsConfig,
  where: FlagContext,
): TpError | undefined {
  const code = (e as { code?: unknown } | null)?.code;
  if (!(e instanceof TypeError) || typeof code !== "string" || !code.startsWith("ERR_PARSE_ARGS"))
    return undefined;
  const see = `see '${where.help}'`;
  const unknown = /^Unknown option '([^']+)'/.exec(e.message);
  if (unknown !== null) {
    // A letter inside a group of short flags (`-jx`) comes back without its dash.
    const raw = unknown[1] as string;
    const flag = raw.startsWith("-") ? raw : `-${raw}`;
    const { long } = flagNames(options);
    const guess = flag.startsWith("--") ? suggestFlag(flag.slice(2), long) : undefined;
    return new TpError(
      "E_ARG",
      `unknown flag ${flag} for ${where.command}; ${guess === undefined ? see : `did you mean --${guess}?`}`,
      { cause: e },
    );
  }
  const missing = /^Option '(?:-\w, )?(--[^' ]+) <value>' argument missing/.exec(e.message);
  if (missing !== null) return new TpError("E_ARG", `${missing[1]} needs a value; ${see}`, { cause: e });
  return new TpError("E_ARG", `${e.message.replace(/\s*\n\s*/g, " ")}; ${see}`, { cause: e });
}

/**
 * `--flag -1` → `--flag=-1` (and `-f -1` → `--flag=-1`) for the string flags of `config.options`, so that
 * a negative number reaches the flag's own range check (`--steps must be …, got '-1'`) instead of
 * parseArgs' "argument is ambiguous" (it refuses a value that starts with "-"). Only a value that reads
 * as a number (`-1`, `-0.5`, `-2GiB`) is joined; no flag name starts with a digit.
 */
function negativeValues(config: ParseArgsConfig): string[] {
  const options = config.options ?? {};
  const shorts = new Map(
    Object.entries(options).flatMap(([name, o]) => (o.short === undefined ? [] : [[o.short, name] as const])),
  );
  const args = config.args ?? [];
  const out: string[] = [];
  for (let i = 0; i < args.length; i++) {
    const a = args[i] as string;
    if (a === "--") {
      out.push(...args.slice(i)); // the rest are positionals
      break;
    }
    const next = args[i + 1];
    const name = a.startsWith("--") ? a.slice(2) : /^-\w$/.test(a) ? shorts.get(a.slice(1)) : undefined;
    if (
      name !== undefined &&
      options[name]?.type === "string" &&
      next !== undefined &&
      /^-\.?\d/.test(next)
    ) {
      out.push(`--${name}=${next}`);
      i++;
    } else out.push(a);
  }
  return out;
}

/**
 * node:util `parseArgs(config)` (strict by default), with its errors as one-line E_ARG messages
 * ({@link flagError}).
 * @param where   the command, for messages
 * @param config  as for parseArgs; `options` is the command's whole flag table
 * @returns what parseArgs returns
 * @throws TpError E_ARG for an unknown flag (with a "did you mean"), a missing value, an unexpected
 *   positional argument
 */
export function parseFlags<T extends ParseArgsConfig>(
  where: FlagContext,
  config: T,
): ReturnType<typeof parseArgs<T>> {
  try {
    return parseArgs(config.args === undefined ? config : { ...config, args: negativeValues(config) });
  } catch (e) {
    throw flagError(e, config.options ?? {}, where) ?? e;
  }
}
