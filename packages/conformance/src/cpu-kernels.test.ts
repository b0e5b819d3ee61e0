/**
 * matmul, embedding (get_rows), native dequantization and the activation quantizers of the cpu
 * backend, at every ISA level this CPU has (scalar, AVX2, AVX-512 — with VNNI / BF16 kernels where the
 * CPU has them), against the TypeScript references of @tp/quant. It lives here, beside the conformance
 * suite, because a workspace devDependency on @tp/quant would stop other projects from adding
 * @tp/backend-cpu by path (bun resolves a path dependency's devDependencies too):
 *
 * - ConvRot matmul: bit for bit against convRotLinear (exact int32 products, same rescale).
 * - GGUF matmul: against ggml's integer block dot products, recomputed in f64 from the same quantized
 *   activations (which are themselves checked bit for bit against quantizeGgml); NMSE below
 *   {@link GGML_NMSE}. Also, loosely, against the f32 product, so the activation pairing is right.
 * - Float formats: against an f64 product (x rounded to bf16 for bf16 / fp8 weights).
 * - get_rows and the dequantizers: bit for bit against dequantizeGgml / dequantizeFp8 / dequantizeConvRot.
 * Shapes: M = 1 (GEMV), small odd M, M ≥ 16 (the packed GEMM of the AVX-512 level), odd N, several K
 * (odd K for the plain formats, K past one cache block of the GEMM, ConvRot groups 16 and 256).
 */
import { afterAll, describe, expect, test } from "bun:test";
import {
  CPU_FEATURES,
  CPU_ISA,
  type CpuIsa,
  createBackend,
  loadCpuLibrary,
  NATIVE_WEIGHT_FORMATS,
  type NativeContext,
  type NativeWeight,
  type NativeWeightFormat,
} from "@tp/backend-cpu";
import {
  convRotLinear,
  dequantizeConvRot,
  dequantizeFp8,
  dequantizeGgml,
  quantizeActivationsConvRot,
  quantizeActivationsGgml,
  quantizeConvRot,
  quantizeGgml,
} from "@tp/quant";
import { f16ToF32, f32ToBf16, f32ToF16, TpError, Weight, type WeightFormat } from "@tp/tensor";

/**
 * GGUF vs ggml's block dot products in f64 on the same quantized inputs: the kernels sum exact int32
 * block sums scaled in f32, so only f32 rounding of the per-block products and their running sum
 * differs (relative ~1e-7 per output; NMSE ~1e-13 observed).
 */
const GGML_NMSE = 1e-9;
/**
 * GGUF vs the f32 product of the dequantized weight and the unquantized x: the 8-bit activation
 * quantization (per 32 or 256, max-scaled) adds a relative error of ~1 % per element (llm.md §2.6).
 */
const GGML_VS_F32_NMSE = 2e-3;
/** f32 / f16 / bf16 / fp8 vs an f64 product of the same (bf16-rounded where the format says) inputs: f32 sums. */
const FLOAT_NMSE = 1e-10;
/** bf16 / fp8 vs the f64 product with the unrounded x: bf16 rounding of x (relative 2^-9 per element). */
const BF16_ACT_NMSE = 1e-5;

const lib = loadCpuLibrary();
const BEST = lib.createContext(1).isa;
const ISAS = (Object.keys(CPU_ISA) as CpuIsa[]).filter((i) => CPU_ISA[i] <= CPU_ISA[BEST]);
const FEATURES = lib.features();
const contexts = new Map<string, NativeContext>();
function ctxFor(isa: CpuIsa, threads = 2): NativeContext {
  const key = `${isa}/${threads}`;
  let c = contexts.get(key);
  if (c === undefined) {
    c = lib.createContext(threads, isa);
    contexts.set(key, c);
  }
  return c;
}
afterAll(() => {
  for (const c of contexts.values()) c.destroy();
});

/** Deterministic uniform [0, 1) (LCG). */
function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

function nmse(got: Float32Array, ref: Float64Array | Float32Array): number {
  let num = 0;
  let den = 0;
  for (let i = 0; i < ref.length; i++) {
    num += ((got[i] as number) - (ref[i] as number)) ** 2;
    den += (ref[i] as number) ** 2;
  }
  return den === 0 ? num : num / den;
}

/** Index of the first element that is not the same f32 (NaN equals NaN), or -1. */
function firstMismatch(a: Float32Array, b: Float32Array): number {
  if (a.length !== b.length) return 0;
  for (let i = 0; i < a.length; i++) {
    if (!Object.is(a[i], b[i]) && !(Number.isNaN(a[i]) && Number.isNaN(b[i]))) return i;
  }
  return -1;
}

const f16bits = (v: number) => f32ToF16(v);

/** Offsets of the f16 scale fields in a block (d, and dmin / m), for weights made of random bytes. */
const SCALE_FIELDS: Partial<Record<NativeWeightFormat, number[]>> = {
  q4_0: [0],
  q4_1: [0, 2],
  q5_0: [0],
  q5_1: [0, 2],
  q8_0: [0],
  q2_k: [80, 82],
  q3_k: [108],
  q4_k: [0, 2],
  q5_k: [0, 2],
  q6_k: [208],
  iq4_nl: [0],
  iq4_xs: [0],
};

