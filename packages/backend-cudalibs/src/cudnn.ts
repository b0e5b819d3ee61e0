/**
 * cuDNN 9 (`libcudnn.so.9`) through bun:ffi: the backend (graph) API — descriptors created, their
 * attributes set, finalized, engine configurations from the heuristics, execution plans and variant
 * packs — and the two graphs the cuda backend runs on it, each built once per shape and cached:
 *
 * - fused scaled-dot-product attention (f16 / bf16, grouped-query heads): S = Q·Kᵀ (matmul), S·scale
 *   (pointwise MUL by a by-value scalar), an optional causal mask from GEN_INDEX (row, column),
 *   ADD (row + qOffset, a by-value scalar), CMP_GE and BINARY_SELECT with the lowest f32, the softmax as
 *   REDUCTION MAX, SUB, EXP, REDUCTION ADD and DIV, then O = P·V (matmul). This is the graph of the
 *   "fused flash attention fprop" pattern of the cuDNN developer guide (Graph API → Specialized Runtime
 *   Fusion Engines); cuDNN 9 has no single SDPA operation descriptor in its backend header
 *   (cudnn_graph.h of 9.6 lists none), so the pattern is the way in.
 * - conv2d forward, NCHW, f32 or f16 data with f32 compute (CONVOLUTION_FORWARD, cross-correlation).
 *
 * Each plan takes the heuristics' engine configurations in order (CUDNN_HEUR_MODE_A) and keeps the
 * first whose execution plan finalizes and whose numerical notes keep the op's numerics (no TF32 for
 * f32 data, no down-converted inputs, no reduced-precision reduction). A shape with no such
 * configuration is cached as null: the caller keeps its PTX kernel. Every failing call is a TpError
 * naming the call and the cudnnStatus_t name (./nvidia-h.ts CUDNN_STATUS), with cuDNN's text.
 *
 * Sources: cuDNN 9 API reference (cudnn_graph.h: cudnnBackendCreateDescriptor, SetAttribute,
 * GetAttribute, Finalize, Execute, the descriptor types and their attributes), the cuDNN developer
 * guide (Graph API: heuristics, engine configs, execution plans, variant packs; the attention
 * pattern). Enum values: ./nvidia-h.ts.
 */
import { CString, type FFIFunction, type Pointer, ptr } from "bun:ffi";
import { TpError, type TpErrorCode } from "@tp/tensor";
import { loadLibrary } from "./libraries.ts";
import {
  CUDNN_ATTR,
  CUDNN_BACKEND,
  CUDNN_CONV_MODE,
  CUDNN_DATA_TYPE,
  CUDNN_HEUR_MODE,
  CUDNN_NUMERICAL_NOTE,
  CUDNN_POINTWISE,
  CUDNN_REDUCE,
  CUDNN_STATUS,
  CUDNN_TYPE,
} from "./nvidia-h.ts";

export const CUDNN_SONAMES = ["libcudnn.so.9"] as const;

/** The bun:ffi declarations (descriptors and handles as `ptr`, element counts as `i64`). */
export const CUDNN_SIGNATURES = {
  cudnnGetVersion: { args: [], returns: "u64" },
  cudnnGetErrorString: { args: ["i32"], returns: "ptr" },
  cudnnCreate: { args: ["ptr"], returns: "i32" },
  cudnnDestroy: { args: ["ptr"], returns: "i32" },
  cudnnSetStream: { args: ["ptr", "ptr"], returns: "i32" },
  cudnnBackendCreateDescriptor: { args: ["i32", "ptr"], returns: "i32" },
  cudnnBackendDestroyDescriptor: { args: ["ptr"], returns: "i32" },
  cudnnBackendSetAttribute: { args: ["ptr", "i32", "i32", "i64", "ptr"], returns: "i32" },
  cudnnBackendGetAttribute: { args: ["ptr", "i32", "i32", "i64", "ptr", "ptr"], returns: "i32" },
  cudnnBackendFinalize: { args: ["ptr"], returns: "i32" },
  cudnnBackendExecute: { args: ["ptr", "ptr", "ptr"], returns: "i32" },
} as const satisfies Record<string, FFIFunction>;

const HOW_TO_GET =
  "cuDNN 9 comes with PyTorch's nvidia-cudnn-cu13 wheel (site-packages/nvidia/cudnn/lib) or NVIDIA's cudnn9 packages";

/** The functions {@link Cudnn} calls (the loaded library, or a stand-in in tests). */
// biome-ignore lint/suspicious/noExplicitAny: bun:ffi functions are typed by their declarations at run time
export type CudnnSymbols = { [K in keyof typeof CUDNN_SIGNATURES]: (...args: any[]) => any };

const STATUS_NAMES = new Map<number, string>(Object.entries(CUDNN_STATUS).map(([k, v]) => [v, k]));

/** The name of a cudnnStatus_t (`CUDNN_STATUS_BAD_PARAM`), or `cudnnStatus_t <n>` for an unknown one. */
export function cudnnStatusName(status: number): string {
  return STATUS_NAMES.get(status) ?? `cudnnStatus_t ${status}`;
}

