/**
 * Row kernels: one block of {@link ROW_BLOCK} threads per row of a contiguous f32 input, reductions
 * across the block (emit.ts blockReduce). Row length and eps are parameters; which affine parts exist
 * is folded in.
 *
 * Sources: RMSNorm, Zhang & Sennrich 2019; LayerNorm, Ba et al. 2016 (biased variance); GroupNorm,
 * Wu & He 2018; softmax max-subtracted; ConvRot activation quantization, ../shared/spec/krea2.md §1.6–1.7
 * (s_x = max(max|x_rot| / 127, 1e-30), q = clamp(round_half_even(x / s_x), −128, 127)).
 */
import { f32Imm, KernelBuilder, type KernelSource } from "./emit.ts";

/** Threads per row. */
export const ROW_BLOCK = 256;

/** Registers of a row kernel's prologue: the row's input and output bases, its length, the thread. */
interface RowCtx {
  readonly kb: KernelBuilder;
  readonly x: string;
  readonly out: string;
  /** Row length (elements). */
  readonly d: string;
  readonly tid: string;
  /** Element offset of the row's first element. */
  readonly rowStart: string;
}

function rowPrologue(name: string, outParam = true): RowCtx & { params: KernelBuilder } {
  const kb = new KernelBuilder(name);
  const out = outParam ? kb.ld("out", "u64") : "";
  const x = kb.ld("x", "u64");
  const d = kb.ld("d", "u32");
  const tid = kb.reg("b32");
  const row = kb.reg("b32");
  const rowStart = kb.reg("b32");
  kb.op(`mov.u32 ${tid}, %tid.x;`, `mov.u32 ${row}, %ctaid.x;`, `mul.lo.u32 ${rowStart}, ${row}, ${d};`);
  return { kb, x, out, d, tid, rowStart, params: kb };
}

/** A loop `for (j = tid; j < d; j += ROW_BLOCK) body(j, globalIndex)`. */
function rowLoop(c: RowCtx, body: (j: string, g: string) => void): void {
  const { kb } = c;
  const j = kb.reg("b32");
  const g = kb.reg("b32");
  const p = kb.reg("pred");
  const top = kb.label("loop");
  const done = kb.label("done");
  kb.op(`mov.u32 ${j}, ${c.tid};`);
  kb.place(top);
  kb.op(`setp.ge.u32 ${p}, ${j}, ${c.d};`, `@${p} bra ${done};`, `add.u32 ${g}, ${c.rowStart}, ${j};`);
  body(j, g);
  kb.op(`add.u32 ${j}, ${j}, ${ROW_BLOCK};`, `bra ${top};`);
  kb.place(done);
}

function loadAt(kb: KernelBuilder, base: string, index: string): string {
  const f = kb.reg("f32");
  const at = kb.addr(base, index, 4);
  kb.op(`ld.global.f32 ${f}, [${at}];`);
  return f;
}

/** base[index] = v (f32). */
function storeAt(kb: KernelBuilder, base: string, index: string, v: string): void {
  const at = kb.addr(base, index, 4);
  kb.op(`st.global.f32 [${at}], ${v};`);
}

/** The sum over the row of f(x_j). */
function rowSum(c: RowCtx, f: (x: string) => string): string {
  const { kb } = c;
  const acc = kb.reg("f32");
  kb.op(`mov.f32 ${acc}, 0f00000000;`);
  rowLoop(c, (_j, g) => {
    const term = f(loadAt(kb, c.x, g));
    kb.op(`add.f32 ${acc}, ${acc}, ${term};`);
  });
  return kb.blockReduce(acc, "add", ROW_BLOCK);
}

/** Row length as f32. */
function dF32(c: RowCtx): string {
  const n = c.kb.reg("f32");
  c.kb.op(`cvt.rn.f32.u32 ${n}, ${c.d};`);
  return n;
}

/** 1 / sqrt(v) with IEEE sqrt and divide. */
function rsqrt(kb: KernelBuilder, v: string): string {
  const r = kb.reg("f32");
  kb.op(`sqrt.rn.f32 ${r}, ${v};`, `rcp.rn.f32 ${r}, ${r};`);
  return r;
}

