/**
 * Position, gather and small convolution kernels: rope, embedding (get_rows) for every float and GGUF
 * block format the matmuls read, conv2d (direct), ssm_conv, and the ConvRot Hadamard rotation.
 *
 * Sources: RoFormer (arXiv:2104.09864) §3.4 — neox pairs (i, i + d/2), interleaved (2i, 2i + 1);
 * GGUF blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K … Q6_K) — ./blocks.ts, ../shared/spec/llm.md §2;
 * ConvRot rotation — ../shared/spec/krea2.md §1.6 (the 4-point butterfly per base-4 digit, ÷ √G).
 */
import { TpError } from "@tp/tensor";
import {
  type BlockFormat,
  blockRowBytes,
  blockRowBytesOps,
  isBlockFormat,
  loadBlockElement,
} from "./blocks.ts";
import { ELEMENTWISE_BLOCK, type FloatDtype, floatBytes, loadF32 } from "./elementwise.ts";
import { f32Imm, f64Imm, KernelBuilder, type KernelSource } from "./emit.ts";

/** Weight formats whose elements the kernels decode one at a time. */
export type ElementFormat =
  | FloatDtype
  | "f8_e4m3fn"
  | "f8_e5m2"
  | BlockFormat
  | "int8_convrot"
  | "int4_convrot";

/** Bytes of one row of K elements in `format`. */
export function rowBytes(format: ElementFormat, k: number): number {
  if (isBlockFormat(format)) return blockRowBytes(format, k);
  switch (format) {
    case "int8_convrot":
    case "f8_e4m3fn":
    case "f8_e5m2":
      return k;
    case "int4_convrot":
      return k / 2;
    default:
      return k * floatBytes(format);
  }
}

/**
 * Element k of the row at `row` (a 64-bit address) as f32 (ConvRot: the integer, unscaled — the
 * per-row scale is applied by the caller).
 */
export function loadElement(kb: KernelBuilder, format: ElementFormat, row: string, k: string): string {
  if (format === "f32" || format === "f16" || format === "bf16")
    return loadF32(kb, kb.addr(row, k, floatBytes(format)), format);
  const f = kb.reg("f32");
  const q = kb.reg("b32");
  if (format === "f8_e5m2") {
    // e5m2 is the top byte of an f16 (same exponent bias and width): widen and convert
    const h = kb.reg("b16");
    const at = kb.addr(row, k, 1);
    kb.op(
      `ld.global.u8 ${q}, [${at}];`,
      `shl.b32 ${q}, ${q}, 8;`,
      `cvt.u16.u32 ${h}, ${q};`,
      `cvt.f32.f16 ${f}, ${h};`,
    );
    return f;
  }
  if (format === "f8_e4m3fn") return decodeE4m3(kb, row, k, q, f);
  if (format === "int8_convrot") {
    const at = kb.addr(row, k, 1);
    kb.op(`ld.global.s8 ${q}, [${at}];`, `cvt.rn.f32.s32 ${f}, ${q};`);
    return f;
  }
  if (format === "int4_convrot") {
    const byte = kb.reg("b32");
    const sh = kb.reg("b32");
    kb.op(`shr.u32 ${byte}, ${k}, 1;`);
    const at = kb.addr(row, byte, 1);
    kb.op(
      `ld.global.u8 ${q}, [${at}];`,
      `and.b32 ${sh}, ${k}, 1;`,
      `shl.b32 ${sh}, ${sh}, 2;`,
      `shr.u32 ${q}, ${q}, ${sh};`,
      // signed nibble: bits 0..3 sign-extended
      `shl.b32 ${q}, ${q}, 28;`,
      `shr.s32 ${q}, ${q}, 28;`,
      `cvt.rn.f32.s32 ${f}, ${q};`,
    );
    return f;
  }
  return loadBlockElement(kb, format, row, k);
}

/**
 * fp8 e4m3fn (OCP FP8: sign, 4 exponent bits with bias 7, 3 mantissa bits, no infinities, S.1111.111
 * is NaN) → f32 by integer ops (any sm): normal values rebias the exponent into f32's; subnormals are
 * m · 2^−9.
 */
