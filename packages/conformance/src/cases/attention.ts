/**
 * Cases of attention: no mask, causal (prefill, chunked prefill with qOffset, decoding with one
 * query), GQA, a sliding window wider and narrower than one key block, a full prefix (an image block
 * attended bidirectionally before causal text), softcap, head_dim_v ≠ head_dim, head sizes that are
 * not multiples of a vector, queries that see no key, inputs in [batch, seq, heads, head_dim]
 * order seen through a permutation (what a model gets from its projections), and K / V read from a KV
 * cache [capacity, kv_heads, head_dim] as `cache.slice(0, 0, len).reshape(1, len, kv_heads, head_dim)
 * .permute(0, 2, 1, 3)` (rows past len hold NaN: a kernel that reads them fails), or from a head-major
 * cache [kv_heads, capacity, head_dim] as `cache.slice(1, 0, len).reshape(1, kv_heads, len, head_dim)`
 * (@tp/llm's KvCache), with decoding shapes that split the keys over threads, a view whose last dimension is strided (copied), and long
 * key ranges (1000–2100 keys, head_dim 64 / 128: decoding and chunked prefill from a KV cache, window).
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
  /** k, v read from a KV cache of this many rows [capacity, kv_heads, dim] (batch 1; q follows bshd) */
  cache?: number;
  /** the cache is head-major, [kv_heads, capacity, dim] (default: token-major as above) */
  headMajor?: boolean;
  /** k seen through every other element of its last dimension (stride 2: copied by the cpu backend) */
  kStride2?: boolean;
}

/**
 * A KV-cache input: [capacity, kvHeads, dim] (headMajor: [kvHeads, capacity, dim]) whose first `len`
 * rows hold `data` ([1, kvHeads, len, dim], the view the op sees, row-major) and whose other rows are NaN.
 */
function cacheInput(
  name: string,
  data: Float32Array,
  capacity: number,
  kvHeads: number,
  len: number,
  dim: number,
  headMajor: boolean,
): InputSpec {
  const stored = new Float32Array(capacity * kvHeads * dim).fill(Number.NaN);
  for (let h = 0; h < kvHeads; h++)
    for (let j = 0; j < len; j++) {
      const at = (headMajor ? h * capacity + j : j * kvHeads + h) * dim;
      for (let t = 0; t < dim; t++) stored[at + t] = data[(h * len + j) * dim + t] as number;
    }
  const shape = headMajor ? [kvHeads, capacity, dim] : [capacity, kvHeads, dim];
  return { name, dtype: "f32", shape, data: stored };
}

/**
 * The view of a KV cache the model passes: [1, kvHeads, len, dim], with strides [*, dim, kvHeads · dim, 1]
 * (token-major) or [*, capacity · dim, dim, 1] (head-major).
 */
