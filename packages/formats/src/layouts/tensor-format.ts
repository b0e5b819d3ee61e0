/**
 * Per-tensor weight format detection for ComfyUI-style checkpoints, and turning a checkpoint tensor
 * into a `Weight` (a view on the mapping plus its scales).
 *
 * Source: ../shared/spec/krea2.md §1.4 ("decide per tensor, never per file"), in this order:
 * 1. a sibling `<layer>.comfy_quant` (U8, JSON bytes): `float8_e4m3fn`, `int8_tensorwise` (+ convrot),
 *    `convrot_w4a4` / `int4_tensorwise`;
 * 2. `__metadata__["_quantization_metadata"]` = `{"layers": {"<layer>": {…same payload…}}}`;
 * 3. legacy scaled fp8: a root `scaled_fp8` tensor and `<layer>.scale_weight`;
 * 4. no marker: from dtype and shape — F8_E4M3 → fp8 (× `<layer>.weight_scale` if present); I8
 *    `[rows, cols]` with `<layer>.weight_scale` → INT8 ConvRot; I8/U8 `[rows, cols/2]` → INT4 ConvRot
 *    (needs the logical K, `expectedK`); BF16/F16/F32 → dense.
 * Scale tensors: fp8 a scalar (`[]` or `[1]`); ConvRot one f32 per row (`[rows]` or `[rows, 1]`).
 * qwen-image.md §10.2: a `comfy_quant` with `convrot: false` means a plain per-row (or scalar) scale.
 */
import { decodeToF32, TpError, Weight, type WeightFormat, type WeightScale } from "@tp/tensor";
import { formatError } from "../errors.ts";
import type { TensorEntry, TensorSource } from "../tensors.ts";

/** How a tensor's format was decided. */
export type FormatMarker = "comfy_quant" | "quantization_metadata" | "scaled_fp8" | "dtype" | "gguf";

/** The storage format of one weight and where its scale lives. */
export interface TensorFormat {
  /** Weight format (`f8_e4m3fn`, `int8_convrot`, `int4_convrot`, `bf16`, `q4_k`, …). */
  readonly format: WeightFormat;
  /** Name of the scale tensor, when the format has one. */
  readonly scaleTensor: string | null;
  /** What decided it. */
  readonly marker: FormatMarker;
}

/** `blocks.0.attn.wq.weight` → `blocks.0.attn.wq`; other names unchanged. */
export function layerOf(weightName: string): string {
  return weightName.endsWith(".weight") ? weightName.slice(0, -".weight".length) : weightName;
}

function readJsonTensor(src: TensorSource, name: string): Record<string, unknown> {
  const t = src.tensor(name);
  try {
    const v = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(src.data(name)));
    if (typeof v === "object" && v !== null && !Array.isArray(v)) return v as Record<string, unknown>;
  } catch {}
  throw formatError("comfy_quant must hold a UTF-8 JSON object", {
    file: t.file,
    tensor: name,
    offset: t.byteOffset,
  });
}

function quantizationMetadata(src: TensorSource, layer: string): Record<string, unknown> | null {
  const meta = (src as { metadata?: unknown }).metadata;
  if (!(meta instanceof Map)) return null;
  const text = meta.get("_quantization_metadata");
  if (typeof text !== "string") return null;
  try {
    const layers = (JSON.parse(text) as { layers?: Record<string, Record<string, unknown>> }).layers;
    return layers?.[layer] ?? null;
  } catch {
    throw formatError("__metadata__._quantization_metadata is not valid JSON", { file: src.path });
  }
}

function fromPayload(
  payload: Record<string, unknown>,
  t: TensorEntry,
  layer: string,
  src: TensorSource,
  marker: FormatMarker,
): TensorFormat {
  const fmt = payload.format;
  const scale = src.has(`${layer}.weight_scale`) ? `${layer}.weight_scale` : null;
  if (fmt === "float8_e4m3fn") return { format: "f8_e4m3fn", scaleTensor: scale, marker };
  if (fmt === "int8_tensorwise" && payload.convrot === true)
    return { format: "int8_convrot", scaleTensor: scale, marker };
  if (fmt === "convrot_w4a4" || fmt === "int4_tensorwise")
    return { format: "int4_convrot", scaleTensor: scale, marker };
  throw new TpError(
    "E_UNSUPPORTED",
    `quantization format ${JSON.stringify(fmt)}${fmt === "int8_tensorwise" ? " without convrot" : ""} is not supported; supported: float8_e4m3fn, int8_tensorwise with convrot, convrot_w4a4 (int4_tensorwise)`,
    { file: t.file, tensor: t.name },
  );
}

