/**
 * The kernel table of the ptx backend: each entry picks a generated kernel (./ptx), folds in the
 * call's fixed parameters, and queues it on the backend's stream. Arguments arrive checked by
 * @tp/tensor's op front-end; what is left here is what only this backend can refuse (E_UNSUPPORTED
 * naming op and reason). Scratch tensors (contiguous copies, rotated activations) live in
 * `host.scope`: their blocks return to the caching allocator at once, which is safe because every
 * kernel runs in stream order.
 *
 * Formats without an entry here (the GGUF iq* blocks but IQ4_NL / IQ4_XS, q8_1 / q8_k / tq*, ConvRot embeddings) are
 * E_UNSUPPORTED through the front-end, naming op, backend and format; ./README.md keeps the table.
 */
import {
  type AttentionParams,
  type DTypeName,
  dtypeBytes,
  type KernelTable,
  type Shape,
  type Tensor,
  TpError,
  type Weight,
  type WeightFormat,
} from "@tp/tensor";
import { fakeQuantizeQ8_0Kernel, fakeQuantizeQ8_KKernel, Q8_BLOCKS_PER_CTA } from "./ptx/activations.ts";
import { attentionKernel } from "./ptx/attention.ts";
import { CAST_FLOATS, type CastFloat, castKernel } from "./ptx/casts.ts";
import { EMBEDDING_FORMATS, MATMUL_FORMATS, MATMUL_ID_FORMATS } from "./ptx/catalogue.ts";
import {
  countNonFiniteKernel,
  ELEMENTWISE_BLOCK,
  type FloatDtype,
  type MapOp,
  mapKernel,
  moveKernel,
} from "./ptx/elementwise.ts";
import type { KernelSource } from "./ptx/emit.ts";
import {
  conv2dKernel,
  type ElementFormat,
  embeddingKernel,
  gatedDeltaNetKernel,
  ropeKernel,
  rotateKernel,
  ssmConvKernel,
} from "./ptx/gather.ts";
import {
  GEMV_WARPS,
  gemvIdKernel,
  gemvKernel,
  MMA_WARPS,
  mmaIntKernel,
  mmaKernel,
  TILE,
  tiledKernel,
} from "./ptx/matmul.ts";
import {
  MMA_TILE,
  type MmaTiledSpec,
  mmaTiledKDivisor,
  mmaTiledKernel,
  mmaTiledName,
} from "./ptx/mma-tiled.ts";
import {
  groupedKernel,
  groupedMatmulId,
  groupedMmaKernel,
  MOE_ROUTE_BLOCK,
  MOE_TILE,
  moeCountKernel,
  moeScanKernel,
  moeScatterKernel,
  moeTileBound,
} from "./ptx/moe.ts";
import {
  argmaxKernel,
  fakeQuantizeRowsKernel,
  groupNormKernel,
  layerNormKernel,
  quantizeRowsFp8Kernel,
  quantizeRowsInt4Kernel,
  quantizeRowsInt8Kernel,
  rmsNormKernel,
  softmaxKernel,
  topKKernel,
} from "./ptx/rows.ts";

/** A kernel argument by parameter name: a tensor (its device address), or a number. */
export type LaunchArg = Tensor | number | bigint;

/** The parts of PtxBackend the ops use. */
export interface PtxOpHost {
  readonly name: string;
  /** Compute capability as sm number (86, 90). */
  readonly sm: number;
  /** INT4 ConvRot through int4 activations and `mma.sync.s4` (W4A4) rather than weight-only. */
  readonly w4a4: boolean;
  /** f8_e4m3fn weights as fp8 W8A8 (x quantised per row to e4m3, `mma…e4m3`) on sm_89+ (opt-in). */
  readonly fp8Mma?: boolean;
  alloc(shape: Shape, dtype: DTypeName, name?: string): Tensor;
  upload(
    data: Float32Array | Float64Array | Int32Array | Uint8Array,
    shape: Shape,
    dtype: DTypeName,
    name?: string,
  ): Tensor;
  scope<T>(fn: () => T): T;
  /** Queue `kernel` with a grid, arguments by parameter name, and dynamic shared bytes. */
  launch(
    kernel: KernelSource,
    grid: readonly [number, number, number],
    args: Record<string, LaunchArg>,
  ): void;
  /** Fill a tensor's bytes with `value` (queued). */
  fill(t: Tensor, value: number): void;
  /** A weight's bytes on the device: the resident copy, else one uploaded for this op (in its scope). */
  weightBytes(w: Weight): Tensor;
  /** A persisted f32 [N] of a weight's scales (ConvRot's per-row ones; fp8's tensor scale repeated). */
  weightScale(w: Weight): Tensor;
  /** A kernel generated once per name. */
  kernel(name: string, make: () => KernelSource): KernelSource;
}

/** A TpError E_UNSUPPORTED for op `op` on backend ptx. */
export function unsupported(op: string, message: string): TpError {
  return new TpError("E_UNSUPPORTED", `op ${op} on backend ptx: ${message}`);
}

