// Everything loadModel checks before any forward, on tiny random models written with our own GGUF and
// safetensors writers (testing/tiny-models.ts) and then altered: tokenizer vs embedding sizes (GGUF:
// equal, as llama.cpp; tokenizer.json: at most the rows, as transformers), out-of-range hyper-parameters
// (E_FORMAT naming the file and the key), paths that are not models, weight formats the backend cannot
// run, maxContext naming itself; then non-finite logits (NaN weights) as one E_NUMERIC naming the file
// on every read path of the generation loop, and step(null).
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createBackend } from "@tp/backend-cpu";
import { ggufKv, openGguf, serializeGguf } from "@tp/formats";
import { type Backend, TpError } from "@tp/tensor";
import { BYTE_TO_UNICODE, HF_SPLIT_PATTERNS } from "@tp/tokenizer";
import { GenerationSession } from "./generate.ts";
import { loadCausalLM, loadModel } from "./load.ts";
import {
  type TinyConfig,
  type TinyGgufOptions,
  tinyWeights,
  writeTinyGguf,
  writeTinySafetensors,
} from "./testing/tiny-models.ts";
import { startVulkan } from "./testing/vulkan.ts";

const backend = createBackend({ threads: 2 });
const tmp = mkdtempSync(join(tmpdir(), "tp-llm-load-"));
/** The Vulkan backend for the non-finite checks, or why it does not start here. */
const vulkan = startVulkan();
afterAll(() => {
  rmSync(tmp, { recursive: true, force: true });
  backend.dispose();
  vulkan.backend?.dispose();
});

const QWEN3: TinyConfig = {
  model_type: "qwen3",
  vocab_size: 96,
  hidden_size: 32,
  num_hidden_layers: 1,
  num_attention_heads: 2,
  num_key_value_heads: 1,
  head_dim: 16,
  intermediate_size: 48,
  rms_norm_eps: 1e-6,
  rope_theta: 1e6,
  max_position_embeddings: 64,
  tie_word_embeddings: true,
};
const W = tinyWeights(QWEN3, 5);
let serial = 0;

/** A tiny qwen3 GGUF with a 96-token tokenizer (unless `options` says otherwise). */
function gguf(options: TinyGgufOptions = {}, config: TinyConfig = QWEN3): string {
  const path = join(tmp, `m${serial++}.gguf`);
  writeTinyGguf(path, config, config === QWEN3 ? W : tinyWeights(config, 5), {
    tokens: config.vocab_size,
    ...options,
  });
  return path;
}

/** The TpError `fn` throws. */
function thrown(fn: () => unknown): TpError {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(TpError);
    return e as TpError;
  }
  throw new Error("expected a TpError");
}

function expectError(e: TpError, code: string, ...parts: string[]): void {
  expect(e.code).toBe(code as TpError["code"]);
  expect(e.message.split("\n").length).toBe(1);
  for (const p of parts) expect(e.message).toContain(p);
}

describe("tokenizer and embedding sizes, checked at load", () => {
  test("GGUF: the tokenizer must have one token per embedding row (llama.cpp), in both directions", () => {
    const ok = loadModel(gguf(), { backend });
    expect(ok.tokenizer.vocabSize).toBe(96);
    ok.model.dispose();
    for (const n of [100, 90]) {
      const path = gguf({ tokens: n });
      expectError(
        thrown(() => loadModel(path, { backend })),
        "E_FORMAT",
        path,
        `${n} tokens`,
        "96 rows",
      );
    }
    const path = gguf({ kv: [ggufKv("qwen3.vocab_size", "u32", 100)] });
    expectError(
      thrown(() => loadModel(path, { backend })),
      "E_FORMAT",
      "qwen3.vocab_size",
      "100",
      "96",
    );
    expect(backend.memory.current).toBe(0);
  });

  /** A byte-level BPE tokenizer.json: 256 byte tokens plus `added` added tokens (ids 256 …). */
  function tokenizerJson(dir: string, added: number): void {
    const vocab = Object.fromEntries(Array.from(BYTE_TO_UNICODE, (cp, i) => [String.fromCodePoint(cp), i]));
    const pattern = Object.keys(HF_SPLIT_PATTERNS)[0] as string;
    const json = {
      version: "1.0",
      added_tokens: Array.from({ length: added }, (_, i) => ({
        id: 256 + i,
        content: `<|t${i}|>`,
        special: true,
      })),
      normalizer: null,
      pre_tokenizer: {
        type: "Sequence",
        pretokenizers: [
          { type: "Split", pattern: { Regex: pattern }, behavior: "Isolated", invert: false },
          { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
        ],
      },
      decoder: { type: "ByteLevel" },
      model: { type: "BPE", vocab, merges: [], byte_fallback: false },
    };
    writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(json));
  }

  test("safetensors: a tokenizer.json smaller than the rows is fine (Qwen's padding), larger is E_FORMAT", () => {
    const big: TinyConfig = { ...QWEN3, vocab_size: 300 };
    const w = tinyWeights(big, 5);
    const d = join(tmp, "st-smaller");
    writeTinySafetensors(d, big, w);
    tokenizerJson(d, 2); // 258 tokens, 300 rows
    const ok = loadModel(d, { backend });
    expect(ok.tokenizer.vocabSize).toBe(258);
    ok.model.dispose();

    const d2 = join(tmp, "st-larger");
    writeTinySafetensors(d2, QWEN3, W);
    tokenizerJson(d2, 2); // 258 tokens, 96 rows
    expectError(
      thrown(() => loadModel(d2, { backend })),
      "E_FORMAT",
      join(d2, "tokenizer.json"),
      "258 tokens",
      "96 rows",
    );

    const d3 = join(tmp, "st-config-vocab");
    writeTinySafetensors(d3, { ...QWEN3, vocab_size: 128 }, W); // config says 128, the embedding has 96
    expectError(
      thrown(() => loadCausalLM(d3, { backend })),
      "E_FORMAT",
      join(d3, "config.json"),
      "'vocab_size' is 128",
      "96 rows",
    );
    expect(backend.memory.current).toBe(0);
  });
});

