/**
 * Shared-memory tiled tensor-core matmul for prefill, y [M, N] = x [M, K] · Wᵀ (+ bias), W [N, K]:
 * a block of {@link MMA_TILE}.warps warps computes a bm × bn = 64 × 128 output tile; warp w owns the
 * 32 × 32 sub-tile at rows 32·(w / 4), columns 32·(w % 4): 2 × 4 `mma.sync` m16n8 fragments. K goes
 * in steps of 64 bytes of each row (32 f16 / bf16, 64 int8 / e4m3, 128 int4 elements) through two
 * shared-memory stages: while the warps multiply the tile in one stage, the next tile's copies are in
 * flight into the other (`cp.async.cg`, 16 bytes a chunk, for the raw operand bytes; f32 x for the
 * 16-bit kernels by `ld.global.v4` into registers, rounded and stored after the multiplies), then
 * `cp.async.wait_group 0` and one `bar.sync` a step. Fragments come from shared memory by
 * `ldmatrix.x4`; rows of both tiles are padded to 80 bytes, so each 8-row phase of an ldmatrix
 * (8 × 16 bytes) hits 32 distinct banks.
 *
 * Operands and numerics are those of the direct mma kernels in matmul.ts, so their tolerances hold:
 * - f16 / bf16: x (f32) rounded to the weight's 16-bit type (`cvt.rn.f16x2.f32` /
 *   `cvt.rn.bf16x2.f32`) as it is staged, `mma.sync.m16n8k16` with f32 accumulation, k in the same
 *   order (16 at a time from 0), + bias;
 * - s8 / s4 (ConvRot W8A8 / W4A4): x already quantised per row (rows.ts), `mma.sync.m16n8k32.s8` /
 *   `m16n8k64.s4`, exact int32 sums, y = f32(acc) · x_scale[m] · scale[n] (+ bias);
 * - e4m3 (fp8 W8A8, sm_89+, opt-in): x quantised per row to e4m3 (rows.ts quantizeRowsFp8Kernel),
 *   `mma.sync.m16n8k32.f32.e4m3.e4m3.f32`, y = acc · x_scale[m] (· scale[n] for a scaled weight)
 *   (+ bias). A different numeric contract from the fp8 kernels that keep x in f32.
 *
 * Every one of these fragment layouts puts the same bytes in the same registers (PTX ISA §9.7.14.5:
 * m16n8k16 .f16/.bf16, m16n8k32 .s8/.e4m3, m16n8k64 .s4): in each 32-byte k slice of a row, lane
 * (g = lane / 4, t = lane % 4) holds A registers a0 = row g bytes 4t..4t+3, a1 = row g + 8, a2 / a3 =
 * the same rows at byte 4t + 16; B registers b0 = row g of W (column g of Wᵀ) at byte 4t, b1 at
 * 4t + 16; C c0, c1 = row g, columns 2t, 2t + 1, c2, c3 = row g + 8. So one staging and fragment
 * walk serves all, only the `mma` instruction differs.
 *
 * Bounds: rows of x past M and rows of W past N stage as zeros, and so do 16-byte chunks past K, so
 * M, N and K need not be multiples of the tile; K must be a multiple of a chunk's elements
 * ({@link mmaTiledKDivisor}: 8 / 16 / 32) and x's first element 16-byte aligned. Grid
 * (ceil(N / 128), ceil(M / 64)), 256 threads.
 *
 * Parameters: out, x, w, [bias], [scale], m, n, k, [x_scale] (s8, s4, e4m3).
 */
import { TpError } from "@tp/tensor";
import { KernelBuilder, type KernelSource, mmaLaneOps } from "./emit.ts";

/** The block tile: outputs bm × bn, `kBytes` bytes of each row a k step, warps (2 × 4). */
export const MMA_TILE = { bm: 64, bn: 128, kBytes: 64, warps: 8 } as const;

