/**
 * Quantization to GGUF block types with llama.cpp's choices of scale — the reference (non-imatrix)
 * paths that `llama-quantize` uses when no importance matrix is given — so a file we write and one
 * llama.cpp writes decode alike. Each f32 operation of the C code is one `Math.fround` here, in the C
 * evaluation order, so the bytes equal ggml's on builds without FMA contraction (x86-64 `ggml-base`);
 * a compiler that fuses `a·b + c` into an FMA (aarch64 builds) can differ where a value sits exactly
 * on a rounding boundary.
 *
 * Weight types:
 * - Q8_0: per 32, `d = max|x| / 127`, `q = roundf(x · (1/d))` (ties away from zero).
 * - Q4_0: per 32, `d = max / −8` where `max` is the signed value of largest magnitude, so that value
 *   maps to code 0 (−8·d) exactly; `q = min(15, trunc(x · (1/d) + 8.5))`.
 * - Q4_K: per 256 = 8 sub-blocks of 32 with a 6-bit scale and a 6-bit min each, found by
 *   {@link makeQkx2Quants}: an asymmetric (scale, min) fit of 4-bit codes by weighted least squares,
 *   weights `w_i = rms(sub-block) + |x_i|`, searched over 21 candidate grids; then the 8 scales and 8
 *   mins are themselves quantized to 6 bits against the super-block maxima (`d = max_scale / 63`,
 *   `dmin = max_min / 63`) and the codes are recomputed against the quantized scales.
 * - Q6_K: per 256 = 16 sub-blocks of 16 with a signed 8-bit scale each, found by
 *   {@link makeQxQuants}: a symmetric 6-bit fit (−32..31) weighted by x², trying 19 grid scalings
 *   around `−32 / max` and keeping the least-squares optimum; the 16 scales are quantized to int8
 *   against `d = max_scale / −128` and the codes recomputed.
 *
 * - Q4_1 / Q5_1: per 32, `d = (max − min) / (2^b − 1)`, `m = min`, `q = min(2^b − 1, trunc((x − min)/d + ½))`;
 *   Q5_0: as Q4_0 with `d = max / −16` and 5-bit codes (the fifth bits in `qh`).
 * - Q5_K: as Q4_K with 5-bit codes ({@link makeQkx2Quants} with nmax 31, grid −0.5 + 0.1·is, 16 steps).
 * - Q2_K: per 256 = 16 sub-blocks of 16, {@link makeQkx2Quants} with nmax 3 weighted by |x| (mean absolute
 *   error), the 16 scales and mins quantized to 4 bits against the super-block maxima.
 * - Q3_K: per 256 = 16 sub-blocks of 16, a symmetric 3-bit fit ({@link makeQxQuants} with nmax 4,
 *   weights x²), the 16 scales quantized to signed 6 bits against `d = max_scale / −32`.
 * - IQ4_NL / IQ4_XS: codes index ggml's non-linear grid K4 (`kvalues_iq4nl`, llm.md §2.4); per 32
 *   the scale is the weighted (x²) least-squares optimum over 15 grid scalings around `max / K4[0]`
 *   (ggml `quantize_row_iq4_nl_impl`'s search); IQ4_XS then stores the 8 sub-block scales of a
 *   super-block as 6-bit `ls − 32` against `d = max_scale / −32`, and the codes are recomputed.
 *   These follow ggml's algorithms but are not checked byte for byte against `llama-quantize`: any
 *   valid blocks decode alike, which is all a reader needs.
 *
 * Activation types (what ggml quantizes the other operand of a dot product to; llm.md §2.6):
 * - Q8_0 (same as the weight quantizer), Q8_1 (Q8_0 plus `s = d · Σq`), Q8_K (per 256:
 *   `is = −127 / max`, `q = min(127, nearest(is · x))`, f32 `d = 1/is`, `bsums` per 16).
 *
 * Source: ggml-org/llama.cpp ggml/src/ggml-quants.c — `quantize_row_q8_0_ref`, `quantize_row_q8_1_ref`,
 * `quantize_row_q4_0_ref`, `quantize_row_q4_1_ref`, `quantize_row_q5_0_ref`, `quantize_row_q5_1_ref`,
 * `quantize_row_q2_K_ref`, `quantize_row_q3_K_ref`, `quantize_row_q5_K_ref`, `quantize_iq4_nl_impl`,
 * `quantize_row_q4_K_ref` + `make_qkx2_quants`, `quantize_row_q6_K_ref` +
 * `make_qx_quants` (rmse_type 1), `quantize_row_q8_K_ref`, `nearest_int`; `quantize_q4_K` /
 * `quantize_q6_K` call the `_ref` functions when `quant_weights` is NULL. The code below is written
 * from the published algorithm, not copied.
 */

import { decodeTable, f32ToF16, TpError, type WeightFormat, weightFormatInfo } from "@tp/tensor";
import { dequantizeGgml, KVALUES_IQ4NL } from "./ggml-dequant.ts";
import { ctx, type FloatInput, finiteF32 } from "./input.ts";
import { nearestInt, roundHalfAway } from "./rounding.ts";

const f32 = Math.fround;
/** ggml `GROUP_MAX_EPS` (1e-15f): below this max|x| a group is treated as all zero. */
const GROUP_MAX_EPS = f32(1e-15);

/** Formats {@link quantizeGgml} writes. */
export const GGML_QUANTIZE_FORMATS: readonly WeightFormat[] = [
  "q8_0",
  "q8_1",
  "q4_0",
  "q4_1",
  "q5_0",
  "q5_1",
  "q2_k",
  "q3_k",
  "q4_k",
  "q5_k",
  "q6_k",
  "q8_k",
  "iq4_nl",
  "iq4_xs",
];