const FLOATS: readonly FloatDtype[] = ["f32", "f16", "bf16"];
const ALL_DTYPES: readonly DTypeName[] = [
  "f64",
  "f32",
  "f16",
  "bf16",
  "f8_e4m3fn",
  "f8_e5m2",
  "i64",
  "u64",
  "i32",
  "u32",
  "i16",
  "u16",
  "i8",
  "u8",
  "bool",
];

/**
 * Merge dimensions every operand walks contiguously and drop size-1 dimensions (fewer index
 * divisions in the strided kernels). Returns at least one dimension.
 */
export function mergeDims(
  shape: readonly number[],
  strides: readonly (readonly number[])[],
): { shape: number[]; strides: number[][] } {
  const outShape: number[] = [];
  const outStrides: number[][] = strides.map(() => []);
  for (let k = 0; k < shape.length; k++) {
    const d = shape[k] as number;
    if (d === 1) continue;
    const last = outShape.length - 1;
    if (last >= 0 && strides.every((s, i) => (outStrides[i] as number[])[last] === (s[k] as number) * d)) {
      outShape[last] = (outShape[last] as number) * d;
      strides.forEach((s, i) => {
        (outStrides[i] as number[])[last] = s[k] as number;
      });
    } else {
      outShape.push(d);
      strides.forEach((s, i) => {
        (outStrides[i] as number[]).push(s[k] as number);
      });
    }
  }
  if (outShape.length === 0) return { shape: [1], strides: strides.map(() => [0]) };
  return { shape: outShape, strides: outStrides };
}

function blocks(n: number, per: number): number {
  return Math.max(1, Math.ceil(n / per));
}

/** @throws E_UNSUPPORTED past the 32-bit indices of the kernels */
function check32(op: string, ...ts: Tensor[]): void {
  for (const t of ts) {
    if (t.numel >= 2 ** 32 || t.storage.byteLength / dtypeBytes(t.dtype) >= 2 ** 32) {
      throw unsupported(op, `${t.describe()} has 2^32 elements or more; its kernels index with 32 bits`);
    }
    if (t.strides.some((s) => s < 0)) throw unsupported(op, `${t.describe()} has a negative stride`);
  }
}

/** Queue a strided kernel over `shape`: out (contiguous unless `outStrided`) and inputs as views. */
function strided(
  host: PtxOpHost,
  op: string,
  kernel: (rank: number) => KernelSource,
  out: Tensor,
  inputs: readonly Tensor[],
  outStrided: boolean,
  extra: Record<string, LaunchArg> = {},
): void {
  check32(op, out, ...inputs);
  const n = out.numel;
  if (n === 0) return;
  const operands = [out, ...inputs];
  const { shape, strides } = mergeDims(
    out.shape,
    operands.map((t) => t.strides),
  );
  const k = kernel(shape.length);
  const args: Record<string, LaunchArg> = { ...extra, out, n };
  inputs.forEach((t, i) => {
    args[`in${i}`] = t;
  });
  shape.forEach((s, d) => {
    args[`size${d}`] = s;
  });
  operands.forEach((_, i) => {
    if (i === 0 && !outStrided) return;
    (strides[i] as number[]).forEach((s, d) => {
      args[`stride${i}_${d}`] = s;
    });
  });
  host.launch(k, [blocks(n, ELEMENTWISE_BLOCK), 1, 1], args);
}

/** A float map kernel over out and its inputs. */
function map(
  host: PtxOpHost,
  op: MapOp,
  out: Tensor,
  inputs: readonly Tensor[],
  extra: Record<string, LaunchArg> = {},
  saturate = false,
): void {
  const dts = inputs.map((t) => t.dtype as FloatDtype);
  strided(
    host,
    op,
    (rank) =>
      host.kernel(`map:${op}:${dts}:${out.dtype}:${rank}:${saturate}`, () =>
        mapKernel({ op, inputs: dts, out: out.dtype as FloatDtype, rank, saturate }),
      ),
    out,
    inputs,
    false,
    extra,
  );
}

/**
 * Weight formats whose matmul takes x quantized as ggml's `vec_dot_type`: Q8_0 per 32 (Q8_1 for Q4_1 /
 * Q5_1, whose codes and d are Q8_0's; ./ptx/activations.ts) for those and IQ4_NL, Q8_K per 256 for the
 * k-quants and IQ4_XS (@tp/quant ACTIVATION_TYPE).
 */
const Q8_0_ACTIVATIONS: ReadonlySet<string> = new Set(["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"]);
const Q8_K_ACTIVATIONS: ReadonlySet<string> = new Set(["q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs"]);

/**
 * x [rows, K] contiguous f32 → a scratch copy quantized to Q8_0 per 32 (Q8_K per 256) and dequantized
 * (ggml's activations for the GGUF weights), or x itself for other formats.
 */
