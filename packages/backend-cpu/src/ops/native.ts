/**
 * Checked wrappers of the op kernels of libtp_cpu.so (symbols in `../symbols.ts`, loaded by
 * `../ffi.ts`, whose checks they share). Each wrapper checks, before anything crosses bun:ffi, that every count is a
 * non-negative safe integer (and every `int32_t` argument an integer of its range: bun:ffi would wrap
 * it modulo 2^32), that every region holds what the kernel will touch (for strided views:
 * the farthest element the strides reach), that f32 / i32 pointers are 4-byte aligned and that no
 * pointer is null where elements are read; then it calls the kernel and turns its status into a
 * TpError with {@link check}. The native side checks its arguments again.
 *
 * Ownership (tp.h): the caller owns every region; native code keeps no pointer after a call.
 */

import { ptr } from "bun:ffi";
import { type AttentionParams, TpError } from "@tp/tensor";
import {
  check,
  checkInt32,
  checkName,
  checkCount as count,
  NATIVE_WEIGHT_FORMATS,
  type NativeContext,
  type NativeWeight,
  NORM_UNIT_OFFSET,
  type Pointer,
  ROPE_MODES,
  weightFormatCode,
} from "../ffi.ts";

/** Native memory a kernel may touch: the address of the first element and the bytes available from it. */
export interface NativeRegion {
  /** Address of the first element; null only when nothing is read or written. */
  readonly ptr: Pointer | null;
  /** Bytes readable / writable from `ptr` onward. */
  readonly bytes: number;
}

/** Highest rank of the strided kernels (tp.h: rank <= 16). */
export const MAX_RANK = 16;

/** Check that `r` holds `bytes` bytes aligned to `align`; returns the pointer (null when bytes is 0). */
function region(op: string, name: string, r: NativeRegion, bytes: number, align: number): Pointer | null {
  if (bytes === 0) return r.ptr;
  if (r.ptr === null) throw new TpError("E_ARG", `${op}: ${name} is null but ${bytes} bytes are needed`);
  if (!Number.isSafeInteger(r.bytes) || r.bytes < bytes) {
    throw new TpError("E_ARG", `${op}: ${name} holds ${r.bytes} bytes, ${bytes} are needed`);
  }
  if (r.ptr % align !== 0) throw new TpError("E_ARG", `${op}: ${name} is not aligned to ${align} bytes`);
  return r.ptr;
}

/** An optional region (null: the kernel gets NULL). */
function optRegion(op: string, name: string, r: NativeRegion | null, bytes: number): Pointer | null {
  return r === null ? null : region(op, name, r, bytes, 4);
}

/**
 * Check a strided view: rank, non-negative integer strides, and that the farthest element it reaches
 * lies inside `r`. Returns the elements available from the pointer and the strides as i64.
 */
function strided(
  op: string,
  name: string,
  r: NativeRegion,
  elemBytes: number,
  shape: readonly number[],
  strides: readonly number[],
): { ptr: Pointer | null; len: number; strides: Uint32Array } {
  if (strides.length !== shape.length) {
    throw new TpError("E_ARG", `${op}: ${name} has ${strides.length} strides for rank ${shape.length}`);
  }
  let last = 0;
  let empty = false;
  for (let d = 0; d < shape.length; d++) {
    const n = count(op, "shape", shape[d] as number);
    const s = strides[d] as number;
    if (!Number.isSafeInteger(s) || s < 0) {
      throw new TpError("E_ARG", `${op}: ${name} stride must be a non-negative safe integer, got ${s}`);
    }
    if (n === 0) empty = true;
    else last += (n - 1) * s;
  }
  const ptr = region(op, name, r, empty ? 0 : (last + 1) * elemBytes, elemBytes);
  return {
    ptr,
    len: Math.floor(r.bytes / elemBytes),
    strides: i64Words(strides),
  };
}

/**
 * Non-negative integers below 2^53 as the little-endian 32-bit words of an int64_t array (what a
 * native `const int64_t *` reads): no BigInt per value.
 */
function i64Words(values: readonly number[]): Uint32Array {
  const out = new Uint32Array(2 * values.length);
  for (let i = 0; i < values.length; i++) {
    const v = values[i] as number;
    out[2 * i] = v % 0x1_0000_0000;
    out[2 * i + 1] = Math.floor(v / 0x1_0000_0000);
  }
  return out;
}

function shapeArg(op: string, shape: readonly number[]): Uint32Array {
  if (shape.length > MAX_RANK) throw new TpError("E_ARG", `${op}: rank ${shape.length} is above ${MAX_RANK}`);
  for (let d = 0; d < shape.length; d++) count(op, "shape", shape[d] as number);
  return i64Words(shape);
}

function product(op: string, ...dims: number[]): number {
  let n = 1;
  for (const d of dims) n *= count(op, "size", d);
  if (!Number.isSafeInteger(n)) throw new TpError("E_ARG", `${op}: ${dims.join(" × ")} is too large`);
  return n;
}

