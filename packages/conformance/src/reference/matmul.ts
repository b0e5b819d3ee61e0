/**
 * References of the weight-consuming ops, built on @tp/quant's decoders (not rewritten here):
 * - plain formats (f32, f16, bf16, fp8 raw or scaled): y = x · dequant(W)ᵀ (+ bias), f64 accumulation;
 * - INT8 / INT4 ConvRot: ComfyUI's W8A8 / W4A4 linear (@tp/quant convRotLinear: rotate, quantize the
 *   activations per row, integer dot products, rescale);
 * - GGUF block types: each activation row quantized to the weight's ggml `vec_dot_type` (Q8_0, Q8_1
 *   or Q8_K, @tp/quant quantizeActivationsGgml), then dequant(W) · dequant(x_q) in f64, as ggml's
 *   CPU backend computes it (llm.md §2.6);
 * - matmul_id: matmul of each row against the expert its id names;
 * - embedding: rows of dequant(table).
 */
import {
  type ConvRotFormat,
  convRotLinear,
  dequantizeFp8,
  dequantizeGgml,
  GGML_DEQUANT_FORMATS,
  quantizeActivationsGgml,
} from "@tp/quant";
import { decodeToF32, type Weight, weightFormatInfo } from "@tp/tensor";

/** The f32 values of a weight [N, K] (row-major). */
export function dequantizeWeight(w: Weight): Float32Array {
  const [n, k] = w.shape;
  const f = w.format;
  if (f === "f32") return new Float32Array(w.data.slice().buffer, 0, n * k);
  if (f === "f16" || f === "bf16") return decodeToF32(w.data, f, n * k);
  if (f === "f8_e4m3fn" || f === "f8_e5m2") {
    return dequantizeFp8(w.data, f, w.scale?.kind === "tensor" ? w.scale.value : undefined);
  }
  if (GGML_DEQUANT_FORMATS.includes(f)) return dequantizeGgml(f, w.data, n * k, w.name);
  throw new Error(`no dense reference for weight format ${f}`);
}

/** x [M, K] (row-major f32) · Wᵀ (+ bias) → [M, N] in f64, by the format's semantics (module comment). */
export function matmulRef(x: Float32Array, w: Weight, bias: Float32Array | null): Float64Array {
  const [n, k] = w.shape;
  const m = x.length / k;
  const info = weightFormatInfo(w.format);
  if (info.family === "convrot") {
    const y = convRotLinear(
      x,
      {
        format: w.format as ConvRotFormat,
        shape: [n, k],
        groupSize: w.rotationGroup ?? 256,
        data: w.data,
        scale: (w.scale as { kind: "row"; values: Float32Array }).values,
      },
      bias === null ? {} : { bias },
    );
    return Float64Array.from(y);
  }
  const wf = dequantizeWeight(w);
  const out = new Float64Array(m * n);
  for (let i = 0; i < m; i++) {
    let row: Float32Array = x.subarray(i * k, (i + 1) * k);
    if (info.family === "ggml") {
      const q = quantizeActivationsGgml(w.format, row.slice());
      row = dequantizeGgml(q.format, q.data, k);
    }
    for (let j = 0; j < n; j++) {
      let s = bias === null ? 0 : (bias[j] as number);
      for (let t = 0; t < k; t++) s += (row[t] as number) * (wf[j * k + t] as number);
      out[i * n + j] = s;
    }
  }
  return out;
}

/**
 * matmul_id: row (t, s) = x[t, sx = 1 ? 0 : s] · W_eᵀ with e = ids[t·slots + s], where w stacks
 * `experts` weights [N, K] expert-major ([experts·N, K]) → [T, slots, N] in f64. Each row is
 * {@link matmulRef} of that input row against the whole stack, of which the N columns of expert e are
 * kept (a row's outputs do not depend on the other columns, in any format).
 */
export function matmulIdRef(
  x: Float32Array,
  w: Weight,
  ids: Int32Array,
  t: number,
  sx: number,
  slots: number,
  experts: number,
): Float64Array {
  const [rows, k] = w.shape;
  const n = rows / experts;
  const out = new Float64Array(t * slots * n);
  for (let i = 0; i < t; i++) {
    for (let s = 0; s < slots; s++) {
      const e = ids[i * slots + s] as number;
      const row = x.subarray((i * sx + (sx === 1 ? 0 : s)) * k, (i * sx + (sx === 1 ? 0 : s) + 1) * k);
      const all = matmulRef(row.slice(), w, null);
      out.set(all.subarray(e * n, (e + 1) * n), (i * slots + s) * n);
    }
  }
  return out;
}

/** Rows of dequant(table) at `ids` → [ids.length, D] f32. */
export function embeddingRef(table: Weight, ids: ArrayLike<number>): Float32Array {
  const d = table.shape[1];
  const wf = dequantizeWeight(table);
  const out = new Float32Array(ids.length * d);
  for (let i = 0; i < ids.length; i++)
    out.set(wf.subarray((ids[i] as number) * d, ((ids[i] as number) + 1) * d), i * d);
  return out;
}