/**
 * RMSNorm: out = x · (1/sqrt(mean(x²) + eps)) · g. `weight`: none, g = w, or g = 1 + w (unitOffset).
 * Parameters: out, x, d, [w], eps. Grid: one block per row.
 */
export function rmsNormKernel(weight: "none" | "weight" | "unit_offset"): KernelSource {
  const c = rowPrologue(`rms_norm_f32_${weight}`);
  const { kb } = c;
  const w = weight === "none" ? null : kb.ld("w", "u64");
  const eps = kb.ld("eps", "f32");
  const ss = rowSum(c, (x) => {
    const t = kb.reg("f32");
    kb.op(`mul.f32 ${t}, ${x}, ${x};`);
    return t;
  });
  const m = kb.reg("f32");
  const d = dF32(c);
  kb.op(`div.rn.f32 ${m}, ${ss}, ${d};`, `add.f32 ${m}, ${m}, ${eps};`);
  const r = rsqrt(kb, m);
  rowLoop(c, (j, g) => {
    const x = loadAt(kb, c.x, g);
    const y = kb.reg("f32");
    kb.op(`mul.f32 ${y}, ${x}, ${r};`);
    if (w !== null) {
      const gv = loadAt(kb, w, j);
      if (weight === "unit_offset") kb.op(`add.f32 ${gv}, ${gv}, 0f3F800000;`);
      kb.op(`mul.f32 ${y}, ${y}, ${gv};`);
    }
    storeAt(kb, c.out, g, y);
  });
  return kb.build([ROW_BLOCK, 1]);
}

/**
 * The row's statistics for LayerNorm and GroupNorm, on data shifted by the row's first value k (so
 * a large common offset — a mean of 1000 with a spread of 1 — cancels exactly before it is summed and
 * squared): `mean` = mean(x − k) and `r` = 1 / sqrt(var + eps) (f32; var the biased mean of
 * ((x − k) − mean)², two passes). Normalise x as ((x − k) − mean) · r with {@link normalize}.
 * `eps`: the f32 register of the epsilon. Source: Chan, Golub & LeVeque 1983 ("shifted data"), as
 * the Vulkan backend's norm.glsl.
 */
function rowMoments(c: RowCtx, eps: string): { shift: string; mean: string; r: string } {
  const { kb } = c;
  const n = dF32(c);
  const shift = loadAt(kb, c.x, c.rowStart);
  const mean = kb.reg("f32");
  const sum = rowSum(c, (x) => {
    const t = kb.reg("f32");
    kb.op(`sub.f32 ${t}, ${x}, ${shift};`);
    return t;
  });
  kb.op(`div.rn.f32 ${mean}, ${sum}, ${n};`);
  const vs = rowSum(c, (x) => {
    const t = kb.reg("f32");
    kb.op(`sub.f32 ${t}, ${x}, ${shift};`, `sub.f32 ${t}, ${t}, ${mean};`, `mul.f32 ${t}, ${t}, ${t};`);
    return t;
  });
  const v = kb.reg("f32");
  kb.op(`div.rn.f32 ${v}, ${vs}, ${n};`, `add.f32 ${v}, ${v}, ${eps};`);
  const r = rsqrt(kb, v);
  return { shift, mean, r };
}

/** y ← ((y − shift) − mean) · r, in place (the moments of {@link rowMoments}). */
function normalize(kb: KernelBuilder, y: string, m: { shift: string; mean: string; r: string }): void {
  kb.op(`sub.f32 ${y}, ${y}, ${m.shift};`, `sub.f32 ${y}, ${y}, ${m.mean};`, `mul.f32 ${y}, ${y}, ${m.r};`);
}

/** LayerNorm: out = (x − mean) / sqrt(var + eps) · w + b. Parameters: out, x, d, [w], [b], eps. */
export function layerNormKernel(hasWeight: boolean, hasBias: boolean): KernelSource {
  const c = rowPrologue(`layer_norm_f32${hasWeight ? "_w" : ""}${hasBias ? "_b" : ""}`);
  const { kb } = c;
  const w = hasWeight ? kb.ld("w", "u64") : null;
  const b = hasBias ? kb.ld("b", "u64") : null;
  const eps = kb.ld("eps", "f32");
  const moments = rowMoments(c, eps);
  rowLoop(c, (j, g) => {
    const y = loadAt(kb, c.x, g);
    normalize(kb, y, moments);
    if (w !== null) {
      const wj = loadAt(kb, w, j);
      kb.op(`mul.f32 ${y}, ${y}, ${wj};`);
    }
    if (b !== null) {
      const bj = loadAt(kb, b, j);
      kb.op(`add.f32 ${y}, ${y}, ${bj};`);
    }
    storeAt(kb, c.out, g, y);
  });
  return kb.build([ROW_BLOCK, 1]);
}

