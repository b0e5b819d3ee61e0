// torch-compatible noise against torch's own output: ../shared/testdata/krea2-tiny/randn/default/ (torch
// CPU with ATEN_CPU_CAPABILITY=default: the scalar kernel with glibc logf/cosf/sinf) and, when present,
// ../shared/testdata/tensorpencil/randn_*.bin (torch on an AVX2 x86-64 machine, the path ComfyUI takes on
// PCs). Every value is compared bit for bit (0 ulp): no tolerance.
import { describe, expect, test } from "bun:test";
import { existsSync, readdirSync } from "node:fs";
import { join, resolve } from "node:path";
import { CpuBackend } from "@tp/backend-cpu";
import { isTpError } from "@tp/tensor";
import { fmaf, glibcCosf, glibcLogf, glibcSinf, Mt19937, rand, randn, randnTensor } from "./noise.ts";
import { readF32 } from "./testing/fixtures.ts";

// <repo root>/../shared; this file is packages/diffusion/src/, three levels below the root.
const SHARED = resolve(import.meta.dir, "../../..", "../shared");
const DEFAULT_DIR = join(SHARED, "testdata/krea2-tiny/randn/default");
const TP_DIR = join(SHARED, "testdata/tensorpencil");
const skipDefault = !existsSync(DEFAULT_DIR);
const skipTp = !existsSync(join(TP_DIR, "randn_42_1024.bin"));
const noteDefault = skipDefault ? ` [skipped: shared fixture missing: ${DEFAULT_DIR}]` : "";
const noteTp = skipTp ? ` [skipped: shared fixture missing: ${TP_DIR}/randn_*.bin]` : "";

/** Number of elements whose f32 bit patterns differ. */
function bitMismatches(a: Float32Array, b: Float32Array): number {
  expect(a.length).toBe(b.length);
  const ua = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const ub = new Uint32Array(b.buffer, b.byteOffset, b.length);
  let n = 0;
  for (let i = 0; i < ua.length; i++) if (ua[i] !== ub[i]) n++;
  return n;
}

describe("Mt19937", () => {
  test("matches the reference mt19937 (seed 5489: 10000th output 4123659995, C++11 [rand.predef])", () => {
    const g = new Mt19937(5489);
    let v = 0;
    for (let i = 0; i < 10000; i++) v = g.nextU32();
    expect(v).toBe(4123659995);
  });
  test("only the low 32 bits of a 64-bit seed are used", () => {
    const a = new Mt19937(252469767172722n);
    const b = new Mt19937(Number(252469767172722n & 0xffffffffn));
    for (let i = 0; i < 700; i++) expect(a.nextU32()).toBe(b.nextU32());
  });
});

describe("fmaf", () => {
  test("single rounding where a·b + c in f64 would round twice", () => {
    // a·b = 1 + 2^-24 + 2^-48 exactly; + 0 → nearest f32 is 1 + 2^-23 (above the halfway point 1 + 2^-24).
    const a = Math.fround(1 + 2 ** -24 * 0 + 2 ** -23);
    expect(fmaf(1, 1, 0)).toBe(1);
    expect(fmaf(a, 1, -1)).toBe(2 ** -23);
    const x = 1 + 2 ** -12;
    const y = 1 + 2 ** -12; // x·y = 1 + 2^-11 + 2^-24 exactly: halfway in f32 → ties to even without the 2^-24 c
    expect(fmaf(x, y, 2 ** -40)).toBe(Math.fround(1 + 2 ** -11 + 2 ** -23));
    expect(fmaf(x, y, 0)).toBe(Math.fround(1 + 2 ** -11));
  });
});

describe(`torch.randn, scalar kernel (ATEN_CPU_CAPABILITY=default)${noteDefault}`, () => {
  const files = skipDefault ? [] : readdirSync(DEFAULT_DIR).filter((f) => /^seed\d+_[\dx]+\.bin$/.test(f));
  test.skipIf(skipDefault)("every randn/default file is reproduced bit for bit", () => {
    expect(files.length).toBeGreaterThanOrEqual(4);
    for (const f of files) {
      const m = /^seed(\d+)_([\dx]+)\.bin$/.exec(f) as RegExpExecArray;
      const shape = (m[2] as string).split("x").map(Number);
      const ref = readF32(join(DEFAULT_DIR, f));
      const ours = randn(Number(m[1]), shape, { capability: "default" });
      expect(`${f}: ${bitMismatches(ours, ref)} mismatches`).toBe(`${f}: 0 mismatches`);
    }
  });
  test.skipIf(skipDefault)("torch.rand(32) after manual_seed(0)", () => {
    expect(bitMismatches(rand(0, 32), readF32(join(DEFAULT_DIR, "rand_seed0_32.bin")))).toBe(0);
  });
  test.skipIf(skipDefault)("correctly rounded logf/cosf/sinf would not do (why glibc's are ported)", () => {
    const ref = readF32(join(DEFAULT_DIR, "seed42_1x16x12x16.bin"));
    const avx = randn(42, [1, 16, 12, 16], { capability: "avx2" });
    expect(bitMismatches(avx, ref)).toBeGreaterThan(0); // the two torch kernels really differ
  });
});

