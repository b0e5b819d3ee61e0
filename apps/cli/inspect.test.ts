// `bun apps/cli inspect`: text and --json reports, exit 0; one-line errors with exit 1 (bad file) or 2 (usage).
import { afterAll, expect, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { GgufArray, ggufKv, writeGguf, writeSafetensors } from "@tp/formats";

const dir = mkdtempSync(join(tmpdir(), "tp-cli-inspect-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const cli = resolve(import.meta.dir, "index.ts");
const run = (...args: string[]) => {
  const p = Bun.spawnSync([process.execPath, cli, "inspect", ...args], { stdout: "pipe", stderr: "pipe" });
  return { code: p.exitCode, out: p.stdout.toString(), err: p.stderr.toString() };
};

const gguf = join(dir, "tiny.gguf");
writeGguf(
  gguf,
  [
    ggufKv("general.architecture", "str", "qwen3"),
    ggufKv("qwen3.block_count", "u32", 1),
    ggufKv(
      "tokenizer.ggml.tokens",
      "arr",
      GgufArray.of(
        "str",
        Array.from({ length: 100 }, (_, i) => `t${i}`),
      ),
    ),
  ],
  [{ name: "token_embd.weight", type: "q8_0", shape: [2, 32], data: new Uint8Array(68) }],
);

test("inspect a GGUF: layout, abridged arrays, tensor table; --json parses", () => {
  const text = run(gguf);
  expect(text.code).toBe(0);
  expect(text.out).toContain("layout: gguf-llm");
  expect(text.out).toContain('arr[str,100]  ["t0", "t1"');
  expect(text.out).toContain("… 92 more");
  expect(text.out).toMatch(/0\s+token_embd\.weight\s+Q8_0\s+\[2, 32\]\s+68\s+\d+/);
  const j = run("--json", "--array-limit", "2", gguf);
  expect(j.code).toBe(0);
  const r = JSON.parse(j.out);
  expect(r.layout.kind).toBe("gguf-llm");
  expect(r.metadata["tokenizer.ggml.tokens"]).toEqual({
    type: "arr",
    elementType: "str",
    length: 100,
    value: ["t0", "t1"],
    abridged: true,
  });
  expect(r.tensors[0]).toMatchObject({ name: "token_embd.weight", dtype: "Q8_0", shape: [2, 32], bytes: 68 });
});

test("an unrecognised but valid safetensors file is still inspected (layout unknown)", () => {
  const p = join(dir, "x.safetensors");
  writeSafetensors(p, [{ name: "foo", dtype: "F32", shape: [1], data: new Uint8Array(4) }], {
    metadata: { a: "b" },
  });
  const r = run("--json", p);
  expect(r.code).toBe(0);
  expect(JSON.parse(r.out).layout.kind).toBe("unknown");
});

test("a safetensors file's __metadata__ is shown whole: text under its key, JSON indented", () => {
  const p = join(dir, "meta.safetensors");
  const description =
    "a description longer than the hundred characters that a GGUF string value shows before it is cut";
  writeSafetensors(p, [{ name: "foo", dtype: "F32", shape: [1], data: new Uint8Array(4) }], {
    metadata: { description, config: '{"hidden_size":256,"num_blocks":2}' },
  });
  const r = run(p);
  expect(r.code).toBe(0);
  expect(r.out).toContain(
    `\n__metadata__ (2):\n  description  ${description}\n  config\n    {\n      "hidden_size": 256,\n      "num_blocks": 2\n    }\n\ntensors (1, 4 B):`,
  );
  expect(JSON.parse(run("--json", p).out).metadata).toEqual({
    description: { type: "str", value: description },
    config: { type: "str", value: '{"hidden_size":256,"num_blocks":2}' },
  });
});

const tinyDit = resolve(
  import.meta.dir,
  "../../../shared/testdata/krea2-tiny/checkpoints/krea2_tiny_bf16.safetensors",
);
test.skipIf(!existsSync(tinyDit))(
  `a Krea 2 DiT: the layout's names come from ComfyUI's code, not a path into ../shared${existsSync(tinyDit) ? "" : ` [skipped: ${tinyDit} is missing]`}`,
  () => {
    const r = run(tinyDit);
    expect(r.code).toBe(0);
    expect(r.out).toContain("\n  names: ComfyUI comfy/ldm/krea2/model.py names\n");
    expect(r.out.replaceAll(tinyDit, "")).not.toContain("shared/");
  },
);

test("inspect --help / -h: its usage on stdout, exit 0", () => {
  for (const h of ["--help", "-h"]) {
    const r = run(h);
    expect([r.code, r.err]).toEqual([0, ""]);
    expect(r.out).toStartWith("usage: bun apps/cli\n  inspect PATH [--json] [--array-limit N]\n");
    expect(r.out).toContain("__metadata__");
  }
});

test("errors: a broken file exits 1 with one line; usage errors exit 2", () => {
  const bad = join(dir, "bad.gguf");
  writeFileSync(bad, "GGUF\x04\x00\x00\x00");
  const r = run(bad);
  expect(r.code).toBe(1);
  expect(r.err.trim().split("\n")).toEqual([
    expect.stringMatching(/^error E_FORMAT: GGUF version 4 is not supported.*file .*bad\.gguf, offset 4\)$/),
  ]);
  expect(run().code).toBe(2);
  expect(run("--array-limit", "x", gguf).code).toBe(2);
  expect(run("--bogus", gguf).code).toBe(2);
});
