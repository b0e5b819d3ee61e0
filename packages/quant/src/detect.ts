/**
 * Per-tensor weight-format detection for ComfyUI-style safetensors checkpoints — a pure function over
 * a table of tensor infos (names, dtypes, shapes, and the bytes of `.comfy_quant` marker tensors); no
 * file I/O. Decide per tensor, never per file: ComfyUI's W4A4 converter mixes int8 and int4 layers and
 * leaves others in BF16.
 *
 * Order of preference (../shared/spec/krea2.md §1.4; qwen-image.md §2.2, §10.2):
 * 1. a sibling `<layer>.comfy_quant` tensor (U8, 1-D, UTF-8 JSON) for the weight `<layer>.weight`:
 *    - `{"format": "float8_e4m3fn"}` (or `"float8_e5m2"`) → fp8, scale `<layer>.weight_scale` (scalar);
 *    - `{"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": g}` → int8_convrot;
 *    - `{"format": "convrot_w4a4" | "int4_tensorwise", "convrot_groupsize": g}` → int4_convrot;
 *    (g defaults to 256; extra keys are kept in `marker` and otherwise ignored);
 * 2. `__metadata__._quantization_metadata` = `{"layers": {"<layer>": {<same payload>}}}` (full names);
 * 3. legacy scaled fp8: a root tensor `scaled_fp8` and per-layer `<layer>.scale_weight` (F32 scalar);
 * 4. no marker — from dtype and shape: `F8_E4M3` / `F8_E5M2` → fp8 (× `<layer>.weight_scale` when
 *    present); `I8` [N, K] with a `weight_scale` → int8_convrot, `I8` [N, K/2] (when the expected
 *    logical shape says so) or `U8` [N, K/2] with a `weight_scale` → int4_convrot, group 256;
 *    `BF16`/`F16`/`F32` → dense; anything else → its plain dtype.
 */

import { dtypeFromSafetensors, TpError, type WeightFormat } from "@tp/tensor";
import { CONVROT_GROUP_SIZE } from "./hadamard.ts";

/** What format detection needs to know about one tensor. */
export interface TensorInfo {
  /** safetensors dtype string: `BF16`, `F16`, `F32`, `F8_E4M3`, `F8_E5M2`, `I8`, `U8`, `I64`, ... */
  readonly dtype: string;
  /** Stored shape. */
  readonly shape: readonly number[];
  /** The tensor's bytes; required for `.comfy_quant` markers, ignored for every other tensor. */
  readonly data?: Uint8Array;
}

/** Input of {@link detectTensorFormats}. */
export interface DetectInput {
  /** Every tensor of the checkpoint (or of all its shards), by full name. */
  readonly tensors: ReadonlyMap<string, TensorInfo> | Readonly<Record<string, TensorInfo>>;
  /** The safetensors `__metadata__` string map, if any. */
  readonly metadata?: Readonly<Record<string, string>>;
  /**
   * Logical [N, K] of weights, when the caller knows them (from the model config). Only rule 4 uses it:
   * an unmarked `I8` weight of shape [N, K/2] is int4, of shape [N, K] int8. Without it an unmarked
   * `I8` weight is taken as int8.
   */
  readonly expectedShapes?: Readonly<Record<string, readonly [number, number]>>;
  /** File path, for error messages. */
  readonly file?: string;
}

/** How one tensor is stored and must be decoded. */
export interface TensorFormat {
  /** Full tensor name (`model.diffusion_model.blocks.0.attn.wq.weight`). */
  readonly name: string;
  /**
   * The weight format (`@tp/tensor` names): a plain dtype (`bf16`, `f32`, `i64`, ...), `f8_e4m3fn` /
   * `f8_e5m2` (raw or scaled), `int8_convrot` or `int4_convrot`.
   */
  readonly format: WeightFormat;
  /** The stored safetensors dtype string. */
  readonly storedDtype: string;
  /** Logical shape: the stored shape, except int4 ConvRot [N, K] where the file holds [N, K/2]. */
  readonly shape: readonly number[];
  /**
   * The scale tensor and its kind: `tensor` (fp8: one scalar, `w = f32(fp8) · s`) or `row` (ConvRot: one
   * per output row, of the rotated weight). Absent for unscaled tensors (raw fp8: scale 1).
   */
  readonly scale?: { readonly tensor: string; readonly kind: "tensor" | "row" };
  /** ConvRot only: columns per rotation group. */
  readonly groupSize?: number;
  /** Which rule decided: a `.comfy_quant` marker, the metadata, legacy `scaled_fp8`, or dtype/shape. */
  readonly source: "comfy_quant" | "metadata" | "scaled_fp8" | "inferred";
  /** The marker's JSON payload, when a marker (rule 1 or 2) decided. */
  readonly marker?: Readonly<Record<string, unknown>>;
}