function ggmlActivations(host: PtxOpHost, x: Tensor, format: string): Tensor {
  if (Q8_K_ACTIVATIONS.has(format)) {
    if (x.numel % 256 !== 0) throw unsupported("matmul", `${format}: K is not a multiple of 256`);
    const out = host.alloc(x.shape, "f32", "x_q8_k");
    const n = x.numel / 256;
    host.launch(host.kernel("fq_q8_k", fakeQuantizeQ8_KKernel), [blocks(n, Q8_BLOCKS_PER_CTA), 1, 1], {
      out,
      x,
      blocks: n,
    });
    return out;
  }
  if (!Q8_0_ACTIVATIONS.has(format)) return x;
  if (x.numel % 32 !== 0) throw unsupported("matmul", `${format}: K is not a multiple of 32`);
  const out = host.alloc(x.shape, "f32", "x_q8_0");
  const n = x.numel / 32;
  host.launch(host.kernel("fq_q8_0", fakeQuantizeQ8_0Kernel), [blocks(n, Q8_BLOCKS_PER_CTA), 1, 1], {
    out,
    x,
    blocks: n,
  });
  return out;
}

const isCastFloat = (d: DTypeName): d is CastFloat => (CAST_FLOATS as readonly string[]).includes(d);

/**
 * cast: any dtype to itself (the bits copied, as the cpu backend); between f32, f16, bf16, f8_e4m3fn and
 * f8_e5m2 through ptx/casts.ts (the cpu's rounding, overflow and NaN rules, bit for bit).
 * @throws TpError E_UNSUPPORTED for another pair (integers, f64, bool convert only to themselves)
 */
function cast(host: PtxOpHost, out: Tensor, x: Tensor, saturate: boolean): void {
  const from = x.dtype;
  const to = out.dtype;
  if (from === to) {
    move(host, out, x);
    return;
  }
  if (!isCastFloat(from) || !isCastFloat(to))
    throw unsupported(
      "cast",
      `no conversion ${from} → ${to} (between ${CAST_FLOATS.join(", ")}, or a dtype to itself)`,
    );
  const sat = saturate && (to === "f8_e4m3fn" || to === "f8_e5m2");
  strided(
    host,
    "cast",
    (rank) =>
      host.kernel(`cast:${from}:${to}:${rank}:${sat}`, () => castKernel({ from, to, rank, saturate: sat })),
    out,
    [x],
    false,
  );
}

/** Copy the elements of `src` (any view) into `dst` (any non-overlapping view), bits unchanged. */
export function move(host: PtxOpHost, dst: Tensor, src: Tensor): void {
  const bytes = dtypeBytes(src.dtype) as 1 | 2 | 4 | 8;
  const outStrided = !dst.isContiguous;
  strided(
    host,
    "copy",
    (rank) =>
      host.kernel(`move:${bytes}:${rank}:${outStrided}`, () => moveKernel({ bytes, rank, outStrided })),
    dst,
    [src],
    outStrided,
  );
}

/** `t` itself when contiguous, else a contiguous copy in the current scope. */
function contiguous(host: PtxOpHost, t: Tensor): Tensor {
  if (t.isContiguous) return t;
  const c = host.alloc(t.shape, t.dtype, t.name);
  move(host, c, t);
  return c;
}

/** Inverse frequencies of rope pairs, with freqScale folded in (f64; RoFormer §3.4, krea2.md §3.5). */
function ropeInvFreq(
  theta: number,
  ropeDims: number,
  freqScale: number,
  sections: readonly number[],
): Float64Array {
  const pairs = ropeDims / 2;
  const inv = new Float64Array(pairs);
  if (sections.length === 0)
    for (let i = 0; i < pairs; i++) inv[i] = freqScale * theta ** ((-2 * i) / ropeDims);
  else {
    let at = 0;
    for (const n of sections) for (let k = 0; k < n; k++) inv[at++] = freqScale * theta ** (-k / n);
  }
  return inv;
}

const scaledFormat = (f: WeightFormat) => f === "int8_convrot" || f === "int4_convrot";

/** From this many rows of x the shared-memory tiled mma kernels (mma-tiled.ts) replace the direct ones. */
export const MMA_TILED_MIN_M = 64;

/** Queue the tiled mma kernel for `spec` over out [M, N] with `args` (its parameters by name). */
function launchTiled(
  host: PtxOpHost,
  spec: MmaTiledSpec,
  M: number,
  N: number,
  args: Record<string, LaunchArg>,
) {
  host.launch(
    host.kernel(mmaTiledName(spec), () => mmaTiledKernel(spec)),
    [blocks(N, MMA_TILE.bn), blocks(M, MMA_TILE.bm), 1],
    args,
  );
}

