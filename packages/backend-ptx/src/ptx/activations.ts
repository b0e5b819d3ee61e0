/**
 * GGUF activation quantization for the matmul kernels that take f32 x: ggml multiplies a GGUF weight by
 * x quantized to its `vec_dot_type` (Q8_0 for Q4_0 / Q5_0 / Q8_0 / IQ4_NL), and matching it matters —
 * f32 x is closer to the exact product but ~4e-3 relative away from llama.cpp, enough to flip greedy
 * tokens of a Q4_0 model (conformance matmul-exact.ts). The kernel quantizes each 32-block and writes
 * the dequantized values back as f32 (q · f16(d), exact in f32), so the float-x kernels then compute
 * ggml's integer block products up to f32 summation order.
 *
 * Source: ggml `quantize_row_q8_0` (llm.md §2.6): d = max|x| / 127, id = d ≠ 0 ? 1/d : 0,
 * q = roundf(x · id) (ties away from zero), d stored as f16; NaN / ±inf make the block NaN
 * (d = NaN, or d = inf with codes 0: 0 · inf), as the reference (@tp/quant quantizeActivationsGgml).
 * Q8_1 (ggml's type for Q4_1 / Q5_1) has Q8_0's codes and d, so the same kernel serves them. The
 * k-quants take Q8_K per 256 (`quantize_row_q8_K_ref`, {@link fakeQuantizeQ8_KKernel}).
 */
import { KernelBuilder as Builder, f32Imm, type KernelBuilder, type KernelSource } from "./emit.ts";

/** Warps (32-blocks) per CTA of {@link fakeQuantizeQ8_0Kernel}. */
export const Q8_BLOCKS_PER_CTA = 8;

/** roundf(v): round half away from zero, exact (|v| < 2^23): r = trunc(v); r ± 1 when |v − r| ≥ 0.5. */
function roundHalfAway(kb: KernelBuilder, v: string): string {
  const r = kb.reg("f32");
  const frac = kb.reg("f32");
  const one = kb.reg("f32");
  const p = kb.reg("pred");
  kb.op(
    `cvt.rzi.f32.f32 ${r}, ${v};`,
    `sub.f32 ${frac}, ${v}, ${r};`,
    `abs.f32 ${frac}, ${frac};`,
    `setp.ge.f32 ${p}, ${frac}, ${f32Imm(0.5)};`,
    `copysign.f32 ${one}, ${v}, ${f32Imm(1)};`,
    `@${p} add.f32 ${r}, ${r}, ${one};`,
  );
  return r;
}

/**
 * The prologue of the fake-quantize kernels (one warp per block of `size` values): parameters out, x,
 * blocks; warp blk = %ctaid.x · {@link Q8_BLOCKS_PER_CTA} + tid / 32 (whole warps past `blocks` branch to
 * `end`, so the shuffles see all 32 lanes) and first = blk · size + lane, the lane's first value.
 */
function warpPerBlock(kb: Builder, size: number) {
  const out = kb.ld("out", "u64");
  const x = kb.ld("x", "u64");
  const nBlocks = kb.ld("blocks", "u32");
  const [tid, lane, blk, first] = kb.regs("b32", 4);
  const end = kb.label("end");
  const p = kb.reg("pred");
  kb.op(
    `mov.u32 ${tid}, %tid.x;`,
    `and.b32 ${lane}, ${tid}, 31;`,
    `shr.u32 ${blk}, ${tid}, 5;`,
    `mov.u32 ${first}, %ctaid.x;`,
    `mad.lo.u32 ${blk}, ${first}, ${Q8_BLOCKS_PER_CTA}, ${blk};`,
    `setp.ge.u32 ${p}, ${blk}, ${nBlocks};`,
    `@${p} bra ${end};`,
    `mad.lo.u32 ${first}, ${blk}, ${size}, ${lane};`,
  );
  return { out, x, first, end };
}

/**
 * x [n] f32 (n a multiple of 32, the rows of x back to back) → out [n] f32, each 32-block replaced by
 * its Q8_0 quantization dequantized: q_j · f32(f16(d)). One warp per block; grid
 * ceil(n / 32 / {@link Q8_BLOCKS_PER_CTA}). Parameters: out, x, blocks (n / 32).
 */
