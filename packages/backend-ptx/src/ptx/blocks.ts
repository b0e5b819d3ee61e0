/**
 * GGUF block decoders of the matmul, matmul_id and embedding kernels.
 *
 * Decoders, with exactly the float operations of @tp/quant's dequantizeGgml (ggml `dequantize_row_*`,
 * no FMA contraction: every product and difference is `.rn`, which ptxas never fuses), two per type:
 * - {@link blockWarpDot}, the GEMV k loop (matmul gemv and matmul_id): lane l of a warp pass takes the
 *   8 consecutive elements from 8l of 256, inside one sub-block (one scale, and min, of the k-quants;
 *   a quarter of a 32-element block), decoded together by the type's sub-block decoder
 *   ({@link GROUP_DECODERS}: the scale once, the codes from four 16-bit loads);
 * - {@link loadBlockElement}, one element k of a row (the tiled kernel's staging, embedding).
 * Layouts (byte offsets inside a block; multi-byte fields little-endian, d / m / dmin binary16):
 * - Q8_0 (34 B): d, qs[32] i8 — q · d;
 * - Q4_0 (18 B): d, qs[16] — element j < 16 the low nibble of byte j, j ≥ 16 the high nibble of
 *   byte j − 16 — (n − 8) · d;
 * - Q4_1 (20 B): d, m, qs[16] — f32(n · d) + m;
 * - Q5_0 (22 B): d, qh u32 (bit j is bit 4 of element j), qs[16] — (n | h << 4 − 16) · d;
 * - Q5_1 (24 B): d, m, qh, qs[16] — f32((n | h << 4) · d) + m;
 * - Q2_K (84 B): scales[16] (low nibble scale, high nibble min of each 16), qs[64], d, dmin —
 *   f32(f32(d · sc) · q) − f32(dmin · mn) with q = qs[32·(e / 128) + e % 32] >> 2·((e % 128) / 32) & 3;
 * - Q3_K (110 B): hmask[32], qs[64], scales[12] (16 signed 6-bit scales S3), d —
 *   f32(d · S3) · (q − 4·!h), h = hmask[e % 32] >> (e / 32) & 1;
 * - Q4_K (144 B): d, dmin, scales[12] (8 × 6-bit scale and min, ggml get_scale_min_k4), qs[128] —
 *   f32(f32(d · sc) · n) − f32(dmin · mn), n the low nibble of qs[32·(e / 64) + e % 32] for
 *   e % 64 < 32, else the high one;
 * - Q5_K (176 B): d, dmin, scales[12], qh[32], qs[128] — as Q4_K with n + 16·(qh[e % 32] >> (e / 32) & 1);
 * - Q6_K (210 B): ql[128], qh[64], scales[16] i8, d — f32(d · sc) · ((lo4 | hi2 << 4) − 32);
 * - IQ4_NL (18 B): d, qs[16] (nibbles as Q4_0) — f32(d · K4[n]), K4 ggml's non-linear codebook
 *   `kvalues_iq4nl` ({@link K4});
 * - IQ4_XS (136 B): d, scales_h u16, scales_l[4], qs[128] — sub-block ib = e / 32 has the 6-bit scale
 *   ls = (scales_l[ib / 2] >> 4·(ib % 2) & 15) | (scales_h >> 2·ib & 3) << 4 and the nibbles of
 *   qs[16·ib + e % 16] (low for e % 32 < 16): f32(f32(d · (ls − 32)) · K4[n]).
 *
 * x is rounded first as ggml rounds activations for these weights (./activations.ts: Q8_0 for the
 * 32-element types and IQ4_NL, Q8_K for the k-quants and IQ4_XS), so the f32 k loops multiply exactly ggml's x.
 *
 * Sources: ggml/src/ggml-common.h (block_q4_0 … block_q6_K, block_iq4_nl, block_iq4_xs, kvalues_iq4nl),
 * ggml/src/ggml-quants.c (`dequantize_row_*`), ../shared/spec/llm.md §2;
 * packages/quant/src/ggml-dequant.ts (the CPU side).
 */
import type { KernelBuilder } from "./emit.ts";

/** The GGUF block types the kernels decode. */
export type BlockFormat =
  | "q8_0"
  | "q4_0"
  | "q4_1"
  | "q5_0"
  | "q5_1"
  | "q2_k"
  | "q3_k"
  | "q4_k"
  | "q5_k"
  | "q6_k"
  | "iq4_nl"
  | "iq4_xs";

/** Elements and bytes of one block of each type (ggml-common.h). */
export const BLOCKS: Readonly<Record<BlockFormat, { readonly elems: 32 | 256; readonly bytes: number }>> = {
  q8_0: { elems: 32, bytes: 34 },
  q4_0: { elems: 32, bytes: 18 },
  q4_1: { elems: 32, bytes: 20 },
  q5_0: { elems: 32, bytes: 22 },
  q5_1: { elems: 32, bytes: 24 },
  q2_k: { elems: 256, bytes: 84 },
  q3_k: { elems: 256, bytes: 110 },
  q4_k: { elems: 256, bytes: 144 },
  q5_k: { elems: 256, bytes: 176 },
  q6_k: { elems: 256, bytes: 210 },
  iq4_nl: { elems: 32, bytes: 18 },
  iq4_xs: { elems: 256, bytes: 136 },
};

