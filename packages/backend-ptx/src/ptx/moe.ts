/**
 * matmul_id (ggml mul_mat_id) for prefill: the routed rows grouped by expert on the device, then one
 * tiled GEMM launch over every expert's gathered rows.
 *
 * Routing, over R = T·S routed rows r with ids[r] (i32), in B = experts + 1 buckets (bucket `experts`
 * collects the ids outside [0, experts), whose rows become NaN as on the GEMV path):
 * 1. `moe_route_count`: counts[b] += 1 per row (counts zeroed by the host first);
 * 2. `moe_route_scan` (one block): exclusive prefix sums of the counts (row_start[b]) and of the row
 *    tiles ⌈counts[b] / 64⌉ (the tile list: tile_expert[j], tile_row[j] = the tile's first row within
 *    its bucket, and tiles[0] = how many);
 * 3. `moe_route_scatter`: list[row_start[b] + atomic cursor[b]++] = r (cursor zeroed first). The order
 *    of rows within a bucket depends on the atomics, the results do not: every output is one thread's
 *    k-ordered sum wherever its row sits in the tile.
 * Then `matmul_id_grouped_<format>`: grid (⌈N / 64⌉, tile-list bound, 1); block (x, y) computes the
 * 64 × 64 outputs of columns 64x… of tile y's expert for its (up to 64) gathered rows, as the tiled
 * matmul (matmul.ts tiledKernel: 16 × 16 threads of 4 × 4 outputs, K in steps of 16 through shared
 * memory, weights decoded to f32 when staged, f32 FMA), and writes them back to the routed rows
 * out[r, :]. Blocks past tiles[0] return at once (the grid is sized for the worst case, no read back to
 * the host). Nothing here reads routing ids on the host.
 */
import { TpError } from "@tp/tensor";
import { KernelBuilder, type KernelSource, mmaLaneOps } from "./emit.ts";
import { type ElementFormat, loadElement } from "./gather.ts";
import { rowBytesReg, TILE, tileFmaStep } from "./matmul.ts";

/** Rows (and columns) of one output tile of the grouped GEMM; K step 16: the tiled kernel's tile, whose FMA step it runs. */
export const MOE_TILE = TILE;

/** Threads per block of the routing kernels. */
export const MOE_ROUTE_BLOCK = 256;

/**
 * Whether matmul_id takes the grouped path for R routed rows over `experts` experts: R ≥ 64 and
 * R ≥ 4 · experts (on average four rows or more per expert). Why: the GEMV path reads the whole
 * expert matrix once per routed row (one decode and one FMA per weight element and row); a 64-row tile
 * decodes each weight element once and spends 64 FMAs on it, so with a rows in a tile the tile costs
 * about as much as ~5 GEMV rows for f32 weights (bandwidth-bound GEMV) and fewer for the block
 * formats (decode-bound GEMV); four rows per expert on average (routing is skewed, so the busy experts
 * hold more) is where the grouped path stops losing. Below 64 rows the three routing launches and two
 * fills cost about what the GEMV rows do.
 */
export function groupedMatmulId(rows: number, experts: number): boolean {
  return rows >= 64 && rows >= 4 * experts;
}

/** The tile list's length bound for R rows in `experts` + 1 buckets: Σ ⌈c_b / 64⌉ ≤ ⌈R / 64⌉ + min(B, R). */
export function moeTileBound(rows: number, experts: number): number {
  return Math.ceil(rows / MOE_TILE.bm) + Math.min(experts + 1, rows);
}

/** The bucket of routed row `r` in `b`: ids[r] when in [0, experts), else experts (unsigned compare). */
function bucket(kb: KernelBuilder, ids: string, r: string, experts: string): string {
  const b = kb.reg("b32");
  const bad = kb.reg("pred");
  const at = kb.addr(ids, r, 4);
  kb.op(
    `ld.global.u32 ${b}, [${at}];`,
    `setp.ge.u32 ${bad}, ${b}, ${experts};`,
    `@${bad} mov.u32 ${b}, ${experts};`,
  );
  return b;
}

