/**
 * The small PTX kernels the cuda backend adds around cuBLASLt (the rest come from @tp/backend-ptx).
 *
 * Source: ConvRot W8A8 (krea2.md §1.7): y = f32(q_x · q_wᵀ) · s_x[m] · s_w[n] (+ bias[n]), the same
 * product @tp/backend-ptx's mmaIntKernel computes in one pass; here cuBLASLt gives the int32 q_x · q_wᵀ.
 */
import { ptx } from "@tp/backend-ptx";

/** Threads per block of {@link dequantInt32Kernel}. */
export const DEQUANT_BLOCK = 256;

/**
 * out[m, n] = f32(acc[m, n]) · x_scale[m] · w_scale[n] (+ bias[n]), one thread per element, row-major
 * [rows, cols]. Parameters: out (f32), acc (s32), x_scale (f32 [rows]), w_scale (f32 [cols]), [bias
 * (f32 [cols])], rows, cols. Grid: ⌈rows·cols / 256⌉ blocks (rows·cols < 2^32).
 */
export function dequantInt32Kernel(bias: boolean): ptx.KernelSource {
  const kb = new ptx.KernelBuilder(`cudalibs_dequant_i32${bias ? "_bias" : ""}`);
  const out = kb.ld("out", "u64");
  const acc = kb.ld("acc", "u64");
  const xs = kb.ld("x_scale", "u64");
  const ws = kb.ld("w_scale", "u64");
  const b = bias ? kb.ld("bias", "u64") : null;
  const rows = kb.ld("rows", "u32");
  const cols = kb.ld("cols", "u32");
  const i = kb.globalIndex();
  const n = kb.reg("b32");
  const p = kb.reg("pred");
  const end = kb.label("end");
  kb.op(`mul.lo.u32 ${n}, ${rows}, ${cols};`, `setp.ge.u32 ${p}, ${i}, ${n};`, `@${p} bra ${end};`);
  const row = kb.reg("b32");
  const col = kb.reg("b32");
  kb.op(
    `div.u32 ${row}, ${i}, ${cols};`,
    `mul.lo.u32 ${col}, ${row}, ${cols};`,
    `sub.u32 ${col}, ${i}, ${col};`,
  );
  const q = kb.reg("b32");
  const v = kb.reg("f32");
  const sx = kb.reg("f32");
  const sw = kb.reg("f32");
  const accAt = kb.addr(acc, i, 4);
  const sxAt = kb.addr(xs, row, 4);
  const swAt = kb.addr(ws, col, 4);
  kb.op(
    `ld.global.s32 ${q}, [${accAt}];`,
    `cvt.rn.f32.s32 ${v}, ${q};`,
    `ld.global.f32 ${sx}, [${sxAt}];`,
    `ld.global.f32 ${sw}, [${swAt}];`,
    `mul.f32 ${v}, ${v}, ${sx};`,
    `mul.f32 ${v}, ${v}, ${sw};`,
  );
  if (b !== null) {
    const bv = kb.reg("f32");
    const bAt = kb.addr(b, col, 4);
    kb.op(`ld.global.f32 ${bv}, [${bAt}];`, `add.f32 ${v}, ${v}, ${bv};`);
  }
  const outAt = kb.addr(out, i, 4);
  kb.op(`st.global.f32 [${outAt}], ${v};`);
  kb.place(end);
  return kb.build([DEQUANT_BLOCK, 1]);
}

/** Threads per block of the fp8 activation kernels. */
export const FP8_BLOCK = 256;

/** Largest finite fp8 e4m3 (OCP FP8 "E4M3FN": S.1111.110 = 448). */
export const E4M3_MAX = 448;

/**
 * amax = max(amax, max |x[i]|) over n f32: one element per thread, a block reduction, then one atomic
 * max of the result's bits per block (for non-negative floats the u32 order is the float order).
 * max.f32 skips NaN operands, so a NaN in x does not set the scale (it stays NaN through the
 * quantizer). `amax` (u32, the f32 bits) starts at 0 (the caller clears it).
 * Parameters: amax, x, n. Grid: ⌈n / 256⌉ blocks.
 */
