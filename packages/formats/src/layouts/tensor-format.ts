/**
 * Per-tensor weight-format detection for ComfyUI-style checkpoints — the one implementation in the
 * repository. The rules are a pure function over a table of tensor infos (names, dtypes, shapes, and the
 * bytes of `.comfy_quant` marker tensors; {@link detectTensorFormats}); `detectTensorFormat`,
 * `detectSourceFormats` and `loadWeight` apply them to an opened checkpoint (a {@link TensorSource}).
 * Decide per tensor, never per file: ComfyUI's W4A4 converter mixes int8 and int4 layers and leaves
 * others in BF16.
 *
 * Order of preference (../shared/spec/krea2.md §1.4; qwen-image.md §2.2, §10.2):
 * 1. a sibling `<layer>.comfy_quant` tensor (U8, 1-D, UTF-8 JSON) for the weight `<layer>.weight`:
 *    - `{"format": "float8_e4m3fn"}` (or `"float8_e5m2"`) → fp8, scale `<layer>.weight_scale` (scalar);
 *    - `{"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": g}` → int8_convrot;
 *    - `{"format": "convrot_w4a4" | "int4_tensorwise", "convrot_groupsize": g}` → int4_convrot;
 *    (g defaults to 256; extra keys are kept in `marker` and otherwise ignored);
 *    - `int8_tensorwise` with `convrot: false` (or without `convrot`), and the int4 formats with
 *      `convrot: false`, are plain per-row (or scalar) scaled integers (qwen-image.md §10.2). TensorPencil
 *      has no weight format for them: E_UNSUPPORTED naming the tensor (a decision, see README.md);
 * 2. `__metadata__._quantization_metadata` = `{"layers": {"<layer>": {<same payload>}}}` (full names);
 * 3. legacy scaled fp8: a root tensor `scaled_fp8` and per-layer `<layer>.scale_weight` (F32 scalar);
 * 4. no marker — from dtype and shape: `F8_E4M3` / `F8_E5M2` → fp8 (× `<layer>.weight_scale` when
 *    present); `I8` [N, K] with a `weight_scale` → int8_convrot, `I8` [N, K/2] (when the expected
 *    logical shape says so) or `U8` [N, K/2] with a `weight_scale` → int4_convrot, group 256;
 *    `BF16`/`F16`/`F32` → dense; anything else → its plain dtype.
 * Scale tensors: fp8 a scalar (`[]` or `[1]`); ConvRot one float per row (`[N, 1]` or `[N]`).
 */

import {
  decodeToF32,
  dtypeFromSafetensors,
  TpError,
  Weight,
  type WeightFormat,
  type WeightScale,
  weightFormatInfo,
} from "@tp/tensor";
import { formatError } from "../errors.ts";
import type { TensorSource } from "../tensors.ts";

/** Default ConvRot rotation group when a marker has no `convrot_groupsize` (krea2.md §1.6): 256. */
export const DEFAULT_CONVROT_GROUP_SIZE: number = weightFormatInfo("int8_convrot").rotationGroup as number;

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
  readonly metadata?: Readonly<Record<string, string>> | ReadonlyMap<string, string> | null;
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
   * `f8_e5m2` (raw or scaled), `int8_convrot`, `int4_convrot`, or (GGUF) a block type (`q4_k`, …).
   */
  readonly format: WeightFormat;
  /** The stored dtype string: a safetensors dtype (`BF16`, `I8`) or a ggml type name (`Q4_K`). */
  readonly storedDtype: string;
  /** Logical shape: the stored shape, except int4 ConvRot [N, K] where the file holds [N, K/2]. */
  readonly shape: readonly number[];
  /**
   * The scale tensor and its kind: `tensor` (fp8: one scalar, `w = f32(fp8) · s`) or `row` (ConvRot: one
   * per output row, of the rotated weight). Absent for unscaled tensors (raw fp8: scale 1).
   */
  readonly scale?: { readonly tensor: string; readonly kind: "tensor" | "row" };
  /** ConvRot only: columns per rotation group (`convrot_groupsize`), a power of 4. */
  readonly groupSize?: number;
  /**
   * Which rule decided: a `.comfy_quant` marker, the metadata, legacy `scaled_fp8`, dtype/shape, or the
   * GGUF tensor type.
   */
  readonly source: "comfy_quant" | "metadata" | "scaled_fp8" | "inferred" | "gguf";
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

type Where = { tensor: string; file?: string };

/**
 * The parsed markers and metadata of one checkpoint, and the per-tensor rules. Build once per
 * checkpoint; {@link FormatRules.detect} then decides one tensor without looking at the others' bytes.
 */
