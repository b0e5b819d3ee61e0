/**
 * Cast kernels between the float dtypes f32, f16, bf16, f8_e4m3fn and f8_e5m2, bit for bit with the
 * cpu backend (tp_cpu_cast, native/include/tp.h) and @tp/tensor convert.ts: every input is widened to
 * its exact f32 bits, then rounded once to the output type (round to nearest, ties to even), so a cast
 * between two narrow types equals the cpu's f32 → narrow of its narrow → f32. Integer and bit
 * operations only where the hardware conversion differs from those rules (NaNs, fp8): any sm.
 *
 * Rules (convert.ts):
 * - f16 → f32 exact; NaN: sign | 0x7FC00000 | mantissa << 13 (payload kept, quiet bit set).
 * - bf16 → f32: bits << 16.   e5m2 → f32: as the f16 whose top byte it is.
 * - e4m3fn → f32 exact (subnormals m · 2^−9); S.1111.111 → sign | 0x7FC00000.
 * - f32 → f16: `cvt.rn.f16.f32` (overflow → ±inf); NaN: sign | 0x7E00 | mantissa >> 13.
 * - f32 → bf16: (u + 0x7FFF + bit 16 of u) >> 16; NaN: u >> 16 | 0x0040.
 * - f32 → fp8: the magnitude rounded to nearest even (f32 subnormals → 0); overflow (past the largest
 *   finite after rounding, or ±inf) → NaN for e4m3fn, ±inf for e5m2, or ±max finite (448, 57344) with
 *   `saturate` (CUDA's __NV_SATFINITE); NaN → S.1111.111 / S.11111.11. `saturate` changes fp8 outputs
 *   only (as tp_cpu_cast's TP_CAST_SATURATE).
 *
 * Source: OCP 8-bit Floating Point Specification (OFP8) rev 1.0 §5 (E4M3 / E5M2 encodings); IEEE
 * 754-2019 §3.6 (binary16); PTX ISA §9.7.9.21 (cvt: .rn rounding, shr / shl clamp shift amounts past the
 * register width).
 */
import { ELEMENTWISE_BLOCK, stridedOffsets } from "./elementwise.ts";
import { KernelBuilder, type KernelSource } from "./emit.ts";

/** The dtypes the cast kernels convert between. */
export const CAST_FLOATS = ["f32", "f16", "bf16", "f8_e4m3fn", "f8_e5m2"] as const;
/** One of {@link CAST_FLOATS}. */
export type CastFloat = (typeof CAST_FLOATS)[number];

/** What a cast kernel folds in. */
export interface CastSpec {
  readonly from: CastFloat;
  readonly to: CastFloat;
  /** Rank of the merged iteration shape (the input is a strided view, the output contiguous), 1..8. */
  readonly rank: number;
  /** fp8 outputs: overflow to ±max finite (ignored for the other outputs). */
  readonly saturate: boolean;
}

const isFp8 = (d: CastFloat) => d === "f8_e4m3fn" || d === "f8_e5m2";

/** Bytes of one element. */
export function castBytes(d: CastFloat): 1 | 2 | 4 {
  return d === "f32" ? 4 : isFp8(d) ? 1 : 2;
}

/** The entry name: `cast_<from>_to_<to>_r<rank>[_sat]` (`_sat` for fp8 outputs only). */
export function castKernelName(s: CastSpec): string {
  return `cast_${s.from}_to_${s.to}_r${s.rank}${s.saturate && isFp8(s.to) ? "_sat" : ""}`;
}

/** f16 bits (a b32 holding 16 bits) → f32 bits in `u`, by the rules above. */
function f16BitsToF32(kb: KernelBuilder, h: string, u: string): void {
  const h16 = kb.reg("b16");
  const f = kb.reg("f32");
  const [e, m, nan] = kb.regs("b32", 3);
  const isNan = kb.reg("pred");
  kb.op(
    `cvt.u16.u32 ${h16}, ${h};`,
    `cvt.f32.f16 ${f}, ${h16};`,
    `mov.b32 ${u}, ${f};`,
    `and.b32 ${e}, ${h}, 31744;`, // 0x7C00
    `and.b32 ${m}, ${h}, 1023;`,
    `setp.eq.u32 ${isNan}, ${e}, 31744;`,
    `setp.ne.and.u32 ${isNan}, ${m}, 0, ${isNan};`,
    `and.b32 ${nan}, ${h}, 32768;`,
    `shl.b32 ${nan}, ${nan}, 16;`,
    `or.b32 ${nan}, ${nan}, 2143289344;`, // 0x7FC00000
    `shl.b32 ${m}, ${m}, 13;`,
    `or.b32 ${nan}, ${nan}, ${m};`,
    `@${isNan} mov.b32 ${u}, ${nan};`,
  );
}

