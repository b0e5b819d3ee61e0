// llama and qwen3 on the CPU backend against a float64 reference forward written from the equations
// (testing/tiny-models.ts), on tiny random checkpoints written with our own safetensors and GGUF
// writers: f32, bf16 and fp8-scaled safetensors (HF names, NeoX RoPE) and GGUF (llama.cpp names; llama
// q/k rows permuted to interleaved pairs and run with NORM rope). Then batched prefill vs token-by-token
// decode, KV-cache growth and truncation, loader errors, and (with ../shared) safetensors converted from
// the shared GGUFs giving the GGUF's logits.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createBackend } from "@tp/backend-cpu";
import { GGUF_HF_NAMES, mapName, openGguf, writeSafetensors } from "@tp/formats";
import { type Tensor, TpError } from "@tp/tensor";
import { GenerationSession } from "../generate.ts";
import { loadCausalLM, loadModel } from "../load.ts";
import type { CausalLM } from "../model.ts";
import {
  isProjection,
  maxAbsDiff,
  permuteQk,
  referenceGemma3Logits,
  referenceHead,
  referenceLogits,
  type TinyConfig,
  tinyWeights,
  writeTinyGguf,
  writeTinySafetensors,
} from "../testing/tiny-models.ts";

const MODELS = resolve(import.meta.dir, "../../../../../shared/models");
const HAVE_MODELS = existsSync(join(MODELS, "PROVENANCE.md"));
const NO_MODELS = `skipped: ${MODELS} is absent (the shared models folder is not beside this checkout)`;

const backend = createBackend({ threads: 2 });
const tmp = mkdtempSync(join(tmpdir(), "tp-llm-models-"));
afterAll(() => {
  rmSync(tmp, { recursive: true, force: true });
  backend.dispose();
});

/**
 * f32 forward vs the f64 reference, absolute on logits of magnitude ≤ 15: f32 rounding and summation
 * order over ≤ 96-wide dot products and 2 layers (measured ≤ 3.1e-6).
 */
const F32_LOGIT_TOL = 2e-5;
/** Same weights through two containers (row permutation, rope layout): only summation order differs. */
const SAME_WEIGHTS_TOL = 2e-5;
/**
 * bf16 / fp8 weights, relative to the largest |logit|: the reference uses the decoded stored weights,
 * but the CPU matmul also rounds the activations to bf16 for these formats (backend-cpu matmul.ts;
 * 2^-9 relative per input, compounded over 2 layers; measured 0.35–0.47 %).
 */
const BF16_ACT_REL_TOL = 1e-2;

const LLAMA: TinyConfig = {
  model_type: "llama",
  vocab_size: 96,
  hidden_size: 48,
  num_hidden_layers: 2,
  num_attention_heads: 6,
  num_key_value_heads: 2,
  head_dim: 8,
  intermediate_size: 80,
  rms_norm_eps: 1e-5,
  rope_theta: 10000,
  max_position_embeddings: 64,
  tie_word_embeddings: false,
};
/** Qwen3-like: head_dim (16) ≠ hidden / heads (48 / 4 = 12), tied head, QK-norm. */
const QWEN3: TinyConfig = {
  model_type: "qwen3",
  vocab_size: 96,
  hidden_size: 48,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  head_dim: 16,
  intermediate_size: 64,
  rms_norm_eps: 1e-6,
  rope_theta: 1e6,
  max_position_embeddings: 64,
  tie_word_embeddings: true,
};
const PROMPT = [3, 17, 42, 5, 88, 61, 0, 29, 17];

async function logitsRows(model: CausalLM, ids: readonly number[]): Promise<Float32Array> {
  const t = model.step(ids, { allLogits: true });
  try {
    expect(t.shape).toEqual([ids.length, model.config.vocab_size]);
    return (await backend.read(t)) as Float32Array;
  } finally {
    backend.free(t);
  }
}

async function readFree(t: Tensor): Promise<Float32Array> {
  try {
    return (await backend.read(t)) as Float32Array;
  } finally {
    backend.free(t);
  }
}

function flat(rows: Float64Array[]): Float64Array {
  const out = new Float64Array(rows.reduce((a, r) => a + r.length, 0));
  let o = 0;
  for (const r of rows) {
    out.set(r, o);
    o += r.length;
  }
  return out;
}

