/**
 * The native weight quantizers of the cpu backend (`quantizeRows`, native/cpu/quantize_w*.c) against
 * @tp/quant's TypeScript references, bit for bit — stored bytes and f32 scale bits — at every ISA
 * level this CPU has, on 1 and 3 threads, from bf16, f16 and f32 sources:
 *
 * - int8 / int4 ConvRot vs `quantizeConvRot` (groups 256, 64, 16);
 * - fp8 e4m3fn scaled vs `quantizeFp8Scaled`;
 * - GGUF Q8_0, Q4_0, Q4_K, Q6_K vs `quantizeGgml`.
 *
 * The rows mix what breaks quantizers: Gaussian weights, magnitudes from 2^-140 to 2^120 (f32
 * subnormals, values whose squares overflow), all-zero rows, one huge value among small ones,
 * subnormal-only rows, NaN, ±inf, values on a coarse grid (ties of every rounding), and for ConvRot
 * rows whose rotation is exactly k + 0.5 (round half to even decides every code). The references are
 * the oracle: nothing here is computed by the code under test.
 *
 * Also: @tp/quant's `quantizer` injection point — `quantizeCheckpoint` and `openQuantCache` with the
 * native quantizer write the same bytes as with the reference, and a cache built by one is a hit for
 * the other. It lives here for the reason given in cpu-kernels.test.ts (@tp/backend-cpu must not
 * depend on @tp/quant, not even as a devDependency).
 */
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  CPU_ISA,
  type CpuIsa,
  createNativeQuantizer,
  loadCpuLibrary,
  type NativeContext,
  type NativeQuantizeFormat,
  quantizeRows,
} from "@tp/backend-cpu";
import { SafetensorsWriter } from "@tp/formats";
import {
  type FloatBytes,
  hadamardMatrix,
  openQuantCache,
  quantizeCheckpoint,
  quantizeConvRot,
  quantizeFp8Scaled,
  quantizeGgml,
  referenceQuantizer,
} from "@tp/quant";
import { f32ToBf16, f32ToF16, TpError } from "@tp/tensor";

const lib = loadCpuLibrary();
const BEST = lib.createContext(1).isa;
const ISAS = (Object.keys(CPU_ISA) as CpuIsa[]).filter((i) => CPU_ISA[i] <= CPU_ISA[BEST]);
const THREADS = [1, 3];
const contexts: NativeContext[] = [];
afterAll(() => {
  for (const c of contexts) c.destroy();
});
function context(isa: CpuIsa, threads: number): NativeContext {
  const c = lib.createContext(threads, isa);
  contexts.push(c);
  return c;
}

/** xorshift32 in [0, 1), deterministic per seed. */
function uniform(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return (s >>> 0) / 4294967296;
  };
}

type Dtype = FloatBytes["dtype"];
const DTYPES: Dtype[] = ["bf16", "f16", "f32"];

/** Row kinds: each row of a test matrix is one of these (row r is kind r mod ROW_KINDS). */
const ROW_KINDS = [
  "gaussian",
  "log-uniform 2^-140..2^120",
  "all zero",
  "one huge value",
  "subnormal only",
  "NaN",
  "±inf",
  "grid (ties)",
] as const;

/** f32 values of one row of `kind` (before rounding to the source dtype). */
function rowValues(kind: (typeof ROW_KINDS)[number], k: number, rnd: () => number): Float32Array {
  const v = new Float32Array(k);
  const gauss = () => (rnd() + rnd() + rnd() + rnd() - 2) * 0.05;
  for (let i = 0; i < k; i++) {
    switch (kind) {
      case "gaussian":
        v[i] = gauss();
        break;
      case "log-uniform 2^-140..2^120":
        v[i] = (rnd() < 0.5 ? -1 : 1) * 2 ** (-140 + 260 * rnd());
        break;
      case "all zero":
        v[i] = rnd() < 0.5 ? 0 : -0;
        break;
      case "one huge value":
        v[i] = gauss();
        break;
      case "subnormal only":
        v[i] = (rnd() < 0.5 ? -1 : 1) * Math.floor(rnd() * 200) * 2 ** -149;
        break;
      case "NaN":
      case "±inf":
        v[i] = gauss();
        break;
      case "grid (ties)":
        v[i] = (Math.floor(rnd() * 33) - 16) * 0.25 + (rnd() < 0.3 ? 0.125 : 0);
        break;
    }
  }
  const at = Math.floor(rnd() * k);
  if (kind === "one huge value") v[at] = (rnd() < 0.5 ? -1 : 1) * 3.3e38;
  if (kind === "NaN") v[at] = Number.NaN;
  if (kind === "±inf") {
    v[at] = Number.POSITIVE_INFINITY;
    v[(at + k / 2) % k] = Number.NEGATIVE_INFINITY;
  }
  return v;
}

