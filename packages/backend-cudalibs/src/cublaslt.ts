/**
 * cuBLASLt (`libcublasLt.so.13` / `.12`) through bun:ffi: the symbol table, status → TpError naming the
 * call, and {@link CublasLt}: one handle, GEMM plans (operation descriptor, three matrix layouts and
 * the heuristic's first algorithm with its workspace size) built once per shape and cached, and the
 * matmul call on the backend's stream with a workspace the caller takes from its allocator.
 *
 * Every GEMM here is the linear layer `y[tokens, out] = x[tokens, in] · w[out, in]ᵀ` with row-major
 * operands. cuBLASLt is column-major, so it computes `yᵀ (out × tokens, ld out) = op(A) · B` with
 * A = w seen as an in × out column-major matrix (ld in) and op(A) = Aᵀ, B = x seen as in × tokens (ld in):
 * the "TN" layout, the one cuBLASLt supports for every input type used here (int8 IMMA and fp8 need
 * it). Enum values and struct sizes: ./nvidia-h.ts.
 *
 * Source: cuBLAS documentation §cuBLASLt API (cublasLtMatmul, cublasLtMatmulAlgoGetHeuristic, the
 * descriptor / layout / preference attributes), cublasLt.h.
 */
import { CString, type FFIFunction, type Pointer } from "bun:ffi";
import { TpError, type TpErrorCode } from "@tp/tensor";
import { type LibrarySpec, loadLibrary } from "./libraries.ts";
import {
  CUBLAS_COMPUTE,
  CUBLAS_OP,
  CUBLAS_STATUS,
  CUBLASLT_EPILOGUE,
  CUBLASLT_MATMUL_DESC,
  CUBLASLT_MATMUL_PREF,
  CUBLASLT_SIZES,
  CUDA_DATA_TYPE,
} from "./nvidia-h.ts";

/** The sonames tried, newest first (CUDA 13's wheel / toolkit, then CUDA 12's). */
export const CUBLASLT_SONAMES = ["libcublasLt.so.13", "libcublasLt.so.12"] as const;