for (const cfg of [LLAMA, QWEN3]) {
  describe(`${cfg.model_type} on tiny random checkpoints vs a float64 reference`, () => {
    const w = tinyWeights(cfg, cfg.model_type === "llama" ? 11 : 12);
    const dir = join(tmp, `${cfg.model_type}-f32`);
    writeTinySafetensors(dir, cfg, w);
    const gguf = join(tmp, `${cfg.model_type}.gguf`);
    writeTinyGguf(gguf, cfg, w);
    const expected = flat(referenceLogits(cfg, w, PROMPT));

    test("safetensors f32: config from config.json, logits of every row", async () => {
      const { model, config, format } = loadCausalLM(dir, { backend });
      try {
        expect(format).toBe("safetensors");
        expect(config).toMatchObject({
          architecture: cfg.model_type,
          head_dim: cfg.head_dim,
          rope_mode: "neox",
          tie_word_embeddings: cfg.tie_word_embeddings,
          vocab_size: cfg.vocab_size,
        });
        expect(maxAbsDiff(await logitsRows(model, PROMPT), expected)).toBeLessThan(F32_LOGIT_TOL);
      } finally {
        model.dispose();
      }
    });

    test(`GGUF f32 of the same weights (${cfg.model_type === "llama" ? "q/k permuted, interleaved RoPE" : "NeoX RoPE"})`, async () => {
      const { model, config, format } = loadCausalLM(gguf, { backend });
      try {
        expect(format).toBe("gguf");
        expect(config.rope_mode).toBe(cfg.model_type === "llama" ? "interleaved" : "neox");
        expect(config.tie_word_embeddings).toBe(cfg.tie_word_embeddings);
        expect(maxAbsDiff(await logitsRows(model, PROMPT), expected)).toBeLessThan(F32_LOGIT_TOL);
      } finally {
        model.dispose();
      }
    });

    test("bf16 safetensors and fp8-scaled projections (F8_E4M3 + weight_scale)", async () => {
      for (const [tag, storeAs] of [
        ["bf16", () => "BF16" as const],
        ["fp8", (n: string) => (isProjection(n) ? ("F8_E4M3" as const) : ("BF16" as const))],
      ] as const) {
        const d = join(tmp, `${cfg.model_type}-${tag}`);
        const held = writeTinySafetensors(d, cfg, w, storeAs);
        const want = flat(referenceLogits(cfg, held, PROMPT));
        const { model } = loadCausalLM(d, { backend });
        try {
          const got = await logitsRows(model, PROMPT);
          const tol = BF16_ACT_REL_TOL * want.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
          expect(maxAbsDiff(got, want)).toBeLessThan(tol);
          // and fp8 itself moved the logits by more than that: the check sees the stored weights' scale
          if (tag === "fp8") expect(maxAbsDiff(want, expected)).toBeGreaterThan(tol);
        } finally {
          model.dispose();
        }
      }
    });

    test("forward(ids, { collect }): hidden_states[k] = the f64 reference of the first k layers, no cache", async () => {
      const { model } = loadCausalLM(gguf, { backend });
      try {
        const L = cfg.num_hidden_layers;
        const before = backend.memory.current;
        const collect = [L, 0, 1]; // any order; L = the last block's output, before the final norm
        const states = model.forward(PROMPT, { collect });
        expect(states.map((t) => t.shape)).toEqual(collect.map(() => [PROMPT.length, cfg.hidden_size]));
        const emb = w.get("model.embed_tokens.weight")?.values as Float32Array;
        const H = cfg.hidden_size;
        for (let i = 0; i < collect.length; i++) {
          const k = collect[i] as number;
          const h = await readFree(states[i] as Tensor);
          if (k === 0)
            expect([...h]).toEqual(PROMPT.flatMap((id) => [...emb.subarray(id * H, (id + 1) * H)]));
          const want = flat(referenceLogits({ ...cfg, num_hidden_layers: k }, w, PROMPT));
          expect(maxAbsDiff(referenceHead(cfg, w, h), want)).toBeLessThan(F32_LOGIT_TOL);
        }
        expect([model.cached, model.kvBytes]).toEqual([0, 0]); // the cache was neither read nor written
        expect(backend.memory.current).toBe(before); // only what was returned outlived the forward
      } finally {
        model.dispose();
      }
    });

    test("prefill then decode one token at a time = one batched forward; KV growth; truncate", async () => {
      const once = loadCausalLM(dir, { backend }).model;
      const batched = await logitsRows(once, PROMPT);
      once.dispose();
      const { model } = loadCausalLM(dir, { backend, kvInitialRows: 2 });
      try {
        const V = cfg.vocab_size;
        const rows: Float32Array[] = [await readFree(model.step(PROMPT.slice(0, 3)))];
        expect(model.cached).toBe(3);
        expect(model.capacity).toBe(4); // max(prompt + 1, kvInitialRows 2)
        for (let i = 3; i < PROMPT.length; i++) rows.push(await readFree(model.step([PROMPT[i] as number])));
        expect(model.capacity).toBeGreaterThanOrEqual(PROMPT.length); // grew ×1.5 (≥ +1024, capped at the context 64)
        expect(model.capacity).toBe(64);
        expect(model.kvBytes).toBe(
          2 * cfg.num_hidden_layers * 64 * cfg.num_key_value_heads * cfg.head_dim * 4,
        );
        for (let r = 2; r < PROMPT.length; r++) {
          const want = batched.subarray(r * V, (r + 1) * V);
          expect(maxAbsDiff(rows[r - 2] as Float32Array, want)).toBeLessThan(SAME_WEIGHTS_TOL);
        }
        // forget the last 4 tokens and feed other ones: the logits are those of the new sequence
        model.truncate(PROMPT.length - 4);
        const alt = [...PROMPT.slice(0, -4), 7, 7];
        const last = await readFree(model.step([7, 7]));
        const ref = referenceLogits(cfg, w, alt);
        expect(maxAbsDiff(last, ref[ref.length - 1] as Float64Array)).toBeLessThan(F32_LOGIT_TOL);
        expect(model.cached).toBe(alt.length);
      } finally {
        model.dispose();
      }
    });
  });
}