/** Encode f32 values as raw little-endian bytes of `dtype`. */
function encode(v: Float32Array, dtype: Dtype): Uint8Array {
  if (dtype === "f32") return new Uint8Array(v.slice().buffer);
  const h = new Uint16Array(v.length);
  for (let i = 0; i < v.length; i++)
    h[i] = dtype === "bf16" ? f32ToBf16(v[i] as number) : f32ToF16(v[i] as number);
  return new Uint8Array(h.buffer);
}

/** Whether encoded `bytes` of `dtype` hold a NaN or ±∞ (an all-ones exponent). */
function holdsNonFinite(bytes: Uint8Array, dtype: Dtype): boolean {
  if (dtype === "f32") {
    const u = new Uint32Array(bytes.slice().buffer);
    return u.some((b) => (b & 0x7f800000) === 0x7f800000);
  }
  const mask = dtype === "bf16" ? 0x7f80 : 0x7c00;
  return new Uint16Array(bytes.slice().buffer).some((h) => (h & mask) === mask);
}

/**
 * Whether rows of `kind` stay finite in `dtype` (NaN and ±∞ never do; f16 rounds the huge values of
 * 'log-uniform' and 'one huge value' to ±∞). Weight quantizers refuse non-finite input (E_NUMERIC,
 * ARCHITECTURE.md §Errors), so only finite rows are compared bit for bit.
 */
function kindFiniteIn(kind: (typeof ROW_KINDS)[number], dtype: Dtype): boolean {
  return !holdsNonFinite(encode(rowValues(kind, 1024, uniform(3)), dtype), dtype);
}

/** An [n, k] matrix whose row r is of kind `kinds[r % kinds.length]`, in `dtype`. */
function matrix(
  n: number,
  k: number,
  dtype: Dtype,
  seed: number,
  kinds: readonly (typeof ROW_KINDS)[number][] = ROW_KINDS,
): Uint8Array {
  const rnd = uniform(seed);
  const all = new Float32Array(n * k);
  for (let r = 0; r < n; r++)
    all.set(rowValues(kinds[r % kinds.length] as (typeof ROW_KINDS)[number], k, rnd), r * k);
  return encode(all, dtype);
}

/**
 * f32 rows whose ConvRot rotation (group g) is exactly `t`: half-integers in (−qmax, qmax) with one
 * value ±qmax per row, so the scale is exactly 1 and every code is decided by round half to even.
 * w = t · H is exact in f32 (sums of ±t/√g with t on a 1/2 grid and |t| < 128).
 */
function tieRows(n: number, k: number, g: number, qmax: number, seed: number): Uint8Array {
  const rnd = uniform(seed);
  const h = hadamardMatrix(g);
  const w = new Float32Array(n * k);
  for (let r = 0; r < n; r++) {
    const t = new Float64Array(k);
    // 70 % halves (ties), 30 % integers, all inside (−qmax, qmax)
    for (let i = 0; i < k; i++)
      t[i] = Math.floor(rnd() * (2 * qmax - 1)) - (qmax - 1) + (rnd() < 0.7 ? 0.5 : 0);
    t[Math.floor(rnd() * k)] = rnd() < 0.5 ? qmax : -qmax;
    for (let off = 0; off < k; off += g) {
      for (let i = 0; i < g; i++) {
        let s = 0;
        for (let j = 0; j < g; j++) s += (t[off + j] as number) * (h[j * g + i] as number);
        w[r * k + off + i] = s;
      }
    }
  }
  return new Uint8Array(w.buffer);
}

/** Bit-level equality of two views (f32 scales compared as bits, so NaN payloads count). */
function sameBytes(a: ArrayBufferView, b: ArrayBufferView): boolean {
  return Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(
    Buffer.from(b.buffer, b.byteOffset, b.byteLength),
  );
}

/** Index of the first differing byte, for messages. */
function firstDiff(a: Uint8Array, b: Uint8Array): number {
  for (let i = 0; i < Math.min(a.length, b.length); i++) if (a[i] !== b[i]) return i;
  return a.length === b.length ? -1 : Math.min(a.length, b.length);
}

/** The reference's result (or its error code) for a target format. */
function reference(
  format: NativeQuantizeFormat,
  input: FloatBytes,
  n: number,
  k: number,
  groupSize: number,
): { data: Uint8Array; scale: Float32Array } | { error: string } {
  try {
    if (format === "int8_convrot" || format === "int4_convrot") {
      const q = quantizeConvRot(input, [n, k], { format, groupSize });
      return { data: q.data, scale: q.scale };
    }
    if (format === "fp8_scaled") {
      const q = quantizeFp8Scaled(input, n * k);
      return { data: q.data, scale: new Float32Array([q.scale]) };
    }
    return { data: quantizeGgml(format, input, n * k), scale: new Float32Array(0) };
  } catch (e) {
    if (e instanceof TpError) return { error: e.code };
    throw e;
  }
}