/** A test weight [n, k] in `format`: quantized from random values where @tp/quant can, else random blocks. */
function makeWeight(format: NativeWeightFormat, n: number, k: number, seed: number): NativeWeight {
  const r = rng(seed);
  const values = () => new Float32Array(n * k).map(() => r() * 2 - 1);
  switch (format) {
    case "f32":
      return { format, n, k, data: new Uint8Array(values().buffer), scale: null, group: 0 };
    case "f16":
      return {
        format,
        n,
        k,
        data: new Uint8Array(Uint16Array.from(values(), f16bits).buffer),
        scale: null,
        group: 0,
      };
    case "bf16":
      return {
        format,
        n,
        k,
        data: new Uint8Array(Uint16Array.from(values(), f32ToBf16).buffer),
        scale: null,
        group: 0,
      };
    case "f8_e4m3fn":
    case "f8_e5m2": {
      // random codes without NaN / inf (e4m3fn S.1111.111; e5m2 S.11111.xx)
      const data = Uint8Array.from({ length: n * k }, () => {
        const b = Math.floor(r() * 256);
        return format === "f8_e4m3fn" ? ((b & 0x7f) === 0x7f ? b ^ 1 : b) : (b & 0x7c) === 0x7c ? b ^ 4 : b;
      });
      return { format, n, k, data, scale: seed % 2 ? Float32Array.of(0.0375) : null, group: 0 };
    }
    case "int8_convrot":
    case "int4_convrot": {
      const group = k % 256 === 0 ? 256 : 16;
      const w = quantizeConvRot(values(), [n, k], { format, groupSize: group });
      return { format, n, k, data: w.data, scale: w.scale, group };
    }
    default: {
      if (format === "q8_0" || format === "q4_0" || format === "q4_k" || format === "q6_k") {
        return { format, n, k, data: quantizeGgml(format, values(), n * k), scale: null, group: 0 };
      }
      const block = superBlocks(format) ? 256 : 32;
      const blockBytes = lib.weightRowBytes(format, block);
      const data = Uint8Array.from({ length: n * lib.weightRowBytes(format, k) }, () =>
        Math.floor(r() * 256),
      );
      for (let o = 0; o < data.length; o += blockBytes) {
        for (const f of SCALE_FIELDS[format] as number[]) {
          const h = f16bits((r() * 2 - 1) * 0.02);
          data[o + f] = h & 255;
          data[o + f + 1] = h >> 8;
        }
      }
      return { format, n, k, data, scale: null, group: 0 };
    }
  }
}

/** The weight dequantized to f32 by @tp/quant (fp8 without its scale). */
function referenceWeight(w: NativeWeight): Float32Array {
  if (w.format === "f8_e4m3fn" || w.format === "f8_e5m2") return dequantizeFp8(w.data, w.format);
  if (w.format === "int8_convrot" || w.format === "int4_convrot") {
    return dequantizeConvRot({
      format: w.format,
      shape: [w.n, w.k],
      groupSize: w.group,
      data: w.data,
      scale: w.scale as Float32Array,
    });
  }
  return dequantizeGgml(w.format, w.data, w.n * w.k);
}

const bf16Round = (v: number) => {
  const b = f32ToBf16(v);
  return new Float32Array(new Uint32Array([b << 16]).buffer)[0] as number;
};

/**
 * Reference y [m, n] in f64 with the activation semantics of the format: GGUF — ggml's block dot
 * products of the quantized x (Q8_1's stored f16 sum s for the m term of Q4_1 / Q5_1); bf16 / fp8 —
 * x rounded to bf16; else x as is. Also the plain f64 product with the unquantized x.
 */
function reference(
  w: NativeWeight,
  x: Float32Array,
  m: number,
  bias: Float32Array | null,
): { semantic: Float64Array; plain: Float64Array } {
  const { n, k } = w;
  const wf = referenceWeight(w);
  const scale = w.format.startsWith("f8") && w.scale ? (w.scale[0] as number) : 1;
  const semantic = new Float64Array(m * n);
  const plain = new Float64Array(m * n);
  const ggml = NATIVE_WEIGHT_FORMATS[w.format] >= NATIVE_WEIGHT_FORMATS.q4_0;
  for (let i = 0; i < m; i++) {
    const xi = x.subarray(i * k, (i + 1) * k);
    let xs: Float32Array = xi;
    let q81: { data: Uint8Array } | null = null;
    if (ggml) {
      const a = quantizeActivationsGgml(w.format, xi);
      xs = dequantizeGgml(a.format, a.data, k);
      if (a.format === "q8_1") q81 = a;
    } else if (w.format === "bf16" || w.format.startsWith("f8")) {
      xs = xi.map(bf16Round);
    }
    for (let j = 0; j < n; j++) {
      let s = 0;
      let p = 0;
      for (let t = 0; t < k; t++) {
        const wv = wf[j * k + t] as number;
        s += wv * (xs[t] as number);
        p += wv * (xi[t] as number);
      }
      if (q81) {
        // ggml adds m_w · s_a with the f16 s = d·Σq of the Q8_1 block, not d·Σq itself
        const wRow = w.data.subarray((j * w.data.length) / n);
        const dv = new DataView(q81.data.buffer, q81.data.byteOffset);
        const wb = w.format === "q4_1" ? 20 : 24;
        for (let b = 0; b < k / 32; b++) {
          const half = (o: DataView, at: number) =>
            new Float16Array(new Uint16Array([o.getUint16(at, true)]).buffer)[0] as number;
          const mw = half(new DataView(wRow.buffer, wRow.byteOffset + b * wb), 2);
          const da = half(dv, b * 36);
          const sa = half(dv, b * 36 + 2);
          let sumq = 0;
          for (let e = 0; e < 32; e++) sumq += dv.getInt8(b * 36 + 4 + e);
          s += mw * (sa - da * sumq);
        }
      }
      const bj = bias ? (bias[j] as number) : 0;
      semantic[i * n + j] = s * scale + bj;
      plain[i * n + j] = p * scale + bj;
    }
  }
  return { semantic, plain };
}