/** binary16 `GGML_FP32_TO_FP16` (round to nearest even), and the value the block will hold. */
function viaF16(x: number): { bits: number; value: number } {
  const bits = f32ToF16(x);
  return { bits, value: decodeTable("f16")[bits] as number };
}
function putF16(out: Uint8Array, o: number, bits: number): void {
  out[o] = bits & 255;
  out[o + 1] = bits >> 8;
}

/** Absolute maximum and the signed value that attains it first (ggml's `amax` / `max` loop). */
function signedAbsMax(x: Float32Array, o: number, n: number): { amax: number; max: number } {
  let amax = 0;
  let max = 0;
  for (let i = 0; i < n; i++) {
    const v = x[o + i] as number;
    if (Math.abs(v) > amax) {
      amax = Math.abs(v);
      max = v;
    }
  }
  return { amax, max };
}

function quantizeQ8_0(x: Float32Array, out: Uint8Array, withSum: boolean): void {
  const bb = withSum ? 36 : 34;
  for (let blk = 0; blk * 32 < x.length; blk++) {
    const o = blk * 32;
    let amax = 0;
    for (let j = 0; j < 32; j++) amax = Math.max(amax, Math.abs(x[o + j] as number));
    const d = f32(amax / 127);
    const id = d !== 0 ? f32(1 / d) : 0;
    const ob = blk * bb;
    putF16(out, ob, f32ToF16(d));
    let sum = 0;
    for (let j = 0; j < 32; j++) {
      const q = roundHalfAway(f32((x[o + j] as number) * id));
      out[ob + bb - 32 + j] = q & 255;
      sum += q;
    }
    if (withSum) putF16(out, ob + 2, f32ToF16(f32(sum * d)));
  }
}

function quantizeQ4_0(x: Float32Array, out: Uint8Array): void {
  for (let blk = 0; blk * 32 < x.length; blk++) {
    const o = blk * 32;
    const { max } = signedAbsMax(x, o, 32);
    const d = f32(max / -8);
    const id = d !== 0 ? f32(1 / d) : 0;
    const ob = blk * 18;
    putF16(out, ob, f32ToF16(d));
    for (let j = 0; j < 16; j++) {
      const x0 = f32((x[o + j] as number) * id);
      const x1 = f32((x[o + 16 + j] as number) * id);
      const q0 = Math.min(15, Math.trunc(f32(x0 + 8.5)));
      const q1 = Math.min(15, Math.trunc(f32(x1 + 8.5)));
      out[ob + 2 + j] = q0 | (q1 << 4);
    }
  }
}

/**
 * ggml `make_qkx2_quants`: fit `x ≈ scale · L − min` with codes L in 0..nmax (min ≥ 0 returned as
 * `the_min`), minimizing Σ w·(scale·L − min − x)² (or Σ w·|…| with `useMad`). Start from the plain
 * grid `(max − min)/nmax` with min = min(0, min x); then for is = 0..nstep re-round x on the grid
 * `(rmin + rdelta·is + nmax)/(max − min)` and solve the weighted 2×2 least-squares problem for
 * (scale, min) given those codes (clamping min to ≤ 0); keep the candidate with the smallest error.
 * @param n       values in the group (32 for Q4_K)
 * @param nmax    largest code (15 for Q4_K)
 * @param x       values; the group is `x[xo .. xo + n)`
 * @param xo      offset of the group in `x`
 * @param weights per-value weights [n]
 * @param L       code output; written at `L[lo .. lo + n)`
 * @param lo      offset in `L`
 * @param rmin    first grid offset (−1 for Q4_K)
 * @param rdelta  grid step (0.1f for Q4_K)
 * @param nstep   number of grid steps after the first (20 for Q4_K)
 * @param useMad  minimize Σ w·|err| instead of Σ w·err²
 * @returns `{ scale, min }` with `min` = ggml's `*the_min` (non-negative)
 */