/**
 * GroupNorm over rows of (channels per group × spatial) elements: one block per (batch, group).
 * Parameters: out, x, d (row length), spatial, groups, channelsPerGroup, [w], [b], eps.
 */
export function groupNormKernel(hasWeight: boolean, hasBias: boolean): KernelSource {
  const c = rowPrologue(`group_norm_f32${hasWeight ? "_w" : ""}${hasBias ? "_b" : ""}`);
  const { kb } = c;
  const spatial = kb.ld("spatial", "u32");
  const groups = kb.ld("groups", "u32");
  const cpg = kb.ld("cpg", "u32");
  const w = hasWeight ? kb.ld("w", "u64") : null;
  const b = hasBias ? kb.ld("b", "u64") : null;
  const eps = kb.ld("eps", "f32");
  const moments = rowMoments(c, eps);
  const group = kb.reg("b32");
  kb.op(`mov.u32 ${group}, %ctaid.x;`, `rem.u32 ${group}, ${group}, ${groups};`);
  rowLoop(c, (j, g) => {
    const y = loadAt(kb, c.x, g);
    normalize(kb, y, moments);
    if (w !== null || b !== null) {
      const ch = kb.reg("b32");
      kb.op(`div.u32 ${ch}, ${j}, ${spatial};`, `mad.lo.u32 ${ch}, ${group}, ${cpg}, ${ch};`);
      if (w !== null) {
        const wc = loadAt(kb, w, ch);
        kb.op(`mul.f32 ${y}, ${y}, ${wc};`);
      }
      if (b !== null) {
        const bc = loadAt(kb, b, ch);
        kb.op(`add.f32 ${y}, ${y}, ${bc};`);
      }
    }
    storeAt(kb, c.out, g, y);
  });
  return kb.build([ROW_BLOCK, 1]);
}

/** Softmax along rows: e^(x − max) / Σ. Parameters: out, x, d. */
export function softmaxKernel(): KernelSource {
  const c = rowPrologue("softmax_f32");
  const { kb } = c;
  const mx = kb.reg("f32");
  kb.op(`mov.f32 ${mx}, 0fFF800000;`);
  rowLoop(c, (_j, g) => {
    const x = loadAt(kb, c.x, g);
    kb.op(`max.f32 ${mx}, ${mx}, ${x};`);
  });
  const m = kb.blockReduce(mx, "max", ROW_BLOCK);
  const s = rowSum(c, (x) => {
    const t = kb.reg("f32");
    kb.op(`sub.f32 ${t}, ${x}, ${m};`);
    return kb.exp(t);
  });
  rowLoop(c, (_j, g) => {
    const t = loadAt(kb, c.x, g);
    kb.op(`sub.f32 ${t}, ${t}, ${m};`);
    const e = kb.exp(t);
    kb.op(`div.rn.f32 ${e}, ${e}, ${s};`);
    storeAt(kb, c.out, g, e);
  });
  return kb.build([ROW_BLOCK, 1]);
}

/**
 * p ← (av, ai) comes before (bv, bi) in the order of argmax / top_k: NaN before every number (as
 * torch.argmax / torch.topk and the cpu backend), then the larger value, then the smaller index
 * (indices compared unsigned, so the sentinel index −1 comes last).
 */