const FORMATS = Object.keys(NATIVE_WEIGHT_FORMATS) as NativeWeightFormat[];
/** GGUF block types with 256-element super-blocks (the k-quants and IQ4_XS). */
const superBlocks = (f: NativeWeightFormat) => f.endsWith("_k") || f === "iq4_xs";
/** GGUF block types of 32 elements. */
const blocks32 = (f: NativeWeightFormat) => (f.startsWith("q") || f === "iq4_nl") && !superBlocks(f);

/** [m, n, k] cases per format: GEMV, small odd m, and m ≥ 16 with n spanning several 64-column strips (and K chunks). */
function shapes(format: NativeWeightFormat): [number, number, number][] {
  if (superBlocks(format))
    return [
      [1, 67, 512],
      [3, 33, 768],
      [23, 131, 256],
      // the Q4_K GEMM: 64 blocks of 32 = two K chunks of its packed panels (48 + 16), m % 4 = 1
      [21, 100, 2048],
    ];
  if (blocks32(format))
    return [
      [1, 67, 320],
      [5, 33, 1024],
      [19, 70, 96],
      // the Q8_0 / Q4_0 GEMM: 50 blocks = two K chunks of its packed panels (48 + 2), m % 4 = 1
      [21, 100, 1600],
    ];
  if (format.includes("convrot"))
    return [
      [1, 67, 768],
      [3, 33, 80],
      // the GEMV below 16 rows: row groups of 4 + 3 and 4 × 3 + 3 over several blocks of 16 row pairs
      // per thread, an odd last column, a K that ends inside a 128-element step
      [7, 203, 320],
      [15, 140, 256],
      [23, 131, 768],
      [17, 600, 512],
    ];
  return [
    [1, 67, 195],
    [5, 33, 512],
    // bf16 below 16 rows: row groups of 4 + 3 over several blocks of 16 row pairs per thread, a K tail
    [7, 203, 260],
    [23, 131, 260],
    [17, 600, 640],
  ];
}

/** The levels under test, e.g. "scalar, avx2, avx512 (VNNI, BF16)". */
const LEVELS = ISAS.map((i) =>
  i === "avx512"
    ? `avx512 (${[FEATURES & CPU_FEATURES.avx512vnni ? "VNNI" : "no VNNI: AVX2 kernels", FEATURES & CPU_FEATURES.avx512bf16 ? "BF16" : "no BF16"].join(", ")})`
    : i,
).join(", ");

