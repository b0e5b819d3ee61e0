/**
 * Cases from the shared fixture `testdata/tensorpencil/op_vectors.json` (torch 2.6 values from
 * qskousen/TensorPencil's fixture script): activations, zero-centred RMSNorm, Flux-style interleaved
 * RoPE, Qwen rotate-half RoPE, and GQA attention with and without a causal mask. When the shared
 * folder is absent the cases skip and say which file is missing.
 */
import { existsSync, readFileSync } from "node:fs";
import { resolve } from "node:path";
import type { Tensor } from "@tp/tensor";
import { type ConformanceCase, defineCase } from "../case.ts";
import { TORCH_VECTORS } from "../tolerances.ts";

/** `<repo>/../shared/testdata/tensorpencil/op_vectors.json` (this file is packages/conformance/src/cases/). */
export const OP_VECTORS_PATH = resolve(
  import.meta.dir,
  "../../../..",
  "../shared/testdata/tensorpencil/op_vectors.json",
);

interface OpVectors {
  activations: { input: number[]; gelu_tanh: number[]; silu: number[]; sigmoid: number[] };
  rmsnorm: {
    x_rows_dim4: number[];
    zero_centered_scale: number[];
    "out_eps_1e-5": number[];
    "out_eps_1e-6": number[];
  };
  rope_interleaved_flux: { q_in: number[]; q_out: number[] };
  rope_rotate_half_qwen: { q_out: number[] };
  gqa_attention: { q: number[]; k: number[]; v: number[]; out: number[]; out_causal: number[] };
}

const f32 = (a: number[]) => Float32Array.from(a);

/** [seq][heads][d] → [heads][seq][d]. */
function headsFirst(a: number[], seq: number, heads: number, d: number): Float32Array {
  const out = new Float32Array(a.length);
  for (let s = 0; s < seq; s++)
    for (let h = 0; h < heads; h++)
      for (let i = 0; i < d; i++) out[(h * seq + s) * d + i] = a[(s * heads + h) * d + i] as number;
  return out;
}

/** The op_vectors.json cases (skipping, with the reason, when the file is missing). */
export function vectorCases(): ConformanceCase[] {
  const missing = existsSync(OP_VECTORS_PATH) ? undefined : `shared fixture missing: ${OP_VECTORS_PATH}`;
  const v: OpVectors | null = missing ? null : JSON.parse(readFileSync(OP_VECTORS_PATH, "utf8"));
  const get = <T>(f: (o: OpVectors) => T, fallback: T): T => (v === null ? fallback : f(v));
  const skip = missing === undefined ? {} : { skip: missing };
  const out: ConformanceCase[] = [];

  const input = get((o) => f32(o.activations.input), new Float32Array(10));
  for (const op of ["silu", "sigmoid", "gelu_tanh"] as const) {
    out.push(
      defineCase({
        op: op === "gelu_tanh" ? "gelu" : op,
        name: `op_vectors.json activations: ${op} (torch)`,
        tolerance: TORCH_VECTORS,
        ...skip,
        inputs: [{ name: "x", dtype: "f32", shape: [input.length], data: input }],
        call: (b, [x]) =>
          op === "silu"
            ? b.silu(x as Tensor)
            : op === "sigmoid"
              ? b.sigmoid(x as Tensor)
              : b.gelu(x as Tensor, { approximate: "tanh" }),
        reference: () => [{ shape: [input.length], dtype: "f32", data: get((o) => o.activations[op], []) }],
      }),
    );
  }

  for (const eps of [1e-5, 1e-6] as const) {
    out.push(
      defineCase({
        op: "rms_norm",
        name: `op_vectors.json rmsnorm: [2, 4], weight 1 + scale, eps ${eps} (torch)`,
        tolerance: TORCH_VECTORS,
        ...skip,
        inputs: [
          {
            name: "x",
            dtype: "f32",
            shape: [2, 4],
            data: get((o) => f32(o.rmsnorm.x_rows_dim4), new Float32Array(8)),
          },
          {
            name: "scale",
            dtype: "f32",
            shape: [4],
            data: get((o) => f32(o.rmsnorm.zero_centered_scale), new Float32Array(4)),
          },
        ],
        call: (b, [x, w]) => b.rmsNorm(x as Tensor, w as Tensor, { eps, unitOffset: true }),
        reference: () => [
          {
            shape: [2, 4],
            dtype: "f32",
            data: get((o) => o.rmsnorm[eps === 1e-5 ? "out_eps_1e-5" : "out_eps_1e-6"], []),
          },
        ],
      }),
    );
  }

  const q = get((o) => f32(o.rope_interleaved_flux.q_in), new Float32Array(24));
  const ropes = [
    { key: "rope_interleaved_flux", mode: "interleaved", theta: 1000, positions: [0, 1, 7] },
    { key: "rope_rotate_half_qwen", mode: "neox", theta: 5e6, positions: [0, 1, 2] },
  ] as const;
  for (const r of ropes) {
    out.push(
      defineCase({
        op: "rope",
        name: `op_vectors.json ${r.key}: head_dim 8, theta ${r.theta}, positions [${r.positions}] (torch)`,
        formats: ["f32", "i32"],
        tolerance: TORCH_VECTORS,
        ...skip,
        inputs: [
          { name: "q", dtype: "f32", shape: [1, 3, 1, 8], data: q },
          { name: "positions", dtype: "i32", shape: [3], data: Int32Array.from(r.positions) },
        ],
        call: (b, [x, p]) => b.rope(x as Tensor, p as Tensor, { mode: r.mode, theta: r.theta }),
        reference: () => [{ shape: [1, 3, 1, 8], dtype: "f32", data: get((o) => o[r.key].q_out, []) }],
      }),
    );
  }

  // q [seq 3][2 heads × 4], k / v [3][1 × 4]: uploaded as [1, seq, heads, d], seen as [1, heads, seq, d]
  const att = (key: "q" | "k" | "v", n: number) => get((o) => f32(o.gqa_attention[key]), new Float32Array(n));
  for (const causal of [false, true]) {
    out.push(
      defineCase({
        op: "attention",
        name: `op_vectors.json gqa_attention: 2 query heads on 1 kv head, seq 3, head_dim 4${causal ? ", causal" : ""} (torch)`,
        tolerance: TORCH_VECTORS,
        ...skip,
        inputs: [
          {
            name: "q",
            dtype: "f32",
            shape: [1, 2, 3, 4],
            data: headsFirst(Array.from(att("q", 24)), 3, 2, 4),
            view: { kind: "permute", perm: [0, 2, 1, 3] },
          },
          {
            name: "k",
            dtype: "f32",
            shape: [1, 1, 3, 4],
            data: att("k", 12),
            view: { kind: "permute", perm: [0, 2, 1, 3] },
          },
          {
            name: "v",
            dtype: "f32",
            shape: [1, 1, 3, 4],
            data: att("v", 12),
            view: { kind: "permute", perm: [0, 2, 1, 3] },
          },
        ],
        call: (b, [qt, kt, vt]) => b.attention(qt as Tensor, kt as Tensor, vt as Tensor, { causal }),
        reference: () => [
          {
            shape: [1, 2, 3, 4],
            dtype: "f32",
            data: headsFirst(
              get((o) => o.gqa_attention[causal ? "out_causal" : "out"], new Array(24).fill(0)),
              3,
              2,
              4,
            ),
          },
        ],
      }),
    );
  }
  return out;
}
