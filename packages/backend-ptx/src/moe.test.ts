// The grouped matmul_id path (ptx/moe.ts) on the PTX simulator: the three routing kernels against
// hand-derived counts, row starts and tile lists (ids out of range in the extra bucket; a bucket past
// one 64-row tile; more buckets than the scan block has threads), and the grouped GEMM against an f64
// reference of out[r] = x[r or r / S] · W_{ids[r]}ᵀ, with NaN rows for ids outside [0, experts).
// Skips, saying why, where the simulator cannot start.
import { describe, expect, test } from "bun:test";
import { decodeToF32, encodeFromF32, type Tensor, Weight } from "@tp/tensor";
import type { PtxBackend } from "./backend.ts";
import {
  groupedMatmulId,
  MOE_ROUTE_BLOCK,
  moeCountKernel,
  moeScanKernel,
  moeScatterKernel,
  moeTileBound,
} from "./ptx/moe.ts";
import { startSimulator } from "./testing/simulator.ts";

const sim = startSimulator();

test("the threshold: from 64 routed rows and 4 per expert; the tile bound covers every routing", () => {
  expect(groupedMatmulId(63, 8)).toBe(false);
  expect(groupedMatmulId(64, 8)).toBe(true);
  expect(groupedMatmulId(64, 17)).toBe(false);
  expect(groupedMatmulId(512, 128)).toBe(true);
  // Σ ⌈c_b / 64⌉ over buckets: worst cases by hand (all rows in one bucket; one row in each of B)
  expect(moeTileBound(64, 8)).toBe(1 + 9);
  expect(moeTileBound(3, 100)).toBe(1 + 3);
  for (const [rows, experts] of [
    [65, 1],
    [129, 2],
    [1000, 700],
  ] as const) {
    // spread so that every bucket has 64·j + 1 rows where possible: the most tiles per row
    const counts = new Array(experts + 1).fill(0);
    let left = rows;
    for (let b = 0; b <= experts && left > 0; b++) {
      counts[b] = 1;
      left--;
    }
    for (let b = 0; left > 0; b = (b + 1) % (experts + 1)) {
      const add = Math.min(64, left);
      counts[b] += add;
      left -= add;
    }
    const tiles = counts.reduce((s: number, c: number) => s + Math.ceil(c / 64), 0);
    expect(tiles).toBeLessThanOrEqual(moeTileBound(rows, experts));
  }
});

/** Run the routing kernels on `ids` and read back counts, row starts, the tile list and the row lists. */
async function route(b: PtxBackend, ids: number[], experts: number) {
  const R = ids.length;
  const buckets = experts + 1;
  const bound = moeTileBound(R, experts);
  const idt = b.upload(Int32Array.from(ids), [R], "i32");
  const counts = b.alloc([buckets], "u32");
  const cursor = b.alloc([buckets], "u32");
  const rowStart = b.alloc([buckets], "u32");
  const tileExpert = b.alloc([bound], "u32");
  const tileRow = b.alloc([bound], "u32");
  const tiles = b.alloc([1], "u32");
  const list = b.alloc([R], "u32");
  b.fill(counts, 0);
  b.fill(cursor, 0);
  const grid: [number, number, number] = [Math.ceil(R / MOE_ROUTE_BLOCK), 1, 1];
  b.launch(moeCountKernel(), grid, { ids: idt, counts, m: R, experts });
  b.launch(moeScanKernel(), [1, 1, 1], {
    counts,
    row_start: rowStart,
    tile_expert: tileExpert,
    tile_row: tileRow,
    tiles,
    experts,
  });
  b.launch(moeScatterKernel(), grid, { ids: idt, row_start: rowStart, cursor, list, m: R, experts });
  const read = async (t: Tensor) => Array.from((await b.read(t)) as Uint32Array);
  const n = (await read(tiles))[0] as number;
  const starts = await read(rowStart);
  const cnt = await read(counts);
  const rows = await read(list);
  return {
    counts: cnt,
    rowStart: starts,
    tiles: n,
    tileExpert: (await read(tileExpert)).slice(0, n),
    tileRow: (await read(tileRow)).slice(0, n),
    // each bucket's rows, sorted (their order within a bucket follows the atomics)
    lists: cnt.map((c, e) => rows.slice(starts[e], (starts[e] as number) + c).sort((p, q) => p - q)),
  };
}

