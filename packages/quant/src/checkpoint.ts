/**
 * Quantizing a whole float checkpoint the way ComfyUI's converters do: which weights, which group
 * size, what lands in the file (`<layer>.weight`, `<layer>.weight_scale`, `<layer>.comfy_quant`), and a
 * streaming writer that never holds more than one tensor (ConvRot: a block of rows) in memory. Used by
 * `bun apps/cli quantize` ({@link quantizeCheckpoint}) and by the quantize-on-load caches (`cache.ts`).
 *
 * Storage, per quantized layer `<layer>.weight` [N, K] (krea2.md §1.4, §1.7–1.8; the krea2-tiny files):
 * - int8_convrot: `weight` I8 [N, K], `weight_scale` F32 [N, 1], marker
 *   `{"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": g}`;
 * - int4_convrot: `weight` I8 [N, K/2] (two nibbles per byte), `weight_scale` F32 [N], marker
 *   `{"format": "convrot_w4a4", "convrot_groupsize": g}`;
 * - fp8_scaled: `weight` F8_E4M3 [N, K], `weight_scale` F32 [] (scalar), marker `{"format": "float8_e4m3fn"}`.
 * Markers are 1-D U8 tensors holding that JSON text exactly as Python's `json.dumps` spaces it (the
 * bytes ComfyUI's files hold). Every other tensor is copied unchanged, and `__metadata__` is kept.
 */
import {
  firstNonFinite,
  formatBytes,
  openCheckpoint,
  quantizableWeights,
  type SafetensorsTensorSpec,
  SafetensorsWriter,
  sameFile,
  type TensorEntry,
  type TensorSource,
} from "@tp/formats";
import { TpError } from "@tp/tensor";
import { type ConvRotFormat, type ConvRotWeight, quantizeConvRot } from "./convrot.ts";
import { type Fp8ScaledWeight, quantizeFp8Scaled } from "./fp8.ts";
import { hadamardDigits } from "./hadamard.ts";
import { type FloatBytes, nonFiniteInput } from "./input.ts";
import { type ProgressReporter, silentProgress } from "./progress.ts";

/** What a checkpoint can be quantized to. */
export type CheckpointQuantFormat = ConvRotFormat | "fp8_scaled";

/** The names, for errors and the CLI. */
export const CHECKPOINT_QUANT_FORMATS: readonly CheckpointQuantFormat[] = [
  "int8_convrot",
  "int4_convrot",
  "fp8_scaled",
];

/**
 * The rotation groups a layer gets when no group size is given: the largest that divides its K. 256
 * is every production Krea 2 / Qwen-Image file's; ComfyUI's converters use 64 and 16 for narrower
 * layers (the krea2-tiny files: K = 80 text-fusion linears at 16).
 */
export const AUTO_CONVROT_GROUP_SIZES: readonly number[] = [256, 64, 16];

/** A per-layer rotation group: layers whose name matches `pattern` (a `Bun.Glob`) use `groupSize`. */
export interface GroupSizeRule {
  /** Glob over the layer name (`blocks.1.*`) or the full tensor name (`blocks.1.attn.wq.weight`). */
  readonly pattern: string;
  /** A power of 4 dividing the layer's K. */
  readonly groupSize: number;
}

/** Options of {@link planQuantization}. */
export interface QuantizePlanOptions {
  /** Target format. */
  readonly format: CheckpointQuantFormat;
  /**
   * ConvRot rotation group of every quantized layer (ignored for fp8). Absent: per layer the largest
   * of {@link AUTO_CONVROT_GROUP_SIZES} that divides its K (the plan marks those layers `autoGroup`).
   */
  readonly groupSize?: number;
  /** Per-layer groups; the last matching rule wins over `groupSize`. Each must match a quantized layer. */
  readonly groupSizes?: readonly GroupSizeRule[];
  /**
   * Globs selecting the weights to quantize, instead of the layout's default table
   * (`@tp/formats` `quantizableWeights`). Each must match a tensor.
   */
  readonly layers?: readonly string[];
  /** Globs of layers to leave as they are (applied after `layers`). Each must match a selected layer. */
  readonly keep?: readonly string[];
  /**
   * How error messages name the fix for a layer whose K does not fit: `options` (default) names these
   * options (`groupSizes` / `keep`), `cli` the flags of `bun apps/cli quantize` (`--group-size` /
   * `--keep`).
   */
  readonly hints?: "options" | "cli";
}