describe(`matmul against @tp/quant references at ${LEVELS}`, () => {
  for (const format of FORMATS) {
    for (const [m, n, k] of shapes(format)) {
      test(`${format} m=${m} n=${n} k=${k}, every ISA level, bias`, () => {
        const w = makeWeight(format, n, k, m * 7919 + k);
        const r = rng(k + n);
        const x = new Float32Array(m * k).map(() => r() * 2 - 1);
        const bias = m % 2 ? new Float32Array(n).map(() => r() - 0.5) : null;
        const convrot = format === "int8_convrot" || format === "int4_convrot";
        const exact = convrot
          ? convRotLinear(
              x,
              { format, shape: [n, k], groupSize: w.group, data: w.data, scale: w.scale as Float32Array },
              bias ? { bias } : {},
            )
          : null;
        const ref = convrot ? null : reference(w, x, m, bias);
        for (const isa of ISAS) {
          const y = new Float32Array(m * n);
          ctxFor(isa).matmul(x, m, w, bias, y);
          if (exact) {
            expect({ isa, firstMismatch: firstMismatch(y, exact) }).toEqual({ isa, firstMismatch: -1 });
            continue;
          }
          const refs = ref as { semantic: Float64Array; plain: Float64Array };
          const ggml = blocks32(format) || superBlocks(format);
          expect({ isa, nmse: nmse(y, refs.semantic) < (ggml ? GGML_NMSE : FLOAT_NMSE) }).toEqual({
            isa,
            nmse: true,
          });
          const loose = ggml
            ? GGML_VS_F32_NMSE
            : format === "bf16" || format.startsWith("f8")
              ? BF16_ACT_NMSE
              : FLOAT_NMSE;
          expect({ isa, plain: nmse(y, refs.plain) < loose }).toEqual({ isa, plain: true });
        }
      });
    }
  }

  test("M = 1 gives the bits of the same row of an M = 2 product (the two-row GEMV kernels), 1 and 2 threads", () => {
    // At one activation row the AVX-512 GGUF, ConvRot, fp8, bf16, f32 and f16 GEMVs read weight rows t and
    // t + h together; each row must still get the float the one-row kernels give (M = 2 runs them; for
    // bf16, f32, f16 and ConvRot both run one two-row kernel, which sums each row the same way for any
    // number of rows). K multiple of 128
    // so the two-row kernels apply (K = 4096: Q4_x / Q5_x took one row at a time past K = 3072
    // before); N odd and even, ranges split over threads; with and without bias.
    const ggufFormats = FORMATS.filter(
      (f) =>
        blocks32(f) ||
        superBlocks(f) ||
        f.endsWith("_convrot") ||
        f.startsWith("f8") ||
        f === "bf16" ||
        f === "f32" ||
        f === "f16",
    );
    for (const format of ggufFormats) {
      for (const [n, k] of [
        [1, 1024],
        [2, 256],
        [67, 512],
        [300, 1024],
        [1001, 3072],
        [129, 4096],
      ] as [number, number][]) {
        const w = makeWeight(format, n, k, n * 31 + k);
        const r = rng(n + 3 * k);
        const row = new Float32Array(k).map(() => r() * 2 - 1);
        const bias = n % 2 ? new Float32Array(n).map(() => r() - 0.5) : null;
        const x2 = new Float32Array(2 * k);
        x2.set(row, 0);
        x2.set(
          row.map((v) => -v),
          k,
        );
        for (const threads of [1, 2]) {
          const y1 = new Float32Array(n);
          const y2 = new Float32Array(2 * n);
          ctxFor(BEST, threads).matmul(row, 1, w, bias, y1);
          ctxFor(BEST, threads).matmul(x2, 2, w, bias, y2);
          expect({ format, n, k, threads, firstMismatch: firstMismatch(y1, y2.subarray(0, n)) }).toEqual({
            format,
            n,
            k,
            threads,
            firstMismatch: -1,
          });
        }
      }
    }
  }, 30_000); // ~4 s alone here (large fp8 / GGUF weights built in TypeScript); more under load

  test("fp8 at M = 1 and M = 2: every code (NaN, ±inf, subnormals, −0) gives dequantizeFp8's value, every level, 1 and 2 threads", () => {
    // Row j holds code j (j < 256; row 256 code 0x38) at column p = 7j mod k and zeros (+0) elsewhere; x
    // holds powers of two (exact in bf16), so each output is exactly the code's value (times the
    // scale, rounded as dequantizeFp8 rounds it) times x[p]. The M = 1 kernel of the AVX-512 level
    // looks codes up in tables and lays x out in its own order: a wrong table entry, sign or
    // position shows here. k = 200 ends in a partial step; n = 257 pairs rows 128 apart plus an odd row.
    const [n, k] = [257, 200];
    const x = Float32Array.from({ length: k }, (_, i) => 2 ** ((i % 13) - 6));
    for (const format of ["f8_e4m3fn", "f8_e5m2"] as const) {
      for (const scale of [undefined, 0.0375]) {
        const data = new Uint8Array(n * k);
        const codes = Uint8Array.from({ length: n }, (_, j) => (j < 256 ? j : 0x38));
        for (let j = 0; j < n; j++) data[j * k + ((7 * j) % k)] = codes[j] as number;
        const w: NativeWeight = {
          format,
          n,
          k,
          data,
          scale: scale === undefined ? null : Float32Array.of(scale),
          group: 0,
        };
        const values = dequantizeFp8(codes, format, scale);
        // + 0: a sum of products that starts from 0 gives +0 for the code −0, as the reference dot would
        const want = Float32Array.from(values, (v, j) => v * (x[(7 * j) % k] as number) + 0);
        for (const isa of ISAS) {
          for (const threads of [1, 2]) {
            const y1 = new Float32Array(n);
            ctxFor(isa, threads).matmul(x, 1, w, null, y1);
            const y2 = new Float32Array(2 * n);
            const x2 = new Float32Array(2 * k);
            x2.set(x, 0);
            x2.set(x, k);
            ctxFor(isa, threads).matmul(x2, 2, w, null, y2);
            const got = {
              format,
              scale,
              isa,
              threads,
              m1: firstMismatch(y1, want),
              m2: firstMismatch(y2.subarray(n), want),
            };
            expect(got).toEqual({ format, scale, isa, threads, m1: -1, m2: -1 });
          }
        }
      }
    }
  });

  // The GEMM keeps partial sums between K blocks in a buffer of its own (m × 1 KiB per task) while all
  // tasks' buffers stay within 32 MiB (matmul.h TP_MM_PART_TOTAL_MAX), in y past that — m = 20000 with
  // 2 threads is past it: both give each row the same bits.
  test("partial sums in the task's buffer (m = 20) or in y (m = 20000) give the same bits", () => {
    for (const format of ["bf16", "int8_convrot", "f32"] as NativeWeightFormat[]) {
      const [mBig, mSmall, n, k] = [20000, 20, 70, 1088]; // k over every KC (512 / 256 / 128); 68 groups of 16
      const w = makeWeight(format, n, k, 9);
      const x = new Float32Array(mBig * k).map(rng(10));
      const yBig = new Float32Array(mBig * n);
      const ySmall = new Float32Array(mSmall * n);
      ctxFor(BEST, 2).matmul(x, mBig, w, null, yBig);
      ctxFor(BEST, 2).matmul(x.subarray(0, mSmall * k), mSmall, w, null, ySmall);
      expect(`${format}: ${firstMismatch(ySmall, yBig.subarray(0, mSmall * n))}`).toBe(`${format}: -1`);
    }
  });

  // n = 1100: five 256-column chunks shared out by stealing (matmul.c col_task) with 2 and 3 threads
  // (3 threads on this 2-CPU machine: one is often descheduled, and the others take its chunks)
  test("1, 2 and 3 threads give the same bits at every level (the split is by output column, chunks stolen or not)", () => {
    for (const isa of ISAS) {
      for (const format of ["q4_k", "bf16", "int8_convrot", "f16", "q8_0"] as NativeWeightFormat[]) {
        for (const n of [300, 1100]) {
          const [m, k] = [20, 512];
          const w = makeWeight(format, n, k, 5);
          const x = new Float32Array(m * k).map(rng(6));
          const y1 = new Float32Array(m * n);
          ctxFor(isa, 1).matmul(x, m, w, null, y1);
          for (const threads of [2, 3]) {
            for (let rep = 0; rep < 3; rep++) {
              const yt = new Float32Array(m * n).fill(Number.NaN);
              ctxFor(isa, threads).matmul(x, m, w, null, yt);
              expect(`${isa} ${format} n=${n} threads=${threads}: ${firstMismatch(y1, yt)}`).toBe(
                `${isa} ${format} n=${n} threads=${threads}: -1`,
              );
            }
          }
        }
      }
    }
  });
});

