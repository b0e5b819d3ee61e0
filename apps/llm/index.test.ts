// `bun apps/llm` end to end, spawned as a user would run it, on the shared tiny models
// (../shared/models; skipped with a reason when absent): --json fields checked against the file's own
// tokenizer, greedy determinism, --seed reproducibility, one-line errors with their exit codes, the
// REPL's /reset and /exit from stdin, and Ctrl-C stopping an answer but not the program.
import { describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { type GgufKvInput, type GgufTensorInput, ggufKv, openGguf, writeGguf } from "@tp/formats";
import { ARCHITECTURES } from "@tp/llm";
import { tinyEagle3, writeTinyEagle3 } from "@tp/llm/testing";
import { isTpError, TpError } from "@tp/tensor";
import { tokenizerFromGguf } from "@tp/tokenizer";
import { parseLlmArgs } from "./args.ts";

const MODELS = resolve(import.meta.dir, "../../../shared/models");
const HAVE_MODELS = existsSync(join(MODELS, "PROVENANCE.md"));
const NO_MODELS = `skipped: ${MODELS} is absent (the shared models folder is not beside this checkout)`;
const STORIES = join(MODELS, "real/stories260K-f32-v3.gguf");
const QWEN = join(MODELS, "synthetic/qwen3-tiny-F32.gguf");
const APP = resolve(import.meta.dir, "index.ts");
const T = 60_000; // spawning bun and loading a model, on a loaded CI machine

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

/** ESC: Bun colours console.error red (FORCE_COLOR=1 makes it do so on a pipe as on a terminal). */
const ESC = "\x1b[";

async function run(args: string[], stdin?: string, env: Record<string, string> = {}): Promise<Run> {
  const p = Bun.spawn(["bun", APP, ...args], {
    stdin: stdin === undefined ? "ignore" : new TextEncoder().encode(stdin),
    stdout: "pipe",
    stderr: "pipe",
    env: { ...process.env, ...env },
  });
  const [stdout, stderr, code] = await Promise.all([
    new Response(p.stdout).text(),
    new Response(p.stderr).text(),
    p.exited,
  ]);
  return { code, stdout, stderr };
}

async function json(args: string[]): Promise<Record<string, unknown>> {
  const r = await run([...args, "--json"]);
  expect(r.stderr).toBe("");
  expect(r.code).toBe(0);
  return JSON.parse(r.stdout);
}

describe.skipIf(!HAVE_MODELS)("bun apps/llm --prompt", () => {
  if (!HAVE_MODELS) test.skip(NO_MODELS, () => {});

  test(
    "--json: prompt ids from the file's tokenizer, the answer's ids and text, rates and peak RSS",
    async () => {
      const o = await json([
        "-m",
        STORIES,
        "-p",
        "Once upon a time",
        "--temp",
        "0",
        "-n",
        "24",
        "--threads",
        "1",
      ]);
      const tok = tokenizerFromGguf(STORIES);
      // stories260K has no chat template, so the prompt is plain text with the file's BOS
      expect(o.prompt_ids).toEqual(tok.encode("Once upon a time", { addSpecial: true }));
      const ids = o.ids as number[];
      expect(ids.length).toBe(24); // no EOS within 24 tokens of a story opening
      expect(o.stop_reason).toBe("length");
      // the text is what the ids add to the prompt's text
      const full = tok.decode([...(o.prompt_ids as number[]), ...ids], { skipSpecial: true });
      const head = tok.decode(o.prompt_ids as number[], { skipSpecial: true });
      expect(o.text).toBe(full.slice(head.length));
      expect(o.prompt_tokens_per_second as number).toBeGreaterThan(0);
      expect(o.tokens_per_second as number).toBeGreaterThan(0);
      // at least the 1 MiB of weights, less than a few hundred MiB
      expect(o.peak_rss_bytes as number).toBeGreaterThan(1 << 20);
      expect(o.peak_rss_bytes as number).toBeLessThan(1 << 30);
    },
    T,
  );

  test(
    "greedy is deterministic; --seed reproduces a sampled answer and another seed changes it",
    async () => {
      const base = ["-m", QWEN, "-p", "Hello", "-n", "16", "--threads", "1"];
      const g1 = await json([...base, "--temp", "0"]);
      const g2 = await json([...base, "--temp", "0", "--seed", "5"]);
      expect(g2.ids).toEqual(g1.ids);
      const s = [...base, "--temp", "1.5", "--top-k", "0", "--top-p", "1", "--min-p", "0"];
      const a = await json([...s, "--seed", "42"]);
      const b = await json([...s, "--seed", "42"]);
      const c = await json([...s, "--seed", "43"]);
      expect(b.ids).toEqual(a.ids);
      expect(b.text).toBe(a.text as string);
      expect(a.seed).not.toBe(c.seed);
      expect(c.ids).not.toEqual(a.ids); // 16 draws at T = 1.5 from a random model's 4122 tokens
      // --top-p 0 keeps only the most likely token: the greedy answer at any temperature and seed
      const top = await json([...base, "--temp", "1.5", "--top-k", "0", "--top-p", "0", "--seed", "43"]);
      expect(top.ids).toEqual(g1.ids);
    },
    T,
  );

  test(
    "the chat template wraps the prompt (Qwen3 ChatML), --raw does not, --no-think adds the empty thought",
    async () => {
      const tok = tokenizerFromGguf(QWEN);
      const chat = await json(["-m", QWEN, "-p", "Hi", "--temp", "0", "-n", "1"]);
      expect(chat.prompt_ids).toEqual(
        tok.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", { parseSpecial: true }),
      );
      const nothink = await json(["-m", QWEN, "-p", "Hi", "--temp", "0", "-n", "1", "--no-think"]);
      expect(nothink.prompt_ids).toEqual(
        tok.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", {
          parseSpecial: true,
        }),
      );
      const raw = await json(["-m", QWEN, "-p", "Hi", "--temp", "0", "-n", "1", "--raw"]);
      expect(raw.prompt_ids).toEqual(tok.encode("Hi", { addSpecial: true }));
    },
    T,
  );

  test(
    "text mode: the answer on stdout, the banner and a summary with tok/s and memory on stderr (not red)",
    async () => {
      const r = await run(
        ["-m", STORIES, "-p", "Once upon a time", "--temp", "0", "-n", "8", "--threads", "1"],
        undefined,
        { FORCE_COLOR: "1" },
      );
      expect(r.stderr).not.toContain(ESC);
      expect(r.code).toBe(0);
      const o = await json([
        "-m",
        STORIES,
        "-p",
        "Once upon a time",
        "--temp",
        "0",
        "-n",
        "8",
        "--threads",
        "1",
      ]);
      expect(r.stdout).toBe(`${o.text}\n`);
      const lines = r.stderr.trim().split("\n");
      expect(lines.length).toBe(2);
      expect(lines[0]).toMatch(
        /^\[cpu backend: .*\(\w+, 1 threads?\), llama, 5 prompt tokens, ctx window 512, max 8 new\/turn, temp 0,/,
      );
      expect(lines[1]).toMatch(
        /tok\/s; generated 8 tok in .* tok\/s; ctx 12\/512, KV \d+ MiB; peak cpu \d+ MiB, peak RSS \d+ MiB, mapped \d+ MiB/,
      );
    },
    T,
  );
});

