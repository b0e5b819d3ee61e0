/**
 * matmul, matmul_id and embedding of the vulkan backend (shaders/matmul.comp, shaders/matmul_id.comp,
 * shaders/embedding.comp). Weights
 * stay in their checkpoint format on the device and are decoded in the kernels (shaders/weights.glsl):
 * f32, f16, bf16, fp8 e4m3fn / e5m2 (raw, or with a per-tensor scale), and the GGUF block types Q8_0,
 * Q4_0, Q4_1, Q5_0, Q5_1, Q2_K … Q6_K.
 *
 * A weight is a host object (a view on the checkpoint's mapping). `VulkanBackend.makeResident(w)`
 * uploads it once and keeps it (accounted); otherwise each call copies it to a scratch buffer for the
 * call (streaming), freed when the op returns. A weight larger than maxStorageBufferRange is bound in
 * windows of whole rows, one dispatch per window.
 *
 * Numerics: f32 accumulation of x · decode(w) with x in f32 — for GGUF types this is closer to the
 * exact product than ggml's (which also quantizes x to Q8), and within the suite's NMSE 5e-4 of it.
 *
 * Kernel-table entries: arguments arrive checked (@tp/tensor's op front-end: shapes, dtypes, a format
 * the entry lists); what is checked here is what only this backend refuses (a scale it cannot apply,
 * a rotation group past its shared memory, a row past maxStorageBufferRange).
 */
import { formatShape, rowBytes, type Tensor, TpError, type Weight, type WeightFormat } from "@tp/tensor";
import type { Binding } from "../ffi.ts";
import { type BoundTensor, dispatch1d, dispatchGroups, grid, Push, type VkOpHost } from "./common.ts";
import { contiguous, copyInto } from "./layout.ts";

/**
 * Columns of K per dispatch: a longer K is summed in chunks, one dispatch each (later ones add to y;
 * ConvRot adds exact i32 partial sums), so no invocation reaches llvmpipe's 65535 loop iterations
 * (README "llvmpipe's loop limit"). The tiled kernels (matmul.comp, matmul_convrot.comp) walk all of K
 * in one invocation and broke somewhere between K = 40,000 and 65,536; matmul_vec.comp was still right
 * at K = 196,608 (M = 8) and is chunked with a wide margin. Multiples of 256 (whole blocks, even).
 */
export const MATMUL_K_CHUNK = { tiled: 16384, vec: 65536 } as const;

/** [k_lo, k_hi) chunks of K of at most `chunk` columns. */
function kChunks(k: number, chunk: number): [number, number][] {
  const out: [number, number][] = [];
  for (let lo = 0; lo < k; lo += chunk) out.push([lo, Math.min(k, lo + chunk)]);
  return out;
}

/**
 * GGUF weight formats whose matmul quantizes x first, as ggml's CPU `vec_dot_type` (and the cpu
 * backend, and @tp/quant ACTIVATION_TYPE): 0 = Q8_0 / Q8_1 blocks of 32, 1 = Q8_K blocks of 256
 * (shaders/ggml_quantize.comp).
 */
const GGML_ACTIVATION: Readonly<Partial<Record<WeightFormat, { kind: number; block: number }>>> = {
  q4_0: { kind: 0, block: 32 },
  q5_0: { kind: 0, block: 32 },
  q8_0: { kind: 0, block: 32 },
  q4_1: { kind: 0, block: 32 },
  q5_1: { kind: 0, block: 32 },
  q2_k: { kind: 1, block: 256 },
  q3_k: { kind: 1, block: 256 },
  q4_k: { kind: 1, block: 256 },
  q5_k: { kind: 1, block: 256 },
  q6_k: { kind: 1, block: 256 },
  iq4_nl: { kind: 0, block: 32 },
  iq4_xs: { kind: 1, block: 256 },
};

/**
 * x [M, K] (contiguous) as ggml quantizes it for a GGUF weight, dequantized to f32 (a scratch tensor
 * of the current scope), or x itself for other formats.
 */