describe("a misshaped norm vector: E_FORMAT naming the tensor and the size the config implies", () => {
  // q_norm is one scale per head dimension: head_dim = 16 here (config.json), whatever shape the file gives it
  const cases: [string, number[]][] = [
    ["q_norm reshaped to [2, 8] (same count, two axes)", [2, 8]],
    ["q_norm of 32 (2 × head_dim)", [32]],
    ["q_norm of 8", [8]],
  ];
  for (const [name, shape] of cases) {
    test(name, () => {
      const w: typeof W = new Map(W);
      const n = shape.reduce((a, b) => a * b, 1);
      w.set("model.layers.0.self_attn.q_norm.weight", { shape, values: new Float32Array(n).fill(1) });
      const d = join(tmp, `st-q-norm-${shape.join("x")}`);
      writeTinySafetensors(d, QWEN3, w);
      expectError(
        thrown(() => loadCausalLM(d, { backend })),
        "E_FORMAT",
        "model.layers.0.self_attn.q_norm.weight",
        "expected a float vector of 16",
        `[${shape.join(", ")}]`,
      );
      expect(backend.memory.current).toBe(0);
    });
  }
});

describe("hyper-parameters out of range: E_FORMAT naming the file and the key", () => {
  const cases: [string, TinyGgufOptions, string][] = [
    ["eps < 0", { kv: [ggufKv("qwen3.attention.layer_norm_rms_epsilon", "f32", -1)] }, "-1"],
    ["eps NaN", { kv: [ggufKv("qwen3.attention.layer_norm_rms_epsilon", "f32", Number.NaN)] }, "NaN"],
    ["freq_base 0", { kv: [ggufKv("qwen3.rope.freq_base", "f32", 0)] }, "qwen3.rope.freq_base"],
    ["freq_base NaN", { kv: [ggufKv("qwen3.rope.freq_base", "f32", Number.NaN)] }, "NaN"],
    ["freq_base < 0", { kv: [ggufKv("qwen3.rope.freq_base", "f32", -5)] }, "-5"],
    ["rope dims 0", { kv: [ggufKv("qwen3.rope.dimension_count", "u32", 0)] }, "got 0"],
    ["rope dims odd", { kv: [ggufKv("qwen3.rope.dimension_count", "u32", 7)] }, "got 7"],
    ["rope dims > head_dim", { kv: [ggufKv("qwen3.rope.dimension_count", "u32", 32)] }, "got 32"],
  ];
  for (const [what, options, part] of cases) {
    test(`GGUF ${what}`, () => {
      const path = gguf(options);
      const key = options.kv?.[0]?.key as string;
      expectError(
        thrown(() => loadCausalLM(path, { backend })),
        "E_FORMAT",
        path,
        `'${key}'`,
        part,
      );
    });
  }

  test("GGUF: a missing epsilon is still 'missing metadata key'", () => {
    const path = gguf({ kv: [{ key: "qwen3.attention.layer_norm_rms_epsilon", value: null }] });
    expectError(
      thrown(() => loadCausalLM(path, { backend })),
      "E_FORMAT",
      "missing metadata key",
    );
  });

  const hf: [string, Record<string, unknown>, string, string][] = [
    ["rms_norm_eps -1", { rms_norm_eps: -1 }, "rms_norm_eps", "-1"],
    ["rms_norm_eps null", { rms_norm_eps: null }, "rms_norm_eps", "null"],
    ["rope_theta 0", { rope_theta: 0 }, "rope_theta", "got 0"],
    ["rope_theta -1", { rope_theta: -1 }, "rope_theta", "-1"],
  ];
  for (const [what, patch, key, part] of hf) {
    test(`config.json ${what}`, () => {
      const d = join(tmp, `hf-${what.replace(/\W+/g, "-")}`);
      writeTinySafetensors(d, QWEN3, W);
      writeFileSync(
        join(d, "config.json"),
        JSON.stringify({ architectures: ["Qwen3ForCausalLM"], ...QWEN3, ...patch }),
      );
      expectError(
        thrown(() => loadCausalLM(d, { backend })),
        "E_FORMAT",
        join(d, "config.json"),
        key,
        part,
      );
    });
  }
  test("nothing was left allocated", () => expect(backend.memory.current).toBe(0));
});