export function makeQkx2Quants(
  n: number,
  nmax: number,
  x: Float32Array,
  xo: number,
  weights: Float32Array,
  L: Uint8Array,
  lo: number,
  rmin: number,
  rdelta: number,
  nstep: number,
  useMad: boolean,
): { scale: number; min: number } {
  const X = (i: number) => x[xo + i] as number;
  const W = (i: number) => weights[i] as number;
  let min = X(0);
  let max = X(0);
  let sumW = W(0);
  let sumX = f32(sumW * X(0));
  for (let i = 1; i < n; i++) {
    if (X(i) < min) min = X(i);
    if (X(i) > max) max = X(i);
    sumW = f32(sumW + W(i));
    sumX = f32(sumX + f32(W(i) * X(i)));
  }
  if (min > 0) min = 0;
  if (max === min) {
    for (let i = 0; i < n; i++) L[lo + i] = 0;
    return { scale: 0, min: -min };
  }
  // Note: `min` is updated by better candidates below and later grids use the updated value, as in ggml.
  let iscale = f32(nmax / f32(max - min));
  let scale = f32(1 / iscale);
  let bestError = 0;
  for (let i = 0; i < n; i++) {
    const l = Math.max(0, Math.min(nmax, nearestInt(f32(iscale * f32(X(i) - min)))));
    L[lo + i] = l;
    let diff = f32(f32(f32(scale * l) + min) - X(i));
    diff = useMad ? Math.abs(diff) : f32(diff * diff);
    bestError = f32(bestError + f32(W(i) * diff));
  }
  if (nstep < 1) return { scale, min: -min };
  const laux = new Uint8Array(n);
  for (let is = 0; is <= nstep; is++) {
    iscale = f32(f32(f32(rmin + f32(rdelta * is)) + nmax) / f32(max - min));
    let sumL = 0;
    let sumL2 = 0;
    let sumXL = 0;
    for (let i = 0; i < n; i++) {
      const l = Math.max(0, Math.min(nmax, nearestInt(f32(iscale * f32(X(i) - min)))));
      laux[i] = l;
      const wl = f32(W(i) * l);
      sumL = f32(sumL + wl);
      sumL2 = f32(sumL2 + f32(wl * l));
      sumXL = f32(sumXL + f32(wl * X(i)));
    }
    const D = f32(f32(sumW * sumL2) - f32(sumL * sumL));
    if (D > 0) {
      let thisScale = f32(f32(f32(sumW * sumXL) - f32(sumX * sumL)) / D);
      let thisMin = f32(f32(f32(sumL2 * sumX) - f32(sumL * sumXL)) / D);
      if (thisMin > 0) {
        thisMin = 0;
        thisScale = f32(sumXL / sumL2);
      }
      let curError = 0;
      for (let i = 0; i < n; i++) {
        let diff = f32(f32(f32(thisScale * (laux[i] as number)) + thisMin) - X(i));
        diff = useMad ? Math.abs(diff) : f32(diff * diff);
        curError = f32(curError + f32(W(i) * diff));
      }
      if (curError < bestError) {
        for (let i = 0; i < n; i++) L[lo + i] = laux[i] as number;
        bestError = curError;
        scale = thisScale;
        min = thisMin;
      }
    }
  }
  return { scale, min: -min };
}

/**
 * ggml `make_qx_quants` with `rmse_type = 1` and no importance weights (the path `quantize_row_q6_K_ref`
 * takes): symmetric codes l in −nmax..nmax−1 (stored as l + nmax), weights w = x². Start from
 * `iscale = −nmax / max` (max = the signed value of largest magnitude) and take the least-squares
 * scale Σwxl / Σwl²; then try `iscale = −(nmax + 0.1·is) / max` for is = ±1..±9 and keep a candidate
 * when it explains more of the data (`(Σwxl)² / Σwl²` larger).
 * @param n    values in the group (16 for Q6_K)
 * @param nmax code bound (32 for Q6_K: codes −32..31)
 * @param x    values; the group is `x[xo .. xo + n)`
 * @param xo   offset of the group in `x`
 * @param L    code output (offset by nmax), written at `L[lo .. lo + n)`
 * @param lo   offset in `L`
 * @returns the scale; its sign is opposite to the largest-magnitude value (codes come from −nmax / max)
 */
export function makeQxQuants(
  n: number,
  nmax: number,
  x: Float32Array,
  xo: number,
  L: Uint8Array,
  lo: number,
): number {
  const X = (i: number) => x[xo + i] as number;
  let max = 0;
  let amax = 0;
  for (let i = 0; i < n; i++) {
    const ax = Math.abs(X(i));
    if (ax > amax) {
      amax = ax;
      max = X(i);
    }
  }
  if (amax < GROUP_MAX_EPS) {
    for (let i = 0; i < n; i++) L[lo + i] = 0;
    return 0;
  }
  const sums = (iscale: number, store: boolean): [number, number] => {
    let sumlx = 0;
    let suml2 = 0;
    for (let i = 0; i < n; i++) {
      const l = Math.max(-nmax, Math.min(nmax - 1, nearestInt(f32(iscale * X(i)))));
      if (store) L[lo + i] = l + nmax;
      const w = f32(X(i) * X(i));
      sumlx = f32(sumlx + f32(f32(w * X(i)) * l));
      suml2 = f32(suml2 + f32(f32(w * l) * l));
    }
    return [sumlx, suml2];
  };
  let [sumlx, suml2] = sums(f32(-nmax / max), true);
  let scale = suml2 !== 0 ? f32(sumlx / suml2) : 0;
  let best = f32(scale * sumlx);
  for (let is = -9; is <= 9; is++) {
    if (is === 0) continue;
    const iscale = f32(-f32(nmax + f32(f32(0.1) * is)) / max);
    [sumlx, suml2] = sums(iscale, false);
    if (suml2 > 0 && f32(sumlx * sumlx) > f32(best * suml2)) {
      sums(iscale, true);
      scale = f32(sumlx / suml2);
      best = f32(scale * sumlx);
    }
  }
  return scale;
}