class FormatRules {
  readonly tensors: ReadonlyMap<string, TensorInfo>;
  readonly markers = new Map<string, Record<string, unknown>>();
  readonly metaLayers = new Map<string, Record<string, unknown>>();
  readonly legacyFp8: boolean;
  readonly file: string | undefined;

  constructor(input: DetectInput) {
    this.tensors =
      input.tensors instanceof Map
        ? input.tensors
        : new Map(Object.entries(input.tensors as Record<string, TensorInfo>));
    this.file = input.file;
    const fileOnly = this.file === undefined ? {} : { file: this.file };
    // Rule 2's table: layer → payload.
    const meta = input.metadata;
    const metaText =
      meta instanceof Map
        ? meta.get("_quantization_metadata")
        : (meta as Record<string, string> | null)?._quantization_metadata;
    if (metaText !== undefined) {
      let parsed: unknown;
      try {
        parsed = JSON.parse(metaText);
      } catch (e) {
        throw new TpError("E_FORMAT", "__metadata__._quantization_metadata is not valid JSON", {
          ...fileOnly,
          cause: e,
        });
      }
      const layers = (parsed as { layers?: unknown } | null)?.layers;
      if (layers !== undefined && (typeof layers !== "object" || layers === null)) {
        throw new TpError(
          "E_FORMAT",
          "__metadata__._quantization_metadata.layers is not an object",
          fileOnly,
        );
      }
      for (const [layer, payload] of Object.entries((layers ?? {}) as Record<string, unknown>)) {
        if (typeof payload !== "object" || payload === null) {
          throw new TpError("E_FORMAT", "quantization metadata entry is not an object", this.where(layer));
        }
        this.metaLayers.set(layer, payload as Record<string, unknown>);
      }
    }
    // Rule 1's markers, and the layers that rules 1–2 name.
    for (const [name, info] of this.tensors) {
      if (!name.endsWith(MARKER_SUFFIX)) continue;
      this.markers.set(name.slice(0, -MARKER_SUFFIX.length), parseMarker(name, info, this.where(name)));
    }
    for (const [layer, from] of [
      ...[...this.markers.keys()].map((l) => [l, `${l}${MARKER_SUFFIX}`] as const),
      ...[...this.metaLayers.keys()].map((l) => [l, "__metadata__._quantization_metadata"] as const),
    ]) {
      if (!this.tensors.has(`${layer}.weight`)) {
        throw new TpError(
          "E_FORMAT",
          `${from} describes layer '${layer}' but there is no '${layer}.weight'`,
          this.where(layer),
        );
      }
    }
    this.legacyFp8 = this.tensors.has("scaled_fp8");
  }

  where(tensor: string): Where {
    return { tensor, ...(this.file === undefined ? {} : { file: this.file }) };
  }

  /** True for marker tensors and the `scaled_fp8` flag (they describe other tensors). */
  isMarker(name: string): boolean {
    return name.endsWith(MARKER_SUFFIX) || (this.legacyFp8 && name === "scaled_fp8");
  }

  /** The format of the data tensor `name` (rules 1–4). */
  detect(name: string, expected: readonly [number, number] | undefined): TensorFormat {
    const info = this.tensors.get(name);
    if (info === undefined) {
      throw new TpError("E_FORMAT", `no tensor '${name}' in this checkpoint`, this.where(name));
    }
    const where = this.where(name);
    const layer = name.endsWith(".weight") ? name.slice(0, -".weight".length) : undefined;
    if (layer !== undefined && this.markers.has(layer)) {
      return this.fromMarker(
        name,
        layer,
        info,
        this.markers.get(layer) as Record<string, unknown>,
        "comfy_quant",
        where,
      );
    }
    if (layer !== undefined && this.metaLayers.has(layer)) {
      return this.fromMarker(
        name,
        layer,
        info,
        this.metaLayers.get(layer) as Record<string, unknown>,
        "metadata",
        where,
      );
    }
    return this.infer(name, layer, info, expected, where);
  }

