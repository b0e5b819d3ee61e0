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
 * `fp8Activations: true` or TP_CUDA_FP8_ACTIVATIONS=1.
 *
 * Attention and conv2d go through cuDNN's graph API (./cudnn.ts) when libcudnn.so.9 loads:
 *
 * | op        | cuDNN when                                                              | otherwise            |
 * |-----------|-------------------------------------------------------------------------|----------------------|
 * | attention | q, k, v all f16 or all bf16; no mask or causal with qOffset ≥ 0; no window, prefix or softcap; head_dim = head_dim_v, a multiple of 8, ≤ 128 (≤ 256 on sm_90+); more than one query row; sm_80+ | the PTX kernel (f32; other dtypes converted to f32 and back, exactly) |
 * | attention, f32 | opt-in only (TP_CUDA_CUDNN_ATTENTION=1 or `cudnnF32Attention`): q, k, v rounded to bf16, the output back to f32 — a change of numerics, so never by default | the PTX kernel |
 * | conv2d    | x and weight both f32 or both f16 (NCHW; f32 compute; no TF32 engine for f32) | the PTX kernel, as for attention |
 *
 * A shape cuDNN has no engine for stays on the PTX kernel (cached, asked once). Plans are per shape,
 * built on first use; the workspace comes from the backend's allocator inside the op's scope. Without
 * libcudnn.so.9 `cudnnMissing` holds the one-line reason (naming it and how to install it) and `device`
 * says "no cuDNN"; every op keeps working on the PTX kernels. `cudnn: false` or TP_CUDA_CUDNN=0 does
 * the same on purpose (to compare with, or to step around a cuDNN that misbehaves).
 *
 * Environment: as ptx (TP_CUDA_DEVICE, TP_CUDA_LIB_DIR — here a ':'-separated list of folders, searched
 * for libcublasLt.so.13/.12 and libcudnn.so.9 before the loader path), TP_CUDA_FP8_ACTIVATIONS,
 * TP_CUDA_CUDNN_ATTENTION, TP_CUDA_CUDNN.
 */
import {
  PtxBackend,
  type PtxBackendOptions,
  type PtxOpHost,
  ptx,
  ptxKernelTable,
  SimCudaDriver,
} from "@tp/backend-ptx";
import {
  type AttentionParams,
  type DTypeName,
  type KernelTable,
  type Tensor,
  TpError,
  type Weight,
} from "@tp/tensor";
import { CublasLt, type GemmKind, type GemmShape, loadCublasLt, WORKSPACE_BYTES } from "./cublaslt.ts";
import { type Cudnn, convOut, loadCudnn } from "./cudnn.ts";
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
  /** cuDNN on the backend's stream, or null without libcudnn.so.9. */
  readonly cudnn: Cudnn | null;
  /** f32 attention through cuDNN with q, k, v rounded to bf16 (opt-in; see the module comment). */
  readonly cudnnF32Attention: boolean;
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

/**
 * The element type of the cuDNN attention graph for these inputs, or null for the PTX kernel (the
 * rules of the module comment's table). `f32OptIn`: f32 inputs go through bf16.
 */
export function cudnnAttentionRoute(
  dtypes: readonly [DTypeName, DTypeName, DTypeName],
  p: AttentionParams,
  sm: number,
  f32OptIn: boolean,
): "f16" | "bf16" | null {
  if (sm < 80 || p.window > 0 || p.fullPrefix > 0 || p.softcap > 0) return null;
  // qOffset < 0: the first queries see no key; with the lowest-f32 mask cuDNN would average every key there
  if (p.causal && p.qOffset < 0) return null;
  if (p.headDim !== p.headDimV || p.headDim % 8 !== 0 || p.headDim > (sm >= 90 ? 256 : 128)) return null;
  // decode: one plan per key length would be built at every step
  if (p.sq < 2 || p.skv < 1) return null;
  const [q, k, v] = dtypes;
  if (q !== k || q !== v) return null;
  if (q === "f16" || q === "bf16") return q;
  return q === "f32" && f32OptIn ? "bf16" : null;
}