/** The TpError code of a cudnnStatus_t, by its category (status / 1000 in cuDNN 9). */
export function cudnnStatusCode(status: number): TpErrorCode {
  if (
    status === CUDNN_STATUS.CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
    status === CUDNN_STATUS.CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED
  )
    return "E_OOM";
  switch (Math.floor(status / 1000)) {
    case 2:
      return "E_ARG";
    case 1:
    case 3:
      return "E_UNSUPPORTED";
    default:
      return "E_INTERNAL";
  }
}

/** `<call> failed: CUDNN_STATUS_… (<code>)[: text][; detail]`. */
export function cudnnError(call: string, status: number, text = "", detail = ""): TpError {
  return new TpError(
    cudnnStatusCode(status),
    `${call} failed: ${cudnnStatusName(status)} (${status})${text === "" ? "" : `: ${text}`}${detail === "" ? "" : `; ${detail}`}`,
  );
}

const T = CUDNN_TYPE;
const A = CUDNN_ATTR;
const B = CUDNN_BACKEND;
const PW = CUDNN_POINTWISE;
const DT = CUDNN_DATA_TYPE;

/** Bytes of one element of each attribute type used here (C enums are int, BOOLEAN a C bool). */
const ELEMENT_BYTES: Record<number, number> = {
  [T.CUDNN_TYPE_HANDLE]: 8,
  [T.CUDNN_TYPE_DATA_TYPE]: 4,
  [T.CUDNN_TYPE_BOOLEAN]: 1,
  [T.CUDNN_TYPE_INT64]: 8,
  [T.CUDNN_TYPE_FLOAT]: 4,
  [T.CUDNN_TYPE_DOUBLE]: 8,
  [T.CUDNN_TYPE_VOID_PTR]: 8,
  [T.CUDNN_TYPE_CONVOLUTION_MODE]: 4,
  [T.CUDNN_TYPE_HEUR_MODE]: 4,
  [T.CUDNN_TYPE_NUMERICAL_NOTE]: 4,
  [T.CUDNN_TYPE_POINTWISE_MODE]: 4,
  [T.CUDNN_TYPE_BACKEND_DESCRIPTOR]: 8,
  [T.CUDNN_TYPE_REDUCTION_OPERATOR_TYPE]: 4,
};

/** The element array of `values` for attribute type `type`, laid out as cuDNN reads it. */
export function attributeArray(type: number, values: readonly (number | bigint)[]): Uint8Array {
  const size = ELEMENT_BYTES[type];
  if (size === undefined) throw new TpError("E_INTERNAL", `cuDNN attribute type ${type} is not used here`);
  const out = new Uint8Array(size * values.length);
  const v = new DataView(out.buffer);
  values.forEach((x, i) => {
    switch (type) {
      case T.CUDNN_TYPE_BOOLEAN:
        v.setUint8(i, x ? 1 : 0);
        break;
      case T.CUDNN_TYPE_FLOAT:
        v.setFloat32(4 * i, Number(x), true);
        break;
      case T.CUDNN_TYPE_DOUBLE:
        v.setFloat64(8 * i, Number(x), true);
        break;
      case T.CUDNN_TYPE_INT64:
        v.setBigInt64(8 * i, BigInt(x), true);
        break;
      case T.CUDNN_TYPE_HANDLE:
      case T.CUDNN_TYPE_VOID_PTR:
      case T.CUDNN_TYPE_BACKEND_DESCRIPTOR:
        v.setBigUint64(8 * i, BigInt(x), true);
        break;
      default:
        v.setInt32(4 * i, Number(x), true);
    }
  });
  return out;
}

/** Element types of the graphs: cuDNN's data type of f32 / f16 / bf16. */
export type CudnnFloat = "f32" | "f16" | "bf16";
export function cudnnDataType(dtype: CudnnFloat): number {
  return dtype === "f32"
    ? DT.CUDNN_DATA_FLOAT
    : dtype === "f16"
      ? DT.CUDNN_DATA_HALF
      : DT.CUDNN_DATA_BFLOAT16;
}

/** One SDPA shape: q [batch, heads, sq, headDim], k / v [batch, kvHeads, skv, headDim], all contiguous. */
export interface SdpaShape {
  readonly dtype: "f16" | "bf16";
  readonly batch: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly sq: number;
  readonly skv: number;
  readonly headDim: number;
  /** Query i (at position qOffset + i, a by-value scalar at execution) sees key j only when j ≤ qOffset + i. */
  readonly causal: boolean;
}

/** One conv2d shape: x [n, cIn, h, w], w [cOut, cIn, kh, kw], y [n, cOut, hOut, wOut], NCHW packed. */
export interface ConvShape {
  readonly dtype: "f32" | "f16";
  readonly n: number;
  readonly cIn: number;
  readonly h: number;
  readonly w: number;
  readonly cOut: number;
  readonly kh: number;
  readonly kw: number;
  readonly stride: readonly [number, number];
  readonly padding: readonly [number, number];
}