describe("layers past the declared depth: E_FORMAT naming the first stray tensor", () => {
  test("GGUF: blk.1.* in a file whose block_count says 1", () => {
    const path = gguf({ kv: [ggufKv("qwen3.block_count", "u32", 1)] }, { ...QWEN3, num_hidden_layers: 2 });
    const e = thrown(() => loadModel(path, { backend }));
    expectError(e, "E_FORMAT", path, "declares qwen3.block_count = 1 but holds layer 1 (blk.1.");
    expect(e.tensor?.startsWith("blk.1.")).toBe(true);
  });
  test("safetensors: model.layers.1.* with num_hidden_layers 1 in config.json", () => {
    const dir = join(tmp, "hf-stray");
    mkdirSync(dir, { recursive: true });
    const two = { ...QWEN3, num_hidden_layers: 2 };
    writeTinySafetensors(dir, two, tinyWeights(two, 5));
    const cfg = JSON.parse(readFileSync(join(dir, "config.json"), "utf8"));
    writeFileSync(join(dir, "config.json"), JSON.stringify({ ...cfg, num_hidden_layers: 1 }));
    const e = thrown(() => loadCausalLM(dir, { backend }));
    expectError(e, "E_FORMAT", "num_hidden_layers = 1 but the checkpoint holds layer 1 (model.layers.1.");
    expect(backend.memory.current).toBe(0);
  });
});

describe("tensors the model does not read: listed for a warning", () => {
  test("a clean file: none; an extra tensor in a GGUF: named, the model still loads", () => {
    const clean = loadCausalLM(gguf(), { backend });
    expect(clean.unexpected).toEqual([]);
    clean.model.dispose();
    // The output norm's bytes a second time, under a name no architecture reads.
    const path = gguf({
      tensor: (t) => (t.name === "output_norm.weight" ? { ...t, name: "blk.0.extra.weight" } : t),
    });
    const e = thrown(() => loadCausalLM(path, { backend }));
    expect(e.tensor).toBe("output_norm.weight"); // renamed away: missing, named
    const g = openGguf(gguf());
    const extra = join(tmp, "extra.gguf");
    writeFileSync(
      extra,
      serializeGguf(
        [...g.metadata.entries.values()].map((kv) => ({ key: kv.key, type: kv.type, value: kv.value })),
        [
          ...g.tensors.map((t) => ({
            name: t.name,
            type: t.dtype,
            shape: [...t.shape],
            data: g.data(t.name),
          })),
          { name: "blk.0.extra.weight", type: "f32", shape: [4], data: new Uint8Array(16) },
        ],
      ),
    );
    g.close();
    const loaded = loadCausalLM(extra, { backend });
    expect(loaded.unexpected).toEqual(["blk.0.extra.weight"]);
    loaded.model.dispose();
    expect(backend.memory.current).toBe(0);
  });
});