function comesBefore(kb: KernelBuilder, p: string, av: string, ai: string, bv: string, bi: string): void {
  const q = kb.reg("pred");
  const lower = kb.reg("pred");
  const num = kb.reg("pred");
  kb.op(
    `setp.lt.u32 ${lower}, ${ai}, ${bi};`,
    `setp.gt.f32 ${p}, ${av}, ${bv};`,
    `setp.eq.and.f32 ${q}, ${av}, ${bv}, ${lower};`,
    `or.pred ${p}, ${p}, ${q};`,
    // av NaN: before a number, or before a NaN of a larger index
    `setp.num.f32 ${num}, ${bv}, ${bv};`,
    `or.pred ${num}, ${num}, ${lower};`,
    `setp.nan.and.f32 ${q}, ${av}, ${av}, ${num};`,
    `or.pred ${p}, ${p}, ${q};`,
  );
}

/** Keep (v, i) in (bv, bi) when it comes first in that order. */
function keepBetter(kb: KernelBuilder, bv: string, bi: string, v: string, i: string): void {
  const p = kb.reg("pred");
  comesBefore(kb, p, v, i, bv, bi);
  kb.op(`@${p} mov.f32 ${bv}, ${v};`, `@${p} mov.u32 ${bi}, ${i};`);
}

/**
 * Block-wide (value, index) maximum in that order: warp shuffles, then across warps through shared
 * memory; every thread ends with the block's best in (bv, bi). Ends with a barrier.
 */
function blockArgmax(kb: KernelBuilder, tid: string, bv: string, bi: string): void {
  const ov = kb.reg("f32");
  const oi = kb.reg("b32");
  const shuffle = () => {
    for (let o = 16; o >= 1; o >>= 1) {
      kb.op(
        `shfl.sync.bfly.b32 ${ov}, ${bv}, ${o}, 31, -1;`,
        `shfl.sync.bfly.b32 ${oi}, ${bi}, ${o}, 31, -1;`,
      );
      keepBetter(kb, bv, bi, ov, oi);
    }
  };
  shuffle();
  const warps = ROW_BLOCK / 32;
  const sv = kb.shared(`v${tid.slice(2)}_${bv.slice(2)}`, warps * 4, 4);
  const si = kb.shared(`i${tid.slice(2)}_${bv.slice(2)}`, warps * 4, 4);
  const [lane, warp, av, ai] = kb.regs("b32", 4);
  const p = kb.reg("pred");
  kb.op(
    `and.b32 ${lane}, ${tid}, 31;`,
    `shr.u32 ${warp}, ${tid}, 5;`,
    `mov.u32 ${av}, ${sv};`,
    `mov.u32 ${ai}, ${si};`,
    `mad.lo.u32 ${av}, ${warp}, 4, ${av};`,
    `mad.lo.u32 ${ai}, ${warp}, 4, ${ai};`,
    `setp.eq.u32 ${p}, ${lane}, 0;`,
    `@${p} st.shared.f32 [${av}], ${bv};`,
    `@${p} st.shared.u32 [${ai}], ${bi};`,
    "bar.sync 0;",
    `setp.lt.u32 ${p}, ${lane}, ${warps};`,
    `mov.u32 ${av}, ${sv};`,
    `mov.u32 ${ai}, ${si};`,
    `mad.lo.u32 ${av}, ${lane}, 4, ${av};`,
    `mad.lo.u32 ${ai}, ${lane}, 4, ${ai};`,
    `mov.f32 ${bv}, 0fFF800000;`,
    `mov.u32 ${bi}, -1;`,
    `@${p} ld.shared.f32 ${bv}, [${av}];`,
    `@${p} ld.shared.u32 ${bi}, [${ai}];`,
  );
  shuffle();
  kb.op("bar.sync 0;");
}

/**
 * argmax of each row → i32 (the first index on ties; the first NaN when the row holds one, as
 * torch.argmax). Parameters: out, x, d.
 */
export function argmaxKernel(): KernelSource {
  const c = rowPrologue("argmax_f32");
  const { kb } = c;
  const bv = kb.reg("f32");
  const bi = kb.reg("b32");
  kb.op(`mov.f32 ${bv}, 0fFF800000;`, `mov.u32 ${bi}, -1;`);
  rowLoop(c, (j, g) => keepBetter(kb, bv, bi, loadAt(kb, c.x, g), j));
  blockArgmax(kb, c.tid, bv, bi);
  const q = kb.reg("pred");
  const row = kb.reg("b32");
  kb.op(`setp.eq.u32 ${q}, ${c.tid}, 0;`, `mov.u32 ${row}, %ctaid.x;`);
  const outAt = kb.addr(c.out, row, 4);
  kb.op(`@${q} st.global.u32 [${outAt}], ${bi};`);
  return kb.build([ROW_BLOCK, 1]);
}