/**
 * dst[i] = src[i] over `shape`, elements of 1, 2, 4 or 8 bytes (tp_cpu_copy).
 * @param op the op named in errors (default "copy"; slice, concat, set and the scratch copies of other
 *   ops pass their own)
 * @throws TpError E_ARG naming `op` for a rank above {@link MAX_RANK}, another element size, bad
 *   strides or a view that reaches past its region
 */
export function copyStrided(
  ctx: NativeContext,
  src: NativeRegion,
  srcStrides: readonly number[],
  dst: NativeRegion,
  dstStrides: readonly number[],
  shape: readonly number[],
  elemBytes: 1 | 2 | 4 | 8,
  op = "copy",
): void {
  if (elemBytes !== 1 && elemBytes !== 2 && elemBytes !== 4 && elemBytes !== 8) {
    throw new TpError("E_ARG", `${op}: elements of ${elemBytes} bytes; the copy kernel moves 1, 2, 4 or 8`);
  }
  const dims = shapeArg(op, shape);
  const s = strided(op, "src", src, elemBytes, shape, srcStrides);
  const d = strided(op, "dst", dst, elemBytes, shape, dstStrides);
  const raw = ctx.lib.raw;
  check(
    ctx,
    raw.tp_cpu_copy(
      ctx.handle,
      s.ptr,
      s.len,
      s.strides,
      d.ptr,
      d.len,
      d.strides,
      dims,
      shape.length,
      elemBytes,
    ),
  );
}

/** Unary f32 kernels over n contiguous elements. */
export type UnaryKernel = "silu" | "sigmoid" | "gelu_erf" | "gelu_tanh";

/** y = f(x) over n f32 elements (tp_cpu_silu_f32, tp_cpu_sigmoid_f32, tp_cpu_gelu_f32). */
export function unary(
  ctx: NativeContext,
  kernel: UnaryKernel,
  x: NativeRegion,
  y: NativeRegion,
  n: number,
): void {
  const op = kernel;
  const bytes = count(op, "n", n) * 4;
  const px = region(op, "x", x, bytes, 4);
  const py = region(op, "y", y, bytes, 4);
  const raw = ctx.lib.raw;
  const h = ctx.handle;
  const status =
    kernel === "silu"
      ? raw.tp_cpu_silu_f32(h, px, py, n)
      : kernel === "sigmoid"
        ? raw.tp_cpu_sigmoid_f32(h, px, py, n)
        : raw.tp_cpu_gelu_f32(h, px, py, n, kernel === "gelu_tanh" ? 1 : 0);
  check(ctx, status);
}

/** y = x · s over n f32 elements (tp_cpu_scale_f32; s is rounded to f32). */
export function scaleF32(ctx: NativeContext, x: NativeRegion, y: NativeRegion, n: number, s: number): void {
  const bytes = count("scale", "n", n) * 4;
  const px = region("scale", "x", x, bytes, 4);
  const py = region("scale", "y", y, bytes, 4);
  check(ctx, ctx.lib.raw.tp_cpu_scale_f32(ctx.handle, px, py, n, s));
}

/** y = silu(gate) · up over n f32 elements (tp_cpu_swiglu_f32). */
export function swigluF32(
  ctx: NativeContext,
  gate: NativeRegion,
  up: NativeRegion,
  y: NativeRegion,
  n: number,
): void {
  const bytes = count("swiglu", "n", n) * 4;
  const pg = region("swiglu", "gate", gate, bytes, 4);
  const pu = region("swiglu", "up", up, bytes, 4);
  const py = region("swiglu", "y", y, bytes, 4);
  check(ctx, ctx.lib.raw.tp_cpu_swiglu_f32(ctx.handle, pg, pu, py, n));
}

/** A strided f32 operand: its region and element strides over the output shape (0 where broadcast). */
export interface StridedOperand {
  readonly region: NativeRegion;
  readonly strides: readonly number[];
}

/** out (contiguous) = a ∘ b over `shape` (tp_cpu_add_f32 / sub / mul). */
export function binaryF32(
  ctx: NativeContext,
  op: "add" | "sub" | "mul",
  a: StridedOperand,
  b: StridedOperand,
  out: NativeRegion,
  shape: readonly number[],
): void {
  const dims = shapeArg(op, shape);
  const sa = strided(op, "a", a.region, 4, shape, a.strides);
  const sb = strided(op, "b", b.region, 4, shape, b.strides);
  const po = region(op, "out", out, product(op, ...shape) * 4, 4);
  const raw = ctx.lib.raw;
  const fn = op === "add" ? raw.tp_cpu_add_f32 : op === "sub" ? raw.tp_cpu_sub_f32 : raw.tp_cpu_mul_f32;
  check(ctx, fn(ctx.handle, sa.ptr, sa.len, sa.strides, sb.ptr, sb.len, sb.strides, po, dims, shape.length));
}