function ggmlActivations(host: VkOpHost, x: Tensor, format: WeightFormat, k: number): Tensor {
  const a = GGML_ACTIVATION[format];
  if (a === undefined || k % a.block !== 0) return x;
  const xq = host.alloc([x.numel], "f32", "quantized activations");
  const src = host.bind(x, "matmul");
  const dst = host.bind(xq, "matmul");
  const blocks = x.numel / a.block;
  dispatch1d(
    host,
    "matmul",
    "ggml_quantize",
    [],
    [dst.binding, src.binding],
    new Push(12).u32(blocks).u32(a.kind).u32(src.offset),
    blocks,
  );
  return xq;
}

/** Activation rows up to which matmul uses the split-K kernel (shaders/matmul_vec.comp MR). */
const VEC_ROWS = 8;
/** Weight rows per workgroup of matmul_vec (its NR). */
const VEC_WEIGHT_ROWS = 4;
/** Invocations per workgroup of matmul_vec (a power of two every device has). */
const VEC_WORKGROUP = 128;
/** Invocations per workgroup of the tiled kernels: 8 × 8, each a 4 × 4 block of a 32 × 32 tile. */
const TILE_WORKGROUP = 64;

/** Workgroups of the tiled kernels: (⌈rows / 32⌉, ⌈M / 32⌉). @throws TpError E_UNSUPPORTED past the device's counts */
function tiles(
  host: VkOpHost,
  op: string,
  m: number,
  rows: number,
  k: number,
  n: number,
): [number, number, number] {
  const groupsN = Math.ceil(rows / 32);
  const groupsM = Math.ceil(m / 32);
  if (groupsN > host.info.maxWorkgroupCount[0] || groupsM > host.info.maxWorkgroupCount[1]) {
    throw new TpError(
      "E_UNSUPPORTED",
      `op ${op} on backend vulkan: [${m}, ${k}] · [${n}, ${k}]ᵀ needs too many workgroups`,
    );
  }
  return [groupsN, groupsM, 1];
}

/** Weight formats of shaders/weights.glsl and their FORMAT codes. */
export const WEIGHT_FORMAT_CODES: Readonly<Partial<Record<WeightFormat, number>>> = {
  f32: 0,
  f16: 1,
  bf16: 2,
  f8_e4m3fn: 3,
  f8_e5m2: 4,
  q8_0: 5,
  q4_0: 6,
  q4_1: 7,
  q5_0: 8,
  q5_1: 9,
  q2_k: 10,
  q3_k: 11,
  q4_k: 12,
  q5_k: 13,
  q6_k: 14,
  iq4_nl: 15,
  iq4_xs: 16,
};

/** ConvRot formats (matmul and matmul_id): codes with one f32 scale per row, Hadamard-rotated columns. */
export const CONVROT_FORMATS: readonly WeightFormat[] = ["int8_convrot", "int4_convrot"];

/** FORMAT codes of the ConvRot formats in shaders/matmul_id.comp (past those of weights.glsl). */
const CONVROT_ID_CODES: Readonly<Partial<Record<WeightFormat, number>>> = {
  int8_convrot: 17,
  int4_convrot: 18,
};

/** A weight on the device: its bytes as a u8 tensor, ConvRot row scales, and every tensor to free. */
export interface ResidentWeight {
  readonly data: Tensor;
  /** ConvRot: the row scales, f32 [N]. */
  readonly scale: Tensor | null;
  readonly tensors: Tensor[];
}

/** What a kernel needs to know about a weight: format code, row bytes and the f32 scale. */
interface WeightInfo {
  readonly code: number;
  readonly rowBytes: number;
  readonly scale: number;
}

/** "weight blk.0.ffn_up.weight q4_k [N, K]" in messages. */
function shownWeight(w: Weight): string {
  return `weight ${w.name} ${w.format} ${formatShape(w.shape)}`;
}

/**
 * Check that this backend decodes `w` and return its kernel parameters.
 * @throws TpError E_UNSUPPORTED naming op, backend and format (and what is supported) for a format or
 *   a scale this backend lacks
 */
