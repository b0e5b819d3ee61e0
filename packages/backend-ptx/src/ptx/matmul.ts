/**
 * Matmul kernels, y [M, N] = x [M, K] · Wᵀ (+ bias) with W [N, K] in its stored format:
 * - `gemv`: one warp per output (decode, small M): lanes stride K, warp-shuffle sum; reads every
 *   weight format element by element (gather.ts loadElement), coalesced across the warp;
 * - `tiled`: 64 × 64 output tiles, 16 × 16 threads of 4 × 4 outputs, K in steps of 16 through shared
 *   memory (weights decoded to f32 when staged), f32 FMA;
 * - `mma`: tensor cores, `mma.sync.m16n8k16` (sm_80+) with f16 / bf16 weights: x rounded to the weight's
 *   16-bit type, f32 accumulation; a warp computes 16 × 32 outputs straight from global memory;
 * - `mma_s8` / `mma_s4`: ConvRot W8A8 / W4A4 — integer activations (rows.ts quantizeRows*) × integer
 *   weights with `mma.sync.m16n8k32.s8` / `m16n8k64.s4`, exact int32 sums, y = f32(acc) · s_x[m] · s_w[n]
 *   (+ bias);
 * - prefill (M ≥ 64) takes the shared-memory tiled versions of the mma kernels instead (mma-tiled.ts);
 * - `matmul_id_gemv`: mul_mat_id as one GEMV per routed row.
 * ConvRot weights (int8 / int4) on the f32 paths are the integers: the per-row scale multiplies the
 * sum (`scaled` kernels), and x must be rotated first (gather.ts rotateKernel).
 *
 * Fragment layouts: PTX ISA §9.7.13.4 (m16n8k16 .f16/.bf16: A a0..a3 rows g / g+8, columns 2t, 2t+1 and
 * +8; B b0, b1 rows 2t, 2t+1 and +8 of column g; C c0..c3 rows g / g+8, columns 2t, 2t+1; g = lane/4,
 * t = lane%4), m16n8k32 .s8 (four bytes per register, columns 4t..4t+3 and +16) and m16n8k64 .s4
 * (eight nibbles per register, columns 8t..8t+7 and +32).
 */
import { TpError } from "@tp/tensor";
import { blockRowBytesOps, blockWarpDot, isBlockFormat, type WarpDotArgs } from "./blocks.ts";
import { KernelBuilder, type KernelSource, mmaLaneOps } from "./emit.ts";
import { type ElementFormat, loadElement, rowBytes } from "./gather.ts";

/** What every matmul variant folds in. */
export interface MatmulSpec {
  readonly format: ElementFormat;
  readonly bias: boolean;
  /** Multiply each output column n by scale[n] (ConvRot per-row weight scales). */
  readonly scaled: boolean;
}

function suffix(s: MatmulSpec): string {
  return `${s.format}${s.bias ? "_b" : ""}${s.scaled ? "_s" : ""}`;
}

/** Common parameters: out, x, w, [bias], [scale], m, n, k. */
function params(kb: KernelBuilder, s: MatmulSpec) {
  const out = kb.ld("out", "u64");
  const x = kb.ld("x", "u64");
  const w = kb.ld("w", "u64");
  const bias = s.bias ? kb.ld("bias", "u64") : null;
  const scale = s.scaled ? kb.ld("scale", "u64") : null;
  const M = kb.ld("m", "u32");
  const N = kb.ld("n", "u32");
  const K = kb.ld("k", "u32");
  return { out, x, w, bias, scale, M, N, K };
}

/** The byte length of one weight row as a register (linear in K for every format). */
export function rowBytesReg(kb: KernelBuilder, format: ElementFormat, K: string): string {
  const r = kb.reg("b32");
  if (isBlockFormat(format)) kb.op(...blockRowBytesOps(format, r, K));
  else if (format === "int4_convrot") kb.op(`shr.u32 ${r}, ${K}, 1;`);
  else if (rowBytes(format, 1) === 1) kb.op(`mov.u32 ${r}, ${K};`);
  else kb.op(`mul.lo.u32 ${r}, ${K}, ${rowBytes(format, 1)};`);
  return r;
}