describe("grouped matmul_id on the simulator", () => {
  if (typeof sim === "string") {
    test.skip(`skipped: the PTX simulator cannot start (${sim})`, () => {});
    return;
  }
  const b = sim;
  test("routing by hand: 7 rows over 4 experts, ids 7 and −1 in the out-of-range bucket", async () => {
    const r = await route(b, [3, 0, 3, 7, -1, 3, 1], 4);
    expect(r.counts).toEqual([1, 1, 0, 3, 2]);
    expect(r.rowStart).toEqual([0, 1, 2, 2, 5]);
    expect(r.tiles).toBe(4);
    expect(r.tileExpert).toEqual([0, 1, 3, 4]);
    expect(r.tileRow).toEqual([0, 0, 0, 0]);
    expect(r.lists).toEqual([[1], [6], [], [0, 2, 5], [3, 4]]);
  });
  test("routing: 1000 rows over 700 experts (3 buckets per scan thread), one expert with 151 rows", async () => {
    const experts = 700;
    const ids = Array.from({ length: 1000 }, (_, r) => (r < 850 ? (r * 37) % experts : 5));
    const r = await route(b, ids, experts);
    const want = new Array(experts + 1).fill(0);
    for (const e of ids) want[e] += 1;
    expect(r.counts).toEqual(want);
    const starts = want.map((_, e) => want.slice(0, e).reduce((s, c) => s + c, 0));
    expect(r.rowStart).toEqual(starts);
    const tileExpert: number[] = [];
    const tileRow: number[] = [];
    want.forEach((c, e) => {
      for (let j = 0; j < c; j += 64) {
        tileExpert.push(e);
        tileRow.push(j);
      }
    });
    expect(want[5]).toBe(151); // three tiles: rows 0, 64, 128 of expert 5
    expect(r.tiles).toBe(tileExpert.length);
    expect(r.tileExpert).toEqual(tileExpert);
    expect(r.tileRow).toEqual(tileRow);
    const lists = want.map((_, e) => ids.flatMap((id, row) => (id === e ? [row] : [])));
    expect(r.lists).toEqual(lists);
  });
  test("the grouped GEMM: f32 experts, x per slot and shared by the slots, NaN rows for bad ids", async () => {
    const [T, S, E, N, K] = [24, 4, 6, 70, 96];
    const R = T * S;
    expect(groupedMatmulId(R, E)).toBe(true);
    let s = 7;
    const rnd = () => {
      s = (Math.imul(s, 1103515245) + 12345) >>> 0;
      return (s / 2 ** 32) * 2 - 1;
    };
    // expert 2 empty, expert 0 takes 70 rows (two tiles), two ids out of range
    const ids = Array.from({ length: R }, (_, r) => (r < 70 ? 0 : ([1, 3, 4, 5][r % 4] as number)));
    ids[17] = 9;
    ids[80] = -3;
    const wf = Float32Array.from({ length: E * N * K }, rnd);
    const f32w = new Weight({
      name: "exps.f32",
      format: "f32",
      shape: [E * N, K],
      data: new Uint8Array(wf.buffer),
    });
    for (const shared of [false, true]) {
      const sx = shared ? 1 : S;
      const xv = Float32Array.from({ length: T * sx * K }, rnd);
      const x = b.upload(xv, [T, sx, K], "f32");
      const out = (await b.read(
        b.matmulId(x, f32w, b.upload(Int32Array.from(ids), [T, S], "i32"), { experts: E }),
      )) as Float32Array;
      const bad: string[] = [];
      for (let r = 0; r < R; r++) {
        const e = ids[r] as number;
        const xr = shared ? Math.floor(r / S) : r;
        for (let n = 0; n < N; n++) {
          const got = out[r * N + n] as number;
          if (e < 0 || e >= E) {
            if (!Number.isNaN(got)) bad.push(`row ${r} (id ${e}) col ${n}: ${got}, not NaN`);
            continue;
          }
          let ref = 0;
          for (let k = 0; k < K; k++) ref += (xv[xr * K + k] as number) * (wf[(e * N + n) * K + k] as number);
          if (!(Math.abs(got - ref) <= 1e-5 * (1 + Math.abs(ref))))
            bad.push(`row ${r} col ${n}: ${got} vs ${ref}`);
        }
      }
      expect(bad.slice(0, 5)).toEqual([]);
    }
  });
  test("the grouped mma kernel (f16, bf16): x rounded to the weight type, exact products, f32 sums", async () => {
    const [T, S, E, N, K] = [20, 4, 5, 72, 48];
    const R = T * S;
    let s = 11;
    const rnd = () => {
      s = (Math.imul(s, 1103515245) + 12345) >>> 0;
      return (s / 2 ** 32) * 2 - 1;
    };
    // expert 1 empty, expert 3 takes 66 rows (a tile of 64 and one of 2: warps past the rows idle)
    const ids = Array.from({ length: R }, (_, r) => (r < 66 ? 3 : ([0, 2, 4][r % 3] as number)));
    ids[5] = 5; // out of range: a NaN row
    const xv = Float32Array.from({ length: R * K }, rnd);
    for (const format of ["f16", "bf16"] as const) {
      const wv = Float32Array.from({ length: E * N * K }, rnd);
      const codes = encodeFromF32(wv, format);
      const wq = decodeToF32(codes, format, wv.length);
      const xq = decodeToF32(encodeFromF32(xv, format), format, xv.length);
      const w = new Weight({ name: `exps.${format}`, format, shape: [E * N, K], data: codes });
      const x = b.upload(xv, [T, S, K], "f32");
      const out = (await b.read(
        b.matmulId(x, w, b.upload(Int32Array.from(ids), [T, S], "i32"), { experts: E }),
      )) as Float32Array;
      const bad: string[] = [];
      for (let r = 0; r < R; r++) {
        const e = ids[r] as number;
        for (let n = 0; n < N; n++) {
          const got = out[r * N + n] as number;
          if (e >= E) {
            if (!Number.isNaN(got)) bad.push(`row ${r} col ${n}: ${got}, not NaN`);
            continue;
          }
          let ref = 0;
          for (let k = 0; k < K; k++) ref += (xq[r * K + k] as number) * (wq[(e * N + n) * K + k] as number);
          if (!(Math.abs(got - ref) <= 1e-5 * (1 + Math.abs(ref))))
            bad.push(`${format} row ${r} col ${n}: ${got} vs ${ref}`);
        }
      }
      expect(bad.slice(0, 5)).toEqual([]);
    }
  });
});
