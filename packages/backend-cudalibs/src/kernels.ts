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
  kb.op(
    `ld.global.s32 ${q}, [${kb.addr(acc, i, 4)}];`,
    `cvt.rn.f32.s32 ${v}, ${q};`,
    `ld.global.f32 ${sx}, [${kb.addr(xs, row, 4)}];`,
    `ld.global.f32 ${sw}, [${kb.addr(ws, col, 4)}];`,
    `mul.f32 ${v}, ${v}, ${sx};`,
    `mul.f32 ${v}, ${v}, ${sw};`,
  );
  if (b !== null) {
    const bv = kb.reg("f32");
    kb.op(`ld.global.f32 ${bv}, [${kb.addr(b, col, 4)}];`, `add.f32 ${v}, ${v}, ${bv};`);
  }
  kb.op(`st.global.f32 [${kb.addr(out, i, 4)}], ${v};`);
  kb.place(end);
  return kb.build([DEQUANT_BLOCK, 1]);
}
