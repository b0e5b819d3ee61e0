/**
 * Native weight quantizers (tp.h `tp_cpu_quantize_weight`, native/cpu/quantize_w*.c): dense bf16 /
 * f16 / f32 weights [N, K] → INT8 / INT4 ConvRot, fp8 e4m3fn scaled, GGUF Q8_0 / Q4_0 / Q4_K / Q6_K,
 * multi-threaded on a context's pool, bit for bit the bytes and f32 scales of @tp/quant's TypeScript
 * references (`quantizeConvRot`, `quantizeFp8Scaled`, `quantizeGgml`; tested in
 * packages/conformance/src/quantize-kernels.test.ts).
 *
 * - {@link quantizeRows}: one call, checked argument by argument before any pointer crosses bun:ffi.
 * - {@link createNativeQuantizer}: an object with @tp/quant's `WeightQuantizer` shape (`convRot`,
 *   `fp8Scaled`), to pass as the `quantizer` option of `quantizeCheckpoint` / `openQuantCache` (this
 *   package does not import @tp/quant: the shape is structural, declared here again).
 *
 * Errors are the reference's: E_ARG for a group that is not a power of 4 or an fp8 scale that cannot be
 * inverted (NaN in the tensor, or max |w| below ~1e-36); E_SHAPE for K not a multiple of the group,
 * odd K for int4, K not whole GGUF blocks, or an input that does not hold N·K values;
 * E_UNSUPPORTED for another format — each naming the tensor when `name` is given.
 *
 * Sources: packages/quant/src/convrot.ts, fp8.ts, ggml-quantize.ts (the maths and its references:
 * comfy-kitchen, llama.cpp ggml-quants.c); native/include/tp.h.
 */
import { ptr } from "bun:ffi";
import { TpError, type TpErrorCode } from "@tp/tensor";
import {
  CAST_DTYPE_BYTES,
  CAST_DTYPES,
  type CpuIsa,
  type CpuLibrary,
  check,
  isPowerOf4,
  loadCpuLibrary,
  NATIVE_WEIGHT_FORMATS,
  type NativeContext,
} from "./ffi.ts";

/** Target formats of {@link quantizeRows}; `fp8_scaled` is f8_e4m3fn with one per-tensor f32 scale. */
export const NATIVE_QUANTIZE_FORMATS = [
  "int8_convrot",
  "int4_convrot",
  "fp8_scaled",
  "q8_0",
  "q4_0",
  "q4_k",
  "q6_k",
] as const;

/** A target format of {@link NATIVE_QUANTIZE_FORMATS}. */
export type NativeQuantizeFormat = (typeof NATIVE_QUANTIZE_FORMATS)[number];

/** tp.h `tp_wformat` code of each target (fp8_scaled is TP_W_F8_E4M3FN with one scale). */
const FORMAT_CODE: Readonly<Record<NativeQuantizeFormat, number>> = {
  int8_convrot: NATIVE_WEIGHT_FORMATS.int8_convrot,
  int4_convrot: NATIVE_WEIGHT_FORMATS.int4_convrot,
  fp8_scaled: NATIVE_WEIGHT_FORMATS.f8_e4m3fn,
  q8_0: NATIVE_WEIGHT_FORMATS.q8_0,
  q4_0: NATIVE_WEIGHT_FORMATS.q4_0,
  q4_k: NATIVE_WEIGHT_FORMATS.q4_k,
  q6_k: NATIVE_WEIGHT_FORMATS.q6_k,
};

/** GGUF block size (elements) of the block targets. */
const GGML_BLOCK: Readonly<Partial<Record<NativeQuantizeFormat, number>>> = {
  q8_0: 32,
  q4_0: 32,
  q4_k: 256,
  q6_k: 256,
};

/** The source dtypes tp_cpu_quantize_weight reads. */
const SOURCE_DTYPES = ["f32", "f16", "bf16"] as const;

