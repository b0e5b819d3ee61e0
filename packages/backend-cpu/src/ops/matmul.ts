/**
 * matmul of the cpu backend: y = x · Wᵀ (+ bias) for a {@link Weight} in any format of
 * {@link CPU_WEIGHT_FORMATS}, with the native kernels of native/cpu/matmul*.c (tp.h tp_cpu_matmul).
 * The weight is read in its own format straight from `Weight.data` (the mapping of the checkpoint):
 * nothing is copied or expanded per weight. Each call prepares the activations once — quantized to
 * Q8_0 / Q8_1 / Q8_K for GGUF types, rotated and quantized per row for ConvRot, rounded to bf16 for
 * bf16 and fp8 — in scratch memory the native context keeps between calls (up to 64 MiB, outside
 * the backend's memory account, like the packing panels of the GEMM).
 *
 * Q8_0 / Q4_0 weights at the AVX-512 VNNI level, for M ≤ {@link REPACK_MAX_M} (decoding, small
 * batches), when the environment has `TP_CPU_REPACK=1` (opt-in for now: the copy outlives the op, which
 * the conformance suite's "memory back where it was" check counts as a leak): on first use the weight is repacked once into 16-row interleaved blocks
 * (native/cpu/matmul.h; llama.cpp's CPU_REPACK idea) in a u8 tensor of this backend — counted in
 * `backend.memory` like any tensor, freed when the Weight object is garbage-collected or the backend
 * is disposed — and later calls read that copy (tp_cpu_matmul_repacked: the same Q8_0 activations and
 * exact int32 block sums, f32 summation order differs). When the budget has no room for the copy,
 * the weight is read unpacked.
 *
 * Numerics (the tolerances the tests state): ConvRot equals @tp/quant convRotLinear bit for bit; GGUF
 * equals ggml's integer block dot products (llm.md §2.6) up to f32 summation order; the float formats
 * differ from an f64 reference by f32 summation order (and bf16 rounding of x for bf16 / fp8).
 */
import { toArrayBuffer } from "bun:ffi";
import {
  formatShape,
  type KernelTable,
  type OpName,
  type Tensor,
  TpError,
  type Weight,
  type WeightFormat,
} from "@tp/tensor";
import { CPU_FEATURES, NATIVE_WEIGHT_FORMATS, type NativeWeight, type NativeWeightFormat } from "../ffi.ts";
import { type CpuOpHost, dense, denseOrNull, optionalRegion, region, strided } from "./common.ts";
import {
  matmulIdWeight,
  matmulRepacked,
  matmulWeight,
  type NativeRegion,
  type RepackFormat,
  repackBytes,
  repackWeight,
} from "./native.ts";

/** Largest M (activation rows) that reads a repacked Q8_0 / Q4_0 weight; larger M reads it unpacked. */
export const REPACK_MAX_M = 64;

/** Per backend: the repacked copy of each Q8_0 / Q4_0 weight (null: not repackable or no room). */
const repacked = new WeakMap<CpuOpHost, WeakMap<Weight, Tensor | null>>();
/** Frees a repacked copy when its Weight is collected (a disposed backend has freed it already). */
const repackFinalizer = new FinalizationRegistry<{ host: CpuOpHost; t: Tensor }>(({ host, t }) => {
  if (!t.storage.freed) host.free(t);
});

/**
 * The repacked copy of `w` on `host` (made on first use), or null when this weight or context has none:
 * another format, a context below the AVX-512 VNNI level, or a memory budget without room for it.
 * @throws TpError from the repack itself (a weight whose bytes do not match its shape)
 */
function repackedWeight(host: CpuOpHost, w: Weight): Tensor | null {
  if ((w.format !== "q8_0" && w.format !== "q4_0") || process.env.TP_CPU_REPACK !== "1") return null;
  const ctx = host.ctx;
  if (ctx.isa !== "avx512" || (ctx.lib.features() & CPU_FEATURES.avx512vnni) === 0) return null;
  let byWeight = repacked.get(host);
  if (byWeight === undefined) {
    byWeight = new WeakMap();
    repacked.set(host, byWeight);
  }
  const have = byWeight.get(w);
  if (have !== undefined) return have?.storage.freed ? null : have;
  const format = w.format as RepackFormat;
  const bytes = repackBytes(ctx, format, w.n, w.k);
  let t: Tensor | null = null;
  if (bytes > 0) {
    try {
      t = host.alloc([bytes], "u8", `${w.name} (repacked ${format})`);
    } catch (e) {
      if (!(e instanceof TpError && e.code === "E_OOM")) throw e;
    }
  }
  if (t !== null) {
    try {
      repackWeight(ctx, format, w.data, w.n, w.k, { ptr: host.elementPointer(t, "matmul"), bytes });
    } catch (e) {
      host.free(t);
      throw e;
    }
    repackFinalizer.register(w, { host, t });
  }
  byWeight.set(w, t);
  return t;
}

/** The weight formats matmul and embedding take on this backend. */
export const CPU_WEIGHT_FORMATS: readonly WeightFormat[] = Object.keys(
  NATIVE_WEIGHT_FORMATS,
) as WeightFormat[];