describe.skipIf(!HAVE_MODELS)("bun apps/llm errors: one line, non-zero exit", () => {
  if (!HAVE_MODELS) test.skip(NO_MODELS, () => {});

  const oneLine = (r: Run, code: number, start: string, ...has: string[]) => {
    expect(r.code).toBe(code);
    expect(r.stdout).toBe("");
    const lines = r.stderr.trimEnd().split("\n");
    expect(lines.length).toBe(1);
    expect(lines[0]).toStartWith(start);
    for (const h of has) expect(lines[0]).toContain(h);
  };

  test(
    "bad flags (exit 2), missing file, unknown architecture, context overflow",
    async () => {
      oneLine(await run(["-m", STORIES, "--bogus"]), 2, "error E_ARG:", "--bogus");
      oneLine(await run(["-p", "hi"]), 2, "error E_ARG:", "--model");
      oneLine(await run(["-m", STORIES, "--temp", "hot"]), 2, "error E_ARG:", "--temp", "hot");
      oneLine(await run(["-m", STORIES, "-n", "0"]), 2, "error E_ARG:", "-n");
      oneLine(await run(["-m", STORIES, "--json"]), 2, "error E_ARG:", "--json", "--prompt");
      oneLine(await run(["-m", STORIES, "-p", "x", "--think"]), 2, "error E_ARG:", "--think");
      oneLine(await run(["-m", STORIES, "-p", "x", "--backend", "tpu"]), 2, "error E_ARG:", "tpu", "cpu");
      oneLine(
        await run(["-m", "/nonexistent/model.gguf", "-p", "x"]),
        1,
        "error E_IO:",
        "/nonexistent/model.gguf",
      );
      // "Once upon a time there was" is 7 tokens with BOS; a window of 4 cannot hold it
      oneLine(
        await run(["-m", STORIES, "-p", "Once upon a time there was", "--ctx", "4"]),
        2,
        "error E_ARG: context window full",
        "--ctx",
      );
      const dir = mkdtempSync(join(tmpdir(), "tp-llm-app-"));
      try {
        const file = join(dir, "mamba.gguf");
        writeGguf(
          file,
          [ggufKv("general.architecture", "str", "mamba")],
          [{ name: "token_embd.weight", type: "F32", shape: [4, 4], data: new Uint8Array(64) }],
        );
        oneLine(await run(["-m", file, "-p", "x"]), 1, "error E_UNSUPPORTED:", "mamba", "llama", "qwen3");
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
    T,
  );
});

describe.skipIf(!HAVE_MODELS)("bun apps/llm REPL", () => {
  if (!HAVE_MODELS) test.skip(NO_MODELS, () => {});

  test(
    "one message per line; /reset starts over (same greedy answer), /exit quits before later lines",
    async () => {
      const r = await run(
        ["-m", STORIES, "--temp", "0", "-n", "10", "--threads", "1"],
        "Once upon a time\nThe end.\n/reset\nOnce upon a time\n/exit\nnever read\n",
      );
      expect(r.code).toBe(0);
      const answers = r.stdout.split("\n").filter((l) => l !== "");
      expect(answers.length).toBe(3);
      const o = await json([
        "-m",
        STORIES,
        "-p",
        "Once upon a time",
        "--temp",
        "0",
        "-n",
        "10",
        "--threads",
        "1",
      ]);
      expect(answers[0]).toBe(o.text as string);
      expect(answers[2]).toBe(o.text as string); // after /reset the conversation starts over
      expect(r.stderr).toContain("[conversation cleared]");
      // the second turn reused the first turn's cache
      expect(r.stderr).toMatch(/\(\+\d+ cached\)/);
    },
    T,
  );

  test(
    "Ctrl-C (SIGINT) stops the current answer, not the program",
    async () => {
      const p = Bun.spawn(
        ["bun", APP, "-m", QWEN, "--temp", "0", "-n", "100000", "--ctx", "40000", "--threads", "1"],
        {
          stdin: "pipe",
          stdout: "pipe",
          stderr: "pipe",
        },
      );
      p.stdin.write("Hello\n");
      p.stdin.flush();
      // wait for the answer to start streaming, then interrupt it
      const reader = p.stdout.getReader();
      let out = "";
      while (out.length < 20) {
        const { value, done } = await reader.read();
        if (done) break;
        out += new TextDecoder().decode(value);
      }
      p.kill("SIGINT");
      await Bun.sleep(300);
      p.stdin.write("/exit\n");
      p.stdin.end();
      const [stderr, code] = await Promise.all([new Response(p.stderr).text(), p.exited]);
      expect(code).toBe(0);
      expect(stderr).toContain("stopped: interrupted");
    },
    T,
  );
});

describe("bun apps/llm --help and flag errors (no model needed)", () => {
  test(
    "--help and -h print the usage on stdout, exit 0; an unknown flag is one line, exit 2",
    async () => {
      for (const h of ["--help", "-h"]) {
        const r = await run([h]);
        expect(r.code).toBe(0);
        expect(r.stdout).toStartWith("usage: bun apps/llm --model FILE");
        expect(r.stdout).toContain("--top-p P");
        // the architectures of @tp/llm's registry, one line each
        for (const a of Object.values(ARCHITECTURES)) expect(r.stdout).toContain(`  ${a.name} `);
        expect(r.stdout).toContain("qwen3vl");
        expect(r.stdout).not.toContain("../shared");
        expect(r.stderr).toBe("");
      }
      const r = await run(["-m", "x.gguf", "--n-predicts", "3"]);
      expect(r.stderr).toBe(
        "error E_ARG: unknown flag --n-predicts for bun apps/llm; did you mean --n-predict?\n",
      );
      expect(r.code).toBe(2);
      expect(r.stdout).toBe("");
    },
    T,
  );
});

/** A copy of a GGUF with metadata replaced or added (same key) and tensors rewritten. */
function rewriteGguf(
  src: string,
  dst: string,
  kv: readonly GgufKvInput[],
  tensor: (t: GgufTensorInput) => GgufTensorInput = (t) => t,
): void {
  const g = openGguf(src);
  try {
    const keep = [...g.metadata.entries.values()].filter((e) => !kv.some((k) => k.key === e.key));
    const tensors = g.tensors.map((t) =>
      tensor({ name: t.name, type: t.dtype, shape: t.shape, data: g.data(t.name) }),
    );
    writeGguf(dst, [...keep, ...kv], tensors);
  } finally {
    g.close();
  }
}

describe("flags: decimal numbers, negative values, one range message per flag", () => {
  const err = (argv: string[]): TpError => {
    try {
      parseLlmArgs(["-m", "x.gguf", ...argv]);
    } catch (e) {
      expect(e).toBeInstanceOf(TpError);
      expect((e as TpError).code).toBe("E_ARG");
      return e as TpError;
    }
    throw new Error(`expected ${argv.join(" ")} to be refused`);
  };

  test("a negative number is the flag's value (--repeat-last-n -1 = all), not 'ambiguous'", () => {
    expect(parseLlmArgs(["-m", "x", "--repeat-last-n", "-1"]).sampling.repeatLastN).toBe(-1);
    expect(parseLlmArgs(["-m", "x", "--repeat-last-n=-1"]).sampling.repeatLastN).toBe(-1);
    expect(err(["-n", "-1"]).message).toBe("-n must be an integer ≥ 1, got '-1'");
    expect(err(["--n-predict", "-3"]).message).toBe("-n must be an integer ≥ 1, got '-3'");
    expect(err(["--temp", "-1"]).message).toBe("--temp must be a number ≥ 0, got '-1'");
    expect(err(["--top-k", "-2"]).message).toContain("--top-k");
    expect(err(["--repeat-last-n", "-2"]).message).toContain("≥ -1");
    expect(err(["--seed", "-5"]).message).toBe(
      "--seed must be an integer from 0 to 18446744073709551615, got '-5'",
    );
    // the text flags still refuse a missing value rather than eat the next flag
    expect(err(["-p", "--json"]).message).toContain("--prompt");
  });

  test("--top-p: 0 (the most likely token only, as llama.cpp and transformers) … 1", () => {
    expect(parseLlmArgs(["-m", "x", "--top-p", "0"]).sampling.topP).toBe(0);
    expect(parseLlmArgs(["-m", "x", "--top-p", "1"]).sampling.topP).toBe(1);
    const range = "a number in [0, 1] (0: the most likely token only)";
    expect(err(["--top-p", "-0.1"]).message).toBe(`--top-p must be ${range}, got '-0.1'`);
    expect(err(["--top-p", "1.5"]).message).toBe(`--top-p must be ${range}, got '1.5'`);
  });

  test("an unknown flag is one E_ARG line with a 'did you mean' when a flag is close", () => {
    expect(err(["--top_p", "0.5"]).message).toBe(
      "unknown flag --top_p for bun apps/llm; did you mean --top-p?",
    );
    expect(err(["--temperature", "0.5"]).message).toBe(
      "unknown flag --temperature for bun apps/llm; did you mean --temp?",
    );
    expect(err(["--thread", "2"]).message).toBe(
      "unknown flag --thread for bun apps/llm; did you mean --threads?",
    );
    expect(err(["--bogus"]).message).toBe("unknown flag --bogus for bun apps/llm; see 'bun apps/llm --help'");
  });

  test("--mmproj (a vision projector) is E_UNSUPPORTED naming the file: vision input is not supported yet", () => {
    let e: unknown;
    try {
      parseLlmArgs(["-m", "m.gguf", "--mmproj", "mmproj-F16.gguf"]);
    } catch (x) {
      e = x;
    }
    expect(isTpError(e, "E_UNSUPPORTED")).toBe(true);
    expect((e as TpError).message).toContain("vision input is not supported yet");
    expect((e as TpError).file).toBe("mmproj-F16.gguf");
  });

  test("--seed: 0 … 2^64 − 1, decimal; integers are decimal everywhere; --ctx has one range message", () => {
    expect(parseLlmArgs(["-m", "x", "--seed", "18446744073709551615"]).seed).toBe(2n ** 64n - 1n);
    expect(err(["--seed", "99999999999999999999"]).message).toContain("--seed");
    expect(err(["--seed", "18446744073709551616"]).message).toContain("--seed");
    expect(err(["--seed", "0x10"]).message).toContain("--seed");
    expect(err(["-n", "0x10"]).message).toBe("-n must be an integer ≥ 1, got '0x10'");
    expect(err(["-n", "1e3"]).message).toContain("-n");
    expect(err(["--temp", "0x1"]).message).toContain("--temp");
    expect(err(["--temp", "Infinity"]).message).toContain("--temp");
    expect(parseLlmArgs(["-m", "x", "--temp", ".5"]).sampling.temperature).toBe(0.5);
    expect(err(["--ctx", "1"]).message).toBe(
      "--ctx must be an integer from 2 to the model's trained context, got '1'",
    );
  });
});

describe.skipIf(!HAVE_MODELS)("bun apps/llm: broken files fail at load, reruns reproduce", () => {
  if (!HAVE_MODELS) test.skip(NO_MODELS, () => {});

  const oneLine = (r: Run, code: number, start: string, ...has: string[]) => {
    expect(r.stdout).toBe("");
    const lines = r.stderr.trimEnd().split("\n");
    expect(lines).toEqual([expect.stringContaining(start)]);
    expect(lines[0]).toStartWith(start);
    for (const h of has) expect(lines[0]).toContain(h);
    expect(r.code).toBe(code);
  };

  test(
    "a hostile chat template is E_FORMAT naming the file and tokenizer.chat_template, at once (-p and REPL)",
    async () => {
      const dir = mkdtempSync(join(tmpdir(), "tp-llm-app-"));
      try {
        const file = join(dir, "loop.gguf");
        rewriteGguf(STORIES, file, [
          ggufKv("tokenizer.chat_template", "str", "{% for i in range(100000000) %}x{% endfor %}"),
        ]);
        const t0 = performance.now();
        oneLine(await run(["-m", file, "-p", "hi"]), 1, "error E_FORMAT:", file, "tokenizer.chat_template");
        // the REPL renders once before its banner
        oneLine(await run(["-m", file], "hi\n"), 1, "error E_FORMAT:", file, "tokenizer.chat_template");
        expect(performance.now() - t0).toBeLessThan(20_000);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
    T,
  );

  test(
    "NaN weights: --temp 0 and --temp 0.8 both stop with E_NUMERIC 'logits at position' naming the file and the NaN tensor",
    async () => {
      const dir = mkdtempSync(join(tmpdir(), "tp-llm-app-"));
      try {
        const file = join(dir, "nan.gguf");
        rewriteGguf(STORIES, file, [], (t) =>
          t.name === "output_norm.weight"
            ? { ...t, data: new Uint8Array(new Float32Array(t.data.length / 4).fill(Number.NaN).buffer) }
            : t,
        );
        for (const temp of ["0", "0.8"]) {
          const r = await run(["-m", file, "-p", "Once", "--temp", temp, "-n", "4", "--json"]);
          oneLine(
            r,
            1,
            "error E_NUMERIC:",
            "logits at position",
            file,
            "holds NaN in tensor output_norm.weight",
          );
        }
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
    T,
  );

  test(
    "--json reports the base seed: --seed with it reproduces the ids; --ctx out of range and overflow messages",
    async () => {
      const s = ["-m", QWEN, "-p", "Hello", "-n", "12", "--threads", "1", "--temp", "1.5", "--top-k", "0"];
      const a = await json(s); // seed from the clock
      const b = await json([...s, "--seed", a.seed as string]);
      expect(b.seed).toBe(a.seed as string);
      expect(b.ids).toEqual(a.ids);
      expect((await json([...s, "--seed", "42"])).seed).toBe("42");
      // the model's trained context is 512: the same message shape as --ctx 1
      const big = await run(["-m", STORIES, "-p", "x", "--ctx", "99999999"]);
      oneLine(
        big,
        2,
        "error E_ARG: --ctx must be an integer from 2 to 512 (the model's trained context), got '99999999'",
      );
      const over = await run(["-m", STORIES, "-p", "Once upon a time there was", "--ctx", "4"]);
      oneLine(over, 2, "error E_ARG: context window full", "--ctx");
      expect(over.stderr).not.toContain("/reset");
      // a negative value reaches the run: --repeat-last-n -1 penalizes the whole context
      const all = await json([
        "-m",
        STORIES,
        "-p",
        "Once",
        "--temp",
        "0",
        "-n",
        "4",
        "--repeat-penalty",
        "1.2",
        "--repeat-last-n",
        "-1",
      ]);
      expect((all.ids as number[]).length).toBe(4);
    },
    T,
  );
});

describe.skipIf(!HAVE_MODELS)("bun apps/llm speculative decoding", () => {
  if (!HAVE_MODELS) test.skip(NO_MODELS, () => {});

  test(
    "--spec-k / -md: greedy ids identical to vanilla; --json and the summary report acceptance and tokens per verify step",
    async () => {
      const base = ["-m", STORIES, "-p", "Once upon a time", "--raw", "-n", "96", "--temp", "0"];
      const vanilla = await json(base);
      expect(vanilla.speculative).toBeUndefined();
      for (const extra of [
        ["--spec-k", "4"],
        ["--spec-type", "ngram-simple"],
        ["-md", STORIES],
        ["--model-draft", STORIES, "--draft-p-min", "0"],
      ]) {
        const o = await json([...base, ...extra]);
        expect(o.ids).toEqual(vanilla.ids);
        const s = o.speculative as {
          drafted: number;
          accepted: number;
          verify_steps: number;
          acceptance_rate: number;
          tokens_per_verify_step: number;
        };
        expect(s.accepted).toBeLessThanOrEqual(s.drafted);
        expect(s.acceptance_rate).toBeCloseTo(s.drafted > 0 ? s.accepted / s.drafted : 0, 12);
        expect(s.tokens_per_verify_step).toBeCloseTo((s.accepted + s.verify_steps) / s.verify_steps, 12);
      }
      // the same model as its own draft: every greedy draft is the target's choice
      const self = await json([...base, "-md", STORIES, "--draft-p-min", "0"]);
      const st = self.speculative as Record<string, number>;
      expect(st.accepted).toBe(st.drafted);
      const r = await run([...base, "--spec-k", "4"]);
      expect(r.code).toBe(0);
      expect(r.stderr).toMatch(
        /spec ngram: accepted \d+\/\d+ drafts \(\d+%\), \d+\.\d\d tok per verify step\]/,
      );
    },
    T * 3,
  );

  test(
    "a draft model of another vocabulary, a missing EAGLE-3 head: one error line",
    async () => {
      const mismatch = await run(["-m", STORIES, "-p", "x", "-md", QWEN]);
      expect(mismatch.code).not.toBe(0);
      expect(mismatch.stderr).toContain("E_ARG: vocabulary mismatch");
      // a draft trained on a shorter context than the target's window (stories260K: 512 tokens):
      // one line naming -md, the draft's ceiling and --ctx, not loadModel's "maxContext"
      const short = await run(["-m", QWEN, "-p", "x", "-n", "1", "-md", STORIES]);
      expect(short.code).not.toBe(0);
      expect(short.stderr.trim().split("\n")).toEqual([
        `error E_ARG: the draft model (-md) takes at most 512 tokens of context, less than the target's window of 40960; give --ctx 512 or less (or a draft of the target's family) (file ${STORIES})`,
      ]);
      // with --ctx inside the draft's window the vocabulary check speaks
      const ctx = await run(["-m", QWEN, "-p", "x", "-n", "1", "--ctx", "512", "-md", STORIES]);
      expect(ctx.stderr).toContain("E_ARG: vocabulary mismatch");
      const eagle = await run([
        "-m",
        STORIES,
        "-p",
        "x",
        "--spec-type",
        "eagle3",
        "--eagle",
        "head.safetensors",
      ]);
      expect(eagle.code).not.toBe(0);
      expect(eagle.stderr.trim().split("\n")).toEqual([
        "error E_IO: cannot open the file: no such file or directory (file head.safetensors)",
      ]);
    },
    T,
  );
});

describe.skipIf(!HAVE_MODELS)("--spec-type eagle3", () => {
  test(
    "greedy ids identical to vanilla with a synthetic head; the summary and --json report acceptance",
    async () => {
      const dir = mkdtempSync(join(tmpdir(), "tp-llm-eagle3-"));
      try {
        const base = ["-m", QWEN, "-p", "Hello there", "--raw", "-n", "64", "--temp", "0"];
        const vanilla = await json(base);
        const g = openGguf(QWEN);
        const f32 = (n: string) => new Float32Array(g.data(n).slice().buffer);
        // a head that copies the target's last choice (testing/eagle3.ts): accepted where the target repeats
        const head = tinyEagle3(
          { hidden_size: 64, vocab_size: 4122, head_dim: 32 },
          {
            include: vanilla.ids as number[],
            mimic: { tap: 0, norm: f32("output_norm.weight"), head: f32("token_embd.weight") },
          },
        );
        g.close();
        const file = join(dir, "head.safetensors");
        writeTinyEagle3(file, head);
        const o = await json([...base, "--spec-type", "eagle3", "--eagle", file, "--draft-max", "4"]);
        expect(o.ids).toEqual(vanilla.ids);
        const s = o.speculative as Record<string, number | string>;
        expect(s.type).toBe("eagle3");
        expect(s.accepted as number).toBeGreaterThan(0);
        expect(s.tokens_per_verify_step as number).toBeGreaterThan(1);
        const r = await run([...base, "--eagle", file]);
        expect(r.code).toBe(0);
        expect(r.stderr).toMatch(/speculative eagle3 \(.*head\.safetensors\)/);
        expect(r.stderr).toMatch(
          /spec eagle3: accepted \d+\/\d+ drafts \(\d+%\), \d+\.\d\d tok per verify step\]/,
        );
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
    T * 3,
  );
});

describe("speculative flags", () => {
  const p = (...a: string[]) => parseLlmArgs(["-m", "x.gguf", ...a]).speculative;
  test("types follow from the flags; llama.cpp's spellings; conflicts and ranges are E_ARG naming the flag", () => {
    expect(p().type).toBe("none");
    expect(p("--spec-k", "3")).toMatchObject({ type: "ngram", draftMax: 3 });
    expect(p("--draft-max", "8", "--draft-min", "2")).toMatchObject({
      type: "ngram",
      draftMax: 8,
      draftMin: 2,
    });
    expect(p("-md", "d.gguf")).toMatchObject({ type: "draft", modelDraft: "d.gguf" });
    expect(p("--model-draft", "d.gguf", "--draft-p-min", "0.5")).toMatchObject({ type: "draft", pMin: 0.5 });
    expect(p("--draft-model", "d.gguf").type).toBe("draft");
    for (const t of ["ngram-simple", "ngram-cache", "ngram-map-k", "ngram-map-k4v", "ngram-mod"])
      expect(p("--spec-type", t).type).toBe("ngram");
    expect(p("--spec-type", "eagle3", "--eagle", "h.safetensors")).toMatchObject({
      type: "eagle3",
      eagle: "h.safetensors",
    });
    const bad: [string[], RegExp][] = [
      [["--spec-k", "17"], /--spec-k must be an integer from 1 to 16/],
      [["--draft-max", "0"], /--draft-max must be/],
      [["--draft-max", "4", "--draft-min", "5"], /--draft-min \(5\) must not exceed --draft-max \(4\)/],
      [["--spec-type", "tree"], /--spec-type must be one of/],
      [["--spec-type", "draft"], /needs a draft model: -md FILE/],
      [["--spec-type", "ngram", "-md", "d.gguf"], /-md FILE is the draft model of --spec-type draft/],
      [["--spec-type", "eagle3"], /needs the head: --eagle FILE/],
      [["--spec-k", "4", "--draft-p-min", "0.5"], /--draft-p-min applies to a draft model/],
      [["--draft-p-min", "2", "-md", "d"], /--draft-p-min must be a number in \[0, 1\]/],
      [["--spec-k", "3", "--draft-max", "4"], /same setting/],
    ];
    for (const [args, re] of bad) {
      expect(() => p(...args)).toThrow(TpError);
      expect(() => p(...args)).toThrow(re);
    }
  });
});