/**
 * top_k of each row: k passes, pass p picking the best (NaN first, then the larger value, then the
 * smaller index) among the elements that come after pass p − 1's pick in that order — so values
 * descend and ties keep index order. out: values f32 [rows, k]; indices i32 [rows, k]. Parameters: out, x, d, indices, k.
 */
export function topKKernel(): KernelSource {
  const c = rowPrologue("top_k_f32");
  const { kb } = c;
  const indices = kb.ld("indices", "u64");
  const K = kb.ld("k", "u32");
  const [lastV, bv] = kb.regs("f32", 2);
  const [lastI, bi, pass, o] = kb.regs("b32", 4);
  const top = kb.label("pass");
  const done = kb.label("passes_done");
  const pp = kb.reg("pred");
  const row = kb.reg("b32");
  kb.op(
    `mov.f32 ${lastV}, 0f7F800000;`,
    `mov.u32 ${lastI}, -1;`,
    `mov.u32 ${pass}, 0;`,
    `mov.u32 ${row}, %ctaid.x;`,
  );
  kb.place(top);
  kb.op(
    `setp.ge.u32 ${pp}, ${pass}, ${K};`,
    `@${pp} bra ${done};`,
    `mov.f32 ${bv}, 0fFF800000;`,
    `mov.u32 ${bi}, -1;`,
  );
  rowLoop(c, (j, g) => {
    const v = loadAt(kb, c.x, g);
    const after = kb.reg("pred");
    const skip = kb.label("skip");
    // after the last pick in the order (every element on the first pass)
    comesBefore(kb, after, lastV, lastI, v, j);
    kb.op(`setp.eq.or.u32 ${after}, ${pass}, 0, ${after};`, `@!${after} bra ${skip};`);
    keepBetter(kb, bv, bi, v, j);
    kb.place(skip);
  });
  blockArgmax(kb, c.tid, bv, bi);
  const lead = kb.reg("pred");
  kb.op(`setp.eq.u32 ${lead}, ${c.tid}, 0;`, `mad.lo.u32 ${o}, ${row}, ${K}, ${pass};`);
  const outAt = kb.addr(c.out, o, 4);
  const indexAt = kb.addr(indices, o, 4);
  kb.op(
    `@${lead} st.global.f32 [${outAt}], ${bv};`,
    `@${lead} st.global.u32 [${indexAt}], ${bi};`,
    `mov.f32 ${lastV}, ${bv};`,
    `mov.u32 ${lastI}, ${bi};`,
    `add.u32 ${pass}, ${pass}, 1;`,
    `bra ${top};`,
  );
  kb.place(done);
  return kb.build([ROW_BLOCK, 1]);
}

/**
 * The per-row scale of the ConvRot quantizers: the block's max |x| over the row (f32), the scale
 * `scaleOf(s, absMax)` computes from it, stored by thread 0 into scales[row] (parameter `scales`, f32
 * [rows]). Returns the scale's register.
 */
function rowScale(c: RowCtx, scaleOf: (s: string, absMax: string) => string[]): string {
  const { kb } = c;
  const scales = kb.ld("scales", "u64");
  const mx = kb.reg("f32");
  kb.op(`mov.f32 ${mx}, 0f00000000;`);
  rowLoop(c, (_j, g) => {
    const x = loadAt(kb, c.x, g);
    kb.op(`abs.f32 ${x}, ${x};`, `max.NaN.f32 ${mx}, ${mx}, ${x};`);
  });
  // NaN-propagating: a row holding NaN gets a NaN scale, so its outputs are NaN as the reference's
  const a = kb.blockReduce(mx, "max_nan", ROW_BLOCK);
  const s = kb.reg("f32");
  kb.op(...scaleOf(s, a));
  const p = kb.reg("pred");
  const row = kb.reg("b32");
  kb.op(`setp.eq.u32 ${p}, ${c.tid}, 0;`, `mov.u32 ${row}, %ctaid.x;`);
  const scaleAt = kb.addr(scales, row, 4);
  kb.op(`@${p} st.global.f32 [${scaleAt}], ${s};`);
  return s;
}