describe("loader and step errors", () => {
  const w = tinyWeights(QWEN3, 3);
  const dir = join(tmp, "errors-ok");
  writeTinySafetensors(dir, QWEN3, w);

  function expectTp(fn: () => unknown, code: string, ...parts: string[]): void {
    try {
      fn();
    } catch (e) {
      expect(e).toBeInstanceOf(TpError);
      expect((e as TpError).code).toBe(code as TpError["code"]);
      for (const p of parts) expect((e as Error).message).toContain(p);
      return;
    }
    throw new Error("expected a TpError");
  }

  test("unknown architecture: E_UNSUPPORTED listing the known ones", () => {
    const d = join(tmp, "errors-arch");
    writeTinySafetensors(d, QWEN3, w);
    writeFileSync(
      join(d, "config.json"),
      JSON.stringify({ ...QWEN3, model_type: "mamba", architectures: ["MambaForCausalLM"] }),
    );
    expectTp(() => loadCausalLM(d, { backend }), "E_UNSUPPORTED", "'mamba'", "llama", "qwen3");
  });

  test("missing and mis-shaped tensors: E_FORMAT naming file and tensor", () => {
    const d = join(tmp, "errors-missing");
    mkdirSync(d, { recursive: true });
    const keep = [...w].filter(([n]) => n !== "model.layers.1.mlp.up_proj.weight");
    writeSafetensors(
      join(d, "model.safetensors"),
      keep.map(([name, t]) => ({
        name,
        dtype: "F32",
        shape: t.shape,
        data: new Uint8Array(t.values.buffer),
      })),
    );
    writeFileSync(join(d, "config.json"), JSON.stringify(QWEN3));
    expectTp(
      () => loadCausalLM(d, { backend }),
      "E_FORMAT",
      "model.layers.1.mlp.up_proj.weight",
      "model.safetensors",
    );

    const d2 = join(tmp, "errors-shape");
    writeTinySafetensors(d2, QWEN3, w);
    writeFileSync(join(d2, "config.json"), JSON.stringify({ ...QWEN3, intermediate_size: 32 }));
    expectTp(() => loadCausalLM(d2, { backend }), "E_FORMAT", "mlp.gate_proj.weight", "[32, 48]");
    expect(backend.memory.current).toBe(0); // norms uploaded before the failure were freed
  });

  test("no config.json: E_IO; a safetensors checkpoint without tokenizer.json: loadModel E_IO", () => {
    const d = join(tmp, "errors-noconfig");
    writeTinySafetensors(d, QWEN3, w);
    rmSync(join(d, "config.json"));
    expectTp(() => loadCausalLM(d, { backend }), "E_IO", "config.json");
    expectTp(() => loadModel(dir, { backend }), "E_IO", "tokenizer.json");
    expect(backend.memory.current).toBe(0);
  });

  test("step: empty, out-of-vocabulary id, context window full (nothing written)", () => {
    const { model } = loadCausalLM(dir, { backend, maxContext: 8 });
    try {
      expectTp(() => model.step([]), "E_ARG", "no token ids");
      expectTp(() => model.step([1, 96]), "E_ARG", "96", "[0, 96)");
      expectTp(() => model.forward([1, -1], { collect: [1] }), "E_ARG", "forward: token id -1", "[0, 96)");
      expectTp(() => model.forward([1], { collect: [3] }), "E_ARG", "forward: layer 3", "[0, 2]");
      expectTp(() => model.forward([1], { collect: [] }), "E_ARG", "forward: no layers asked for");
      backend.free(model.step([1, 2, 3, 4, 5, 6]));
      expectTp(() => model.step([1, 2, 3]), "E_ARG", "context window full", "--ctx");
      expect(model.cached).toBe(6);
      expectTp(() => loadCausalLM(dir, { backend, maxContext: 65 }), "E_ARG", "maxContext", "from 1 to 64");
    } finally {
      model.dispose();
    }
    expect(backend.memory.current).toBe(0);
  });
});

