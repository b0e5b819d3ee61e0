/**
 * attention of the vulkan backend (shaders/attention.comp): grouped-query scaled dot-product
 * attention with the causal / sliding-window / full-prefix masks and softcap of @tp/tensor
 * AttentionOptions with the online softmax, so memory stays O(seq_len) per head. q, k and v are read
 * in place through their batch / head / seq strides (KV-cache views, [batch, seq, heads, head_dim]
 * permuted); a view whose last dimension is strided is copied to contiguous scratch first.
 *
 * The keys are split into ranges of a bounded number of keys ({@link attentionPlan}): each range is
 * one workgroup's work (split-KV, "flash decoding"), whose partial results (maximum, sum, unnormalized
 * output) shaders/attention_merge.comp folds together. That bounds the loop iterations of every
 * invocation whatever the number of keys — Mesa's llvmpipe silently ends all loops of an invocation
 * once they have run 65535 iterations together (gallivm LP_MAX_TGSI_LOOP_ITERATIONS), which made the
 * one-pass kernel wrong from Skv · (D + Dv) ≈ 64k — and gives decoding (one query) more than one
 * workgroup per head.
 * Kernel-table entry: arguments arrive checked (@tp/tensor's op front-end).
 * Source: Vaswani et al. 2017 eq. 1; GQA: Ainslie et al. 2023; online softmax: Milakov & Gimelshein 2018.
 */
import { type AttentionParams, type Tensor, TpError } from "@tp/tensor";
import { type BoundTensor, dispatchGroups, Push, unsupported, type VkOpHost } from "./common.ts";
import { contiguous } from "./layout.ts";

/** Queries per workgroup (one invocation each): a tile is one (batch, head, block of QUERIES queries). */
const QUERIES = 64;
/** Invocations per workgroup of attention_merge (one workgroup per query, invocations over Dv). */
const MERGE_WG = 64;
/**
 * Loop iterations one invocation of the attention kernels may run, by the estimates below: half of
 * llvmpipe's 65535 (gallivm ends every loop of an invocation once their iterations together pass it),
 * leaving room for what the estimates leave out.
 */
export const ATTENTION_LOOP_BUDGET = 32768;
/** At most this much scratch (bytes) for partial results of key ranges at once (and the binding limit). */
const SCRATCH_BYTES = 64 * 2 ** 20;

/** How attention splits its work for head sizes d, dv and skv keys ({@link attentionPlan}). */
export interface AttentionPlan {
  /** Keys per block in shared memory. */
  readonly kb: number;
  /** Keys per range (one workgroup's keys; a multiple of kb unless smaller than it). */
  readonly chunk: number;
  /** Ranges: ceil(skv / chunk); 1 (or 0 keys): one pass, no scratch. */
  readonly chunks: number;
  /** Loop iterations of one invocation of attention.comp for a full range (≤ ATTENTION_LOOP_BUDGET). */
  readonly iterations: number;
  /** Most ranges attention_merge folds in one dispatch (its loop iterations ≤ ATTENTION_LOOP_BUDGET). */
  readonly maxMerge: number;
}

/** Loop iterations of one invocation of attention.comp over `keys` keys (an upper estimate). */
function passIterations(d: number, dv: number, kb: number, keys: number): number {
  const fixed = d + 2 * dv + 8; // q load, acc init, output; loop exits
  const perBlock = Math.ceil((kb * d) / QUERIES) + Math.ceil((kb * dv) / QUERIES) + 3;
  const perKey = d + dv + 3; // q·k, acc update, the key loop
  return fixed + Math.ceil(keys / kb) * perBlock + keys * perKey;
}

/**
 * The split of the keys for head sizes d, dv, skv keys and `sharedBytes` of shared memory.
 * @throws TpError E_UNSUPPORTED when a block of keys of these head sizes does not fit the shared memory
 *   or one key alone needs more loop iterations than the budget
 */
export function attentionPlan(
  d: number,
  dv: number,
  skv: number,
  sharedBytes: number,
  device = "the device",
): AttentionPlan {
  const floats = Math.floor(Math.min(sharedBytes, 32768) / 4);
  const kbMax = Math.min(32, Math.floor(floats / Math.max(d + dv, 1)));
  if (kbMax < 1) {
    throw new TpError(
      "E_UNSUPPORTED",
      `op attention on backend vulkan: head_dim ${d} + head_dim_v ${dv} needs more shared memory than ${device} has`,
    );
  }
  // The most keys a range may hold with blocks of kbMax keys, then the block size for that.
  let keys = Math.floor((ATTENTION_LOOP_BUDGET - passIterations(d, dv, 1, 0)) / (d + dv + 3));
  while (keys > 0 && passIterations(d, dv, Math.min(kbMax, keys), keys) > ATTENTION_LOOP_BUDGET) keys--;
  if (keys < 1) {
    throw new TpError(
      "E_UNSUPPORTED",
      `op attention on backend vulkan: head_dim ${d} + head_dim_v ${dv} is too large for one key per workgroup`,
    );
  }
  const kb = Math.min(kbMax, keys);
  const chunk = keys >= kb ? Math.floor(keys / kb) * kb : keys;
  const cols = Math.ceil(Math.max(dv, 1) / MERGE_WG);
  // attention_merge: 2 loops over the slots, then per column one more; plus the column loop's exits.
  const maxMerge = Math.floor((ATTENTION_LOOP_BUDGET - 2 * cols - 8) / (2 + cols)) - 1;
  return {
    kb,
    chunk,
    chunks: Math.ceil(skv / chunk),
    iterations: passIterations(d, dv, kb, chunk),
    maxMerge,
  };
}