/** out (contiguous) = x · (1 + scale) + shift over `shape` (tp_cpu_modulate_f32). */
export function modulateF32(
  ctx: NativeContext,
  x: StridedOperand,
  scale: StridedOperand,
  shift: StridedOperand,
  out: NativeRegion,
  shape: readonly number[],
): void {
  const op = "modulate";
  const dims = shapeArg(op, shape);
  const sx = strided(op, "x", x.region, 4, shape, x.strides);
  const ss = strided(op, "scale", scale.region, 4, shape, scale.strides);
  const sh = strided(op, "shift", shift.region, 4, shape, shift.strides);
  const po = region(op, "out", out, product(op, ...shape) * 4, 4);
  check(
    ctx,
    ctx.lib.raw.tp_cpu_modulate_f32(
      ctx.handle,
      sx.ptr,
      sx.len,
      sx.strides,
      ss.ptr,
      ss.len,
      ss.strides,
      sh.ptr,
      sh.len,
      sh.strides,
      po,
      dims,
      shape.length,
    ),
  );
}

/** Softmax over the middle axis of [outer, dim, inner] f32 (tp_cpu_softmax_f32). */
export function softmaxF32(
  ctx: NativeContext,
  x: NativeRegion,
  y: NativeRegion,
  outer: number,
  dim: number,
  inner: number,
): void {
  const bytes = product("softmax", outer, dim, inner) * 4;
  const px = region("softmax", "x", x, bytes, 4);
  const py = region("softmax", "y", y, bytes, 4);
  check(ctx, ctx.lib.raw.tp_cpu_softmax_f32(ctx.handle, px, py, outer, dim, inner));
}

/** RMSNorm of rows × dim f32 (tp_cpu_rms_norm_f32); weight [dim] or null. */
export function rmsNormF32(
  ctx: NativeContext,
  x: NativeRegion,
  weight: NativeRegion | null,
  y: NativeRegion,
  rows: number,
  dim: number,
  eps: number,
  unitOffset: boolean,
): void {
  const op = "rms_norm";
  const bytes = product(op, rows, dim) * 4;
  const px = region(op, "x", x, bytes, 4);
  const pw = optRegion(op, "weight", weight, dim * 4);
  const py = region(op, "y", y, bytes, 4);
  const flags = unitOffset ? NORM_UNIT_OFFSET : 0;
  check(ctx, ctx.lib.raw.tp_cpu_rms_norm_f32(ctx.handle, px, pw, py, rows, dim, eps, flags));
}

/** LayerNorm of rows × dim f32 (tp_cpu_layer_norm_f32); weight, bias [dim] or null. */
export function layerNormF32(
  ctx: NativeContext,
  x: NativeRegion,
  weight: NativeRegion | null,
  bias: NativeRegion | null,
  y: NativeRegion,
  rows: number,
  dim: number,
  eps: number,
): void {
  const op = "layer_norm";
  const bytes = product(op, rows, dim) * 4;
  const px = region(op, "x", x, bytes, 4);
  const pw = optRegion(op, "weight", weight, dim * 4);
  const pb = optRegion(op, "bias", bias, dim * 4);
  const py = region(op, "y", y, bytes, 4);
  check(ctx, ctx.lib.raw.tp_cpu_layer_norm_f32(ctx.handle, px, pw, pb, py, rows, dim, eps));
}

/** GroupNorm of [batch, channels, spatial] f32 (tp_cpu_group_norm_f32); weight, bias [channels] or null. */
export function groupNormF32(
  ctx: NativeContext,
  x: NativeRegion,
  weight: NativeRegion | null,
  bias: NativeRegion | null,
  y: NativeRegion,
  dims: { batch: number; channels: number; spatial: number; groups: number },
  eps: number,
): void {
  const op = "group_norm";
  const bytes = product(op, dims.batch, dims.channels, dims.spatial) * 4;
  const px = region(op, "x", x, bytes, 4);
  const pw = optRegion(op, "weight", weight, dims.channels * 4);
  const pb = optRegion(op, "bias", bias, dims.channels * 4);
  const py = region(op, "y", y, bytes, 4);
  count(op, "groups", dims.groups);
  check(
    ctx,
    ctx.lib.raw.tp_cpu_group_norm_f32(
      ctx.handle,
      px,
      pw,
      pb,
      py,
      dims.batch,
      dims.channels,
      dims.spatial,
      dims.groups,
      eps,
    ),
  );
}

/** Arguments of {@link ropeF32} besides the buffers. */
export interface RopeDims {
  readonly batch: number;
  readonly seq: number;
  readonly heads: number;
  readonly headDim: number;
  /** Section sizes in pairs ([] for one section). */
  readonly sections: readonly number[];
  readonly ropeDims: number;
  /** 0: neox, 1: interleaved (tp.h TP_ROPE_*). */
  readonly mode: 0 | 1;
  readonly theta: number;
  readonly freqScale: number;
}