/** Raw little-endian bytes of a float weight (a view on a checkpoint mapping, any alignment). */
export interface QuantizeSourceBytes {
  /** N·K elements of `dtype`. */
  readonly bytes: Uint8Array;
  /** Element type. */
  readonly dtype: "f32" | "f16" | "bf16";
}

/** A source weight: f32 values, or raw f32 / f16 / bf16 bytes (the shape of @tp/quant's `FloatInput`). */
export type QuantizeSource = Float32Array | QuantizeSourceBytes;

/** Options of {@link quantizeRows}. */
export interface QuantizeRowsOptions {
  /** ConvRot rotation group, a power of 4 dividing K (default 256); ignored by the other formats. */
  readonly groupSize?: number;
  /** Tensor name, for errors. */
  readonly name?: string;
}

/** What {@link quantizeRows} returns. */
export interface QuantizedRows {
  /** Target format. */
  readonly format: NativeQuantizeFormat;
  /** Logical shape [N, K]. */
  readonly shape: readonly [number, number];
  /** ConvRot rotation group; 0 for the other formats. */
  readonly groupSize: number;
  /**
   * Stored bytes: int8_convrot N·K, int4_convrot N·K/2 (element 2i in the low nibble), fp8 N·K,
   * GGUF N·K / block · block bytes.
   */
  readonly data: Uint8Array;
  /** ConvRot: N row scales; fp8_scaled: the one tensor scale; GGUF: empty (scales live in the blocks). */
  readonly scale: Float32Array;
}

function fail(code: TpErrorCode, message: string, name: string | undefined): never {
  throw new TpError(code, message, name === undefined ? {} : { tensor: name });
}

/**
 * Quantize a dense weight [N, K] with the native kernels, on the threads of `ctx`, bit for bit as
 * @tp/quant's reference for the format:
 * - int8_convrot / int4_convrot: `quantizeConvRot` — f64 Hadamard rotation per group of `groupSize`
 *   columns, per-row abs-max scale, round half to even (a row holding NaN: scale NaN, codes 0);
 * - fp8_scaled: `quantizeFp8Scaled` — `s = f32(max|w|) / 448`, codes e4m3fn of `w · f32(1/s)`
 *   (all-zero: s = 1);
 * - q8_0, q4_0, q4_k, q6_k: `quantizeGgml` — llama.cpp's reference scale choices, rows of whole blocks.
 * @param ctx     a native context (its threads and ISA level are used; the result does not depend on them)
 * @param format  target format ({@link NATIVE_QUANTIZE_FORMATS})
 * @param input   [N, K] row-major: f32 values, or f32 / f16 / bf16 bytes (read in place, any alignment)
 * @param shape   [N, K]
 * @param options groupSize (ConvRot, default 256), name (for errors); null or undefined: none
 * @returns the stored bytes and scales ({@link QuantizedRows}); new buffers owned by the caller
 * @throws TpError E_UNSUPPORTED for another format; E_ARG for a bad group, a bad dtype or view, or an
 *   fp8 scale that cannot be inverted (NaN in the tensor); E_SHAPE for a shape the format cannot take
 *   or an input that does not hold N·K values; E_STATE for a destroyed context — naming the tensor.
 */
