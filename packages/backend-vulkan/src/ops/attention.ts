/**
 * attention of the vulkan backend (shaders/attention.comp): grouped-query scaled dot-product
 * attention with the causal / sliding-window / full-prefix masks and softcap of @tp/tensor
 * AttentionOptions, in one pass with the online softmax, so memory stays O(seq_len) per head.
 * Strided inputs (e.g. [batch, seq, heads, head_dim] seen through a permutation) are copied to
 * contiguous scratch first.
 * Source: Vaswani et al. 2017 eq. 1; GQA: Ainslie et al. 2023; online softmax: Milakov & Gimelshein 2018.
 */
import { type AttentionOptions, formatShape, type Tensor, TpError } from "@tp/tensor";
import {
  argError,
  checkTensors,
  dispatchGroups,
  finite,
  integer,
  Push,
  produce,
  scoped,
  shapeError,
  type VkOpHost,
} from "./common.ts";
import { contiguous } from "./layout.ts";

/** Queries per workgroup (one invocation each). */
const QUERIES = 64;

/**
 * Scaled dot-product attention. q [B, H, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv] f32 (any
 * views) → [B, H, Sq, Dv] f32.
 * @throws TpError E_SHAPE for shapes that do not fit together (H % Hkv ≠ 0, D or batch differ);
 *   E_ARG for a bad option (window without causal, non-finite scale); E_UNSUPPORTED when a block of
 *   keys of this head size does not fit the device's shared memory
 */
export function attention(
  host: VkOpHost,
  q: Tensor,
  k: Tensor,
  v: Tensor,
  options: AttentionOptions = {},
): Tensor {
  const op = "attention";
  checkTensors(host, op, ["f32"], { q, k, v });
  if (q.rank !== 4 || k.rank !== 4 || v.rank !== 4) {
    throw shapeError(
      op,
      `q ${formatShape(q.shape)}, k ${formatShape(k.shape)}, v ${formatShape(v.shape)} must be 4-D`,
    );
  }
  const [b, h, sq, d] = q.shape as [number, number, number, number];
  const [bk, hkv, skv, dk] = k.shape as [number, number, number, number];
  const [bv, hv, sv, dv] = v.shape as [number, number, number, number];
  if (bk !== b || bv !== b || dk !== d || hv !== hkv || sv !== skv || hkv === 0 || h % hkv !== 0) {
    throw shapeError(
      op,
      `q ${formatShape(q.shape)}, k ${formatShape(k.shape)}, v ${formatShape(v.shape)} do not fit [B, H, Sq, D], [B, Hkv, Skv, D], [B, Hkv, Skv, Dv] with H % Hkv = 0`,
    );
  }
  const o = options ?? {};
  const scale = finite(op, "scale", o.scale ?? 1 / Math.sqrt(Math.max(d, 1)));
  const softcap = o.softcap === undefined ? 0 : finite(op, "softcap", o.softcap);
  if (softcap < 0) throw argError(op, `softcap must be positive, got ${softcap}`);
  const qOffset = integer(op, "qOffset", o.qOffset ?? skv - sq, -(2 ** 31), 2 ** 31 - 1);
  const window = o.window === undefined ? 0 : integer(op, "window", o.window, 1, 2 ** 31 - 1);
  if (window > 0 && !o.causal) throw argError(op, "window needs causal");
  const fullPrefix = integer(op, "fullPrefix", o.fullPrefix ?? 0, 0, 2 ** 31 - 1);
  const floats = Math.floor(Math.min(host.info.maxComputeSharedMemory, 32768) / 4);
  const kb = Math.min(32, Math.floor(floats / Math.max(d + dv, 1)));
  if (kb < 1) {
    throw new TpError(
      "E_UNSUPPORTED",
      `op attention on backend vulkan: head_dim ${d} + head_dim_v ${dv} needs more shared memory than ${host.info.name} has`,
    );
  }
  return scoped(host, op, (s) =>
    produce(host, [b, h, sq, dv], "f32", undefined, (out) => {
      if (out.numel === 0) return;
      const qc = host.bind(contiguous(host, s, q), op);
      const kc = host.bind(contiguous(host, s, k), op);
      const vc = host.bind(contiguous(host, s, v), op);
      const y = host.bind(out, op);
      const push = new Push(60)
        .u32(b)
        .u32(h)
        .u32(hkv)
        .u32(sq)
        .u32(skv)
        .u32(qc.offset)
        .u32(kc.offset)
        .u32(vc.offset)
        .u32(kb)
        .u32(o.causal ? 1 : 0)
        .i32(qOffset)
        .u32(window)
        .u32(fullPrefix)
        .f32(scale)
        .f32(softcap);
      const groups = b * h * Math.ceil(sq / QUERIES);
      dispatchGroups(
        host,
        op,
        "attention",
        [QUERIES, kb * (Math.max(d, 1) + Math.max(dv, 1)), Math.max(d, 1), Math.max(dv, 1)],
        [y.binding, qc.binding, kc.binding, vc.binding],
        push,
        groups,
      );
    }),
  );
}
