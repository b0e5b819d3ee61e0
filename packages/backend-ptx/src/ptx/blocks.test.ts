// The block decoders and activation quantizers: host-side facts (the block table against @tp/tensor's
// GGUF table from ggml-common.h, row lengths, parameters), and on the simulator (sm_86) single blocks
// with values worked by hand from the ggml-common.h layouts and ggml-quants.c formulas (blocks.ts's
// module comment lists both). The conformance suite checks whole tensors against @tp/quant.
import { describe, expect, test } from "bun:test";
import { weightBytes, weightFormatInfo } from "@tp/tensor";
import { SimCudaDriver } from "../sim/driver.ts";
import { fakeQuantizeQ8_0Kernel, fakeQuantizeQ8_KKernel } from "./activations.ts";
import { BLOCKS, type BlockFormat, blockRowBytes, isBlockFormat } from "./blocks.ts";
import { GGUF_BLOCK_FORMATS } from "./catalogue.ts";
import { type KernelSource, ptxModule } from "./emit.ts";
import { embeddingKernel, rowBytes } from "./gather.ts";
import { GEMV_WARPS, gemvKernel } from "./matmul.ts";

/** Run `k` on a fresh simulated sm_86 over `grid` (x, or x and y); buffers by parameter name, numbers as u32; returns out. */
function simulate(
  k: KernelSource,
  grid: number | readonly [number, number],
  args: Record<string, Uint8Array | number>,
  outBytes: number,
) {
  const d = new SimCudaDriver({ sm: 86, memoryBytes: 1 << 20 });
  const fn = d.loadPtx(ptxModule(86, [k]), k.name);
  const bufs = new Map<string, { p: bigint; h: { address: number; bytes: Uint8Array } }>();
  const put = (name: string, data: Uint8Array) => {
    const p = d.memAlloc(data.byteLength);
    const h = d.memAllocHost(data.byteLength);
    h.bytes.set(data);
    d.copyHtoDAsync(p, h.address, data.byteLength, 0);
    bufs.set(name, { p, h });
  };
  put("out", new Uint8Array(outBytes));
  for (const [name, v] of Object.entries(args)) if (typeof v !== "number") put(name, v);
  d.launch(
    fn,
    typeof grid === "number" ? [grid, 1, 1] : [grid[0], grid[1], 1],
    [k.block[0], 1, 1],
    0,
    0,
    k.params.map((p) => {
      const b = bufs.get(p.name);
      if (b !== undefined) return { u64: b.p };
      return { u32: args[p.name] as number };
    }),
  );
  const o = bufs.get("out") as { p: bigint; h: { address: number; bytes: Uint8Array } };
  d.copyDtoHAsync(o.h.address, o.p, outBytes, 0);
  return new Float32Array(o.h.bytes.slice(0, outBytes).buffer);
}

/** One block of `format`: zero bytes with the given (offset, byte) pairs; binary16 fields as [offset, bits]. */
function block(format: BlockFormat, bytes: [number, number][], halves: [number, number][]): Uint8Array {
  const b = new Uint8Array(BLOCKS[format].bytes);
  for (const [o, v] of bytes) b[o] = v;
  for (const [o, h] of halves) {
    b[o] = h & 255;
    b[o + 1] = h >> 8;
  }
  return b;
}

// binary16 bits: 0.25, 0.5, 1, 2, −1
const H = { quarter: 0x3400, half: 0x3800, one: 0x3c00, two: 0x4000, minusOne: 0xbc00 };

/**
 * Per format: a block and [element, value] pairs worked by hand. Q4_K / Q5_K sub-block 4 takes its
 * scale and min from the high 2 bits of bytes 0 and 4 and the nibbles of byte 8 of scales[12]
 * (get_scale_min_k4): sc = 1 | 3 << 4 = 49, mn = 5 | 2 << 4 = 37.
 */