/** e4m3fn byte `q` (in a b32) → f32 bits in `u`. */
function e4m3BitsToF32(kb: KernelBuilder, q: string, u: string): void {
  const [e, m, sign, sub, low] = kb.regs("b32", 5);
  const isSub = kb.reg("pred");
  const isNan = kb.reg("pred");
  const fs = kb.reg("f32");
  kb.op(
    `shr.u32 ${e}, ${q}, 3;`,
    `and.b32 ${e}, ${e}, 15;`,
    `and.b32 ${m}, ${q}, 7;`,
    `and.b32 ${sign}, ${q}, 128;`,
    `shl.b32 ${sign}, ${sign}, 24;`,
    // normal: (e − 7 + 127) << 23 | m << 20 | sign
    `add.u32 ${u}, ${e}, 120;`,
    `shl.b32 ${u}, ${u}, 23;`,
    `shl.b32 ${low}, ${m}, 20;`,
    `or.b32 ${u}, ${u}, ${low};`,
    `or.b32 ${u}, ${u}, ${sign};`,
    // subnormal or zero (e = 0): m · 2^−9 (exact), the sign or-ed in (−0 for S.0000.000)
    `setp.eq.u32 ${isSub}, ${e}, 0;`,
    `cvt.rn.f32.u32 ${fs}, ${m};`,
    `mul.f32 ${fs}, ${fs}, 0f3B000000;`, // 2^-9
    `mov.b32 ${sub}, ${fs};`,
    `or.b32 ${sub}, ${sub}, ${sign};`,
    `@${isSub} mov.b32 ${u}, ${sub};`,
    // NaN: S.1111.111
    `and.b32 ${low}, ${q}, 127;`,
    `setp.eq.u32 ${isNan}, ${low}, 127;`,
    `or.b32 ${sign}, ${sign}, 2143289344;`,
    `@${isNan} mov.b32 ${u}, ${sign};`,
  );
}

/** The layout of an 8-bit float (convert.ts's MiniFloat). */
interface Fp8 {
  readonly mantBits: number;
  readonly bias: number;
  readonly maxFinite: number;
  readonly nan: number;
  /** The code of +inf, or -1 (e4m3fn has none). */
  readonly inf: number;
}
const FP8: Record<"f8_e4m3fn" | "f8_e5m2", Fp8> = {
  f8_e4m3fn: { mantBits: 3, bias: 7, maxFinite: 0x7e, nan: 0x7f, inf: -1 },
  f8_e5m2: { mantBits: 2, bias: 15, maxFinite: 0x7b, nan: 0x7f, inf: 0x7c },
};

/**
 * f32 bits `u` → the fp8 code (a b32 holding 8 bits), branch-free: the magnitude's code with its
 * round-to-nearest-even increment (which may carry into the exponent), then overflow, ±inf and NaN.
 */
function f32BitsToFp8(kb: KernelBuilder, u: string, f: Fp8, saturate: boolean): string {
  const minNormalExp = 1 - f.bias;
  const shiftNormal = 23 - f.mantBits;
  const [a, ef, sig, frac, shift, code, codeS, mask, rem, half, one, sign] = kb.regs("b32", 12);
  const [normal, tiny, up, tie, over, isInf, isNan] = kb.regs("pred", 7);
  const overflow = saturate ? f.maxFinite : f.inf >= 0 ? f.inf : f.nan;
  kb.op(
    `shr.u32 ${sign}, ${u}, 24;`,
    `and.b32 ${sign}, ${sign}, 128;`,
    `and.b32 ${a}, ${u}, 2147483647;`,
    `setp.gt.u32 ${isNan}, ${a}, 2139095040;`, // past 0x7F800000
    `setp.eq.u32 ${isInf}, ${a}, 2139095040;`,
    // ef = exponent − 127 (signed), sig = the 24-bit significand
    `shr.u32 ${ef}, ${a}, 23;`,
    `sub.s32 ${ef}, ${ef}, 127;`,
    `and.b32 ${frac}, ${a}, 8388607;`,
    `or.b32 ${sig}, ${frac}, 8388608;`,
    `setp.ge.s32 ${normal}, ${ef}, ${minNormalExp};`,
    // normal in fp8: ((ef + bias) << mantBits) | frac >> (23 − mantBits)
    `add.s32 ${code}, ${ef}, ${f.bias};`,
    `shl.b32 ${code}, ${code}, ${f.mantBits};`,
    `shr.u32 ${frac}, ${frac}, ${shiftNormal};`,
    `or.b32 ${code}, ${code}, ${frac};`,
    // subnormal in fp8: sig >> (23 − mantBits + minNormalExp − ef), in units of the smallest subnormal
    `sub.s32 ${shift}, ${shiftNormal + minNormalExp}, ${ef};`,
    `shr.u32 ${codeS}, ${sig}, ${shift};`,
    // shifts past 24 (f32 subnormals and zero included) are below half the smallest subnormal
    `setp.gt.s32 ${tiny}, ${shift}, 24;`,
    `selp.b32 ${shift}, ${shiftNormal}, ${shift}, ${normal};`,
    `selp.b32 ${code}, ${code}, ${codeS}, ${normal};`,
    `not.pred ${normal}, ${normal};`,
    `and.pred ${tiny}, ${tiny}, ${normal};`,
    // round to nearest, ties to even, on the dropped bits
    `mov.u32 ${one}, 1;`,
    `shl.b32 ${mask}, ${one}, ${shift};`,
    `sub.u32 ${mask}, ${mask}, 1;`,
    `and.b32 ${rem}, ${sig}, ${mask};`,
    `sub.u32 ${half}, ${shift}, 1;`,
    `shl.b32 ${half}, ${one}, ${half};`,
    `setp.gt.u32 ${up}, ${rem}, ${half};`,
    `setp.eq.u32 ${tie}, ${rem}, ${half};`,
    `and.b32 ${one}, ${code}, 1;`,
    `setp.ne.and.u32 ${tie}, ${one}, 0, ${tie};`,
    `or.pred ${up}, ${up}, ${tie};`,
    `@${up} add.u32 ${code}, ${code}, 1;`,
    `@${tiny} mov.u32 ${code}, 0;`,
    `setp.gt.u32 ${over}, ${code}, ${f.maxFinite};`,
    `or.pred ${over}, ${over}, ${isInf};`,
    `@${over} mov.u32 ${code}, ${overflow};`,
    `@${isNan} mov.u32 ${code}, ${f.nan};`,
    `or.b32 ${code}, ${code}, ${sign};`,
  );
  return code;
}