/** Result of {@link detectTensorFormats}. */
export interface DetectResult {
  /** Every tensor that carries data of its own (weights, biases, norms, buffers), by name. */
  readonly tensors: ReadonlyMap<string, TensorFormat>;
  /** Marker, scale and flag tensors, mapped to the tensor they describe (`scaled_fp8` → ""). */
  readonly auxiliary: ReadonlyMap<string, string>;
}

/** The marker `format` strings we understand, for error messages. */
export const KNOWN_COMFY_QUANT_FORMATS: readonly string[] = [
  "float8_e4m3fn",
  "float8_e5m2",
  "int8_tensorwise (with convrot: true)",
  "convrot_w4a4",
  "int4_tensorwise",
];

const MARKER_SUFFIX = ".comfy_quant";

/**
 * Decide the storage format of every tensor of a checkpoint (see the module comment for the rules).
 * @param input tensor infos (with marker bytes), metadata, optional expected logical shapes
 * @returns formats of the data tensors, plus the auxiliary (marker / scale) tensors
 * @throws TpError, naming the tensor (and file when given):
 *   - E_FORMAT: a marker that is not JSON or has no `format`, a marker or metadata entry for a layer
 *     without a `<layer>.weight`, a weight whose dtype or rank does not fit its marker, a missing scale
 *     where the format needs one, a scale of the wrong shape or dtype ("scale shape mismatch"), a
 *     group size that is not a power of 4;
 *   - E_UNSUPPORTED: an unknown marker format (the message lists the known ones), `int8_tensorwise`
 *     without ConvRot;
 *   - E_SHAPE: a ConvRot K that is not a multiple of the group size.
 */
export function detectTensorFormats(input: DetectInput): DetectResult {
  const tensors: ReadonlyMap<string, TensorInfo> =
    input.tensors instanceof Map
      ? input.tensors
      : new Map(Object.entries(input.tensors as Record<string, TensorInfo>));
  const file = input.file;
  const where = (tensor: string) => ({ tensor, ...(file === undefined ? {} : { file }) });
  const out = new Map<string, TensorFormat>();
  const aux = new Map<string, string>();

  // Rule 2's table: layer → payload.
  const metaLayers = new Map<string, Record<string, unknown>>();
  const metaText = input.metadata?._quantization_metadata;
  if (metaText !== undefined) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(metaText);
    } catch (e) {
      throw new TpError("E_FORMAT", "__metadata__._quantization_metadata is not valid JSON", {
        ...(file === undefined ? {} : { file }),
        cause: e,
      });
    }
    const layers = (parsed as { layers?: unknown } | null)?.layers;
    if (layers !== undefined && (typeof layers !== "object" || layers === null)) {
      throw new TpError("E_FORMAT", "__metadata__._quantization_metadata.layers is not an object", {
        ...(file === undefined ? {} : { file }),
      });
    }
    for (const [layer, payload] of Object.entries((layers ?? {}) as Record<string, unknown>)) {
      if (typeof payload !== "object" || payload === null) {
        throw new TpError("E_FORMAT", "quantization metadata entry is not an object", where(layer));
      }
      metaLayers.set(layer, payload as Record<string, unknown>);
    }
  }

  // Rule 1's markers, and the layers that rules 1–2 name.
  const markers = new Map<string, Record<string, unknown>>();
  for (const [name, info] of tensors) {
    if (!name.endsWith(MARKER_SUFFIX)) continue;
    const layer = name.slice(0, -MARKER_SUFFIX.length);
    aux.set(name, `${layer}.weight`);
    markers.set(layer, parseMarker(name, info, where(name)));
  }
  for (const [layer, from] of [
    ...[...markers.keys()].map((l) => [l, `${l}${MARKER_SUFFIX}`] as const),
    ...[...metaLayers.keys()].map((l) => [l, "__metadata__._quantization_metadata"] as const),
  ]) {
    if (!tensors.has(`${layer}.weight`)) {
      throw new TpError(
        "E_FORMAT",
        `${from} describes layer '${layer}' but there is no '${layer}.weight'`,
        where(layer),
      );
    }
  }

  const legacyFp8 = tensors.has("scaled_fp8");
  if (legacyFp8) aux.set("scaled_fp8", "");

  for (const [name, info] of tensors) {
    if (aux.has(name)) continue;
    const layer = name.endsWith(".weight") ? name.slice(0, -".weight".length) : undefined;
    let payload: Record<string, unknown> | undefined;
    let source: "comfy_quant" | "metadata" = "comfy_quant";
    if (layer !== undefined && markers.has(layer)) {
      payload = markers.get(layer);
    } else if (layer !== undefined && metaLayers.has(layer)) {
      payload = metaLayers.get(layer);
      source = "metadata";
    }
    const f = payload
      ? fromMarker(name, layer as string, info, payload, source, tensors, where(name))
      : inferFormat(name, layer, info, tensors, legacyFp8, input.expectedShapes?.[name], where(name));
    out.set(name, f);
    if (f.scale) aux.set(f.scale.tensor, name);
  }
  // Scale tensors were visited as data tensors before their weight claimed them; drop them.
  for (const s of aux.keys()) out.delete(s);
  return { tensors: out, auxiliary: aux };
}