/**
 * ConvRot activation quantization of rotated rows (krea2.md §1.7 step 2): s_x = max(max|x| / 127,
 * 1e-30) into scales[row], q = clamp(round_half_even(x / s_x), −128, 127) as int8 into out.
 * Parameters: out (s8 [rows, d]), x (f32 [rows, d]), d, scales (f32 [rows]).
 */
export function quantizeRowsInt8Kernel(): KernelSource {
  const c = rowPrologue("convrot_quantize_rows_int8");
  const { kb } = c;
  const s = rowScale(c, (s, a) => [
    `div.rn.f32 ${s}, ${a}, ${f32Imm(127)};`,
    `max.NaN.f32 ${s}, ${s}, ${f32Imm(1e-30)};`,
  ]);
  rowLoop(c, (_j, g) => {
    const x = loadAt(kb, c.x, g);
    const q = kb.reg("b32");
    kb.op(
      `div.rn.f32 ${x}, ${x}, ${s};`,
      `cvt.rni.s32.f32 ${q}, ${x};`,
      `min.s32 ${q}, ${q}, 127;`,
      `max.s32 ${q}, ${q}, -128;`,
    );
    const outAt = kb.addr(c.out, g, 1);
    kb.op(`st.global.s8 [${outAt}], ${q};`);
  });
  return kb.build([ROW_BLOCK, 1]);
}

/**
 * ConvRot W4A4 activation quantization of rotated rows (krea2.md §1.8): s_x = max(max|x|, 1e-10) / 7
 * into scales[row], q = clamp(round_half_even(x / s_x), −7, 7), packed two per byte (element 2k in the
 * low nibble) into out [rows, d/2]. d even. Parameters: out, x, d, scales. Grid: one block per row.
 */
export function quantizeRowsInt4Kernel(): KernelSource {
  const c = rowPrologue("convrot_quantize_rows_int4");
  const { kb } = c;
  const s = rowScale(c, (s, a) => [
    `max.NaN.f32 ${s}, ${a}, ${f32Imm(1e-10)};`,
    `div.rn.f32 ${s}, ${s}, ${f32Imm(7)};`,
  ]);
  // pairs: thread loop over k < d/2, elements 2k and 2k + 1
  const [pair, pairs, e, byte, q0, q1, o] = kb.regs("b32", 7);
  const top = kb.label("pair");
  const done = kb.label("pairs_done");
  const q = kb.reg("pred");
  kb.op(`shr.u32 ${pairs}, ${c.d}, 1;`, `mov.u32 ${pair}, ${c.tid};`);
  kb.place(top);
  kb.op(
    `setp.ge.u32 ${q}, ${pair}, ${pairs};`,
    `@${q} bra ${done};`,
    `mad.lo.u32 ${e}, ${pair}, 2, ${c.rowStart};`,
  );
  for (const [k, r] of [
    [0, q0],
    [1, q1],
  ] as const) {
    const x = kb.reg("f32");
    const ek = kb.reg("b32");
    kb.op(`add.u32 ${ek}, ${e}, ${k};`);
    const xAt = kb.addr(c.x, ek, 4);
    kb.op(
      `ld.global.f32 ${x}, [${xAt}];`,
      `div.rn.f32 ${x}, ${x}, ${s};`,
      `cvt.rni.s32.f32 ${r}, ${x};`,
      `min.s32 ${r}, ${r}, 7;`,
      `max.s32 ${r}, ${r}, -7;`,
      `and.b32 ${r}, ${r}, 15;`,
    );
  }
  kb.op(
    `shl.b32 ${byte}, ${q1}, 4;`,
    `or.b32 ${byte}, ${byte}, ${q0};`,
    `shr.u32 ${o}, ${c.rowStart}, 1;`,
    `add.u32 ${o}, ${o}, ${pair};`,
  );
  const outAt = kb.addr(c.out, o, 1);
  kb.op(`st.global.u8 [${outAt}], ${byte};`, `add.u32 ${pair}, ${pair}, ${ROW_BLOCK};`, `bra ${top};`);
  kb.place(done);
  return kb.build([ROW_BLOCK, 1]);
}