/** "weight blk.0.ffn_up.weight q4_k [N, K]" in messages. */
export function shownWeight(w: Weight): string {
  return `weight ${w.name} ${w.format} ${formatShape(w.shape)}`;
}

/**
 * The native view of a weight (the front-end has checked that it is a Weight of a format listed in
 * {@link CPU_WEIGHT_FORMATS}): format, shape, bytes, scales and rotation group.
 * @throws TpError E_UNSUPPORTED naming op, backend and format for scales the kernels do not take (a
 *   row-scaled fp8 weight, a scaled bf16 / GGUF weight)
 */
export function nativeWeight(op: OpName, w: Weight): NativeWeight {
  const format = w.format as NativeWeightFormat;
  const convrot = format === "int8_convrot" || format === "int4_convrot";
  const fp8 = format === "f8_e4m3fn" || format === "f8_e5m2";
  let scale: Float32Array | null = null;
  if (convrot) {
    scale = (w.scale as { kind: "row"; values: Float32Array }).values; // Weight checks it is [N] row scales
  } else if (w.scale !== undefined) {
    if (!fp8 || w.scale.kind !== "tensor") {
      throw new TpError(
        "E_UNSUPPORTED",
        `op ${op} on backend cpu does not support ${w.scale.kind} scales on ${format} weights (${shownWeight(w)}); ` +
          "only fp8 takes one, a per-tensor scale",
      );
    }
    scale = Float32Array.of(w.scale.value);
  }
  return { format, n: w.n, k: w.k, data: w.data, scale, group: convrot ? (w.rotationGroup as number) : 0 };
}

/** A Float32Array over `count` f32 values of a native region (empty for 0). */
export function f32View(r: NativeRegion, count: number): Float32Array {
  if (count === 0 || r.ptr === null) return new Float32Array(0);
  return new Float32Array(toArrayBuffer(r.ptr, 0, count * 4));
}

/**
 * out [..., N] = x [..., K] · Wᵀ (+ bias [N]), f32; a strided x or bias is copied first.
 * @throws TpError E_UNSUPPORTED for scales the kernels do not take; E_OOM
 */
function matmul(host: CpuOpHost, out: Tensor, x: Tensor, w: Weight, bias: Tensor | null): void {
  const op = "matmul";
  if (strided(x, bias)) {
    host.scope(() => matmul(host, out, dense(host, x, op), w, denseOrNull(host, bias, op)));
    return;
  }
  const nw = nativeWeight(op, w);
  const [n, k] = w.shape;
  let m = 1;
  for (let d = 0; d < x.rank - 1; d++) m *= x.shape[d] as number;
  const xr = region(host, x, op);
  const br = optionalRegion(host, bias, op);
  const packed = m <= REPACK_MAX_M && m * n > 0 ? repackedWeight(host, w) : null;
  if (packed !== null) {
    const pr = { ptr: host.elementPointer(packed, op), bytes: packed.byteLength };
    matmulRepacked(host.ctx, w.format as RepackFormat, xr, m, k, pr, n, br, region(host, out, op));
    return;
  }
  matmulWeight(host.ctx, xr, m, nw, br, region(host, out, op));
}

/**
 * out [T, S, N] = x [T, S or 1, K] · W_{ids[t, s]}ᵀ for a stack of `experts` weights [experts·N, K]
 * read in place (tp_cpu_matmul_id: the rows routed to each expert gathered into one GEMM over the
 * expert's sub-view of the stack, with the kernels and numbers of matmul); a strided x or ids is
 * copied first. Never reads a repacked copy.
 * @throws TpError E_ARG for an id outside [0, experts) (nothing written); E_UNSUPPORTED for scales the
 *   kernels do not take; E_OOM
 */
function matmulId(host: CpuOpHost, out: Tensor, x: Tensor, w: Weight, ids: Tensor, experts: number): void {
  const op = "matmul_id";
  if (strided(x, ids)) {
    host.scope(() => matmulId(host, out, dense(host, x, op), w, dense(host, ids, op), experts));
    return;
  }
  const [t, s] = ids.shape as [number, number];
  const nw = nativeWeight(op, w);
  matmulIdWeight(
    host.ctx,
    region(host, x, op),
    t,
    x.shape[1] as number,
    nw,
    experts,
    region(host, ids, op),
    s,
    region(host, out, op),
  );
}

/**
 * The kernel-table entries of matmul and matmul_id: f32 activations and bias, every weight format of
 * CPU_WEIGHT_FORMATS.
 */
export function matmulKernels(host: CpuOpHost): Pick<KernelTable, "matmul" | "matmul_id"> {
  return {
    matmul: {
      dtypes: ["f32"],
      weightFormats: CPU_WEIGHT_FORMATS,
      run: (out, x, w, bias) => matmul(host, out, x, w, bias),
    },
    matmul_id: {
      dtypes: ["f32"],
      weightFormats: CPU_WEIGHT_FORMATS,
      run: (out, x, w, ids, experts) => matmulId(host, out, x, w, ids, experts),
    },
  };
}