/** acc · scale[n] + bias[n], stored at out[m·N + n]. */
function epilogue(kb: KernelBuilder, p: ReturnType<typeof params>, acc: string, m: string, n: string): void {
  if (p.scale !== null) {
    const sv = kb.reg("f32");
    const at = kb.addr(p.scale, n, 4);
    kb.op(`ld.global.f32 ${sv}, [${at}];`, `mul.f32 ${acc}, ${acc}, ${sv};`);
  }
  if (p.bias !== null) {
    const bv = kb.reg("f32");
    const at = kb.addr(p.bias, n, 4);
    kb.op(`ld.global.f32 ${bv}, [${at}];`, `add.f32 ${acc}, ${acc}, ${bv};`);
  }
  const idx = kb.reg("b32");
  kb.op(`mad.lo.u32 ${idx}, ${m}, ${p.N}, ${n};`);
  const at = kb.addr(p.out, idx, 4);
  kb.op(`st.global.f32 [${at}], ${acc};`);
}

/** Warps per block of the GEMV kernel (one output column each). */
export const GEMV_WARPS = 8;

/**
 * The k loop of the GEMV kernels: lane `lane` of the warp sums w_row[k] · x[xrow + k] (f32) over
 * k = lane, lane + 32, … < K into `acc`, jumping to `done` at the end, then the butterfly reduction
 * leaves the row's dot product in every lane's `acc`. `row`: the weight row's address; `q` a free pred.
 */
function warpDot(kb: KernelBuilder, a: WarpDotArgs<ElementFormat>): void {
  const { format, row, x, xrow, k, K, lane, acc, top, done, q } = a;
  // GGUF blocks: 8 consecutive k of one sub-block per lane (blocks.ts)
  if (isBlockFormat(format)) {
    blockWarpDot(kb, { ...a, format });
    return;
  }
  kb.op(`mov.f32 ${acc}, 0f00000000;`, `mov.u32 ${k}, ${lane};`);
  kb.place(top);
  kb.op(`setp.ge.u32 ${q}, ${k}, ${K};`, `@${q} bra ${done};`);
  const wv = loadElement(kb, format, row, k);
  const xi = kb.reg("b32");
  const xv = kb.reg("f32");
  kb.op(`add.u32 ${xi}, ${xrow}, ${k};`);
  const xAt = kb.addr(x, xi, 4);
  kb.op(
    `ld.global.f32 ${xv}, [${xAt}];`,
    `fma.rn.f32 ${acc}, ${xv}, ${wv}, ${acc};`,
    `add.u32 ${k}, ${k}, 32;`,
    `bra ${top};`,
  );
  kb.place(done);
  const t = kb.reg("f32");
  for (let o = 16; o >= 1; o >>= 1)
    kb.op(`shfl.sync.bfly.b32 ${t}, ${acc}, ${o}, 31, -1;`, `add.f32 ${acc}, ${acc}, ${t};`);
}

/** GEMV: grid (ceil(N / 8), M), 256 threads; warp w of block (bx, m) computes out[m, bx·8 + w]. */
export function gemvKernel(s: MatmulSpec): KernelSource {
  const kb = new KernelBuilder(`matmul_gemv_${suffix(s)}`);
  const p = params(kb, s);
  const [tid, lane, n, m, k] = kb.regs("b32", 5);
  const end = kb.label("end");
  const q = kb.reg("pred");
  kb.op(
    `mov.u32 ${tid}, %tid.x;`,
    `and.b32 ${lane}, ${tid}, 31;`,
    `shr.u32 ${n}, ${tid}, 5;`,
    `mov.u32 ${m}, %ctaid.x;`,
    `mad.lo.u32 ${n}, ${m}, ${GEMV_WARPS}, ${n};`,
    `mov.u32 ${m}, %ctaid.y;`,
    `setp.ge.u32 ${q}, ${n}, ${p.N};`,
    `@${q} bra ${end};`,
  );
  const rb = rowBytesReg(kb, s.format, p.K);
  const row = kb.reg("b64");
  kb.op(`mul.wide.u32 ${row}, ${n}, ${rb};`, `add.u64 ${row}, ${row}, ${p.w};`);
  const xrow = kb.reg("b32");
  kb.op(`mul.lo.u32 ${xrow}, ${m}, ${p.K};`);
  const acc = kb.reg("f32");
  const top = kb.label("k");
  const done = kb.label("k_done");
  warpDot(kb, { format: s.format, row, x: p.x, xrow, k, K: p.K, lane, acc, top, done, q });
  const lead = kb.reg("pred");
  const skip = kb.label("skip");
  kb.op(`setp.ne.u32 ${lead}, ${lane}, 0;`, `@${lead} bra ${skip};`);
  epilogue(kb, p, acc, m, n);
  kb.place(skip);
  kb.place(end);
  return kb.build([GEMV_WARPS * 32, 1]);
}