function quantizeQ4_K(x: Float32Array, out: Uint8Array): void {
  const L = new Uint8Array(256);
  const weights = new Float32Array(32);
  const scales = new Float32Array(8);
  const mins = new Float32Array(8);
  for (let blk = 0; blk * 256 < x.length; blk++) {
    const o = blk * 256;
    const ob = blk * 144;
    let maxScale = 0;
    let maxMin = 0;
    for (let j = 0; j < 8; j++) {
      let sumX2 = 0;
      for (let l = 0; l < 32; l++) {
        const v = x[o + 32 * j + l] as number;
        sumX2 = f32(sumX2 + f32(v * v));
      }
      const avX = f32(Math.sqrt(f32(sumX2 / 32)));
      for (let l = 0; l < 32; l++) weights[l] = f32(avX + Math.abs(x[o + 32 * j + l] as number));
      const r = makeQkx2Quants(32, 15, x, o + 32 * j, weights, L, 32 * j, -1, f32(0.1), 20, false);
      scales[j] = r.scale;
      mins[j] = r.min;
      if (r.scale > maxScale) maxScale = r.scale;
      if (r.min > maxMin) maxMin = r.min;
    }
    const invScale = maxScale > 0 ? f32(63 / maxScale) : 0;
    const invMin = maxMin > 0 ? f32(63 / maxMin) : 0;
    const S = out.subarray(ob + 4, ob + 16);
    for (let j = 0; j < 8; j++) {
      // `uint8_t ls = nearest_int(...)` keeps the low 8 bits, then MIN(63, ·).
      const ls = Math.min(63, nearestInt(f32(invScale * (scales[j] as number))) & 255);
      const lm = Math.min(63, nearestInt(f32(invMin * (mins[j] as number))) & 255);
      if (j < 4) {
        S[j] = ls;
        S[j + 4] = lm;
      } else {
        S[j + 4] = (ls & 15) | ((lm & 15) << 4);
        S[j - 4] = (S[j - 4] as number) | ((ls >> 4) << 6);
        S[j] = (S[j] as number) | ((lm >> 4) << 6);
      }
    }
    const d = viaF16(f32(maxScale / 63));
    const dmin = viaF16(f32(maxMin / 63));
    putF16(out, ob, d.bits);
    putF16(out, ob + 2, dmin.bits);
    for (let j = 0; j < 8; j++) {
      const [sc, m] = scaleMinFromPacked(S, j);
      const dj = f32(d.value * sc);
      if (dj === 0) continue;
      const dm = f32(dmin.value * m);
      for (let ii = 0; ii < 32; ii++) {
        const l = nearestInt(f32(f32((x[o + 32 * j + ii] as number) + dm) / dj));
        L[32 * j + ii] = Math.max(0, Math.min(15, l));
      }
    }
    for (let c = 0; c < 4; c++) {
      for (let l = 0; l < 32; l++)
        out[ob + 16 + 32 * c + l] = (L[64 * c + l] as number) | ((L[64 * c + 32 + l] as number) << 4);
    }
  }
}

function scaleMinFromPacked(S: Uint8Array, k: number): [number, number] {
  const s = (i: number) => S[i] as number;
  if (k < 4) return [s(k) & 63, s(k + 4) & 63];
  return [(s(k + 4) & 15) | ((s(k - 4) >> 6) << 4), (s(k + 4) >> 4) | ((s(k) >> 6) << 4)];
}

function quantizeQ6_K(x: Float32Array, out: Uint8Array): void {
  const L = new Uint8Array(256);
  const scales = new Float32Array(16);
  for (let blk = 0; blk * 256 < x.length; blk++) {
    const o = blk * 256;
    const ob = blk * 210;
    let maxScale = 0;
    let maxAbsScale = 0;
    for (let ib = 0; ib < 16; ib++) {
      const s = makeQxQuants(16, 32, x, o + 16 * ib, L, 16 * ib);
      scales[ib] = s;
      if (Math.abs(s) > maxAbsScale) {
        maxAbsScale = Math.abs(s);
        maxScale = s;
      }
    }
    if (maxAbsScale < GROUP_MAX_EPS) continue; // the whole block stays zero (d = 0)
    const iscale = f32(-128 / maxScale);
    const d = viaF16(f32(1 / iscale));
    putF16(out, ob + 208, d.bits);
    const sc = new Int8Array(out.buffer, out.byteOffset + ob + 192, 16);
    for (let ib = 0; ib < 16; ib++) sc[ib] = Math.min(127, nearestInt(f32(iscale * (scales[ib] as number))));
    for (let j = 0; j < 16; j++) {
      const dj = f32(d.value * (sc[j] as number));
      if (dj === 0) continue;
      for (let ii = 0; ii < 16; ii++) {
        const l = nearestInt(f32((x[o + 16 * j + ii] as number) / dj));
        L[16 * j + ii] = Math.max(-32, Math.min(31, l)) + 32;
      }
    }
    for (let half = 0; half < 2; half++) {
      const ql = ob + 64 * half;
      const qh = ob + 128 + 32 * half;
      const Lh = (i: number) => L[128 * half + i] as number;
      for (let l = 0; l < 32; l++) {
        out[ql + l] = (Lh(l) & 15) | ((Lh(l + 64) & 15) << 4);
        out[ql + l + 32] = (Lh(l + 32) & 15) | ((Lh(l + 96) & 15) << 4);
        out[qh + l] =
          (Lh(l) >> 4) | ((Lh(l + 32) >> 4) << 2) | ((Lh(l + 64) >> 4) << 4) | ((Lh(l + 96) >> 4) << 6);
      }
    }
  }
}

function quantizeQ8_K(x: Float32Array, out: Uint8Array): void {
  const dv = new DataView(out.buffer, out.byteOffset, out.byteLength);
  for (let blk = 0; blk * 256 < x.length; blk++) {
    const o = blk * 256;
    const ob = blk * 292;
    const { amax, max } = signedAbsMax(x, o, 256);
    if (amax === 0) continue; // d = 0, codes and bsums 0
    const iscale = f32(-127 / max);
    for (let j = 0; j < 256; j++) {
      const q = Math.min(127, nearestInt(f32(iscale * (x[o + j] as number))));
      out[ob + 4 + j] = q & 255;
    }
    const qs = new Int8Array(out.buffer, out.byteOffset + ob + 4, 256);
    for (let g = 0; g < 16; g++) {
      let sum = 0;
      for (let i = 0; i < 16; i++) sum += qs[16 * g + i] as number;
      dv.setInt16(ob + 260 + 2 * g, sum, true);
    }
    dv.setFloat32(ob, f32(1 / iscale), true);
  }
}