function weightInfo(op: string, w: Weight): WeightInfo {
  if (op !== "embedding" && CONVROT_FORMATS.includes(w.format))
    return { code: -1, rowBytes: rowBytes(w.format, w.k), scale: 1 };
  const code = WEIGHT_FORMAT_CODES[w.format];
  if (code === undefined) {
    throw new TpError(
      "E_UNSUPPORTED",
      `op ${op} on backend vulkan does not support weight format ${w.format} (${shownWeight(w)}); supported: ${Object.keys(WEIGHT_FORMAT_CODES).join(", ")}`,
    );
  }
  const fp8 = w.format === "f8_e4m3fn" || w.format === "f8_e5m2";
  let scale = 1;
  if (w.scale !== undefined) {
    if (!fp8 || w.scale.kind !== "tensor") {
      throw new TpError(
        "E_UNSUPPORTED",
        `op ${op} on backend vulkan does not support ${w.scale.kind} scales on ${w.format} weights (${shownWeight(w)}); only fp8 takes one, a per-tensor scale`,
      );
    }
    scale = w.scale.value;
  }
  return { code, rowBytes: rowBytes(w.format, w.k), scale };
}

/**
 * Upload a weight's bytes as a device tensor (u8 [bytes]), with ConvRot's row scales (f32 [N]); both
 * belong to the caller's scope, and neither stays when one upload fails.
 * @throws TpError E_UNSUPPORTED for a format this backend lacks; E_OOM over the budget
 */
export function uploadWeight(host: VkOpHost, w: Weight, op: string): ResidentWeight {
  weightInfo(op, w);
  return host.scope(() => {
    const data =
      w.data.byteLength === 0
        ? host.alloc([1], "u8", `${w.name} (weight)`)
        : host.upload(w.data, [w.data.byteLength], "u8", `${w.name} (weight)`);
    if (w.scale?.kind !== "row" || !CONVROT_FORMATS.includes(w.format))
      return { data, scale: null, tensors: [data] };
    const scale = host.upload(w.scale.values, [w.scale.values.length], "f32", `${w.name} (row scales)`);
    return { data, scale, tensors: [data, scale] };
  });
}

/**
 * The device copy of `w`: resident, else in the next slot of the stream ring, else uploaded for this
 * op (scratch of the current scope).
 */
function deviceWeight(host: VkOpHost, w: Weight, op: string): ResidentWeight {
  return host.residentWeight(w) ?? host.streamWeight(w) ?? uploadWeight(host, w, op);
}

/**
 * Windows of whole weight rows that each fit one binding: [first row, rows, binding, byte offset of
 * the first row inside the binding].
 */
function weightWindows(
  host: VkOpHost,
  op: string,
  data: Tensor,
  n: number,
  rowB: number,
): { n0: number; rows: number; binding: Binding; offset: number }[] {
  const buffer = host.bufferOf(data, op);
  const info = host.info;
  if (Math.ceil(buffer.bytes / 16) * 16 <= info.maxStorageBufferRange) {
    const whole = host.bind(data, op);
    return [{ n0: 0, rows: n, binding: whole.binding, offset: whole.offset }];
  }
  const align = Math.max(info.minStorageBufferOffsetAlignment, 4);
  const rowsPer = Math.floor((info.maxStorageBufferRange - align) / rowB);
  if (rowsPer < 1) {
    throw new TpError(
      "E_UNSUPPORTED",
      `op ${op} on backend vulkan: one weight row of ${rowB} bytes is past maxStorageBufferRange ${info.maxStorageBufferRange} of ${info.name}`,
    );
  }
  const out = [];
  for (let n0 = 0; n0 < n; n0 += rowsPer) {
    const rows = Math.min(rowsPer, n - n0);
    const first = n0 * rowB;
    const start = Math.floor(first / align) * align;
    const end = Math.min(Math.ceil(((n0 + rows) * rowB) / 4) * 4, Math.ceil(buffer.bytes / 16) * 16);
    out.push({ n0, rows, binding: { buffer, offset: start, range: end - start }, offset: first - start });
  }
  return out;
}

/**
 * matmul: out [..., N] = x · Wᵀ (+ bias). x: [..., K] f32 (any view; a strided one is copied first);
 * w: [N, K] in a format of {@link WEIGHT_FORMAT_CODES} or {@link CONVROT_FORMATS}; bias: [N] f32.
 * @throws TpError E_UNSUPPORTED naming op, backend and format for a scale this backend cannot apply;
 *   E_OOM for the streamed weight or scratch
 */