/**
 * RoPE on [batch, seq, heads, head_dim] f32 with i32 positions [axes, seq] (tp_cpu_rope_f32).
 * @throws TpError E_ARG for short regions, bad counts, a ropeDims or section outside [0, 2^31 − 1],
 *   more than 64 sections or a mode other than 0 / 1 (the native check names the rest)
 */
export function ropeF32(
  ctx: NativeContext,
  x: NativeRegion,
  positions: NativeRegion,
  y: NativeRegion,
  d: RopeDims,
): void {
  const op = "rope";
  const bytes = product(op, d.batch, d.seq, d.heads, d.headDim) * 4;
  const px = region(op, "x", x, bytes, 4);
  const py = region(op, "y", y, bytes, 4);
  const axes = Math.max(1, d.sections.length);
  const pp = region(op, "positions", positions, bytes === 0 ? 0 : product(op, axes, d.seq) * 4, 4);
  if (d.mode !== ROPE_MODES.neox && d.mode !== ROPE_MODES.interleaved) {
    throw new TpError("E_ARG", `${op}: mode must be 0 (neox) or 1 (interleaved), got ${d.mode}`);
  }
  if (d.sections.length > 64) {
    throw new TpError("E_ARG", `${op}: at most 64 sections, got ${d.sections.length}`);
  }
  const sections =
    d.sections.length === 0 ? null : Int32Array.from(d.sections, (s) => checkInt32(op, "section", s));
  const ropeDims = checkInt32(op, "ropeDims", d.ropeDims);
  check(
    ctx,
    ctx.lib.raw.tp_cpu_rope_f32(
      ctx.handle,
      px,
      py,
      d.batch,
      d.seq,
      d.heads,
      d.headDim,
      pp,
      sections,
      sections === null ? 0 : sections.length,
      ropeDims,
      d.mode,
      d.theta,
      d.freqScale,
    ),
  );
}

/**
 * A rank-4 f32 view [batch, heads, rows, dim] for {@link attentionF32}: the region from its first
 * element, and its element strides (4 values, non-negative; the last must be 1).
 */
export interface AttentionView {
  readonly region: NativeRegion;
  readonly strides: readonly number[];
}

/** Names of the dimensions of an {@link AttentionView}, for messages. */
const ATTENTION_DIMS = ["batch", "heads", "seq", "dim"] as const;

/** The largest stride tp_cpu_attention_strided_f32 takes (2^40 elements). */
const MAX_ATTENTION_STRIDE = 2 ** 40;

/**
 * Tiled online-softmax attention on strided f32 views, read and written in place
 * (tp_cpu_attention_strided_f32) with the sizes and options `d` of the op ({@link AttentionParams}):
 * q [batch, heads, sq, headDim], k [batch, kvHeads, skv, headDim],
 * v [batch, kvHeads, skv, headDimV] → out [batch, heads, sq, headDimV] (any strides whose last is 1).
 * The stride of a dimension of size 1 is never used and is passed as 0 (a view may hold any value
 * there, e.g. 2^52).
 * @throws TpError E_ARG when a stride is not a non-negative integer or is above 2^40 (naming the
 *   tensor and dimension), a last stride is not 1, a view reaches past its region or is misaligned,
 *   or a count is bad; the native checks (out overlapping an input, out strides that alias) as E_ARG
 *   from {@link check}
 */