export function sdpaKey(s: SdpaShape): string {
  return `sdpa:${s.dtype}:${s.batch}x${s.heads}/${s.kvHeads}x${s.sq}x${s.skv}x${s.headDim}:${s.causal ? "causal" : "full"}`;
}
export function convKey(s: ConvShape): string {
  return `conv:${s.dtype}:${s.n}x${s.cIn}x${s.h}x${s.w}:${s.cOut}x${s.kh}x${s.kw}:s${s.stride.join(",")}:p${s.padding.join(",")}`;
}

/** conv2d output size along one axis: ⌊(in + 2·pad − k) / stride⌋ + 1 (cross-correlation, dilation 1). */
export function convOut(size: number, k: number, stride: number, pad: number): number {
  return Math.floor((size + 2 * pad - k) / stride) + 1;
}

/** Unique ids of the graphs' tensors (the variant pack's keys). */
export const SDPA_UID = { q: 1, k: 2, v: 3, o: 4, scale: 5, qOffset: 6, maskValue: 7 } as const;
export const CONV_UID = { x: 1, w: 2, y: 3 } as const;

/** A finalized execution plan and what it keeps alive. */
export interface CudnnPlan {
  readonly key: string;
  readonly plan: number;
  readonly workspaceBytes: number;
  /** CUDNN_ATTR_ENGINE_GLOBAL_INDEX of the engine chosen. */
  readonly engine: number;
  /** Every descriptor the plan was built from (destroyed with it). */
  readonly owned: readonly number[];
}

/** Numerical notes an engine must not carry for `dtype` data (see the module comment). */
export function forbiddenNotes(dtype: CudnnFloat): readonly number[] {
  const N = CUDNN_NUMERICAL_NOTE;
  const always = [
    N.CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS,
    N.CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION,
  ];
  // f32 data on tensor cores is TF32: a 10-bit mantissa where the PTX kernel keeps 23
  return dtype === "f32" ? [N.CUDNN_NUMERICAL_NOTE_TENSOR_CORE, ...always] : always;
}

/** Most engine configurations read from the heuristics per plan (the first usable one is kept). */
const MAX_CONFIGS = 64;
/** Most numerical notes read per engine. */
const MAX_NOTES = 16;

const contiguousStrides = (dims: readonly number[]): number[] => {
  const s = new Array<number>(dims.length).fill(1);
  for (let i = dims.length - 2; i >= 0; i--) s[i] = (s[i + 1] as number) * (dims[i + 1] as number);
  return s;
};

interface TensorSpec {
  readonly uid: number;
  readonly dtype: number;
  readonly dims: readonly number[];
  readonly strides?: readonly number[];
  readonly virtual?: boolean;
  readonly byValue?: boolean;
}

/** A cuDNN handle bound to a stream, with its plan cache. Not thread-safe (one per backend). */
export class Cudnn {
  readonly path: string;
  /** cudnnGetVersion(): e.g. 91000 for 9.10.0. */
  readonly version: number;
  readonly handle: number;
  readonly #s: CudnnSymbols;
  readonly #plans = new Map<string, CudnnPlan | null>();
  /** Why a shape cached as null has no plan (the last refusal), by key. */
  readonly whyNoPlan = new Map<string, string>();
  /** How many times the heuristics were queried (once per new shape; tests read it). */
  heuristicQueries = 0;
  #closed = false;

  /** @throws TpError naming cudnnCreate / cudnnSetStream and the status */
  constructor(path: string, symbols: CudnnSymbols, stream: number) {
    this.path = path;
    this.#s = symbols;
    this.version = Number(symbols.cudnnGetVersion());
    const h = new BigUint64Array(1);
    this.#check("cudnnCreate", symbols.cudnnCreate(h));
    this.handle = Number(h[0]);
    this.#check("cudnnSetStream", symbols.cudnnSetStream(this.handle, stream));
  }

  #check(call: string, status: number, detail = ""): void {
    if (status === 0) return;
    throw cudnnError(call, status, this.#text(status), detail);
  }