const HAND: Record<BlockFormat, { block: Uint8Array; values: [number, number][] }> = {
  // d = 0.5; qs[5] = −10
  q8_0: {
    block: block("q8_0", [[2 + 5, 0xf6]], [[0, H.half]]),
    values: [
      [5, -5],
      [0, 0],
    ],
  },
  // d = 2; byte 1 = 0x3f: element 1 → (15 − 8)·2, element 17 → (3 − 8)·2; element 0 → −16
  q4_0: {
    block: block("q4_0", [[2 + 1, 0x3f]], [[0, H.two]]),
    values: [
      [1, 14],
      [17, -10],
      [0, -16],
    ],
  },
  // d = 0.5, m = −1; byte 3 = 0xa7: element 3 → 7·0.5 − 1, element 19 → 10·0.5 − 1
  q4_1: {
    block: block(
      "q4_1",
      [[4 + 3, 0xa7]],
      [
        [0, H.half],
        [2, H.minusOne],
      ],
    ),
    values: [
      [3, 2.5],
      [19, 4],
      [0, -1],
    ],
  },
  // d = 0.25; qh bit 19 (byte 2 of qh = 0x08); byte 3 = 0x5c: element 3 → (12 − 16)/4, 19 → (5 + 16 − 16)/4
  q5_0: {
    block: block(
      "q5_0",
      [
        [2 + 2, 0x08],
        [6 + 3, 0x5c],
      ],
      [[0, H.quarter]],
    ),
    values: [
      [3, -1],
      [19, 1.25],
      [0, -4],
    ],
  },
  // d = 2, m = 0.5; qh bit 0; byte 0 = 0x31: element 0 → (1 + 16)·2 + 0.5, element 16 → 3·2 + 0.5
  q5_1: {
    block: block(
      "q5_1",
      [
        [4, 0x01],
        [8, 0x31],
      ],
      [
        [0, H.two],
        [2, H.half],
      ],
    ),
    values: [
      [0, 34.5],
      [16, 6.5],
      [1, 0.5],
    ],
  },
  // d = 0.5, dmin = 0.25; scales[0] = 0x23 (sc 3, min 2), scales[2] = 0x12, scales[8] = 0x17;
  // qs[0] = 0xe4: element 0 → q 0, element 32 → q 1; qs[32 + 5] = 2: element 133 → q 2
  q2_k: {
    block: block(
      "q2_k",
      [
        [0, 0x23],
        [2, 0x12],
        [8, 0x17],
        [16, 0xe4],
        [16 + 37, 0x02],
      ],
      [
        [80, H.half],
        [82, H.quarter],
      ],
    ),
    values: [
      [0, -0.5], // 0.5·3·0 − 0.25·2
      [32, 0.75], // 0.5·2·1 − 0.25·1
      [133, 6.75], // 0.5·7·2 − 0.25·1
    ],
  },
  // d = 1; S3(0) = 5 | 2 << 4 − 32 = 5 (scales[0] = 5, scales[8] = 2); S3(12) = 9 − 32 (scales[4] = 0x90);
  // element 0: q 3, hmask set → 5·3; element 1: q 0, hmask clear → 5·(0 − 4);
  // element 200 (half 1, l 8, shift 4): qs[32 + 8] = 0x10 → q 1, hmask[8] bit 6 set → −23·1
  q3_k: {
    block: block(
      "q3_k",
      [
        [0, 0x01],
        [8, 0x40],
        [32, 0x03],
        [32 + 40, 0x10],
        [96, 0x05],
        [96 + 4, 0x90],
        [96 + 8, 0x02],
      ],
      [[108, H.one]],
    ),
    values: [
      [0, 15],
      [1, -20],
      [200, -23],
    ],
  },
  // d = 1, dmin = 0.5; scales: S[0] = 0xc3 (sc 3), S[4] = 0x82 (min 2), S[8] = 0x51;
  // qs[0] = 0x97: element 0 → 3·7 − 0.5·2; element 32 (sub-block 1: sc 0, min 0) → 0;
  // qs[64] = 0x0b: element 128 (sub-block 4) → 49·11 − 0.5·37
  q4_k: {
    block: block(
      "q4_k",
      [
        [4, 0xc3],
        [8, 0x82],
        [12, 0x51],
        [16, 0x97],
        [16 + 64, 0x0b],
      ],
      [
        [0, H.one],
        [2, H.half],
      ],
    ),
    values: [
      [0, 20],
      [32, 0],
      [128, 520.5],
    ],
  },
  // as Q4_K with qh[0] = 0x11 (bit 0 → element 0 + 16, bit 4 → element 128 + 16)
  q5_k: {
    block: block(
      "q5_k",
      [
        [4, 0xc3],
        [8, 0x82],
        [12, 0x51],
        [16, 0x11],
        [48, 0x97],
        [48 + 64, 0x0b],
      ],
      [
        [0, H.one],
        [2, H.half],
      ],
    ),
    values: [
      [0, 68], // 3·23 − 1
      [128, 1304.5], // 49·27 − 18.5
    ],
  },
  // d = 0.5; element 0: ql[0] = 0x2a (low 10), qh[0] = 3 → 10 | 48 − 32 = 26, scale −3 → −39;
  // element 200 (half 1, l 8, j 2): ql[72] = 0x50 (high 5), qh[32 + 8] = 0x20 (bits 4..5: 2) → 5 | 32 − 32,
  // scale[12] = 4 → 0.5·4·5
  q6_k: {
    block: block(
      "q6_k",
      [
        [0, 0x2a],
        [72, 0x50],
        [128, 0x03],
        [128 + 40, 0x20],
        [192, 0xfd],
        [192 + 12, 4],
      ],
      [[208, H.half]],
    ),
    values: [
      [0, -39],
      [200, 10],
    ],
  },
  // d = 0.5 (values 0.5 · K4[n], kvalues_iq4nl); byte 1 = 0x3f: element 1 → K4[15] = 113, 17 → K4[3] = −65;
  // byte 2 = 0x6c: element 2 → K4[12] = 53, 18 → K4[6] = −22; byte 7 = 0x98: element 7 → K4[8] = 1,
  // 23 → K4[9] = 13; element 0 → K4[0] = −127 (a code from each of the four packed words)
  iq4_nl: {
    block: block(
      "iq4_nl",
      [
        [2 + 1, 0x3f],
        [2 + 2, 0x6c],
        [2 + 7, 0x98],
      ],
      [[0, H.half]],
    ),
    values: [
      [1, 56.5],
      [17, -32.5],
      [2, 26.5],
      [18, -11],
      [7, 0.5],
      [23, 6.5],
      [0, -63.5],
    ],
  },
  // d = 0.25; scales_h = 0xc002 (sub-block 0 high bits 2, sub-block 7 high bits 3), scales_l = 05 00 30 f0:
  // ls − 32 of sub-block 0: 5 | 2 << 4 − 32 = 5 (dl 1.25); 1: −32 (dl −8); 5 (high nibble of scales_l[2]):
  // 3 − 32 (dl −7.25); 7: 15 | 3 << 4 − 32 = 31 (dl 7.75). qs[0] = 0x0f: element 0 → 1.25 · 113, 16 →
  // 1.25 · −127; element 32 → −8 · −127; qs[84] = 0x60: element 164 → −7.25 · −127, 180 → −7.25 · −22;
  // qs[127] = 0x90: element 255 → 7.75 · 13
  iq4_xs: {
    block: block(
      "iq4_xs",
      [
        [4, 0x05],
        [6, 0x30],
        [7, 0xf0],
        [8, 0x0f],
        [8 + 84, 0x60],
        [8 + 127, 0x90],
      ],
      [
        [0, H.quarter],
        [2, 0xc002],
      ],
    ),
    values: [
      [0, 141.25],
      [16, -158.75],
      [32, 1016],
      [164, 920.75],
      [180, 159.5],
      [255, 100.75],
    ],
  },
};