/** Tile of the tiled kernel: BM = BN = 64 outputs, BK = 16. */
export const TILE = { bm: 64, bn: 64, bk: 16 } as const;

/** Registers and labels of {@link tileFmaStep}. */
export interface TileFmaRegs {
  /** The shared tiles: As [BK][BM], Bs [BK][BN], f32. */
  readonly As: string;
  readonly Bs: string;
  /** Thread coordinates (tid % 16, tid / 16): this thread owns tile rows ty·4 … ty·4 + 3, columns tx·4 …. */
  readonly tx: string;
  readonly ty: string;
  /** The 16 f32 accumulators, row-major 4 × 4. */
  readonly acc: readonly string[];
  /** The K offset register (advanced by BK), the loop head and the label placed after the step. */
  readonly k0: string;
  readonly top: string;
  readonly done: string;
}

/**
 * The compute step of the shared-memory FMA tiles ({@link tiledKernel}, moe.ts groupedKernel), after the
 * stage's stores: barrier, BK rank-1 updates of the thread's 4 × 4 accumulators from As / Bs (two
 * `ld.shared.v4.f32` each), barrier, k0 += BK, branch to `top`; then places `done`. Tile sizes: {@link TILE}.
 */
export function tileFmaStep(kb: KernelBuilder, r: TileFmaRegs): void {
  const { bm, bn, bk } = TILE;
  const { As, Bs, tx, ty, acc, k0, top, done } = r;
  kb.op("bar.sync 0;");
  const aBase = kb.reg("b32");
  const bBase = kb.reg("b32");
  kb.op(
    `mov.u32 ${aBase}, ${As};`,
    `mad.lo.u32 ${aBase}, ${ty}, 16, ${aBase};`,
    `mov.u32 ${bBase}, ${Bs};`,
    `mad.lo.u32 ${bBase}, ${tx}, 16, ${bBase};`,
  );
  const av = kb.regs("f32", 4);
  const bv = kb.regs("f32", 4);
  for (let kk = 0; kk < bk; kk++) {
    kb.op(
      `ld.shared.v4.f32 {${av.join(", ")}}, [${aBase}+${kk * bm * 4}];`,
      `ld.shared.v4.f32 {${bv.join(", ")}}, [${bBase}+${kk * bn * 4}];`,
    );
    for (let i = 0; i < 4; i++)
      for (let j = 0; j < 4; j++)
        kb.op(`fma.rn.f32 ${acc[i * 4 + j]}, ${av[i]}, ${bv[j]}, ${acc[i * 4 + j]};`);
  }
  kb.op("bar.sync 0;", `add.u32 ${k0}, ${k0}, ${bk};`, `bra ${top};`);
  kb.place(done);
}