function decodeE4m3(kb: KernelBuilder, row: string, k: string, q: string, f: string): string {
  const [e, m, sign, bits] = kb.regs("b32", 4);
  const sub = kb.reg("pred");
  const nan = kb.reg("pred");
  const fs = kb.reg("f32");
  const at = kb.addr(row, k, 1);
  kb.op(
    `ld.global.u8 ${q}, [${at}];`,
    `shr.u32 ${e}, ${q}, 3;`,
    `and.b32 ${e}, ${e}, 15;`,
    `and.b32 ${m}, ${q}, 7;`,
    `and.b32 ${sign}, ${q}, 128;`,
    `shl.b32 ${sign}, ${sign}, 24;`,
    // normal: (e − 7 + 127) << 23 | m << 20
    `add.u32 ${bits}, ${e}, 120;`,
    `shl.b32 ${bits}, ${bits}, 23;`,
    `shl.b32 ${m}, ${m}, 20;`,
    `or.b32 ${bits}, ${bits}, ${m};`,
    `or.b32 ${bits}, ${bits}, ${sign};`,
    `mov.b32 ${f}, ${bits};`,
    // subnormal (e = 0): m · 2^−9 with the sign
    `setp.eq.u32 ${sub}, ${e}, 0;`,
    `shr.u32 ${m}, ${m}, 20;`,
    `cvt.rn.f32.u32 ${fs}, ${m};`,
    `mul.f32 ${fs}, ${fs}, ${f32Imm(2 ** -9)};`,
    `setp.ne.u32 ${nan}, ${sign}, 0;`,
    `@${nan} neg.f32 ${fs}, ${fs};`,
    `@${sub} mov.f32 ${f}, ${fs};`,
    // NaN: the low 7 bits all ones
    `and.b32 ${bits}, ${q}, 127;`,
    `setp.eq.u32 ${nan}, ${bits}, 127;`,
    `@${nan} mov.f32 ${f}, 0f7FC00000;`,
  );
  return f;
}

/** Prologue of a 1-D kernel over n outputs: the index and the exit label. */
function linear(kb: KernelBuilder): { i: string; end: string } {
  const n = kb.ld("n", "u32");
  const i = kb.globalIndex();
  const p = kb.reg("pred");
  const end = kb.label("end");
  kb.op(`setp.ge.u32 ${p}, ${i}, ${n};`, `@${p} bra ${end};`);
  return { i, end };
}

/**
 * embedding (ggml get_rows): out [rows, D] f32 = table[ids[r]] decoded; an id outside [0, vocab) gives a
 * row of NaN. Parameters: out, table, ids, n (rows·D), D, vocab.
 */
export function embeddingKernel(format: ElementFormat): KernelSource {
  if (format === "int8_convrot" || format === "int4_convrot")
    throw new TpError("E_INTERNAL", "no ConvRot embedding");
  const kb = new KernelBuilder(`embedding_${format}`);
  const out = kb.ld("out", "u64");
  const table = kb.ld("table", "u64");
  const ids = kb.ld("ids", "u64");
  const { i, end } = linear(kb);
  const D = kb.ld("d", "u32");
  const vocab = kb.ld("vocab", "u32");
  const r = kb.reg("b32");
  const c = kb.reg("b32");
  const id = kb.reg("b32");
  const bad = kb.reg("pred");
  const v = kb.reg("f32");
  const skip = kb.label("bad");
  const store = kb.label("store");
  kb.op(`div.u32 ${r}, ${i}, ${D};`, `mul.lo.u32 ${c}, ${r}, ${D};`, `sub.u32 ${c}, ${i}, ${c};`);
  const idAt = kb.addr(ids, r, 4);
  kb.op(
    `ld.global.u32 ${id}, [${idAt}];`,
    `setp.ge.u32 ${bad}, ${id}, ${vocab};`,
    `mov.f32 ${v}, 0f7FC00000;`,
    `@${bad} bra ${skip};`,
  );
  // row address: table + id · rowBytes(D); rowBytes is linear in D for every format
  const rb = kb.reg("b32");
  const perRow = isBlockFormat(format)
    ? blockRowBytesOps(format, rb, D)
    : [`mul.lo.u32 ${rb}, ${D}, ${rowBytes(format, 1)};`];
  kb.op(...perRow);
  const rowAddr = kb.reg("b64");
  kb.op(`mul.wide.u32 ${rowAddr}, ${id}, ${rb};`, `add.u64 ${rowAddr}, ${rowAddr}, ${table};`);
  const e = loadElement(kb, format, rowAddr, c);
  kb.op(`mov.f32 ${v}, ${e};`, `bra ${store};`);
  kb.place(skip);
  kb.place(store);
  const outAt = kb.addr(out, i, 4);
  kb.op(`st.global.f32 [${outAt}], ${v};`);
  kb.place(end);
  return kb.build([ELEMENTWISE_BLOCK, 1]);
}