/** Q4_1 (bits 4) / Q5_1 (bits 5): per 32, codes on the grid from the block minimum to its maximum. */
function quantizeQx_1(x: Float32Array, out: Uint8Array, bits: 4 | 5): void {
  const nmax = (1 << bits) - 1;
  const bb = bits === 4 ? 20 : 24;
  const qs = bits === 4 ? 4 : 8;
  for (let blk = 0; blk * 32 < x.length; blk++) {
    const o = blk * 32;
    let min = Number.POSITIVE_INFINITY;
    let max = Number.NEGATIVE_INFINITY;
    for (let j = 0; j < 32; j++) {
      const v = x[o + j] as number;
      if (v < min) min = v;
      if (v > max) max = v;
    }
    const d = f32(f32(max - min) / nmax);
    const id = d !== 0 ? f32(1 / d) : 0;
    const ob = blk * bb;
    putF16(out, ob, f32ToF16(d));
    putF16(out, ob + 2, f32ToF16(min));
    let qh = 0;
    for (let j = 0; j < 16; j++) {
      const q0 = Math.min(nmax, Math.trunc(f32(f32(f32((x[o + j] as number) - min) * id) + 0.5)));
      const q1 = Math.min(nmax, Math.trunc(f32(f32(f32((x[o + 16 + j] as number) - min) * id) + 0.5)));
      out[ob + qs + j] = (q0 & 15) | ((q1 & 15) << 4);
      qh |= ((q0 >> 4) << j) | ((q1 >> 4) << (j + 16));
    }
    if (bits === 5) new DataView(out.buffer, out.byteOffset + ob + 4, 4).setUint32(0, qh >>> 0, true);
  }
}

/** Q5_0: as Q4_0 with `d = max / −16`, codes 0..31 (fifth bits in the u32 `qh`). */
function quantizeQ5_0(x: Float32Array, out: Uint8Array): void {
  for (let blk = 0; blk * 32 < x.length; blk++) {
    const o = blk * 32;
    const { max } = signedAbsMax(x, o, 32);
    const d = f32(max / -16);
    const id = d !== 0 ? f32(1 / d) : 0;
    const ob = blk * 22;
    putF16(out, ob, f32ToF16(d));
    let qh = 0;
    for (let j = 0; j < 16; j++) {
      const q0 = Math.min(31, Math.trunc(f32(f32((x[o + j] as number) * id) + 16.5)));
      const q1 = Math.min(31, Math.trunc(f32(f32((x[o + 16 + j] as number) * id) + 16.5)));
      out[ob + 6 + j] = (q0 & 15) | ((q1 & 15) << 4);
      qh |= ((q0 >> 4) << j) | ((q1 >> 4) << (j + 16));
    }
    new DataView(out.buffer, out.byteOffset + ob + 2, 4).setUint32(0, qh >>> 0, true);
  }
}

/** Pack 8 six-bit scales and mins into the 12 bytes of Q4_K / Q5_K (ggml get_scale_min_k4's inverse). */
function packScaleMinK4(S: Uint8Array, ls: readonly number[], lm: readonly number[]): void {
  for (let j = 0; j < 8; j++) {
    const a = ls[j] as number;
    const m = lm[j] as number;
    if (j < 4) {
      S[j] = a;
      S[j + 4] = m;
    } else {
      S[j + 4] = (a & 15) | ((m & 15) << 4);
      S[j - 4] = (S[j - 4] as number) | ((a >> 4) << 6);
      S[j] = (S[j] as number) | ((m >> 4) << 6);
    }
  }
}

/** Q5_K: Q4_K's scheme with 5-bit codes (the fifth bits in `qh[32]`, bit j for sub-block j). */
function quantizeQ5_K(x: Float32Array, out: Uint8Array): void {
  const L = new Uint8Array(256);
  const weights = new Float32Array(32);
  const scales = new Float32Array(8);
  const mins = new Float32Array(8);
  for (let blk = 0; blk * 256 < x.length; blk++) {
    const o = blk * 256;
    const ob = blk * 176;
    let maxScale = 0;
    let maxMin = 0;
    for (let j = 0; j < 8; j++) {
      let sumX2 = 0;
      for (let l = 0; l < 32; l++) sumX2 = f32(sumX2 + f32((x[o + 32 * j + l] as number) ** 2));
      const avX = f32(Math.sqrt(f32(sumX2 / 32)));
      for (let l = 0; l < 32; l++) weights[l] = f32(avX + Math.abs(x[o + 32 * j + l] as number));
      const r = makeQkx2Quants(32, 31, x, o + 32 * j, weights, L, 32 * j, f32(-0.5), f32(0.1), 15, false);
      scales[j] = r.scale;
      mins[j] = r.min;
      if (r.scale > maxScale) maxScale = r.scale;
      if (r.min > maxMin) maxMin = r.min;
    }
    const invScale = maxScale > 0 ? f32(63 / maxScale) : 0;
    const invMin = maxMin > 0 ? f32(63 / maxMin) : 0;
    const ls = Array.from(scales, (v) => Math.min(63, nearestInt(f32(invScale * v)) & 255));
    const lm = Array.from(mins, (v) => Math.min(63, nearestInt(f32(invMin * v)) & 255));
    const S = out.subarray(ob + 4, ob + 16);
    packScaleMinK4(S, ls, lm);
    const d = viaF16(f32(maxScale / 63));
    const dmin = viaF16(f32(maxMin / 63));
    putF16(out, ob, d.bits);
    putF16(out, ob + 2, dmin.bits);
    for (let j = 0; j < 8; j++) {
      const [sc, m] = scaleMinFromPacked(S, j);
      const dj = f32(d.value * sc);
      if (dj === 0) continue;
      const dm = f32(dmin.value * m);
      for (let ii = 0; ii < 32; ii++) {
        const l = nearestInt(f32(f32((x[o + 32 * j + ii] as number) + dm) / dj));
        L[32 * j + ii] = Math.max(0, Math.min(31, l));
      }
    }
    for (let c = 0; c < 4; c++) {
      for (let l = 0; l < 32; l++) {
        const l1 = L[64 * c + l] as number;
        const l2 = L[64 * c + 32 + l] as number;
        out[ob + 48 + 32 * c + l] = (l1 & 15) | ((l2 & 15) << 4);
        out[ob + 16 + l] = (out[ob + 16 + l] as number) | ((l1 >> 4) << (2 * c)) | ((l2 >> 4) << (2 * c + 1));
      }
    }
  }
}