/** `t` when the kernel can read it in place (last dimension contiguous), else a contiguous copy (scratch of the scope). */
function readable(host: VkOpHost, t: Tensor): Tensor {
  const last = t.rank - 1;
  if (t.shape[last] === 1 || t.layout.strides[last] === 1) return t;
  return contiguous(host, "attention", t);
}

/**
 * Scaled dot-product attention. q [B, H, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv] f32 (any
 * views) → out [B, H, Sq, Dv] f32. `scratchBytes` caps the scratch of partial results (tests make it
 * small to run the paths that fold the ranges in several dispatches and the queries in several groups).
 * @throws TpError E_UNSUPPORTED when a block of keys of this head size does not fit the device's
 *   shared memory, or a view spans more than maxStorageBufferRange
 */
export function attention(
  host: VkOpHost,
  out: Tensor,
  q: Tensor,
  k: Tensor,
  v: Tensor,
  p: AttentionParams,
  scratchBytes = SCRATCH_BYTES,
): void {
  const op = "attention";
  const { batch: b, heads: h, kvHeads: hkv, sq, skv, headDim: d, headDimV: dv } = p;
  const plan = attentionPlan(d, dv, skv, host.info.maxComputeSharedMemory, host.info.name);
  const hd = Math.max(d, 1);
  const hdv = Math.max(dv, 1);
  if (out.numel === 0) return;
  host.scope(() => {
    const qv = readable(host, q);
    const kv = readable(host, k);
    const vv = readable(host, v);
    const qc = host.bind(qv, op);
    const kc = host.bind(kv, op);
    const vc = host.bind(vv, op);
    const y = host.bind(out, op);
    const blocks = Math.ceil(sq / QUERIES);
    const tiles = b * h * blocks;
    const stride = (t: Tensor, dim: number) => (t.shape[dim] === 1 ? 0 : (t.layout.strides[dim] as number));
    const pass = (dst: BoundTensor, split0: number, nsplit: number, tile0: number, ntile: number) => {
      const push = new Push(120).u32(b).u32(h).u32(hkv).u32(sq).u32(skv).u32(dst.offset);
      for (const [t, c] of [
        [qv, qc],
        [kv, kc],
        [vv, vc],
      ] as const) {
        push.u32(c.offset).u32(stride(t, 0)).u32(stride(t, 1)).u32(stride(t, 2));
      }
      push
        .u32(plan.kb)
        .u32(plan.chunk)
        .u32(split0)
        .u32(nsplit)
        .u32(tile0)
        .u32(ntile)
        .u32(p.causal ? 1 : 0)
        .i32(p.qOffset)
        .u32(p.window)
        .u32(p.fullPrefix)
        .f32(p.scale)
        .f32(p.softcap);
      dispatchGroups(
        host,
        op,
        "attention",
        [QUERIES, plan.kb * (hd + hdv), hd, hdv],
        [dst.binding, qc.binding, kc.binding, vc.binding],
        push,
        ntile * Math.max(nsplit, 1),
      );
    };
    if (plan.chunks <= 1) {
      pass(y, 0, 0, 0, tiles);
      return;
    }
    // Scratch [1 + nsplit, ntile · QUERIES, 2 + Dv]: slot 0 the running state, then one per range.
    const tileFloats = QUERIES * (2 + dv);
    const cap = Math.floor(Math.min(scratchBytes, host.info.maxStorageBufferRange) / 4);
    const slots = Math.floor(cap / tileFloats); // tile-slots that fit
    if (slots < 2) {
      throw unsupported(
        op,
        `head_dim_v ${dv} needs ${2 * tileFloats * 4} bytes of scratch per ${QUERIES} queries, past ${cap * 4} bytes on ${host.info.name}`,
      );
    }
    const ntileMax = Math.min(tiles, Math.floor(slots / 2));
    const nsplitMax = Math.max(1, Math.min(plan.chunks, plan.maxMerge, Math.floor(slots / ntileMax) - 1));
    const scratch = host.alloc(
      [(1 + nsplitMax) * ntileMax * tileFloats],
      "f32",
      "attention partials (scratch)",
    );
    const sc = host.bind(scratch, op);
    if (sc.offset !== 0) {
      throw new TpError(
        "E_INTERNAL",
        `op attention on backend vulkan: scratch bound at element ${sc.offset}, not 0`,
      );
    }
    for (let tile0 = 0; tile0 < tiles; tile0 += ntileMax) {
      const ntile = Math.min(ntileMax, tiles - tile0);
      for (let split0 = 0; split0 < plan.chunks; split0 += nsplitMax) {
        const nsplit = Math.min(nsplitMax, plan.chunks - split0);
        pass(sc, split0, nsplit, tile0, ntile);
        const final = split0 + nsplit === plan.chunks;
        const push = new Push(36)
          .u32(ntile * QUERIES)
          .u32(nsplit)
          .u32(split0 > 0 ? 1 : 0)
          .u32(final ? 1 : 0)
          .u32(final ? y.offset : 0)
          .u32(tile0)
          .u32(QUERIES)
          .u32(blocks)
          .u32(sq);
        dispatchGroups(
          host,
          op,
          "attention_merge",
          [MERGE_WG, hdv],
          [final ? y.binding : sc.binding, sc.binding],
          push,
          ntile * QUERIES,
        );
      }
    }
  });
}
