/**
 * The `cuda` backend: @tp/backend-ptx (one CUDA context, stream, caching allocator and its PTX kernels
 * for every op) with the linear layer routed to cuBLASLt where it has the format:
 *
 * | weight format            | tokens  | path                                                         |
 * |--------------------------|---------|--------------------------------------------------------------|
 * | bf16, f16                | > 8     | x cast to the weight's type (PTX), cuBLASLt GEMM, f32 accumulate and out, bias in its epilogue |
 * | int8_convrot             | ≥ 16    | rotation + per-row int8 quantization (PTX), cuBLASLt int8 GEMM (int32), dequant + bias (PTX) |
 * | everything else, decode  | any     | the PTX kernels (gemv, mma, tiled) as on `ptx`               |
 *
 * A shape cuBLASLt's heuristic has no algorithm for stays on the PTX kernels too (cached, asked once).
 * fp8 e4m3 with a tensor scale is planned in ./cublaslt.ts but not routed yet: it needs an on-device
 * per-tensor activation scale (amax) kernel first; it runs on the PTX kernels. Attention stays on the
 * PTX kernel (cuDNN's graph API is not bound yet; ./cudnn.ts loads the library and makes a handle).
 *
 * Environment: as ptx (TP_CUDA_DEVICE, TP_CUDA_LIB_DIR — here a ':'-separated list of folders, searched
 * for libcublasLt.so.13/.12 and libcudnn.so.9 before the loader path).
 */
import { PtxBackend, type PtxBackendOptions, type PtxOpHost, ptx, ptxKernelTable } from "@tp/backend-ptx";
import { type KernelTable, type Tensor, TpError, type Weight } from "@tp/tensor";
import { CublasLt, type GemmKind, type GemmShape, loadCublasLt, WORKSPACE_BYTES } from "./cublaslt.ts";
import { type Cudnn, loadCudnn } from "./cudnn.ts";
import { DEQUANT_BLOCK, dequantInt32Kernel } from "./kernels.ts";

/** What the cuBLASLt matmul path needs of its backend (a PtxBackend, or a fake in tests). */
export interface CudaOpHost extends PtxOpHost {
  readonly lt: CublasLt;
  readonly stream: number;
  /** The device address of a tensor view's first element. */
  address(t: Tensor): bigint;
  /** The persisted cuBLASLt workspace (allocated on first use from the backend's allocator). */
  workspace(): { ptr: bigint; bytes: number };
}

/** Which cuBLASLt GEMM a linear layer takes, or null for the PTX kernels. */
export function cublasLtRoute(
  format: string,
  tokens: number,
  inFeatures: number,
  sm: number,
): GemmKind | null {
  if ((format === "bf16" || format === "f16") && tokens > 8) return format;
  // int8 IMMA: the rotation group divides K; K a multiple of 16 keeps every row 16-byte aligned
  if (format === "int8_convrot" && tokens >= 16 && inFeatures % 16 === 0 && sm >= 80) return "int8";
  return null;
}

/**
 * The linear layer through cuBLASLt: y[tokens, N] = x[tokens, K] · wᵀ (+ bias); returns false (and
 * queues nothing) when this shape stays on the PTX kernels.
 */
export function cublasLtMatmul(
  host: CudaOpHost,
  out: Tensor,
  x: Tensor,
  w: Weight,
  bias: Tensor | null,
): boolean {
  const [N, K] = w.shape;
  const M = x.numel / Math.max(1, K);
  const kind = cublasLtRoute(w.format, M, K, host.sm);
  if (kind === null || out.numel === 0) return false;
  const shape: GemmShape = {
    kind,
    tokens: M,
    inFeatures: K,
    outFeatures: N,
    bias: bias !== null && kind !== "int8",
  };
  const plan = host.lt.plan(shape);
  if (plan === null) return false;
  host.scope(() => {
    const wb = host.weightBytes(w);
    if (kind === "bf16" || kind === "f16") {
      const xh = host.alloc([M, K], kind, "x_half");
      castInto(host, xh, x);
      host.lt.matmul(
        plan,
        {
          w: host.address(wb),
          x: host.address(xh),
          y: host.address(out),
          ...(shape.bias ? { bias: host.address(bias as Tensor) } : {}),
        },
        host.workspace(),
        host.stream,
      );
      return;
    }
    // int8 ConvRot (krea2.md §1.7): rotate, quantize rows to int8, q_x · q_wᵀ in int32, dequantize
    const group = w.rotationGroup ?? 256;
    const xf = contiguousF32(host, x, M, K);
    const rot = host.alloc([M, K], "f32", "x_rot");
    host.launch(
      host.kernel(`rotate:${group}`, () => ptx.rotateKernel(group)),
      [K / group, M, 1],
      { out: rot, x: xf, k: K },
    );
    const q = host.alloc([M, K], "i8", "x_q");
    const sx = host.alloc([M], "f32", "x_scale");
    host.launch(host.kernel("quant8", ptx.quantizeRowsInt8Kernel), [M, 1, 1], {
      out: q,
      x: rot,
      d: K,
      scales: sx,
    });
    const acc = host.alloc([M, N], "i32", "acc");
    host.lt.matmul(
      plan,
      { w: host.address(wb), x: host.address(q), y: host.address(acc) },
      host.workspace(),
      host.stream,
    );
    const k = host.kernel(`dequant_i32:${bias !== null}`, () => dequantInt32Kernel(bias !== null));
    host.launch(k, [Math.max(1, Math.ceil((M * N) / DEQUANT_BLOCK)), 1, 1], {
      out,
      acc,
      x_scale: sx,
      w_scale: host.weightScale(w),
      ...(bias === null ? {} : { bias }),
      rows: M,
      cols: N,
    });
  });
  return true;
}