/** Tiled FMA matmul: grid (ceil(N / 64), ceil(M / 64)), 256 threads. */
export function tiledKernel(s: MatmulSpec): KernelSource {
  const { bm, bn, bk } = TILE;
  const kb = new KernelBuilder(`matmul_tiled_${suffix(s)}`);
  const p = params(kb, s);
  const As = kb.shared("a", bk * bm * 4);
  const Bs = kb.shared("b", bk * bn * 4);
  const [tid, tx, ty, m0, n0, k0] = kb.regs("b32", 6);
  kb.op(
    `mov.u32 ${tid}, %tid.x;`,
    `and.b32 ${tx}, ${tid}, 15;`,
    `shr.u32 ${ty}, ${tid}, 4;`,
    `mov.u32 ${n0}, %ctaid.x;`,
    `mul.lo.u32 ${n0}, ${n0}, ${bn};`,
    `mov.u32 ${m0}, %ctaid.y;`,
    `mul.lo.u32 ${m0}, ${m0}, ${bm};`,
    `mov.u32 ${k0}, 0;`,
  );
  const rb = rowBytesReg(kb, s.format, p.K);
  const acc = kb.regs("f32", 16);
  for (const a of acc) kb.op(`mov.f32 ${a}, 0f00000000;`);
  const top = kb.label("kt");
  const done = kb.label("kt_done");
  const q = kb.reg("pred");
  kb.place(top);
  kb.op(`setp.ge.u32 ${q}, ${k0}, ${p.K};`, `@${q} bra ${done};`);
  // stage: 1024 elements of each tile, 4 per thread; element e → (row e / 16, kk e % 16), stored [kk][row]
  for (let l = 0; l < 4; l++) {
    const [e, r, kk, gk, gm, sa] = kb.regs("b32", 6);
    const ok = kb.reg("pred");
    kb.op(
      `add.u32 ${e}, ${tid}, ${l * 256};`,
      `shr.u32 ${r}, ${e}, 4;`,
      `and.b32 ${kk}, ${e}, 15;`,
      `add.u32 ${gk}, ${k0}, ${kk};`,
      `mad.lo.u32 ${sa}, ${kk}, ${bm}, ${r};`,
      `shl.b32 ${sa}, ${sa}, 2;`,
    );
    // x tile
    const xv = kb.reg("f32");
    kb.op(
      `add.u32 ${gm}, ${m0}, ${r};`,
      `setp.lt.u32 ${ok}, ${gm}, ${p.M};`,
      `setp.lt.and.u32 ${ok}, ${gk}, ${p.K}, ${ok};`,
      `mov.f32 ${xv}, 0f00000000;`,
      `mad.lo.u32 ${gm}, ${gm}, ${p.K}, ${gk};`,
    );
    const xAt = kb.addr(p.x, gm, 4);
    kb.op(`@${ok} ld.global.f32 ${xv}, [${xAt}];`);
    const ax = kb.reg("b32");
    kb.op(`mov.u32 ${ax}, ${As};`, `add.u32 ${ax}, ${ax}, ${sa};`, `st.shared.f32 [${ax}], ${xv};`);
    // w tile (decoded)
    const gn = kb.reg("b32");
    const wv = kb.reg("f32");
    const skip = kb.label("wskip");
    kb.op(
      `add.u32 ${gn}, ${n0}, ${r};`,
      `setp.lt.u32 ${ok}, ${gn}, ${p.N};`,
      `setp.lt.and.u32 ${ok}, ${gk}, ${p.K}, ${ok};`,
      `mov.f32 ${wv}, 0f00000000;`,
      `@!${ok} bra ${skip};`,
    );
    const row = kb.reg("b64");
    kb.op(`mul.wide.u32 ${row}, ${gn}, ${rb};`, `add.u64 ${row}, ${row}, ${p.w};`);
    const w = loadElement(kb, s.format, row, gk);
    kb.op(`mov.f32 ${wv}, ${w};`);
    kb.place(skip);
    const bx = kb.reg("b32");
    kb.op(`mov.u32 ${bx}, ${Bs};`, `add.u32 ${bx}, ${bx}, ${sa};`, `st.shared.f32 [${bx}], ${wv};`);
  }
  tileFmaStep(kb, { As, Bs, tx, ty, acc, k0, top, done });
  for (let i = 0; i < 4; i++) {
    for (let j = 0; j < 4; j++) {
      const [m, n] = kb.regs("b32", 2);
      const ok = kb.reg("pred");
      const skip = kb.label("st");
      kb.op(
        `mad.lo.u32 ${m}, ${ty}, 4, ${m0};`,
        `add.u32 ${m}, ${m}, ${i};`,
        `mad.lo.u32 ${n}, ${tx}, 4, ${n0};`,
        `add.u32 ${n}, ${n}, ${j};`,
        `setp.lt.u32 ${ok}, ${m}, ${p.M};`,
        `setp.lt.and.u32 ${ok}, ${n}, ${p.N}, ${ok};`,
        `@!${ok} bra ${skip};`,
      );
      epilogue(kb, p, acc[i * 4 + j] as string, m, n);
      kb.place(skip);
    }
  }
  return kb.build([256, 1]);
}