/** One tensor of the source and what becomes of it. */
export interface PlannedTensor {
  /** Source tensor name. */
  readonly name: string;
  /** `copy` unchanged, or `quantize` to the plan's format. */
  readonly action: "copy" | "quantize";
  /** Source dtype string (`BF16`). */
  readonly dtype: string;
  /** Source shape. */
  readonly shape: readonly number[];
  /** ConvRot rotation group (quantized ConvRot layers only). */
  readonly groupSize?: number;
  /** True when `groupSize` was chosen from K (no group size option or rule named this layer). */
  readonly autoGroup?: boolean;
  /** The tensors this one becomes in the output (copy: itself; quantize: weight, scale, marker). */
  readonly outputs: readonly SafetensorsTensorSpec[];
}

/** The result of {@link planQuantization}. */
export interface QuantizePlan {
  /** Target format. */
  readonly format: CheckpointQuantFormat;
  /** Every source tensor, in file order. */
  readonly tensors: readonly PlannedTensor[];
  /** How the quantized layers were chosen, in words. */
  readonly rule: string;
}

/**
 * The `.comfy_quant` JSON text of a quantized layer, spaced as Python's `json.dumps` writes it (the
 * bytes of ComfyUI's own files).
 * @param groupSize the ConvRot rotation group (ignored for fp8)
 */
export function comfyQuantMarker(format: CheckpointQuantFormat, groupSize: number): string {
  if (format === "int8_convrot")
    return `{"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": ${groupSize}}`;
  if (format === "int4_convrot") return `{"format": "convrot_w4a4", "convrot_groupsize": ${groupSize}}`;
  return `{"format": "float8_e4m3fn"}`;
}

const FLOAT_DTYPES: Readonly<Record<string, "bf16" | "f16" | "f32">> = {
  BF16: "bf16",
  F16: "f16",
  F32: "f32",
};

/** True when the glob matches the layer name (`x.weight` → `x`) or the full name. */
function matches(glob: Bun.Glob, name: string): boolean {
  const layer = name.endsWith(".weight") ? name.slice(0, -".weight".length) : name;
  return glob.match(layer) || glob.match(name);
}

function checkGroupSize(g: number, what: string): void {
  if (!Number.isSafeInteger(g) || g < 4 || 4 ** hadamardDigitsSafe(g) !== g) {
    throw new TpError(
      "E_ARG",
      `${what}: the rotation group must be a power of 4 (4, 16, 64, 256, …), got ${g}`,
    );
  }
}

function hadamardDigitsSafe(g: number): number {
  try {
    return hadamardDigits(g);
  } catch {
    return -1;
  }
}

/**
 * Decide what happens to every tensor of a float checkpoint, and check everything before any byte is
 * written: the selection, the group sizes and every quantized layer's shape.
 * @param src     an opened safetensors checkpoint (BF16 / F16 / F32 weights)
 * @param options format, group sizes, layer selection
 * @throws TpError, naming the tensor or the option:
 *   - E_ARG: a group size that is not a power of 4; a `layers` / `keep` / `groupSizes` glob that
 *     matches nothing; a selected tensor that is not a `.weight`;
 *   - E_UNSUPPORTED: a selected weight that is not BF16/F16/F32 (already quantized); a layout without a
 *     default selection (pass `layers`); a GGUF source;
 *   - E_SHAPE: a selected weight that is not 2-D; int4 with an odd K; a ConvRot K that is not a multiple
 *     of the layer's group (the message says which `groupSizes` rule or `keep` would fix it);
 *   - E_FORMAT: the source already holds the `weight_scale` or `comfy_quant` tensor a layer would get.
 */