describe("activation quantizers are bit-exact", () => {
  test("Q8_0 / Q8_1 / Q8_K rows equal @tp/quant quantizeGgml (incl. zero blocks and ties)", () => {
    const r = rng(11);
    const k = 512;
    const m = 3;
    const x = new Float32Array(m * k).map(() => (r() * 2 - 1) * 10);
    x.fill(0, 0, 256); // a zero Q8_K block and zero Q8_0 blocks
    for (let i = 256; i < 288; i++) x[i] = (i % 5) - 2; // small integers: x·(1/d) lands on .5 ties
    x[300] = 127; // d = 1 exactly for that block
    for (const type of ["q8_0", "q8_1", "q8_k"] as const) {
      const ref = new Uint8Array(
        m * ((k / (type === "q8_k" ? 256 : 32)) * (type === "q8_0" ? 34 : type === "q8_1" ? 36 : 292)),
      );
      for (let i = 0; i < m; i++) {
        const q = quantizeGgml(type, x.subarray(i * k, (i + 1) * k), k);
        ref.set(q, (i * ref.length) / m);
      }
      for (const isa of ISAS) {
        const out = new Uint8Array(ref.length);
        ctxFor(isa).quantizeActivations(type, x, m, k, out);
        expect({ isa, type, equal: Buffer.from(out).equals(Buffer.from(ref)) }).toEqual({
          isa,
          type,
          equal: true,
        });
      }
    }
  });

  test("NaN / ±inf activations: Q8_0 / Q8_1 blocks and ConvRot rows as the reference, and a NaN matmul row", () => {
    // reference arithmetic (Math.max keeps a NaN): a block holding NaN gets d = NaN, one holding ±inf
    // (no NaN) d = +inf, codes 0 either way, Q8_1's s NaN — so the products come out NaN
    const k = 256;
    const x = new Float32Array(2 * k).map((_, i) => Math.sin(i * 0.37) * 3);
    x[3] = Number.NaN; // block 0
    x[40] = Number.POSITIVE_INFINITY; // block 1
    x[70] = Number.NEGATIVE_INFINITY; // block 2
    x[100] = Number.NaN; // block 3: NaN and inf
    x[101] = Number.POSITIVE_INFINITY;
    x[k + 200] = Number.NaN; // row 1, block 6
    for (const type of ["q8_0", "q8_1"] as const) {
      const bb = type === "q8_0" ? 34 : 36;
      const ref = new Uint8Array(2 * (k / 32) * bb);
      for (let i = 0; i < 2; i++)
        // the activation path (weights of the type that pairs with these blocks): NaN / ±∞ propagate
        ref.set(
          quantizeActivationsGgml(type === "q8_0" ? "q8_0" : "q4_1", x.subarray(i * k, (i + 1) * k)).data,
          (i * ref.length) / 2,
        );
      const dv = new DataView(ref.buffer);
      expect(f16ToF32(dv.getUint16(0, true))).toBeNaN(); // the reference's d of block 0
      expect(f16ToF32(dv.getUint16(bb, true))).toBe(Number.POSITIVE_INFINITY);
      for (const isa of ISAS) {
        const out = new Uint8Array(ref.length);
        ctxFor(isa).quantizeActivations(type, x, 2, k, out);
        expect({ isa, type, equal: Buffer.from(out).equals(Buffer.from(ref)) }).toEqual({
          isa,
          type,
          equal: true,
        });
      }
    }
    for (const bits of [8, 4] as const) {
      const xr = x.slice(0, 3 * 64).fill(1, 0, 64); // rows: one +inf (rotated to ±inf), one NaN, finite
      xr[5] = Number.POSITIVE_INFINITY;
      xr.set(x.subarray(0, 64), 64);
      xr[64 + 3] = Number.NaN;
      xr.set(x.subarray(130, 194), 128);
      const ref = quantizeActivationsConvRot(xr, 64, bits, 16);
      const [s0, s1, s2] = Array.from(ref.scale);
      expect([Number.isFinite(s0), Number.isNaN(s1), Number.isFinite(s2)]).toEqual([false, true, true]);
      for (const isa of ISAS) {
        const codes = new Int8Array(3 * 64);
        const scales = new Float32Array(3);
        ctxFor(isa).convRotQuantize(xr, 3, 64, bits, 16, codes, scales);
        expect({ isa, bits, codes: Array.from(codes), scales: Array.from(scales) }).toEqual({
          isa,
          bits,
          codes: Array.from(ref.codes),
          scales: Array.from(ref.scale),
        });
      }
    }
    // a NaN in a row of x makes that row of the product NaN and leaves the other rows finite
    for (const format of ["q8_0", "q4_0", "q4_1", "int8_convrot", "int4_convrot"] as NativeWeightFormat[]) {
      for (const m of [1, 16]) {
        const w = makeWeight(format, 8, k, 5);
        const xm = new Float32Array(m * k).map((_, i) => Math.cos(i * 0.11));
        xm[7] = Number.NaN;
        const y = new Float32Array(m * 8);
        for (const isa of ISAS) {
          ctxFor(isa).matmul(xm, m, w, null, y);
          const row0 = Array.from(y.subarray(0, 8), Number.isNaN);
          const rest = Array.from(y.subarray(8), Number.isFinite);
          expect({ format, m, isa, row0NaN: row0.every(Boolean), restFinite: rest.every(Boolean) }).toEqual({
            format,
            m,
            isa,
            row0NaN: true,
            restFinite: true,
          });
        }
      }
    }
  });

  test("ConvRot rotate + quantize equals quantizeActivationsConvRot (groups 16, 64, 256; round-half-even ties)", () => {
    const r = rng(12);
    for (const bits of [8, 4] as const) {
      for (const group of [16, 64, 256]) {
        const k = 2 * Math.max(group, 64);
        const m = 3;
        const x = new Float32Array(m * k).map(() => r() * 2 - 1);
        // row 2: x = H·t with t odd integers and max |t| = 2·qmax, so s_x = 2 and x_rot / s_x = t / 2
        // are exact ties (H is its own inverse, and every sum of these small dyadics is exact in f32)
        const qmax = bits === 8 ? 127 : 7;
        const t = Float32Array.from({ length: k }, () => 2 * Math.floor(r() * (qmax + 1)) - qmax);
        t[5] = 2 * qmax;
        hadamardRowsF64(t, k, group);
        x.set(t, 2 * k);
        const ref = quantizeActivationsConvRot(x, k, bits, group);
        for (const isa of ISAS) {
          const codes = new Int8Array(m * k);
          const scales = new Float32Array(m);
          ctxFor(isa).convRotQuantize(x, m, k, bits, group, codes, scales);
          expect({
            isa,
            bits,
            group,
            codes: Buffer.from(codes.buffer).equals(Buffer.from(ref.codes.buffer)),
          }).toEqual({
            isa,
            bits,
            group,
            codes: true,
          });
          expect(Array.from(scales)).toEqual(Array.from(ref.scale));
        }
      }
    }
  });
});