describe.skipIf(!HAVE_MODELS)(
  `safetensors converted from the shared GGUFs give the GGUF's logits${HAVE_MODELS ? "" : ` — ${NO_MODELS}`}`,
  () => {
    for (const file of ["llama-tiny-F32.gguf", "qwen3-tiny-F32.gguf"]) {
      test(file, async () => {
        const path = join(MODELS, "synthetic", file);
        const ref = loadCausalLM(path, { backend, maxContext: 64 });
        const c = ref.config;
        const g = openGguf(path);
        const table = GGUF_HF_NAMES[c.architecture];
        if (table === undefined) throw new Error("no table");
        // HF names; llama q/k rows back from interleaved pairs to NeoX halves (inverse of llama.cpp's permute)
        const tensors = g.tensors.map((t) => {
          const name = mapName(table, t.name)[0]?.name as string;
          let data = g.data(t.name);
          if (c.architecture === "llama" && /self_attn\.[qk]_proj\.weight$/.test(name)) {
            const heads = name.includes("q_proj") ? c.num_attention_heads : c.num_key_value_heads;
            const v = new Float32Array(data.slice().buffer);
            data = new Uint8Array(permuteQk(v, heads, c.head_dim, c.hidden_size, true).buffer);
          }
          return { name, dtype: "F32", shape: [...t.shape], data };
        });
        const d = join(tmp, `shared-${file}`);
        mkdirSync(d, { recursive: true });
        writeSafetensors(join(d, "model.safetensors"), tensors);
        writeFileSync(
          join(d, "config.json"),
          JSON.stringify({
            model_type: c.architecture,
            hidden_size: c.hidden_size,
            num_hidden_layers: c.num_hidden_layers,
            num_attention_heads: c.num_attention_heads,
            num_key_value_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            intermediate_size: c.intermediate_size,
            rms_norm_eps: c.rms_norm_eps,
            rope_theta: c.rope_theta,
            max_position_embeddings: c.max_position_embeddings,
            tie_word_embeddings: c.tie_word_embeddings,
            vocab_size: c.vocab_size,
          }),
        );
        const st = loadCausalLM(d, { backend, maxContext: 64 });
        try {
          expect({ ...st.config, rope_mode: "x" }).toEqual({ ...c, rope_mode: "x" });
          const ids = [1, 100, 200, 300, 17, 5, 400];
          const a = await logitsRows(ref.model, ids);
          const b = await logitsRows(st.model, ids);
          expect(maxAbsDiff(a, b)).toBeLessThan(SAME_WEIGHTS_TOL);
        } finally {
          st.model.dispose();
          ref.model.dispose();
          g.close();
        }
      });
    }
  },
);

/**
 * Gemma 3: 7 layers (layers 0-4 and 6 slide with a window of 4, layer 5 is global), GQA 4 : 2,
 * head_dim 16, linear RoPE scaling ×8 on the global layer, local θ 10000; the 9-token prompt runs past
 * the window. Logits reach ±22 (√H-scaled embeddings, sandwich norms), so the f32 tolerance is relative.
 */
const GEMMA3: TinyConfig = {
  model_type: "gemma3",
  vocab_size: 96,
  hidden_size: 48,
  num_hidden_layers: 7,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  head_dim: 16,
  intermediate_size: 64,
  rms_norm_eps: 1e-6,
  rope_theta: 1e6,
  max_position_embeddings: 64,
  tie_word_embeddings: true,
  sliding_window: 4,
  rope_local_base_freq: 10000,
  rope_scaling_factor: 8,
};
/**
 * f32 forward vs the f64 reference, relative to the largest |logit|: f32 rounding and summation order
 * over 7 layers of ≤ 64-wide dot products (measured 1.5e-7 relative).
 */