export function planQuantization(src: TensorSource, options: QuantizePlanOptions): QuantizePlan {
  const { format } = options;
  if (!CHECKPOINT_QUANT_FORMATS.includes(format)) {
    throw new TpError(
      "E_ARG",
      `unknown quantization format '${format}'; expected one of: ${CHECKPOINT_QUANT_FORMATS.join(", ")}`,
    );
  }
  if (src.kind !== "safetensors") {
    throw new TpError(
      "E_UNSUPPORTED",
      `quantization reads safetensors checkpoints; this is a ${src.kind} file (GGUF has its own block quantizations)`,
      { file: src.path },
    );
  }
  const convRot = format !== "fp8_scaled";
  const defaultGroup = options.groupSize;
  if (convRot && defaultGroup !== undefined) checkGroupSize(defaultGroup, "group size");
  const groupRules = (options.groupSizes ?? []).map((r) => {
    checkGroupSize(r.groupSize, `group size of '${r.pattern}'`);
    return { ...r, glob: new Bun.Glob(r.pattern), used: false };
  });

  // Which weights.
  let selected: Set<string>;
  let rule: string;
  if (options.layers !== undefined && options.layers.length > 0) {
    selected = new Set();
    for (const pattern of options.layers) {
      const glob = new Bun.Glob(pattern);
      const hit = src.tensors.filter((t) => matches(glob, t.name));
      if (hit.length === 0)
        throw new TpError("E_ARG", `layer pattern '${pattern}' matches no tensor`, { file: src.path });
      for (const t of hit) selected.add(t.name);
    }
    rule = `layers matching ${options.layers.map((p) => `'${p}'`).join(", ")}`;
  } else {
    const q = quantizableWeights(src);
    selected = new Set(q.names);
    rule = `${q.layout}: ${q.rule}`;
  }
  for (const pattern of options.keep ?? []) {
    const glob = new Bun.Glob(pattern);
    const hit = [...selected].filter((n) => matches(glob, n));
    if (hit.length === 0) {
      throw new TpError("E_ARG", `keep pattern '${pattern}' matches no layer that would be quantized`, {
        file: src.path,
      });
    }
    for (const n of hit) selected.delete(n);
  }
  if ((options.keep ?? []).length > 0)
    rule += `, keeping ${(options.keep ?? []).map((p) => `'${p}'`).join(", ")}`;

  const tensors = src.tensors.map((t): PlannedTensor => {
    const copy: PlannedTensor = {
      name: t.name,
      action: "copy",
      dtype: t.dtype,
      shape: t.shape,
      outputs: [{ name: t.name, dtype: t.dtype, shape: t.shape }],
    };
    if (!selected.has(t.name)) return copy;
    const group = convRot ? groupOf(t.name, defaultGroup, groupRules) : 0;
    return planLayer(src, t, format, group, options.hints ?? "options");
  });
  for (const r of groupRules) {
    if (!r.used && convRot) {
      throw new TpError("E_ARG", `group-size pattern '${r.pattern}' matches no layer that is quantized`, {
        file: src.path,
      });
    }
  }
  return { format, tensors, rule };
}

/** The layer's group from the rules (last match wins), else `fallback`; undefined: choose from K. */
function groupOf(
  name: string,
  fallback: number | undefined,
  rules: { pattern: string; groupSize: number; glob: Bun.Glob; used: boolean }[],
): number | undefined {
  let g = fallback;
  for (const r of rules) {
    if (matches(r.glob, name)) {
      g = r.groupSize;
      r.used = true;
    }
  }
  return g;
}

/**
 * One selected layer's plan; `given` is its ConvRot group from the options (0 for fp8), or undefined
 * to take the largest of {@link AUTO_CONVROT_GROUP_SIZES} dividing K.
 */
