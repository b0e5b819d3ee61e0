/**
 * matmul on repacked Q8_0 / Q4_0 weights (native/cpu/matmul_repack_avx512vnni.c, opt-in with
 * TP_CPU_REPACK=1) against the unpacked kernels of the same context: the same Q8_0 activations and
 * exact int32 block sums, so only the f32 order of the per-block sums differs ({@link REPACK_NMSE}).
 * Also: the repacked copy is counted in backend.memory and freed with the backend, and the native
 * checks (sizes, level). Skips below the AVX-512 VNNI level.
 */
import { afterAll, describe, expect, test } from "bun:test";
import { CPU_FEATURES, createBackend, loadCpuLibrary, type NativeWeightFormat } from "@tp/backend-cpu";
import { Weight } from "@tp/tensor";
import { gaussian } from "./data.ts";

/** Relative f32 rounding of block sums added in another order (per output ~1e-7; NMSE ~1e-14 seen). */
const REPACK_NMSE = 1e-10;

const lib = loadCpuLibrary();
const ctx = lib.createContext(2);
const vnni = ctx.isa === "avx512" && (lib.features() & CPU_FEATURES.avx512vnni) !== 0;
afterAll(() => ctx.destroy());

/** Well-formed random blocks: f16 scales around 2^-8, random codes. */
function weightBytes(format: NativeWeightFormat, n: number, k: number, seed: number): Uint8Array {
  const bb = format === "q8_0" ? 34 : 18;
  const out = new Uint8Array((n * k * bb) / 32);
  let s = seed >>> 0;
  for (let i = 0; i < out.length; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out[i] = s >>> 24;
  }
  for (let o = 0; o < out.length; o += bb) out[o + 1] = 0x1c;
  return out;
}

function nmse(a: Float32Array, b: Float32Array): number {
  let num = 0;
  let den = 0;
  for (let i = 0; i < a.length; i++) {
    num += ((a[i] as number) - (b[i] as number)) ** 2;
    den += (b[i] as number) ** 2;
  }
  return den === 0 ? num : num / den;
}

describe.skipIf(!vnni)(
  `repacked Q8_0 / Q4_0 matmul (AVX-512 VNNI)${vnni ? "" : " [skipped: this CPU has no AVX-512 VNNI, the only ISA with a repacked kernel]"}`,
  () => {
    test("equals the unpacked kernels: M 1..5, 17, 64; N 1, 17, 40; K 32, 256, 1024; bias", async () => {
      const prev = process.env.TP_CPU_REPACK;
      process.env.TP_CPU_REPACK = "1";
      const b = createBackend({ threads: 2 });
      try {
        let seed = 1;
        for (const format of ["q8_0", "q4_0"] as const)
          for (const k of [32, 256, 1024])
            for (const n of [1, 17, 40])
              for (const m of [1, 2, 3, 4, 5, 17, 64]) {
                const data = weightBytes(format, n, k, seed++);
                const w = new Weight({ format, shape: [n, k], data, name: "w" } as never);
                const x = gaussian(seed++, m * k);
                const biasData = gaussian(seed++, n);
                const want = new Float32Array(m * n);
                ctx.matmul(x, m, { format, n, k, data, scale: null, group: 0 }, biasData, want);
                const xt = b.upload(x, [m, k], "f32");
                const bt = b.upload(biasData, [n], "f32");
                const before = b.memory.current;
                const y = b.matmul(xt, w, { bias: bt });
                const got = (await b.read(y)) as Float32Array;
                // the copy stays (counted) besides the output: ceil(n / 16) groups of k / 32 records
                const rec = format === "q8_0" ? 544 : 288;
                const copy = Math.ceil(n / 16) * (k / 32) * rec;
                expect(b.memory.current - before - y.byteLength).toBe(m <= 64 ? copy : 0);
                const e = nmse(got, want);
                if (!(e <= REPACK_NMSE)) throw new Error(`${format} m ${m} n ${n} k ${k}: NMSE ${e}`);
                // a second call reuses the copy
                const again = b.memory.current;
                b.free(b.matmul(xt, w, { bias: bt }));
                expect(b.memory.current).toBe(again);
                for (const t of [y, xt, bt]) b.free(t);
              }
      } finally {
        b.dispose();
        expect(b.memory.current).toBe(0);
        if (prev === undefined) delete process.env.TP_CPU_REPACK;
        else process.env.TP_CPU_REPACK = prev;
      }
    });

    test("native checks: wrong packed size, another format, a context below the level", () => {
      const raw = lib.raw;
      const data = weightBytes("q8_0", 16, 64, 9);
      const packed = new Uint8Array(Number(raw.tp_weight_repack_bytes(11, 16, 64)));
      expect(packed.length).toBe(2 * 544);
      expect(raw.tp_cpu_repack_weight(ctx.handle, 11, data, data.length, 16, 64, packed, packed.length)).toBe(
        0,
      );
      expect(
        raw.tp_cpu_repack_weight(ctx.handle, 11, data, data.length, 16, 64, packed, packed.length - 1),
      ).not.toBe(0);
      expect(ctx.lastError()).toMatch(/out needs 1088 bytes/);
      expect(
        raw.tp_cpu_repack_weight(ctx.handle, 12, data, data.length, 16, 64, packed, packed.length),
      ).not.toBe(0);
      expect(Number(raw.tp_weight_repack_bytes(12, 16, 64))).toBe(-1);
      const x = new Float32Array(64);
      const y = new Float32Array(16);
      expect(
        raw.tp_cpu_matmul_repacked(ctx.handle, x, 1, 64, 11, packed, packed.length - 1, 16, null, y),
      ).not.toBe(0);
      expect(ctx.lastError()).toMatch(/repacked bytes/);
      const avx2 = lib.createContext(1, "avx2");
      expect(raw.tp_cpu_matmul_repacked(avx2.handle, x, 1, 64, 11, packed, packed.length, 16, null, y)).toBe(
        3,
      );
      avx2.destroy();
    });
  },
);