export function quantizeRows(
  ctx: NativeContext,
  format: NativeQuantizeFormat,
  input: QuantizeSource,
  shape: readonly [number, number],
  options?: QuantizeRowsOptions | null,
): QuantizedRows {
  const opts = options ?? {};
  const name = opts.name;
  if (typeof format !== "string" || !Object.hasOwn(FORMAT_CODE, format)) {
    fail(
      "E_UNSUPPORTED",
      `quantizeRows: cannot quantize to ${JSON.stringify(format)}; supported: ${NATIVE_QUANTIZE_FORMATS.join(", ")}`,
      name,
    );
  }
  if (!Array.isArray(shape) || shape.length !== 2) {
    fail("E_SHAPE", `quantizeRows: shape must be [N, K], got ${JSON.stringify(shape)}`, name);
  }
  const [n, k] = shape;
  if (!Number.isSafeInteger(n) || !Number.isSafeInteger(k) || n < 0 || k < 0) {
    fail("E_SHAPE", `quantizeRows: shape [${n}, ${k}] must hold non-negative integers`, name);
  }
  const convRot = format === "int8_convrot" || format === "int4_convrot";
  let group = 0;
  if (convRot) {
    group = opts.groupSize ?? 256;
    if (!isPowerOf4(group)) {
      fail(
        "E_ARG",
        `ConvRot group size ${group} is not a power of 4 (expected 4, 16, 64, 256, 1024, ..., 2^30)`,
        name,
      );
    }
    if (format === "int4_convrot" && k % 2 !== 0)
      fail("E_SHAPE", `int4 ConvRot needs an even K, got K = ${k}`, name);
    if (k === 0 || k % group !== 0) {
      fail(
        "E_SHAPE",
        `ConvRot: K = ${k} input columns is not a multiple of the rotation group size ${group}`,
        name,
      );
    }
  }
  const block = GGML_BLOCK[format];
  if (block !== undefined && k % block !== 0) {
    fail(
      "E_SHAPE",
      `${n * k} values are not whole ${format.toUpperCase()} blocks of ${block} (rows of K = ${k})`,
      name,
    );
  }

  // The source: a Float32Array, or bytes + dtype.
  let bytes: Uint8Array;
  let dtype: (typeof SOURCE_DTYPES)[number];
  if (input instanceof Float32Array) {
    bytes = new Uint8Array(input.buffer, input.byteOffset, input.byteLength);
    dtype = "f32";
  } else if (
    input !== null &&
    typeof input === "object" &&
    input.bytes instanceof Uint8Array &&
    SOURCE_DTYPES.includes(input.dtype)
  ) {
    bytes = input.bytes;
    dtype = input.dtype;
  } else {
    fail(
      "E_ARG",
      "quantizeRows: input must be a Float32Array or { bytes: Uint8Array, dtype: f32 | f16 | bf16 }",
      name,
    );
  }
  const elementBytes = CAST_DTYPE_BYTES[dtype];
  if (bytes.byteLength !== n * k * elementBytes) {
    fail(
      "E_SHAPE",
      `expected ${n * k} values (${n * k * elementBytes} bytes of ${dtype}), got ${bytes.byteLength} bytes`,
      name,
    );
  }

  // int8 ConvRot and fp8: one byte per element; int4 ConvRot: two per byte; GGUF: whole blocks
  const data = new Uint8Array(n * ctx.lib.weightRowBytes(format === "fp8_scaled" ? "f8_e4m3fn" : format, k));
  const scale = new Float32Array(convRot ? n : format === "fp8_scaled" ? 1 : 0);
  const handle = ctx.handle; // E_STATE after destroy
  const status = ctx.lib.raw.tp_cpu_quantize_weight(
    handle,
    FORMAT_CODE[format],
    bytes.byteLength === 0 ? null : ptr(bytes),
    CAST_DTYPES[dtype],
    bytes.byteLength,
    n,
    k,
    group,
    data.byteLength === 0 ? null : ptr(data),
    data.byteLength,
    scale.length === 0 ? null : ptr(scale),
    scale.length,
  );
  check(ctx, status, name === undefined ? undefined : { tensor: name });
  if (format === "fp8_scaled" && n * k === 0) scale[0] = 1;
  return { format, shape: [n, k], groupSize: group, data, scale };
}

/**
 * The weight quantizer of @tp/quant's checkpoint and cache writers (`WeightQuantizer` there; the same
 * shape, declared here so that this package need not import @tp/quant), running on native threads.
 */