export function attentionF32(
  ctx: NativeContext,
  q: AttentionView,
  k: AttentionView,
  v: AttentionView,
  out: AttentionView,
  d: AttentionParams,
): void {
  const op = "attention";
  const views: [string, AttentionView, number[]][] = [
    ["q", q, [d.batch, d.heads, d.sq, d.headDim]],
    ["k", k, [d.batch, d.kvHeads, d.skv, d.headDim]],
    ["v", v, [d.batch, d.kvHeads, d.skv, d.headDimV]],
    ["out", out, [d.batch, d.heads, d.sq, d.headDimV]],
  ];
  const ptrs: (Pointer | null)[] = [];
  const lens = new Uint32Array(8); // uint64_t [4]
  const strides = new Uint32Array(24); // int64_t [4][3]
  views.forEach(([name, view, shape], i) => {
    if (view.strides.length !== 4 || (view.strides[3] !== 1 && (shape[3] as number) > 1)) {
      throw new TpError(
        "E_ARG",
        `${op}: ${name} strides [${view.strides.join(", ")}] must be 4 with a last stride of 1`,
      );
    }
    const st = [0, 0, 0, 1];
    for (let a = 0; a < 3; a++) {
      const s = view.strides[a] as number;
      if ((shape[a] as number) <= 1) continue; // never multiplied by a non-zero index
      if (Number.isSafeInteger(s) && s > MAX_ATTENTION_STRIDE) {
        throw new TpError(
          "E_ARG",
          `${op}: ${name} stride ${s} of dimension ${a} (${ATTENTION_DIMS[a]}, size ${shape[a]}) is above 2^40`,
        );
      }
      st[a] = s;
    }
    const sv = strided(op, name, view.region, 4, shape, st);
    ptrs.push(sv.ptr);
    lens[2 * i] = sv.len % 0x1_0000_0000;
    lens[2 * i + 1] = Math.floor(sv.len / 0x1_0000_0000);
    // word by word: a subarray of a small typed array first moves its elements into an ArrayBuffer of
    // their own (bun / JavaScriptCore), ~10 µs per attention call here
    for (let j = 0; j < 6; j++) strides[6 * i + j] = sv.strides[j] as number;
  });
  if (!Number.isSafeInteger(d.qOffset))
    throw new TpError("E_ARG", `${op}: qOffset ${d.qOffset} is not an integer`);
  check(
    ctx,
    ctx.lib.raw.tp_cpu_attention_strided_f32(
      ctx.handle,
      ptrs[0] as Pointer | null,
      ptrs[1] as Pointer | null,
      ptrs[2] as Pointer | null,
      ptrs[3] as Pointer | null,
      lens,
      strides,
      count(op, "batch", d.batch),
      count(op, "heads", d.heads),
      count(op, "kvHeads", d.kvHeads),
      count(op, "sq", d.sq),
      count(op, "skv", d.skv),
      count(op, "headDim", d.headDim),
      count(op, "headDimV", d.headDimV),
      d.scale,
      d.qOffset,
      d.causal ? 1 : 0,
      count(op, "window", d.window),
      count(op, "fullPrefix", d.fullPrefix),
      d.softcap,
    ),
  );
}

/** Sizes of {@link conv2dF32}; the output size follows from them ({@link conv2dOutputSize}). */
export interface Conv2dDims {
  readonly batch: number;
  readonly cIn: number;
  readonly h: number;
  readonly w: number;
  readonly cOut: number;
  readonly kh: number;
  readonly kw: number;
  readonly stride: readonly [number, number];
  readonly padding: readonly [number, number];
}

/**
 * The output size [oh, ow] of tp_cpu_conv2d_f32, by the formula of native/cpu/conv2d.c:
 * oh = ⌊(h + 2·ph − kh) / sh⌋ + 1 (ow likewise), after checking what the kernel checks: stride an
 * integer in [1, 2^31 − 1], padding in [0, 2^31 − 1] (int32_t arguments), h, w, kh, kw non-negative
 * safe integers, and a kernel of at least 1×1 that fits the padded input.
 * @throws TpError E_ARG naming "conv2d" and the argument
 */
export function conv2dOutputSize(d: Conv2dDims): [number, number] {
  const op = "conv2d";
  const [sh, sw] = [checkInt32(op, "stride[0]", d.stride[0], 1), checkInt32(op, "stride[1]", d.stride[1], 1)];
  const [ph, pw] = [checkInt32(op, "padding[0]", d.padding[0]), checkInt32(op, "padding[1]", d.padding[1])];
  const [h, w, kh, kw] = [
    count(op, "h", d.h),
    count(op, "w", d.w),
    count(op, "kh", d.kh),
    count(op, "kw", d.kw),
  ];
  if (kh < 1 || kw < 1 || kh > h + 2 * ph || kw > w + 2 * pw) {
    throw new TpError(
      "E_ARG",
      `${op}: kernel ${kh}×${kw} does not fit the padded input ${h + 2 * ph}×${w + 2 * pw}`,
    );
  }
  return [Math.floor((h + 2 * ph - kh) / sh) + 1, Math.floor((w + 2 * pw - kw) / sw) + 1];
}

/**
 * 2-D convolution on contiguous f32 (tp_cpu_conv2d_f32): x [batch, cIn, h, w], weight [cOut, cIn, kh,
 * kw], bias [cOut] or null → y [batch, cOut, oh, ow], with [oh, ow] = {@link conv2dOutputSize}(d) — the
 * size the kernel writes, computed here, never taken from the caller.
 * @throws TpError E_ARG for a bad stride, padding or count (see {@link conv2dOutputSize}), or a region
 *   too short for what the kernel reads or writes; the native checks as E_ARG from {@link check}
 */
export function conv2dF32(
  ctx: NativeContext,
  x: NativeRegion,
  weight: NativeRegion,
  bias: NativeRegion | null,
  y: NativeRegion,
  d: Conv2dDims,
): void {
  const op = "conv2d";
  const [oh, ow] = conv2dOutputSize(d);
  const px = region(op, "x", x, product(op, d.batch, d.cIn, d.h, d.w) * 4, 4);
  const pw = region(op, "weight", weight, product(op, d.cOut, d.cIn, d.kh, d.kw) * 4, 4);
  const pb = optRegion(op, "bias", bias, count(op, "cOut", d.cOut) * 4);
  const py = region(op, "y", y, product(op, d.batch, d.cOut, oh, ow) * 4, 4);
  check(
    ctx,
    ctx.lib.raw.tp_cpu_conv2d_f32(
      ctx.handle,
      px,
      pw,
      pb,
      py,
      d.batch,
      d.cIn,
      d.h,
      d.w,
      d.cOut,
      d.kh,
      d.kw,
      d.stride[0],
      d.stride[1],
      d.padding[0],
      d.padding[1],
    ),
  );
}