  fromMarker(
    name: string,
    layer: string,
    info: TensorInfo,
    payload: Record<string, unknown>,
    source: "comfy_quant" | "metadata",
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
      const scale = this.fp8Scale(layer, false, where);
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
    const int8 = fmt === "int8_tensorwise";
    const int4 = fmt === "convrot_w4a4" || fmt === "int4_tensorwise";
    if ((int8 && payload.convrot !== true) || (int4 && payload.convrot === false)) {
      // qwen-image.md §10.2: "A `convrot: false` entry means plain per-row (or single scalar) scale."
      throw new TpError(
        "E_UNSUPPORTED",
        `comfy_quant ${fmt} without convrot: true is plain ${int8 ? "int8" : "int4"} with a per-row or scalar scale (qwen-image.md §10.2); TensorPencil has no weight format for it, only ConvRot — convert the float source with 'bun apps/cli quantize --format ${int8 ? "int8" : "int4"}-convrot'`,
        where,
      );
    }
    if (int8 || int4) {
      const g = payload.convrot_groupsize ?? DEFAULT_CONVROT_GROUP_SIZE;
      if (typeof g !== "number" || !isPowerOf4(g)) {
        throw new TpError(
          "E_FORMAT",
          `convrot_groupsize ${JSON.stringify(g)} is not a power of 4 (4, 16, 64, 256, ...)`,
          where,
        );
      }
      return this.convRot(
        name,
        layer,
        info,
        int8 ? "int8_convrot" : "int4_convrot",
        g,
        source,
        where,
        payload,
      );
    }
    throw new TpError(
      "E_UNSUPPORTED",
      `unknown comfy_quant format '${fmt}'; expected one of: ${KNOWN_COMFY_QUANT_FORMATS.join(", ")}`,
      where,
    );
  }

  infer(
    name: string,
    layer: string | undefined,
    info: TensorInfo,
    expected: readonly [number, number] | undefined,
    where: Where,
  ): TensorFormat {
    const plain = dtypeFromSafetensors(info.dtype);
    if ((info.dtype === "F8_E4M3" || info.dtype === "F8_E5M2") && layer !== undefined) {
      const scale = this.fp8Scale(layer, this.legacyFp8, where);
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
    const hasRowScale = layer !== undefined && this.tensors.has(`${layer}.weight_scale`);
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
      return this.convRot(
        name,
        layer,
        info,
        format,
        DEFAULT_CONVROT_GROUP_SIZE,
        "inferred",
        where,
        undefined,
      );
    }
    if (plain === null) {
      throw new TpError("E_FORMAT", `unknown safetensors dtype '${info.dtype}'`, where);
    }
    return { name, format: plain, storedDtype: info.dtype, shape: info.shape, source: "inferred" };
  }