/** The 2-bit code bytes of Q2_K / Q3_K: byte 32h + l holds codes 128h + l + 32j at bits 2j. */
function pack2bit(L: Uint8Array, out: Uint8Array, at: number): void {
  for (let h = 0; h < 2; h++) {
    for (let l = 0; l < 32; l++) {
      const c = (j: number) => (L[128 * h + 32 * j + l] as number) & 3;
      out[at + 32 * h + l] = c(0) | (c(1) << 2) | (c(2) << 4) | (c(3) << 6);
    }
  }
}

/** Q2_K: 16 sub-blocks of 16 with 4-bit scales and mins ({@link makeQkx2Quants}, nmax 3, |x| weights). */
function quantizeQ2_K(x: Float32Array, out: Uint8Array): void {
  const L = new Uint8Array(256);
  const weights = new Float32Array(16);
  const scales = new Float32Array(16);
  const mins = new Float32Array(16);
  for (let blk = 0; blk * 256 < x.length; blk++) {
    const o = blk * 256;
    const ob = blk * 84;
    let maxScale = 0;
    let maxMin = 0;
    for (let j = 0; j < 16; j++) {
      for (let l = 0; l < 16; l++) weights[l] = Math.abs(x[o + 16 * j + l] as number);
      const r = makeQkx2Quants(16, 3, x, o + 16 * j, weights, L, 16 * j, f32(-0.5), f32(0.1), 15, true);
      scales[j] = r.scale;
      mins[j] = r.min;
      if (r.scale > maxScale) maxScale = r.scale;
      if (r.min > maxMin) maxMin = r.min;
    }
    const iscale = maxScale > 0 ? f32(15 / maxScale) : 0;
    const imin = maxMin > 0 ? f32(15 / maxMin) : 0;
    for (let j = 0; j < 16; j++) {
      const ls = Math.min(15, nearestInt(f32(iscale * (scales[j] as number))));
      const lm = Math.min(15, nearestInt(f32(imin * (mins[j] as number))));
      out[ob + j] = ls | (lm << 4);
    }
    const d = viaF16(maxScale > 0 ? f32(maxScale / 15) : 0);
    const dmin = viaF16(maxMin > 0 ? f32(maxMin / 15) : 0);
    putF16(out, ob + 80, d.bits);
    putF16(out, ob + 82, dmin.bits);
    for (let j = 0; j < 16; j++) {
      const sc = out[ob + j] as number;
      const dl = f32(d.value * (sc & 15));
      if (dl === 0) continue;
      const dm = f32(dmin.value * (sc >> 4));
      for (let ii = 0; ii < 16; ii++) {
        const l = nearestInt(f32(f32((x[o + 16 * j + ii] as number) + dm) / dl));
        L[16 * j + ii] = Math.max(0, Math.min(3, l));
      }
    }
    pack2bit(L, out, ob + 16);
  }
}

/** Q3_K: 16 sub-blocks of 16, symmetric 3-bit codes, signed 6-bit scales; hmask holds code bit 2. */
function quantizeQ3_K(x: Float32Array, out: Uint8Array): void {
  const L = new Uint8Array(256);
  const scales = new Float32Array(16);
  for (let blk = 0; blk * 256 < x.length; blk++) {
    const o = blk * 256;
    const ob = blk * 110;
    let maxScale = 0;
    let amax = 0;
    for (let j = 0; j < 16; j++) {
      const s = makeQxQuants(16, 4, x, o + 16 * j, L, 16 * j);
      scales[j] = s;
      if (Math.abs(s) > amax) {
        amax = Math.abs(s);
        maxScale = s;
      }
    }
    L.fill(4); // code 0 where the block stays zero
    if (amax >= GROUP_MAX_EPS) {
      const iscale = f32(-32 / maxScale);
      const S = out.subarray(ob + 96, ob + 108);
      for (let j = 0; j < 16; j++) {
        const l = Math.max(-32, Math.min(31, nearestInt(f32(iscale * (scales[j] as number))))) + 32;
        if (j < 8) S[j] = l & 15;
        else S[j - 8] = (S[j - 8] as number) | ((l & 15) << 4);
        S[8 + (j & 3)] = (S[8 + (j & 3)] as number) | ((l >> 4) << (2 * (j >> 2)));
      }
      const d = viaF16(f32(1 / iscale));
      putF16(out, ob + 108, d.bits);
      for (let j = 0; j < 16; j++) {
        const low = j < 8 ? (S[j] as number) & 15 : (S[j - 8] as number) >> 4;
        const high = ((S[8 + (j & 3)] as number) >> (2 * (j >> 2))) & 3;
        const dl = f32(d.value * ((low | (high << 4)) - 32));
        if (dl === 0) continue;
        for (let ii = 0; ii < 16; ii++) {
          const l = nearestInt(f32((x[o + 16 * j + ii] as number) / dl));
          L[16 * j + ii] = Math.max(-4, Math.min(3, l)) + 4;
        }
      }
    }
    for (let j = 0; j < 256; j++) {
      if ((L[j] as number) > 3) {
        out[ob + (j & 31)] = (out[ob + (j & 31)] as number) | (1 << (j >> 5));
        L[j] = (L[j] as number) - 4;
      }
    }
    pack2bit(L, out, ob + 32);
  }
}