describe("GGUF block table", () => {
  test("every decoded type has @tp/tensor's elements and bytes per block", () => {
    for (const f of Object.keys(BLOCKS) as BlockFormat[]) {
      const info = weightFormatInfo(f);
      expect([f, BLOCKS[f].elems, BLOCKS[f].bytes]).toEqual([f, info.blockElems, info.blockBytes]);
    }
    expect(GGUF_BLOCK_FORMATS.map(String).sort()).toEqual(Object.keys(BLOCKS).sort());
  });
  test("row bytes equal weightBytes of one row; other iq*, q8_1 and q8_k are not block formats here", () => {
    for (const f of GGUF_BLOCK_FORMATS) {
      expect(blockRowBytes(f, 512)).toBe(weightBytes(f, [1, 512]));
      expect(rowBytes(f, 768 * 4)).toBe(weightBytes(f, [1, 768 * 4]));
    }
    for (const f of ["iq2_xxs", "iq3_s", "q8_1", "q8_k", "f32", "tq1_0"])
      expect(isBlockFormat(f)).toBe(false);
  });
});

describe("block decoders on the simulator (sm_86): embedding of one block, values worked by hand", () => {
  for (const f of GGUF_BLOCK_FORMATS) {
    test(f, () => {
      const { block: data, values } = HAND[f];
      const D = BLOCKS[f].elems;
      const out = simulate(
        embeddingKernel(f),
        Math.ceil(D / 256),
        { table: data, ids: new Uint8Array(4), n: D, d: D, vocab: 1 },
        D * 4,
      );
      expect(values.map(([e]) => [e, out[e]])).toEqual(values);
    });
  }
});