type Base = KernelTable;
type Entry<K extends keyof KernelTable> = NonNullable<KernelTable[K]>;

/** `t` as a contiguous, 16-byte aligned tensor of `dtype` (itself, or a copy / conversion in the scope). */
function dense(host: CudaOpHost, base: Base, t: Tensor, dtype: DTypeName, name: string): Tensor {
  if (t.dtype === dtype && t.isContiguous && host.address(t) % 16n === 0n) return t;
  const c = host.alloc(t.shape, dtype, name);
  if (t.dtype === dtype) (base.copy as Entry<"copy">).run(c, t);
  else (base.cast as Entry<"cast">).run(c, t, false);
  return c;
}

/** A workspace of `bytes` from the allocator (in the current scope). */
function cudnnWorkspace(host: CudaOpHost, bytes: number): { ptr: bigint; bytes: number } {
  if (bytes === 0) return { ptr: 0n, bytes: 0 };
  return { ptr: host.address(host.alloc([bytes], "u8", "cudnn.workspace")), bytes };
}

/**
 * Attention through cuDNN: out [batch, heads, sq, headDim] = softmax(scale · q·kᵀ, causal mask) · v
 * with q [batch, heads, sq, headDim], k / v [batch, kvHeads, skv, headDim] (any views; copied to
 * contiguous 16-byte aligned ones, or converted to bf16 on the f32 opt-in), on the plan of the shape
 * (./cudnn.ts sdpaPlan). Returns false, having queued nothing, when {@link cudnnAttentionRoute} or
 * cuDNN's heuristics leave the shape to the PTX kernel.
 * @throws TpError naming the cuDNN call that failed (a NOT_SUPPORTED graph is not an error: false)
 */
export function cudnnAttention(
  host: CudaOpHost,
  base: Base,
  out: Tensor,
  q: Tensor,
  k: Tensor,
  v: Tensor,
  p: AttentionParams,
): boolean {
  const dnn = host.cudnn;
  if (dnn === null) return false;
  const kind = cudnnAttentionRoute([q.dtype, k.dtype, v.dtype], p, host.sm, host.cudnnF32Attention);
  if (kind === null) return false;
  const plan = dnn.sdpaPlan({
    dtype: kind,
    batch: p.batch,
    heads: p.heads,
    kvHeads: p.kvHeads,
    sq: p.sq,
    skv: p.skv,
    headDim: p.headDim,
    causal: p.causal,
  });
  if (plan === null) return false;
  host.scope(() => {
    const [qc, kc, vc] = [q, k, v].map((t, i) => dense(host, base, t, kind, `attn.${"qkv"[i]}`)) as [
      Tensor,
      Tensor,
      Tensor,
    ];
    const direct = out.dtype === kind && host.address(out) % 16n === 0n;
    const o = direct ? out : host.alloc(out.shape, kind, "attn.out");
    dnn.sdpa(
      plan,
      {
        q: host.address(qc),
        k: host.address(kc),
        v: host.address(vc),
        o: host.address(o),
        scale: p.scale,
        qOffset: p.causal ? p.qOffset : 0,
      },
      cudnnWorkspace(host, plan.workspaceBytes),
    );
    if (!direct) (base.cast as Entry<"cast">).run(out, o, false);
  });
  return true;
}

/**
 * Run a PTX entry that takes f32 only on tensors of other float dtypes: inputs converted to f32
 * (exact: f16 and bf16 are subsets of f32), the entry, the f32 result converted to out's dtype.
 */
function throughF32(
  host: CudaOpHost,
  base: Base,
  out: Tensor,
  inputs: Tensor[],
  run: (o: Tensor, xs: Tensor[]) => void,
): void {
  if (out.dtype === "f32" && inputs.every((t) => t.dtype === "f32")) {
    run(out, inputs);
    return;
  }
  host.scope(() => {
    const xs = inputs.map((t) => (t.dtype === "f32" ? t : dense(host, base, t, "f32", `${t.name}.f32`)));
    const o = out.dtype === "f32" ? out : host.alloc(out.shape, "f32", "out.f32");
    run(o, xs);
    if (o !== out) (base.cast as Entry<"cast">).run(out, o, false);
  });
}