type Where = { tensor: string; file?: string };

function parseMarker(name: string, info: TensorInfo, where: Where): Record<string, unknown> {
  if (info.data === undefined) {
    throw new TpError("E_FORMAT", "comfy_quant marker given without its bytes (TensorInfo.data)", where);
  }
  if (info.dtype !== "U8" || info.shape.length !== 1) {
    throw new TpError(
      "E_FORMAT",
      `comfy_quant marker must be U8 1-D, got ${info.dtype} [${info.shape}]`,
      where,
    );
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(info.data));
  } catch (e) {
    throw new TpError("E_FORMAT", `comfy_quant marker ${name} is not UTF-8 JSON`, { ...where, cause: e });
  }
  if (
    typeof parsed !== "object" ||
    parsed === null ||
    typeof (parsed as { format?: unknown }).format !== "string"
  ) {
    throw new TpError("E_FORMAT", "comfy_quant marker has no string 'format' field", where);
  }
  return parsed as Record<string, unknown>;
}

function fromMarker(
  name: string,
  layer: string,
  info: TensorInfo,
  payload: Record<string, unknown>,
  source: "comfy_quant" | "metadata",
  tensors: ReadonlyMap<string, TensorInfo>,
  where: Where,
): TensorFormat {
  const fmt = payload.format;
  if (typeof fmt !== "string")
    throw new TpError("E_FORMAT", "quantization entry has no string 'format'", where);
  if (fmt === "float8_e4m3fn" || fmt === "float8_e5m2") {
    const want = fmt === "float8_e4m3fn" ? "F8_E4M3" : "F8_E5M2";
    if (info.dtype !== want) {
      throw new TpError(
        "E_FORMAT",
        `marker says ${fmt} but the weight is ${info.dtype}, expected ${want}`,
        where,
      );
    }
    const scale = fp8Scale(layer, tensors, false, where);
    return {
      name,
      format: fmt === "float8_e4m3fn" ? "f8_e4m3fn" : "f8_e5m2",
      storedDtype: info.dtype,
      shape: info.shape,
      ...(scale ? { scale } : {}),
      source,
      marker: payload,
    };
  }
  if (fmt === "int8_tensorwise" && payload.convrot !== true) {
    throw new TpError(
      "E_UNSUPPORTED",
      "comfy_quant format int8_tensorwise without convrot: true (plain per-row int8) is not supported; only INT8 ConvRot is",
      where,
    );
  }
  if (fmt === "int8_tensorwise" || fmt === "convrot_w4a4" || fmt === "int4_tensorwise") {
    const format = fmt === "int8_tensorwise" ? "int8_convrot" : "int4_convrot";
    const g = payload.convrot_groupsize ?? CONVROT_GROUP_SIZE;
    if (typeof g !== "number" || !isPowerOf4(g)) {
      throw new TpError(
        "E_FORMAT",
        `convrot_groupsize ${JSON.stringify(g)} is not a power of 4 (4, 16, 64, 256, ...)`,
        where,
      );
    }
    return convRotFormat(name, layer, info, format, g, source, tensors, where, payload);
  }
  throw new TpError(
    "E_UNSUPPORTED",
    `unknown comfy_quant format '${fmt}'; expected one of: ${KNOWN_COMFY_QUANT_FORMATS.join(", ")}`,
    where,
  );
}