/** Operand types of the tiled kernels: the weight's (and x's, after rounding or quantising). */
export type MmaOperand = "f16" | "bf16" | "s8" | "s4" | "e4m3";

/** A tiled mma variant: operands, bias, and a per-column scale (always on for s8 / s4). */
export interface MmaTiledSpec {
  readonly operand: MmaOperand;
  readonly bias: boolean;
  /** Multiply column n by scale[n] (ConvRot per-row weight scales; fp8's tensor scale repeated). */
  readonly scaled: boolean;
}

const BITS: Record<MmaOperand, number> = { f16: 16, bf16: 16, s8: 8, s4: 4, e4m3: 8 };
/** Padded shared row (bytes): 64 data + 16, so 8 rows × 4 words fall in distinct banks. */
const ROW = 80;
const A_BYTES = MMA_TILE.bm * ROW;
const STAGE = A_BYTES + MMA_TILE.bn * ROW;

/** K must be a multiple of this (the elements of one 16-byte chunk): 8 (16-bit), 16 (8-bit), 32 (4-bit). */
export function mmaTiledKDivisor(operand: MmaOperand): number {
  return 128 / BITS[operand];
}

/** The oldest sm a tiled variant runs on: 89 for e4m3, else 80. */
export function mmaTiledMinSm(operand: MmaOperand): number {
  return operand === "e4m3" ? 89 : 80;
}

/** The weight format a tiled variant reads. */
function weightFormat(operand: MmaOperand): string {
  return operand === "s8"
    ? "int8_convrot"
    : operand === "s4"
      ? "int4_convrot"
      : operand === "e4m3"
        ? "f8_e4m3fn"
        : operand;
}

/** The entry name: `matmul_mma_tiled_{f16,bf16}[_b]`, `…_s8_int8_convrot[_b]_s`, `…_e4m3_f8_e4m3fn[_b][_s]`. */
export function mmaTiledName(s: MmaTiledSpec): string {
  const fmt = weightFormat(s.operand);
  const head = s.operand === "f16" || s.operand === "bf16" ? fmt : `${s.operand}_${fmt}`;
  return `matmul_mma_tiled_${head}${s.bias ? "_b" : ""}${s.scaled ? "_s" : ""}`;
}

/** The `mma.sync` of one 32-byte k slice for the operand type. */
function mmaInstruction(operand: MmaOperand): string {
  switch (operand) {
    case "f16":
    case "bf16":
      return `mma.sync.aligned.m16n8k16.row.col.f32.${operand}.${operand}.f32`;
    case "s8":
      return "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32";
    case "s4":
      return "mma.sync.aligned.m16n8k64.row.col.s32.s4.s4.s32";
    case "e4m3":
      return "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32";
  }
}

/**
 * The tiled tensor-core kernel for `s` (see the module comment). K a multiple of
 * {@link mmaTiledKDivisor}; `x` f32 [M, K] for f16 / bf16, else the quantised bytes [M, K·bits/8].
 * @throws TpError E_INTERNAL for an s8 / s4 spec without `scaled` or an f16 / bf16 one with it
 */