/** Whether `format` is one of the {@link BLOCKS}. */
export function isBlockFormat(format: string): format is BlockFormat {
  return Object.hasOwn(BLOCKS, format);
}

/** Bytes of a row of `k` elements of `format` (k a multiple of its block). */
export function blockRowBytes(format: BlockFormat, k: number): number {
  const b = BLOCKS[format];
  return (k / b.elems) * b.bytes;
}

/** `rb = (K / elems) · bytes` into register `rb` (the byte length of a row of K elements). */
export function blockRowBytesOps(format: BlockFormat, rb: string, K: string): string[] {
  const b = BLOCKS[format];
  return [`shr.u32 ${rb}, ${K}, ${Math.log2(b.elems)};`, `mul.lo.u32 ${rb}, ${rb}, ${b.bytes};`];
}

/** The decoder's view of one element: its block's address, index inside the block, and helpers. */
interface Element {
  readonly kb: KernelBuilder;
  /** 64-bit address of the block. */
  readonly base: string;
  /** Index of the element inside its block (0 ≤ e < elems), a 32-bit register. */
  readonly e: string;
}

/** byte at base + off (off a register or an immediate) into a fresh u32 register. */
function byteAt(x: Element, off: string | number): string {
  const { kb, base } = x;
  const r = kb.reg("b32");
  if (typeof off === "number") kb.op(`ld.global.u8 ${r}, [${base}+${off}];`);
  else {
    const at = kb.addr(base, off, 1);
    kb.op(`ld.global.u8 ${r}, [${at}];`);
  }
  return r;
}

/** the binary16 at base + off (an immediate, 2-aligned) as f32. */
function halfAt(x: Element, off: number): string {
  const { kb, base } = x;
  const h = kb.reg("b16");
  const f = kb.reg("f32");
  kb.op(`ld.global.b16 ${h}, [${base}+${off}];`, `cvt.f32.f16 ${f}, ${h};`);
  return f;
}

/** A u32 register = `expr` lines with `%d` standing for the new register. */
function int(x: Element, ...lines: string[]): string {
  const r = x.kb.reg("b32");
  x.kb.op(...lines.map((l) => l.replaceAll("%d", r)));
  return r;
}

/** f32 of a signed 32-bit integer register. */
function toF32(x: Element, q: string): string {
  const f = x.kb.reg("f32");
  x.kb.op(`cvt.rn.f32.s32 ${f}, ${q};`);
  return f;
}

/** a · b (f32, rounded once, never fused). */
function mul(x: Element, a: string, b: string): string {
  const f = x.kb.reg("f32");
  x.kb.op(`mul.rn.f32 ${f}, ${a}, ${b};`);
  return f;
}

/** f32(f32(d · q) + m) of a signed code q (Q4_1 / Q5_1: scale d and min m of the block). */
function scaledPlusMin(x: Element, q: string, d: string, m: string): string {
  const v = mul(x, toF32(x, q), d);
  x.kb.op(`add.rn.f32 ${v}, ${v}, ${m};`);
  return v;
}

/**
 * The 4-bit code of element j of a 32-element block whose 16 code bytes start at byte `qs`: the low
 * nibble of byte j for j < 16, else the high nibble of byte j − 16.
 */
function nibble32(x: Element, qs: number): string {
  const { kb, e } = x;
  const hi = kb.reg("pred");
  const sh = kb.reg("b32");
  const j = kb.reg("b32");
  kb.op(
    `setp.ge.u32 ${hi}, ${e}, 16;`,
    `selp.b32 ${sh}, 4, 0, ${hi};`,
    `and.b32 ${j}, ${e}, 15;`,
    `add.u32 ${j}, ${j}, ${qs};`,
  );
  const b = byteAt(x, j);
  kb.op(`shr.u32 ${b}, ${b}, ${sh};`, `and.b32 ${b}, ${b}, 15;`);
  return b;
}

/** Bit e of the u32 at byte `qh` of a 32-element block (Q5_0 / Q5_1), as 0 or 16. */
function highBit32(x: Element, qh: number): string {
  const { kb, e } = x;
  const at = int(x, `shr.u32 %d, ${e}, 3;`, `add.u32 %d, %d, ${qh};`);
  const b = byteAt(x, at);
  const sh = int(x, `and.b32 %d, ${e}, 7;`);
  kb.op(`shr.u32 ${b}, ${b}, ${sh};`, `and.b32 ${b}, ${b}, 1;`, `shl.b32 ${b}, ${b}, 4;`);
  return b;
}

/** f32(f32(d · sc) · q) − f32(dmin · mn), the k-quants with a min (Q2_K, Q4_K, Q5_K). */
function scaledMinusMin(x: Element, d: string, sc: string, q: string, dmin: string, mn: string): string {
  const ds = mul(x, d, toF32(x, sc));
  const v = mul(x, ds, toF32(x, q));
  const m = mul(x, dmin, toF32(x, mn));
  const f = x.kb.reg("f32");
  x.kb.op(`sub.rn.f32 ${f}, ${v}, ${m};`);
  return f;
}