/** matmul: picks W8A8 / mma / gemv / tiled for the format, M and the device. */
function matmul(host: PtxOpHost, out: Tensor, x: Tensor, w: Weight, biasView: Tensor | null): void {
  const [N, K] = w.shape;
  const M = x.numel / Math.max(1, K);
  if (out.numel === 0) return;
  if (K === 0) {
    // no terms: out [..., N] is the bias, or zeros (x has no elements, so M above is 0)
    if (biasView === null) host.fill(out, 0);
    else move(host, out, biasView.broadcastTo(out.shape));
    return;
  }
  host.scope(() => {
    const format = w.format as ElementFormat;
    // the kernels read bias[n] at n: a strided or sliced bias view is copied first
    const bias = biasView === null ? null : contiguous(host, biasView);
    let xc = contiguous(host, x);
    // the mma kernels load x in 8-byte pairs, the tiled ones in 16-byte chunks: a view starting
    // off a 4-element boundary is copied first
    if (xc.layout.offset % 4 !== 0) {
      const c = host.alloc(xc.shape, "f32", "x");
      move(host, c, xc);
      xc = c;
    }
    check32("matmul", xc, out);
    const wb = host.weightBytes(w);
    const convrot = scaledFormat(w.format);
    // ConvRot: per-row scales; fp8 scaled: one scale for the tensor (w = f32(fp8) · scale)
    const scaled = convrot || w.scale?.kind === "tensor";
    const scale = scaled ? host.weightScale(w) : null;
    if (convrot) {
      const group = w.rotationGroup ?? 256;
      if (K % group !== 0)
        throw unsupported("matmul", `${w.name}: K = ${K} is not a multiple of the rotation group ${group}`);
      const rot = host.alloc([M, K], "f32", "x_rot");
      host.launch(
        host.kernel(`rotate:${group}`, () => rotateKernel(group)),
        [K / group, M, 1],
        { out: rot, x: xc, k: K },
      );
      xc = rot;
      // integer tensor cores at every M (decode too: the weight is read once either way), W8A8 and
      // W4A4 as ComfyUI (krea2.md §1.8), bit for bit with the cpu backend and @tp/quant convRotLinear;
      // weight-only INT4 when w4a4 is off
      const bits = w.format === "int8_convrot" ? 8 : host.w4a4 ? 4 : null;
      if (bits !== null && !(K % (bits === 8 ? 32 : 64) === 0 && host.sm >= 80)) {
        // a K the mma kernels do not tile: the activations quantized and dequantized in f32, then the
        // float-x kernels below — the same W8A8 / W4A4 numbers up to f32 summation
        const fq = host.alloc([M, K], "f32", "x_fq");
        const sx = host.alloc([M], "f32", "x_scale");
        host.launch(
          host.kernel(`fake_quant${bits}`, () => fakeQuantizeRowsKernel(bits)),
          [M, 1, 1],
          {
            out: fq,
            x: rot,
            d: K,
            scales: sx,
          },
        );
        xc = fq;
      } else if (bits !== null) {
        const q = host.alloc([M, bits === 8 ? K : K / 2], bits === 8 ? "i8" : "u8", "x_q");
        const sx = host.alloc([M], "f32", "x_scale");
        const quant = bits === 8 ? quantizeRowsInt8Kernel : quantizeRowsInt4Kernel;
        host.launch(host.kernel(`quant${bits}`, quant), [M, 1, 1], { out: q, x: rot, d: K, scales: sx });
        const intArgs = {
          out,
          x: q,
          w: wb,
          ...(bias === null ? {} : { bias }),
          scale: scale as Tensor,
          m: M,
          n: N,
          k: K,
          x_scale: sx,
        };
        const operand = bits === 8 ? "s8" : "s4";
        if (M >= MMA_TILED_MIN_M && K % mmaTiledKDivisor(operand) === 0) {
          launchTiled(host, { operand, bias: bias !== null, scaled: true }, M, N, intArgs);
          return;
        }
        const k = host.kernel(`mma_s${bits}:${bias !== null}`, () => mmaIntKernel(bits, bias !== null));
        host.launch(k, [blocks(N, MMA_WARPS * 32), blocks(M, 16), 1], intArgs);
        return;
      }
    }
    xc = ggmlActivations(host, xc, format);
    const spec = { format, bias: bias !== null, scaled };
    const args: Record<string, LaunchArg> = {
      out,
      x: xc,
      w: wb,
      ...(bias === null ? {} : { bias }),
      ...(scale === null ? {} : { scale }),
      m: M,
      n: N,
      k: K,
    };
    const key = `${format}:${spec.bias}:${scaled}`;
    const half = format === "f16" || format === "bf16";
    if (half && M >= MMA_TILED_MIN_M && K % mmaTiledKDivisor(format) === 0 && host.sm >= 80) {
      launchTiled(host, { operand: format, bias: spec.bias, scaled: false }, M, N, args);
    } else if (
      format === "f8_e4m3fn" &&
      host.fp8Mma === true &&
      host.sm >= 89 &&
      M >= 16 &&
      K % mmaTiledKDivisor("e4m3") === 0
    ) {
      // fp8 W8A8 (opt-in): x quantised per row to e4m3, fp8 tensor cores
      const q = host.alloc([M, K], "f8_e4m3fn", "x_fp8");
      const sx = host.alloc([M], "f32", "x_scale");
      host.launch(host.kernel("quant_fp8", quantizeRowsFp8Kernel), [M, 1, 1], {
        out: q,
        x: xc,
        d: K,
        scales: sx,
      });
      launchTiled(host, { operand: "e4m3", bias: spec.bias, scaled }, M, N, { ...args, x: q, x_scale: sx });
    } else if (half && M >= 16 && K % 16 === 0 && host.sm >= 80) {
      host.launch(
        host.kernel(`mma:${key}`, () => mmaKernel(spec)),
        [blocks(N, MMA_WARPS * 32), blocks(M, 16), 1],
        args,
      );
    } else if (M <= 8) {
      host.launch(
        host.kernel(`gemv:${key}`, () => gemvKernel(spec)),
        [blocks(N, GEMV_WARPS), M, 1],
        args,
      );
    } else {
      host.launch(
        host.kernel(`tiled:${key}`, () => tiledKernel(spec)),
        [blocks(N, TILE.bn), blocks(M, TILE.bm), 1],
        args,
      );
    }
  });
}