/** Index of the K4 grid value nearest to v (the lower one on a tie). */
function nearestK4(v: number): number {
  let best = 0;
  let bestErr = Math.abs(v - (KVALUES_IQ4NL[0] as number));
  for (let i = 1; i < 16; i++) {
    const e = Math.abs(v - (KVALUES_IQ4NL[i] as number));
    if (e < bestErr) {
      bestErr = e;
      best = i;
    }
  }
  return best;
}

/**
 * The IQ4 scale of the 32 values x[o ..]: weighted (w = x²) least squares over the K4 codes chosen on
 * the grids `id = (t + K4[0]) / max`, t = −7..7, starting from `d = max / K4[0]` (ggml
 * quantize_iq4_nl_impl, ntry 7). Returns 0 for an all-zero group.
 */
function iq4Scale(x: Float32Array, o: number): number {
  const { amax, max } = signedAbsMax(x, o, 32);
  if (amax < GROUP_MAX_EPS) return 0;
  const k0 = KVALUES_IQ4NL[0] as number;
  const fit = (id: number): [number, number] => {
    let sumqx = 0;
    let sumq2 = 0;
    for (let j = 0; j < 32; j++) {
      const v = x[o + j] as number;
      const q = KVALUES_IQ4NL[nearestK4(f32(id * v))] as number;
      const w = f32(v * v);
      sumqx = f32(sumqx + f32(f32(w * q) * v));
      sumq2 = f32(sumq2 + f32(f32(w * q) * q));
    }
    return [sumqx, sumq2];
  };
  let [sumqx, sumq2] = fit(f32(k0 / max));
  let d = sumq2 > 0 ? f32(sumqx / sumq2) : f32(max / k0);
  let best = f32(d * sumqx);
  for (let t = -7; t <= 7; t++) {
    [sumqx, sumq2] = fit(f32((t + k0) / max));
    if (sumq2 > 0 && f32(sumqx * sumqx) > f32(best * sumq2)) {
      d = f32(sumqx / sumq2);
      best = f32(d * sumqx);
    }
  }
  return d;
}

/** The nibbles of 32 IQ4 codes for values x[o ..] on scale dl (low nibbles: elements 0..15). */
function putIq4Codes(x: Float32Array, o: number, dl: number, out: Uint8Array, at: number): void {
  const id = dl !== 0 ? f32(1 / dl) : 0;
  for (let j = 0; j < 16; j++) {
    out[at + j] =
      nearestK4(f32(id * (x[o + j] as number))) | (nearestK4(f32(id * (x[o + 16 + j] as number))) << 4);
  }
}

function quantizeIq4Nl(x: Float32Array, out: Uint8Array): void {
  for (let blk = 0; blk * 32 < x.length; blk++) {
    const d = viaF16(iq4Scale(x, blk * 32));
    putF16(out, blk * 18, d.bits);
    putIq4Codes(x, blk * 32, d.value, out, blk * 18 + 2);
  }
}

function quantizeIq4Xs(x: Float32Array, out: Uint8Array): void {
  const scales = new Float32Array(8);
  for (let blk = 0; blk * 256 < x.length; blk++) {
    const o = blk * 256;
    const ob = blk * 136;
    let maxScale = 0;
    let amax = 0;
    for (let ib = 0; ib < 8; ib++) {
      const s = iq4Scale(x, o + 32 * ib);
      scales[ib] = s;
      if (Math.abs(s) > amax) {
        amax = Math.abs(s);
        maxScale = s;
      }
    }
    const d = viaF16(amax > 0 ? f32(maxScale / -32) : 0);
    const id = d.value !== 0 ? f32(1 / d.value) : 0;
    putF16(out, ob, d.bits);
    let scalesH = 0;
    for (let ib = 0; ib < 8; ib++) {
      const l = Math.max(-32, Math.min(31, nearestInt(f32(id * (scales[ib] as number)))));
      const ls = l + 32;
      out[ob + 4 + (ib >> 1)] = (out[ob + 4 + (ib >> 1)] as number) | ((ls & 15) << (4 * (ib & 1)));
      scalesH |= (ls >> 4) << (2 * ib);
      putIq4Codes(x, o + 32 * ib, f32(d.value * l), out, ob + 8 + 16 * ib);
    }
    out[ob + 2] = scalesH & 255;
    out[ob + 3] = scalesH >> 8;
  }
}

/**
 * Quantize `count` values to a GGUF block type with llama.cpp's reference choices (module comment).
 * @param format one of {@link GGML_QUANTIZE_FORMATS}
 * @param input  f32 values, or f16 / bf16 / f32 bytes (widened exactly); a multiple of the block size
 *   (32, or 256 for k-quants). Rows are independent blocks, so a [N, K] matrix is quantized as N·K
 *   values when K is a multiple of the block size.
 * @param count  number of values
 * @param name   tensor name, for errors
 * @returns the block bytes, `count / blockElems · blockBytes` long
 * @throws TpError E_UNSUPPORTED for another type (naming it and listing the supported ones);
 *   E_SHAPE when `count` is not whole blocks; E_NUMERIC for a NaN or ±∞ value — naming the tensor.
 */