/** v ← v · H per group with the exact f64 butterfly (the ConvRot rotation, krea2.md §1.6). */
function hadamardRowsF64(v: Float32Array, k: number, group: number): void {
  const row = new Float64Array(group);
  for (let off = 0; off < k; off += group) {
    for (let i = 0; i < group; i++) row[i] = v[off + i] as number;
    for (let s = 1; s < group; s *= 4) {
      for (let base = 0; base < group; base += 4 * s) {
        for (let o = 0; o < s; o++) {
          const p = base + o;
          const [a, b, c, d] = [row[p], row[p + s], row[p + 2 * s], row[p + 3 * s]] as number[];
          row[p] = (a as number) + (b as number) + (c as number) - (d as number);
          row[p + s] = (a as number) + (b as number) - (c as number) + (d as number);
          row[p + 2 * s] = (a as number) - (b as number) + (c as number) + (d as number);
          row[p + 3 * s] = -(a as number) + (b as number) + (c as number) + (d as number);
        }
      }
    }
    const norm = 1 / Math.sqrt(group);
    for (let i = 0; i < group; i++) v[off + i] = (row[i] as number) * norm;
  }
}

describe("get_rows / dequantization are bit-exact with @tp/quant", () => {
  for (const format of FORMATS) {
    test(`${format}: rows at ids, every ISA level`, () => {
      const k = superBlocks(format) || format.includes("convrot") ? 512 : blocks32(format) ? 96 : 37;
      const n = 9;
      const r = rng(k * 3 + format.length);
      let w: NativeWeight;
      if (blocks32(format) || superBlocks(format) || format.startsWith("f8")) {
        // random bytes everywhere (fp8 NaN codes included), sane f16 scales
        w = makeWeight(format, n, k, 77);
        if (format.startsWith("f8")) w = { ...w, data: Uint8Array.from(w.data, () => Math.floor(r() * 256)) };
      } else {
        w = makeWeight(format, n, k, 78);
      }
      const ref = referenceWeight(w);
      const scale = format.startsWith("f8") && w.scale ? (w.scale[0] as number) : undefined;
      const expected = scale === undefined ? ref : dequantizeFp8(w.data, format as "f8_e4m3fn", scale);
      const ids = Int32Array.from([4, 0, 8, 8, 1, 3]);
      for (const isa of ISAS) {
        const out = new Float32Array(ids.length * k);
        ctxFor(isa).getRows(w, ids, ids.length, out);
        const want = new Float32Array(ids.length * k);
        ids.forEach((id, i) => {
          want.set(expected.subarray(id * k, (id + 1) * k), i * k);
        });
        expect({ isa, firstMismatch: firstMismatch(out, want) }).toEqual({ isa, firstMismatch: -1 });
        const all = new Float32Array(n * k);
        ctxFor(isa).getRows(w, null, n, all);
        expect({ isa, all: firstMismatch(all, expected) }).toEqual({ isa, all: -1 });
      }
    });
  }
});

