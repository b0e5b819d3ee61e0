/**
 * The `cuda` backend: @tp/backend-ptx (one CUDA context, stream, caching allocator and its PTX kernels
 * for every op) with the linear layer routed to cuBLASLt where it has the format:
 *
 * | weight format            | tokens  | path                                                         |
 * |--------------------------|---------|--------------------------------------------------------------|
 * | bf16, f16                | > 8     | x cast to the weight's type (PTX), cuBLASLt GEMM, f32 accumulate and out, bias in its epilogue |
 * | int8_convrot             | ≥ 16    | rotation + per-row int8 quantization (PTX), cuBLASLt int8 GEMM (int32), dequant + bias (PTX) |
 * | f8_e4m3fn (sm_89+), opt-in | > 8   | amax + per-tensor e4m3 quantization of x (PTX), cuBLASLt fp8 GEMM with both scales, bias (PTX) |
 * | everything else, decode  | any     | the PTX kernels (gemv, mma, tiled) as on `ptx`               |
 *
 * A shape cuBLASLt's heuristic has no algorithm for stays on the PTX kernels too (cached, asked once).
 * fp8 through cuBLASLt quantizes the activations too (per tensor, like the weight): W8A8, not the PTX
 * kernels' weight-only product. Its error is past the conformance suite's matmul tolerance (NMSE 5e-4;
 * e4m3's 3-bit mantissa gives about 7e-4 on Gaussian activations), so it is opt-in, as ptx's W4A4 is:
 * `fp8Activations: true` or TP_CUDA_FP8_ACTIVATIONS=1. Attention stays on the PTX kernel (cuDNN's graph API is not bound yet;
 * ./cudnn.ts loads the library and makes a handle).
 *
 * Environment: as ptx (TP_CUDA_DEVICE, TP_CUDA_LIB_DIR — here a ':'-separated list of folders, searched
 * for libcublasLt.so.13/.12 and libcudnn.so.9 before the loader path).
 */
import {
  PtxBackend,
  type PtxBackendOptions,
  type PtxOpHost,
  ptx,
  ptxKernelTable,
  SimCudaDriver,
} from "@tp/backend-ptx";
import { type KernelTable, type Tensor, TpError, type Weight } from "@tp/tensor";
import { CublasLt, type GemmKind, type GemmShape, loadCublasLt, WORKSPACE_BYTES } from "./cublaslt.ts";
import { type Cudnn, loadCudnn } from "./cudnn.ts";
import { fakeCublasLt } from "./fake-cublaslt.ts";
import { absMaxKernel, DEQUANT_BLOCK, dequantInt32Kernel, FP8_BLOCK, quantizeFp8Kernel } from "./kernels.ts";

/** What the cuBLASLt matmul path needs of its backend (a PtxBackend, or a fake in tests). */
export interface CudaOpHost extends PtxOpHost {
  readonly lt: CublasLt;
  /** fp8 weights through cuBLASLt with e4m3 activations (W8A8, opt-in), else on the PTX kernels. */
  readonly fp8Activations: boolean;
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
  outFeatures: number,
  sm: number,
): GemmKind | null {
  if ((format === "bf16" || format === "f16") && tokens > 8) return format;
  // int8 IMMA: the rotation group divides K; K a multiple of 16 keeps every row 16-byte aligned
  if (format === "int8_convrot" && tokens >= 16 && inFeatures % 16 === 0 && sm >= 80) return "int8";
  // fp8 (Ada / Hopper tensor cores): cuBLASLt wants every dimension a multiple of 16
  const by16 = [tokens, inFeatures, outFeatures].every((d) => d % 16 === 0);
  if (format === "f8_e4m3fn" && tokens > 8 && sm >= 89 && by16) return "fp8_e4m3";
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
  const kind = cublasLtRoute(w.format, M, K, N, host.sm);
  if (kind === null || out.numel === 0 || (kind === "fp8_e4m3" && !host.fp8Activations)) return false;
  const shape: GemmShape = {
    kind,
    tokens: M,
    inFeatures: K,
    outFeatures: N,
    // the epilogue adds a contiguous bias for bf16 / f16; otherwise a PTX pass adds it
    bias: bias?.isContiguous === true && (kind === "bf16" || kind === "f16"),
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
      if (bias !== null && !shape.bias) addBias(host, out, bias, M, N);
      return;
    }
    if (kind === "fp8_e4m3") {
      // y = (s_w·s_x)·(q_x·q_wᵀ): q_x = e4m3(x / s_x), s_x = max|x| / 448 (per tensor, on the device)
      const xf = contiguousF32(host, x, M, K);
      const amax = host.alloc([1], "u32", "x_amax");
      host.fill(amax, 0);
      host.launch(host.kernel("absmax", absMaxKernel), [Math.ceil((M * K) / FP8_BLOCK), 1, 1], {
        amax,
        x: xf,
        n: M * K,
      });
      const q = host.alloc([M, K], "f8_e4m3fn", "x_fp8");
      const sx = host.alloc([1], "f32", "x_scale");
      const pairs = (M * K) / 2;
      host.launch(host.kernel("quant_fp8", quantizeFp8Kernel), [Math.ceil(pairs / FP8_BLOCK), 1, 1], {
        out: q,
        x: xf,
        amax,
        x_scale: sx,
        pairs,
      });
      // no scale on the weight: a null A scale pointer, which cuBLASLt reads as 1
      const wScale = w.scale?.kind === "tensor" ? host.address(host.weightScale(w)) : 0n;
      host.lt.matmul(
        plan,
        { w: host.address(wb), x: host.address(q), y: host.address(out), wScale, xScale: host.address(sx) },
        host.workspace(),
        host.stream,
      );
      if (bias !== null) addBias(host, out, bias, M, N);
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
    const fused = bias?.isContiguous === true;
    const k = host.kernel(`dequant_i32:${fused}`, () => dequantInt32Kernel(fused));
    host.launch(k, [Math.max(1, Math.ceil((M * N) / DEQUANT_BLOCK)), 1, 1], {
      out,
      acc,
      x_scale: sx,
      w_scale: host.weightScale(w),
      ...(fused ? { bias: bias as Tensor } : {}),
      rows: M,
      cols: N,
    });
    if (bias !== null && !fused) addBias(host, out, bias, M, N);
  });
  return true;
}

