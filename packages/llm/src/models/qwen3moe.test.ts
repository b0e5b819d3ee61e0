// qwen3moe on the CPU backend against a float64 reference forward written from the equations
// (testing/tiny-moe.ts: softmax over all experts, top-k, renormalised weights, the weighted sum of the
// chosen experts) on a tiny random GGUF written with our own writer: every prompt row in one batched
// forward (tokens routed unevenly: matmul_id's grouped GEMMs), then decode one token at a time
// (matmul_id's single rows), and the loader's errors. Parity with llama.cpp on the shared files is in
// ../parity.test.ts.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createBackend } from "@tp/backend-cpu";
import { ggufKv } from "@tp/formats";
import { quantizeConvRot } from "@tp/quant";
import { TpError, Weight } from "@tp/tensor";
import { loadCausalLM } from "../load.ts";
import type { CausalLM } from "../model.ts";
import { maxAbsDiff, referenceLogits, type TinyWeights } from "../testing/tiny-models.ts";
import {
  referenceMoeLogits,
  referenceRoute,
  type TinyMoeConfig,
  tinyMoeWeights,
  writeTinyMoeGguf,
  writeTinyMoeSafetensors,
} from "../testing/tiny-moe.ts";
import { stackExperts } from "./checkpoint.ts";

const backend = createBackend({ threads: 2 });
const tmp = mkdtempSync(join(tmpdir(), "tp-llm-qwen3moe-"));
afterAll(() => {
  rmSync(tmp, { recursive: true, force: true });
  backend.dispose();
});

/**
 * f32 forward vs the f64 reference, absolute on logits of magnitude ≤ 15: f32 rounding and summation
 * order over ≤ 64-wide dot products and 2 layers, as the dense models (models.test.ts F32_LOGIT_TOL).
 * The routing itself is discrete: a top-k decision within f32 noise of a tie would fail this outright,
 * and the seed has none (the reference's smallest gap between the k-th and (k+1)-th probability is
 * checked below).
 */
const F32_LOGIT_TOL = 2e-5;