export function absMaxKernel(): ptx.KernelSource {
  const kb = new ptx.KernelBuilder("cudalibs_absmax_f32");
  const amax = kb.ld("amax", "u64");
  const x = kb.ld("x", "u64");
  const n = kb.ld("n", "u32");
  const i = kb.globalIndex();
  const v = kb.reg("f32");
  const p = kb.reg("pred");
  const xAt = kb.addr(x, i, 4);
  kb.op(`mov.f32 ${v}, 0f00000000;`, `setp.lt.u32 ${p}, ${i}, ${n};`, `@${p} ld.global.f32 ${v}, [${xAt}];`);
  kb.op(`abs.f32 ${v}, ${v};`);
  const m = kb.blockReduce(v, "max", FP8_BLOCK);
  const t = kb.reg("b32");
  const bits = kb.reg("b32");
  const first = kb.reg("pred");
  kb.op(
    `mov.u32 ${t}, %tid.x;`,
    `setp.eq.u32 ${first}, ${t}, 0;`,
    `mov.b32 ${bits}, ${m};`,
    `@${first} red.global.max.u32 [${amax}], ${bits};`,
  );
  return kb.build([FP8_BLOCK, 1]);
}

/**
 * Per-tensor fp8 e4m3 quantization of activations (sm_89+): s = max(amax / 448, 1e-30) into x_scale[0]
 * (thread 0), q = e4m3(x / s) rounded to nearest even and saturated to ±448, two elements per thread
 * (element 2i in the low byte, as memory order has it). Parameters: out (e4m3 [2·pairs]), x (f32),
 * amax (the f32 bits of max |x|, {@link absMaxKernel}), x_scale (f32 [1]), pairs. Grid: ⌈pairs / 256⌉.
 * Source: PTX ISA §9.7.9.21 cvt (`.e4m3x2.f32`, `.satfinite`); the scale as cuBLASLt takes it
 * (x = f32(q) · scale_B).
 */
export function quantizeFp8Kernel(): ptx.KernelSource {
  const kb = new ptx.KernelBuilder("cudalibs_quantize_fp8_e4m3");
  const out = kb.ld("out", "u64");
  const x = kb.ld("x", "u64");
  const amax = kb.ld("amax", "u64");
  const xs = kb.ld("x_scale", "u64");
  const pairs = kb.ld("pairs", "u32");
  const i = kb.globalIndex();
  const s = kb.reg("f32");
  kb.op(
    `ld.global.f32 ${s}, [${amax}];`,
    `div.rn.f32 ${s}, ${s}, ${ptx.f32Imm(E4M3_MAX)};`,
    `max.f32 ${s}, ${s}, ${ptx.f32Imm(1e-30)};`,
  );
  const zero = kb.reg("pred");
  kb.op(`setp.eq.u32 ${zero}, ${i}, 0;`, `@${zero} st.global.f32 [${xs}], ${s};`);
  const p = kb.reg("pred");
  const end = kb.label("end");
  kb.op(`setp.ge.u32 ${p}, ${i}, ${pairs};`, `@${p} bra ${end};`);
  const a = kb.reg("f32");
  const b = kb.reg("f32");
  const at = kb.addr(x, i, 8);
  kb.op(
    `ld.global.v2.f32 {${a}, ${b}}, [${at}];`,
    `div.rn.f32 ${a}, ${a}, ${s};`,
    `div.rn.f32 ${b}, ${b}, ${s};`,
  );
  const q = kb.reg("b16");
  const outAt = kb.addr(out, i, 2);
  kb.op(`cvt.rn.satfinite.e4m3x2.f32 ${q}, ${b}, ${a};`, `st.global.b16 [${outAt}], ${q};`);
  kb.place(end);
  return kb.build([FP8_BLOCK, 1], 89);
}