/**
 * ConvRot activation quantization applied and undone (for the few-row GEMV / tiled kernels that take
 * f32 x): out[row, j] = clamp(round_half_even(x / s_x), lo, hi) · s_x in f32, with s_x and the clamp of
 * {@link quantizeRowsInt8Kernel} (bits 8: max|x| / 127, [−128, 127]) or {@link quantizeRowsInt4Kernel}
 * (bits 4: max(max|x|, 1e-10) / 7, [−7, 7]); s_x into scales[row]. The product with the integer weight
 * codes is then the W8A8 / W4A4 product up to f32 rounding of the partial sums. Parameters: out, x, d,
 * scales. Grid: one block per row. Source: krea2.md §1.8 (ComfyUI's W8A8 / W4A4 activations).
 */
export function fakeQuantizeRowsKernel(bits: 8 | 4): KernelSource {
  const c = rowPrologue(`convrot_fake_quantize_rows_int${bits}`);
  const { kb } = c;
  const s = rowScale(c, (s, a) =>
    bits === 8
      ? [`div.rn.f32 ${s}, ${a}, ${f32Imm(127)};`, `max.NaN.f32 ${s}, ${s}, ${f32Imm(1e-30)};`]
      : [`max.NaN.f32 ${s}, ${a}, ${f32Imm(1e-10)};`, `div.rn.f32 ${s}, ${s}, ${f32Imm(7)};`],
  );
  const [hi, lo] = bits === 8 ? [127, -128] : [7, -7];
  rowLoop(c, (_j, g) => {
    const x = loadAt(kb, c.x, g);
    const q = kb.reg("b32");
    kb.op(
      `div.rn.f32 ${x}, ${x}, ${s};`,
      `cvt.rni.s32.f32 ${q}, ${x};`,
      `min.s32 ${q}, ${q}, ${hi};`,
      `max.s32 ${q}, ${q}, ${lo};`,
      `cvt.rn.f32.s32 ${x}, ${q};`,
      `mul.f32 ${x}, ${x}, ${s};`,
    );
    const outAt = kb.addr(c.out, g, 4);
    kb.op(`st.global.f32 [${outAt}], ${x};`);
  });
  return kb.build([ROW_BLOCK, 1]);
}

/** Largest finite fp8 e4m3 (OCP FP8 E4M3FN: S.1111.110 = 448). */
export const E4M3_MAX = 448;

/**
 * Per-row fp8 e4m3 quantization of activations for the fp8 tensor-core matmul (sm_89+, opt-in
 * TP_PTX_FP8_MMA=1): s_x = max(max|x| / 448, 1e-30) into scales[row], q = e4m3(x / s_x) rounded to
 * nearest even and saturated to ±448 (`cvt.rn.satfinite.e4m3x2.f32`) into out [rows, d] (one byte
 * each). Parameters: out (e4m3 [rows, d]), x (f32 [rows, d]), d, scales (f32 [rows]). Grid: one block
 * per row. Source: PTX ISA §9.7.9.21 cvt (.e4m3x2, .satfinite); OCP 8-bit floating point spec (E4M3).
 */
export function quantizeRowsFp8Kernel(): KernelSource {
  const c = rowPrologue("quantize_rows_fp8_e4m3");
  const { kb } = c;
  const s = rowScale(c, (s, a) => [
    `div.rn.f32 ${s}, ${a}, ${f32Imm(E4M3_MAX)};`,
    `max.NaN.f32 ${s}, ${s}, ${f32Imm(1e-30)};`,
  ]);
  rowLoop(c, (_j, g) => {
    const x = loadAt(kb, c.x, g);
    const h = kb.reg("b16");
    const q = kb.reg("b32");
    const zero = kb.reg("f32");
    kb.op(
      `div.rn.f32 ${x}, ${x}, ${s};`,
      `mov.f32 ${zero}, 0f00000000;`,
      `cvt.rn.satfinite.e4m3x2.f32 ${h}, ${zero}, ${x};`,
      `cvt.u32.u16 ${q}, ${h};`,
    );
    const outAt = kb.addr(c.out, g, 1);
    kb.op(`st.global.u8 [${outAt}], ${q};`);
  });
  return kb.build([ROW_BLOCK, 1], 89);
}