/**
 * conv2d through cuDNN: out [n, cOut, hOut, wOut] = x [n, cIn, h, w] ⋆ weight [cOut, cIn, kh, kw]
 * (cross-correlation, zero padding, dilation 1; x and weight both f32 or both f16, any views — copied
 * to NCHW packed), then + bias [cOut] broadcast over n, h, w by the PTX add kernel (in out's dtype).
 * Returns false, having queued nothing, when the dtypes or cuDNN's heuristics leave it to the PTX kernel.
 * @throws TpError naming the cuDNN call that failed
 */
export function cudnnConv2d(
  host: CudaOpHost,
  base: Base,
  out: Tensor,
  x: Tensor,
  weight: Tensor,
  bias: Tensor | null,
  stride: readonly [number, number],
  padding: readonly [number, number],
): boolean {
  const dnn = host.cudnn;
  if (dnn === null || x.dtype !== weight.dtype || (x.dtype !== "f32" && x.dtype !== "f16")) return false;
  const dtype = x.dtype;
  const [n, cIn, h, w] = x.shape as [number, number, number, number];
  const [cOut, , kh, kw] = weight.shape as [number, number, number, number];
  if (convOut(h, kh, stride[0], padding[0]) < 1 || convOut(w, kw, stride[1], padding[1]) < 1) return false;
  const plan = dnn.convPlan({ dtype, n, cIn, h, w, cOut, kh, kw, stride, padding });
  if (plan === null) return false;
  host.scope(() => {
    const xc = dense(host, base, x, dtype, "conv.x");
    const wc = dense(host, base, weight, dtype, "conv.w");
    const direct = out.dtype === dtype && host.address(out) % 16n === 0n;
    const y = direct ? out : host.alloc(out.shape, dtype, "conv.y");
    dnn.conv(
      plan,
      { x: host.address(xc), w: host.address(wc), y: host.address(y) },
      cudnnWorkspace(host, plan.workspaceBytes),
    );
    if (!direct) (base.cast as Entry<"cast">).run(out, y, false);
    if (bias !== null) {
      // out[n, c, y, x] += bias[c]: the bias as a [1, C, 1, 1] view broadcast to out
      const b = dense(host, base, bias, out.dtype, "conv.bias");
      (base.add as Entry<"add">).run(out, out, b.reshape(1, cOut, 1, 1).broadcastTo(out.shape));
    }
  });
  return true;
}

/**
 * The ptx table with matmul taking cuBLASLt first, and attention (f32 / f16 / bf16) and conv2d
 * (f32 / f16) taking cuDNN first; what cuDNN does not take runs on the ptx entries, which are f32 only,
 * between exact conversions of the other dtypes to f32 and of the result back.
 */
export function cudaKernelTable(host: CudaOpHost, base: KernelTable): KernelTable {
  const table: { -readonly [K in keyof KernelTable]: KernelTable[K] } = { ...base };
  const m = base.matmul;
  if (m !== undefined)
    table.matmul = {
      ...m,
      run: (out, x, w, bias) => {
        if (!cublasLtMatmul(host, out, x, w, bias)) m.run(out, x, w, bias);
      },
    };
  const attn = base.attention;
  if (attn !== undefined && base.cast !== undefined && base.copy !== undefined)
    table.attention = {
      dtypes: ["f32", "f16", "bf16"],
      run: (out, q, k, v, p) => {
        if (cudnnAttention(host, base, out, q, k, v, p)) return;
        throughF32(host, base, out, [q, k, v], (o, [qf, kf, vf]) =>
          attn.run(o, qf as Tensor, kf as Tensor, vf as Tensor, p),
        );
      },
    };
  const conv = base.conv2d;
  if (conv !== undefined && base.cast !== undefined && base.copy !== undefined && base.add !== undefined)
    table.conv2d = {
      dtypes: ["f32", "f16"],
      run: (out, x, weight, bias, stride, padding) => {
        if (cudnnConv2d(host, base, out, x, weight, bias, stride, padding)) return;
        throughF32(host, base, out, bias === null ? [x, weight] : [x, weight, bias], (o, [xf, wf, bf]) =>
          conv.run(o, xf as Tensor, wf as Tensor, bf ?? null, stride, padding),
        );
      },
    };
  return table;
}

