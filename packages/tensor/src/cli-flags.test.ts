// The flag parser of both command lines: edit distances computed by hand, the suggestion rules, and
// parseArgs errors turned into one-line E_ARG messages.
import { expect, test } from "bun:test";
import { editDistance, parseFlags, suggestFlag } from "./cli-flags.ts";
import { TpError } from "./errors.ts";

test("editDistance: insertions, deletions, substitutions and adjacent transpositions cost 1", () => {
  expect(editDistance("", "")).toBe(0);
  expect(editDistance("", "abc")).toBe(3);
  expect(editDistance("abc", "")).toBe(3);
  expect(editDistance("threads", "threads")).toBe(0);
  expect(editDistance("thread", "threads")).toBe(1); // one insertion
  expect(editDistance("thraeds", "threads")).toBe(1); // one transposition (Levenshtein alone: 2)
  expect(editDistance("formt", "format")).toBe(1);
  expect(editDistance("kitten", "sitting")).toBe(3); // k→s, e→i, +g
  expect(editDistance("ca", "abc")).toBe(3); // optimal string alignment, not unrestricted Damerau (2)
  expect(editDistance("top_p", "top-p")).toBe(1);
});

test("suggestFlag: the nearest within the length's limit, underscores as dashes, prefixes", () => {
  const backends = ["threads", "json", "verbose", "help"];
  expect(suggestFlag("thread", backends)).toBe("threads");
  expect(suggestFlag("thraeds", backends)).toBe("threads");
  expect(suggestFlag("jsn", backends)).toBe("json");
  expect(suggestFlag("bogus", backends)).toBeUndefined();
  expect(suggestFlag("x", backends)).toBeUndefined();
  const llm = ["model", "prompt", "temp", "top-k", "top-p", "min-p", "n-predict", "ctx"];
  expect(suggestFlag("top_p", llm)).toBe("top-p");
  expect(suggestFlag("TOP-P", llm)).toBe("top-p");
  expect(suggestFlag("temperature", llm)).toBe("temp"); // distance 7, but it starts with --temp
  expect(suggestFlag("n-pred", llm)).toBe("n-predict"); // distance 3 > 2, but a prefix of it
  expect(suggestFlag("top-q", llm)).toBe("top-k"); // distance 1 to top-k and top-p: the first listed
  expect(suggestFlag("modle", llm)).toBe("model");
  expect(suggestFlag("cx", llm)).toBe("ctx");
  expect(suggestFlag("zz", llm)).toBeUndefined();
});

const where = { command: "backends", help: "bun apps/cli backends --help" };
const options = {
  threads: { type: "string" },
  json: { type: "boolean", short: "j" },
  verbose: { type: "boolean", short: "v" },
} as const;
const parseError = (args: string[], allowPositionals = false): string => {
  try {
    parseFlags(where, { args, options, strict: true, allowPositionals });
  } catch (e) {
    expect(e).toBeInstanceOf(TpError);
    return `${(e as TpError).code}: ${(e as TpError).message}`;
  }
  return "no error";
};

test("parseFlags: values as parseArgs gives them; its errors as one-line E_ARG naming the command", () => {
  const r = parseFlags(where, { args: ["--threads", "2", "-j"], options, strict: true });
  expect(r.values).toEqual({ threads: "2", json: true });
  expect(parseError(["--thread", "2"])).toBe(
    "E_ARG: unknown flag --thread for backends; did you mean --threads?",
  );
  expect(parseError(["--thread=2"], true)).toBe(
    "E_ARG: unknown flag --thread for backends; did you mean --threads?",
  );
  expect(parseError(["--bogus"])).toBe(
    "E_ARG: unknown flag --bogus for backends; see 'bun apps/cli backends --help'",
  );
  expect(parseError(["-x"], true)).toBe(
    "E_ARG: unknown flag -x for backends; see 'bun apps/cli backends --help'",
  );
  expect(parseError(["-jx"])).toBe("E_ARG: unknown flag -x for backends; see 'bun apps/cli backends --help'");
  expect(parseError(["--threads"])).toBe(
    "E_ARG: --threads needs a value; see 'bun apps/cli backends --help'",
  );
  expect(parseError(["--json=1"])).toBe(
    "E_ARG: Option '-j, --json' does not take an argument; see 'bun apps/cli backends --help'",
  );
  expect(parseError(["extra"])).toStartWith("E_ARG: Unexpected argument 'extra'.");
  expect(parseError(["--threads", "--json"])).not.toContain("\n");
});

test("parseFlags: a negative number after a string flag is its value (for the flag's range check)", () => {
  const opts = { ...options, steps: { type: "string", short: "s" } } as const;
  const p = (args: string[]) => parseFlags(where, { args, options: opts, strict: true }).values;
  expect(p(["--threads", "-1"])).toEqual({ threads: "-1" });
  expect(p(["-s", "-0.5", "-j"])).toEqual({ steps: "-0.5", json: true });
  expect(p(["--steps", "-2GiB"])).toEqual({ steps: "-2GiB" });
  // a boolean flag before a number is left alone: parseArgs' own "unknown flag -1"
  expect(() => p(["-j", "-1"])).toThrow(TpError);
  // a value that is a flag is still "needs a value"
  expect(parseError(["--threads", "--json"])).toBe(
    "E_ARG: Option '--threads' argument is ambiguous. Did you forget to specify the option argument for '--threads'? To specify an option argument starting with a dash use '--threads=-XYZ'.; see 'bun apps/cli backends --help'",
  );
});