/** Qwen3 attention (head_dim 16 ≠ 48 / 4), 6 experts of which 2 per token, untied head. */
const MOE: TinyMoeConfig = {
  model_type: "qwen3moe",
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
  tie_word_embeddings: false,
  num_experts: 6,
  num_experts_per_tok: 2,
  moe_intermediate_size: 32,
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

function flat(rows: Float64Array[]): Float64Array {
  const out = new Float64Array(rows.reduce((a, r) => a + r.length, 0));
  rows.forEach((r, i) => {
    out.set(r, i * (rows[0]?.length ?? 0));
  });
  return out;
}

describe("qwen3moe on a tiny random GGUF vs a float64 reference", () => {
  const w = tinyMoeWeights(MOE);
  const gguf = join(tmp, "qwen3moe.gguf");
  writeTinyMoeGguf(gguf, MOE, w);
  const expected = flat(referenceMoeLogits(MOE, w, PROMPT));

  test("the prompt routes unevenly (an expert takes several rows), with no near tie in the top-k", () => {
    const counts = new Map<number, number>();
    let minGap = Number.POSITIVE_INFINITY;
    for (const f of mlpInputs(MOE, w, PROMPT)) {
      const { ids } = referenceRoute(MOE, w, 0, f);
      for (const e of ids) counts.set(e, (counts.get(e) ?? 0) + 1);
      minGap = Math.min(minGap, topKGap(MOE, w, f));
    }
    expect(Math.max(...counts.values())).toBeGreaterThan(1); // a grouped GEMM of several rows
    expect(counts.size).toBeGreaterThan(MOE.num_experts_per_tok);
    expect(counts.size).toBeLessThan(MOE.num_experts + 1);
    expect(minGap).toBeGreaterThan(1e-3); // logits apart by far more than f32 noise (~1e-6)
  });

  test("config from the GGUF metadata: the experts, k and the expert width", () => {
    const { model, config } = loadCausalLM(gguf, { backend });
    try {
      expect(config).toMatchObject({
        architecture: "qwen3moe",
        head_dim: 16,
        rope_mode: "neox",
        tie_word_embeddings: false,
        num_experts: 6,
        num_experts_per_tok: 2,
        moe_intermediate_size: 32,
        norm_topk_prob: true,
      });
    } finally {
      model.dispose();
    }
  });

  test("logits of every prompt row in one batched forward", async () => {
    const { model } = loadCausalLM(gguf, { backend });
    try {
      expect(maxAbsDiff(await logitsRows(model, PROMPT), expected)).toBeLessThan(F32_LOGIT_TOL);
    } finally {
      model.dispose();
    }
  });

  test("decode one token at a time: each row's logits as the reference's", async () => {
    const { model } = loadCausalLM(gguf, { backend, kvInitialRows: 2 });
    try {
      const V = MOE.vocab_size;
      for (let i = 0; i < PROMPT.length; i++) {
        const got = await logitsRows(model, [PROMPT[i] as number]);
        expect(maxAbsDiff(got, expected.subarray(i * V, (i + 1) * V))).toBeLessThan(F32_LOGIT_TOL);
      }
    } finally {
      model.dispose();
    }
  });
});

describe("qwen3_moe from safetensors (each expert its own tensors) against the GGUF of the same weights", () => {
  const w = tinyMoeWeights(MOE);
  const gguf = join(tmp, "same.gguf");
  writeTinyMoeGguf(gguf, MOE, w);
  const hf = join(tmp, "hf-same");
  writeTinyMoeSafetensors(hf, MOE, w);
  const expected = flat(referenceMoeLogits(MOE, w, PROMPT));

  test("config from config.json: the experts, k, the expert width and norm_topk_prob", () => {
    const { model, config } = loadCausalLM(hf, { backend });
    try {
      expect(config).toMatchObject({
        architecture: "qwen3moe",
        head_dim: 16,
        num_experts: 6,
        num_experts_per_tok: 2,
        moe_intermediate_size: 32,
        norm_topk_prob: true,
      });
    } finally {
      model.dispose();
    }
  });

  // The stacks copied from the experts' tensors hold the GGUF stacks' bytes, so the same kernels see the
  // same inputs: the logits must be bit for bit the GGUF's (tolerance 0), and the reference's within
  // F32_LOGIT_TOL (prompt rows in one batch, then one token at a time).
  test("every prompt row and each decode step: the GGUF's logits exactly, the reference's within 2e-5", async () => {
    const fromGguf = loadCausalLM(gguf, { backend });
    const fromHf = loadCausalLM(hf, { backend });
    try {
      const rows = await logitsRows(fromHf.model, PROMPT);
      expect(maxAbsDiff(rows, await logitsRows(fromGguf.model, PROMPT))).toBe(0);
      expect(maxAbsDiff(rows, expected)).toBeLessThan(F32_LOGIT_TOL);
      const V = MOE.vocab_size;
      for (const id of [7, 61, 3]) {
        const a = await logitsRows(fromHf.model, [id]);
        const b = await logitsRows(fromGguf.model, [id]);
        expect(a.length).toBe(V);
        expect(maxAbsDiff(a, b)).toBe(0);
      }
    } finally {
      fromGguf.model.dispose();
      fromHf.model.dispose();
    }
  });
});

/** Layer 0's MLP input rows (normed) of a prompt, from the reference of one layer. */
function mlpInputs(c: TinyMoeConfig, w: TinyWeights, ids: readonly number[]): Float64Array[] {
  const rows: Float64Array[] = [];
  referenceLogits({ ...c, model_type: "qwen3", num_hidden_layers: 1 }, w, ids, (_l, f) => {
    rows.push(f);
    return new Float64Array(c.hidden_size);
  });
  return rows;
}

/** The gap between the k-th and (k+1)-th router probability of a row (how far the top-k is from a tie). */
function topKGap(c: TinyMoeConfig, w: TinyWeights, f: Float64Array): number {
  const { ids } = referenceRoute({ ...c, num_experts_per_tok: c.num_experts_per_tok + 1 }, w, 0, f);
  const router = w.get("model.layers.0.mlp.gate.weight");
  if (!router) throw new Error("no router");
  const k = router.shape[1] as number;
  const logit = (e: number) => {
    let s = 0;
    for (let j = 0; j < k; j++) s += (router.values[e * k + j] as number) * (f[j] as number);
    return s;
  };
  return logit(ids[c.num_experts_per_tok - 1] as number) - logit(ids[c.num_experts_per_tok] as number);
}

describe("qwen3moe loader errors", () => {
  const w = tinyMoeWeights(MOE, 5);

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

  test("expert_used_count above expert_count, or missing: E_FORMAT naming the key", () => {
    const bad = join(tmp, "bad-used.gguf");
    writeTinyMoeGguf(bad, MOE, w, { kv: [ggufKv("qwen3moe.expert_used_count", "u32", 7)] });
    expectTp(() => loadCausalLM(bad, { backend }), "E_FORMAT", "expert_used_count", "7", "6");
    const none = join(tmp, "no-width.gguf");
    writeTinyMoeGguf(none, MOE, w, { kv: [ggufKv("qwen3moe.expert_feed_forward_length", "u32", 0)] });
    expectTp(() => loadCausalLM(none, { backend }), "E_FORMAT", "expert_feed_forward_length");
  });

  test("an expert stack of the wrong shape: E_FORMAT naming the tensor and both shapes", () => {
    const bad = join(tmp, "bad-stack.gguf");
    writeTinyMoeGguf(bad, MOE, w, {
      tensor: (t) => (t.name === "blk.1.ffn_up_exps.weight" ? { ...t, shape: [3, 64, 48], data: t.data } : t),
    });
    expectTp(
      () => loadCausalLM(bad, { backend }),
      "E_FORMAT",
      "blk.1.ffn_up_exps.weight",
      "[3, 64, 48]",
      "[6, 32, 48]",
    );
  });

  test("stackExperts: ConvRot experts keep their codes and row scales; matmul_id on the stack = matmul on each", async () => {
    // 3 experts [5, 256] of int8 ConvRot (quantizeConvRot, group 256); the stack's rows of expert e must
    // be expert e's: matmul_id routed to e gives matmul with e exactly (the same integer products and
    // row scales; tolerance 0).
    const [n, k] = [5, 256];
    const parts = [0, 1, 2].map((e) => {
      const q = quantizeConvRot(
        Float32Array.from({ length: n * k }, (_, i) => Math.sin(0.37 * i + e)),
        [n, k],
      );
      return new Weight({
        name: `experts.${e}.up_proj.weight`,
        format: "int8_convrot",
        shape: [n, k],
        data: q.data,
        scale: { kind: "row", values: q.scale },
        rotationGroup: q.groupSize,
      });
    });
    const stack = stackExperts("experts.up_proj.weight", parts, "mem");
    expect(stack.shape).toEqual([3 * n, k]);
    const x = backend.upload(
      Float32Array.from({ length: k }, (_, i) => Math.cos(0.11 * i)),
      [1, 1, k],
      "f32",
    );
    for (const e of [2, 0, 1]) {
      const ids = backend.upload(Int32Array.of(e), [1, 1], "i32");
      const got = await backend.read(backend.matmulId(x, stack, ids, { experts: 3 }));
      const want = await backend.read(backend.matmul(x.reshape(1, k), parts[e] as Weight));
      expect(Array.from(got as Float32Array)).toEqual(Array.from(want as Float32Array));
    }
  });

  test("stackExperts: fp8 experts with different per-tensor scales are E_UNSUPPORTED", () => {
    const fp8 = (scale: number) =>
      new Weight({
        name: `e${scale}`,
        format: "f8_e4m3fn",
        shape: [2, 32],
        data: new Uint8Array(64),
        scale: { kind: "tensor", value: scale },
      });
    expectTp(() => stackExperts("s", [fp8(1), fp8(2)], "mem"), "E_UNSUPPORTED", "per-tensor scales");
    expect(stackExperts("s", [fp8(0.5), fp8(0.5)], "mem").scale).toEqual({ kind: "tensor", value: 0.5 });
  });

  test("safetensors: a missing expert is E_FORMAT naming its tensor", () => {
    const d = join(tmp, "hf-missing-expert");
    writeTinyMoeSafetensors(d, MOE, w, {
      drop: (n) => n === "model.layers.1.mlp.experts.4.down_proj.weight",
    });
    expectTp(() => loadCausalLM(d, { backend }), "E_FORMAT", "model.layers.1.mlp.experts.4.down_proj.weight");
  });

  test("safetensors: dense layers among the MoE ones are E_UNSUPPORTED; k above the experts E_FORMAT", () => {
    const dense = join(tmp, "hf-dense-layers");
    writeTinyMoeSafetensors(dense, MOE, w, { config: { mlp_only_layers: [1] } });
    expectTp(() => loadCausalLM(dense, { backend }), "E_UNSUPPORTED", "mlp_only_layers");
    const k = join(tmp, "hf-bad-k");
    writeTinyMoeSafetensors(k, MOE, w, { config: { num_experts_per_tok: 7 } });
    expectTp(() => loadCausalLM(k, { backend }), "E_FORMAT", "num_experts_per_tok", "7", "6");
  });
});