describe(`torch.randn, AVX2 kernel (TensorPencil fixtures)${noteTp}`, () => {
  const cases: [string, number, number[]][] = [
    ["randn_42_1024.bin", 42, [1, 16, 8, 8]],
    ["randn_7_40.bin", 7, [40]],
    ["randn_12345_1000.bin", 12345, [1000]],
    ["randn_80085_full.bin", 80085, [1, 16, 210, 140]],
    ["vae_z_8x8.bin", 7, [1, 16, 1, 8, 8]],
    ["dit_x.bin", 11, [1, 16, 16, 16]],
  ];
  for (const [file, seed, shape] of cases) {
    test.skipIf(skipTp)(`${file} (seed ${seed}, [${shape.join(", ")}]) bit for bit`, () => {
      const ours = randn(seed, shape); // "avx2" is the default
      expect(bitMismatches(ours, readF32(join(TP_DIR, file)))).toBe(0);
    });
  }
});

describe("glibc float libm ports", () => {
  test("exact special values", () => {
    expect(glibcLogf(1)).toBe(0);
    expect(glibcLogf(0)).toBe(Number.NEGATIVE_INFINITY);
    expect(glibcLogf(-1)).toBeNaN();
    expect(glibcSinf(0)).toBe(0);
    expect(glibcCosf(0)).toBe(1);
    expect(glibcLogf(2 ** -140)).toBe(Math.fround(-140 * Math.LN2));
  });
  test("within 1 ulp of the true value over Box–Muller's ranges", () => {
    const ulp = (v: number) => {
      const f = Math.abs(Math.fround(v));
      return f === 0 ? 2 ** -149 : Math.fround(f * (1 + 2 ** -23)) - f;
    };
    for (let i = 1; i < 4096; i++) {
      const u = Math.fround(i / 4096);
      const th = Math.fround(2 * Math.PI * u);
      expect(Math.abs(glibcLogf(u) - Math.log(u))).toBeLessThanOrEqual(ulp(Math.log(u)));
      expect(Math.abs(glibcSinf(th) - Math.sin(th))).toBeLessThanOrEqual(ulp(Math.sin(th)) + 2 ** -149);
      expect(Math.abs(glibcCosf(th) - Math.cos(th))).toBeLessThanOrEqual(ulp(Math.cos(th)) + 2 ** -149);
    }
  });
});

describe("randn API", () => {
  test("tails: n mod 16 ≠ 0 redraws the last 16; n < 16 uses the double path", () => {
    const a = randn(3, [40], { capability: "default" });
    const b = randn(3, [32], { capability: "default" });
    expect(Array.from(a.subarray(0, 24))).toEqual(Array.from(b.subarray(0, 24)));
    expect(a[24]).not.toBe(b[24]);
    const small = randn(3, [5]);
    expect(small.length).toBe(5);
    for (const v of small) expect(Number.isFinite(v)).toBe(true);
    expect(randn(3, [0]).length).toBe(0);
  });
  test("bad seeds and shapes are E_ARG", () => {
    for (const f of [
      () => randn(-1, [16]),
      () => randn(1.5, [16]),
      () => randn(1, [-2]),
      () => randn(2n ** 64n, [4]),
    ]) {
      let code = "";
      try {
        f();
      } catch (e) {
        if (isTpError(e)) code = e.code;
      }
      expect(code).toBe("E_ARG");
    }
  });
  test("randnTensor uploads the same values", async () => {
    const b = new CpuBackend({ threads: 1 });
    const t = randnTensor(b, 42, [1, 16, 1, 2, 3]);
    expect(t.shape).toEqual([1, 16, 1, 2, 3]);
    expect(Array.from((await b.read(t)) as Float32Array)).toEqual(Array.from(randn(42, [1, 16, 1, 2, 3])));
    b.dispose();
  });
});