/** Native result or its error code. */
function native(
  ctx: NativeContext,
  format: NativeQuantizeFormat,
  input: FloatBytes,
  n: number,
  k: number,
  groupSize: number,
): { data: Uint8Array; scale: Float32Array } | { error: string } {
  try {
    const q = quantizeRows(ctx, format, input, [n, k], { groupSize });
    return { data: q.data, scale: q.scale };
  } catch (e) {
    if (e instanceof TpError) return { error: e.code };
    throw e;
  }
}

function expectSame(got: ReturnType<typeof native>, want: ReturnType<typeof reference>, what: string): void {
  if ("error" in want || "error" in got) {
    expect(`${what}: ${"error" in got ? got.error : "ok"}`).toBe(
      `${what}: ${"error" in want ? want.error : "ok"}`,
    );
    return;
  }
  expect(`${what}: first differing byte ${firstDiff(got.data, want.data)}`).toBe(
    `${what}: first differing byte -1`,
  );
  expect(
    `${what}: scales ${sameBytes(got.scale, want.scale) ? "equal" : `differ: ${got.scale} vs ${want.scale}`}`,
  ).toBe(`${what}: scales equal`);
}

// Reference results are computed once per input and compared at every level and thread count.
describe("native weight quantizers, bit for bit against @tp/quant", () => {
  const cases: { format: NativeQuantizeFormat; k: number; group: number }[] = [
    { format: "int8_convrot", k: 512, group: 256 },
    { format: "int8_convrot", k: 192, group: 64 },
    { format: "int8_convrot", k: 48, group: 16 },
    { format: "int4_convrot", k: 512, group: 256 },
    { format: "int4_convrot", k: 128, group: 64 },
    { format: "q8_0", k: 256, group: 0 },
    { format: "q4_0", k: 256, group: 0 },
    { format: "q4_k", k: 512, group: 0 },
    { format: "q6_k", k: 512, group: 0 },
  ];
  for (const { format, k, group } of cases) {
    for (const dtype of DTYPES) {
      const kinds = ROW_KINDS.filter((kind) => kindFiniteIn(kind, dtype));
      const N = 2 * kinds.length; // every finite kind twice
      test(`${format}${group ? ` group ${group}` : ""} from ${dtype}, [${N}, ${k}], every finite row kind`, () => {
        const input = { bytes: matrix(N, k, dtype, 1000 + k + group, kinds), dtype };
        const want = reference(format, input, N, k, group);
        expect("error" in want ? want.error : "ok").toBe("ok");
        for (const isa of ISAS) {
          for (const threads of THREADS) {
            expectSame(
              native(context(isa, threads), format, input, N, k, group),
              want,
              `${isa} × ${threads}`,
            );
          }
        }
      });
    }
  }

  test("non-finite rows (NaN, ±∞) are E_NUMERIC in every reference weight quantizer, each source dtype", () => {
    for (const { format, k, group } of cases) {
      for (const dtype of DTYPES) {
        for (const kind of ["NaN", "±inf"] as const) {
          const input = { bytes: matrix(4, k, dtype, 5, ["gaussian", kind]), dtype };
          const want = reference(format, input, 4, k, group);
          expect(`${format} ${dtype} ${kind}: ${"error" in want ? want.error : "ok"}`).toBe(
            `${format} ${dtype} ${kind}: E_NUMERIC`,
          );
        }
      }
    }
  });

  for (const [format, qmax] of [
    ["int8_convrot", 127],
    ["int4_convrot", 7],
  ] as const) {
    for (const g of [256, 64, 16]) {
      test(`${format} group ${g}: rotations exactly on k + 1/2 (round half to even decides every code)`, () => {
        const k = 4 * g;
        const input = { bytes: tieRows(6, k, g, qmax, g + qmax), dtype: "f32" as const };
        const want = reference(format, input, 6, k, g);
        if ("error" in want) throw new Error(want.error);
        expect(Array.from(want.scale)).toEqual([1, 1, 1, 1, 1, 1]); // the construction holds
        for (const isa of ISAS) expectSame(native(context(isa, 3), format, input, 6, k, g), want, isa);
      });
    }
  }

  // fp8 has one scale per tensor: one matrix per row kind (a NaN anywhere is an error in both).
  for (const kind of ROW_KINDS) {
    for (const dtype of DTYPES) {
      test(`fp8_scaled from ${dtype}, [8, 1000], rows of kind '${kind}' (+ gaussian rows)`, () => {
        const input = { bytes: matrix(8, 1000, dtype, 77, [kind, "gaussian"]), dtype };
        const want = reference("fp8_scaled", input, 8, 1000, 0);
        if (!kindFiniteIn(kind, dtype)) {
          // Refused as damaged input by the reference; the native quantizer refuses it too.
          expect("error" in want ? want.error : "ok").toBe("E_NUMERIC");
          const got = native(context(BEST, 3), "fp8_scaled", input, 8, 1000, 0);
          expect("error" in got ? "an error" : "ok").toBe("an error");
          return;
        }
        for (const isa of ISAS) {
          for (const threads of THREADS) {
            expectSame(
              native(context(isa, threads), "fp8_scaled", input, 8, 1000, 0),
              want,
              `${isa} × ${threads}`,
            );
          }
        }
      });
    }
  }

  test("fp8_scaled: all-zero tensor → scale 1, zero codes; subnormal-only tensor → E_ARG in both", () => {
    for (const kind of ["all zero", "subnormal only"] as const) {
      const input = { bytes: matrix(4, 1000, "f32", 5, [kind]), dtype: "f32" as const };
      const want = reference("fp8_scaled", input, 4, 1000, 0);
      expect("error" in want ? want.error : Array.from(want.scale)).toEqual(
        kind === "all zero" ? [1] : "E_ARG",
      );
      for (const isa of ISAS) expectSame(native(context(isa, 3), "fp8_scaled", input, 4, 1000, 0), want, isa);
    }
  });

  test("a larger tensor split over many tasks gives the reference's bytes (bf16 [300, 1024], every format)", () => {
    const input = { bytes: matrix(300, 1024, "bf16", 9, ["gaussian"]), dtype: "bf16" as const };
    for (const format of [
      "int8_convrot",
      "int4_convrot",
      "fp8_scaled",
      "q8_0",
      "q4_0",
      "q4_k",
      "q6_k",
    ] as const) {
      const g = format.endsWith("convrot") ? 256 : 0;
      const want = reference(format, input, 300, 1024, g);
      expectSame(native(context(BEST, 3), format, input, 300, 1024, g), want, format);
    }
  });
});