function planLayer(
  src: TensorSource,
  t: TensorEntry,
  format: CheckpointQuantFormat,
  given: number | undefined,
  hints: "options" | "cli",
): PlannedTensor {
  const where = { file: src.path, tensor: t.name };
  if (!t.name.endsWith(".weight")) {
    throw new TpError("E_ARG", "only '<layer>.weight' tensors can be quantized", where);
  }
  if (FLOAT_DTYPES[t.dtype] === undefined) {
    throw new TpError(
      "E_UNSUPPORTED",
      `the weight is ${t.dtype}, not BF16, F16 or F32 (already quantized?); quantize from a float checkpoint`,
      where,
    );
  }
  if (t.shape.length !== 2) {
    throw new TpError("E_SHAPE", `only 2-D weights [N, K] can be quantized, got [${t.shape}]`, where);
  }
  const layer = t.name.slice(0, -".weight".length);
  for (const aux of [`${layer}.weight_scale`, `${layer}.comfy_quant`]) {
    if (src.has(aux)) {
      throw new TpError(
        "E_FORMAT",
        `the source already has '${aux}'; is this layer quantized already?`,
        where,
      );
    }
  }
  const [n, k] = t.shape as [number, number];
  // Say how to get past it: a per-layer group that divides K (the largest power of 4 up to 256), or
  // leaving the layer unquantized (CLI flag, and the option of QuantizePlanOptions).
  const hint = (why: string) => {
    let g = 4;
    while (k % (g * 4) === 0 && g * 4 <= 256) g *= 4;
    if (hints === "cli") {
      const fix = k % 4 === 0 ? `--group-size '${layer}=${g}' or ` : "";
      return `${why}; use ${fix}--keep '${layer}' to leave it unquantized`;
    }
    const fix = k % 4 === 0 ? `groupSizes [{ pattern: '${layer}', groupSize: ${g} }] or ` : "";
    return `${why}; set ${fix}keep ['${layer}'] to leave it unquantized`;
  };
  if (format === "int4_convrot" && k % 2 !== 0) {
    throw new TpError(
      "E_SHAPE",
      hint(`int4 ConvRot packs two columns per byte and needs an even K, got K = ${k}`),
      where,
    );
  }
  const auto = given === undefined;
  const groupSize = given ?? AUTO_CONVROT_GROUP_SIZES.find((g) => k % g === 0);
  if (groupSize === undefined) {
    throw new TpError(
      "E_SHAPE",
      hint(
        `K = ${k} input columns is not a multiple of any ConvRot rotation group (${AUTO_CONVROT_GROUP_SIZES.join(", ")})`,
      ),
      where,
    );
  }
  if (format !== "fp8_scaled" && k % groupSize !== 0) {
    throw new TpError(
      "E_SHAPE",
      hint(`K = ${k} input columns is not a multiple of the rotation group ${groupSize}`),
      where,
    );
  }
  const marker = new TextEncoder().encode(comfyQuantMarker(format, groupSize));
  const outputs: SafetensorsTensorSpec[] =
    format === "int8_convrot"
      ? [
          { name: t.name, dtype: "I8", shape: [n, k] },
          { name: `${layer}.weight_scale`, dtype: "F32", shape: [n, 1] },
        ]
      : format === "int4_convrot"
        ? [
            { name: t.name, dtype: "I8", shape: [n, k / 2] },
            { name: `${layer}.weight_scale`, dtype: "F32", shape: [n] },
          ]
        : [
            { name: t.name, dtype: "F8_E4M3", shape: [n, k] },
            { name: `${layer}.weight_scale`, dtype: "F32", shape: [] },
          ];
  outputs.push({ name: `${layer}.comfy_quant`, dtype: "U8", shape: [marker.length] });
  return {
    name: t.name,
    action: "quantize",
    dtype: t.dtype,
    shape: t.shape,
    ...(format === "fp8_scaled" ? {} : { groupSize, ...(auto ? { autoGroup: true } : {}) }),
    outputs,
  };
}

/** Elements per block of rows quantized at once (bounds the f32 working memory to ~64 MiB). */
const ROW_BLOCK_ELEMENTS = 1 << 22;