describe("paths that are not models, formats the backend cannot run, options", () => {
  test("a text file, config.json itself, an empty directory: 'not a GGUF or safetensors file'; a device: E_IO", () => {
    const d = join(tmp, "plain");
    writeTinySafetensors(d, QWEN3, W);
    const empty = join(tmp, "empty");
    mkdirSync(empty);
    // a device (or FIFO) is refused before it is opened: opening a FIFO would block
    expectError(
      thrown(() => loadModel("/dev/null", { backend })),
      "E_IO",
      "the model /dev/null is a character device, not a regular file or a folder",
    );
    const paths = [join(d, "config.json"), empty];
    if (existsSync("/proc/self/maps")) paths.push("/proc/self/maps");
    for (const p of paths) {
      const e = thrown(() => loadModel(p, { backend }));
      expectError(e, "E_FORMAT", p, "not a GGUF or safetensors file (or a directory holding one)");
    }
  });

  test("a weight type the backend's matmul does not take (I8) fails at load, naming the tensor", () => {
    const path = gguf({
      tensor: (t) =>
        t.name === "blk.0.ffn_up.weight" ? { ...t, type: "I8", data: new Uint8Array(t.data.length / 4) } : t,
    });
    const e = thrown(() => loadCausalLM(path, { backend }));
    expectError(e, "E_UNSUPPORTED", path, "blk.0.ffn_up.weight", "matmul", "i8");
    expect(backend.memory.current).toBe(0);
  });

  test("maxContext out of range names maxContext, not a CLI flag; step(null) is E_ARG", () => {
    const path = gguf();
    for (const m of [0, 65, 1.5]) {
      const e = thrown(() => loadCausalLM(path, { backend, maxContext: m }));
      expectError(e, "E_ARG", "maxContext", "from 1 to 64");
      expect(e.message).not.toContain("--ctx");
    }
    const { model } = loadCausalLM(path, { backend });
    try {
      expectError(
        thrown(() => model.step(null as unknown as number[])),
        "E_ARG",
        "ids must be an array",
      );
      expectError(
        thrown(() => model.step("12" as unknown as number[])),
        "E_ARG",
        "ids must be an array",
      );
    } finally {
      model.dispose();
    }
    expect(backend.memory.current).toBe(0);
  });
});

// The same on every backend: the row is checked by count_nonfinite on the device (the Vulkan argmax and
// top_k order NaN below numbers, so reading their answer alone misses it).
for (const [name, b] of [
  ["cpu", backend],
  ["vulkan", vulkan.backend],
] as const) {
  const skip = b === undefined ? `: skipped, no Vulkan device starts (${vulkan.reason})` : "";
  describe.skipIf(b === undefined)(
    `non-finite logits on ${name}: one E_NUMERIC naming the position, the model file and its NaN tensor, however the row is read${skip}`,
    () => {
      // NaN in the final norm's scale: every logit is NaN.
      const nanPath = gguf({
        tensor: (t) =>
          t.name === "output_norm.weight"
            ? { ...t, data: new Uint8Array(new Float32Array(32).fill(Number.NaN).buffer) }
            : t,
      });
      const modes: [string, object][] = [
        ["greedy (the backend's argmax)", { temperature: 0 }],
        ["greedy with a penalty (the whole row)", { temperature: 0, repeatPenalty: 1.3 }],
        ["top-k sampling (the backend's top-k candidates)", { temperature: 0.8, topK: 40 }],
        ["top-k 0 sampling (the whole row)", { temperature: 0.8, topK: 0 }],
      ];
      for (const [what, sampling] of modes) {
        test(what, async () => {
          const { model, tokenizer } = loadModel(nanPath, { backend: b as Backend });
          try {
            const session = new GenerationSession(model, tokenizer, { seed: 1 });
            let err: unknown;
            try {
              await session.generate([1, 5, 9], { sampling, maxNewTokens: 4 });
            } catch (e) {
              err = e;
            }
            expect(err).toBeInstanceOf(TpError);
            expectError(err as TpError, "E_NUMERIC", nanPath, "logits at position 2: all 96 values are NaN");
            expect((err as TpError).message).toContain(
              "the model file holds NaN in tensor output_norm.weight (element 0)",
            );
          } finally {
            model.dispose();
          }
        });
      }
      test("nothing was left allocated", () => expect((b as Backend).memory.current).toBe(0));
    },
  );
}

describe("token ids are checked once, by the model", () => {
  test("a prompt id outside the vocabulary: E_ARG from step naming the id and the vocabulary size", async () => {
    const { model, tokenizer } = loadModel(gguf(), { backend });
    try {
      const session = new GenerationSession(model, tokenizer, { seed: 1 });
      let err: unknown;
      try {
        await session.generate([1, 5, 96], { maxNewTokens: 2 });
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(TpError);
      expectError(err as TpError, "E_ARG", "token id 96", "[0, 96)");
      expect(model.cached).toBe(0); // nothing was written
    } finally {
      model.dispose();
    }
    expect(backend.memory.current).toBe(0);
  });
});