export function quantizeGgml(
  format: WeightFormat,
  input: FloatInput,
  count: number,
  name?: string,
): Uint8Array {
  const info = weightFormatInfo(format);
  if (!GGML_QUANTIZE_FORMATS.includes(format)) {
    throw new TpError(
      "E_UNSUPPORTED",
      `quantizing to ${info.ggufName ?? format} is not supported; supported: ${GGML_QUANTIZE_FORMATS.map((f) => weightFormatInfo(f).ggufName).join(", ")}`,
      ctx(name),
    );
  }
  if (!Number.isSafeInteger(count) || count < 0 || count % info.blockElems !== 0) {
    throw new TpError(
      "E_SHAPE",
      `${count} values are not whole ${info.ggufName} blocks of ${info.blockElems}`,
      ctx(name),
    );
  }
  return encodeGgml(format, finiteF32(input, count, name));
}

/** The blocks of `x` in `format` (checked by the callers: a quantizable format, whole blocks). */
function encodeGgml(format: WeightFormat, x: Float32Array): Uint8Array {
  const info = weightFormatInfo(format);
  const out = new Uint8Array((x.length / info.blockElems) * info.blockBytes);
  if (format === "q8_0") quantizeQ8_0(x, out, false);
  else if (format === "q8_1") quantizeQ8_0(x, out, true);
  else if (format === "q4_0") quantizeQ4_0(x, out);
  else if (format === "q4_1") quantizeQx_1(x, out, 4);
  else if (format === "q5_0") quantizeQ5_0(x, out);
  else if (format === "q5_1") quantizeQx_1(x, out, 5);
  else if (format === "q2_k") quantizeQ2_K(x, out);
  else if (format === "q3_k") quantizeQ3_K(x, out);
  else if (format === "q4_k") quantizeQ4_K(x, out);
  else if (format === "q5_k") quantizeQ5_K(x, out);
  else if (format === "iq4_nl") quantizeIq4Nl(x, out);
  else if (format === "iq4_xs") quantizeIq4Xs(x, out);
  else if (format === "q6_k") quantizeQ6_K(x, out);
  else quantizeQ8_K(x, out);
  return out;
}

/**
 * Quantize an activation row the way ggml's CPU backend does before a quantized dot product
 * (llm.md §2.6; ggml `vec_dot_type`): Q8_0 for Q4_0 / Q5_0 / Q8_0 / IQ4_NL weights, Q8_1 for Q4_1 /
 * Q5_1, Q8_K for the k-quants and IQ4_XS.
 * @param weightFormat the weight's block type
 * @param x            activations (f32), a multiple of the activation block size
 * @returns the activation type and its blocks
 * @throws TpError E_UNSUPPORTED for a weight type without a quantized dot product here.
 */
export function quantizeActivationsGgml(
  weightFormat: WeightFormat,
  x: Float32Array,
  name?: string,
): { format: "q8_0" | "q8_1" | "q8_k"; data: Uint8Array } {
  const format = ACTIVATION_TYPE[weightFormat];
  if (format === undefined) {
    throw new TpError(
      "E_UNSUPPORTED",
      `no quantized dot product for ${weightFormatInfo(weightFormat).ggufName ?? weightFormat} weights`,
      ctx(name),
    );
  }
  const block = weightFormatInfo(format).blockElems;
  if (x.length % block !== 0) {
    throw new TpError(
      "E_SHAPE",
      `${x.length} activations are not whole ${format} blocks of ${block}`,
      ctx(name),
    );
  }
  // Activations are not refused when non-finite: NaN / ±∞ propagate into the dot products as in
  // ggml, and the stage checks (count_nonfinite) report them; weights are refused in quantizeGgml.
  return { format, data: encodeGgml(format, x) };
}

/** ggml CPU `vec_dot_type` of each weight block type (llm.md §2.6). */
export const ACTIVATION_TYPE: Readonly<Partial<Record<WeightFormat, "q8_0" | "q8_1" | "q8_k">>> = {
  q4_0: "q8_0",
  q5_0: "q8_0",
  q8_0: "q8_0",
  iq4_nl: "q8_0",
  q4_1: "q8_1",
  q5_1: "q8_1",
  q2_k: "q8_k",
  q3_k: "q8_k",
  q4_k: "q8_k",
  q5_k: "q8_k",
  q6_k: "q8_k",
  iq4_xs: "q8_k",
};

/**
 * Reference quantized dot product: Σ dequant(w)·dequant(a) accumulated in f64. ggml's integer kernels
 * compute the same sum blockwise in integers and scale per block, so they agree with this to f32
 * rounding. For tests and as the backends' reference.
 * @param weightFormat block type of `w`; `a` must be in its {@link ACTIVATION_TYPE}
 * @param w  weight blocks for `count` elements
 * @param a  activation blocks for `count` elements
 * @param count elements
 */
export function dotGgml(
  weightFormat: WeightFormat,
  w: Uint8Array,
  a: { format: WeightFormat; data: Uint8Array },
  count: number,
): number {
  const wf = dequantizeGgml(weightFormat, w, count);
  const af = dequantizeGgml(a.format, a.data, count);
  let s = 0;
  for (let i = 0; i < count; i++) s += (wf[i] as number) * (af[i] as number);
  return s;
}