/**
 * The quantizer the checkpoint and cache writers call: the injection point for faster
 * implementations (the native, multi-threaded one is `createNativeQuantizer()` of
 * `@tp/backend-cpu`; this package does not import a backend). Every implementation must return the
 * bytes and f32 scales of the TypeScript reference ({@link referenceQuantizer}) bit for bit — caches
 * are keyed without naming the quantizer, so a cache built by one is valid for the other.
 */
export interface WeightQuantizer {
  /** For reports and logs (`typescript`, `native cpu (avx512, 16 threads)`). */
  readonly name: string;
  /**
   * Elements per ConvRot call (a block of whole rows; at least one row). Default 4 M (~64 MiB of f32
   * working memory in the TypeScript reference); a multi-threaded quantizer wants larger blocks.
   */
  readonly rowBlockElements?: number;
  /**
   * INT8 / INT4 ConvRot of a [N, K] block of rows: the contract of {@link quantizeConvRot}.
   * @param weight [N, K] bf16 / f16 / f32 bytes (a view on the checkpoint mapping)
   * @param shape  [N, K]
   * @param options format, groupSize (a power of 4 dividing K), name (for errors)
   * @returns codes (int8: N·K bytes; int4: N·K/2) and row scales [N]
   * @throws TpError as {@link quantizeConvRot}, naming the tensor
   */
  convRot(
    weight: FloatBytes,
    shape: readonly [number, number],
    options: { readonly format: ConvRotFormat; readonly groupSize: number; readonly name?: string },
  ): ConvRotWeight;
  /**
   * fp8 e4m3fn with one per-tensor scale: the contract of {@link quantizeFp8Scaled}.
   * @param weight `count` bf16 / f16 / f32 values as bytes
   * @throws TpError as {@link quantizeFp8Scaled}, naming the tensor
   */
  fp8Scaled(weight: FloatBytes, count: number, options: { readonly name?: string }): Fp8ScaledWeight;
}

/** The TypeScript reference quantizers of this package, single-threaded (about 30 MB/s of BF16). */
export const referenceQuantizer: WeightQuantizer = {
  name: "typescript",
  convRot: (weight, shape, options) => quantizeConvRot(weight, shape, options),
  fp8Scaled: (weight, count, options) => quantizeFp8Scaled(weight, count, options),
};

/**
 * Quantize one planned layer and write its weight, scale and marker to `writer`, a block of rows
 * (≤ 4 M elements) at a time for ConvRot — rows are independent, so the bytes equal quantizing the
 * whole tensor — and whole for fp8 (one scale for the tensor). The quantizer is `quantizer` (default
 * {@link referenceQuantizer}; e.g. the native one of `@tp/backend-cpu`), whose bytes are the same.
 * @param p      a `quantize` entry of {@link planQuantization} (source dtype BF16/F16/F32, shape [N, K])
 * @param format the plan's format
 * @param bytes  the source tensor's bytes, N·K elements (a view on the mapping)
 * @param writer the output; receives `<layer>.weight`, `.weight_scale`, `.comfy_quant` in that order
 * @param onRows called after each block with the source bytes consumed
 * @param quantizer the implementation (default {@link referenceQuantizer})
 * @throws TpError from the quantizers (E_SHAPE) or the writer (E_ARG, E_IO), naming the tensor
 */