/**
 * Nearest upsampling of planes × [h, w] f32 by `factor` (tp_cpu_upsample_nearest2d_f32).
 * @throws TpError E_ARG for a factor outside [1, 2^31 − 1] (an int32_t), bad counts or short regions
 */
export function upsampleNearest2dF32(
  ctx: NativeContext,
  x: NativeRegion,
  y: NativeRegion,
  planes: number,
  h: number,
  w: number,
  factor: number,
): void {
  const op = "upsample_nearest2d";
  checkInt32(op, "factor", factor, 1);
  const px = region(op, "x", x, product(op, planes, h, w) * 4, 4);
  const py = region(op, "y", y, product(op, planes, h, w, factor, factor) * 4, 4);
  check(ctx, ctx.lib.raw.tp_cpu_upsample_nearest2d_f32(ctx.handle, px, py, planes, h, w, factor));
}

/** Per row of n f32: the index of the largest value (tp_cpu_argmax_f32). */
export function argmaxF32(
  ctx: NativeContext,
  x: NativeRegion,
  out: NativeRegion,
  rows: number,
  n: number,
): void {
  const op = "argmax";
  const px = region(op, "x", x, product(op, rows, n) * 4, 4);
  const po = region(op, "out", out, count(op, "rows", rows) * 4, 4);
  check(ctx, ctx.lib.raw.tp_cpu_argmax_f32(ctx.handle, px, po, rows, n));
}

/** The number of NaN / ±∞ values among n f32 into out (one i32; tp_cpu_count_nonfinite_f32). */
export function countNonFiniteF32(ctx: NativeContext, x: NativeRegion, out: NativeRegion, n: number): void {
  const op = "count_nonfinite";
  const px = region(op, "x", x, count(op, "n", n) * 4, 4);
  const po = region(op, "out", out, 4, 4);
  check(ctx, ctx.lib.raw.tp_cpu_count_nonfinite_f32(ctx.handle, px, n, po));
}

/** Per row of n f32: the k largest values, descending, and their i32 indices (tp_cpu_top_k_f32). */
export function topKF32(
  ctx: NativeContext,
  x: NativeRegion,
  values: NativeRegion,
  indices: NativeRegion,
  rows: number,
  n: number,
  k: number,
): void {
  const op = "top_k";
  const px = region(op, "x", x, product(op, rows, n) * 4, 4);
  const pv = region(op, "values", values, product(op, rows, k) * 4, 4);
  const pi = region(op, "indices", indices, product(op, rows, k) * 4, 4);
  check(ctx, ctx.lib.raw.tp_cpu_top_k_f32(ctx.handle, px, pv, pi, rows, n, k));
}

/** The weight formats with a repacked layout (tp.h tp_weight_repack_bytes) and their tp_wformat codes. */
const REPACK_FORMATS = { q8_0: NATIVE_WEIGHT_FORMATS.q8_0, q4_0: NATIVE_WEIGHT_FORMATS.q4_0 } as const;

/** A weight format of {@link REPACK_FORMATS}. */
export type RepackFormat = keyof typeof REPACK_FORMATS;

/** The tp_wformat code of a {@link RepackFormat}, or E_ARG naming `op` and the two formats. */
function repackCode(op: string, format: RepackFormat): number {
  return REPACK_FORMATS[checkName(op, "repacked weight format", REPACK_FORMATS, format)];
}

/**
 * Bytes of the repacked layout of a weight [n, k] (tp_weight_repack_bytes), or -1 when k is not a
 * multiple of 32.
 * @throws TpError E_ARG for another format or a bad count
 */
export function repackBytes(ctx: NativeContext, format: RepackFormat, n: number, k: number): number {
  const op = "repack";
  return Number(
    ctx.lib.raw.tp_weight_repack_bytes(repackCode(op, format), count(op, "n", n), count(op, "k", k)),
  );
}

/**
 * Repack a Q8_0 / Q4_0 weight [n, k] (`data`: n rows of ggml blocks) into `out`, which holds exactly
 * {@link repackBytes} bytes (tp_cpu_repack_weight; layout in native/cpu/matmul.h).
 * @throws TpError E_ARG for a bad size, a short region or overlapping buffers (from the native check too)
 */