  #text(status: number): string {
    const p = this.#s.cudnnGetErrorString(status);
    return typeof p === "number" && p !== 0 ? String(new CString(p as Pointer)) : "";
  }

  /** "9.10.0" from the version number (major·10000 + minor·100 + patch in cuDNN 9). */
  versionString(): string {
    const v = this.version;
    return `${Math.floor(v / 10000)}.${Math.floor((v % 10000) / 100)}.${v % 100}`;
  }

  // ------------------------------------------------------------------------------ descriptor calls

  /** cudnnBackendCreateDescriptor; the descriptor is pushed on `owned`. */
  create(type: number, owned: number[], detail = ""): number {
    const out = new BigUint64Array(1);
    this.#check("cudnnBackendCreateDescriptor", this.#s.cudnnBackendCreateDescriptor(type, out), detail);
    const d = Number(out[0]);
    owned.push(d);
    return d;
  }

  /** cudnnBackendSetAttribute with `values` laid out for `type`. @throws TpError naming the call */
  set(desc: number, attr: number, type: number, values: readonly (number | bigint)[], detail = ""): void {
    if (values.length === 0)
      throw new TpError("E_INTERNAL", `cuDNN attribute ${attr}: no elements (${detail})`);
    const buf = attributeArray(type, values);
    this.#check(
      "cudnnBackendSetAttribute",
      this.#s.cudnnBackendSetAttribute(desc, attr, type, values.length, buf),
      `attribute ${attr}${detail === "" ? "" : `, ${detail}`}`,
    );
  }

  /** cudnnBackendFinalize. */
  finalize(desc: number, detail = ""): void {
    this.#check("cudnnBackendFinalize", this.#s.cudnnBackendFinalize(desc), detail);
  }

  /** cudnnBackendGetAttribute of INT64 elements (at most `max`). */
  getInt64(desc: number, attr: number, max: number, detail = ""): bigint[] {
    const buf = new BigInt64Array(max);
    const count = new BigInt64Array(1);
    this.#check(
      "cudnnBackendGetAttribute",
      this.#s.cudnnBackendGetAttribute(desc, attr, T.CUDNN_TYPE_INT64, max, count, buf),
      `attribute ${attr}${detail === "" ? "" : `, ${detail}`}`,
    );
    return [...buf.subarray(0, Math.min(max, Number(count[0])))];
  }

  destroyDescriptor(desc: number): void {
    this.#s.cudnnBackendDestroyDescriptor(desc);
  }

  #tensor(owned: number[], t: TensorSpec, key: string): number {
    const d = this.create(B.CUDNN_BACKEND_TENSOR_DESCRIPTOR, owned, key);
    const what = `${key}, tensor ${t.uid}`;
    this.set(d, A.CUDNN_ATTR_TENSOR_DATA_TYPE, T.CUDNN_TYPE_DATA_TYPE, [t.dtype], what);
    this.set(d, A.CUDNN_ATTR_TENSOR_DIMENSIONS, T.CUDNN_TYPE_INT64, t.dims, what);
    this.set(
      d,
      A.CUDNN_ATTR_TENSOR_STRIDES,
      T.CUDNN_TYPE_INT64,
      t.strides ?? contiguousStrides(t.dims),
      what,
    );
    this.set(d, A.CUDNN_ATTR_TENSOR_UNIQUE_ID, T.CUDNN_TYPE_INT64, [t.uid], what);
    this.set(d, A.CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, T.CUDNN_TYPE_INT64, [16], what);
    if (t.virtual) this.set(d, A.CUDNN_ATTR_TENSOR_IS_VIRTUAL, T.CUDNN_TYPE_BOOLEAN, [1], what);
    if (t.byValue) this.set(d, A.CUDNN_ATTR_TENSOR_IS_BY_VALUE, T.CUDNN_TYPE_BOOLEAN, [1], what);
    this.finalize(d, what);
    return d;
  }

  /**
   * A pointwise operation y = mode(x[, b][, t]) with `math` precision (default f32; `axis` for
   * GEN_INDEX). The causal mask takes the precisions cudnn-frontend gives it (its sliding-window /
   * causal score modifier): GEN_INDEX in f32 math into int32 tensors, the row offset added in int32,
   * CMP_GE in boolean math into a boolean tensor.
   */
  #pointwise(
    owned: number[],
    mode: number,
    io: { x: number; b?: number; t?: number; y: number },
    key: string,
    options: { axis?: number; math?: number } = {},
  ): number {
    const what = `${key}, pointwise ${mode}`;
    const pw = this.create(B.CUDNN_BACKEND_POINTWISE_DESCRIPTOR, owned, what);
    const math = options.math ?? DT.CUDNN_DATA_FLOAT;
    const axis = options.axis;
    this.set(pw, A.CUDNN_ATTR_POINTWISE_MODE, T.CUDNN_TYPE_POINTWISE_MODE, [mode], what);
    this.set(pw, A.CUDNN_ATTR_POINTWISE_MATH_PREC, T.CUDNN_TYPE_DATA_TYPE, [math], what);
    if (axis !== undefined) this.set(pw, A.CUDNN_ATTR_POINTWISE_AXIS, T.CUDNN_TYPE_INT64, [axis], what);
    this.finalize(pw, what);
    const op = this.create(B.CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, owned, what);
    const D = T.CUDNN_TYPE_BACKEND_DESCRIPTOR;
    this.set(op, A.CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, D, [pw], what);
    this.set(op, A.CUDNN_ATTR_OPERATION_POINTWISE_XDESC, D, [io.x], what);
    if (io.b !== undefined) this.set(op, A.CUDNN_ATTR_OPERATION_POINTWISE_BDESC, D, [io.b], what);
    if (io.t !== undefined) this.set(op, A.CUDNN_ATTR_OPERATION_POINTWISE_TDESC, D, [io.t], what);
    this.set(op, A.CUDNN_ATTR_OPERATION_POINTWISE_YDESC, D, [io.y], what);
    this.finalize(op, what);
    return op;
  }

  #matmul(owned: number[], a: number, b: number, c: number, key: string): number {
    const what = `${key}, matmul`;
    const mm = this.create(B.CUDNN_BACKEND_MATMUL_DESCRIPTOR, owned, what);
    this.set(mm, A.CUDNN_ATTR_MATMUL_COMP_TYPE, T.CUDNN_TYPE_DATA_TYPE, [DT.CUDNN_DATA_FLOAT], what);
    this.finalize(mm, what);
    const op = this.create(B.CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, owned, what);
    const D = T.CUDNN_TYPE_BACKEND_DESCRIPTOR;
    this.set(op, A.CUDNN_ATTR_OPERATION_MATMUL_ADESC, D, [a], what);
    this.set(op, A.CUDNN_ATTR_OPERATION_MATMUL_BDESC, D, [b], what);
    this.set(op, A.CUDNN_ATTR_OPERATION_MATMUL_CDESC, D, [c], what);
    this.set(op, A.CUDNN_ATTR_OPERATION_MATMUL_DESC, D, [mm], what);
    this.finalize(op, what);
    return op;
  }

  #reduction(owned: number[], operator: number, x: number, y: number, key: string): number {
    const what = `${key}, reduction ${operator}`;
    const r = this.create(B.CUDNN_BACKEND_REDUCTION_DESCRIPTOR, owned, what);
    this.set(r, A.CUDNN_ATTR_REDUCTION_OPERATOR, T.CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, [operator], what);
    this.set(r, A.CUDNN_ATTR_REDUCTION_COMP_TYPE, T.CUDNN_TYPE_DATA_TYPE, [DT.CUDNN_DATA_FLOAT], what);
    this.finalize(r, what);
    const op = this.create(B.CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, owned, what);
    const D = T.CUDNN_TYPE_BACKEND_DESCRIPTOR;
    this.set(op, A.CUDNN_ATTR_OPERATION_REDUCTION_XDESC, D, [x], what);
    this.set(op, A.CUDNN_ATTR_OPERATION_REDUCTION_YDESC, D, [y], what);
    this.set(op, A.CUDNN_ATTR_OPERATION_REDUCTION_DESC, D, [r], what);
    this.finalize(op, what);
    return op;
  }

  // ------------------------------------------------------------------------------------- plans

  #cached(key: string, build: (owned: number[]) => number[], dtype: CudnnFloat): CudnnPlan | null {
    if (this.#closed) throw new TpError("E_STATE", "cuDNN handle was destroyed");
    if (this.#plans.has(key)) return this.#plans.get(key) as CudnnPlan | null;
    const owned: number[] = [];
    let plan: CudnnPlan | null = null;
    try {
      plan = this.#finish(key, owned, build(owned), dtype);
    } catch (e) {
      // a NOT_SUPPORTED status while describing the graph (a type or layout this cuDNN lacks): the
      // caller keeps its kernel; any other status is a bug here and is thrown
      if (!(e instanceof TpError) || e.code !== "E_UNSUPPORTED") throw e;
      this.whyNoPlan.set(key, e.message);
    } finally {
      if (plan === null) for (const d of owned.reverse()) this.destroyDescriptor(d);
    }
    this.#plans.set(key, plan);
    return plan;
  }

  /** Operation graph → heuristics (mode A) → the first engine config that finalizes and keeps the numerics. */
  #finish(key: string, owned: number[], ops: number[], dtype: CudnnFloat): CudnnPlan | null {
    const D = T.CUDNN_TYPE_BACKEND_DESCRIPTOR;
    const graph = this.create(B.CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, owned, key);
    this.set(graph, A.CUDNN_ATTR_OPERATIONGRAPH_HANDLE, T.CUDNN_TYPE_HANDLE, [this.handle], key);
    this.set(graph, A.CUDNN_ATTR_OPERATIONGRAPH_OPS, D, ops, key);
    const gs = this.#s.cudnnBackendFinalize(graph);
    if (gs !== 0) {
      // the library refuses this graph (its pattern, a shape, a type): the caller keeps its kernel
      if (cudnnStatusCode(gs) === "E_UNSUPPORTED") {
        this.whyNoPlan.set(key, `operation graph: ${cudnnStatusName(gs)}`);
        return null;
      }
      this.#check("cudnnBackendFinalize", gs, `${key}, operation graph`);
    }
    const heur = this.create(B.CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, owned, key);
    this.set(heur, A.CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, D, [graph], key);
    this.set(
      heur,
      A.CUDNN_ATTR_ENGINEHEUR_MODE,
      T.CUDNN_TYPE_HEUR_MODE,
      [CUDNN_HEUR_MODE.CUDNN_HEUR_MODE_A],
      key,
    );
    this.heuristicQueries++;
    this.finalize(heur, `${key}, heuristics`);
    const count = new BigInt64Array(1);
    this.#check(
      "cudnnBackendGetAttribute",
      this.#s.cudnnBackendGetAttribute(heur, A.CUDNN_ATTR_ENGINEHEUR_RESULTS, D, 0, count, null),
      `${key}, heuristic result count`,
    );
    const n = Math.min(MAX_CONFIGS, Number(count[0]));
    if (n === 0) {
      this.whyNoPlan.set(key, "the heuristics returned no engine configuration");
      return null;
    }
    const cfgs = Array.from({ length: n }, () =>
      this.create(B.CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, owned, key),
    );
    this.#check(
      "cudnnBackendGetAttribute",
      this.#s.cudnnBackendGetAttribute(
        heur,
        A.CUDNN_ATTR_ENGINEHEUR_RESULTS,
        D,
        n,
        count,
        attributeArray(D, cfgs),
      ),
      `${key}, heuristic results`,
    );
    const got = Math.min(n, Number(count[0]));
    const forbidden = forbiddenNotes(dtype);
    const refusals: string[] = [];
    for (const cfg of cfgs.slice(0, got)) {
      const engine = this.create(B.CUDNN_BACKEND_ENGINE_DESCRIPTOR, owned, key);
      this.#check(
        "cudnnBackendGetAttribute",
        this.#s.cudnnBackendGetAttribute(
          cfg,
          A.CUDNN_ATTR_ENGINECFG_ENGINE,
          D,
          1,
          count,
          attributeArray(D, [engine]),
        ),
        `${key}, engine of a configuration`,
      );
      const index = Number(this.getInt64(engine, A.CUDNN_ATTR_ENGINE_GLOBAL_INDEX, 1, key)[0] ?? -1);
      const notes = new Int32Array(MAX_NOTES);
      this.#check(
        "cudnnBackendGetAttribute",
        this.#s.cudnnBackendGetAttribute(
          engine,
          A.CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
          T.CUDNN_TYPE_NUMERICAL_NOTE,
          MAX_NOTES,
          count,
          notes,
        ),
        `${key}, numerical notes of engine ${index}`,
      );
      const bad = [...notes.subarray(0, Math.min(MAX_NOTES, Number(count[0])))].filter((x) =>
        forbidden.includes(x),
      );
      if (bad.length > 0) {
        refusals.push(`engine ${index}: numerical note ${bad.join(", ")}`);
        continue;
      }
      const plan = this.create(B.CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, owned, key);
      this.set(plan, A.CUDNN_ATTR_EXECUTION_PLAN_HANDLE, T.CUDNN_TYPE_HANDLE, [this.handle], key);
      this.set(plan, A.CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, D, [cfg], key);
      const fs = this.#s.cudnnBackendFinalize(plan);
      if (fs !== 0) {
        refusals.push(`engine ${index}: ${cudnnStatusName(fs)}`);
        continue;
      }
      const ws = Number(this.getInt64(plan, A.CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, 1, key)[0] ?? 0n);
      if (!Number.isSafeInteger(ws) || ws < 0)
        throw new TpError("E_INTERNAL", `cuDNN plan ${key}: workspace size ${ws} from engine ${index}`);
      return { key, plan, workspaceBytes: ws, engine: index, owned: [...owned] };
    }
    this.whyNoPlan.set(key, `no usable engine configuration (${refusals.join("; ") || "none"})`);
    return null;
  }

  /**
   * The plan of one attention shape (see the module comment), built on first use and cached; null
   * (cached too) when cuDNN has no engine for it.
   * @throws TpError E_ARG for a shape that is not positive integers or whose heads are not a multiple
   *   of kvHeads; the failing call's error otherwise
   */
  sdpaPlan(s: SdpaShape): CudnnPlan | null {
    const key = sdpaKey(s);
    positive(key, {
      batch: s.batch,
      heads: s.heads,
      kvHeads: s.kvHeads,
      sq: s.sq,
      skv: s.skv,
      headDim: s.headDim,
    });
    if (s.heads % s.kvHeads !== 0)
      throw new TpError(
        "E_ARG",
        `cuDNN attention ${key}: ${s.heads} heads are not a multiple of ${s.kvHeads}`,
      );
    return this.#cached(key, (owned) => this.#sdpaGraph(owned, s, key), s.dtype);
  }

  #sdpaGraph(owned: number[], s: SdpaShape, key: string): number[] {
    const io = cudnnDataType(s.dtype);
    const F = DT.CUDNN_DATA_FLOAT;
    const { batch: b, heads: h, kvHeads: hk, sq, skv, headDim: d } = s;
    const t = (spec: TensorSpec) => this.#tensor(owned, spec, key);
    let uid = 100;
    const virt = (dtype: number, dims: readonly number[]) => t({ uid: uid++, dtype, dims, virtual: true });
    const scalar = (u: number, dtype: number) => t({ uid: u, dtype, dims: [1, 1, 1, 1], byValue: true });
    const q = t({ uid: SDPA_UID.q, dtype: io, dims: [b, h, sq, d] });
    // Kᵀ [b, hk, d, skv] as a strided view of the contiguous k [b, hk, skv, d]
    const kt = t({
      uid: SDPA_UID.k,
      dtype: io,
      dims: [b, hk, d, skv],
      strides: [hk * skv * d, skv * d, 1, d],
    });
    const v = t({ uid: SDPA_UID.v, dtype: io, dims: [b, hk, skv, d] });
    const o = t({ uid: SDPA_UID.o, dtype: io, dims: [b, h, sq, d] });
    const scores = [b, h, sq, skv];
    const rows = [b, h, sq, 1];
    const ops: number[] = [];
    const s0 = virt(F, scores);
    ops.push(this.#matmul(owned, q, kt, s0, key));
    const s1 = virt(F, scores);
    ops.push(
      this.#pointwise(owned, PW.CUDNN_POINTWISE_MUL, { x: s0, b: scalar(SDPA_UID.scale, F), y: s1 }, key),
    );
    let masked = s1;
    if (s.causal) {
      const I = DT.CUDNN_DATA_INT32;
      const row = virt(I, scores);
      ops.push(this.#pointwise(owned, PW.CUDNN_POINTWISE_GEN_INDEX, { x: s1, y: row }, key, { axis: 2 }));
      const col = virt(I, scores);
      ops.push(this.#pointwise(owned, PW.CUDNN_POINTWISE_GEN_INDEX, { x: s1, y: col }, key, { axis: 3 }));
      const pos = virt(I, scores);
      ops.push(
        this.#pointwise(
          owned,
          PW.CUDNN_POINTWISE_ADD,
          { x: row, b: scalar(SDPA_UID.qOffset, I), y: pos },
          key,
          { math: I },
        ),
      );
      const visible = virt(DT.CUDNN_DATA_BOOLEAN, scores);
      ops.push(
        this.#pointwise(owned, PW.CUDNN_POINTWISE_CMP_GE, { x: pos, b: col, y: visible }, key, {
          math: DT.CUDNN_DATA_BOOLEAN,
        }),
      );
      masked = virt(F, scores);
      ops.push(
        this.#pointwise(
          owned,
          PW.CUDNN_POINTWISE_BINARY_SELECT,
          { x: s1, b: scalar(SDPA_UID.maskValue, F), t: visible, y: masked },
          key,
        ),
      );
    }
    const max = virt(F, rows);
    ops.push(this.#reduction(owned, CUDNN_REDUCE.CUDNN_REDUCE_TENSOR_MAX, masked, max, key));
    const shifted = virt(F, scores);
    ops.push(this.#pointwise(owned, PW.CUDNN_POINTWISE_SUB, { x: masked, b: max, y: shifted }, key));
    const e = virt(F, scores);
    ops.push(this.#pointwise(owned, PW.CUDNN_POINTWISE_EXP, { x: shifted, y: e }, key));
    const sum = virt(F, rows);
    ops.push(this.#reduction(owned, CUDNN_REDUCE.CUDNN_REDUCE_TENSOR_ADD, e, sum, key));
    // P in the inputs' type, as the second matmul of the flash-attention pattern takes it
    const p = virt(io, scores);
    ops.push(this.#pointwise(owned, PW.CUDNN_POINTWISE_DIV, { x: e, b: sum, y: p }, key));
    ops.push(this.#matmul(owned, p, v, o, key));
    return ops;
  }

  /**
   * The plan of one conv2d shape, built on first use and cached; null (cached) when cuDNN has no engine
   * that keeps the numerics.
   * @throws TpError E_ARG for sizes that are not positive or an empty output; the failing call's error
   */
  convPlan(s: ConvShape): CudnnPlan | null {
    const key = convKey(s);
    positive(key, { n: s.n, cIn: s.cIn, h: s.h, w: s.w, cOut: s.cOut, kh: s.kh, kw: s.kw });
    const [ho, wo] = [
      convOut(s.h, s.kh, s.stride[0], s.padding[0]),
      convOut(s.w, s.kw, s.stride[1], s.padding[1]),
    ];
    if (!(ho >= 1 && wo >= 1))
      throw new TpError("E_ARG", `cuDNN conv2d ${key}: output ${ho} × ${wo} is empty`);
    return this.#cached(
      key,
      (owned) => {
        const io = cudnnDataType(s.dtype);
        const t = (spec: TensorSpec) => this.#tensor(owned, spec, key);
        const x = t({ uid: CONV_UID.x, dtype: io, dims: [s.n, s.cIn, s.h, s.w] });
        const w = t({ uid: CONV_UID.w, dtype: io, dims: [s.cOut, s.cIn, s.kh, s.kw] });
        const y = t({ uid: CONV_UID.y, dtype: io, dims: [s.n, s.cOut, ho, wo] });
        const what = `${key}, convolution`;
        const conv = this.create(B.CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, owned, what);
        const I64 = T.CUDNN_TYPE_INT64;
        this.set(
          conv,
          A.CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
          T.CUDNN_TYPE_DATA_TYPE,
          [DT.CUDNN_DATA_FLOAT],
          what,
        );
        this.set(
          conv,
          A.CUDNN_ATTR_CONVOLUTION_CONV_MODE,
          T.CUDNN_TYPE_CONVOLUTION_MODE,
          [CUDNN_CONV_MODE.CUDNN_CROSS_CORRELATION],
          what,
        );
        this.set(conv, A.CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, I64, [2], what);
        this.set(conv, A.CUDNN_ATTR_CONVOLUTION_DILATIONS, I64, [1, 1], what);
        this.set(conv, A.CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, I64, s.stride, what);
        this.set(conv, A.CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, I64, s.padding, what);
        this.set(conv, A.CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, I64, s.padding, what);
        this.finalize(conv, what);
        const op = this.create(B.CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, owned, what);
        const D = T.CUDNN_TYPE_BACKEND_DESCRIPTOR;
        this.set(op, A.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, D, [x], what);
        this.set(op, A.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, D, [w], what);
        this.set(op, A.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, D, [y], what);
        this.set(op, A.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, D, [conv], what);
        this.set(op, A.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, T.CUDNN_TYPE_DOUBLE, [1], what);
        this.set(op, A.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, T.CUDNN_TYPE_DOUBLE, [0], what);
        this.finalize(op, what);
        return [op];
      },
      s.dtype,
    );
  }

  // ---------------------------------------------------------------------------------- execution

  /**
   * Queue a plan on the handle's stream: `pointers` maps each unique id to a device address, or to a
   * host array for a by-value scalar (read by cuDNN during the call).
   * @throws TpError E_ARG when the workspace is smaller than the plan's; the failing call's error
   */
  execute(
    plan: CudnnPlan,
    pointers: ReadonlyMap<number, bigint | Float32Array | Int32Array>,
    workspace: { ptr: bigint; bytes: number },
  ): void {
    if (this.#closed) throw new TpError("E_STATE", "cuDNN handle was destroyed");
    if (plan.workspaceBytes > workspace.bytes)
      throw new TpError(
        "E_ARG",
        `cuDNN plan ${plan.key}: needs ${plan.workspaceBytes} B of workspace, given ${workspace.bytes}`,
      );
    const uids = [...pointers.keys()];
    const addrs = [...pointers.values()].map((p) => (typeof p === "bigint" ? p : BigInt(ptr(p))));
    const owned: number[] = [];
    try {
      const pack = this.create(B.CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, owned, plan.key);
      this.set(pack, A.CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, T.CUDNN_TYPE_INT64, uids, plan.key);
      this.set(pack, A.CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, T.CUDNN_TYPE_VOID_PTR, addrs, plan.key);
      this.set(pack, A.CUDNN_ATTR_VARIANT_PACK_WORKSPACE, T.CUDNN_TYPE_VOID_PTR, [workspace.ptr], plan.key);
      this.finalize(pack, `${plan.key}, variant pack`);
      this.#check("cudnnBackendExecute", this.#s.cudnnBackendExecute(this.handle, plan.plan, pack), plan.key);
    } finally {
      // the by-value scalars (host arrays held by `pointers`) are read within cudnnBackendExecute
      for (const d of owned) this.destroyDescriptor(d);
    }
  }

  /** Queue attention of a plan: device addresses of q, k, v, o (contiguous), the scale and qOffset. */
  sdpa(
    plan: CudnnPlan,
    a: { q: bigint; k: bigint; v: bigint; o: bigint; scale: number; qOffset: number },
    workspace: { ptr: bigint; bytes: number },
  ): void {
    const m = new Map<number, bigint | Float32Array | Int32Array>([
      [SDPA_UID.q, a.q],
      [SDPA_UID.k, a.k],
      [SDPA_UID.v, a.v],
      [SDPA_UID.o, a.o],
      [SDPA_UID.scale, new Float32Array([a.scale])],
    ]);
    if (plan.key.endsWith(":causal")) {
      if (!Number.isSafeInteger(a.qOffset) || a.qOffset < 0 || a.qOffset >= 2 ** 31)
        throw new TpError("E_ARG", `cuDNN attention ${plan.key}: qOffset ${a.qOffset} is not in [0, 2^31)`);
      m.set(SDPA_UID.qOffset, new Int32Array([a.qOffset]));
      // the most negative f32, as cudnn-frontend's causal mask selects: exp(lowest − max) is 0 like −∞, and a
      // row with no visible key would average instead of giving NaN (the route never sends one)
      m.set(SDPA_UID.maskValue, new Float32Array([-3.4028234663852886e38]));
    }
    this.execute(plan, m, workspace);
  }

  /** Queue conv2d of a plan: device addresses of x, w, y (NCHW packed). */
  conv(
    plan: CudnnPlan,
    a: { x: bigint; w: bigint; y: bigint },
    workspace: { ptr: bigint; bytes: number },
  ): void {
    this.execute(
      plan,
      new Map([
        [CONV_UID.x, a.x],
        [CONV_UID.w, a.w],
        [CONV_UID.y, a.y],
      ]),
      workspace,
    );
  }

  /** Plans built so far (null entries: no engine). */
  planCount(): number {
    return this.#plans.size;
  }

  /** Destroy every plan's descriptors and the handle (twice is a no-op). */
  destroy(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const p of this.#plans.values())
      if (p !== null) for (const d of [...p.owned].reverse()) this.destroyDescriptor(d);
    this.#plans.clear();
    this.#s.cudnnDestroy(this.handle);
  }
}

function positive(key: string, sizes: Record<string, number>): void {
  for (const [k, v] of Object.entries(sizes))
    if (!Number.isInteger(v) || v < 1 || v >= 2 ** 31)
      throw new TpError("E_ARG", `cuDNN ${key}: ${k} = ${v} is not a positive 32-bit size`);
}

/** Load cuDNN 9 and make a handle on `stream`. @throws TpError as ./libraries.ts loadLibrary, or naming the call */
export function loadCudnn(stream: number, env: Record<string, string | undefined> = process.env): Cudnn {
  const lib = loadLibrary(
    { label: "cuDNN", sonames: CUDNN_SONAMES, symbols: CUDNN_SIGNATURES, howToGet: HOW_TO_GET },
    env,
  );
  return new Cudnn(lib.path, lib.symbols, stream);
}