export function matmul(host: VkOpHost, out: Tensor, x: Tensor, w: Weight, bias: Tensor | null): void {
  const op = "matmul";
  const wi = weightInfo(op, w);
  const [n, k] = w.shape;
  const m = x.numel / Math.max(k, 1);
  if (out.numel === 0) return;
  if (k === 0) {
    // An empty sum: y = bias, or 0.
    if (bias !== null) copyInto(host, op, bias.broadcastTo(out.shape), out);
    else host.ctx.fill(host.bind(out, op).binding.buffer, 0, Math.ceil(out.byteLength / 4) * 4, 0);
    return;
  }
  host.scope(() => {
    const xc = contiguous(host, op, x);
    const bc = bias === null ? null : contiguous(host, op, bias);
    if (wi.code < 0) {
      convRotMatmul(host, xc, w, bc, out, m);
      return;
    }
    const data = deviceWeight(host, w, op).data;
    const a = host.bind(ggmlActivations(host, xc, w.format, k), op);
    const y = host.bind(out, op);
    const b = bc === null ? null : host.bind(bc, op);
    // Few rows: the split-K kernel; else 32 × 32 tiles.
    const vec = m <= VEC_ROWS;
    const pipeline = vec
      ? host.kernels.get("matmul_vec", [VEC_WORKGROUP, wi.code, m])
      : host.kernels.get("matmul", [TILE_WORKGROUP, wi.code]);
    const chunks = kChunks(k, vec ? MATMUL_K_CHUNK.vec : MATMUL_K_CHUNK.tiled);
    for (const win of weightWindows(host, op, data, n, wi.rowBytes)) {
      const groups = vec
        ? grid(host.info, Math.ceil(win.rows / VEC_WEIGHT_ROWS), op)
        : tiles(host, op, m, win.rows, k, n);
      chunks.forEach(([lo, hi], c) => {
        const push = new Push(56)
          .u32(m)
          .u32(win.rows)
          .u32(k)
          .u32(a.offset)
          .u32(b?.offset ?? 0)
          .u32(b === null || c > 0 ? 0 : 1)
          .u32(win.offset)
          .u32(wi.rowBytes)
          .f32(wi.scale)
          .u32(n)
          .u32(win.n0)
          .u32(lo)
          .u32(hi)
          .u32(c > 0 ? 1 : 0);
        host.ctx.dispatch(
          pipeline,
          [y.binding, a.binding, win.binding, (b ?? a).binding],
          push.bytes(),
          groups,
        );
      });
    }
  });
}

/** Weight rows per workgroup of matmul_id (shaders/matmul_id.comp NR). */
const ID_WEIGHT_ROWS = 4;

/**
 * matmul_id: out [T, S, N] = x [T, S or 1, K] · W_{ids[t, s]}ᵀ for a stack of `experts` weights
 * [experts·N, K] in a format of {@link WEIGHT_FORMAT_CODES} or {@link CONVROT_FORMATS}, read in place
 * on the device (resident, or streamed for the call as matmul does). The ids are not read back:
 * shaders/matmul_id.comp reads each row's id on the device, one workgroup per 4 weight rows of one row
 * (a GEMV per routed row: a prefill reads an expert's rows once per row routed to it, not once per
 * expert). GGUF formats quantize x first as matmul does (ggml's vec_dot_type); ConvRot rotates and
 * quantizes each input row once as matmul does ({@link convRotActivations}), then integer dot
 * products with the chosen expert's codes and its row scales (the stack's [experts·N] scales). An id
 * outside [0, experts) gives NaN rows.
 * @throws TpError E_UNSUPPORTED for a scale this backend cannot apply, a ConvRot rotation group past
 *   the quantize kernel's, or a stack past one binding (maxStorageBufferRange); E_OOM
 */