/**
 * The 6-bit scale and min of sub-block t = e / 32 of Q4_K / Q5_K (ggml `get_scale_min_k4`; the 12
 * scale bytes S at byte 4): t < 4 — S[t] & 63, S[t + 4] & 63; t ≥ 4 — (S[t + 4] & 15) | (S[t − 4] >> 6) << 4,
 * (S[t + 4] >> 4) | (S[t] >> 6) << 4. Both forms are computed and selected (no divergence).
 */
function scaleMinK4(x: Element): { sc: string; mn: string } {
  const { kb, e } = x;
  const t = int(x, `shr.u32 %d, ${e}, 5;`);
  const lowHalf = kb.reg("pred");
  kb.op(`setp.lt.u32 ${lowHalf}, ${t}, 4;`);
  const st = byteAt(x, int(x, `add.u32 %d, ${t}, 4;`)); // S[t]
  const st4 = byteAt(x, int(x, `add.u32 %d, ${t}, 8;`)); // S[t + 4]
  const stm4 = byteAt(x, int(x, `and.b32 %d, ${t}, 3;`, `add.u32 %d, %d, 4;`)); // S[t − 4] when t ≥ 4
  const [sc, mn, hiBits] = kb.regs("b32", 3);
  kb.op(
    // t ≥ 4
    `and.b32 ${sc}, ${st4}, 15;`,
    `shr.u32 ${hiBits}, ${stm4}, 6;`,
    `shl.b32 ${hiBits}, ${hiBits}, 4;`,
    `or.b32 ${sc}, ${sc}, ${hiBits};`,
    `shr.u32 ${mn}, ${st4}, 4;`,
    `shr.u32 ${hiBits}, ${st}, 6;`,
    `shl.b32 ${hiBits}, ${hiBits}, 4;`,
    `or.b32 ${mn}, ${mn}, ${hiBits};`,
    // t < 4
    `and.b32 ${st}, ${st}, 63;`,
    `and.b32 ${st4}, ${st4}, 63;`,
    `selp.b32 ${sc}, ${st}, ${sc}, ${lowHalf};`,
    `selp.b32 ${mn}, ${st4}, ${mn}, ${lowHalf};`,
  );
  return { sc, mn };
}

/** The 4-bit code of element e of a Q4_K / Q5_K block: nibble of qs[32·(e / 64) + e % 32] at byte `qs`. */
function nibbleK(x: Element, qs: number): string {
  const { kb, e } = x;
  const at = int(x, `shr.u32 %d, ${e}, 6;`, `shl.b32 %d, %d, 5;`);
  const l = int(x, `and.b32 %d, ${e}, 31;`);
  kb.op(`add.u32 ${at}, ${at}, ${l};`, `add.u32 ${at}, ${at}, ${qs};`);
  const b = byteAt(x, at);
  const sh = int(x, `and.b32 %d, ${e}, 32;`, `shr.u32 %d, %d, 3;`); // 4 when e % 64 ≥ 32
  kb.op(`shr.u32 ${b}, ${b}, ${sh};`, `and.b32 ${b}, ${b}, 15;`);
  return b;
}

/** The 2-bit code of element e of Q2_K / Q3_K: qs[32·(e / 128) + e % 32] >> 2·((e % 128) / 32) & 3. */
function crumbK(x: Element, qs: number): string {
  const { e } = x;
  const at = int(x, `shr.u32 %d, ${e}, 7;`, `shl.b32 %d, %d, 5;`);
  const l = int(x, `and.b32 %d, ${e}, 31;`);
  x.kb.op(`add.u32 ${at}, ${at}, ${l};`, `add.u32 ${at}, ${at}, ${qs};`);
  const b = byteAt(x, at);
  const sh = int(x, `shr.u32 %d, ${e}, 4;`, `and.b32 %d, %d, 6;`); // 2·((e / 32) % 4)
  x.kb.op(`shr.u32 ${b}, ${b}, ${sh};`, `and.b32 ${b}, ${b}, 3;`);
  return b;
}

/** Bit e / 32 of byte `at + e % 32` (Q3_K hmask, Q5_K qh): 0 or 1. */
function highBitK(x: Element, at: number): string {
  const { e } = x;
  const l = int(x, `and.b32 %d, ${e}, 31;`, `add.u32 %d, %d, ${at};`);
  const b = byteAt(x, l);
  const sh = int(x, `shr.u32 %d, ${e}, 5;`);
  x.kb.op(`shr.u32 ${b}, ${b}, ${sh};`, `and.b32 ${b}, ${b}, 1;`);
  return b;
}

