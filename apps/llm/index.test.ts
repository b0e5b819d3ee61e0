// `bun apps/llm` end to end, spawned as a user would run it, on the shared tiny models
// (../shared/models; skipped with a reason when absent): --json fields checked against the file's own
// tokenizer, greedy determinism, --seed reproducibility, one-line errors with their exit codes, the
// REPL's /reset and /exit from stdin, and Ctrl-C stopping an answer but not the program.
import { describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { ggufKv, writeGguf } from "@tp/formats";
import { tokenizerFromGguf } from "@tp/tokenizer";

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

async function run(args: string[], stdin?: string): Promise<Run> {
  const p = Bun.spawn(["bun", APP, ...args], {
    stdin: stdin === undefined ? "ignore" : new TextEncoder().encode(stdin),
    stdout: "pipe",
    stderr: "pipe",
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
    "text mode: the answer on stdout, the banner and a summary with tok/s and memory on stderr",
    async () => {
      const r = await run([
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
        /^\[cpu backend, llama, 5 prompt tokens, ctx window 512, max 8 new\/turn, temp 0,/,
      );
      expect(lines[1]).toMatch(
        /tok\/s; generated 8 tok in .* tok\/s; ctx 12\/512, KV \d+ MiB; peak RSS \d+ MiB/,
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