export function repackWeight(
  ctx: NativeContext,
  format: RepackFormat,
  data: Uint8Array,
  n: number,
  k: number,
  out: NativeRegion,
): void {
  const op = "repack";
  const bytes = repackBytes(ctx, format, n, k);
  if (bytes < 0) throw new TpError("E_ARG", `${op}: k = ${k} is not a multiple of 32`);
  const po = region(op, "out", out, bytes, 1);
  if (!(data instanceof Uint8Array)) throw new TpError("E_ARG", `${op}: data must be a Uint8Array`);
  const pw = data.byteLength === 0 ? null : ptr(data);
  check(
    ctx,
    ctx.lib.raw.tp_cpu_repack_weight(
      ctx.handle,
      repackCode(op, format),
      pw,
      data.byteLength,
      n,
      k,
      po,
      bytes,
    ),
  );
}

/**
 * y [m, n] = x [m, k] · Wᵀ (+ bias [n]) from a repacked Q8_0 / Q4_0 weight (tp_cpu_matmul_repacked):
 * the numbers of the unpacked kernels up to f32 summation order. Needs the AVX-512 VNNI level.
 * @throws TpError E_ARG for short or misaligned regions or bad counts; E_UNSUPPORTED below that level
 */
export function matmulRepacked(
  ctx: NativeContext,
  format: RepackFormat,
  x: NativeRegion,
  m: number,
  k: number,
  packed: NativeRegion,
  n: number,
  bias: NativeRegion | null,
  y: NativeRegion,
): void {
  const op = "matmul";
  const bytes = repackBytes(ctx, format, n, k);
  if (bytes < 0) throw new TpError("E_ARG", `${op}: k = ${k} is not a multiple of 32`);
  const px = region(op, "x", x, product(op, m, k) * 4, 4);
  const pp = region(op, "packed weight", packed, bytes, 1);
  const pb = optRegion(op, "bias", bias, n * 4);
  const py = region(op, "y", y, product(op, m, n) * 4, 4);
  check(
    ctx,
    ctx.lib.raw.tp_cpu_matmul_repacked(ctx.handle, px, m, k, repackCode(op, format), pp, bytes, n, pb, py),
  );
}

/**
 * y [m, n] = x [m, k] · Wᵀ (+ bias [n]) for a weight in its own format (tp_cpu_matmul), on native
 * regions: the same call as `NativeContext.matmul` without a Float32Array view per operand (each view
 * over native memory is a new ArrayBuffer on the JavaScript heap, three per matmul, hundreds per
 * decoded token). The native side checks the weight's bytes, scales and group against its format.
 * @throws TpError E_ARG for short or misaligned regions, bad counts, an unknown format or a group
 *   outside [0, 2^31 − 1] (from the native check too)
 */
export function matmulWeight(
  ctx: NativeContext,
  x: NativeRegion,
  m: number,
  w: NativeWeight,
  bias: NativeRegion | null,
  y: NativeRegion,
): void {
  const op = "matmul";
  const format = weightFormatCode(op, w.format);
  const group = checkInt32(op, "group", w.group);
  if (!(w.data instanceof Uint8Array))
    throw new TpError("E_ARG", `${op}: the weight data must be a Uint8Array`);
  if (w.scale !== null && !(w.scale instanceof Float32Array)) {
    throw new TpError("E_ARG", `${op}: the weight scale must be a Float32Array or null`);
  }
  const px = region(op, "x", x, product(op, m, w.k) * 4, 4);
  const pb = optRegion(op, "bias", bias, count(op, "n", w.n) * 4);
  const py = region(op, "y", y, product(op, m, w.n) * 4, 4);
  const scale = w.scale === null || w.scale.length === 0 ? null : w.scale;
  check(
    ctx,
    ctx.lib.raw.tp_cpu_matmul(
      ctx.handle,
      px,
      m,
      w.k,
      format,
      w.data.byteLength === 0 ? null : ptr(w.data),
      w.data.byteLength,
      w.n,
      scale === null ? null : ptr(scale),
      scale === null ? 0 : scale.length,
      group,
      pb,
      py,
    ),
  );
}

/**
 * y [t, s, n] = x [t, sx, k] · W_{ids[t, s]}ᵀ for a stack of `experts` weights [experts·n, k] in its
 * own format (tp_cpu_matmul_id: one tp_cpu_matmul per expert over its rows, experts no row chose not
 * read). `w` is the whole stack (n = w.n / experts rows each); sx is 1 or s. The native side checks
 * the ids' range (nothing is written for one outside [0, experts)).
 * @throws TpError E_ARG for short or misaligned regions, bad counts, an id out of range (from the
 *   native check), an unknown format
 */