/** Rope layout folded into a kernel. */
export interface RopeSpec {
  readonly mode: "neox" | "interleaved";
  /** Rotated dimensions per head (even). */
  readonly ropeDims: number;
  /** Pairs per axis (multi-axis rope), or [] for one axis. */
  readonly sections: readonly number[];
}

/** sin and cos of an f64 angle: reduce by 2π (two-part constant), then Taylor series to degree 19/20 in f64. */
function sinCos(kb: KernelBuilder, angle: string): { sin: string; cos: string } {
  const k = kb.reg("f64");
  const r = kb.reg("f64");
  const r2 = kb.reg("f64");
  const TWO_PI_HI = 6.283185307179586;
  const TWO_PI_LO = 2.4492935982947064e-16;
  kb.op(
    `mul.f64 ${k}, ${angle}, ${f64Imm(1 / TWO_PI_HI)};`,
    `cvt.rni.f64.f64 ${k}, ${k};`,
    `neg.f64 ${k}, ${k};`,
    `fma.rn.f64 ${r}, ${k}, ${f64Imm(TWO_PI_HI)}, ${angle};`,
    `fma.rn.f64 ${r}, ${k}, ${f64Imm(TWO_PI_LO)}, ${r};`,
    `mul.f64 ${r2}, ${r}, ${r};`,
  );
  // sin r = r Σ (−1)^n r^(2n) / (2n+1)!, cos r = Σ (−1)^n r^(2n) / (2n)!, Horner in r².
  const fact = (m: number) => {
    let f = 1;
    for (let i = 2; i <= m; i++) f *= i;
    return f;
  };
  const s = kb.reg("f64");
  const c = kb.reg("f64");
  kb.op(`mov.f64 ${s}, ${f64Imm((-1) ** 9 / fact(19))};`, `mov.f64 ${c}, ${f64Imm((-1) ** 10 / fact(20))};`);
  for (let n = 8; n >= 0; n--) kb.op(`fma.rn.f64 ${s}, ${s}, ${r2}, ${f64Imm((-1) ** n / fact(2 * n + 1))};`);
  for (let n = 9; n >= 0; n--) kb.op(`fma.rn.f64 ${c}, ${c}, ${r2}, ${f64Imm((-1) ** n / fact(2 * n))};`);
  kb.op(`mul.f64 ${s}, ${s}, ${r};`);
  const sf = kb.reg("f32");
  const cf = kb.reg("f32");
  kb.op(`cvt.rn.f32.f64 ${sf}, ${s};`, `cvt.rn.f32.f64 ${cf}, ${c};`);
  return { sin: sf, cos: cf };
}

/** The entry name of a rope kernel. */
export function ropeKernelName(s: RopeSpec): string {
  return `rope_f32_${s.mode}_d${s.ropeDims}${s.sections.length > 0 ? `_s${s.sections.join("_")}` : ""}`;
}

/**
 * rope over x [batch, seq_len, heads, head_dim] contiguous. Pair i turns by pos · invFreq[i] (invFreq:
 * an f64 table [ropeDims/2] made on the host, freqScale folded in); pairs of section a read positions
 * row a ([axes, seq_len] i32). Dimensions past ropeDims are copied. Angles in f64.
 * Parameters: out, x, positions, invFreq, n, head_dim, heads, seq_len.
 */