/** Routing step 1: counts[bucket(r)] += 1. Grid ⌈R / 256⌉. Parameters: ids, counts, m (R), experts. */
export function moeCountKernel(): KernelSource {
  const kb = new KernelBuilder("moe_route_count");
  const ids = kb.ld("ids", "u64");
  const counts = kb.ld("counts", "u64");
  const [R, experts] = kb.lds("u32", "m", "experts");
  const r = kb.globalIndex();
  const end = kb.label("end");
  const q = kb.reg("pred");
  kb.op(`setp.ge.u32 ${q}, ${r}, ${R};`, `@${q} bra ${end};`);
  const b = bucket(kb, ids, r, experts);
  const at = kb.addr(counts, b, 4);
  kb.op(`red.global.add.u32 [${at}], 1;`);
  kb.place(end);
  return kb.build([MOE_ROUTE_BLOCK, 1]);
}

/**
 * Routing step 2, one block of 256 threads: thread t takes buckets [t·c, t·c + c), c = ⌈B / 256⌉; the
 * chunk sums of rows and tiles are scanned across the block (Hillis–Steele in shared memory), then
 * each thread writes its buckets' row_start and tile list entries. Parameters: counts, row_start,
 * tile_expert, tile_row, tiles, experts.
 */
export function moeScanKernel(): KernelSource {
  const T = MOE_ROUTE_BLOCK;
  const kb = new KernelBuilder("moe_route_scan");
  const counts = kb.ld("counts", "u64");
  const rowStart = kb.ld("row_start", "u64");
  const tileExpert = kb.ld("tile_expert", "u64");
  const tileRow = kb.ld("tile_row", "u64");
  const tiles = kb.ld("tiles", "u64");
  const experts = kb.ld("experts", "u32");
  const sRows = kb.shared("rows", T * 4, 4);
  const sTiles = kb.shared("tiles", T * 4, 4);
  const [tid, nb, chunk, b0, b1, b, c, ct, rows, tl] = kb.regs("b32", 10);
  const q = kb.reg("pred");
  kb.op(
    `mov.u32 ${tid}, %tid.x;`,
    `add.u32 ${nb}, ${experts}, 1;`,
    `add.u32 ${chunk}, ${nb}, ${T - 1};`,
    `shr.u32 ${chunk}, ${chunk}, ${Math.log2(T)};`,
    `mul.lo.u32 ${b0}, ${tid}, ${chunk};`,
    `min.u32 ${b0}, ${b0}, ${nb};`,
    `add.u32 ${b1}, ${b0}, ${chunk};`,
    `min.u32 ${b1}, ${b1}, ${nb};`,
    `mov.u32 ${rows}, 0;`,
    `mov.u32 ${tl}, 0;`,
    `mov.u32 ${b}, ${b0};`,
  );
  // pass 1: the chunk's rows and tiles
  const sum = kb.label("sum");
  const sumDone = kb.label("sum_done");
  kb.place(sum);
  kb.op(`setp.ge.u32 ${q}, ${b}, ${b1};`, `@${q} bra ${sumDone};`);
  const cAt = kb.addr(counts, b, 4);
  kb.op(
    `ld.global.u32 ${c}, [${cAt}];`,
    `add.u32 ${rows}, ${rows}, ${c};`,
    `add.u32 ${ct}, ${c}, ${MOE_TILE.bm - 1};`,
    `shr.u32 ${ct}, ${ct}, ${Math.log2(MOE_TILE.bm)};`,
    `add.u32 ${tl}, ${tl}, ${ct};`,
    `add.u32 ${b}, ${b}, 1;`,
    `bra ${sum};`,
  );
  kb.place(sumDone);
  // inclusive scan of (rows, tiles) over the block
  const [aR, aT, vR, vT, src] = kb.regs("b32", 5);
  const has = kb.reg("pred");
  kb.op(
    `mov.u32 ${aR}, ${sRows};`,
    `mad.lo.u32 ${aR}, ${tid}, 4, ${aR};`,
    `mov.u32 ${aT}, ${sTiles};`,
    `mad.lo.u32 ${aT}, ${tid}, 4, ${aT};`,
    `st.shared.u32 [${aR}], ${rows};`,
    `st.shared.u32 [${aT}], ${tl};`,
  );
  for (let off = 1; off < T; off <<= 1) {
    kb.op(
      "bar.sync 0;",
      `setp.ge.u32 ${has}, ${tid}, ${off};`,
      `mov.u32 ${vR}, 0;`,
      `mov.u32 ${vT}, 0;`,
      `sub.u32 ${src}, ${aR}, ${off * 4};`,
      `@${has} ld.shared.u32 ${vR}, [${src}];`,
      `sub.u32 ${src}, ${aT}, ${off * 4};`,
      `@${has} ld.shared.u32 ${vT}, [${src}];`,
      "bar.sync 0;",
      `ld.shared.u32 ${src}, [${aR}];`,
      `add.u32 ${src}, ${src}, ${vR};`,
      `st.shared.u32 [${aR}], ${src};`,
      `ld.shared.u32 ${src}, [${aT}];`,
      `add.u32 ${src}, ${src}, ${vT};`,
      `st.shared.u32 [${aT}], ${src};`,
    );
  }
  kb.op("bar.sync 0;");
  // the last thread's inclusive tile sum is the list's length
  const [incR, incT] = kb.regs("b32", 2);
  const last = kb.reg("pred");
  kb.op(
    `ld.shared.u32 ${incR}, [${aR}];`,
    `ld.shared.u32 ${incT}, [${aT}];`,
    `setp.eq.u32 ${last}, ${tid}, ${T - 1};`,
    `@${last} st.global.u32 [${tiles}], ${incT};`,
    // exclusive starts of this chunk
    `sub.u32 ${rows}, ${incR}, ${rows};`,
    `sub.u32 ${tl}, ${incT}, ${tl};`,
    `mov.u32 ${b}, ${b0};`,
  );
  // pass 2: row_start of each bucket, and its tiles in the list
  const put = kb.label("put");
  const putDone = kb.label("put_done");
  const jr = kb.reg("b32");
  const q2 = kb.reg("pred");
  kb.place(put);
  kb.op(`setp.ge.u32 ${q}, ${b}, ${b1};`, `@${q} bra ${putDone};`);
  const c2At = kb.addr(counts, b, 4);
  const rsAt = kb.addr(rowStart, b, 4);
  kb.op(
    `ld.global.u32 ${c}, [${c2At}];`,
    `st.global.u32 [${rsAt}], ${rows};`,
    `add.u32 ${rows}, ${rows}, ${c};`,
    `mov.u32 ${jr}, 0;`,
  );
  const tile = kb.label("tile");
  const tileDone = kb.label("tile_done");
  kb.place(tile);
  kb.op(`setp.ge.u32 ${q2}, ${jr}, ${c};`, `@${q2} bra ${tileDone};`);
  const teAt = kb.addr(tileExpert, tl, 4);
  kb.op(`st.global.u32 [${teAt}], ${b};`);
  const trAt = kb.addr(tileRow, tl, 4);
  kb.op(
    `st.global.u32 [${trAt}], ${jr};`,
    `add.u32 ${tl}, ${tl}, 1;`,
    `add.u32 ${jr}, ${jr}, ${MOE_TILE.bm};`,
    `bra ${tile};`,
  );
  kb.place(tileDone);
  kb.op(`add.u32 ${b}, ${b}, 1;`, `bra ${put};`);
  kb.place(putDone);
  return kb.build([T, 1]);
}