export function mmaTiledKernel(s: MmaTiledSpec): KernelSource {
  const { operand } = s;
  const half = operand === "f16" || operand === "bf16";
  const integer = operand === "s8" || operand === "s4";
  if ((integer && !s.scaled) || (half && s.scaled))
    throw new TpError("E_INTERNAL", `tiled mma ${operand}: scaled must be ${integer}`);
  const bits = BITS[operand];
  const perChunk = 128 / bits; // elements of one 16-byte chunk of a weight row
  const xBytesPerChunk = half ? perChunk * 4 : 16; // x is f32 for the 16-bit kernels
  const { bm, bn, kBytes, warps } = MMA_TILE;
  const kb = new KernelBuilder(mmaTiledName(s));
  const out = kb.ld("out", "u64");
  const x = kb.ld("x", "u64");
  const w = kb.ld("w", "u64");
  const bias = s.bias ? kb.ld("bias", "u64") : null;
  const scale = s.scaled ? kb.ld("scale", "u64") : null;
  const [M, N, K] = kb.lds("u32", "m", "n", "k");
  const xScale = half ? null : kb.ld("x_scale", "u64");
  const tile = kb.shared("tile", 2 * STAGE);

  const [tid, lane, warp, g, t, wm, wn, m0, n0, kc, kk, k0, stage] = kb.regs("b32", 13);
  kb.op(
    ...mmaLaneOps({ tid, lane, warp, g, t }),
    `shr.u32 ${wm}, ${warp}, 2;`,
    `and.b32 ${wn}, ${warp}, 3;`,
    `mov.u32 ${m0}, %ctaid.y;`,
    `mul.lo.u32 ${m0}, ${m0}, ${bm};`,
    `mov.u32 ${n0}, %ctaid.x;`,
    `mul.lo.u32 ${n0}, ${n0}, ${bn};`,
    // staging: thread tid copies chunk kc = tid % 4 of x row tid / 4 and of W rows tid / 4, + 64
    `and.b32 ${kc}, ${tid}, 3;`,
    `mov.u32 ${k0}, 0;`,
    `mov.u32 ${stage}, 0;`,
  );
  // first element of the thread's chunk in its row (advances by a tile's elements each step)
  kb.op(`mul.lo.u32 ${kk}, ${kc}, ${perChunk};`);
  const rowBytesOf = (bytesPerElem: number, row: string): string => {
    // byte offset of row `row` (64-bit): row · K · bytesPerElem (4-bit: K / 2)
    const rb = kb.reg("b32");
    if (bits === 4 && bytesPerElem === 0.5) kb.op(`shr.u32 ${rb}, ${K}, 1;`);
    else kb.op(`mul.lo.u32 ${rb}, ${K}, ${bytesPerElem};`);
    const off = kb.reg("b64");
    kb.op(`mul.wide.u32 ${off}, ${row}, ${rb};`);
    return off;
  };
  const xElemBytes = half ? 4 : bits / 8;
  const wElemBytes = bits / 8;
  // x row pointer and predicate
  const [ra, rb0, rb1] = kb.regs("b32", 3);
  const [okA, okB0, okB1] = kb.regs("pred", 3);
  kb.op(
    `shr.u32 ${ra}, ${tid}, 2;`,
    `add.u32 ${rb0}, ${ra}, ${n0};`,
    `add.u32 ${rb1}, ${rb0}, 64;`,
    `add.u32 ${ra}, ${ra}, ${m0};`,
    `setp.lt.u32 ${okA}, ${ra}, ${M};`,
    `setp.lt.u32 ${okB0}, ${rb0}, ${N};`,
    `setp.lt.u32 ${okB1}, ${rb1}, ${N};`,
  );
  const chunkPtr = (base: string, row: string, elemBytes: number, chunkBytes: number): string => {
    const off = rowBytesOf(elemBytes, row);
    const c = kb.reg("b64");
    kb.op(
      `mul.wide.u32 ${c}, ${kc}, ${chunkBytes};`,
      `add.u64 ${off}, ${off}, ${c};`,
      `add.u64 ${off}, ${off}, ${base};`,
    );
    return off;
  };
  const xp = chunkPtr(x, ra, xElemBytes, xBytesPerChunk);
  const wp0 = chunkPtr(w, rb0, wElemBytes, 16);
  const wp1 = chunkPtr(w, rb1, wElemBytes, 16);
  const xStep = half ? (kBytes / 2) * 4 : kBytes; // bytes of an x row a k step
  const elemsPerStep = (kBytes * 8) / bits;

  // shared addresses: the thread's chunk slots and its ldmatrix row addresses (stage 0). ldmatrix
  // .x4 reads four 8 × 16-byte matrices, lanes 8j..8j+7 giving the row addresses of matrix j:
  // A (per 16-row half mi): j = 0, 1 rows 0–7 / 8–15 at byte 0, j = 2, 3 the same at byte 16 → a0..a3;
  // B (per pair of n8 tiles): j = 0, 1 tile 2p at bytes 0 / 16 → b0, b1, j = 2, 3 tile 2p + 1.
  const [sBase, sA, sB, fA, fB, tmp, tmp2] = kb.regs("b32", 7);
  kb.op(
    `mov.u32 ${sBase}, ${tile};`,
    `shr.u32 ${tmp}, ${tid}, 2;`,
    `mul.lo.u32 ${sA}, ${tmp}, ${ROW};`,
    `mad.lo.u32 ${sA}, ${kc}, 16, ${sA};`,
    `add.u32 ${sA}, ${sA}, ${sBase};`,
    `add.u32 ${sB}, ${sA}, ${A_BYTES};`,
    // A: row 32·wm + (lane & 15), byte 16·(lane >> 4)
    `and.b32 ${tmp}, ${lane}, 15;`,
    `mad.lo.u32 ${tmp}, ${wm}, 32, ${tmp};`,
    `mul.lo.u32 ${fA}, ${tmp}, ${ROW};`,
    `shr.u32 ${tmp}, ${lane}, 4;`,
    `mad.lo.u32 ${fA}, ${tmp}, 16, ${fA};`,
    `add.u32 ${fA}, ${fA}, ${sBase};`,
    // B: row 32·wn + (lane & 7) + 8·(lane >> 4), byte 16·((lane >> 3) & 1)
    `and.b32 ${tmp}, ${lane}, 7;`,
    `shr.u32 ${tmp2}, ${lane}, 4;`,
    `mad.lo.u32 ${tmp}, ${tmp2}, 8, ${tmp};`,
    `mad.lo.u32 ${tmp}, ${wn}, 32, ${tmp};`,
    `mul.lo.u32 ${fB}, ${tmp}, ${ROW};`,
    `shr.u32 ${tmp}, ${lane}, 3;`,
    `and.b32 ${tmp}, ${tmp}, 1;`,
    `mad.lo.u32 ${fB}, ${tmp}, 16, ${fB};`,
    `add.u32 ${fB}, ${fB}, ${sBase};`,
    `add.u32 ${fB}, ${fB}, ${A_BYTES};`,
  );

  // a step's copies: raw operand bytes (W, and x unless it is f32) by cp.async.cg, 16 bytes a chunk,
  // zero-filled (src-size 0, from the operand's base address) past M / N / K; f32 x by ld.global.v4
  // into registers, rounded and stored after the step's multiplies
  const xv = kb.regs("f32", half ? 8 : 0);
  const [pA, pB0, pB1, inK] = kb.regs("pred", 4);
  const [dst, size] = kb.regs("b32", 2);
  const src = kb.reg("b64");
  const copy = (to: string, offset: number, from: string, base: string, ok: string): void => {
    kb.op(
      `selp.b32 ${size}, 16, 0, ${ok};`,
      `selp.b64 ${src}, ${from}, ${base}, ${ok};`,
      `add.u32 ${dst}, ${to}, ${offset};`,
      `cp.async.cg.shared.global [${dst}], [${src}], 16, ${size};`,
    );
  };
  /** Issue the copies of the tile at element kk (this thread's chunk) into stage `into`. */
  const loadStep = (into: string): void => {
    kb.op(
      `setp.lt.u32 ${inK}, ${kk}, ${K};`,
      `and.pred ${pA}, ${okA}, ${inK};`,
      `and.pred ${pB0}, ${okB0}, ${inK};`,
      `and.pred ${pB1}, ${okB1}, ${inK};`,
      `add.u32 ${tmp}, ${sB}, ${into};`,
    );
    copy(tmp, 0, wp0, w, pB0);
    copy(tmp, 64 * ROW, wp1, w, pB1);
    if (half) {
      for (const r of xv) kb.op(`mov.f32 ${r}, 0f00000000;`);
      kb.op(
        `@${pA} ld.global.v4.f32 {${xv.slice(0, 4).join(", ")}}, [${xp}];`,
        `@${pA} ld.global.v4.f32 {${xv.slice(4).join(", ")}}, [${xp}+16];`,
      );
    } else {
      kb.op(`add.u32 ${tmp}, ${sA}, ${into};`);
      copy(tmp, 0, xp, x, pA);
    }
    kb.op(
      "cp.async.commit_group;",
      `add.u64 ${xp}, ${xp}, ${xStep};`,
      `add.u64 ${wp0}, ${wp0}, ${kBytes};`,
      `add.u64 ${wp1}, ${wp1}, ${kBytes};`,
      `add.u32 ${kk}, ${kk}, ${elemsPerStep};`,
    );
  };
  const packed = kb.regs("b32", half ? 4 : 0);
  /** f32 x: round the loaded pairs to the 16-bit type and store them into stage `into`. */
  const storeX = (into: string): void => {
    if (!half) return;
    for (let i = 0; i < 4; i++)
      kb.op(`cvt.rn.${operand}x2.f32 ${packed[i]}, ${xv[2 * i + 1]}, ${xv[2 * i]};`);
    kb.op(`add.u32 ${tmp}, ${sA}, ${into};`, `st.shared.v4.b32 [${tmp}], {${packed.join(", ")}};`);
  };

  const accType = integer ? "b32" : "f32";
  const acc = kb.regs(accType, 32); // [mi][nj][c]: (mi · 4 + nj) · 4 + c
  for (const r of acc) kb.op(integer ? `mov.b32 ${r}, 0;` : `mov.f32 ${r}, 0f00000000;`);

  const next = kb.reg("b32");
  loadStep(stage);
  storeX(stage);
  kb.op("cp.async.wait_group 0;", "bar.sync 0;");
  const top = kb.label("kt");
  const done = kb.label("kt_done");
  const more = kb.reg("pred");
  const [cA, cB] = kb.regs("b32", 2);
  const af = kb.regs("b32", 8); // [mi][4]
  const bfr = kb.regs("b32", 8); // [nj][2]
  kb.place(top);
  kb.op(
    `add.u32 ${k0}, ${k0}, ${elemsPerStep};`,
    `setp.lt.u32 ${more}, ${k0}, ${K};`,
    `add.u32 ${cA}, ${fA}, ${stage};`,
    `add.u32 ${cB}, ${fB}, ${stage};`,
    `xor.b32 ${next}, ${stage}, ${STAGE};`,
  );
  // the next tile into the other stage (zero-filled past K), in flight during the multiplies; that
  // stage was last read before the previous step's bar.sync
  loadStep(next);
  for (let slice = 0; slice < kBytes / 32; slice++) {
    for (let mi = 0; mi < 2; mi++)
      kb.op(
        `ldmatrix.sync.aligned.m8n8.x4.shared.b16 {${af.slice(mi * 4, mi * 4 + 4).join(", ")}}, [${cA}+${mi * 16 * ROW + slice * 32}];`,
      );
    for (let p = 0; p < 2; p++)
      kb.op(
        `ldmatrix.sync.aligned.m8n8.x4.shared.b16 {${bfr.slice(p * 4, p * 4 + 4).join(", ")}}, [${cB}+${p * 16 * ROW + slice * 32}];`,
      );
    for (let mi = 0; mi < 2; mi++)
      for (let nj = 0; nj < 4; nj++) {
        const c = acc.slice((mi * 4 + nj) * 4, (mi * 4 + nj) * 4 + 4).join(", ");
        const a = af.slice(mi * 4, mi * 4 + 4).join(", ");
        const b = bfr.slice(nj * 2, nj * 2 + 2).join(", ");
        kb.op(`${mmaInstruction(operand)} {${c}}, {${a}}, {${b}}, {${c}};`);
      }
  }
  kb.op(`@!${more} bra ${done};`);
  storeX(next);
  kb.op("cp.async.wait_group 0;", "bar.sync 0;", `mov.u32 ${stage}, ${next};`, `bra ${top};`);
  kb.place(done);
  kb.op("cp.async.wait_group 0;");

  // epilogue: rows m0 + 32·wm + 16·mi + g (+ 8), columns n0 + 32·wn + 8·nj + 2t (+ 1)
  const rows = [0, 8, 16, 24].map((d) => {
    const r = kb.reg("b32");
    const ok = kb.reg("pred");
    kb.op(
      `mad.lo.u32 ${r}, ${wm}, 32, ${m0};`,
      `add.u32 ${r}, ${r}, ${g};`,
      `add.u32 ${r}, ${r}, ${d};`,
      `setp.lt.u32 ${ok}, ${r}, ${M};`,
    );
    let sx: string | null = null;
    if (xScale !== null) {
      sx = kb.reg("f32");
      const at = kb.addr(xScale, r, 4);
      kb.op(`mov.f32 ${sx}, 0f00000000;`, `@${ok} ld.global.f32 ${sx}, [${at}];`);
    }
    return { r, ok, sx };
  });
  const cols = Array.from({ length: 8 }, (_, i) => {
    const c = kb.reg("b32");
    const ok = kb.reg("pred");
    kb.op(
      `mad.lo.u32 ${c}, ${wn}, 32, ${n0};`,
      `mad.lo.u32 ${c}, ${t}, 2, ${c};`,
      `add.u32 ${c}, ${c}, ${(i >> 1) * 8 + (i & 1)};`,
      `setp.lt.u32 ${ok}, ${c}, ${N};`,
    );
    const load = (base: string | null): string | null => {
      if (base === null) return null;
      const v = kb.reg("f32");
      const at = kb.addr(base, c, 4);
      kb.op(`mov.f32 ${v}, 0f00000000;`, `@${ok} ld.global.f32 ${v}, [${at}];`);
      return v;
    };
    const sw = load(scale);
    const bv = load(bias);
    return { c, ok, sw, bv };
  });
  for (let mi = 0; mi < 2; mi++)
    for (let nj = 0; nj < 4; nj++)
      for (let e = 0; e < 4; e++) {
        const row = rows[mi * 2 + (e >> 1)] as (typeof rows)[number];
        const col = cols[nj * 2 + (e & 1)] as (typeof cols)[number];
        const a = acc[(mi * 4 + nj) * 4 + e] as string;
        let v = a;
        if (integer) {
          v = kb.reg("f32");
          kb.op(`cvt.rn.f32.s32 ${v}, ${a};`);
        }
        // W8A8: f32(acc) · f32(s_x · s_w); W4A4 (and fp8): (f32(acc) · s_x) · s_w — each as the
        // reference (@tp/quant convRotLinear) rounds it, so the cpu backend's results are matched bit for bit
        if (operand === "s8" && row.sx !== null && col.sw !== null) {
          const t = kb.reg("f32");
          kb.op(`mul.f32 ${t}, ${row.sx}, ${col.sw};`, `mul.f32 ${v}, ${v}, ${t};`);
        } else {
          if (row.sx !== null) kb.op(`mul.f32 ${v}, ${v}, ${row.sx};`);
          if (col.sw !== null) kb.op(`mul.f32 ${v}, ${v}, ${col.sw};`);
        }
        if (col.bv !== null) kb.op(`add.f32 ${v}, ${v}, ${col.bv};`);
        const [ok, idx] = [kb.reg("pred"), kb.reg("b32")];
        kb.op(`and.pred ${ok}, ${row.ok}, ${col.ok};`, `mad.lo.u32 ${idx}, ${row.r}, ${N}, ${col.c};`);
        const at = kb.addr(out, idx, 4);
        kb.op(`@${ok} st.global.f32 [${at}], ${v};`);
      }
  return kb.build([warps * 32, 1], mmaTiledMinSm(operand), operand === "e4m3" ? "8.4" : undefined);
}