export function matmulIdWeight(
  ctx: NativeContext,
  x: NativeRegion,
  t: number,
  sx: number,
  w: NativeWeight,
  experts: number,
  ids: NativeRegion,
  s: number,
  y: NativeRegion,
): void {
  const op = "matmul_id";
  const format = weightFormatCode(op, w.format);
  const group = checkInt32(op, "group", w.group);
  count(op, "experts", experts);
  if (experts < 1 || w.n % experts !== 0) {
    throw new TpError("E_ARG", `${op}: experts = ${experts} does not divide the ${w.n} weight rows`);
  }
  const n = w.n / experts;
  if (!(w.data instanceof Uint8Array))
    throw new TpError("E_ARG", `${op}: the weight data must be a Uint8Array`);
  if (w.scale !== null && !(w.scale instanceof Float32Array)) {
    throw new TpError("E_ARG", `${op}: the weight scale must be a Float32Array or null`);
  }
  if (sx !== 1 && sx !== s) throw new TpError("E_ARG", `${op}: x has ${sx} slots per token, not 1 or ${s}`);
  const px = region(op, "x", x, product(op, t, sx, w.k) * 4, 4);
  const pi = region(op, "ids", ids, product(op, t, s) * 4, 4);
  const py = region(op, "y", y, product(op, t, s, n) * 4, 4);
  const scale = w.scale === null || w.scale.length === 0 ? null : w.scale;
  check(
    ctx,
    ctx.lib.raw.tp_cpu_matmul_id(
      ctx.handle,
      px,
      t,
      sx,
      w.k,
      format,
      w.data.byteLength === 0 ? null : ptr(w.data),
      w.data.byteLength,
      experts,
      n,
      scale === null ? null : ptr(scale),
      scale === null ? 0 : scale.length,
      group,
      pi,
      s,
      py,
    ),
  );
}

/** y = softplus(x) over n f32 elements (tp_cpu_softplus_f32). */
export function softplusF32(ctx: NativeContext, x: NativeRegion, y: NativeRegion, n: number): void {
  const op = "softplus";
  const bytes = count(op, "n", n) * 4;
  const px = region(op, "x", x, bytes, 4);
  const py = region(op, "y", y, bytes, 4);
  check(ctx, ctx.lib.raw.tp_cpu_softplus_f32(ctx.handle, px, py, n));
}

/** y [tOut, channels] = depthwise causal conv of x [tOut + taps − 1, channels] with w [channels, taps] (tp_cpu_ssm_conv_f32). */
export function ssmConvF32(
  ctx: NativeContext,
  x: NativeRegion,
  w: NativeRegion,
  y: NativeRegion,
  tOut: number,
  channels: number,
  taps: number,
): void {
  const op = "ssm_conv";
  if (count(op, "taps", taps) < 1) throw new TpError("E_ARG", `${op}: the kernel has no taps`);
  const px = region(op, "x", x, product(op, tOut + taps - 1, channels) * 4, 4);
  const pw = region(op, "weight", w, product(op, channels, taps) * 4, 4);
  const py = region(op, "y", y, product(op, tOut, channels) * 4, 4);
  check(ctx, ctx.lib.raw.tp_cpu_ssm_conv_f32(ctx.handle, px, pw, py, tOut, channels, taps));
}

/** Sizes of a {@link gatedDeltaNetF32} call. */
export interface DeltaNetDims {
  readonly n: number;
  readonly kHeads: number;
  readonly vHeads: number;
  readonly dk: number;
  readonly dv: number;
}

/**
 * The gated delta rule over n tokens (tp_cpu_gated_delta_net_f32): q, k [n, kHeads, dk], v, out
 * [n, vHeads, dv], g, beta [n, vHeads], state [vHeads, dk, dv] updated in place; chunk 0: token by token.
 */
export function gatedDeltaNetF32(
  ctx: NativeContext,
  q: NativeRegion,
  k: NativeRegion,
  v: NativeRegion,
  g: NativeRegion,
  beta: NativeRegion,
  state: NativeRegion,
  out: NativeRegion,
  d: DeltaNetDims,
  scale: number,
  chunk: number,
): void {
  const op = "gated_delta_net";
  const qk = product(op, d.n, d.kHeads, d.dk) * 4;
  const vo = product(op, d.n, d.vHeads, d.dv) * 4;
  const gb = product(op, d.n, d.vHeads) * 4;
  if (d.kHeads < 1 || d.vHeads % d.kHeads !== 0)
    throw new TpError("E_ARG", `${op}: ${d.vHeads} value heads are not a multiple of ${d.kHeads} key heads`);
  checkInt32(op, "chunk", chunk);
  const ptrs = [
    region(op, "q", q, qk, 4),
    region(op, "k", k, qk, 4),
    region(op, "v", v, vo, 4),
    region(op, "g", g, gb, 4),
    region(op, "beta", beta, gb, 4),
    region(op, "state", state, product(op, d.vHeads, d.dk, d.dv) * 4, 4),
    region(op, "out", out, vo, 4),
  ] as const;
  check(
    ctx,
    ctx.lib.raw.tp_cpu_gated_delta_net_f32(
      ctx.handle,
      ...ptrs,
      d.n,
      d.kHeads,
      d.vHeads,
      d.dk,
      d.dv,
      scale,
      chunk,
    ),
  );
}