/**
 * Routing step 3: list[row_start[b] + cursor[b]++] = r with b = bucket(r) (cursor zeroed by the host).
 * Grid ⌈R / 256⌉. Parameters: ids, row_start, cursor, list, m (R), experts.
 */
export function moeScatterKernel(): KernelSource {
  const kb = new KernelBuilder("moe_route_scatter");
  const ids = kb.ld("ids", "u64");
  const rowStart = kb.ld("row_start", "u64");
  const cursor = kb.ld("cursor", "u64");
  const list = kb.ld("list", "u64");
  const [R, experts] = kb.lds("u32", "m", "experts");
  const r = kb.globalIndex();
  const end = kb.label("end");
  const q = kb.reg("pred");
  kb.op(`setp.ge.u32 ${q}, ${r}, ${R};`, `@${q} bra ${end};`);
  const b = bucket(kb, ids, r, experts);
  const [pos, start] = kb.regs("b32", 2);
  const curAt = kb.addr(cursor, b, 4);
  kb.op(`atom.global.add.u32 ${pos}, [${curAt}], 1;`);
  const rsAt = kb.addr(rowStart, b, 4);
  kb.op(`ld.global.u32 ${start}, [${rsAt}];`, `add.u32 ${pos}, ${pos}, ${start};`);
  const at = kb.addr(list, pos, 4);
  kb.op(`st.global.u32 [${at}], ${r};`);
  kb.place(end);
  return kb.build([MOE_ROUTE_BLOCK, 1]);
}

