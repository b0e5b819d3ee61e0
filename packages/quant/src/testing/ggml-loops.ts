/**
 * TEST-ONLY second decoder for GGUF blocks that walks each block the way ggml's `dequantize_row_*`
 * loops do (pointers advanced per 32/64/128-element chunk, scales consumed in order, C `float`
 * arithmetic as `Math.fround`), rather than by the per-element index formulas of llm.md §2 that
 * `ggml-dequant.ts` uses. Agreement of the two on random blocks checks the index arithmetic.
 * Written from ggml/src/ggml-quants.c (ggml-org/llama.cpp) loop structure; not used by the package.
 */

import { decodeTable } from "@tp/tensor";

const f = Math.fround;
const K4 = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];
const h16 = (b: Uint8Array, o: number) =>
  decodeTable("f16")[(b[o] as number) | ((b[o + 1] as number) << 8)] as number;
const i8 = (x: number) => (x << 24) >> 24;

/** Decode `nb` blocks of `type` from `b` with ggml's loop structure. */
export function dequantizeLoops(type: string, b: Uint8Array, nb: number): Float32Array {
  const bs: Record<string, [number, number]> = {
    q4_0: [32, 18],
    q4_1: [32, 20],
    q5_0: [32, 22],
    q5_1: [32, 24],
    q8_0: [32, 34],
    iq4_nl: [32, 18],
    q2_k: [256, 84],
    q3_k: [256, 110],
    q4_k: [256, 144],
    q5_k: [256, 176],
    q6_k: [256, 210],
    q8_k: [256, 292],
    iq4_xs: [256, 136],
  };
  const [qk, bytes] = bs[type] as [number, number];
  const y = new Float32Array(nb * qk);
  for (let i = 0; i < nb; i++) {
    const x = b.subarray(i * bytes, (i + 1) * bytes);
    const Y = y.subarray(i * qk, (i + 1) * qk);
    DECODE[type]?.(x, Y);
  }
  return y;
}

function scaleMin(j: number, q: Uint8Array): [number, number] {
  if (j < 4) return [(q[j] as number) & 63, (q[j + 4] as number) & 63];
  return [
    ((q[j + 4] as number) & 0xf) | (((q[j - 4] as number) >> 6) << 4),
    ((q[j + 4] as number) >> 4) | (((q[j] as number) >> 6) << 4),
  ];
}