export function fakeQuantizeQ8_0Kernel(): KernelSource {
  const kb = new Builder("ggml_fake_quantize_q8_0");
  const { out, x, first: i, end } = warpPerBlock(kb, 32);
  const xv = kb.reg("f32");
  const at = kb.addr(x, i, 4);
  kb.op(`ld.global.f32 ${xv}, [${at}];`);
  const amax = kb.reg("f32");
  const t = kb.reg("f32");
  kb.op(`abs.f32 ${amax}, ${xv};`);
  for (let o = 16; o >= 1; o >>= 1)
    kb.op(`shfl.sync.bfly.b32 ${t}, ${amax}, ${o}, 31, -1;`, `max.NaN.f32 ${amax}, ${amax}, ${t};`);
  const [d, id, v, dh] = kb.regs("f32", 4);
  const h = kb.reg("b16");
  const zero = kb.reg("pred");
  kb.op(
    `div.rn.f32 ${d}, ${amax}, ${f32Imm(127)};`,
    `rcp.rn.f32 ${id}, ${d};`,
    `setp.eq.f32 ${zero}, ${d}, ${f32Imm(0)};`,
    `@${zero} mov.f32 ${id}, ${f32Imm(0)};`,
    `mul.f32 ${v}, ${xv}, ${id};`,
  );
  const q = roundHalfAway(kb, v);
  kb.op(`cvt.rn.f16.f32 ${h}, ${d};`, `cvt.f32.f16 ${dh}, ${h};`);
  // roundHalfAway(NaN) is NaN; ggml's int8 code of it is 0 (the block's d is NaN or inf anyway)
  const nan = kb.reg("pred");
  kb.op(
    `setp.nan.f32 ${nan}, ${q}, ${q};`,
    `@${nan} mov.f32 ${q}, ${f32Imm(0)};`,
    `mul.f32 ${q}, ${q}, ${dh};`,
  );
  const o = kb.addr(out, i, 4);
  kb.op(`st.global.f32 [${o}], ${q};`);
  kb.place(end);
  return kb.build([Q8_BLOCKS_PER_CTA * 32, 1]);
}

/**
 * x [n] f32 (n a multiple of 256) → out [n] f32, each 256-block replaced by its Q8_K quantization
 * dequantized: max = the first value of largest |x| (strictly greater, from 0, so a NaN never wins; the
 * sign of a tie does not change the values), iscale = −127 / max, q = min(127, nearest_int(iscale · x))
 * (ties to even; NaN → 0), d = f32(1 / iscale), value f32(d · q); an all-zero block stays 0, and ±∞
 * gives d = ∓∞, so NaN values, as the reference. One warp per block, lane l the values l + 32i;
 * grid ceil(n / 256 / {@link Q8_BLOCKS_PER_CTA}). Parameters: out, x, blocks (n / 256).
 * Source: ggml `quantize_row_q8_K_ref` (ggml-quants.c), @tp/quant quantizeQ8_K.
 */
export function fakeQuantizeQ8_KKernel(): KernelSource {
  const kb = new Builder("ggml_fake_quantize_q8_k");
  const { out, x, first, end } = warpPerBlock(kb, 256);
  const idx: string[] = [];
  const v: string[] = [];
  for (let i = 0; i < 8; i++) {
    const r = kb.reg("b32");
    kb.op(`add.u32 ${r}, ${first}, ${32 * i};`);
    const at = kb.addr(x, r, 4);
    const f = kb.reg("f32");
    kb.op(`ld.global.f32 ${f}, [${at}];`);
    idx.push(r);
    v.push(f);
  }
  // the lane's value of largest |x| (first in index order), then across the warp
  const [amax, max, a, t, tm] = kb.regs("f32", 5);
  const gt = kb.reg("pred");
  kb.op(`mov.f32 ${amax}, ${f32Imm(0)};`, `mov.f32 ${max}, ${f32Imm(0)};`);
  for (const vi of v)
    kb.op(
      `abs.f32 ${a}, ${vi};`,
      `setp.gt.f32 ${gt}, ${a}, ${amax};`,
      `@${gt} mov.f32 ${amax}, ${a};`,
      `@${gt} mov.f32 ${max}, ${vi};`,
    );
  for (let o = 16; o >= 1; o >>= 1)
    kb.op(
      `shfl.sync.bfly.b32 ${t}, ${amax}, ${o}, 31, -1;`,
      `shfl.sync.bfly.b32 ${tm}, ${max}, ${o}, 31, -1;`,
      `setp.gt.f32 ${gt}, ${t}, ${amax};`,
      `@${gt} mov.f32 ${amax}, ${t};`,
      `@${gt} mov.f32 ${max}, ${tm};`,
    );
  const [iscale, d] = kb.regs("f32", 2);
  const zero = kb.reg("pred");
  kb.op(
    `setp.eq.f32 ${zero}, ${amax}, ${f32Imm(0)};`,
    `div.rn.f32 ${iscale}, ${f32Imm(-127)}, ${max};`,
    `rcp.rn.f32 ${d}, ${iscale};`,
  );
  v.forEach((vi, i) => {
    const s = kb.reg("f32");
    const q = kb.reg("b32");
    kb.op(
      `mul.rn.f32 ${s}, ${iscale}, ${vi};`,
      `cvt.rni.s32.f32 ${q}, ${s};`,
      `min.s32 ${q}, ${q}, 127;`,
      `cvt.rn.f32.s32 ${s}, ${q};`,
      `mul.rn.f32 ${s}, ${d}, ${s};`,
      `@${zero} mov.f32 ${s}, ${f32Imm(0)};`,
    );
    const at = kb.addr(out, idx[i] as string, 4);
    kb.op(`st.global.f32 [${at}], ${s};`);
  });
  kb.place(end);
  return kb.build([Q8_BLOCKS_PER_CTA * 32, 1]);
}