export function ropeKernel(s: RopeSpec): KernelSource {
  if (s.ropeDims % 2 !== 0 || s.ropeDims < 2) throw new TpError("E_INTERNAL", `rope dims ${s.ropeDims}`);
  const half = s.ropeDims / 2;
  const kb = new KernelBuilder(ropeKernelName(s));
  const out = kb.ld("out", "u64");
  const x = kb.ld("x", "u64");
  const positions = kb.ld("positions", "u64");
  const invFreq = kb.ld("inv_freq", "u64");
  const { i, end } = linear(kb);
  const D = kb.ld("head_dim", "u32");
  const H = kb.ld("heads", "u32");
  const S = kb.ld("seq_len", "u32");
  const row = kb.reg("b32");
  const d = kb.reg("b32");
  const tok = kb.reg("b32");
  const pass = kb.reg("pred");
  const copy = kb.label("copy");
  const xv = kb.reg("f32");
  kb.op(`div.u32 ${row}, ${i}, ${D};`, `mul.lo.u32 ${d}, ${row}, ${D};`, `sub.u32 ${d}, ${i}, ${d};`);
  const xAt = kb.addr(x, i, 4);
  kb.op(
    `ld.global.f32 ${xv}, [${xAt}];`,
    `setp.ge.u32 ${pass}, ${d}, ${s.ropeDims};`,
    `@${pass} bra ${copy};`,
    `div.u32 ${tok}, ${row}, ${H};`,
    `rem.u32 ${tok}, ${tok}, ${S};`,
  );
  // pair index, partner element, and the sign of the partner's term
  const pair = kb.reg("b32");
  const partner = kb.reg("b32");
  const first = kb.reg("pred");
  if (s.mode === "neox") {
    kb.op(
      `setp.lt.u32 ${first}, ${d}, ${half};`,
      `rem.u32 ${pair}, ${d}, ${half};`,
      `selp.b32 ${partner}, ${half}, -${half}, ${first};`,
      `add.s32 ${partner}, ${i}, ${partner};`,
    );
  } else {
    const odd = kb.reg("b32");
    kb.op(
      `and.b32 ${odd}, ${d}, 1;`,
      `setp.eq.u32 ${first}, ${odd}, 0;`,
      `shr.u32 ${pair}, ${d}, 1;`,
      `selp.b32 ${partner}, 1, -1, ${first};`,
      `add.s32 ${partner}, ${i}, ${partner};`,
    );
  }
  // axis of the pair (sections folded in): position index = axis · S + tok
  const pidx = kb.reg("b32");
  kb.op(`mov.u32 ${pidx}, ${tok};`);
  if (s.sections.length > 0) {
    let start = 0;
    const axis = kb.reg("b32");
    const q = kb.reg("pred");
    kb.op(`mov.u32 ${axis}, 0;`);
    s.sections.forEach((n, a) => {
      if (a > 0) kb.op(`setp.ge.u32 ${q}, ${pair}, ${start};`, `@${q} mov.u32 ${axis}, ${a};`);
      start += n;
    });
    kb.op(`mad.lo.u32 ${pidx}, ${axis}, ${S}, ${tok};`);
  }
  const pos = kb.reg("b32");
  const posd = kb.reg("f64");
  const fq = kb.reg("f64");
  const posAt = kb.addr(positions, pidx, 4);
  const fqAt = kb.addr(invFreq, pair, 8);
  kb.op(
    `ld.global.s32 ${pos}, [${posAt}];`,
    `cvt.rn.f64.s32 ${posd}, ${pos};`,
    `ld.global.f64 ${fq}, [${fqAt}];`,
    `mul.f64 ${posd}, ${posd}, ${fq};`,
  );
  const { sin, cos } = sinCos(kb, posd);
  const pv = kb.reg("f32");
  const y = kb.reg("f32");
  const partnerAt = kb.addr(x, partner, 4);
  kb.op(
    `ld.global.f32 ${pv}, [${partnerAt}];`,
    // first of the pair: x cos − partner sin; second: x cos + partner sin
    `@${first} neg.f32 ${pv}, ${pv};`,
    `mul.rn.f32 ${y}, ${xv}, ${cos};`,
    `mul.rn.f32 ${pv}, ${pv}, ${sin};`,
    `add.rn.f32 ${xv}, ${y}, ${pv};`,
  );
  kb.place(copy);
  const outAt = kb.addr(out, i, 4);
  kb.op(`st.global.f32 [${outAt}], ${xv};`);
  kb.place(end);
  return kb.build([ELEMENTWISE_BLOCK, 1]);
}

/** conv2d geometry folded into a kernel. */
export interface Conv2dSpec {
  readonly kh: number;
  readonly kw: number;
  readonly stride: readonly [number, number];
  readonly padding: readonly [number, number];
  readonly bias: boolean;
}

export function conv2dKernelName(s: Conv2dSpec): string {
  return `conv2d_f32_k${s.kh}x${s.kw}_s${s.stride.join("x")}_p${s.padding.join("x")}${s.bias ? "_b" : ""}`;
}

/**
 * Direct conv2d (cross-correlation), one thread per output element: out[b, co, oy, ox] = bias[co] +
 * Σ_{ci, ky, kx} x[b, ci, oy·sh − ph + ky, ox·sw − pw + kx] · w[co, ci, ky, kx] (zero outside).
 * Parameters: out, x, w, [bias], n, c_in, h, w, c_out, h_out, w_out.
 */