/** Warps per block of the mma kernels; each computes 16 rows × 32 columns. */
export const MMA_WARPS = 4;

/**
 * Tensor-core matmul for f16 / bf16 weights (sm_80+): grid (ceil(N / 128), ceil(M / 16)), 128 threads;
 * K a multiple of 16. x is read as f32 and rounded to the weight's type in registers.
 */
export function mmaKernel(s: MatmulSpec): KernelSource {
  if (s.format !== "f16" && s.format !== "bf16")
    throw new TpError("E_INTERNAL", `mma kernel for ${s.format}`);
  const t16 = s.format;
  const kb = new KernelBuilder(`matmul_mma_${suffix(s)}`);
  const p = params(kb, s);
  const { t, n0, k0, rows, cols } = mmaFragmentIndices(kb, p);
  const acc = kb.regs("f32", 16);
  for (const a of acc) kb.op(`mov.f32 ${a}, 0f00000000;`);
  const top = kb.label("k");
  const done = kb.label("k_done");
  const q = kb.reg("pred");
  kb.place(top);
  kb.op(`setp.ge.u32 ${q}, ${k0}, ${p.K};`, `@${q} bra ${done};`);
  // A fragment: a0 (row g, cols 2t..), a1 (row g+8), a2 (row g, cols 2t+8..), a3 (row g+8, +8)
  const a = kb.regs("b32", 4);
  [
    [0, 0],
    [1, 0],
    [0, 8],
    [1, 8],
  ].forEach(([ri, dk], idx) => {
    const row = rows[ri as number] as { r: string; ok: string };
    const kk = kb.reg("b32");
    const lo = kb.reg("f32");
    const hi = kb.reg("f32");
    kb.op(
      `mad.lo.u32 ${kk}, ${t}, 2, ${k0};`,
      `add.u32 ${kk}, ${kk}, ${dk};`,
      `mad.lo.u32 ${kk}, ${row.r}, ${p.K}, ${kk};`,
      `mov.f32 ${lo}, 0f00000000;`,
      `mov.f32 ${hi}, 0f00000000;`,
    );
    const xAt = kb.addr(p.x, kk, 4);
    kb.op(
      `@${row.ok} ld.global.v2.f32 {${lo}, ${hi}}, [${xAt}];`,
      `cvt.rn.${t16}x2.f32 ${a[idx]}, ${hi}, ${lo};`,
    );
  });
  for (let j = 0; j < 4; j++) {
    const col = cols[j] as { c: string; ok: string };
    const b = kb.regs("b32", 2);
    [0, 8].forEach((dk, bi) => {
      const kk = kb.reg("b32");
      kb.op(
        `mad.lo.u32 ${kk}, ${t}, 2, ${k0};`,
        `add.u32 ${kk}, ${kk}, ${dk};`,
        `mad.lo.u32 ${kk}, ${col.c}, ${p.K}, ${kk};`,
        `mov.b32 ${b[bi]}, 0;`,
      );
      const wAt = kb.addr(p.w, kk, 2);
      kb.op(`@${col.ok} ld.global.b32 ${b[bi]}, [${wAt}];`);
    });
    const c = acc.slice(j * 4, j * 4 + 4);
    kb.op(
      `mma.sync.aligned.m16n8k16.row.col.f32.${t16}.${t16}.f32 {${c.join(", ")}}, {${a.join(", ")}}, {${b.join(", ")}}, {${c.join(", ")}};`,
    );
  }
  kb.op(`add.u32 ${k0}, ${k0}, 16;`, `bra ${top};`);
  kb.place(done);
  storeFragments(kb, p, acc, rows, n0, t);
  return kb.build([MMA_WARPS * 32, 1], 80);
}