/**
 * matmul_id: ConvRot experts take x rotated (and quantized as the dense matmul does: W8A8, W4A4 by
 * default), Q8_0 / Q4_0 experts x quantized as ggml's Q8_0, and the row scales (fp8: the tensor scale)
 * multiply the sums; then one GEMV per routed row, or from {@link groupedMatmulId}'s threshold the grouped path of
 * ptx/moe.ts (routing on the device, one tiled GEMM launch over all experts).
 */
function matmulId(host: PtxOpHost, out: Tensor, x: Tensor, w: Weight, ids: Tensor, experts: number): void {
  host.scope(() => {
    if (out.numel === 0) return;
    const [T, S, N] = out.shape as [number, number, number];
    const K = w.shape[1];
    const R = T * S;
    const convrot = scaledFormat(w.format);
    const scaled = convrot || w.scale?.kind === "tensor";
    if (w.scale !== undefined && !scaled)
      throw unsupported(
        "matmul_id",
        `${w.name}: ${w.format} experts with ${w.scale.kind} scales have no kernel`,
      );
    let xc = contiguous(host, x);
    check32("matmul_id", xc, out);
    if (convrot) {
      const group = w.rotationGroup ?? 256;
      if (K % group !== 0)
        throw unsupported(
          "matmul_id",
          `${w.name}: K = ${K} is not a multiple of the rotation group ${group}`,
        );
      const rows = xc.numel / K;
      const rot = host.alloc([rows, K], "f32", "x_rot");
      host.launch(
        host.kernel(`rotate:${group}`, () => rotateKernel(group)),
        [K / group, rows, 1],
        { out: rot, x: xc, k: K },
      );
      xc = rot;
      // the activations as the dense matmul's float-x kernels take them: W8A8 always, W4A4 unless
      // weight-only was asked for (quantized per row and dequantized, rows.ts fakeQuantizeRowsKernel)
      const bits = w.format === "int8_convrot" ? 8 : host.w4a4 ? 4 : null;
      if (bits !== null) {
        const fq = host.alloc([rows, K], "f32", "x_fq");
        const sx = host.alloc([rows], "f32", "x_scale");
        host.launch(
          host.kernel(`fake_quant${bits}`, () => fakeQuantizeRowsKernel(bits)),
          [rows, 1, 1],
          {
            out: fq,
            x: rot,
            d: K,
            scales: sx,
          },
        );
        xc = fq;
      }
    }
    xc = ggmlActivations(host, xc, w.format);
    const format = w.format as ElementFormat;
    const args: Record<string, LaunchArg> = {
      out,
      x: xc,
      w: host.weightBytes(w),
      ...(scaled ? { scale: host.weightScale(w) } : {}),
      m: R,
      n: N,
      k: K,
      experts,
      x_div: x.shape[1] === 1 ? S : 1,
    };
    const ic = contiguous(host, ids);
    if (!groupedMatmulId(R, experts)) {
      if (R > 65535) throw unsupported("matmul_id", `${R} routed rows past the GEMV grid's 65535`);
      const k = host.kernel(`mmid:${format}:${scaled}`, () => gemvIdKernel(format, scaled));
      host.launch(k, [blocks(N, GEMV_WARPS), R, 1], { ...args, ids: ic });
      return;
    }
    const bound = moeTileBound(R, experts);
    if (bound > 65535)
      throw unsupported(
        "matmul_id",
        `${R} routed rows over ${experts} experts: ${bound} row tiles past the grid's 65535`,
      );
    const buckets = experts + 1;
    const counts = host.alloc([buckets], "u32", "moe_counts");
    const cursor = host.alloc([buckets], "u32", "moe_cursor");
    const rowStart = host.alloc([buckets], "u32", "moe_row_start");
    const tileExpert = host.alloc([bound], "u32", "moe_tile_expert");
    const tileRow = host.alloc([bound], "u32", "moe_tile_row");
    const tiles = host.alloc([1], "u32", "moe_tiles");
    const list = host.alloc([R], "u32", "moe_list");
    host.fill(counts, 0);
    host.fill(cursor, 0);
    const routeGrid: [number, number, number] = [blocks(R, MOE_ROUTE_BLOCK), 1, 1];
    host.launch(host.kernel("moe_count", moeCountKernel), routeGrid, { ids: ic, counts, m: R, experts });
    host.launch(host.kernel("moe_scan", moeScanKernel), [1, 1, 1], {
      counts,
      row_start: rowStart,
      tile_expert: tileExpert,
      tile_row: tileRow,
      tiles,
      experts,
    });
    host.launch(host.kernel("moe_scatter", moeScatterKernel), routeGrid, {
      ids: ic,
      row_start: rowStart,
      cursor,
      list,
      m: R,
      experts,
    });
    const routing = { counts, row_start: rowStart, tile_expert: tileExpert, tile_row: tileRow, tiles, list };
    const grid: [number, number, number] = [blocks(N, MOE_TILE.bn), bound, 1];
    // f16 / bf16 on tensor cores (x rounded to the weight type, as matmul's mma kernels); the mma
    // kernel reads x in 8-byte pairs, so a view starting at an odd element is copied first
    if ((format === "f16" || format === "bf16") && K % 16 === 0 && host.sm >= 80) {
      let xm = xc;
      if (xm.layout.offset % 2 !== 0) {
        xm = host.alloc(xc.shape, "f32", "x");
        move(host, xm, xc);
      }
      const k = host.kernel(`mmid_grouped_mma:${format}`, () => groupedMmaKernel(format));
      host.launch(k, grid, { ...args, x: xm, ...routing });
      return;
    }
    const spec = { format, scaled };
    host.launch(
      host.kernel(`mmid_grouped:${format}:${scaled}`, () => groupedKernel(spec)),
      grid,
      { ...args, ...routing },
    );
  });
}