export function conv2dKernel(s: Conv2dSpec): KernelSource {
  const kb = new KernelBuilder(conv2dKernelName(s));
  const out = kb.ld("out", "u64");
  const x = kb.ld("x", "u64");
  const w = kb.ld("w", "u64");
  const bias = s.bias ? kb.ld("bias", "u64") : null;
  const { i, end } = linear(kb);
  const [cin, H, W, cout, Ho, Wo] = ["c_in", "h", "w_in", "c_out", "h_out", "w_out"].map((n) =>
    kb.ld(n, "u32"),
  ) as [string, string, string, string, string, string];
  const [ox, oy, co, b, t] = kb.regs("b32", 5);
  kb.op(
    `rem.u32 ${ox}, ${i}, ${Wo};`,
    `div.u32 ${t}, ${i}, ${Wo};`,
    `rem.u32 ${oy}, ${t}, ${Ho};`,
    `div.u32 ${t}, ${t}, ${Ho};`,
    `rem.u32 ${co}, ${t}, ${cout};`,
    `div.u32 ${b}, ${t}, ${cout};`,
  );
  const acc = kb.reg("f32");
  kb.op(`mov.f32 ${acc}, 0f00000000;`);
  if (bias !== null) {
    const biasAt = kb.addr(bias, co, 4);
    kb.op(`ld.global.f32 ${acc}, [${biasAt}];`);
  }
  const ci = kb.reg("b32");
  const top = kb.label("ci");
  const done = kb.label("ci_done");
  const p = kb.reg("pred");
  const y0 = kb.reg("b32");
  const x0 = kb.reg("b32");
  kb.op(
    `mul.lo.u32 ${y0}, ${oy}, ${s.stride[0]};`,
    `sub.s32 ${y0}, ${y0}, ${s.padding[0]};`,
    `mul.lo.u32 ${x0}, ${ox}, ${s.stride[1]};`,
    `sub.s32 ${x0}, ${x0}, ${s.padding[1]};`,
    `mov.u32 ${ci}, 0;`,
  );
  kb.place(top);
  kb.op(`setp.ge.u32 ${p}, ${ci}, ${cin};`, `@${p} bra ${done};`);
  const plane = kb.reg("b32");
  const wbase = kb.reg("b32");
  kb.op(
    `mad.lo.u32 ${plane}, ${b}, ${cin}, ${ci};`,
    `mul.lo.u32 ${plane}, ${plane}, ${H};`,
    `mad.lo.u32 ${wbase}, ${co}, ${cin}, ${ci};`,
    `mul.lo.u32 ${wbase}, ${wbase}, ${s.kh * s.kw};`,
  );
  for (let ky = 0; ky < s.kh; ky++) {
    const yy = kb.reg("b32");
    const inY = kb.reg("pred");
    kb.op(`add.s32 ${yy}, ${y0}, ${ky};`, `setp.lt.u32 ${inY}, ${yy}, ${H};`);
    for (let kx = 0; kx < s.kw; kx++) {
      const xx = kb.reg("b32");
      const ok = kb.reg("pred");
      const idx = kb.reg("b32");
      const xv = kb.reg("f32");
      const wv = kb.reg("f32");
      kb.op(
        `add.s32 ${xx}, ${x0}, ${kx};`,
        `setp.lt.and.u32 ${ok}, ${xx}, ${W}, ${inY};`,
        `add.u32 ${idx}, ${plane}, ${yy};`,
        `mad.lo.u32 ${idx}, ${idx}, ${W}, ${xx};`,
        `mov.f32 ${xv}, 0f00000000;`,
      );
      const xAt = kb.addr(x, idx, 4);
      kb.op(`@${ok} ld.global.f32 ${xv}, [${xAt}];`, `add.u32 ${idx}, ${wbase}, ${ky * s.kw + kx};`);
      const wAt = kb.addr(w, idx, 4);
      kb.op(`ld.global.f32 ${wv}, [${wAt}];`, `fma.rn.f32 ${acc}, ${xv}, ${wv}, ${acc};`);
    }
  }
  kb.op(`add.u32 ${ci}, ${ci}, 1;`, `bra ${top};`);
  kb.place(done);
  const outAt = kb.addr(out, i, 4);
  kb.op(`st.global.f32 [${outAt}], ${acc};`);
  kb.place(end);
  return kb.build([ELEMENTWISE_BLOCK, 1]);
}

/**
 * ssm_conv: out[t][c] = Σ_j w[c][j] · x[t + j][c], K taps folded in. Parameters: out, x, w, n (T·C), C.
 */