export function writeQuantizedLayer(
  p: PlannedTensor,
  format: CheckpointQuantFormat,
  bytes: Uint8Array,
  writer: SafetensorsWriter,
  onRows: (bytes: number) => void = () => {},
  quantizer: WeightQuantizer = referenceQuantizer,
): void {
  const dtype = FLOAT_DTYPES[p.dtype] as "bf16" | "f16" | "f32";
  // Checked here for every quantizer (the native one too) before a byte is written.
  const bad = firstNonFinite(bytes, p.dtype);
  if (bad !== null) throw nonFiniteInput(bad.index, bad.value, p.name);
  const [n, k] = p.shape as [number, number];
  const layer = p.name.slice(0, -".weight".length);
  const rowBytes = bytes.byteLength / n;
  if (format === "fp8_scaled") {
    const q = quantizer.fp8Scaled({ bytes, dtype }, n * k, { name: p.name });
    writer.write(p.name, q.data);
    writer.write(`${layer}.weight_scale`, f32Bytes(new Float32Array([q.scale])));
    onRows(bytes.byteLength);
  } else {
    const scales = new Float32Array(n);
    const rowsPerBlock = Math.max(1, Math.floor((quantizer.rowBlockElements ?? ROW_BLOCK_ELEMENTS) / k));
    for (let r0 = 0; r0 < n; r0 += rowsPerBlock) {
      const r1 = Math.min(n, r0 + rowsPerBlock);
      const q = quantizer.convRot(
        { bytes: bytes.subarray(r0 * rowBytes, r1 * rowBytes), dtype },
        [r1 - r0, k],
        {
          format,
          groupSize: p.groupSize as number,
          name: p.name,
        },
      );
      writer.write(p.name, q.data);
      scales.set(q.scale, r0);
      onRows((r1 - r0) * rowBytes);
    }
    writer.write(`${layer}.weight_scale`, f32Bytes(scales));
  }
  writer.write(`${layer}.comfy_quant`, new TextEncoder().encode(comfyQuantMarker(format, p.groupSize ?? 0)));
}

function f32Bytes(a: Float32Array): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}

/** Options of {@link quantizeCheckpoint}. */
export interface QuantizeCheckpointOptions extends QuantizePlanOptions {
  /** Progress of the run (default: nothing). */
  readonly progress?: ProgressReporter;
  /** The quantizer (default {@link referenceQuantizer}; the bytes are the same with any). */
  readonly quantizer?: WeightQuantizer;
}

/** What {@link quantizeCheckpoint} did. */
export interface QuantizeReport {
  /** The file written. */
  readonly output: string;
  /** Target format. */
  readonly format: CheckpointQuantFormat;
  /** How the quantized layers were chosen. */
  readonly rule: string;
  /** Layers quantized, by rotation group (`{ "256": 16, "64": 16 }`; fp8: `{ "0": n }`). */
  readonly groups: Readonly<Record<string, number>>;
  /** Number of layers quantized. */
  readonly quantized: number;
  /** The ConvRot layers whose group was chosen from K (no group size given for them), in file order. */
  readonly autoGroups: readonly { readonly layer: string; readonly k: number; readonly groupSize: number }[];
  /** Number of tensors copied unchanged. */
  readonly copied: number;
  /** Bytes of the source read (every tensor once). */
  readonly bytesIn: number;
  /** Size of the output file in bytes. */
  readonly bytesOut: number;
  /** Wall time, seconds. */
  readonly seconds: number;
}

/**
 * Write a quantized copy of a float safetensors checkpoint that ComfyUI loads: the selected layers as
 * ConvRot or fp8-scaled with their `weight_scale` and `comfy_quant` tensors, every other tensor and the
 * metadata unchanged. Written to a temporary name and renamed, so nothing is left half-written.
 * @param input  a `.safetensors` (or `.safetensors.index.json`) path, or an opened source
 * @param output the output `.safetensors` path (must differ from the input)
 * @param options format, group sizes, selection ({@link planQuantization}), progress
 * @throws TpError as {@link planQuantization}; E_ARG when output is the input (or one of its shards),
 *   compared by resolved path and, when the output exists, by device and inode; E_IO / E_FORMAT from
 *   reading and writing (the temporary file is removed)
 */