function inferFormat(
  name: string,
  layer: string | undefined,
  info: TensorInfo,
  tensors: ReadonlyMap<string, TensorInfo>,
  legacyFp8: boolean,
  expected: readonly [number, number] | undefined,
  where: Where,
): TensorFormat {
  const plain = dtypeFromSafetensors(info.dtype);
  if ((info.dtype === "F8_E4M3" || info.dtype === "F8_E5M2") && layer !== undefined) {
    const scale = fp8Scale(layer, tensors, legacyFp8, where);
    const viaLegacy = scale?.tensor.endsWith(".scale_weight") ?? false;
    return {
      name,
      format: info.dtype === "F8_E4M3" ? "f8_e4m3fn" : "f8_e5m2",
      storedDtype: info.dtype,
      shape: info.shape,
      ...(scale ? { scale } : {}),
      source: viaLegacy ? "scaled_fp8" : "inferred",
    };
  }
  const hasRowScale = layer !== undefined && tensors.has(`${layer}.weight_scale`);
  if (
    layer !== undefined &&
    hasRowScale &&
    info.shape.length === 2 &&
    (info.dtype === "I8" || info.dtype === "U8")
  ) {
    const [rows, cols] = info.shape as [number, number];
    const int4 = info.dtype === "U8" || (expected !== undefined && expected[1] === 2 * cols);
    if (expected !== undefined && (expected[0] !== rows || expected[1] !== (int4 ? 2 * cols : cols))) {
      throw new TpError(
        "E_SHAPE",
        `stored ${info.dtype} [${info.shape}] does not fit the expected logical shape [${expected}] as ${int4 ? "int4" : "int8"} ConvRot`,
        where,
      );
    }
    const format = int4 ? "int4_convrot" : "int8_convrot";
    return convRotFormat(
      name,
      layer,
      info,
      format,
      CONVROT_GROUP_SIZE,
      "inferred",
      tensors,
      where,
      undefined,
    );
  }
  if (plain === null) {
    throw new TpError("E_FORMAT", `unknown safetensors dtype '${info.dtype}'`, where);
  }
  return { name, format: plain, storedDtype: info.dtype, shape: info.shape, source: "inferred" };
}

function convRotFormat(
  name: string,
  layer: string,
  info: TensorInfo,
  format: "int8_convrot" | "int4_convrot",
  groupSize: number,
  source: TensorFormat["source"],
  tensors: ReadonlyMap<string, TensorInfo>,
  where: Where,
  payload: Record<string, unknown> | undefined,
): TensorFormat {
  const ok = format === "int8_convrot" ? ["I8"] : ["I8", "U8"];
  if (!ok.includes(info.dtype) || info.shape.length !== 2) {
    throw new TpError(
      "E_FORMAT",
      `${format} weight must be ${ok.join(" or ")} with 2 dimensions, got ${info.dtype} [${info.shape}]`,
      where,
    );
  }
  const [n, cols] = info.shape as [number, number];
  const k = format === "int8_convrot" ? cols : 2 * cols;
  const scaleName = `${layer}.weight_scale`;
  const scale = tensors.get(scaleName);
  if (scale === undefined) {
    throw new TpError("E_FORMAT", `${format} weight has no '${scaleName}' (one f32 scale per row)`, where);
  }
  checkFloatScale(scale, scaleName, where);
  const okShape =
    (scale.shape.length === 1 && scale.shape[0] === n) ||
    (scale.shape.length === 2 && scale.shape[0] === n && scale.shape[1] === 1);
  if (!okShape) {
    throw new TpError(
      "E_FORMAT",
      `scale shape mismatch: ${format} weight [${info.shape}] needs ${scaleName} [${n}, 1] or [${n}], got [${scale.shape}]`,
      where,
    );
  }
  if (k % groupSize !== 0) {
    throw new TpError(
      "E_SHAPE",
      `ConvRot: K = ${k} input columns is not a multiple of the rotation group size ${groupSize}`,
      where,
    );
  }
  return {
    name,
    format,
    storedDtype: info.dtype,
    shape: [n, k],
    scale: { tensor: scaleName, kind: "row" },
    groupSize,
    source,
    ...(payload ? { marker: payload } : {}),
  };
}

/** The fp8 scale of a layer: `<layer>.weight_scale`, else (legacy files) `<layer>.scale_weight`. */
function fp8Scale(
  layer: string,
  tensors: ReadonlyMap<string, TensorInfo>,
  legacy: boolean,
  where: Where,
): { tensor: string; kind: "tensor" } | undefined {
  const candidates = [`${layer}.weight_scale`, ...(legacy ? [`${layer}.scale_weight`] : [])];
  for (const s of candidates) {
    const info = tensors.get(s);
    if (info === undefined) continue;
    checkFloatScale(info, s, where);
    const numel = info.shape.reduce((a, b) => a * b, 1);
    if (numel !== 1 || info.shape.length > 1) {
      throw new TpError(
        "E_FORMAT",
        `scale shape mismatch: fp8 weight needs a scalar ${s} ([] or [1]), got [${info.shape}]`,
        where,
      );
    }
    return { tensor: s, kind: "tensor" };
  }
  return undefined;
}

function checkFloatScale(info: TensorInfo, scaleName: string, where: Where): void {
  if (info.dtype !== "F32" && info.dtype !== "BF16" && info.dtype !== "F16") {
    throw new TpError("E_FORMAT", `${scaleName} must be F32 (or BF16/F16), got ${info.dtype}`, where);
  }
}

function isPowerOf4(g: number): boolean {
  if (!Number.isInteger(g) || g < 4) return false;
  let x = g;
  while (x % 4 === 0) x /= 4;
  return x === 1;
}