/** The bun:ffi declarations (handles and host pointers as `ptr`, device addresses as `u64`). */
export const CUBLASLT_SIGNATURES = {
  cublasLtCreate: { args: ["ptr"], returns: "i32" },
  cublasLtDestroy: { args: ["ptr"], returns: "i32" },
  cublasLtGetVersion: { args: [], returns: "u64" },
  cublasLtGetStatusString: { args: ["i32"], returns: "ptr" },
  cublasLtMatmulDescCreate: { args: ["ptr", "i32", "i32"], returns: "i32" },
  cublasLtMatmulDescDestroy: { args: ["ptr"], returns: "i32" },
  cublasLtMatmulDescSetAttribute: { args: ["ptr", "i32", "ptr", "u64"], returns: "i32" },
  cublasLtMatrixLayoutCreate: { args: ["ptr", "i32", "u64", "u64", "i64"], returns: "i32" },
  cublasLtMatrixLayoutDestroy: { args: ["ptr"], returns: "i32" },
  cublasLtMatmulPreferenceCreate: { args: ["ptr"], returns: "i32" },
  cublasLtMatmulPreferenceDestroy: { args: ["ptr"], returns: "i32" },
  cublasLtMatmulPreferenceSetAttribute: { args: ["ptr", "i32", "ptr", "u64"], returns: "i32" },
  cublasLtMatmulAlgoGetHeuristic: {
    args: ["ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "i32", "ptr", "ptr"],
    returns: "i32",
  },
  cublasLtMatmul: {
    args: [
      "ptr",
      "ptr",
      "ptr",
      "u64",
      "ptr",
      "u64",
      "ptr",
      "ptr",
      "u64",
      "ptr",
      "u64",
      "ptr",
      "ptr",
      "u64",
      "u64",
      "ptr",
    ],
    returns: "i32",
  },
} as const satisfies Record<string, FFIFunction>;

/** The functions {@link CublasLt} calls (the loaded library, or a fake in tests). */
// biome-ignore lint/suspicious/noExplicitAny: bun:ffi functions are typed by their declarations at run time
export type CublasLtSymbols = { [K in keyof typeof CUBLASLT_SIGNATURES]: (...args: any[]) => any };

const HOW_TO_GET =
  "cuBLASLt comes with the CUDA toolkit (libcublas) or PyTorch's nvidia-cublas wheel (site-packages/nvidia/cublas/lib)";

/** Load cuBLASLt (see ./libraries.ts for the places and errors). */
export function loadCublasLt(env: Record<string, string | undefined> = process.env): {
  path: string;
  symbols: CublasLtSymbols;
} {
  const spec: LibrarySpec<typeof CUBLASLT_SIGNATURES> = {
    label: "cuBLASLt",
    sonames: CUBLASLT_SONAMES,
    symbols: CUBLASLT_SIGNATURES,
    howToGet: HOW_TO_GET,
  };
  return loadLibrary(spec, env);
}

const STATUS_NAMES = new Map<number, string>(Object.entries(CUBLAS_STATUS).map(([k, v]) => [v, k]));

/** The TpError code of a cublasStatus_t. */
export function cublasStatusCode(status: number): TpErrorCode {
  switch (status) {
    case CUBLAS_STATUS.CUBLAS_STATUS_ALLOC_FAILED:
      return "E_OOM";
    case CUBLAS_STATUS.CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS.CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS.CUBLAS_STATUS_LICENSE_ERROR:
    case CUBLAS_STATUS.CUBLAS_STATUS_NOT_INITIALIZED:
      return "E_UNSUPPORTED";
    case CUBLAS_STATUS.CUBLAS_STATUS_INVALID_VALUE:
      return "E_ARG";
    default:
      return "E_INTERNAL";
  }
}

/** `<call> failed: CUBLAS_STATUS_… (<code>)[: text][; detail]`. */
export function cublasError(call: string, status: number, text = "", detail = ""): TpError {
  const name = STATUS_NAMES.get(status) ?? "cublasStatus_t";
  return new TpError(
    cublasStatusCode(status),
    `${call} failed: ${name} (${status})${text === "" ? "" : `: ${text}`}${detail === "" ? "" : `; ${detail}`}`,
  );
}

/** The input kinds a plan supports: bf16 / f16 (f32 out), int8 (int32 out), fp8 e4m3 (f32 out). */
export type GemmKind = "bf16" | "f16" | "int8" | "fp8_e4m3";

/** One GEMM shape: `y[tokens, outFeatures] = x[tokens, inFeatures] · w[outFeatures, inFeatures]ᵀ`. */
export interface GemmShape {
  readonly kind: GemmKind;
  readonly tokens: number;
  readonly inFeatures: number;
  readonly outFeatures: number;
  /** Add a bias [outFeatures] in cuBLASLt's epilogue (float kinds only). */
  readonly bias: boolean;
}

/** Types of A (w), B (x), C = D (y), the compute and scale types of a kind. */
export function gemmTypes(kind: GemmKind): { ab: number; cd: number; compute: number; scale: number } {
  const T = CUDA_DATA_TYPE;
  switch (kind) {
    case "bf16":
      return {
        ab: T.CUDA_R_16BF,
        cd: T.CUDA_R_32F,
        compute: CUBLAS_COMPUTE.CUBLAS_COMPUTE_32F,
        scale: T.CUDA_R_32F,
      };
    case "f16":
      return {
        ab: T.CUDA_R_16F,
        cd: T.CUDA_R_32F,
        compute: CUBLAS_COMPUTE.CUBLAS_COMPUTE_32F,
        scale: T.CUDA_R_32F,
      };
    case "int8":
      return {
        ab: T.CUDA_R_8I,
        cd: T.CUDA_R_32I,
        compute: CUBLAS_COMPUTE.CUBLAS_COMPUTE_32I,
        scale: T.CUDA_R_32I,
      };
    case "fp8_e4m3":
      return {
        ab: T.CUDA_R_8F_E4M3,
        cd: T.CUDA_R_32F,
        compute: CUBLAS_COMPUTE.CUBLAS_COMPUTE_32F,
        scale: T.CUDA_R_32F,
      };
  }
}

/** The cache key of a shape. */
export function gemmKey(s: GemmShape): string {
  return `${s.kind}:${s.tokens}x${s.inFeatures}x${s.outFeatures}:${s.bias ? "bias" : "nobias"}`;
}

/** A built plan: the descriptors and the chosen algorithm (the heuristic result, 96 bytes). */
export interface GemmPlan {
  readonly shape: GemmShape;
  readonly desc: number;
  readonly layouts: readonly [a: number, b: number, d: number];
  /** The heuristic result; its first 64 bytes are the cublasLtMatmulAlgo_t passed to cublasLtMatmul. */
  readonly heuristic: Uint8Array;
  readonly workspaceBytes: number;
}

/** Device addresses of one call. */
export interface GemmOperands {
  /** w [outFeatures, inFeatures], the kind's element type. */
  readonly w: bigint;
  /** x [tokens, inFeatures], the kind's element type. */
  readonly x: bigint;
  /** y [tokens, outFeatures]: f32, or int32 for int8. */
  readonly y: bigint;
  /** f32 [outFeatures], when the shape has a bias. */
  readonly bias?: bigint;
  /** fp8: f32 scalars on the device, w = f32(w_fp8)·wScale, x = f32(x_fp8)·xScale; 0n (null) reads as 1. */
  readonly wScale?: bigint;
  readonly xScale?: bigint;
}

/** Largest workspace a plan may ask for (bytes): 32 MiB, what NVIDIA suggests for Hopper. */
export const WORKSPACE_BYTES = 32 << 20;

/**
 * A cuBLASLt handle and its plan cache. Methods take raw addresses; errors are TpError naming the call
 * and the shape. Not thread-safe (one per backend).
 */
export class CublasLt {
  readonly #s: CublasLtSymbols;
  readonly handle: number;
  readonly #plans = new Map<string, GemmPlan | null>();
  /** How many times the heuristic was queried (once per new shape; tests read it). */
  heuristicQueries = 0;
  #closed = false;

  /** @throws TpError naming cublasLtCreate when the library cannot make a handle */
  constructor(symbols: CublasLtSymbols) {
    this.#s = symbols;
    const h = new BigUint64Array(1);
    this.#check("cublasLtCreate", symbols.cublasLtCreate(h));
    this.handle = Number(h[0]);
  }

  /** cublasLtGetVersion(): e.g. 130000 for 13.0.0. */
  version(): number {
    return Number(this.#s.cublasLtGetVersion());
  }

  #check(call: string, status: number, detail = ""): void {
    if (status === 0) return;
    const p = this.#s.cublasLtGetStatusString(status);
    let text = "";
    if (typeof p === "number" && p !== 0) text = String(new CString(p as Pointer));
    throw cublasError(call, status, text, detail);
  }

  #setDesc(desc: number, attr: number, value: Int32Array | Uint32Array | BigUint64Array, what: string): void {
    this.#check(
      "cublasLtMatmulDescSetAttribute",
      this.#s.cublasLtMatmulDescSetAttribute(desc, attr, value, value.byteLength),
      what,
    );
  }

  /**
   * The plan of a shape: built and its algorithm chosen by the heuristic on first use, then cached.
   * Returns null (also cached) when cuBLASLt has no algorithm for it, so the caller keeps its own kernel.
   * @throws TpError E_ARG for a shape that is not positive integers; the call's error otherwise
   */
  plan(shape: GemmShape): GemmPlan | null {
    if (this.#closed) throw new TpError("E_STATE", "cuBLASLt handle was destroyed");
    const key = gemmKey(shape);
    if (this.#plans.has(key)) return this.#plans.get(key) as GemmPlan | null;
    for (const [k, v] of Object.entries({
      tokens: shape.tokens,
      inFeatures: shape.inFeatures,
      outFeatures: shape.outFeatures,
    })) {
      if (!Number.isInteger(v) || v < 1 || v >= 2 ** 31)
        throw new TpError("E_ARG", `cuBLASLt GEMM ${key}: ${k} = ${v} is not a positive 32-bit size`);
    }
    if (shape.bias && shape.kind === "int8")
      throw new TpError("E_INTERNAL", `cuBLASLt GEMM ${key}: the int32 output takes no bias epilogue`);
    const built = this.#build(shape, key);
    this.#plans.set(key, built);
    return built;
  }

  #build(shape: GemmShape, key: string): GemmPlan | null {
    const t = gemmTypes(shape.kind);
    const out = new BigUint64Array(1);
    this.#check("cublasLtMatmulDescCreate", this.#s.cublasLtMatmulDescCreate(out, t.compute, t.scale), key);
    const desc = Number(out[0]);
    const layouts: number[] = [];
    let pref = 0;
    let kept = false;
    try {
      this.#setDesc(
        desc,
        CUBLASLT_MATMUL_DESC.CUBLASLT_MATMUL_DESC_TRANSA,
        new Int32Array([CUBLAS_OP.CUBLAS_OP_T]),
        key,
      );
      this.#setDesc(
        desc,
        CUBLASLT_MATMUL_DESC.CUBLASLT_MATMUL_DESC_TRANSB,
        new Int32Array([CUBLAS_OP.CUBLAS_OP_N]),
        key,
      );
      if (shape.bias)
        this.#setDesc(
          desc,
          CUBLASLT_MATMUL_DESC.CUBLASLT_MATMUL_DESC_EPILOGUE,
          new Uint32Array([CUBLASLT_EPILOGUE.CUBLASLT_EPILOGUE_BIAS]),
          key,
        );
      const { inFeatures: K, outFeatures: N, tokens: M } = shape;
      // A: w as K × N (ld K), B: x as K × M (ld K), D: yᵀ as N × M (ld N); all column-major
      for (const [type, rows, cols] of [
        [t.ab, K, N],
        [t.ab, K, M],
        [t.cd, N, M],
      ] as const) {
        this.#check(
          "cublasLtMatrixLayoutCreate",
          this.#s.cublasLtMatrixLayoutCreate(out, type, rows, cols, rows),
          `${key}, ${rows} × ${cols}`,
        );
        layouts.push(Number(out[0]));
      }
      this.#check("cublasLtMatmulPreferenceCreate", this.#s.cublasLtMatmulPreferenceCreate(out), key);
      pref = Number(out[0]);
      const ws = new BigUint64Array([BigInt(WORKSPACE_BYTES)]);
      this.#check(
        "cublasLtMatmulPreferenceSetAttribute",
        this.#s.cublasLtMatmulPreferenceSetAttribute(
          pref,
          CUBLASLT_MATMUL_PREF.CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
          ws,
          8,
        ),
        key,
      );
      const heuristic = new Uint8Array(CUBLASLT_SIZES.cublasLtMatmulHeuristicResult_t);
      const count = new Int32Array(1);
      const [a, b, d] = layouts as [number, number, number];
      this.heuristicQueries++;
      const r = this.#s.cublasLtMatmulAlgoGetHeuristic(
        this.handle,
        desc,
        a,
        b,
        d,
        d,
        pref,
        1,
        heuristic,
        count,
      );
      if (r === CUBLAS_STATUS.CUBLAS_STATUS_NOT_SUPPORTED || (r === 0 && count[0] === 0)) return null;
      this.#check("cublasLtMatmulAlgoGetHeuristic", r, key);
      const view = new DataView(heuristic.buffer);
      const state = view.getInt32(CUBLASLT_SIZES["cublasLtMatmulHeuristicResult_t.state"], true);
      if (state !== 0) return null;
      const workspaceBytes = Number(
        view.getBigUint64(CUBLASLT_SIZES["cublasLtMatmulHeuristicResult_t.workspaceSize"], true),
      );
      kept = true;
      return { shape, desc, layouts: [a, b, d], heuristic, workspaceBytes };
    } finally {
      if (pref !== 0) this.#s.cublasLtMatmulPreferenceDestroy(pref);
      if (!kept) {
        for (const l of layouts) this.#s.cublasLtMatrixLayoutDestroy(l);
        this.#s.cublasLtMatmulDescDestroy(desc);
      }
    }
  }

  /**
   * Queue `y = x · wᵀ (+ bias)` of a plan on `stream` (alpha 1, beta 0; C = D).
   * @throws TpError E_ARG when the operands lack the plan's bias / fp8 scales or the workspace is too
   *   small; the cublasLtMatmul error otherwise
   */
  matmul(plan: GemmPlan, ops: GemmOperands, workspace: { ptr: bigint; bytes: number }, stream: number): void {
    const key = gemmKey(plan.shape);
    if (plan.workspaceBytes > workspace.bytes)
      throw new TpError(
        "E_ARG",
        `cuBLASLt GEMM ${key}: needs ${plan.workspaceBytes} B of workspace, given ${workspace.bytes}`,
      );
    if (plan.shape.bias !== (ops.bias !== undefined))
      throw new TpError(
        "E_ARG",
        `cuBLASLt GEMM ${key}: bias ${ops.bias === undefined ? "missing" : "not planned"}`,
      );
    if (plan.shape.bias)
      this.#setDesc(
        plan.desc,
        CUBLASLT_MATMUL_DESC.CUBLASLT_MATMUL_DESC_BIAS_POINTER,
        new BigUint64Array([ops.bias as bigint]),
        key,
      );
    if (plan.shape.kind === "fp8_e4m3") {
      if (ops.wScale === undefined || ops.xScale === undefined)
        throw new TpError("E_ARG", `cuBLASLt GEMM ${key}: fp8 needs the scales of w and x`);
      this.#setDesc(
        plan.desc,
        CUBLASLT_MATMUL_DESC.CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
        new BigUint64Array([ops.wScale]),
        key,
      );
      this.#setDesc(
        plan.desc,
        CUBLASLT_MATMUL_DESC.CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
        new BigUint64Array([ops.xScale]),
        key,
      );
    }
    const int = plan.shape.kind === "int8";
    const alpha = int ? new Int32Array([1]) : new Float32Array([1]);
    const beta = int ? new Int32Array([0]) : new Float32Array([0]);
    const [a, b, d] = plan.layouts;
    this.#check(
      "cublasLtMatmul",
      this.#s.cublasLtMatmul(
        this.handle,
        plan.desc,
        alpha,
        ops.w,
        a,
        ops.x,
        b,
        beta,
        ops.y,
        d,
        ops.y,
        d,
        plan.heuristic,
        workspace.ptr,
        workspace.bytes,
        stream,
      ),
      key,
    );
  }

  /** Destroy every plan and the handle (twice is a no-op). */
  destroy(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const p of this.#plans.values()) {
      if (p === null) continue;
      for (const l of p.layouts) this.#s.cublasLtMatrixLayoutDestroy(l);
      this.#s.cublasLtMatmulDescDestroy(p.desc);
    }
    this.#plans.clear();
    this.#s.cublasLtDestroy(this.handle);
  }

  /** Plans built so far (null entries: no algorithm). */
  planCount(): number {
    return this.#plans.size;
  }
}