describe("@tp/quant quantizer injection", () => {
  const dir = mkdtempSync(join(tmpdir(), "tp-quantize-kernels-"));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const src = join(dir, "set_bf16.safetensors");
  const shapes: [string, number, number][] = [
    ["a.weight", 64, 512],
    ["b.weight", 33, 256],
    ["c.weight", 16, 1024],
  ];
  const w = new SafetensorsWriter(
    src,
    shapes.map(([name, n, k]) => ({ name, dtype: "BF16", shape: [n, k] })),
  );
  for (const [i, [name, n, k]] of shapes.entries()) {
    w.write(name, matrix(n, k, "bf16", 40 + i, ["gaussian", "grid (ties)"]));
  }
  w.commit();

  for (const format of ["int8_convrot", "int4_convrot", "fp8_scaled"] as const) {
    test(`quantizeCheckpoint ${format}: native and reference quantizers write identical files`, () => {
      const nativeQ = createNativeQuantizer({ threads: 3 });
      try {
        const a = join(dir, `${format}-native.safetensors`);
        const b = join(dir, `${format}-ref.safetensors`);
        quantizeCheckpoint(src, a, { format, layers: ["*"], quantizer: nativeQ });
        quantizeCheckpoint(src, b, { format, layers: ["*"], quantizer: referenceQuantizer });
        expect(readFileSync(a).equals(readFileSync(b))).toBe(true);
      } finally {
        nativeQ.dispose();
      }
    });
  }

  test("openQuantCache: a cache built natively is a hit for the reference quantizer, and maps the same bytes", () => {
    const nativeQ = createNativeQuantizer({ threads: 2 });
    try {
      const opts = { format: "int4_convrot" as const, layers: ["*"], progress: null, cacheDir: dir };
      const built = openQuantCache(src, { ...opts, quantizer: nativeQ });
      expect(built.status).toBe("built");
      const bytes = readFileSync(built.path);
      built.source.close();
      const hit = openQuantCache(src, { ...opts, quantizer: referenceQuantizer });
      expect(hit.status).toBe("hit");
      hit.source.close();
      rmSync(hit.path);
      const rebuilt = openQuantCache(src, { ...opts, quantizer: referenceQuantizer });
      expect(rebuilt.status).toBe("built");
      expect(readFileSync(rebuilt.path).equals(bytes)).toBe(true);
      rebuilt.source.close();
    } finally {
      nativeQ.dispose();
    }
  });
});