/**
 * The thread indices of the mma kernels: lane's group g = lane / 4 and t = lane % 4, the block's first
 * row m0 = 16·%ctaid.y and the warp's first column n0, the k counter (0), rows g and g + 8 of x and
 * columns g + 8j (j < 4) of w, each with its in-range predicate.
 */
function mmaFragmentIndices(kb: KernelBuilder, p: ReturnType<typeof params>) {
  const [tid, lane, warp, g, t, m0, n0, k0] = kb.regs("b32", 8);
  kb.op(
    ...mmaLaneOps({ tid, lane, warp, g, t }),
    `mov.u32 ${m0}, %ctaid.y;`,
    `shl.b32 ${m0}, ${m0}, 4;`,
    `mov.u32 ${n0}, %ctaid.x;`,
    `mul.lo.u32 ${n0}, ${n0}, ${MMA_WARPS * 32};`,
    `mad.lo.u32 ${n0}, ${warp}, 32, ${n0};`,
    `mov.u32 ${k0}, 0;`,
  );
  // rows g and g + 8 of x, clamped validity
  const rows = [0, 8].map((d) => {
    const r = kb.reg("b32");
    const ok = kb.reg("pred");
    kb.op(`add.u32 ${r}, ${m0}, ${g};`, `add.u32 ${r}, ${r}, ${d};`, `setp.lt.u32 ${ok}, ${r}, ${p.M};`);
    return { r, ok };
  });
  const cols = [0, 1, 2, 3].map((j) => {
    const c = kb.reg("b32");
    const ok = kb.reg("pred");
    kb.op(`add.u32 ${c}, ${n0}, ${j * 8};`, `add.u32 ${c}, ${c}, ${g};`, `setp.lt.u32 ${ok}, ${c}, ${p.N};`);
    return { c, ok };
  });
  return { t, n0, k0, rows, cols };
}

/** Store the 4 n-tiles of C fragments (c0, c1: row g, cols 2t, 2t+1; c2, c3: row g+8). */
function storeFragments(
  kb: KernelBuilder,
  p: ReturnType<typeof params>,
  acc: readonly string[],
  rows: readonly { r: string; ok: string }[],
  n0: string,
  t: string,
  rowScale?: readonly string[],
  combineScales = false,
): void {
  for (let j = 0; j < 4; j++) {
    for (let e = 0; e < 4; e++) {
      const row = rows[e >> 1] as { r: string; ok: string };
      const n = kb.reg("b32");
      const ok = kb.reg("pred");
      const skip = kb.label("st");
      kb.op(
        `mad.lo.u32 ${n}, ${t}, 2, ${n0};`,
        `add.u32 ${n}, ${n}, ${j * 8 + (e & 1)};`,
        `setp.lt.and.u32 ${ok}, ${n}, ${p.N}, ${row.ok};`,
        `@!${ok} bra ${skip};`,
      );
      const v = acc[j * 4 + e] as string;
      if (rowScale !== undefined && combineScales && p.scale !== null) {
        // W8A8: f32(acc) · f32(s_x · s_w), as the reference rounds it (@tp/quant convRotLinear)
        const sw = kb.reg("f32");
        const at = kb.addr(p.scale, n, 4);
        kb.op(
          `ld.global.f32 ${sw}, [${at}];`,
          `mul.f32 ${sw}, ${sw}, ${rowScale[e >> 1]};`,
          `mul.f32 ${v}, ${v}, ${sw};`,
        );
        epilogue(kb, { ...p, scale: null }, v, row.r, n);
      } else {
        // W4A4: (f32(acc) · s_x) · s_w
        if (rowScale !== undefined) kb.op(`mul.f32 ${v}, ${v}, ${rowScale[e >> 1]};`);
        epilogue(kb, p, v, row.r, n);
      }
      kb.place(skip);
    }
  }
}