describe("activation quantizers (./activations.ts) on the simulator (sm_86)", () => {
  test("Q8_0: d = amax / 127, codes rounded half away from zero, q · f16(d); a block with NaN or ±∞ is NaN", () => {
    const x = new Float32Array(96);
    // block 0: amax 127 → d = 1, id = 1; −2.5 → −3 (away from zero), 3.5 → 4, 0.49 → 0
    x.set([127, -2.5, 3.5, 0.49]);
    x[40] = Number.NaN; // block 1
    x[64] = 1;
    x[70] = Number.POSITIVE_INFINITY; // block 2
    const out = simulate(fakeQuantizeQ8_0Kernel(), 1, { x: new Uint8Array(x.buffer), blocks: 3 }, 96 * 4);
    expect([...out.subarray(0, 5)]).toEqual([127, -3, 4, 0, 0]);
    expect(out.subarray(32, 96).every(Number.isNaN)).toBe(true);
  });
  test("Q8_K: iscale = −127 / (first value of largest |x|), codes to nearest even, d = 1 / iscale; zero block 0", () => {
    const x = new Float32Array(512);
    // block 0: max −254 → iscale 0.5, d 2: 3 → 1.5 → 2 → 4; 5 → 2.5 → 2 → 4; 254 → 127 → 254; 7 → 3.5 → 4 → 8
    x.set([3, -254, 5, 254, 7]);
    const out = simulate(fakeQuantizeQ8_KKernel(), 1, { x: new Uint8Array(x.buffer), blocks: 2 }, 512 * 4);
    expect([...out.subarray(0, 6)]).toEqual([4, -254, 4, 254, 8, 0]);
    expect(out.subarray(256).every((v) => v === 0)).toBe(true);
  });
});

describe("GEMV sub-block decoders on the simulator (sm_86) against the element decoders", () => {
  // random code bytes with small binary16 scales (the d / m / dmin offsets of each block type); K = 9
  // blocks of 32 (one whole pass of the warp's 256 and one where 28 lanes skip) or 2 blocks of 256
  const SCALES: Record<BlockFormat, number[]> = {
    q8_0: [0],
    q4_0: [0],
    q4_1: [0, 2],
    q5_0: [0],
    q5_1: [0, 2],
    q2_k: [80, 82],
    q3_k: [108],
    q4_k: [0, 2],
    q5_k: [0, 2],
    q6_k: [208],
    iq4_nl: [0],
    iq4_xs: [0],
  };
  for (const f of GGUF_BLOCK_FORMATS) {
    test(`${f}: y = x · Wᵀ equals the f64 dot product of x with the embedding-decoded rows`, () => {
      const [N, M] = [5, 2];
      const K = BLOCKS[f].elems === 32 ? 288 : 512;
      let seed = 7 + f.length * 31 + f.charCodeAt(1);
      const u = () => {
        seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
        return seed / 2 ** 32;
      };
      const w = Uint8Array.from({ length: blockRowBytes(f, K) * N }, () => Math.floor(u() * 256));
      for (let at = 0; at < w.length; at += BLOCKS[f].bytes)
        for (const o of SCALES[f]) {
          // binary16 of ±(0.001 … 0.01): exponent 2^-10 … 2^-7, random mantissa
          const h =
            ((u() < 0.3 ? 0x8000 : 0) | ((5 + Math.floor(u() * 3)) << 10) | Math.floor(u() * 1024)) >>> 0;
          w[at + o] = h & 255;
          w[at + o + 1] = h >> 8;
        }
      const x = Float32Array.from({ length: M * K }, () => u() * 2 - 1);
      // the rows as the element decoders give them (checked by hand above): embedding of ids 0 … N − 1
      const table = simulate(
        embeddingKernel(f),
        Math.ceil((N * K) / 256),
        {
          table: w,
          ids: new Uint8Array(Int32Array.from({ length: N }, (_, i) => i).buffer),
          n: N * K,
          d: K,
          vocab: N,
        },
        N * K * 4,
      );
      const y = simulate(
        gemvKernel({ format: f, bias: false, scaled: false }),
        [Math.ceil(N / GEMV_WARPS), M],
        { x: new Uint8Array(x.buffer), w, m: M, n: N, k: K },
        M * N * 4,
      );
      for (let m = 0; m < M; m++)
        for (let n = 0; n < N; n++) {
          let ref = 0;
          let mag = 0;
          for (let k = 0; k < K; k++) {
            const p = (x[m * K + k] as number) * (table[n * K + k] as number);
            ref += p;
            mag += Math.abs(p);
          }
          // f32 products and sums over K terms: within K · 2^-24 of Σ|x·w|
          expect(Math.abs((y[m * N + n] as number) - ref)).toBeLessThanOrEqual(mag * K * 2 ** -24);
        }
    });
  }
});