export interface NativeWeightQuantizer {
  /** For reports: `native cpu (avx512, 16 threads)`. */
  readonly name: string;
  /** Elements per ConvRot call: large blocks keep every thread busy (16 M elements). */
  readonly rowBlockElements: number;
  /**
   * INT8 / INT4 ConvRot, as @tp/quant `quantizeConvRot` (bit for bit).
   * @param weight [N, K] bf16 / f16 / f32 bytes (or f32 values)
   * @param shape  [N, K]
   * @param options format, groupSize (default 256), name
   * @returns { format, shape, groupSize, data, scale [N] }
   * @throws TpError as {@link quantizeRows}
   */
  convRot(
    weight: QuantizeSource,
    shape: readonly [number, number],
    options: {
      readonly format?: "int8_convrot" | "int4_convrot";
      readonly groupSize?: number;
      readonly name?: string;
    },
  ): {
    format: "int8_convrot" | "int4_convrot";
    shape: readonly [number, number];
    groupSize: number;
    data: Uint8Array;
    scale: Float32Array;
  };
  /**
   * fp8 e4m3fn with one per-tensor scale, as @tp/quant `quantizeFp8Scaled` (bit for bit).
   * @param weight `count` bf16 / f16 / f32 values
   * @param count  number of elements
   * @param options name; dtype must be f8_e4m3fn (the only one here)
   * @throws TpError as {@link quantizeRows}; E_UNSUPPORTED for dtype f8_e5m2
   */
  fp8Scaled(
    weight: QuantizeSource,
    count: number,
    options?: { readonly dtype?: "f8_e4m3fn" | "f8_e5m2"; readonly name?: string },
  ): { data: Uint8Array; scale: number };
  /** The context the quantizer runs on (its threads and ISA level). */
  readonly context: NativeContext;
  /** Stop its threads; later calls throw E_STATE. */
  dispose(): void;
}

/** Options of {@link createNativeQuantizer}. */
export interface NativeQuantizerOptions {
  /** Threads, the caller's included: 0 (default) for every CPU. */
  readonly threads?: number;
  /** Highest ISA level (tests, comparisons); default the best this CPU has. */
  readonly maxIsa?: CpuIsa;
  /** The library (default {@link loadCpuLibrary}()). */
  readonly library?: CpuLibrary;
}

/**
 * A native {@link NativeWeightQuantizer} with its own context (thread pool). Pass it as the `quantizer`
 * option of @tp/quant `quantizeCheckpoint` / `openQuantCache` / `buildQuantCache`; dispose of it after.
 * @throws TpError E_IO when the library is not built; E_ARG for bad threads / maxIsa
 */
export function createNativeQuantizer(options?: NativeQuantizerOptions | null): NativeWeightQuantizer {
  const opts = options ?? {};
  const lib = opts.library ?? loadCpuLibrary();
  const ctx = lib.createContext(opts.threads ?? 0, opts.maxIsa ?? "avx512");
  return {
    name: `native cpu (${ctx.isa}, ${ctx.threads} thread${ctx.threads === 1 ? "" : "s"})`,
    rowBlockElements: 1 << 24,
    context: ctx,
    convRot(weight, shape, options) {
      const opts = options ?? {};
      const format = opts.format ?? "int8_convrot";
      const q = quantizeRows(ctx, format, weight, shape, {
        ...(opts.groupSize === undefined ? {} : { groupSize: opts.groupSize }),
        ...(opts.name === undefined ? {} : { name: opts.name }),
      });
      return { format, shape: q.shape, groupSize: q.groupSize, data: q.data, scale: q.scale };
    },
    fp8Scaled(weight, count, options) {
      const opts = options ?? {};
      if ((opts.dtype ?? "f8_e4m3fn") !== "f8_e4m3fn") {
        fail("E_UNSUPPORTED", `native fp8 quantization writes f8_e4m3fn only, got ${opts.dtype}`, opts.name);
      }
      const q = quantizeRows(
        ctx,
        "fp8_scaled",
        weight,
        [1, count],
        opts.name === undefined ? {} : { name: opts.name },
      );
      return { data: q.data, scale: q.scale[0] as number };
    },
    dispose() {
      if (!ctx.destroyed) ctx.destroy();
    },
  };
}