export function ssmConvKernel(taps: number): KernelSource {
  const kb = new KernelBuilder(`ssm_conv_f32_k${taps}`);
  const out = kb.ld("out", "u64");
  const x = kb.ld("x", "u64");
  const w = kb.ld("w", "u64");
  const { i, end } = linear(kb);
  const C = kb.ld("c", "u32");
  const c = kb.reg("b32");
  kb.op(`rem.u32 ${c}, ${i}, ${C};`);
  const acc = kb.reg("f32");
  kb.op(`mov.f32 ${acc}, 0f00000000;`);
  for (let j = 0; j < taps; j++) {
    const xi = kb.reg("b32");
    const wi = kb.reg("b32");
    const xv = kb.reg("f32");
    const wv = kb.reg("f32");
    kb.op(`mad.lo.u32 ${xi}, ${C}, ${j}, ${i};`, `mad.lo.u32 ${wi}, ${c}, ${taps}, ${j};`);
    const xAt = kb.addr(x, xi, 4);
    const wAt = kb.addr(w, wi, 4);
    kb.op(
      `ld.global.f32 ${xv}, [${xAt}];`,
      `ld.global.f32 ${wv}, [${wAt}];`,
      `fma.rn.f32 ${acc}, ${wv}, ${xv}, ${acc};`,
    );
  }
  const outAt = kb.addr(out, i, 4);
  kb.op(`st.global.f32 [${outAt}], ${acc};`);
  kb.place(end);
  return kb.build([ELEMENTWISE_BLOCK, 1]);
}

/**
 * ConvRot rotation (krea2.md §1.6) of rows of a contiguous f32 [rows, K] in place-free form: block
 * (row, group) of G/4 threads; each pass of the 4-point butterfly acts on one base-4 digit of the
 * index, in shared memory; the result is scaled by 1/√G. G (a power of 4, 16..4096) is folded in.
 * Parameters: out, x, k (row length). Grid: (K/G, rows).
 */
export function rotateKernel(group: number): KernelSource {
  let passes = 0;
  for (let g = group; g > 1; g /= 4) passes++;
  if (4 ** passes !== group || group < 16 || group > 4096)
    throw new TpError("E_INTERNAL", `rotation group ${group}`);
  const threads = group / 4;
  const kb = new KernelBuilder(`convrot_rotate_g${group}`);
  const out = kb.ld("out", "u64");
  const x = kb.ld("x", "u64");
  const K = kb.ld("k", "u32");
  const sh = kb.shared("v", group * 4, 16);
  const t = kb.reg("b32");
  const base = kb.reg("b32");
  kb.op(`mov.u32 ${t}, %tid.x;`, `mov.u32 ${base}, %ctaid.y;`, `mul.lo.u32 ${base}, ${base}, ${K};`);
  const g0 = kb.reg("b32");
  kb.op(`mov.u32 ${g0}, %ctaid.x;`, `mad.lo.u32 ${base}, ${g0}, ${group}, ${base};`);
  const sa = kb.reg("b32");
  // load 4 values per thread: t, t + G/4, t + G/2, t + 3G/4 (coalesced)
  for (let q = 0; q < 4; q++) {
    const e = kb.reg("b32");
    const v = kb.reg("f32");
    kb.op(`add.u32 ${e}, ${t}, ${q * threads};`, `add.u32 ${sa}, ${base}, ${e};`);
    const xAt = kb.addr(x, sa, 4);
    kb.op(
      `ld.global.f32 ${v}, [${xAt}];`,
      `mov.u32 ${sa}, ${sh};`,
      `mad.lo.u32 ${sa}, ${e}, 4, ${sa};`,
      `st.shared.f32 [${sa}], ${v};`,
    );
  }
  kb.op("bar.sync 0;");
  for (let pass = 0, s = 1; pass < passes; pass++, s *= 4) {
    // p = (t / s)·4s + t % s; the four values at p, p + s, p + 2s, p + 3s
    const p = kb.reg("b32");
    const o = kb.reg("b32");
    kb.op(`div.u32 ${p}, ${t}, ${s};`, `rem.u32 ${o}, ${t}, ${s};`, `mad.lo.u32 ${p}, ${p}, ${4 * s}, ${o};`);
    const addrs = [0, 1, 2, 3].map((m) => {
      const a = kb.reg("b32");
      kb.op(`add.u32 ${a}, ${p}, ${m * s};`, `mov.u32 ${sa}, ${sh};`, `mad.lo.u32 ${a}, ${a}, 4, ${sa};`);
      return a;
    });
    const [a, b, c, d] = addrs.map((ad) => {
      const v = kb.reg("f32");
      kb.op(`ld.shared.f32 ${v}, [${ad}];`);
      return v;
    }) as [string, string, string, string];
    const [ab, r0, r1, r2, r3] = kb.regs("f32", 5);
    kb.op(
      `add.f32 ${ab}, ${a}, ${b};`,
      `add.f32 ${r0}, ${ab}, ${c};`,
      `sub.f32 ${r0}, ${r0}, ${d};`, // a + b + c − d
      `sub.f32 ${r1}, ${ab}, ${c};`,
      `add.f32 ${r1}, ${r1}, ${d};`, // a + b − c + d
      // left to right, as @tp/quant hadamardTransform rounds (the cpu and Vulkan backends match it bit for bit)
      `sub.f32 ${r2}, ${a}, ${b};`,
      `add.f32 ${r2}, ${r2}, ${c};`,
      `add.f32 ${r2}, ${r2}, ${d};`, // a − b + c + d
      `sub.f32 ${r3}, ${b}, ${a};`,
      `add.f32 ${r3}, ${r3}, ${c};`,
      `add.f32 ${r3}, ${r3}, ${d};`, // −a + b + c + d
      "bar.sync 0;",
    );
    for (const [m, r] of [r0, r1, r2, r3].entries()) kb.op(`st.shared.f32 [${addrs[m]}], ${r};`);
    kb.op("bar.sync 0;");
  }
  for (let q = 0; q < 4; q++) {
    const e = kb.reg("b32");
    const v = kb.reg("f32");
    kb.op(
      `add.u32 ${e}, ${t}, ${q * threads};`,
      `mov.u32 ${sa}, ${sh};`,
      `mad.lo.u32 ${sa}, ${e}, 4, ${sa};`,
      `ld.shared.f32 ${v}, [${sa}];`,
      `mul.f32 ${v}, ${v}, ${f32Imm(1 / Math.sqrt(group))};`,
      `add.u32 ${sa}, ${base}, ${e};`,
    );
    const outAt = kb.addr(out, sa, 4);
    kb.op(`st.global.f32 [${outAt}], ${v};`);
  }
  return kb.build([threads, 1]);
}