/** The TpError code of what `fn` throws. */
function code(fn: () => unknown): string {
  try {
    fn();
  } catch (e) {
    return e instanceof TpError ? e.code : `not a TpError: ${e}`;
  }
  return "no error";
}

describe("CpuBackend.matmul / embedding", () => {
  const weightOf = (nw: NativeWeight, name = "blk.0.w"): Weight =>
    new Weight({
      name,
      format: nw.format as WeightFormat,
      shape: [nw.n, nw.k],
      data: nw.data,
      ...(nw.format.includes("convrot")
        ? { scale: { kind: "row" as const, values: nw.scale as Float32Array }, rotationGroup: nw.group }
        : nw.scale
          ? { scale: { kind: "tensor" as const, value: nw.scale[0] as number } }
          : {}),
    });

  test("leading dimensions, bias, a strided x, M = 0, and the same bits as the native call", async () => {
    const b = createBackend({ threads: 2 });
    const nw = makeWeight("q4_k", 24, 256, 3);
    const w = weightOf(nw);
    const xs = new Float32Array(2 * 3 * 256).map(rng(4));
    const x = b.upload(xs, [2, 3, 256], "f32", "x");
    const bias = b.upload(new Float32Array(24).map(rng(5)), [24], "f32", "bias");
    const y = b.matmul(x, w, { bias });
    expect(y.shape).toEqual([2, 3, 24]);
    const direct = new Float32Array(6 * 24);
    b.ctx.matmul(xs, 6, nw, (await b.read(bias)) as Float32Array, direct);
    expect(firstMismatch((await b.read(y)) as Float32Array, direct)).toBe(-1);
    // a transposed (strided) x is copied first: [256, 6]ᵀ
    const xt = b.upload(new Float32Array(6 * 256).map(rng(6)), [256, 6], "f32").transpose(0, 1);
    const yt = b.matmul(xt, w);
    const dense = b.matmul(b.copy(xt), w);
    expect(firstMismatch((await b.read(yt)) as Float32Array, (await b.read(dense)) as Float32Array)).toBe(-1);
    expect(b.matmul(b.alloc([0, 256], "f32"), w).shape).toEqual([0, 24]);
    b.dispose();
  });

  test("errors: K mismatch and bias shape (E_SHAPE naming shapes), formats and dtypes (E_UNSUPPORTED)", () => {
    const b = createBackend({ threads: 1 });
    const w = weightOf(makeWeight("q8_0", 4, 64, 1), "blk.3.ffn_up.weight");
    const x = b.alloc([2, 32], "f32");
    expect(() => b.matmul(x, w)).toThrow(
      "op matmul on backend cpu: x [2, 32] does not end in K = 64 of weight blk.3.ffn_up.weight q8_0 [4, 64]",
    );
    expect(code(() => b.matmul(b.alloc([2, 64], "f32"), w, { bias: b.alloc([5], "f32") }))).toBe("E_SHAPE");
    expect(() => b.matmul(b.alloc([2, 64], "f16"), w)).toThrow(
      "op matmul on backend cpu does not support dtype f16",
    );
    const q8k = new Weight({ name: "t", format: "q8_k", shape: [2, 256], data: new Uint8Array(584) });
    expect(() => b.matmul(b.alloc([1, 256], "f32"), q8k)).toThrow(
      "op matmul on backend cpu does not support weight format q8_k",
    );
    const scaledBf16 = new Weight({
      name: "s",
      format: "bf16",
      shape: [2, 4],
      data: new Uint8Array(16),
      scale: { kind: "tensor", value: 2 },
    });
    expect(code(() => b.matmul(b.alloc([1, 4], "f32"), scaledBf16))).toBe("E_UNSUPPORTED");
    expect(b.supports("matmul", ["q6_k", "f32"])).toBe(true);
    expect(b.supports("matmul", ["iq4_xs"])).toBe(true);
    expect(b.supports("matmul", ["q8_k"])).toBe(false);
    expect(b.capabilities().weightFormats).toContain("int4_convrot");
    b.dispose();
  });

  test("embedding: rows at ids of any shape; ids outside [0, V) are E_ARG naming the id and V", async () => {
    const b = createBackend({ threads: 2 });
    for (const format of ["q6_k", "bf16", "int4_convrot", "f8_e4m3fn"] as NativeWeightFormat[]) {
      const nw = makeWeight(format, 10, 256, 9);
      const table = weightOf(nw, "token_embd.weight");
      const ids = b.upload(Int32Array.from([9, 0, 3, 3, 7, 1]), [2, 3], "i32");
      const out = b.embedding(table, ids);
      expect(out.shape).toEqual([2, 3, 256]);
      const got = (await b.read(out)) as Float32Array;
      const full = new Float32Array(10 * 256);
      b.ctx.getRows(nw, null, 10, full);
      [9, 0, 3, 3, 7, 1].forEach((id, i) => {
        expect(
          firstMismatch(got.subarray(i * 256, (i + 1) * 256), full.subarray(id * 256, (id + 1) * 256)),
        ).toBe(-1);
      });
      expect(() => b.embedding(table, b.upload(Int32Array.from([2, 10]), [2], "i32"))).toThrow(
        "op embedding on backend cpu: id 10 (at index 1 of ids [2]) is outside [0, V) for V = 10 rows",
      );
      expect(code(() => b.embedding(table, b.upload(Int32Array.from([-1]), [1], "i32")))).toBe("E_ARG");
    }
    expect(code(() => b.embedding(weightOf(makeWeight("f32", 2, 4, 1)), b.alloc([1], "i64")))).toBe(
      "E_UNSUPPORTED",
    );
    b.dispose();
  });
});