const GEMMA_F32_REL_TOL = 1e-5;

describe("gemma3 on tiny random checkpoints vs a float64 reference", () => {
  const w = tinyWeights(GEMMA3, 21);
  const gguf = join(tmp, "gemma3.gguf");
  writeTinyGguf(gguf, GEMMA3, w);
  const expected = flat(referenceGemma3Logits(GEMMA3, w, PROMPT));
  const tol = GEMMA_F32_REL_TOL * expected.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
  const windowMatters = maxAbsDiff(
    expected,
    flat(referenceGemma3Logits({ ...GEMMA3, sliding_window: 64 }, w, PROMPT)),
  );

  test("the reference itself: the window and the RoPE scaling change the logits", () => {
    expect(windowMatters).toBeGreaterThan(100 * tol);
    const unscaled = flat(referenceGemma3Logits({ ...GEMMA3, rope_scaling_factor: 1 }, w, PROMPT));
    expect(maxAbsDiff(expected, unscaled)).toBeGreaterThan(100 * tol);
  });

  test("GGUF f32 (norms stored with the +1): config and logits of every row", async () => {
    const { model, config } = loadCausalLM(gguf, { backend });
    try {
      expect(config).toMatchObject({
        architecture: "gemma3",
        sliding_window: 4,
        rope_local_base_freq: 10000,
        rope_scaling_factor: 8,
        query_pre_attn_scalar: 16,
        final_logit_softcapping: null,
        norm_plus_one: false,
      });
      expect((config.layer_types ?? []).map((t) => t[0])).toEqual([..."sssssfs"]);
      expect(maxAbsDiff(await logitsRows(model, PROMPT), expected)).toBeLessThan(tol);
    } finally {
      model.dispose();
    }
  });

  test("safetensors f32, gemma3_text and Gemma3ForConditionalGeneration (zero-centred norms get +1 at load)", async () => {
    for (const multimodal of [false, true]) {
      const dir = join(tmp, `gemma3-st-${multimodal}`);
      const held = writeTinySafetensors(dir, GEMMA3, w, () => "F32", multimodal);
      const want = flat(referenceGemma3Logits(GEMMA3, held, PROMPT));
      const { model, config } = loadCausalLM(dir, { backend });
      try {
        expect(config).toMatchObject({ architecture: "gemma3", norm_plus_one: true, rope_scaling_factor: 8 });
        expect(maxAbsDiff(await logitsRows(model, PROMPT), want)).toBeLessThan(tol);
      } finally {
        model.dispose();
      }
    }
  });

  test("final_logit_softcapping: logits ← c·tanh(logits / c)", async () => {
    const cfg = { ...GEMMA3, final_logit_softcapping: 10 };
    const path = join(tmp, "gemma3-softcap.gguf");
    writeTinyGguf(path, cfg, w);
    const want = flat(referenceGemma3Logits(cfg, w, PROMPT));
    const { model } = loadCausalLM(path, { backend });
    try {
      const got = await logitsRows(model, PROMPT);
      expect(maxAbsDiff(got, want)).toBeLessThan(GEMMA_F32_REL_TOL * 10);
      expect(Math.max(...got.map(Math.abs))).toBeLessThan(10);
    } finally {
      model.dispose();
    }
  });

  test("forward(ids, { collect }): hidden states with the window, no cache", async () => {
    const { model } = loadCausalLM(gguf, { backend });
    try {
      const states = model.forward(PROMPT, { collect: [0, 6] });
      const [h0, h6] = [await readFree(states[0] as Tensor), await readFree(states[1] as Tensor)];
      for (const [got, k] of [
        [h0, 0],
        [h6, 6],
      ] as const) {
        const want = flat(referenceGemma3Logits(GEMMA3, w, PROMPT, k));
        const scale = want.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
        expect(maxAbsDiff(got, want)).toBeLessThan(GEMMA_F32_REL_TOL * scale);
      }
      expect(model.kvBytes).toBe(0);
    } finally {
      model.dispose();
    }
  });

  test("sliding-window ring: 4 + 2 rows per local layer, chunked prefill and decode = the reference; truncate", async () => {
    const { model } = loadCausalLM(gguf, { backend, kvRingBatch: 2, kvInitialRows: 16 });
    try {
      const V = GEMMA3.vocab_size;
      // 5 rows in chunks of 2 (ring 6 rows: it moves on), then one token at a time: the ring wraps
      const first = await logitsRows(model, PROMPT.slice(0, 5));
      const rows: Float32Array[] = [];
      for (let i = 5; i < PROMPT.length; i++) rows.push(await readFree(model.step([PROMPT[i] as number])));
      expect(maxAbsDiff(first, expected.subarray(0, 5 * V))).toBeLessThan(tol);
      for (let i = 5; i < PROMPT.length; i++) {
        expect(maxAbsDiff(rows[i - 5] as Float32Array, expected.subarray(i * V, (i + 1) * V))).toBeLessThan(
          tol,
        );
      }
      // 6 local layers × 6 rows + 1 global layer × 16 rows, K and V, 2 heads × 16 f32
      expect(model.kvBytes).toBe(2 * (6 * 6 + 16) * 2 * 16 * 4);
      expect(backend.memory.current).toBeGreaterThan(0);
      // the ring dropped positions: truncating far back is refused, near back works
      const floor = model.truncateFloor;
      expect(floor).toBeGreaterThan(0);
      expect(floor).toBeLessThanOrEqual(PROMPT.length);
      expectGemmaTp(() => model.truncate(floor - 1), "E_STATE", `${floor}`);
      model.truncate(floor);
      const alt = [...PROMPT.slice(0, floor), 7];
      const last = await readFree(model.step([7]));
      const ref = referenceGemma3Logits(GEMMA3, w, alt);
      expect(maxAbsDiff(last, ref[ref.length - 1] as Float64Array)).toBeLessThan(tol);
      // back to 0 always works: the same logits as a fresh model
      model.truncate(0);
      expect(maxAbsDiff(await logitsRows(model, PROMPT), expected)).toBeLessThan(tol);
    } finally {
      model.dispose();
    }
  });

  test("a step larger than the ring's batch is split; allLogits joins the rows", async () => {
    const { model } = loadCausalLM(gguf, { backend, kvRingBatch: 3 });
    try {
      expect(maxAbsDiff(await logitsRows(model, PROMPT), expected)).toBeLessThan(tol);
      const last = await readFree(model.step([1, 2, 3, 4, 5, 6, 7]));
      const ref = referenceGemma3Logits(GEMMA3, w, [...PROMPT, 1, 2, 3, 4, 5, 6, 7]);
      expect(maxAbsDiff(last, ref[ref.length - 1] as Float64Array)).toBeLessThan(tol);
    } finally {
      model.dispose();
    }
  });
});