const DECODE: Record<string, (x: Uint8Array, y: Float32Array) => void> = {
  q4_0: (x, y) => {
    const d = h16(x, 0);
    for (let j = 0; j < 16; j++) {
      y[j] = (((x[2 + j] as number) & 0x0f) - 8) * d;
      y[j + 16] = (((x[2 + j] as number) >> 4) - 8) * d;
    }
  },
  q4_1: (x, y) => {
    const d = h16(x, 0);
    const m = h16(x, 2);
    for (let j = 0; j < 16; j++) {
      y[j] = f(((x[4 + j] as number) & 0x0f) * d) + m;
      y[j + 16] = f(((x[4 + j] as number) >> 4) * d) + m;
    }
  },
  q5_0: (x, y) => {
    const d = h16(x, 0);
    const qh = new DataView(x.buffer, x.byteOffset + 2, 4).getUint32(0, true);
    for (let j = 0; j < 16; j++) {
      const xh0 = ((qh >>> j) << 4) & 0x10;
      const xh1 = (qh >>> (j + 12)) & 0x10;
      y[j] = ((((x[6 + j] as number) & 0x0f) | xh0) - 16) * d;
      y[j + 16] = ((((x[6 + j] as number) >> 4) | xh1) - 16) * d;
    }
  },
  q5_1: (x, y) => {
    const d = h16(x, 0);
    const m = h16(x, 2);
    const qh = new DataView(x.buffer, x.byteOffset + 4, 4).getUint32(0, true);
    for (let j = 0; j < 16; j++) {
      const xh0 = ((qh >>> j) << 4) & 0x10;
      const xh1 = (qh >>> (j + 12)) & 0x10;
      y[j] = f((((x[8 + j] as number) & 0x0f) | xh0) * d) + m;
      y[j + 16] = f((((x[8 + j] as number) >> 4) | xh1) * d) + m;
    }
  },
  q8_0: (x, y) => {
    const d = h16(x, 0);
    for (let j = 0; j < 32; j++) y[j] = i8(x[2 + j] as number) * d;
  },
  iq4_nl: (x, y) => {
    const d = h16(x, 0);
    for (let j = 0; j < 16; j++) {
      y[j] = d * (K4[(x[2 + j] as number) & 0xf] as number);
      y[j + 16] = d * (K4[(x[2 + j] as number) >> 4] as number);
    }
  },
  q2_k: (x, y) => {
    const d = h16(x, 80);
    const min = h16(x, 82);
    let q = 16;
    let is = 0;
    let p = 0;
    for (let n = 0; n < 256; n += 128) {
      let shift = 0;
      for (let j = 0; j < 4; j++) {
        for (const half of [0, 16]) {
          const sc = x[is++] as number;
          const dl = f(d * (sc & 0xf));
          const ml = f(min * (sc >> 4));
          for (let l = 0; l < 16; l++) y[p++] = f(dl * (((x[q + l + half] as number) >> shift) & 3)) - ml;
        }
        shift += 2;
      }
      q += 32;
    }
  },
  q3_k: (x, y) => {
    const dAll = h16(x, 108);
    // Unpack the 12 scale bytes into 16 values with ggml's kmask1/kmask2 word shuffle.
    const aux = new Uint32Array(4);
    const sv = new DataView(x.buffer, x.byteOffset + 96, 12);
    aux[0] = sv.getUint32(0, true);
    aux[1] = sv.getUint32(4, true);
    aux[2] = sv.getUint32(8, true);
    const kmask1 = 0x03030303;
    const kmask2 = 0x0f0f0f0f;
    const tmp = aux[2] as number;
    aux[2] = (((aux[0] as number) >>> 4) & kmask2) | (((tmp >>> 4) & kmask1) << 4);
    aux[3] = (((aux[1] as number) >>> 4) & kmask2) | (((tmp >>> 6) & kmask1) << 4);
    aux[0] = ((aux[0] as number) & kmask2) | (((tmp >>> 0) & kmask1) << 4);
    aux[1] = ((aux[1] as number) & kmask2) | (((tmp >>> 2) & kmask1) << 4);
    const scales = new Int8Array(aux.buffer);
    let q = 32;
    let m = 1;
    let is = 0;
    let p = 0;
    for (let n = 0; n < 256; n += 128) {
      let shift = 0;
      for (let j = 0; j < 4; j++) {
        for (const half of [0, 16]) {
          const dl = f(dAll * ((scales[is++] as number) - 32));
          for (let l = 0; l < 16; l++) {
            const qv = ((x[q + l + half] as number) >> shift) & 3;
            y[p++] = dl * (qv - ((x[l + half] as number) & m ? 0 : 4));
          }
        }
        shift += 2;
        m <<= 1;
      }
      q += 32;
    }
  },
  q4_k: (x, y) => {
    const d = h16(x, 0);
    const min = h16(x, 2);
    const sc = x.subarray(4, 16);
    let q = 16;
    let is = 0;
    let p = 0;
    for (let j = 0; j < 256; j += 64) {
      const [s1, m1] = scaleMin(is, sc);
      const [s2, m2] = scaleMin(is + 1, sc);
      const d1 = f(d * s1);
      const mm1 = f(min * m1);
      const d2 = f(d * s2);
      const mm2 = f(min * m2);
      for (let l = 0; l < 32; l++) y[p++] = f(d1 * ((x[q + l] as number) & 0xf)) - mm1;
      for (let l = 0; l < 32; l++) y[p++] = f(d2 * ((x[q + l] as number) >> 4)) - mm2;
      q += 32;
      is += 2;
    }
  },
  q5_k: (x, y) => {
    const d = h16(x, 0);
    const min = h16(x, 2);
    const sc = x.subarray(4, 16);
    let ql = 48;
    let is = 0;
    let u1 = 1;
    let u2 = 2;
    let p = 0;
    for (let j = 0; j < 256; j += 64) {
      const [s1, m1] = scaleMin(is, sc);
      const [s2, m2] = scaleMin(is + 1, sc);
      const d1 = f(d * s1);
      const mm1 = f(min * m1);
      const d2 = f(d * s2);
      const mm2 = f(min * m2);
      for (let l = 0; l < 32; l++)
        y[p++] = f(d1 * (((x[ql + l] as number) & 0xf) + ((x[16 + l] as number) & u1 ? 16 : 0))) - mm1;
      for (let l = 0; l < 32; l++)
        y[p++] = f(d2 * (((x[ql + l] as number) >> 4) + ((x[16 + l] as number) & u2 ? 16 : 0))) - mm2;
      ql += 32;
      is += 2;
      u1 <<= 2;
      u2 <<= 2;
    }
  },
  q6_k: (x, y) => {
    const d = h16(x, 208);
    let ql = 0;
    let qh = 128;
    let sc = 192;
    for (let n = 0; n < 256; n += 128) {
      for (let l = 0; l < 32; l++) {
        const is = l >> 4;
        const L = (o: number) => x[ql + l + o] as number;
        const H = x[qh + l] as number;
        const q1 = ((L(0) & 0xf) | (((H >> 0) & 3) << 4)) - 32;
        const q2 = ((L(32) & 0xf) | (((H >> 2) & 3) << 4)) - 32;
        const q3 = ((L(0) >> 4) | (((H >> 4) & 3) << 4)) - 32;
        const q4 = ((L(32) >> 4) | (((H >> 6) & 3) << 4)) - 32;
        const S = (k: number) => i8(x[sc + is + k] as number);
        y[n + l] = f(d * S(0)) * q1;
        y[n + l + 32] = f(d * S(2)) * q2;
        y[n + l + 64] = f(d * S(4)) * q3;
        y[n + l + 96] = f(d * S(6)) * q4;
      }
      ql += 64;
      qh += 32;
      sc += 8;
    }
  },
  q8_k: (x, y) => {
    const d = new DataView(x.buffer, x.byteOffset, 4).getFloat32(0, true);
    for (let j = 0; j < 256; j++) y[j] = d * i8(x[4 + j] as number);
  },
  iq4_xs: (x, y) => {
    const d = h16(x, 0);
    const scalesH = (x[2] as number) | ((x[3] as number) << 8);
    let qs = 8;
    let p = 0;
    for (let ib = 0; ib < 8; ib++) {
      const ls =
        (((x[4 + (ib >> 1)] as number) >> (4 * (ib % 2))) & 0xf) | (((scalesH >> (2 * ib)) & 3) << 4);
      const dl = f(d * (ls - 32));
      for (let j = 0; j < 16; j++) {
        y[p + j] = dl * (K4[(x[qs + j] as number) & 0xf] as number);
        y[p + j + 16] = dl * (K4[(x[qs + j] as number) >> 4] as number);
      }
      p += 32;
      qs += 16;
    }
  },
};