function attention(host: PtxOpHost, out: Tensor, q: Tensor, k: Tensor, v: Tensor, p: AttentionParams): void {
  if (p.batch > 65535 || p.heads > 65535)
    throw unsupported("attention", `batch ${p.batch} × heads ${p.heads} past the grid's 65535`);
  host.scope(() => {
    const [qc, kc, vc] = [q, k, v].map((t) => contiguous(host, t)) as [Tensor, Tensor, Tensor];
    check32("attention", qc, kc, vc, out);
    const spec = { headDim: p.headDim, headDimV: p.headDimV, causal: p.causal, softcap: p.softcap > 0 };
    const kern = host.kernel(`attn:${spec.headDim}:${spec.headDimV}:${spec.causal}:${spec.softcap}`, () =>
      attentionKernel(spec),
    );
    host.launch(kern, [p.sq, p.heads, p.batch], {
      out,
      q: qc,
      k: kc,
      v: vc,
      sq: p.sq,
      skv: p.skv,
      heads: p.heads,
      kv_heads: p.kvHeads,
      q_offset: p.qOffset,
      window: p.window,
      full_prefix: p.fullPrefix,
      scale: p.scale,
      softcap: p.softcap > 0 ? p.softcap : 1,
    });
  });
}

/** The table: see the module comment. */
export function ptxKernelTable(host: PtxOpHost): KernelTable {
  const unary = (op: MapOp) => ({ dtypes: FLOATS, run: (out: Tensor, x: Tensor) => map(host, op, out, [x]) });
  const binary = (op: MapOp) => ({
    dtypes: FLOATS,
    run: (out: Tensor, a: Tensor, b: Tensor) => map(host, op, out, [a, b]),
  });
  return {
    matmul: {
      dtypes: ["f32"],
      weightFormats: MATMUL_FORMATS,
      run: (out, x, w, bias) => matmul(host, out, x, w, bias),
    },
    matmul_id: {
      dtypes: ["f32"],
      weightFormats: MATMUL_ID_FORMATS,
      run: (out, x, w, ids, experts) => matmulId(host, out, x, w, ids, experts),
    },
    attention: { dtypes: ["f32"], run: (out, q, k, v, p) => attention(host, out, q, k, v, p) },
    rms_norm: {
      dtypes: ["f32"],
      run: (out, x, weight, eps, unitOffset) =>
        host.scope(() => {
          // no rows, or rows of 0 values: nothing to write (the grid would be empty)
          if (out.numel === 0) return;
          const d = x.shape[x.rank - 1] as number;
          const xc = contiguous(host, x);
          const kind = weight === null ? "none" : unitOffset ? "unit_offset" : "weight";
          const w = weight === null ? null : contiguous(host, weight);
          host.launch(
            host.kernel(`rms:${kind}`, () => rmsNormKernel(kind)),
            [xc.numel / d, 1, 1],
            {
              out,
              x: xc,
              d,
              ...(w === null ? {} : { w }),
              eps,
            },
          );
        }),
    },
    layer_norm: {
      dtypes: ["f32"],
      run: (out, x, weight, bias, eps) =>
        host.scope(() => {
          if (out.numel === 0) return;
          const d = x.shape[x.rank - 1] as number;
          const xc = contiguous(host, x);
          const w = weight === null ? null : contiguous(host, weight);
          const b = bias === null ? null : contiguous(host, bias);
          const k = host.kernel(`ln:${w !== null}:${b !== null}`, () =>
            layerNormKernel(w !== null, b !== null),
          );
          host.launch(k, [x.numel / d, 1, 1], {
            out,
            x: xc,
            d,
            ...(w ? { w } : {}),
            ...(b ? { b } : {}),
            eps,
          });
        }),
    },
    group_norm: {
      dtypes: ["f32"],
      run: (out, x, groups, weight, bias, eps) =>
        host.scope(() => {
          if (out.numel === 0) return;
          const [batch, channels] = x.shape as [number, number];
          const spatial = x.numel / Math.max(1, batch * channels);
          const xc = contiguous(host, x);
          const w = weight === null ? null : contiguous(host, weight);
          const b = bias === null ? null : contiguous(host, bias);
          const k = host.kernel(`gn:${w !== null}:${b !== null}`, () =>
            groupNormKernel(w !== null, b !== null),
          );
          host.launch(k, [batch * groups, 1, 1], {
            out,
            x: xc,
            d: (channels / groups) * spatial,
            spatial,
            groups,
            cpg: channels / groups,
            ...(w ? { w } : {}),
            ...(b ? { b } : {}),
            eps,
          });
        }),
    },
    rope: {
      dtypes: ["f32"],
      run: (out, x, positions, mode, theta, ropeDims, freqScale, sections) =>
        host.scope(() => {
          const [, seq, heads, headDim] = x.shape as [number, number, number, number];
          const xc = contiguous(host, x);
          const pc = contiguous(host, positions);
          const spec = { mode, ropeDims, sections };
          // Uploaded per call (a few hundred bytes, freed with the scope): a cached table would stay
          // in the backend's memory past the op.
          const freqs = ropeInvFreq(theta, ropeDims, freqScale, sections);
          const inv = host.upload(freqs, [freqs.length], "f64", "rope.inv_freq");
          host.launch(
            host.kernel(`rope:${mode}:${ropeDims}:${sections}`, () => ropeKernel(spec)),
            [blocks(out.numel, ELEMENTWISE_BLOCK), 1, 1],
            {
              out,
              x: xc,
              positions: pc,
              inv_freq: inv,
              n: out.numel,
              head_dim: headDim,
              heads,
              seq_len: seq,
            },
          );
        }),
    },
    silu: unary("silu"),
    gelu: {
      dtypes: FLOATS,
      run: (out, x, approximate) => map(host, approximate === "tanh" ? "gelu_tanh" : "gelu", out, [x]),
    },
    sigmoid: unary("sigmoid"),
    softplus: unary("softplus"),
    swiglu: binary("swiglu"),
    softmax: {
      dtypes: ["f32"],
      run: (out, x, dim) =>
        host.scope(() => {
          if (out.numel === 0) return;
          const last = x.rank - 1;
          const xt = dim === last ? x : x.transpose(dim, last);
          const xc = contiguous(host, xt);
          const d = xt.shape[last] as number;
          const target = dim === last ? out : host.alloc(xt.shape, "f32", "softmax");
          host.launch(host.kernel("softmax", softmaxKernel), [x.numel / d, 1, 1], { out: target, x: xc, d });
          if (target !== out) move(host, out.transpose(dim, last), target);
        }),
    },
    add: binary("add"),
    sub: binary("sub"),
    mul: binary("mul"),
    scale: { dtypes: FLOATS, run: (out, x, s) => map(host, "scale", out, [x], { s }) },
    modulate: { dtypes: FLOATS, run: (out, x, sc, sh) => map(host, "modulate", out, [x, sc, sh]) },
    embedding: {
      dtypes: ["f32"],
      weightFormats: EMBEDDING_FORMATS,
      run: (out, table, ids) =>
        host.scope(() => {
          const [vocab, d] = table.shape;
          const ic = contiguous(host, ids);
          const k = host.kernel(`emb:${table.format}`, () => embeddingKernel(table.format as ElementFormat));
          host.launch(k, [blocks(out.numel, ELEMENTWISE_BLOCK), 1, 1], {
            out,
            table: host.weightBytes(table),
            ids: ic,
            n: out.numel,
            d,
            vocab,
          });
          if (table.scale?.kind === "tensor") map(host, "scale", out, [out], { s: table.scale.value });
          else if (table.scale !== undefined)
            throw unsupported(
              "embedding",
              `${table.name}: per-row scaled ${table.format} tables have no kernel yet`,
            );
        }),
    },
    conv2d: {
      dtypes: ["f32"],
      run: (out, x, weight, bias, stride, padding) =>
        host.scope(() => {
          const [, cin, h, wIn] = x.shape as [number, number, number, number];
          const [cout, , kh, kw] = weight.shape as [number, number, number, number];
          const [, , ho, wo] = out.shape as [number, number, number, number];
          const spec = { kh, kw, stride, padding, bias: bias !== null };
          const xc = contiguous(host, x);
          const wc = contiguous(host, weight);
          const bc = bias === null ? null : contiguous(host, bias);
          check32("conv2d", xc, wc, out);
          host.launch(
            host.kernel(`conv:${kh}:${kw}:${stride}:${padding}:${spec.bias}`, () => conv2dKernel(spec)),
            [blocks(out.numel, ELEMENTWISE_BLOCK), 1, 1],
            {
              out,
              x: xc,
              w: wc,
              ...(bc ? { bias: bc } : {}),
              n: out.numel,
              c_in: cin,
              h,
              w_in: wIn,
              c_out: cout,
              h_out: ho,
              w_out: wo,
            },
          );
        }),
    },
    upsample_nearest2d: {
      dtypes: ALL_DTYPES,
      run: (out, x, factor) => {
        // out[..., y, x] = x[..., y / f, x / f]: a copy of the broadcast view [..., H, f, W, f]
        const lead = x.shape.slice(0, -2);
        const [H, W] = x.shape.slice(-2) as [number, number];
        const [sH, sW] = x.strides.slice(-2) as [number, number];
        const view = x.view({
          shape: [...lead, H, factor, W, factor],
          strides: [...x.strides.slice(0, -2), sH, 0, sW, 0],
          offset: x.layout.offset,
        });
        move(host, out.reshape(...view.shape), view);
      },
    },
    concat: {
      dtypes: ALL_DTYPES,
      run: (out, inputs, dim) => {
        // an empty result (a 0 dimension other than dim): nothing to move — and a slice of its 0-byte
        // storage at an offset is refused by the view check
        if (out.numel === 0) return;
        let at = 0;
        for (const t of inputs) {
          const n = t.shape[dim] as number;
          if (n > 0) move(host, out.slice(dim, at, at + n), t);
          at += n;
        }
      },
    },
    slice: { dtypes: ALL_DTYPES, run: (out, view) => move(host, out, view) },
    copy: { dtypes: ALL_DTYPES, run: (out, x) => move(host, out, x) },
    set: { dtypes: ALL_DTYPES, run: (dst, src) => move(host, dst, src) },
    cast: { dtypes: ALL_DTYPES, run: (out, x, saturate) => cast(host, out, x, saturate) },
    argmax: {
      dtypes: ["f32"],
      run: (out, x) =>
        host.scope(() => {
          const d = x.shape[x.rank - 1] as number;
          const xc = contiguous(host, x);
          if (out.numel > 0)
            host.launch(host.kernel("argmax", argmaxKernel), [out.numel, 1, 1], { out, x: xc, d });
        }),
    },
    top_k: {
      dtypes: ["f32"],
      run: (values, indices, x, k) =>
        host.scope(() => {
          if (values.numel === 0) return;
          const d = x.shape[x.rank - 1] as number;
          const xc = contiguous(host, x);
          host.launch(host.kernel("top_k", topKKernel), [values.numel / k, 1, 1], {
            out: values,
            x: xc,
            d,
            indices,
            k,
          });
        }),
    },
    count_nonfinite: {
      dtypes: ["f32"],
      run: (out, x) =>
        host.scope(() => {
          const xc = contiguous(host, x);
          check32("count_nonfinite", xc);
          if (xc.numel >= 2 ** 31)
            throw unsupported("count_nonfinite", `${x.describe()}: 2^31 elements or more`);
          host.fill(out, 0);
          if (xc.numel > 0)
            host.launch(
              host.kernel("count_nonfinite", countNonFiniteKernel),
              [blocks(xc.numel, ELEMENTWISE_BLOCK), 1, 1],
              {
                out,
                in0: xc,
                n: xc.numel,
              },
            );
        }),
    },
    gated_delta_net: {
      dtypes: ["f32"],
      run: (out, q, k, v, g, beta, state, scale) =>
        host.scope(() => {
          // chunk: the chunked form is the same function up to rounding; this runs token by token
          const [n, hk, dk] = q.shape as [number, number, number];
          const [, hv, dv] = v.shape as [number, number, number];
          const [qc, kc, vc, gc, bc] = [q, k, v, g, beta].map((t) => contiguous(host, t)) as Tensor[];
          check32("gated_delta_net", state, out);
          if (hv > 65535) throw unsupported("gated_delta_net", `${hv} value heads: past the grid's 65535`);
          host.launch(host.kernel("gdn", gatedDeltaNetKernel), [blocks(dv, ELEMENTWISE_BLOCK / 2), hv, 1], {
            out,
            q: qc as Tensor,
            k: kc as Tensor,
            v: vc as Tensor,
            g: gc as Tensor,
            beta: bc as Tensor,
            state,
            n,
            hk,
            hv,
            dk,
            dv,
            scale,
          });
        }),
    },
    ssm_conv: {
      dtypes: ["f32"],
      run: (out, x, weight) =>
        host.scope(() => {
          if (out.numel === 0) return;
          const [c, taps] = weight.shape as [number, number];
          const xc = contiguous(host, x);
          const wc = contiguous(host, weight);
          host.launch(
            host.kernel(`ssm_conv:${taps}`, () => ssmConvKernel(taps)),
            [blocks(out.numel, ELEMENTWISE_BLOCK), 1, 1],
            {
              out,
              x: xc,
              w: wc,
              n: out.numel,
              c,
            },
          );
        }),
    },
  };
}