/**
 * A cast kernel: out (contiguous, `to`) ← in0 (a strided view, `from`). Parameters as the map kernels
 * (elementwise.ts): out, in0, n, size0..size{rank−1}, stride1_0..stride1_{rank−1} (element strides of
 * in0). Grid ceil(n / 256), 256 threads.
 */
export function castKernel(s: CastSpec): KernelSource {
  const kb = new KernelBuilder(castKernelName(s));
  const out = kb.ld("out", "u64");
  const src = kb.ld("in0", "u64");
  const { offs, end } = stridedOffsets(kb, s.rank, 2, true);
  const u = kb.reg("b32"); // the input's exact f32 bits
  const inAt = kb.addr(src, offs[1] as string, castBytes(s.from));
  if (s.from === "f32") kb.op(`ld.global.b32 ${u}, [${inAt}];`);
  else if (s.from === "bf16") kb.op(`ld.global.u16 ${u}, [${inAt}];`, `shl.b32 ${u}, ${u}, 16;`);
  else {
    const raw = kb.reg("b32");
    kb.op(`ld.global.${castBytes(s.from) === 2 ? "u16" : "u8"} ${raw}, [${inAt}];`);
    if (s.from === "f8_e4m3fn") e4m3BitsToF32(kb, raw, u);
    else {
      if (s.from === "f8_e5m2") kb.op(`shl.b32 ${raw}, ${raw}, 8;`);
      f16BitsToF32(kb, raw, u);
    }
  }
  const outAt = kb.addr(out, offs[0] as string, castBytes(s.to));
  if (s.to === "f32") kb.op(`st.global.b32 [${outAt}], ${u};`);
  else if (s.to === "bf16") {
    const [r, lsb, nan] = kb.regs("b32", 3);
    const isNan = kb.reg("pred");
    kb.op(
      `shr.u32 ${lsb}, ${u}, 16;`,
      `or.b32 ${nan}, ${lsb}, 64;`,
      `and.b32 ${lsb}, ${lsb}, 1;`,
      `add.u32 ${r}, ${u}, 32767;`,
      `add.u32 ${r}, ${r}, ${lsb};`,
      `shr.u32 ${r}, ${r}, 16;`,
      `and.b32 ${lsb}, ${u}, 2147483647;`,
      `setp.gt.u32 ${isNan}, ${lsb}, 2139095040;`,
      `@${isNan} mov.b32 ${r}, ${nan};`,
      `st.global.u16 [${outAt}], ${r};`,
    );
  } else if (s.to === "f16") {
    const f = kb.reg("f32");
    const h = kb.reg("b16");
    const [r, nan, a] = kb.regs("b32", 3);
    const isNan = kb.reg("pred");
    kb.op(
      `mov.b32 ${f}, ${u};`,
      `cvt.rn.f16.f32 ${h}, ${f};`,
      `cvt.u32.u16 ${r}, ${h};`,
      // NaN: sign | 0x7E00 | mantissa >> 13
      `shr.u32 ${nan}, ${u}, 16;`,
      `and.b32 ${nan}, ${nan}, 32768;`,
      `or.b32 ${nan}, ${nan}, 32256;`,
      `and.b32 ${a}, ${u}, 8388607;`,
      `shr.u32 ${a}, ${a}, 13;`,
      `or.b32 ${nan}, ${nan}, ${a};`,
      `and.b32 ${a}, ${u}, 2147483647;`,
      `setp.gt.u32 ${isNan}, ${a}, 2139095040;`,
      `@${isNan} mov.b32 ${r}, ${nan};`,
      `st.global.u16 [${outAt}], ${r};`,
    );
  } else {
    const code = f32BitsToFp8(kb, u, FP8[s.to], s.saturate);
    kb.op(`st.global.u8 [${outAt}], ${code};`);
  }
  kb.place(end);
  return kb.build([ELEMENTWISE_BLOCK, 1]);
}