/**
 * Decide the storage format of the weight `name` (krea2.md §1.4).
 * @param expectedK the logical input width, when known (tells INT4-packed `[rows, K/2]` from INT8)
 * @throws TpError E_FORMAT for a missing tensor or a bad marker; E_UNSUPPORTED for a known but
 *   unsupported quantization format, or a dtype TensorPencil has no format for
 */
export function detectTensorFormat(src: TensorSource, name: string, expectedK?: number): TensorFormat {
  const t = src.tensor(name);
  if (src.kind === "gguf") {
    if (t.format === null)
      throw new TpError("E_UNSUPPORTED", `ggml type ${t.dtype} has no weight format`, {
        file: t.file,
        tensor: name,
      });
    return { format: t.format, scaleTensor: null, marker: "gguf" };
  }
  const layer = layerOf(name);
  if (src.has(`${layer}.comfy_quant`))
    return fromPayload(readJsonTensor(src, `${layer}.comfy_quant`), t, layer, src, "comfy_quant");
  const meta = quantizationMetadata(src, layer);
  if (meta) return fromPayload(meta, t, layer, src, "quantization_metadata");
  if (src.has("scaled_fp8") && t.dtype === "F8_E4M3") {
    return {
      format: "f8_e4m3fn",
      scaleTensor: src.has(`${layer}.scale_weight`) ? `${layer}.scale_weight` : null,
      marker: "scaled_fp8",
    };
  }
  const scale = src.has(`${layer}.weight_scale`) ? `${layer}.weight_scale` : null;
  const cols = t.shape[t.shape.length - 1];
  if (t.dtype === "F8_E4M3") return { format: "f8_e4m3fn", scaleTensor: scale, marker: "dtype" };
  if ((t.dtype === "I8" || t.dtype === "U8") && scale !== null) {
    const packed =
      t.dtype === "U8" || (expectedK !== undefined && cols !== undefined && cols * 2 === expectedK);
    return { format: packed ? "int4_convrot" : "int8_convrot", scaleTensor: scale, marker: "dtype" };
  }
  if (t.format === null) {
    throw new TpError("E_UNSUPPORTED", `dtype ${t.dtype} has no TensorPencil weight format`, {
      file: t.file,
      tensor: name,
    });
  }
  return { format: t.format, scaleTensor: null, marker: "dtype" };
}

function f32Values(src: TensorSource, name: string): Float32Array {
  const t = src.tensor(name);
  if (t.format !== "f32" && t.format !== "bf16" && t.format !== "f16") {
    throw formatError(`scale tensor must be F32 (or BF16/F16), got ${t.dtype}`, {
      file: t.file,
      tensor: name,
      offset: t.byteOffset,
    });
  }
  const bytes = src.data(name);
  if (t.format === "f16" || t.format === "bf16") return decodeToF32(bytes, t.format);
  return new Float32Array(bytes.slice().buffer); // f32: copy (the mapping may not be 4-aligned)
}

/**
 * The checkpoint tensor `name` as a `Weight` [N, K]: a view on the mapping (no copy) with the scales
 * its format needs. Leading dimensions are folded into N (`[E, N, K]` → `[E·N, K]`); a 1-D tensor is
 * `[1, K]`. For GGUF, K is `ne[0]`.
 * @param expectedK logical input width, to recognise INT4 ConvRot packed `[N, K/2]` (see above)
 * @throws TpError as {@link detectTensorFormat}; E_FORMAT when the scales do not fit; E_SHAPE for a scalar
 */
export function loadWeight(src: TensorSource, name: string, expectedK?: number): Weight {
  const t = src.tensor(name);
  const f = detectTensorFormat(src, name, expectedK);
  if (t.shape.length === 0)
    throw new TpError("E_SHAPE", "a scalar is not a weight", { file: t.file, tensor: name });
  let k = t.shape[t.shape.length - 1] as number;
  if (f.format === "int4_convrot") k *= 2;
  const n = t.shape.slice(0, -1).reduce((a, b) => a * b, 1);
  let scale: WeightScale | undefined;
  if (f.scaleTensor !== null) {
    const values = f32Values(src, f.scaleTensor);
    if (f.format === "int8_convrot" || f.format === "int4_convrot" || values.length === n) {
      scale = { kind: "row", values };
    } else if (values.length === 1) {
      scale = { kind: "tensor", value: values[0] as number };
    } else {
      const s = src.tensor(f.scaleTensor);
      throw formatError(`scale has ${values.length} values; expected 1 or ${n} (one per row)`, {
        file: s.file,
        tensor: f.scaleTensor,
        offset: s.byteOffset,
      });
    }
  }
  return new Weight({
    name,
    format: f.format,
    shape: [n, k],
    data: src.data(name),
    source: { file: t.file, byteOffset: t.byteOffset, byteLength: t.byteLength },
    ...(scale ? { scale } : {}),
  });
}