/** What the grouped GEMM folds in: the experts' weight format and whether outputs take scale[e·N + n]. */
export interface GroupedSpec {
  readonly format: ElementFormat;
  /** Multiply out[r, n] by scale[e·N + n] (ConvRot per-row scales; fp8's tensor scale repeated). */
  readonly scaled: boolean;
}

/** The parameters of the grouped GEMMs, loaded in their order (`scale` only when `scaled`). */
function groupedParams(kb: KernelBuilder, scaled: boolean) {
  const out = kb.ld("out", "u64");
  const x = kb.ld("x", "u64");
  const w = kb.ld("w", "u64");
  const scale = scaled ? kb.ld("scale", "u64") : null;
  const counts = kb.ld("counts", "u64");
  const rowStart = kb.ld("row_start", "u64");
  const tileExpert = kb.ld("tile_expert", "u64");
  const tileRow = kb.ld("tile_row", "u64");
  const tiles = kb.ld("tiles", "u64");
  const list = kb.ld("list", "u64");
  kb.ld("m", "u32");
  const [N, K, experts, xDiv] = kb.lds("u32", "n", "k", "experts", "x_div");
  return { out, x, w, scale, counts, rowStart, tileExpert, tileRow, tiles, list, N, K, experts, xDiv };
}

/**
 * The tile header of the grouped GEMMs: y = %ctaid.y (past `tiles[0]` → `end`), its expert e and first
 * row row0 (moeScatterKernel's tile_expert / tile_row), then valid = min(counts[e] − row0, BM) and
 * first = row_start[e] + row0 (the list index of the tile's row 0), into the given registers.
 */
function tileRouting(
  kb: KernelBuilder,
  p: ReturnType<typeof groupedParams>,
  r: Record<"y" | "total" | "e" | "row0" | "cnt" | "valid" | "first" | "q" | "end", string>,
): void {
  const { y, total, e, row0, cnt, valid, first, q, end } = r;
  kb.op(
    `mov.u32 ${y}, %ctaid.y;`,
    `ld.global.u32 ${total}, [${p.tiles}];`,
    `setp.ge.u32 ${q}, ${y}, ${total};`,
    `@${q} bra ${end};`,
  );
  const teAt = kb.addr(p.tileExpert, y, 4);
  const trAt = kb.addr(p.tileRow, y, 4);
  kb.op(`ld.global.u32 ${e}, [${teAt}];`, `ld.global.u32 ${row0}, [${trAt}];`);
  const cAt = kb.addr(p.counts, e, 4);
  const rsAt = kb.addr(p.rowStart, e, 4);
  kb.op(
    `ld.global.u32 ${cnt}, [${cAt}];`,
    `ld.global.u32 ${first}, [${rsAt}];`,
    `sub.u32 ${valid}, ${cnt}, ${row0};`,
    `min.u32 ${valid}, ${valid}, ${MOE_TILE.bm};`,
    `add.u32 ${first}, ${first}, ${row0};`,
  );
}

/** The entry name: `matmul_id_grouped_<format>[_s]`. */
export function groupedKernelName(s: GroupedSpec): string {
  return `matmul_id_grouped_${s.format}${s.scaled ? "_s" : ""}`;
}

