/**
 * Cases of attention: no mask, causal (prefill, chunked prefill with qOffset, decoding with one
 * query), GQA, a sliding window wider and narrower than one key block, a full prefix (an image block
 * attended bidirectionally before causal text), softcap, head_dim_v ≠ head_dim, head sizes that are
 * not multiples of a vector, queries that see no key, and inputs in [batch, seq, heads, head_dim]
 * order seen through a permutation (what a model gets from its projections).
 */
import type { AttentionOptions, Tensor } from "@tp/tensor";
import { type ConformanceCase, defineCase, type InputSpec } from "../case.ts";
import { gaussian } from "../data.ts";
import { numelOf } from "../host.ts";
import { attentionRef } from "../reference/index.ts";
import { ATTENTION } from "../tolerances.ts";

interface AttnCase {
  /** batch, heads, kv heads, sq, skv, head_dim, head_dim_v */
  dims: [number, number, number, number, number, number, number];
  options: AttentionOptions;
  note: string;
  /** q, k, v stored as [batch, seq, heads, dim] and permuted */
  bshd?: boolean;
}

/** Every attention case. */
export function attentionCases(): ConformanceCase[] {
  const cases: AttnCase[] = [
    { dims: [1, 2, 2, 5, 5, 16, 16], options: {}, note: "no mask" },
    { dims: [2, 4, 2, 7, 7, 8, 8], options: { causal: true }, note: "causal, GQA 4/2" },
    { dims: [1, 8, 2, 1, 70, 32, 32], options: { causal: true }, note: "decode: 1 query, 70 keys, GQA 8/2" },
    {
      dims: [1, 4, 4, 5, 12, 16, 16],
      options: { causal: true, qOffset: 7 },
      note: "chunked prefill, qOffset 7",
    },
    { dims: [1, 2, 1, 70, 70, 16, 16], options: { causal: true, window: 4 }, note: "sliding window 4" },
    { dims: [1, 2, 2, 150, 150, 8, 8], options: { causal: true, window: 100 }, note: "sliding window 100" },
    {
      dims: [1, 3, 1, 20, 20, 16, 16],
      options: { causal: true, fullPrefix: 6 },
      note: "causal + full prefix 6",
    },
    {
      dims: [1, 2, 2, 90, 90, 8, 8],
      options: { causal: true, fullPrefix: 70 },
      note: "causal + full prefix 70 (past a key block)",
    },
    {
      dims: [1, 2, 1, 9, 9, 32, 32],
      options: { causal: true, softcap: 2, scale: 0.5 },
      note: "softcap 2, scale 0.5",
    },
    { dims: [2, 2, 2, 6, 11, 12, 20], options: {}, note: "head_dim 12, head_dim_v 20" },
    { dims: [1, 1, 1, 67, 67, 40, 40], options: {}, note: "one head of 40 (VAE-like)" },
    { dims: [1, 2, 2, 3, 130, 128, 128], options: {}, note: "head_dim 128, 130 keys" },
    {
      dims: [1, 2, 1, 4, 4, 8, 8],
      options: { causal: true, qOffset: -2 },
      note: "qOffset −2: early queries see no key",
    },
    {
      dims: [1, 6, 3, 10, 10, 16, 16],
      options: { causal: true },
      note: "causal, [b, s, h, d] permuted",
      bshd: true,
    },
    {
      dims: [1, 16, 1, 1, 33, 8, 8],
      options: { causal: true },
      note: "decode, 16 query heads on one kv head",
    },
  ];
  return cases.map(({ dims, options, note, bshd }, i) => {
    const [b, h, hkv, sq, skv, d, dv] = dims;
    const shapes = [
      [b, h, sq, d],
      [b, hkv, skv, d],
      [b, hkv, skv, dv],
    ];
    const view: InputSpec["view"] = bshd ? { kind: "permute", perm: [0, 2, 1, 3] } : { kind: "contiguous" };
    const inputs = (["q", "k", "v"] as const).map(
      (name, k): InputSpec => ({
        name,
        dtype: "f32",
        shape: shapes[k] as number[],
        data: gaussian(1200 + 3 * i + k, numelOf(shapes[k] as number[])),
        view,
      }),
    );
    return defineCase({
      op: "attention",
      name: `attention q [${shapes[0]}] k [${shapes[1]}] v [${shapes[2]}] ${note}`,
      tolerance: ATTENTION,
      inputs,
      call: (bk, [q, k, v]) => bk.attention(q as Tensor, k as Tensor, v as Tensor, options),
      reference: ([q, k, v]) => [
        {
          shape: [b, h, sq, dv],
          dtype: "f32",
          data: attentionRef(q as never, k as never, v as never, options),
        },
      ],
    });
  });
}