  convRot(
    name: string,
    layer: string,
    info: TensorInfo,
    format: "int8_convrot" | "int4_convrot",
    groupSize: number,
    source: TensorFormat["source"],
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
    const scale = this.tensors.get(scaleName);
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
  fp8Scale(layer: string, legacy: boolean, where: Where): { tensor: string; kind: "tensor" } | undefined {
    const candidates = [`${layer}.weight_scale`, ...(legacy ? [`${layer}.scale_weight`] : [])];
    for (const s of candidates) {
      const info = this.tensors.get(s);
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
}

/**
 * Decide the storage format of every tensor of a checkpoint (see the module comment for the rules).
 * Pure: no file I/O; marker bytes come in `TensorInfo.data`.
 * @param input tensor infos (with marker bytes), metadata, optional expected logical shapes
 * @returns formats of the data tensors, plus the auxiliary (marker / scale) tensors
 * @throws TpError, naming the tensor (and file when given):
 *   - E_FORMAT: a marker that is not JSON or has no `format`, a marker or metadata entry for a layer
 *     without a `<layer>.weight`, a weight whose dtype or rank does not fit its marker, a missing scale
 *     where the format needs one, a scale of the wrong shape or dtype ("scale shape mismatch"), a
 *     group size that is not a power of 4;
 *   - E_UNSUPPORTED: an unknown marker format (the message lists the known ones), `int8_tensorwise`
 *     without ConvRot (`convrot: false`, qwen-image.md §10.2);
 *   - E_SHAPE: a ConvRot K that is not a multiple of the group size.
 */
export function detectTensorFormats(input: DetectInput): DetectResult {
  const rules = new FormatRules(input);
  const out = new Map<string, TensorFormat>();
  const aux = new Map<string, string>();
  for (const layer of rules.markers.keys()) aux.set(`${layer}${MARKER_SUFFIX}`, `${layer}.weight`);
  if (rules.legacyFp8) aux.set("scaled_fp8", "");
  for (const name of rules.tensors.keys()) {
    if (aux.has(name)) continue;
    const f = rules.detect(name, input.expectedShapes?.[name]);
    out.set(name, f);
    if (f.scale) aux.set(f.scale.tensor, name);
  }
  // Scale tensors were visited as data tensors before their weight claimed them; drop them.
  for (const s of aux.keys()) out.delete(s);
  return { tensors: out, auxiliary: aux };
}

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
    Array.isArray(parsed) ||
    typeof (parsed as { format?: unknown }).format !== "string"
  ) {
    throw new TpError("E_FORMAT", "comfy_quant marker has no string 'format' field", where);
  }
  return parsed as Record<string, unknown>;
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

// ---------------------------------------------------------------------------------------------------
// The same rules on an opened checkpoint.

/** `blocks.0.attn.wq.weight` → `blocks.0.attn.wq`; other names unchanged. */
export function layerOf(weightName: string): string {
  return weightName.endsWith(".weight") ? weightName.slice(0, -".weight".length) : weightName;
}

/**
 * The detection input of an opened safetensors checkpoint: every tensor's dtype and shape, the bytes of
 * its `.comfy_quant` markers (views on the mapping), its `__metadata__` and its path.
 * @throws TpError E_IO when a marker cannot be mapped
 */
export function detectInputOf(src: TensorSource): DetectInput {
  const tensors = new Map<string, TensorInfo>();
  for (const t of src.tensors) {
    tensors.set(t.name, {
      dtype: t.dtype,
      shape: t.shape,
      ...(t.name.endsWith(MARKER_SUFFIX) ? { data: src.data(t.name) } : {}),
    });
  }
  const metadata = (src as { metadata?: unknown }).metadata;
  return {
    tensors,
    ...(metadata instanceof Map ? { metadata: metadata as ReadonlyMap<string, string> } : {}),
    file: src.path,
  };
}

const rulesOf = new WeakMap<TensorSource, FormatRules>();

function sourceRules(src: TensorSource): FormatRules {
  let r = rulesOf.get(src);
  if (r === undefined) {
    r = new FormatRules(detectInputOf(src));
    rulesOf.set(src, r);
  }
  return r;
}

function ggufFormat(src: TensorSource, name: string): TensorFormat {
  const t = src.tensor(name);
  if (t.format === null)
    throw new TpError("E_UNSUPPORTED", `ggml type ${t.dtype} has no weight format`, {
      file: t.file,
      tensor: name,
    });
  return { name, format: t.format, storedDtype: t.dtype, shape: t.shape, source: "gguf" };
}

/**
 * Every tensor's format in an opened checkpoint ({@link detectTensorFormats} on
 * {@link detectInputOf}; for GGUF, each tensor's ggml type, with no auxiliary tensors).
 * @param options.expectedShapes logical [N, K] of weights, as in {@link DetectInput}
 * @throws TpError as {@link detectTensorFormats}, naming the file
 */
export function detectSourceFormats(
  src: TensorSource,
  options: { expectedShapes?: Readonly<Record<string, readonly [number, number]>> } = {},
): DetectResult {
  if (src.kind === "gguf") {
    return {
      tensors: new Map(src.tensors.map((t) => [t.name, ggufFormat(src, t.name)])),
      auxiliary: new Map(),
    };
  }
  return detectTensorFormats({ ...detectInputOf(src), ...options });
}

/**
 * Decide the storage format of the one tensor `name` of an opened checkpoint (krea2.md §1.4; the rules
 * of {@link detectTensorFormats}, parsed once per checkpoint and cached).
 * @param expectedK the logical input width, when known (tells INT4-packed `[N, K/2]` I8 from INT8)
 * @throws TpError E_FORMAT for a missing tensor or a bad marker (naming tensor and file); E_UNSUPPORTED
 *   for a known but unsupported quantization format (`convrot: false`), or a GGUF type without a format;
 *   E_SHAPE for a ConvRot K that is not a multiple of its group
 */
export function detectTensorFormat(src: TensorSource, name: string, expectedK?: number): TensorFormat {
  const t = src.tensor(name);
  if (src.kind === "gguf") return ggufFormat(src, name);
  const rows = t.shape[0];
  const expected =
    expectedK === undefined || t.shape.length !== 2 ? undefined : ([rows as number, expectedK] as const);
  return sourceRules(src).detect(name, expected);
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
 * The checkpoint tensor `name` as a `Weight` [N, K]: a view on the mapping (no copy) with the scales its
 * format needs, and for ConvRot the marker's `convrot_groupsize` as `Weight.rotationGroup`. Leading
 * dimensions are folded into N (`[E, N, K]` → `[E·N, K]`); a 1-D tensor is `[1, K]`. For GGUF, K is
 * `ne[0]`.
 * @param expectedK logical input width, to recognise unmarked INT4 ConvRot packed `[N, K/2]` in I8
 * @throws TpError as {@link detectTensorFormat}; E_FORMAT when the scales do not fit; E_SHAPE for a
 *   scalar
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
  if (f.scale !== undefined) {
    const values = f32Values(src, f.scale.tensor);
    scale = f.scale.kind === "row" ? { kind: "row", values } : { kind: "tensor", value: values[0] as number };
  }
  return new Weight({
    name,
    format: f.format,
    shape: [n, k],
    data: src.data(name),
    source: { file: t.file, byteOffset: t.byteOffset, byteLength: t.byteLength },
    ...(scale ? { scale } : {}),
    ...(f.groupSize !== undefined ? { rotationGroup: f.groupSize } : {}),
  });
}