/**
 * The grouped GEMM: out [R, N] (rows r = t·S + s) = x[r / x_div] · W_eᵀ for the rows the routing put in
 * expert e's list, W the expert-major stack [experts·N, K] in `format`; rows of the bucket `experts`
 * (ids out of range) are NaN. Grid (⌈N / 64⌉, moeTileBound(R, experts), 1), 256 threads.
 * Parameters: out, x, w, [scale], counts, row_start, tile_expert, tile_row, tiles, list, m, n, k,
 * experts, x_div.
 */
export function groupedKernel(s: GroupedSpec): KernelSource {
  if (s.format === "int4_convrot" || s.format === "int8_convrot") {
    if (!s.scaled) throw new TpError("E_INTERNAL", `grouped matmul_id: ${s.format} needs its row scales`);
  }
  const { bm, bn, bk } = MOE_TILE;
  const kb = new KernelBuilder(groupedKernelName(s));
  const p = groupedParams(kb, s.scaled);
  const { out, x, w, scale, list, N, K, experts, xDiv } = p;
  const As = kb.shared("a", bk * bm * 4);
  const Bs = kb.shared("b", bk * bn * 4);
  const [tid, tx, ty, y, total, e, row0, cnt, valid, first, n0, k0] = kb.regs("b32", 12);
  const q = kb.reg("pred");
  const end = kb.label("end");
  kb.op(
    `mov.u32 ${tid}, %tid.x;`,
    `and.b32 ${tx}, ${tid}, 15;`,
    `shr.u32 ${ty}, ${tid}, 4;`,
    `mov.u32 ${n0}, %ctaid.x;`,
    `mul.lo.u32 ${n0}, ${n0}, ${bn};`,
  );
  tileRouting(kb, p, { y, total, e, row0, cnt, valid, first, q, end });
  // the routed row of the tile's local row `i` (a register), or nothing when past `valid`
  const routed = (i: string): { r: string; ok: string } => {
    const r = kb.reg("b32");
    const ok = kb.reg("pred");
    const li = kb.reg("b32");
    kb.op(`setp.lt.u32 ${ok}, ${i}, ${valid};`, `add.u32 ${li}, ${first}, ${i};`, `mov.u32 ${r}, 0;`);
    const at = kb.addr(list, li, 4);
    kb.op(`@${ok} ld.global.u32 ${r}, [${at}];`);
    return { r, ok };
  };
  // the out-of-range bucket: NaN rows
  const compute = kb.label("compute");
  const invalid = kb.reg("pred");
  kb.op(`setp.lt.u32 ${invalid}, ${e}, ${experts};`, `@${invalid} bra ${compute};`);
  const nanRows = Array.from({ length: 4 }, (_, i) => {
    const li = kb.reg("b32");
    kb.op(`mad.lo.u32 ${li}, ${ty}, 4, ${i};`);
    return routed(li);
  });
  const nan = kb.reg("f32");
  kb.op(`mov.f32 ${nan}, 0f7FC00000;`);
  for (let i = 0; i < 4; i++) {
    for (let j = 0; j < 4; j++) {
      const row = nanRows[i] as { r: string; ok: string };
      const [n, oi] = kb.regs("b32", 2);
      const ok = kb.reg("pred");
      kb.op(
        `mad.lo.u32 ${n}, ${tx}, 4, ${n0};`,
        `add.u32 ${n}, ${n}, ${j};`,
        `setp.lt.and.u32 ${ok}, ${n}, ${N}, ${row.ok};`,
        `mad.lo.u32 ${oi}, ${row.r}, ${N}, ${n};`,
      );
      const at = kb.addr(out, oi, 4);
      kb.op(`@${ok} st.global.f32 [${at}], ${nan};`);
    }
  }
  kb.op(`bra ${end};`);
  kb.place(compute);
  // staging rows of this thread: tile row (and weight column) tid / 16 + 16·l, k offset tid % 16
  const rb = rowBytesReg(kb, s.format, K);
  const stage = Array.from({ length: 4 }, (_, l) => {
    const lr = kb.reg("b32");
    kb.op(`add.u32 ${lr}, ${ty}, ${16 * l};`);
    const xr = routed(lr);
    const xBase = kb.reg("b32");
    kb.op(`div.u32 ${xBase}, ${xr.r}, ${xDiv};`, `mul.lo.u32 ${xBase}, ${xBase}, ${K};`);
    const [gn, wr] = kb.regs("b32", 2);
    const wok = kb.reg("pred");
    const wrow = kb.reg("b64");
    kb.op(
      `add.u32 ${gn}, ${n0}, ${lr};`,
      `setp.lt.u32 ${wok}, ${gn}, ${N};`,
      `mad.lo.u32 ${wr}, ${e}, ${N}, ${gn};`,
      `mul.wide.u32 ${wrow}, ${wr}, ${rb};`,
      `add.u64 ${wrow}, ${wrow}, ${w};`,
    );
    // shared offset of (kk = tid % 16, row lr): [kk][row] as the tiled kernel
    const sa = kb.reg("b32");
    kb.op(`mad.lo.u32 ${sa}, ${tx}, ${bm}, ${lr};`, `shl.b32 ${sa}, ${sa}, 2;`);
    return { xok: xr.ok, xBase, wok, wrow, sa };
  });
  const acc = kb.regs("f32", 16);
  for (const a of acc) kb.op(`mov.f32 ${a}, 0f00000000;`);
  kb.op(`mov.u32 ${k0}, 0;`);
  const top = kb.label("kt");
  const done = kb.label("kt_done");
  kb.place(top);
  kb.op(`setp.ge.u32 ${q}, ${k0}, ${K};`, `@${q} bra ${done};`);
  const gk = kb.reg("b32");
  const kin = kb.reg("pred");
  kb.op(`add.u32 ${gk}, ${k0}, ${tx};`, `setp.lt.u32 ${kin}, ${gk}, ${K};`);
  for (const st of stage) {
    const ok = kb.reg("pred");
    const xv = kb.reg("f32");
    const xi = kb.reg("b32");
    kb.op(
      `and.pred ${ok}, ${st.xok}, ${kin};`,
      `mov.f32 ${xv}, 0f00000000;`,
      `add.u32 ${xi}, ${st.xBase}, ${gk};`,
    );
    const xAt = kb.addr(x, xi, 4);
    const ax = kb.reg("b32");
    kb.op(
      `@${ok} ld.global.f32 ${xv}, [${xAt}];`,
      `mov.u32 ${ax}, ${As};`,
      `add.u32 ${ax}, ${ax}, ${st.sa};`,
      `st.shared.f32 [${ax}], ${xv};`,
    );
    const wv = kb.reg("f32");
    const skip = kb.label("wskip");
    kb.op(`and.pred ${ok}, ${st.wok}, ${kin};`, `mov.f32 ${wv}, 0f00000000;`, `@!${ok} bra ${skip};`);
    const v = loadElement(kb, s.format, st.wrow, gk);
    kb.op(`mov.f32 ${wv}, ${v};`);
    kb.place(skip);
    const bx = kb.reg("b32");
    kb.op(`mov.u32 ${bx}, ${Bs};`, `add.u32 ${bx}, ${bx}, ${st.sa};`, `st.shared.f32 [${bx}], ${wv};`);
  }
  tileFmaStep(kb, { As, Bs, tx, ty, acc, k0, top, done });
  // epilogue: outputs (ty·4 + i, tx·4 + j) to out[routed row, n]
  for (let i = 0; i < 4; i++) {
    const li = kb.reg("b32");
    kb.op(`mad.lo.u32 ${li}, ${ty}, 4, ${i};`);
    const row = routed(li);
    for (let j = 0; j < 4; j++) {
      const [n, oi] = kb.regs("b32", 2);
      const ok = kb.reg("pred");
      const skip = kb.label("st");
      const v = acc[i * 4 + j] as string;
      kb.op(
        `mad.lo.u32 ${n}, ${tx}, 4, ${n0};`,
        `add.u32 ${n}, ${n}, ${j};`,
        `setp.lt.and.u32 ${ok}, ${n}, ${N}, ${row.ok};`,
        `@!${ok} bra ${skip};`,
      );
      if (scale !== null) {
        const si = kb.reg("b32");
        const sv = kb.reg("f32");
        kb.op(`mad.lo.u32 ${si}, ${e}, ${N}, ${n};`);
        const sAt = kb.addr(scale, si, 4);
        kb.op(`ld.global.f32 ${sv}, [${sAt}];`, `mul.f32 ${v}, ${v}, ${sv};`);
      }
      kb.op(`mad.lo.u32 ${oi}, ${row.r}, ${N}, ${n};`);
      const at = kb.addr(out, oi, 4);
      kb.op(`st.global.f32 [${at}], ${v};`);
      kb.place(skip);
    }
  }
  kb.place(end);
  return kb.build([256, 1]);
}