export function matmulId(
  host: VkOpHost,
  out: Tensor,
  x: Tensor,
  w: Weight,
  ids: Tensor,
  experts: number,
): void {
  const op = "matmul_id";
  const wi = weightInfo(op, w);
  const k = w.k;
  const n = w.n / experts;
  const [t, s] = ids.shape as [number, number];
  const rows = t * s;
  if (out.numel === 0) return;
  if (k === 0) {
    host.ctx.fill(host.bind(out, op).binding.buffer, 0, Math.ceil(out.byteLength / 4) * 4, 0);
    return;
  }
  host.scope(() => {
    const xc = contiguous(host, op, x);
    const ic = host.bind(contiguous(host, op, ids), op);
    const dw = deviceWeight(host, w, op);
    const windows = weightWindows(host, op, dw.data, w.n, wi.rowBytes);
    if (windows.length !== 1) {
      throw new TpError(
        "E_UNSUPPORTED",
        `op ${op} on backend vulkan: ${shownWeight(w)} is past maxStorageBufferRange ${host.info.maxStorageBufferRange} of ${host.info.name} (one binding per expert stack)`,
      );
    }
    const win = windows[0] as (typeof windows)[number];
    const y = host.bind(out, op);
    const convRot = wi.code < 0 ? convRotActivations(host, op, xc, w, xc.numel / k) : null;
    const a = convRot?.codes ?? host.bind(ggmlActivations(host, xc, w.format, k), op);
    const code = convRot === null ? wi.code : (CONVROT_ID_CODES[w.format] as number);
    const pipeline = host.kernels.get("matmul_id", [VEC_WORKGROUP, code]);
    const groups = grid(host.info, Math.ceil(n / ID_WEIGHT_ROWS) * rows, op);
    const chunks = kChunks(k, MATMUL_K_CHUNK.vec);
    // ConvRot: the row scales of x and of the stack, exact i32 partial sums between chunks.
    const sx = convRot?.scales ?? y;
    const sw = convRot === null ? y : host.bind(dw.scale as Tensor, op);
    const part =
      convRot !== null && chunks.length > 1 ? host.bind(host.alloc([rows, n], "i32", "partial sums"), op) : y;
    chunks.forEach(([lo, hi], c) => {
      const push = new Push(68)
        .u32(rows)
        .u32(s)
        .u32(x.shape[1] as number)
        .u32(n)
        .u32(k)
        .u32(a.offset)
        .u32(ic.offset)
        .u32(win.offset)
        .u32(wi.rowBytes)
        .f32(wi.scale)
        .u32(experts)
        .u32(lo)
        .u32(hi)
        .u32(c > 0 ? 1 : 0)
        .u32(c === chunks.length - 1 ? 1 : 0)
        .u32(sx.offset)
        .u32(sw.offset);
      host.ctx.dispatch(
        pipeline,
        [y.binding, a.binding, win.binding, ic.binding, sx.binding, sw.binding, part.binding],
        push.bytes(),
        groups,
      );
    });
  });
}

/**
 * embedding: out [..., D] f32 = rows of a weight table ([vocab, D], a format of
 * {@link WEIGHT_FORMAT_CODES}) at i32 ids [...] (ggml get_rows). An id outside [0, vocab) gives a row
 * of NaN (ids are not read back). A table past maxStorageBufferRange is read in windows of whole rows,
 * one dispatch each.
 * @throws TpError E_UNSUPPORTED for a scale this backend cannot apply; E_OOM
 */
export function embedding(host: VkOpHost, out: Tensor, table: Weight, ids: Tensor): void {
  const op = "embedding";
  const wi = weightInfo(op, table);
  const [vocab, d] = table.shape;
  if (out.numel === 0) return;
  host.scope(() => {
    const i = host.bind(contiguous(host, op, ids), op);
    const data = deviceWeight(host, table, op).data;
    const y = host.bind(out, op);
    for (const win of weightWindows(host, op, data, vocab, wi.rowBytes)) {
      const push = new Push(36)
        .u32(out.numel)
        .u32(d)
        .u32(vocab)
        .u32(i.offset)
        .u32(win.offset)
        .u32(wi.rowBytes)
        .f32(wi.scale)
        .u32(win.n0)
        .u32(win.rows);
      dispatch1d(host, op, "embedding", [wi.code], [y.binding, i.binding, win.binding], push, out.numel);
    }
  });
}