function cacheView(cache: Tensor, len: number, headMajor: boolean): Tensor {
  if (headMajor) {
    const [kvHeads, , dim] = cache.shape as [number, number, number];
    return cache.slice(1, 0, len).reshape(1, kvHeads, len, dim);
  }
  const [, kvHeads, dim] = cache.shape as [number, number, number];
  return cache.slice(0, 0, len).reshape(1, len, kvHeads, dim).permute(0, 2, 1, 3);
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
    {
      dims: [1, 16, 8, 1, 200, 128, 128],
      options: { causal: true },
      note: "decode from a KV cache of 300, GQA 16/8, q [b, s, h, d] permuted",
      bshd: true,
      cache: 300,
    },
    {
      dims: [1, 4, 1, 1, 1500, 16, 16],
      options: { causal: true },
      note: "decode from a KV cache of 1600, one kv head (keys split over threads)",
      cache: 1600,
    },
    {
      dims: [1, 16, 8, 1, 200, 128, 128],
      options: { causal: true },
      note: "decode from a head-major KV cache of 300, GQA 16/8, q [b, s, h, d] permuted",
      bshd: true,
      cache: 300,
      headMajor: true,
    },
    {
      dims: [1, 4, 1, 1, 1500, 16, 16],
      options: { causal: true },
      note: "decode from a head-major KV cache of 1600, one kv head (keys split over threads)",
      cache: 1600,
      headMajor: true,
    },
    {
      dims: [1, 8, 2, 9, 130, 64, 64],
      options: { causal: true },
      note: "chunked prefill of 9 from a head-major KV cache of 140, q [b, s, h, d] permuted",
      bshd: true,
      cache: 140,
      headMajor: true,
    },
    {
      dims: [1, 2, 1, 1, 1300, 16, 16],
      options: { causal: true, window: 700, fullPrefix: 40 },
      note: "decode from a KV cache, window 700 + full prefix 40 (keys split; early chunks masked)",
      cache: 1301,
    },
    {
      dims: [1, 4, 2, 5, 20, 16, 16],
      options: { causal: true },
      note: "chunked prefill from a KV cache of 40, q [b, s, h, d] permuted",
      bshd: true,
      cache: 40,
    },
    {
      dims: [1, 8, 2, 20, 90, 64, 64],
      options: { causal: true },
      note: "prefill from a KV cache of 100, head_dim 64 (V read in place)",
      cache: 100,
    },
    {
      dims: [1, 2, 1, 3, 70, 16, 16],
      options: { causal: true },
      note: "k with a strided last dimension (copied)",
      kStride2: true,
    },
    // Long key ranges: Skv · head_dim past 64k floats (the vulkan kernel was cut short there by
    // llvmpipe's loop limit before it split the keys into ranges).
    { dims: [1, 4, 1, 3, 1500, 64, 64], options: {}, note: "1500 keys, head_dim 64, one kv head" },
    {
      dims: [1, 16, 8, 1, 1024, 128, 128],
      options: { causal: true },
      note: "decode from a KV cache of 1100, 1024 keys, head_dim 128, GQA 16/8, q [b, s, h, d] permuted",
      bshd: true,
      cache: 1100,
    },
    {
      dims: [1, 8, 1, 1, 2100, 128, 128],
      options: { causal: true, qOffset: 2099 },
      note: "decode from a KV cache of 2100, 2100 keys, head_dim 128, GQA 8/1",
      cache: 2100,
    },
    {
      dims: [1, 8, 2, 9, 1300, 64, 64],
      options: { causal: true },
      note: "chunked prefill of 9 from a KV cache of 1400, 1300 keys, q [b, s, h, d] permuted",
      bshd: true,
      cache: 1400,
    },
    {
      dims: [1, 4, 2, 5, 2000, 64, 64],
      options: { causal: true, window: 700, fullPrefix: 60 },
      note: "2000 keys, window 700 + full prefix 60 (whole ranges masked)",
    },
  ];
  return cases.map(({ dims, options, note, bshd, cache, headMajor = false, kStride2 }, i) => {
    const [b, h, hkv, sq, skv, d, dv] = dims;
    const shapes = [
      [b, h, sq, d],
      [b, hkv, skv, d],
      [b, hkv, skv, dv],
    ];
    const view: InputSpec["view"] = bshd ? { kind: "permute", perm: [0, 2, 1, 3] } : { kind: "contiguous" };
    const data = shapes.map((shape, k) => gaussian(1200 + 3 * i + k, numelOf(shape as number[])));
    const inputs = (["q", "k", "v"] as const).map((name, k): InputSpec => {
      if (cache !== undefined && k > 0) {
        return cacheInput(name, data[k] as Float32Array, cache, hkv, skv, k === 1 ? d : dv, headMajor);
      }
      const kView: InputSpec["view"] = kStride2 && k === 1 ? { kind: "stride2" } : view;
      return { name, dtype: "f32", shape: shapes[k] as number[], data: data[k] as Float32Array, view: kView };
    });
    return defineCase({
      op: "attention",
      name: `attention q [${shapes[0]}] k [${shapes[1]}] v [${shapes[2]}] ${note}`,
      tolerance: ATTENTION,
      inputs,
      call: (bk, [q, k, v]) =>
        cache === undefined
          ? bk.attention(q as Tensor, k as Tensor, v as Tensor, options)
          : bk.attention(
              q as Tensor,
              cacheView(k as Tensor, skv, headMajor),
              cacheView(v as Tensor, skv, headMajor),
              options,
            ),
      reference: ([q]) => [
        {
          shape: [b, h, sq, dv],
          dtype: "f32",
          data: attentionRef(
            q as never,
            { shape: shapes[1] as number[], data: data[1] as Float32Array },
            { shape: shapes[2] as number[], data: data[2] as Float32Array },
            options,
          ),
        },
      ],
    });
  });
}