/** Warps per block of the grouped mma kernel: warp w takes rows 16w … 16w + 15 of the 64-row tile. */
export const MOE_MMA_WARPS = 4;

/**
 * The grouped GEMM on tensor cores for f16 / bf16 experts (sm_80+, K a multiple of 16): as
 * {@link groupedKernel} (same routing, grid (⌈N / 64⌉, moeTileBound(R, experts), 1), same parameters
 * less `scale`), but each warp computes 16 gathered rows × 64 columns with
 * `mma.sync.aligned.m16n8k16.row.col.f32.<t>.<t>.f32` straight from global memory: x read as f32 pairs
 * and rounded to the weight's type (as matmul.ts mmaKernel), f32 accumulation. 128 threads; x's base
 * must be 8-byte aligned. Fragments: PTX ISA §9.7.13.4.8 (m16n8k16, .f16 / .bf16): A a0..a3 at rows
 * g, g + 8 and columns 2t, 2t + 1 (+8); B b0, b1 at rows 2t, 2t + 1 (+8) of column g; C c0, c1 at row g,
 * c2, c3 at row g + 8, columns 2t, 2t + 1; g = lane / 4, t = lane % 4.
 */
export function groupedMmaKernel(format: "f16" | "bf16"): KernelSource {
  const kb = new KernelBuilder(`matmul_id_grouped_mma_${format}`);
  const p = groupedParams(kb, false);
  const { out, x, w, list, N, K, experts, xDiv } = p;
  const [tid, lane, warp, g, t, y, total, e, row0, cnt, valid, first, n0, r16, k0] = kb.regs("b32", 15);
  const q = kb.reg("pred");
  const end = kb.label("end");
  kb.op(
    ...mmaLaneOps({ tid, lane, warp, g, t }),
    `mov.u32 ${n0}, %ctaid.x;`,
    `mul.lo.u32 ${n0}, ${n0}, ${MOE_TILE.bn};`,
  );
  tileRouting(kb, p, { y, total, e, row0, cnt, valid, first, q, end });
  kb.op(
    // a warp whose 16 rows are all past the tile's end has nothing to do (no barrier in this kernel)
    `shl.b32 ${r16}, ${warp}, 4;`,
    `setp.ge.u32 ${q}, ${r16}, ${valid};`,
    `@${q} bra ${end};`,
  );
  // this lane's rows g and g + 8 of the warp's 16: routed row, x row address, in-range predicate
  const rows = [0, 8].map((d) => {
    const [li, r, xr] = kb.regs("b32", 3);
    const ok = kb.reg("pred");
    kb.op(
      `add.u32 ${li}, ${r16}, ${g};`,
      `add.u32 ${li}, ${li}, ${d};`,
      `setp.lt.u32 ${ok}, ${li}, ${valid};`,
      `add.u32 ${li}, ${li}, ${first};`,
      `mov.u32 ${r}, 0;`,
    );
    const at = kb.addr(list, li, 4);
    kb.op(
      `@${ok} ld.global.u32 ${r}, [${at}];`,
      `div.u32 ${xr}, ${r}, ${xDiv};`,
      `mul.lo.u32 ${xr}, ${xr}, ${K};`,
    );
    const xa = kb.addr(x, xr, 4);
    return { r, ok, xa };
  });
  // columns n0 + 8j + g (j < 8): weight row addresses of expert e (64-bit), in-range predicates
  const rb = kb.reg("b32");
  kb.op(`shl.b32 ${rb}, ${K}, 1;`);
  const cols = Array.from({ length: 8 }, (_, j) => {
    const [c, wr] = kb.regs("b32", 2);
    const ok = kb.reg("pred");
    const wa = kb.reg("b64");
    kb.op(
      `add.u32 ${c}, ${n0}, ${j * 8};`,
      `add.u32 ${c}, ${c}, ${g};`,
      `setp.lt.u32 ${ok}, ${c}, ${N};`,
      `mad.lo.u32 ${wr}, ${e}, ${N}, ${c};`,
      `mul.wide.u32 ${wa}, ${wr}, ${rb};`,
      `add.u64 ${wa}, ${wa}, ${w};`,
    );
    return { ok, wa };
  });
  const acc = kb.regs("f32", 32);
  const invalid = kb.reg("pred");
  const done = kb.label("k_done");
  // the out-of-range bucket: NaN outputs, no products
  kb.op(`setp.ge.u32 ${invalid}, ${e}, ${experts};`);
  for (const a of acc) kb.op(`selp.f32 ${a}, 0f7FC00000, 0f00000000, ${invalid};`);
  kb.op(`mov.u32 ${k0}, 0;`, `@${invalid} bra ${done};`);
  const top = kb.label("k");
  kb.place(top);
  kb.op(`setp.ge.u32 ${q}, ${k0}, ${K};`, `@${q} bra ${done};`);
  const kt = kb.reg("b32");
  kb.op(`mad.lo.u32 ${kt}, ${t}, 2, ${k0};`); // k0 + 2t
  const a = kb.regs("b32", 4);
  [
    [0, 0],
    [1, 0],
    [0, 8],
    [1, 8],
  ].forEach(([ri, dk], idx) => {
    const row = rows[ri as number] as { ok: string; xa: string };
    const kk = kb.reg("b32");
    const [lo, hi] = kb.regs("f32", 2);
    kb.op(`add.u32 ${kk}, ${kt}, ${dk};`, `mov.f32 ${lo}, 0f00000000;`, `mov.f32 ${hi}, 0f00000000;`);
    const at = kb.addr(row.xa, kk, 4);
    kb.op(
      `@${row.ok} ld.global.v2.f32 {${lo}, ${hi}}, [${at}];`,
      `cvt.rn.${format}x2.f32 ${a[idx]}, ${hi}, ${lo};`,
    );
  });
  cols.forEach((col, j) => {
    const b = kb.regs("b32", 2);
    [0, 8].forEach((dk, bi) => {
      const kk = kb.reg("b32");
      kb.op(`add.u32 ${kk}, ${kt}, ${dk};`, `mov.b32 ${b[bi]}, 0;`);
      const at = kb.addr(col.wa, kk, 2);
      kb.op(`@${col.ok} ld.global.b32 ${b[bi]}, [${at}];`);
    });
    const c = acc.slice(j * 4, j * 4 + 4);
    kb.op(
      `mma.sync.aligned.m16n8k16.row.col.f32.${format}.${format}.f32 {${c.join(", ")}}, {${a.join(", ")}}, {${b.join(", ")}}, {${c.join(", ")}};`,
    );
  });
  kb.op(`add.u32 ${k0}, ${k0}, 16;`, `bra ${top};`);
  kb.place(done);
  // C fragments: c0, c1 at row g, c2, c3 at row g + 8; columns n0 + 8j + 2t (+1)
  for (let j = 0; j < 8; j++) {
    for (let i = 0; i < 4; i++) {
      const row = rows[i >> 1] as { r: string; ok: string };
      const [n, oi] = kb.regs("b32", 2);
      const ok = kb.reg("pred");
      kb.op(
        `mad.lo.u32 ${n}, ${t}, 2, ${n0};`,
        `add.u32 ${n}, ${n}, ${j * 8 + (i & 1)};`,
        `setp.lt.and.u32 ${ok}, ${n}, ${N}, ${row.ok};`,
        `mad.lo.u32 ${oi}, ${row.r}, ${N}, ${n};`,
      );
      const at = kb.addr(out, oi, 4);
      kb.op(`@${ok} st.global.f32 [${at}], ${acc[j * 4 + i]};`);
    }
  }
  kb.place(end);
  return kb.build([MOE_MMA_WARPS * 32, 1], 80);
}