/** out[M, N] += bias[N] in place (the ptx map kernel, bias broadcast over rows). */
function addBias(host: CudaOpHost, out: Tensor, bias: Tensor, M: number, N: number): void {
  const k = host.kernel("map:add:f32,f32:f32:2:false", () =>
    ptx.mapKernel({ op: "add", inputs: ["f32", "f32"], out: "f32", rank: 2 }),
  );
  host.launch(k, [Math.max(1, Math.ceil((M * N) / ptx.ELEMENTWISE_BLOCK)), 1, 1], {
    out,
    in0: out,
    in1: bias,
    n: M * N,
    size0: M,
    size1: N,
    stride1_0: N,
    stride1_1: 1,
    stride2_0: 0,
    stride2_1: bias.strides[0] as number,
  });
}

/** `x` as a contiguous, 8-byte aligned f32 [M, K] (a copy in the scope when it is not). */
function contiguousF32(host: CudaOpHost, x: Tensor, M: number, K: number): Tensor {
  // the fp8 quantizer reads x in 8-byte pairs: a view starting at an odd element is copied too
  if (x.isContiguous && x.layout.offset % 2 === 0) return x;
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

/** Options of the cuda backend: those of ptx, and the fp8 W8A8 opt-in. */
export interface CudaBackendOptions extends PtxBackendOptions {
  /** fp8 e4m3 weights as W8A8 through cuBLASLt (see the module comment); default TP_CUDA_FP8_ACTIVATIONS=1. */
  fp8Activations?: boolean;
}

/** The cuda backend. Create it with {@link createBackend} or `loadBackend("cuda", options)`. */
export class CudaBackend extends PtxBackend implements CudaOpHost {
  readonly lt: CublasLt;
  readonly fp8Activations: boolean;
  /** cuDNN when libcudnn.so.9 loads (no op uses it yet), else null. */
  readonly cudnn: Cudnn | null;
  /** Why cuDNN is not loaded, when it is not. */
  readonly cudnnMissing: string | null;
  #workspace: Tensor | null = null;
  #libsClosed = false;
  override readonly kernelTable: KernelTable = cudaKernelTable(this, ptxKernelTable(this));

  /** @throws TpError as PtxBackend, and as loadCublasLt / cublasLtCreate */
  constructor(options: CudaBackendOptions = {}) {
    super(options, "cuda");
    const env = options.env ?? process.env;
    this.fp8Activations = options.fp8Activations ?? env.TP_CUDA_FP8_ACTIVATIONS === "1";
    const sim = this.driver instanceof SimCudaDriver ? this.driver : null;
    try {
      // On the PTX simulator no real library can run (its buffers are not device memory): cuBLASLt is
      // the float64 model of ./fake-cublaslt.ts computing on the simulator's memory.
      const symbols =
        sim === null ? loadCublasLt(env).symbols : fakeCublasLt({ view: (a) => sim.dataView(a) }).symbols;
      this.lt = new CublasLt(symbols);
    } catch (e) {
      super.dispose();
      throw e;
    }
    let cudnn: Cudnn | null = null;
    let missing: string | null = sim === null ? null : "the PTX simulator has no cuDNN";
    if (sim === null) {
      try {
        cudnn = loadCudnn(this.stream, env);
      } catch (e) {
        missing = e instanceof Error ? e.message : String(e);
      }
    }
    this.cudnn = cudnn;
    this.cudnnMissing = missing;
    const v = this.lt.version();
    // The workspace is the backend's from the start (not the first GEMM's): ops leave memory as they found it.
    this.workspace();
    if (sim !== null) this.device += ", cuBLASLt model (float64), no cuDNN";
    else
      this.device += `, cuBLASLt ${Math.floor(v / 10000)}.${Math.floor((v % 10000) / 100)}.${v % 100}${cudnn === null ? ", no cuDNN" : `, cuDNN ${cudnn.versionString()}`}`;
  }

  workspace(): { ptr: bigint; bytes: number } {
    if (this.#workspace === null || this.#workspace.storage.freed)
      this.#workspace = this.persist(this.alloc([WORKSPACE_BYTES], "u8", "cublaslt.workspace"));
    return { ptr: this.address(this.#workspace), bytes: WORKSPACE_BYTES };
  }

  /** Wait for queued work, release cuBLASLt's plans and handle, cuDNN's handle, then the ptx backend. */
  override dispose(): void {
    if (this.#libsClosed) return;
    this.#libsClosed = true;
    this.driver.streamSynchronize(this.stream);
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