describe("native argument checks (TpError before any pointer crosses)", () => {
  const ctx = () => ctxFor(BEST, 1);
  const w = makeWeight("q4_0", 4, 64, 1);
  test("short views, bad weight bytes, scales and groups are E_ARG naming the argument", () => {
    const x = new Float32Array(2 * 64);
    const y = new Float32Array(2 * 4);
    expect(() => ctx().matmul(x.subarray(1), 2, w, null, y)).toThrow(
      "matmul: x holds 127 values, 128 are needed",
    );
    expect(() => ctx().matmul(x, 2, w, null, y.subarray(1))).toThrow(
      "matmul: y holds 7 values, 8 are needed",
    );
    expect(() => ctx().matmul(x, 2, { ...w, data: w.data.subarray(1) }, null, y)).toThrow(
      "q4_0 weight [4, 64] needs 144 bytes, w.data holds 143",
    );
    expect(() => ctx().matmul(x, 2, w, new Float32Array(3), y)).toThrow("bias holds 3 values");
    expect(() => ctx().matmul(x, 2, { ...w, scale: Float32Array.of(1) }, null, y)).toThrow(
      "a q4_0 weight takes no scale",
    );
    const cw = makeWeight("int8_convrot", 4, 256, 2);
    expect(() =>
      ctx().matmul(new Float32Array(256), 1, { ...cw, group: 8 }, null, new Float32Array(4)),
    ).toThrow("group = 8 for int8_convrot");
    expect(() =>
      ctx().matmul(
        new Float32Array(256),
        1,
        { ...cw, scale: new Float32Array(3) },
        null,
        new Float32Array(4),
      ),
    ).toThrow("takes 4 row scales, got 3");
    expect(() => ctx().matmul(x, 2, { ...w, k: 48 }, null, y)).toThrow("not a whole number of q4_0 blocks");
    expect(() => ctx().matmul(x, 2, { ...w, format: "iq2_xxs" as NativeWeightFormat }, null, y)).toThrow(
      "unknown weight format",
    );
    expect(code(() => ctx().getRows(w, Int32Array.from([0, 4]), 2, new Float32Array(128)))).toBe("E_ARG");
    expect(() => ctx().getRows(w, Int32Array.from([0, 4]), 2, new Float32Array(128))).toThrow(
      "id 4 at index 1 is outside [0, 4)",
    );
    expect(code(() => ctx().quantizeActivations("q8_k", x, 2, 64, new Uint8Array(10)))).toBe("E_ARG");
    expect(code(() => ctx().convRotQuantize(x, 2, 64, 8, 48, new Int8Array(128), new Float32Array(2)))).toBe(
      "E_ARG",
    );
  });
});

describe("thread pool (spin, then sleep)", () => {
  test("parallel calls after gaps of 0, 50 µs and 300 µs (spinning and sleeping workers) give the same bits", () => {
    const w = makeWeight("q8_0", 256, 256, 21); // 65,536 multiply-adds: split over the threads
    const x = new Float32Array(256).map(rng(22));
    const ref = new Float32Array(256);
    const ctx = ctxFor(BEST, 2);
    ctx.matmul(x, 1, w, null, ref);
    const y = new Float32Array(256);
    let mismatches = 0;
    for (const gapMs of [0, 0.05, 0.3]) {
      for (let i = 0; i < 100; i++) {
        const until = performance.now() + gapMs;
        while (performance.now() < until) {} // idle without yielding the thread
        ctx.matmul(x, 1, w, null, y);
        if (firstMismatch(y, ref) !== -1) mismatches++;
      }
    }
    expect(mismatches).toBe(0);
  });

  test("contexts destroyed right after a parallel call (workers still spinning) shut down cleanly", () => {
    const w = makeWeight("bf16", 256, 256, 23);
    const x = new Float32Array(256).map(rng(24));
    const y = new Float32Array(256);
    for (let i = 0; i < 20; i++) {
      const c = lib.createContext(2, BEST);
      c.matmul(x, 1, w, null, y);
      c.destroy();
    }
    expect(y.every(Number.isFinite)).toBe(true);
  });
});