describe("gemma3 in a GenerationSession", () => {
  test("a prompt sharing less than the ring's floor with the cache is prefilled from 0, same tokens as a fresh session", async () => {
    const w = tinyWeights(GEMMA3, 21);
    const path = join(tmp, "gemma3-tok.gguf");
    writeTinyGguf(path, GEMMA3, w, { tokens: GEMMA3.vocab_size });
    const greedy = { sampling: { temperature: 0 }, stopIds: [] as number[] };
    const a = loadModel(path, { backend, kvRingBatch: 2 });
    const b = loadModel(path, { backend, kvRingBatch: 2 });
    try {
      const s = new GenerationSession(a.model, a.tokenizer, { seed: 1 });
      await s.generate(PROMPT, { ...greedy, maxNewTokens: 6 });
      expect(a.model.truncateFloor).toBeGreaterThan(3);
      const next = [PROMPT[0] as number, PROMPT[1] as number, PROMPT[2] as number, 9, 9];
      const r = await s.generate(next, { ...greedy, maxNewTokens: 4 });
      expect(r.reusedTokens).toBe(0); // 3 shared tokens lie below the floor: start over
      const fresh = await new GenerationSession(b.model, b.tokenizer, { seed: 1 }).generate(next, {
        ...greedy,
        maxNewTokens: 4,
      });
      expect(r.ids).toEqual(fresh.ids);
      // a prompt extending the cached one reuses it
      const more = await s.generate([...next, ...r.ids, 4], { ...greedy, maxNewTokens: 1 });
      expect(more.reusedTokens).toBeGreaterThan(next.length);
    } finally {
      a.model.dispose();
      b.model.dispose();
    }
  });
});

function expectGemmaTp(fn: () => unknown, code: string, ...parts: string[]): void {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(TpError);
    expect((e as TpError).code).toBe(code as TpError["code"]);
    for (const p of parts) expect((e as Error).message).toContain(p);
    return;
  }
  throw new Error("expected a TpError");
}