/**
 * ConvRot W8A8 / W4A4 (sm_80+): out = f32(q_x · q_wᵀ) · s_x[m] · s_w[n] (+ bias), q_x [M, K] with s_x
 * f32 [M] (rows.ts quantizeRows*), q_w [N, K] with s_w [N], both signed int8, or int4 packed two per
 * byte (element 2k in the low nibble, as ConvRot stores them). `mma.sync.m16n8k32.s8` / `m16n8k64.s4`:
 * a register holds 4 (8) consecutive k of one row. K a multiple of 32 (64). Grid as {@link mmaKernel}.
 * Parameters: out, x, w, [bias], scale (s_w), m, n, k, x_scale.
 */
export function mmaIntKernel(bits: 8 | 4, bias: boolean): KernelSource {
  const s: MatmulSpec = { format: bits === 8 ? "int8_convrot" : "int4_convrot", bias, scaled: true };
  const per = 32 / bits; // elements per 32-bit register
  const kb = new KernelBuilder(`matmul_mma_s${bits}_${suffix(s)}`);
  const p = params(kb, s);
  const xs = kb.ld("x_scale", "u64");
  const { t, n0, k0, rows, cols } = mmaFragmentIndices(kb, p);
  const acc = kb.regs("b32", 16);
  for (const a of acc) kb.op(`mov.b32 ${a}, 0;`);
  const top = kb.label("k");
  const done = kb.label("k_done");
  const q = kb.reg("pred");
  kb.place(top);
  kb.op(`setp.ge.u32 ${q}, ${k0}, ${p.K};`, `@${q} bra ${done};`);
  const a = kb.regs("b32", 4);
  // element offsets → byte offsets: >> 1 for int4
  const bytesOf = (kk: string) => {
    if (bits === 4) kb.op(`shr.u32 ${kk}, ${kk}, 1;`);
    return kk;
  };
  [
    [0, 0],
    [1, 0],
    [0, 4 * per],
    [1, 4 * per],
  ].forEach(([ri, dk], idx) => {
    const row = rows[ri as number] as { r: string; ok: string };
    const kk = kb.reg("b32");
    kb.op(
      `mad.lo.u32 ${kk}, ${t}, ${per}, ${k0};`,
      `add.u32 ${kk}, ${kk}, ${dk};`,
      `mad.lo.u32 ${kk}, ${row.r}, ${p.K}, ${kk};`,
      `mov.b32 ${a[idx]}, 0;`,
    );
    const xAt = kb.addr(p.x, bytesOf(kk), 1);
    kb.op(`@${row.ok} ld.global.b32 ${a[idx]}, [${xAt}];`);
  });
  for (let j = 0; j < 4; j++) {
    const col = cols[j] as { c: string; ok: string };
    const b = kb.regs("b32", 2);
    [0, 4 * per].forEach((dk, bi) => {
      const kk = kb.reg("b32");
      kb.op(
        `mad.lo.u32 ${kk}, ${t}, ${per}, ${k0};`,
        `add.u32 ${kk}, ${kk}, ${dk};`,
        `mad.lo.u32 ${kk}, ${col.c}, ${p.K}, ${kk};`,
        `mov.b32 ${b[bi]}, 0;`,
      );
      const wAt = kb.addr(p.w, bytesOf(kk), 1);
      kb.op(`@${col.ok} ld.global.b32 ${b[bi]}, [${wAt}];`);
    });
    const c = acc.slice(j * 4, j * 4 + 4);
    kb.op(
      `mma.sync.aligned.m16n8k${8 * per}.row.col.s32.s${bits}.s${bits}.s32 {${c.join(", ")}}, {${a.join(", ")}}, {${b.join(", ")}}, {${c.join(", ")}};`,
    );
  }
  kb.op(`add.u32 ${k0}, ${k0}, ${8 * per};`, `bra ${top};`);
  kb.place(done);
  const accF = acc.map((r) => {
    const f = kb.reg("f32");
    kb.op(`cvt.rn.f32.s32 ${f}, ${r};`);
    return f;
  });
  const rowScale = rows.map((row) => {
    const sv = kb.reg("f32");
    const at = kb.addr(xs, row.r, 4);
    kb.op(`mov.f32 ${sv}, 0f00000000;`, `@${row.ok} ld.global.f32 ${sv}, [${at}];`);
    return sv;
  });
  storeFragments(kb, p, accF, rows, n0, t, rowScale, bits === 8);
  return kb.build([MMA_WARPS * 32, 1], 80);
}