/** `x` as a contiguous f32 [M, K] (a copy in the scope when it is a strided view). */
function contiguousF32(host: CudaOpHost, x: Tensor, M: number, K: number): Tensor {
  if (x.isContiguous) return x;
  const c = host.alloc([M, K], "f32", "x");
  castInto(host, c, x);
  return c;
}

/** out (contiguous, f32 / f16 / bf16) ← x (f32, any view) converted, through the ptx map kernel. */
function castInto(host: CudaOpHost, out: Tensor, x: Tensor): void {
  const rank = x.shape.length;
  const k = host.kernel(`map:cast:f32:${out.dtype}:${rank}:false`, () =>
    ptx.mapKernel({ op: "cast", inputs: ["f32"], out: out.dtype as ptx.FloatDtype, rank }),
  );
  const args: Record<string, Tensor | number> = { out, in0: x, n: x.numel };
  x.shape.forEach((s, d) => {
    args[`size${d}`] = s;
    args[`stride1_${d}`] = x.strides[d] as number;
  });
  host.launch(k, [Math.max(1, Math.ceil(x.numel / ptx.ELEMENTWISE_BLOCK)), 1, 1], args);
}

/** The ptx table with matmul taking cuBLASLt first. */
export function cudaKernelTable(host: CudaOpHost, base: KernelTable): KernelTable {
  const m = base.matmul;
  if (m === undefined) return base;
  return {
    ...base,
    matmul: {
      ...m,
      run: (out, x, w, bias) => {
        if (!cublasLtMatmul(host, out, x, w, bias)) m.run(out, x, w, bias);
      },
    },
  };
}

/** Options of the cuda backend (those of ptx). */
export type CudaBackendOptions = PtxBackendOptions;

/** The cuda backend. Create it with {@link createBackend} or `loadBackend("cuda", options)`. */
export class CudaBackend extends PtxBackend implements CudaOpHost {
  readonly lt: CublasLt;
  /** cuDNN when libcudnn.so.9 loads (no op uses it yet), else null. */
  readonly cudnn: Cudnn | null;
  /** Why cuDNN is not loaded, when it is not. */
  readonly cudnnMissing: string | null;
  #workspace: Tensor | null = null;
  override readonly kernelTable: KernelTable = cudaKernelTable(this, ptxKernelTable(this));

  /** @throws TpError as PtxBackend, and as loadCublasLt / cublasLtCreate */
  constructor(options: CudaBackendOptions = {}) {
    super(options, "cuda");
    const env = options.env ?? process.env;
    try {
      const lib = loadCublasLt(env);
      this.lt = new CublasLt(lib.symbols);
    } catch (e) {
      super.dispose();
      throw e;
    }
    let cudnn: Cudnn | null = null;
    let missing: string | null = null;
    try {
      cudnn = loadCudnn(this.stream, env);
    } catch (e) {
      missing = e instanceof Error ? e.message : String(e);
    }
    this.cudnn = cudnn;
    this.cudnnMissing = missing;
    const v = this.lt.version();
    this.device += `, cuBLASLt ${Math.floor(v / 10000)}.${Math.floor((v % 10000) / 100)}.${v % 100}${cudnn === null ? ", no cuDNN" : `, cuDNN ${cudnn.versionString()}`}`;
  }

  workspace(): { ptr: bigint; bytes: number } {
    if (this.#workspace === null || this.#workspace.storage.freed)
      this.#workspace = this.persist(this.alloc([WORKSPACE_BYTES], "u8", "cublaslt.workspace"));
    return { ptr: this.address(this.#workspace), bytes: WORKSPACE_BYTES };
  }

  override dispose(): void {
    this.lt.destroy();
    this.cudnn?.destroy();
    super.dispose();
  }
}

/**
 * Create the `cuda` backend.
 * @throws TpError `backend cuda cannot start: …` — E_UNSUPPORTED without libcuda.so.1, a device
 *   (sm_80+) or libcublasLt.so.13/.12 (each naming the library, where it was looked for and how to get
 *   it); E_IO for a damaged library in TP_CUDA_LIB_DIR; E_ARG for a bad device selector
 */
export function createBackend(options: CudaBackendOptions = {}): CudaBackend {
  try {
    return new CudaBackend(options);
  } catch (e) {
    if (!(e instanceof TpError)) throw e;
    const message = e.message.replace(/\s*\n\s*/g, " ");
    throw new TpError(e.code, `backend cuda cannot start: ${message}`, {
      ...(e.file === undefined ? {} : { file: e.file }),
      cause: e,
    });
  }
}