export function quantizeCheckpoint(
  input: string | TensorSource,
  output: string,
  options: QuantizeCheckpointOptions,
): QuantizeReport {
  const t0 = performance.now();
  const src = typeof input === "string" ? openCheckpoint(input) : input;
  try {
    const into = [src.path, ...src.files].find((f) => sameFile(f, output));
    if (into !== undefined) {
      throw new TpError("E_ARG", `the output ${output} is the input ${into}; it must not overwrite it`, {
        file: output,
      });
    }
    const plan = planQuantization(src, options);
    const specs = plan.tensors.flatMap((t) => t.outputs);
    const metadata = (src as { metadata?: unknown }).metadata;
    const writer = new SafetensorsWriter(output, specs, {
      ...(metadata instanceof Map ? { metadata: metadata as ReadonlyMap<string, string> } : {}),
    });
    const progress = options.progress ?? silentProgress;
    const groups: Record<string, number> = {};
    let bytesIn = 0;
    try {
      const total = src.tensors.reduce((a, t) => a + t.byteLength, 0);
      progress.start(total, `quantizing to ${plan.format}`);
      for (const p of plan.tensors) {
        const bytes = src.data(p.name);
        if (p.action === "copy") {
          const bad = firstNonFinite(bytes, p.dtype);
          if (bad !== null) throw nonFiniteInput(bad.index, bad.value, p.name);
          writer.write(p.name, bytes);
          progress.advance(bytes.byteLength, p.name);
        } else {
          writeQuantizedLayer(
            p,
            plan.format,
            bytes,
            writer,
            (b) => progress.advance(b, p.name),
            options.quantizer,
          );
          const g = String(p.groupSize ?? 0);
          groups[g] = (groups[g] ?? 0) + 1;
        }
        bytesIn += bytes.byteLength;
      }
      writer.commit();
    } catch (e) {
      writer.abort();
      throw e;
    } finally {
      progress.stop();
    }
    const quantized = plan.tensors.filter((t) => t.action === "quantize").length;
    const autoGroups = plan.tensors
      .filter((t) => t.autoGroup === true)
      .map((t) => ({
        layer: t.name.slice(0, -".weight".length),
        k: t.shape[1] as number,
        groupSize: t.groupSize as number,
      }));
    return {
      output,
      format: plan.format,
      rule: plan.rule,
      groups,
      quantized,
      autoGroups,
      copied: plan.tensors.length - quantized,
      bytesIn,
      bytesOut: writer.layout.fileSize,
      seconds: (performance.now() - t0) / 1000,
    };
  } finally {
    if (typeof input === "string") src.close();
  }
}

/**
 * What the automatic group choice did, for people: one line per group smaller than the largest of
 * {@link AUTO_CONVROT_GROUP_SIZES}, e.g. `rotation group 16 for 36 layers whose K (80) is not a
 * multiple of 256 or 64: txtfusion.layerwise_blocks.0.attn.gate, …, and 33 more`. Empty when every
 * chosen group is the largest (or none was chosen).
 * @param r a report of {@link quantizeCheckpoint}
 * @param names layers named per line before "and N more" (default 3)
 */
export function describeAutoGroups(r: Pick<QuantizeReport, "autoGroups">, names = 3): string[] {
  const lines: string[] = [];
  for (const [i, g] of AUTO_CONVROT_GROUP_SIZES.entries()) {
    if (i === 0) continue;
    const layers = r.autoGroups.filter((a) => a.groupSize === g);
    if (layers.length === 0) continue;
    const ks = [...new Set(layers.map((a) => a.k))].join(", ");
    const larger = AUTO_CONVROT_GROUP_SIZES.slice(0, i).join(" or ");
    const shown = layers.slice(0, names).map((a) => a.layer);
    const more = layers.length > names ? `, and ${layers.length - names} more` : "";
    lines.push(
      `rotation group ${g} for ${layers.length} layer${layers.length === 1 ? "" : "s"} whose K (${ks}) is not a multiple of ${larger}: ${shown.join(", ")}${more}`,
    );
  }
  return lines;
}

/** One line for people, largest group first: `wrote out.safetensors: 48 layers int8_convrot (20×g256, 28×g16), …`. */
export function describeQuantizeReport(r: QuantizeReport): string {
  const groups = Object.entries(r.groups)
    .sort(([a], [b]) => Number(b) - Number(a))
    .map(([g, n]) => (g === "0" ? `${n}` : `${n}×g${g}`))
    .join(", ");
  return `wrote ${r.output}: ${r.quantized} layers ${r.format} (${groups}), ${r.copied} tensors copied, ${formatBytes(r.bytesIn)} → ${formatBytes(r.bytesOut)} in ${r.seconds.toFixed(2)} s`;
}