/** Options of the cuda backend: those of ptx, and the fp8 W8A8 opt-in. */
export interface CudaBackendOptions extends PtxBackendOptions {
  /** fp8 e4m3 weights as W8A8 through cuBLASLt (see the module comment); default TP_CUDA_FP8_ACTIVATIONS=1. */
  fp8Activations?: boolean;
  /** f32 attention through cuDNN in bf16 (see the module comment); default TP_CUDA_CUDNN_ATTENTION=1. */
  cudnnF32Attention?: boolean;
  /** Load cuDNN (default true; TP_CUDA_CUDNN=0 turns it off): false keeps attention and conv2d on PTX. */
  cudnn?: boolean;
}

/**
 * The cuDNN a cuda backend uses on `stream`: none on the PTX simulator (no real library can read its
 * buffers) or when turned off (`cudnn: false`, TP_CUDA_CUDNN=0), else libcudnn.so.9 when it loads
 * (./cudnn.ts loadCudnn). `missing` is the one-line reason when there is none (for an absent library:
 * its name, the places tried and how to install it).
 */
export function openCudnn(
  stream: number,
  options: { readonly cudnn?: boolean },
  env: Record<string, string | undefined>,
  simulated: boolean,
): { cudnn: Cudnn | null; missing: string | null } {
  if (simulated) return { cudnn: null, missing: "the PTX simulator has no cuDNN" };
  if (options.cudnn === false || (options.cudnn === undefined && env.TP_CUDA_CUDNN === "0"))
    return { cudnn: null, missing: "cuDNN turned off (cudnn: false or TP_CUDA_CUDNN=0)" };
  try {
    return { cudnn: loadCudnn(stream, env), missing: null };
  } catch (e) {
    return { cudnn: null, missing: e instanceof Error ? e.message : String(e) };
  }
}

/**
 * What `device` adds for the libraries: `, cuBLASLt 13.0.2, cuDNN 9.10.0`, or `…, no cuDNN (attention
 * and conv2d on PTX)`; `ltVersion` null for the cuBLASLt model of the simulator.
 */
export function librariesNote(ltVersion: number | null, cudnn: Cudnn | null): string {
  const v = ltVersion;
  const lt =
    v === null
      ? "cuBLASLt model (float64)"
      : `cuBLASLt ${Math.floor(v / 10000)}.${Math.floor((v % 10000) / 100)}.${v % 100}`;
  return `, ${lt}${cudnn === null ? ", no cuDNN (attention and conv2d on PTX)" : `, cuDNN ${cudnn.versionString()}`}`;
}

/** The cuda backend. Create it with {@link createBackend} or `loadBackend("cuda", options)`. */
export class CudaBackend extends PtxBackend implements CudaOpHost {
  readonly lt: CublasLt;
  readonly fp8Activations: boolean;
  readonly cudnnF32Attention: boolean;
  /** cuDNN when libcudnn.so.9 loads (attention and conv2d), else null. */
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
    this.cudnnF32Attention = options.cudnnF32Attention ?? env.TP_CUDA_CUDNN_ATTENTION === "1";
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
    const { cudnn, missing } = openCudnn(this.stream, options, env, sim !== null);
    this.cudnn = cudnn;
    this.cudnnMissing = missing;
    // The workspace is the backend's from the start (not the first GEMM's): ops leave memory as they found it.
    this.workspace();
    this.device += librariesNote(sim === null ? this.lt.version() : null, cudnn);
  }

  workspace(): { ptr: bigint; bytes: number } {
    if (this.#workspace === null || this.#workspace.storage.freed)
      this.#workspace = this.persist(this.alloc([WORKSPACE_BYTES], "u8", "cublaslt.workspace"));
    return { ptr: this.address(this.#workspace), bytes: WORKSPACE_BYTES };
  }

  /** Wait for queued work, release cuBLASLt's and cuDNN's plans and handles, then the ptx backend. */
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