/** Columns per Hadamard group the quantize kernel holds in shared memory. */
const MAX_ROTATION_GROUP = 4096;

/** The activation side of a ConvRot product: codes i32 [M, K], row scales f32 [M], and the bits. */
interface ConvRotActivations {
  readonly codes: BoundTensor;
  readonly scales: BoundTensor;
  readonly bits: 8 | 4;
}

/**
 * Rotate and quantize x per row for an INT8 / INT4 ConvRot weight w [N, K] (rotation group
 * w.rotationGroup), as ComfyUI's W8A8 / W4A4 linear and bit for bit as @tp/quant
 * (shaders/convrot_quantize.comp). x: contiguous [M, K] f32. The codes and scales are scratch of the
 * caller's scope.
 * @throws TpError E_UNSUPPORTED for a rotation group past the kernel's shared memory; E_OOM
 */
function convRotActivations(host: VkOpHost, op: string, x: Tensor, w: Weight, m: number): ConvRotActivations {
  const k = w.k;
  const g = w.rotationGroup as number;
  if (g > MAX_ROTATION_GROUP) {
    throw new TpError(
      "E_UNSUPPORTED",
      `op ${op} on backend vulkan: ConvRot rotation group ${g} of ${shownWeight(w)} is past ${MAX_ROTATION_GROUP}`,
    );
  }
  const bits = w.format === "int8_convrot" ? 8 : 4;
  const codes = host.alloc([m, k], "i32", "activation codes");
  const rotated = host.alloc([m, k], "f32", "rotated activations");
  const sx = host.alloc([m], "f32", "activation scales");
  const a = host.bind(x, op);
  const c = host.bind(codes, op);
  const r = host.bind(rotated, op);
  const sxb = host.bind(sx, op);
  const q = new Push(24)
    .u32(m)
    .u32(k)
    .u32(g)
    .u32(Math.round(Math.log(g) / Math.log(4)))
    .u32(bits)
    .u32(a.offset);
  dispatchGroups(
    host,
    op,
    "convrot_quantize",
    [host.workgroup, g],
    [c.binding, sxb.binding, a.binding, r.binding],
    q,
    m,
  );
  return { codes: c, scales: sxb, bits };
}

/**
 * y = x · Wᵀ (+ bias) for an INT8 / INT4 ConvRot weight, as ComfyUI's W8A8 / W4A4 linear: rotate and
 * quantize x per row ({@link convRotActivations}), then integer dot products and the rescale
 * (shaders/matmul_convrot.comp). x: contiguous [M, K] f32; runs inside the caller's scope (its
 * scratch is freed there).
 */
function convRotMatmul(
  host: VkOpHost,
  x: Tensor,
  w: Weight,
  bias: Tensor | null,
  out: Tensor,
  m: number,
): void {
  const op = "matmul";
  const [n, k] = w.shape;
  const { codes: c, scales: sxb, bits } = convRotActivations(host, op, x, w, m);
  const dw = deviceWeight(host, w, op);
  const wd = host.bind(dw.data, op);
  const sw = host.bind(dw.scale as Tensor, op);
  const b = bias === null ? null : host.bind(bias, op);
  const y = host.bind(out, op);
  const chunks = kChunks(k, MATMUL_K_CHUNK.tiled);
  const part = chunks.length > 1 ? host.bind(host.alloc([m, n], "i32", "partial sums"), op) : y;
  chunks.forEach(([lo, hi], i) => {
    const push = new Push(48)
      .u32(m)
      .u32(n)
      .u32(k)
      .u32(b?.offset ?? 0)
      .u32(b === null ? 0 : 1)
      .u32(wd.offset)
      .u32(bits)
      .u32(sw.offset)
      .u32(lo)
      .u32(hi)
      .u32(i === 0 ? 1 : 0)
      .u32(i === chunks.length - 1 ? 1 : 0);
    host.ctx.dispatch(
      host.kernels.get("matmul_convrot", [TILE_WORKGROUP]),
      [y.binding, c.binding, wd.binding, (b ?? y).binding, sxb.binding, sw.binding, part.binding],
      push.bytes(),
      tiles(host, op, m, n, k, n),
    );
  });
}