/** ggml `kvalues_iq4nl` (ggml-common.h): the IQ4_NL / IQ4_XS value of each 4-bit code. */
export const K4: readonly number[] = [
  -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/** {@link K4} as four u32 immediates, byte i of word w the int8 K4[4w + i]. */
const K4_WORDS: readonly string[] = [0, 1, 2, 3].map(
  (w) =>
    `0x${(K4.slice(4 * w, 4 * w + 4).reduce((acc, v, i) => acc + (v & 255) * 256 ** i, 0) >>> 0)
      .toString(16)
      .padStart(8, "0")}`,
);

/**
 * K4[n] (a signed 32-bit register) of a code n (0 ≤ n < 16, a u32 register): word n / 4 of
 * {@link K4_WORDS} picked with two `selp`, then its byte n % 4 sign-extended by `bfe.s32` (no memory,
 * no divergence).
 */
function k4Value(x: Element, n: string): string {
  const { kb } = x;
  const [p2, p3] = kb.regs("pred", 2);
  const [lo, hi, pos] = kb.regs("b32", 3);
  const r = kb.reg("b32");
  kb.op(
    `and.b32 ${pos}, ${n}, 4;`,
    `setp.ne.u32 ${p2}, ${pos}, 0;`,
    `setp.ge.u32 ${p3}, ${n}, 8;`,
    `selp.b32 ${lo}, ${K4_WORDS[1]}, ${K4_WORDS[0]}, ${p2};`,
    `selp.b32 ${hi}, ${K4_WORDS[3]}, ${K4_WORDS[2]}, ${p2};`,
    `selp.b32 ${lo}, ${hi}, ${lo}, ${p3};`,
    `and.b32 ${pos}, ${n}, 3;`,
    `shl.b32 ${pos}, ${pos}, 3;`,
    `bfe.s32 ${r}, ${lo}, ${pos}, 8;`,
  );
  return r;
}

/**
 * IQ4_XS: dl = f32(d · (ls − 32)) of sub-block ib = e / 32 (d at byte 0; ls the low nibble, for odd ib
 * the high one, of scales_l[ib / 2] at byte 4, with bits 2·ib, 2·ib + 1 of the u16 scales_h at byte 2
 * as bits 4, 5).
 */
function iq4xsScale(x: Element): string {
  const { kb, base, e } = x;
  const d = halfAt(x, 0);
  const ls = byteAt(x, int(x, `shr.u32 %d, ${e}, 6;`, `add.u32 %d, %d, 4;`));
  const lsh = int(x, `shr.u32 %d, ${e}, 3;`, `and.b32 %d, %d, 4;`); // 4·(ib % 2)
  const h = kb.reg("b32");
  const hsh = int(x, `shr.u32 %d, ${e}, 4;`, `and.b32 %d, %d, 14;`); // 2·ib
  kb.op(
    `shr.u32 ${ls}, ${ls}, ${lsh};`,
    `and.b32 ${ls}, ${ls}, 15;`,
    `ld.global.u16 ${h}, [${base}+2];`,
    `shr.u32 ${h}, ${h}, ${hsh};`,
    `and.b32 ${h}, ${h}, 3;`,
    `shl.b32 ${h}, ${h}, 4;`,
    `or.b32 ${ls}, ${ls}, ${h};`,
    `sub.s32 ${ls}, ${ls}, 32;`,
  );
  return mul(x, d, toF32(x, ls));
}

/** IQ4_XS: the byte offset 8 + 16·(e / 32) + e % 16 of element e's code and its nibble shift (4 when e % 32 ≥ 16). */
function iq4xsCodeAt(x: Element): { at: string; sh: string } {
  const { e } = x;
  const at = int(x, `shr.u32 %d, ${e}, 5;`, `shl.b32 %d, %d, 4;`);
  const l = int(x, `and.b32 %d, ${e}, 15;`);
  x.kb.op(`add.u32 ${at}, ${at}, ${l};`, `add.u32 ${at}, ${at}, 8;`);
  const sh = int(x, `and.b32 %d, ${e}, 16;`, `shr.u32 %d, %d, 2;`);
  return { at, sh };
}

/** One decoder per block type: element e of the block at `base` as f32. */
const DECODERS: Record<BlockFormat, (x: Element) => string> = {
  q8_0: (x) => {
    const d = halfAt(x, 0);
    const q = x.kb.reg("b32");
    const at = x.kb.addr(x.base, x.e, 1);
    x.kb.op(`ld.global.s8 ${q}, [${at}+2];`);
    return mul(x, toF32(x, q), d);
  },
  q4_0: (x) => {
    const d = halfAt(x, 0);
    const n = nibble32(x, 2);
    x.kb.op(`sub.s32 ${n}, ${n}, 8;`);
    return mul(x, toF32(x, n), d);
  },
  q4_1: (x) => {
    const d = halfAt(x, 0);
    const m = halfAt(x, 2);
    return scaledPlusMin(x, nibble32(x, 4), d, m);
  },
  q5_0: (x) => {
    const d = halfAt(x, 0);
    const h = highBit32(x, 2);
    const n = nibble32(x, 6);
    x.kb.op(`or.b32 ${n}, ${n}, ${h};`, `sub.s32 ${n}, ${n}, 16;`);
    return mul(x, toF32(x, n), d);
  },
  q5_1: (x) => {
    const d = halfAt(x, 0);
    const m = halfAt(x, 2);
    const h = highBit32(x, 4);
    const n = nibble32(x, 8);
    x.kb.op(`or.b32 ${n}, ${n}, ${h};`);
    return scaledPlusMin(x, n, d, m);
  },
  q2_k: (x) => {
    const d = halfAt(x, 80);
    const dmin = halfAt(x, 82);
    const q = crumbK(x, 16);
    const s = byteAt(x, int(x, `shr.u32 %d, ${x.e}, 4;`));
    const sc = int(x, `and.b32 %d, ${s}, 15;`);
    const mn = int(x, `shr.u32 %d, ${s}, 4;`);
    return scaledMinusMin(x, d, sc, q, dmin, mn);
  },
  q3_k: (x) => {
    const { kb, e } = x;
    const d = halfAt(x, 108);
    const q = crumbK(x, 32);
    const h = highBitK(x, 0);
    // q − 4 when the hmask bit is clear
    kb.op(`xor.b32 ${h}, ${h}, 1;`, `shl.b32 ${h}, ${h}, 2;`, `sub.s32 ${q}, ${q}, ${h};`);
    // S3(t), t = e / 16: low nibble of scales[t] (t < 8) or high nibble of scales[t − 8]; high 2 bits
    // from scales[8 + t % 4] >> 2·(t / 4)
    const t = int(x, `shr.u32 %d, ${e}, 4;`);
    const lo = byteAt(x, int(x, `and.b32 %d, ${t}, 7;`, `add.u32 %d, %d, 96;`));
    const losh = int(x, `and.b32 %d, ${t}, 8;`, `shr.u32 %d, %d, 1;`); // 4 when t ≥ 8
    kb.op(`shr.u32 ${lo}, ${lo}, ${losh};`, `and.b32 ${lo}, ${lo}, 15;`);
    const hi = byteAt(x, int(x, `and.b32 %d, ${t}, 3;`, `add.u32 %d, %d, 104;`));
    const hish = int(x, `shr.u32 %d, ${t}, 2;`, `shl.b32 %d, %d, 1;`);
    kb.op(
      `shr.u32 ${hi}, ${hi}, ${hish};`,
      `and.b32 ${hi}, ${hi}, 3;`,
      `shl.b32 ${hi}, ${hi}, 4;`,
      `or.b32 ${lo}, ${lo}, ${hi};`,
      `sub.s32 ${lo}, ${lo}, 32;`,
    );
    const ds = mul(x, d, toF32(x, lo));
    return mul(x, ds, toF32(x, q));
  },
  q4_k: (x) => {
    const d = halfAt(x, 0);
    const dmin = halfAt(x, 2);
    const { sc, mn } = scaleMinK4(x);
    const n = nibbleK(x, 16);
    return scaledMinusMin(x, d, sc, n, dmin, mn);
  },
  q5_k: (x) => {
    const d = halfAt(x, 0);
    const dmin = halfAt(x, 2);
    const { sc, mn } = scaleMinK4(x);
    const n = nibbleK(x, 48);
    const h = highBitK(x, 16);
    x.kb.op(`shl.b32 ${h}, ${h}, 4;`, `add.u32 ${n}, ${n}, ${h};`);
    return scaledMinusMin(x, d, sc, n, dmin, mn);
  },
  q6_k: (x) => {
    const { kb, e } = x;
    const d = halfAt(x, 208);
    // ql[64·half + l + 32·(j & 1)], low nibble for j < 2 (j = (e % 128) / 32), high for j ≥ 2
    const l = int(x, `and.b32 %d, ${e}, 63;`);
    const lo = byteAt(x, int(x, `shr.u32 %d, ${e}, 7;`, `shl.b32 %d, %d, 6;`, `add.u32 %d, %d, ${l};`));
    const losh = int(x, `and.b32 %d, ${e}, 64;`, `shr.u32 %d, %d, 4;`); // 4 when j ≥ 2
    kb.op(`shr.u32 ${lo}, ${lo}, ${losh};`, `and.b32 ${lo}, ${lo}, 15;`);
    // qh[32·half + l] >> 2j & 3
    const hi = crumbK(x, 128);
    kb.op(`shl.b32 ${hi}, ${hi}, 4;`, `or.b32 ${lo}, ${lo}, ${hi};`, `sub.s32 ${lo}, ${lo}, 32;`);
    const s = kb.reg("b32");
    const at = int(x, `shr.u32 %d, ${e}, 4;`);
    const sAt = kb.addr(x.base, at, 1);
    kb.op(`ld.global.s8 ${s}, [${sAt}+192];`);
    const ds = mul(x, d, toF32(x, s));
    return mul(x, ds, toF32(x, lo));
  },
  iq4_nl: (x) => {
    const d = halfAt(x, 0);
    return mul(x, d, toF32(x, k4Value(x, nibble32(x, 2))));
  },
  iq4_xs: (x) => {
    const dl = iq4xsScale(x);
    const { at, sh } = iq4xsCodeAt(x);
    const b = byteAt(x, at);
    x.kb.op(`shr.u32 ${b}, ${b}, ${sh};`, `and.b32 ${b}, ${b}, 15;`);
    return mul(x, dl, toF32(x, k4Value(x, b)));
  },
};

/**
 * Bytes base + off … base + off + 7 (off an even register; blocks start 2-aligned, as the binary16
 * fields need) as 8 registers: four `ld.u16`, split with `bfe` (signed: each byte sign-extended).
 */
function bytes8(x: Element, off: string, signed = false): string[] {
  const { kb, base } = x;
  const at = kb.addr(base, off, 1);
  const out: string[] = [];
  for (let j = 0; j < 4; j++) {
    const h = kb.reg("b32");
    const [lo, hi] = kb.regs("b32", 2);
    const t = signed ? "s32" : "u32";
    kb.op(
      `ld.global.u16 ${h}, [${at}+${2 * j}];`,
      `bfe.${t} ${lo}, ${h}, 0, 8;`,
      `bfe.${t} ${hi}, ${h}, 8, 8;`,
    );
    out.push(lo, hi);
  }
  return out;
}

/** Bits `pos` … `pos + len − 1` of each register (pos a register or an immediate). */
function fields(x: Element, regs: readonly string[], pos: string | number, len: number): string[] {
  return regs.map((r) => int(x, `bfe.u32 %d, ${r}, ${pos}, ${len};`));
}

/** The byte offset `qs + (e0 & 15)` and nibble shift (4 when e0 ≥ 16) of 8 elements of a 32-element block. */
function nibbles32(x: Element, qs: number): string[] {
  const off = int(x, `and.b32 %d, ${x.e}, 15;`, `add.u32 %d, %d, ${qs};`);
  const sh = int(x, `and.b32 %d, ${x.e}, 16;`, `shr.u32 %d, %d, 2;`);
  return fields(x, bytes8(x, off), sh, 4);
}

/** Bits e0 … e0 + 7 of the u32 qh at byte `qh` (Q5_0 / Q5_1), each as 0 or 16. */
function highBits32(x: Element, qh: number): string[] {
  const b = byteAt(x, int(x, `shr.u32 %d, ${x.e}, 3;`, `add.u32 %d, %d, ${qh};`));
  return Array.from({ length: 8 }, (_, i) => int(x, `bfe.u32 %d, ${b}, ${i}, 1;`, `shl.b32 %d, %d, 4;`));
}

/** f32(f32(ds · q) − dm) for each code q (ds = f32(d · sc), dm = f32(dmin · mn) of the sub-block). */
function minusMin(x: Element, ds: string, dm: string, q: readonly string[]): string[] {
  return q.map((c) => {
    const v = mul(x, ds, toF32(x, c));
    x.kb.op(`sub.rn.f32 ${v}, ${v}, ${dm};`);
    return v;
  });
}

/** 2-bit codes of elements e0 … e0 + 7 of Q2_K / Q3_K (qs bytes at `qs`, shift 2·((e0 / 32) % 4)). */
function crumbs(x: Element, qs: number): string[] {
  const { e } = x;
  const off = int(x, `shr.u32 %d, ${e}, 7;`, `shl.b32 %d, %d, 5;`);
  const l = int(x, `and.b32 %d, ${e}, 31;`);
  x.kb.op(`add.u32 ${off}, ${off}, ${l};`, `add.u32 ${off}, ${off}, ${qs};`);
  const sh = int(x, `shr.u32 %d, ${e}, 4;`, `and.b32 %d, %d, 6;`);
  return fields(x, bytes8(x, off), sh, 2);
}

/** Bit e0 / 32 of bytes `at + e0 % 32` … + 7 (Q3_K hmask, Q5_K qh): 0 or 1 each. */
function highBitsK(x: Element, at: number): string[] {
  const off = int(x, `and.b32 %d, ${x.e}, 31;`, `add.u32 %d, %d, ${at};`);
  const sh = int(x, `shr.u32 %d, ${x.e}, 5;`);
  return fields(x, bytes8(x, off), sh, 1);
}

/** Q4_K / Q5_K: ds = f32(d · sc) and dm = f32(dmin · mn) of the sub-block of `x.e` (d, dmin at bytes 0, 2). */
function subBlockScaleMinK4(x: Element): { ds: string; dm: string } {
  const d = halfAt(x, 0);
  const dmin = halfAt(x, 2);
  const { sc, mn } = scaleMinK4(x);
  const ds = mul(x, d, toF32(x, sc));
  const dm = mul(x, dmin, toF32(x, mn));
  return { ds, dm };
}

/** 4-bit codes of elements e0 … e0 + 7 of Q4_K / Q5_K (qs bytes at `qs`). */
function nibblesK(x: Element, qs: number): string[] {
  const { e } = x;
  const off = int(x, `shr.u32 %d, ${e}, 6;`, `shl.b32 %d, %d, 5;`);
  const l = int(x, `and.b32 %d, ${e}, 31;`);
  x.kb.op(`add.u32 ${off}, ${off}, ${l};`, `add.u32 ${off}, ${off}, ${qs};`);
  const sh = int(x, `and.b32 %d, ${e}, 32;`, `shr.u32 %d, %d, 3;`);
  return fields(x, bytes8(x, off), sh, 4);
}

/**
 * One sub-block decoder per block type: elements e0 … e0 + 7 (e0 = `x.e`, a multiple of 8) of the block
 * at `x.base` as 8 f32 registers, with the float operations of {@link DECODERS} (so the same values):
 * the sub-block's scale (and min) are decoded once, the codes come from four 16-bit loads.
 */
const GROUP_DECODERS: Record<BlockFormat, (x: Element) => string[]> = {
  q8_0: (x) => {
    const d = halfAt(x, 0);
    const off = int(x, `add.u32 %d, ${x.e}, 2;`);
    return bytes8(x, off, true).map((q) => mul(x, toF32(x, q), d));
  },
  q4_0: (x) => {
    const d = halfAt(x, 0);
    return nibbles32(x, 2).map((n) => {
      x.kb.op(`sub.s32 ${n}, ${n}, 8;`);
      return mul(x, toF32(x, n), d);
    });
  },
  q4_1: (x) => {
    const d = halfAt(x, 0);
    const m = halfAt(x, 2);
    return nibbles32(x, 4).map((n) => scaledPlusMin(x, n, d, m));
  },
  q5_0: (x) => {
    const d = halfAt(x, 0);
    const h = highBits32(x, 2);
    return nibbles32(x, 6).map((n, i) => {
      x.kb.op(`or.b32 ${n}, ${n}, ${h[i]};`, `sub.s32 ${n}, ${n}, 16;`);
      return mul(x, toF32(x, n), d);
    });
  },
  q5_1: (x) => {
    const d = halfAt(x, 0);
    const m = halfAt(x, 2);
    const h = highBits32(x, 4);
    return nibbles32(x, 8).map((n, i) => {
      x.kb.op(`or.b32 ${n}, ${n}, ${h[i]};`);
      return scaledPlusMin(x, n, d, m);
    });
  },
  q2_k: (x) => {
    const d = halfAt(x, 80);
    const dmin = halfAt(x, 82);
    const s = byteAt(x, int(x, `shr.u32 %d, ${x.e}, 4;`));
    const ds = mul(x, d, toF32(x, int(x, `and.b32 %d, ${s}, 15;`)));
    const dm = mul(x, dmin, toF32(x, int(x, `shr.u32 %d, ${s}, 4;`)));
    return minusMin(x, ds, dm, crumbs(x, 16));
  },
  q3_k: (x) => {
    const { kb, e } = x;
    const d = halfAt(x, 108);
    const t = int(x, `shr.u32 %d, ${e}, 4;`);
    const lo = byteAt(x, int(x, `and.b32 %d, ${t}, 7;`, `add.u32 %d, %d, 96;`));
    const losh = int(x, `and.b32 %d, ${t}, 8;`, `shr.u32 %d, %d, 1;`);
    const hi = byteAt(x, int(x, `and.b32 %d, ${t}, 3;`, `add.u32 %d, %d, 104;`));
    const hish = int(x, `shr.u32 %d, ${t}, 2;`, `shl.b32 %d, %d, 1;`);
    kb.op(
      `shr.u32 ${lo}, ${lo}, ${losh};`,
      `and.b32 ${lo}, ${lo}, 15;`,
      `shr.u32 ${hi}, ${hi}, ${hish};`,
      `and.b32 ${hi}, ${hi}, 3;`,
      `shl.b32 ${hi}, ${hi}, 4;`,
      `or.b32 ${lo}, ${lo}, ${hi};`,
      `sub.s32 ${lo}, ${lo}, 32;`,
    );
    const ds = mul(x, d, toF32(x, lo));
    const h = highBitsK(x, 0);
    return crumbs(x, 32).map((q, i) => {
      // q − 4 when the hmask bit is clear
      kb.op(`xor.b32 ${h[i]}, ${h[i]}, 1;`, `shl.b32 ${h[i]}, ${h[i]}, 2;`, `sub.s32 ${q}, ${q}, ${h[i]};`);
      return mul(x, ds, toF32(x, q));
    });
  },
  q4_k: (x) => {
    const { ds, dm } = subBlockScaleMinK4(x);
    return minusMin(x, ds, dm, nibblesK(x, 16));
  },
  q5_k: (x) => {
    const { ds, dm } = subBlockScaleMinK4(x);
    const h = highBitsK(x, 16);
    const n = nibblesK(x, 48).map((c, i) => {
      x.kb.op(`shl.b32 ${h[i]}, ${h[i]}, 4;`, `add.u32 ${c}, ${c}, ${h[i]};`);
      return c;
    });
    return minusMin(x, ds, dm, n);
  },
  q6_k: (x) => {
    const { kb, e } = x;
    const d = halfAt(x, 208);
    const s = kb.reg("b32");
    const sAt = kb.addr(x.base, int(x, `shr.u32 %d, ${e}, 4;`), 1);
    kb.op(`ld.global.s8 ${s}, [${sAt}+192];`);
    const ds = mul(x, d, toF32(x, s));
    const l = int(x, `and.b32 %d, ${e}, 63;`);
    const off = int(x, `shr.u32 %d, ${e}, 7;`, `shl.b32 %d, %d, 6;`, `add.u32 %d, %d, ${l};`);
    const losh = int(x, `and.b32 %d, ${e}, 64;`, `shr.u32 %d, %d, 4;`);
    const lo = fields(x, bytes8(x, off), losh, 4);
    const hi = crumbs(x, 128);
    return lo.map((c, i) => {
      kb.op(`shl.b32 ${hi[i]}, ${hi[i]}, 4;`, `or.b32 ${c}, ${c}, ${hi[i]};`, `sub.s32 ${c}, ${c}, 32;`);
      return mul(x, ds, toF32(x, c));
    });
  },
  iq4_nl: (x) => {
    const d = halfAt(x, 0);
    return nibbles32(x, 2).map((n) => mul(x, d, toF32(x, k4Value(x, n))));
  },
  iq4_xs: (x) => {
    const dl = iq4xsScale(x);
    const { at, sh } = iq4xsCodeAt(x);
    return fields(x, bytes8(x, at), sh, 4).map((n) => mul(x, dl, toF32(x, k4Value(x, n))));
  },
};

/**
 * The registers and labels of a GEMV row's k loop (matmul.ts warpDot, {@link blockWarpDot}): the weight
 * row's address `row`, x and the x row's first element `xrow`, the loop counter `k`, K, the lane, the
 * f32 accumulator, the loop's labels `top` / `done` and a free predicate `q`.
 */
export interface WarpDotArgs<F extends string> {
  readonly format: F;
  readonly row: string;
  readonly x: string;
  readonly xrow: string;
  readonly k: string;
  readonly K: string;
  readonly lane: string;
  readonly acc: string;
  readonly top: string;
  readonly done: string;
  readonly q: string;
}

/**
 * The k loop of the GEMV kernels (matmul.ts warpDot) for a row of `format` blocks: each pass of the warp
 * covers 256 consecutive k, lane l the 8 elements from k0 + 8l (one sub-block decode: scale once, codes
 * from four 16-bit loads, {@link GROUP_DECODERS}), summed with their x into `acc` (f32 fma in k order);
 * lanes past K (K a multiple of the 32-element block) skip their part. Then `done` and the butterfly
 * sum, so every lane holds the row's dot product, as warpDot leaves it. `k` is the loop's counter
 * register, `q` a free predicate; a jump to `done` with `acc` set skips the loop (matmul_id's bad ids).
 */
export function blockWarpDot(kb: KernelBuilder, a: WarpDotArgs<BlockFormat>): void {
  const { format, row, x, xrow, k, K, lane, acc, top, done, q } = a;
  const b = BLOCKS[format];
  const kl = kb.reg("b32");
  const skip = kb.label("group_skip");
  kb.op(`mov.f32 ${acc}, 0f00000000;`, `mov.u32 ${k}, 0;`);
  kb.place(top);
  kb.op(
    `setp.ge.u32 ${q}, ${k}, ${K};`,
    `@${q} bra ${done};`,
    `mad.lo.u32 ${kl}, ${lane}, 8, ${k};`,
    `setp.ge.u32 ${q}, ${kl}, ${K};`,
    `@${q} bra ${skip};`,
  );
  const [blk, e0] = kb.regs("b32", 2);
  kb.op(`shr.u32 ${blk}, ${kl}, ${Math.log2(b.elems)};`, `and.b32 ${e0}, ${kl}, ${b.elems - 1};`);
  const base = kb.addr(row, blk, b.bytes);
  const w = GROUP_DECODERS[format]({ kb, base, e: e0 });
  const xi = kb.reg("b32");
  kb.op(`add.u32 ${xi}, ${xrow}, ${kl};`);
  const xAt = kb.addr(x, xi, 4);
  w.forEach((wv, i) => {
    const xv = kb.reg("f32");
    kb.op(`ld.global.f32 ${xv}, [${xAt}+${4 * i}];`, `fma.rn.f32 ${acc}, ${xv}, ${wv}, ${acc};`);
  });
  kb.place(skip);
  kb.op(`add.u32 ${k}, ${k}, 256;`, `bra ${top};`);
  kb.place(done);
  const t = kb.reg("f32");
  for (let o = 16; o >= 1; o >>= 1)
    kb.op(`shfl.sync.bfly.b32 ${t}, ${acc}, ${o}, 31, -1;`, `add.f32 ${acc}, ${acc}, ${t};`);
}

/**
 * Element k of the row of `format` blocks at `row` (a 64-bit address) as f32, exactly as @tp/quant's
 * dequantizeGgml computes it. `k` is a 32-bit register, left unchanged.
 */
export function loadBlockElement(kb: KernelBuilder, format: BlockFormat, row: string, k: string): string {
  const b = BLOCKS[format];
  const blk = kb.reg("b32");
  const e = kb.reg("b32");
  kb.op(`shr.u32 ${blk}, ${k}, ${Math.log2(b.elems)};`, `and.b32 ${e}, ${k}, ${b.elems - 1};`);
  const base = kb.addr(row, blk, b.bytes);
  return DECODERS[format]({ kb, base, e });
}