/**
 * The gated delta rule (Yang et al. 2024, eq. 10), token by token: thread (head j, value dim b) owns
 * column b of S_j (S[a][b], a < Dk, updated in place in `state`), since every step acts on columns
 * independently: S ← e^g S; δ_b = β (v_b − Σ_a S[a][b] k_a); S[a][b] += k_a δ_b; out_b = scale ·
 * Σ_a S[a][b] q_a. Value head j reads key head j mod Hk. Grid (ceil(Dv / 128), Hv), 128 threads.
 * Parameters: out, q, k, v, g, beta, state, n, hk, hv, dk, dv, scale.
 */
export function gatedDeltaNetKernel(): KernelSource {
  const kb = new KernelBuilder("gated_delta_net_f32");
  const [out, q, k, v, g, beta, state] = kb.lds("u64", "out", "q", "k", "v", "g", "beta", "state");
  const [n, hk, hv, dk, dv] = kb.lds("u32", "n", "hk", "hv", "dk", "dv");
  const scale = kb.ld("scale", "f32");
  const [b, j, kh, t, a, sBase, qkRow, vRow, idx] = kb.regs("b32", 9);
  const end = kb.label("end");
  const p = kb.reg("pred");
  kb.op(
    `mov.u32 ${b}, %ctaid.x;`,
    `mov.u32 ${t}, %tid.x;`,
    `mad.lo.u32 ${b}, ${b}, ${ELEMENTWISE_BLOCK / 2}, ${t};`,
    `setp.ge.u32 ${p}, ${b}, ${dv};`,
    `@${p} bra ${end};`,
    `mov.u32 ${j}, %ctaid.y;`,
    `rem.u32 ${kh}, ${j}, ${hk};`,
    `mul.lo.u32 ${sBase}, ${j}, ${dk};`, // state row of (j, a = 0): (j·Dk + a)·Dv + b
    `mov.u32 ${t}, 0;`,
  );
  const tokens = kb.label("token");
  const tokensDone = kb.label("tokens_done");
  kb.place(tokens);
  kb.op(`setp.ge.u32 ${p}, ${t}, ${n};`, `@${p} bra ${tokensDone};`);
  const [gv, bv, vv, eg, sk, delta, o, sv, kv, qv] = kb.regs("f32", 10);
  const gi = kb.reg("b32");
  kb.op(`mad.lo.u32 ${gi}, ${t}, ${hv}, ${j};`);
  const gAt = kb.addr(g, gi, 4);
  const betaAt = kb.addr(beta, gi, 4);
  kb.op(
    `ld.global.f32 ${gv}, [${gAt}];`,
    `ld.global.f32 ${bv}, [${betaAt}];`,
    `mad.lo.u32 ${vRow}, ${gi}, ${dv}, ${b};`,
  );
  const vAt = kb.addr(v, vRow, 4);
  kb.op(
    `ld.global.f32 ${vv}, [${vAt}];`,
    `mad.lo.u32 ${qkRow}, ${t}, ${hk}, ${kh};`,
    `mul.lo.u32 ${qkRow}, ${qkRow}, ${dk};`,
  );
  const expG = kb.exp(gv);
  kb.op(`mov.f32 ${eg}, ${expG};`);
  // pass 1: Σ_a (e^g S[a][b]) k_a
  const loop1 = kb.label("a1");
  const loop1Done = kb.label("a1_done");
  kb.op(`mov.f32 ${sk}, 0f00000000;`, `mov.u32 ${a}, 0;`);
  kb.place(loop1);
  kb.op(
    `setp.ge.u32 ${p}, ${a}, ${dk};`,
    `@${p} bra ${loop1Done};`,
    `add.u32 ${idx}, ${sBase}, ${a};`,
    `mad.lo.u32 ${idx}, ${idx}, ${dv}, ${b};`,
  );
  const stateAt = kb.addr(state, idx, 4);
  kb.op(
    `ld.global.f32 ${sv}, [${stateAt}];`,
    `mul.f32 ${sv}, ${sv}, ${eg};`,
    `add.u32 ${idx}, ${qkRow}, ${a};`,
  );
  const kAt = kb.addr(k, idx, 4);
  kb.op(
    `ld.global.f32 ${kv}, [${kAt}];`,
    `fma.rn.f32 ${sk}, ${sv}, ${kv}, ${sk};`,
    `add.u32 ${a}, ${a}, 1;`,
    `bra ${loop1};`,
  );
  kb.place(loop1Done);
  kb.op(`sub.f32 ${delta}, ${vv}, ${sk};`, `mul.f32 ${delta}, ${delta}, ${bv};`);
  // pass 2: S[a][b] ← e^g S[a][b] + k_a δ_b; out_b = scale Σ_a S[a][b] q_a
  const loop2 = kb.label("a2");
  const loop2Done = kb.label("a2_done");
  const sAddr = kb.reg("b64");
  kb.op(`mov.f32 ${o}, 0f00000000;`, `mov.u32 ${a}, 0;`);
  kb.place(loop2);
  kb.op(
    `setp.ge.u32 ${p}, ${a}, ${dk};`,
    `@${p} bra ${loop2Done};`,
    `add.u32 ${idx}, ${sBase}, ${a};`,
    `mad.lo.u32 ${idx}, ${idx}, ${dv}, ${b};`,
    `mad.wide.u32 ${sAddr}, ${idx}, 4, ${state};`,
    `ld.global.f32 ${sv}, [${sAddr}];`,
    `add.u32 ${idx}, ${qkRow}, ${a};`,
  );
  const kAt2 = kb.addr(k, idx, 4);
  const qAt = kb.addr(q, idx, 4);
  kb.op(
    `ld.global.f32 ${kv}, [${kAt2}];`,
    `ld.global.f32 ${qv}, [${qAt}];`,
    `mul.f32 ${sv}, ${sv}, ${eg};`,
    `fma.rn.f32 ${sv}, ${kv}, ${delta}, ${sv};`,
    `st.global.f32 [${sAddr}], ${sv};`,
    `fma.rn.f32 ${o}, ${sv}, ${qv}, ${o};`,
    `add.u32 ${a}, ${a}, 1;`,
    `bra ${loop2};`,
  );
  kb.place(loop2Done);
  const outAt = kb.addr(out, vRow, 4);
  kb.op(
    `mul.f32 ${o}, ${o}, ${scale};`,
    `st.global.f32 [${outAt}], ${o};`,
    `add.u32 ${t}, ${t}, 1;`,
    `bra ${tokens};`,
  );
  kb.place(tokensDone);
  kb.place(end);
  return kb.build([ELEMENTWISE_BLOCK / 2, 1]);
}