/**
 * matmul_id (ggml mul_mat_id) for decode: GEMV per routed row. Row r = t·S + s of out [T, S, N] is
 * x[t, s] (or x[t, 0] when x has one slot: x_div = S) · W_{ids[r]}ᵀ with W the expert-major stack
 * [experts·N, K]; an id outside [0, experts) gives a row of NaN. Grid (ceil(N / 8), T·S), 256 threads.
 * `scaled`: the sum times scale[e·N + n] (ConvRot row scales, fp8's tensor scale repeated).
 * Parameters: out, x, w, ids, [scale], m (T·S), n, k, experts, x_div.
 */
export function gemvIdKernel(format: ElementFormat, scaled = false): KernelSource {
  const kb = new KernelBuilder(`matmul_id_gemv_${format}${scaled ? "_s" : ""}`);
  const out = kb.ld("out", "u64");
  const x = kb.ld("x", "u64");
  const w = kb.ld("w", "u64");
  const ids = kb.ld("ids", "u64");
  const scale = scaled ? kb.ld("scale", "u64") : null;
  kb.ld("m", "u32");
  const N = kb.ld("n", "u32");
  const K = kb.ld("k", "u32");
  const experts = kb.ld("experts", "u32");
  const xDiv = kb.ld("x_div", "u32");
  const [tid, lane, n, r, k, id, wrow, xrow] = kb.regs("b32", 8);
  const end = kb.label("end");
  const q = kb.reg("pred");
  const bad = kb.reg("pred");
  kb.op(
    `mov.u32 ${tid}, %tid.x;`,
    `and.b32 ${lane}, ${tid}, 31;`,
    `shr.u32 ${n}, ${tid}, 5;`,
    `mov.u32 ${r}, %ctaid.x;`,
    `mad.lo.u32 ${n}, ${r}, ${GEMV_WARPS}, ${n};`,
    `mov.u32 ${r}, %ctaid.y;`,
    `setp.ge.u32 ${q}, ${n}, ${N};`,
    `@${q} bra ${end};`,
  );
  const idAt = kb.addr(ids, r, 4);
  kb.op(
    `ld.global.u32 ${id}, [${idAt}];`,
    `setp.ge.u32 ${bad}, ${id}, ${experts};`,
    `mad.lo.u32 ${wrow}, ${id}, ${N}, ${n};`,
    `div.u32 ${xrow}, ${r}, ${xDiv};`,
    `mul.lo.u32 ${xrow}, ${xrow}, ${K};`,
  );
  const acc = kb.reg("f32");
  const done = kb.label("k_done");
  kb.op(`mov.f32 ${acc}, 0f7FC00000;`, `@${bad} bra ${done};`);
  const rb = rowBytesReg(kb, format, K);
  const row = kb.reg("b64");
  kb.op(`mul.wide.u32 ${row}, ${wrow}, ${rb};`, `add.u64 ${row}, ${row}, ${w};`);
  const top = kb.label("k");
  warpDot(kb, { format, row, x, xrow, k, K, lane, acc, top, done, q: kb.reg("pred") });
  if (scale !== null) {
    const sv = kb.reg("f32");
    const sAt = kb.addr(scale, wrow, 4);
    kb.op(`@!${bad} ld.global.f32 ${sv}, [${sAt}];`, `@!${bad} mul.f32 ${acc}, ${acc}, ${sv};`);
  }
  const lead = kb.reg("pred");
  const oi = kb.reg("b32");
  kb.op(`setp.eq.u32 ${lead}, ${lane}, 0;`, `mad.lo.u32 ${oi}, ${r}, ${N}, ${n};`);
  const outAt = kb.addr(out, oi, 4);
  kb.op(`@${lead} st.global.f32 [${outAt}], ${acc};`);
  kb.place(end);
  return kb.build([GEMV_WARPS * 32, 1]);
}
