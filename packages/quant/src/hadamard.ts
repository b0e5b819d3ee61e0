/**
 * The ConvRot rotation: a normalized "regular" Hadamard matrix applied to consecutive groups of
 * columns.
 *
 * `H_g = (h4 ⊗ h4 ⊗ … ⊗ h4) / √g` for g = 4^m (g = 256 in every Krea 2 / Qwen-Image file; the
 * krea2-tiny fixtures also use 64 and 16), with
 *
 * ```
 * h4 = [ +1 +1 +1 -1 ]
 *      [ +1 +1 -1 +1 ]
 *      [ +1 -1 +1 +1 ]
 *      [ -1 +1 +1 +1 ]
 * ```
 *
 * Closed form: write i and j in base 4; `H[i][j] = (-1)^(#digits d with i_d + j_d = 3) / √g`.
 * H is symmetric and orthogonal, so H·H = I (self-inverse) — the same transform rotates weights,
 * un-rotates them, and rotates activations. It is NOT the Sylvester/Walsh ordering.
 *
 * The fast transform applies the 4-point butterfly of h4 along each base-4 digit (strides 1, 4, 16,
 * 64, …) and scales by 1/√g = 2^-m (exact in binary floating point). Each pass computes, for
 * `a,b,c,d = v[p], v[p+s], v[p+2s], v[p+3s]`, left to right:
 * `v[p] = a+b+c−d`, `v[p+s] = a+b−c+d`, `v[p+2s] = a−b+c+d`, `v[p+3s] = −a+b+c+d`.
 *
 * Sources: ../shared/spec/krea2.md §1.6; ../shared/spec/qwen-image.md §10.1; comfy-kitchen
 * `_build_hadamard` (Kronecker power of h4, divided by size**0.5).
 */

import { TpError } from "@tp/tensor";
import { ctx } from "./input.ts";

/** The ConvRot group size of every production checkpoint (columns per rotation group). */
export const CONVROT_GROUP_SIZE = 256;

/** The 4×4 base block h4, row-major. */
export const H4: readonly number[] = [1, 1, 1, -1, 1, 1, -1, 1, 1, -1, 1, 1, -1, 1, 1, 1];

/**
 * The number m of base-4 digits of a group size g = 4^m.
 * @throws TpError E_ARG when g is not a power of 4 that is at least 4.
 */
export function hadamardDigits(groupSize: number, tensor?: string): number {
  let m = 0;
  let g = groupSize;
  while (Number.isInteger(g) && g >= 4 && g % 4 === 0) {
    g /= 4;
    m++;
  }
  if (g !== 1 || m === 0) {
    throw new TpError(
      "E_ARG",
      `ConvRot group size ${groupSize} is not a power of 4 (expected 4, 16, 64, 256, 1024, ...)`,
      ctx(tensor),
    );
  }
  return m;
}

/**
 * The dense normalized Hadamard matrix H_g (for tests and small kernels; use
 * {@link hadamardTransform} to apply it).
 * @param groupSize g = 4^m (default 256)
 * @returns Float64Array [g, g], row-major, entries ±1/√g (exact)
 * @throws TpError E_ARG for a group size that is not a power of 4.
 */
export function hadamardMatrix(groupSize = CONVROT_GROUP_SIZE): Float64Array {
  const m = hadamardDigits(groupSize);
  const norm = 2 ** -m;
  const h = new Float64Array(groupSize * groupSize);
  for (let i = 0; i < groupSize; i++) {
    for (let j = 0; j < groupSize; j++) {
      // Kronecker power: the sign is the product of h4[i_d][j_d] over the base-4 digits d.
      let sign = 1;
      for (let d = 0, a = i, b = j; d < m; d++, a >>= 2, b >>= 2) sign *= H4[(a & 3) * 4 + (b & 3)] as number;
      h[i * groupSize + j] = sign * norm;
    }
  }
  return h;
}

/**
 * Rotate one group in place: `v[offset .. offset+g) ← v[offset .. offset+g) · H_g` (= H_g · v, H is
 * symmetric). Butterfly passes, not a dense product.
 *
 * Arithmetic: a Float32Array is transformed in f32 — every addition is rounded to f32, in the order
 * written in the module comment, then the 2^-m scale (exact) — so a C/GLSL/PTX kernel doing the same
 * f32 additions matches bit for bit. A Float64Array is transformed in f64 the same way.
 *
 * @param v         values; the group is `v[offset .. offset + groupSize)`
 * @param groupSize g = 4^m (default 256)
 * @param offset    first element of the group (default 0)
 * @throws TpError E_ARG for a bad group size or a group past the end of `v`.
 */
export function hadamardTransform(
  v: Float32Array | Float64Array,
  groupSize = CONVROT_GROUP_SIZE,
  offset = 0,
): void {
  const m = hadamardDigits(groupSize);
  if (offset < 0 || offset + groupSize > v.length) {
    throw new TpError(
      "E_ARG",
      `Hadamard group [${offset}, ${offset + groupSize}) outside ${v.length} values`,
    );
  }
  const r = v instanceof Float32Array ? Math.fround : (x: number) => x;
  for (let s = 1; s < groupSize; s *= 4) {
    for (let base = 0; base < groupSize; base += 4 * s) {
      for (let o = 0; o < s; o++) {
        const p = offset + base + o;
        const a = v[p] as number;
        const b = v[p + s] as number;
        const c = v[p + 2 * s] as number;
        const d = v[p + 3 * s] as number;
        v[p] = r(r(r(a + b) + c) - d);
        v[p + s] = r(r(r(a + b) - c) + d);
        v[p + 2 * s] = r(r(r(a - b) + c) + d);
        v[p + 3 * s] = r(r(r(b - a) + c) + d);
      }
    }
  }
  const norm = 2 ** -m;
  for (let i = offset; i < offset + groupSize; i++) v[i] = (v[i] as number) * norm;
}

/**
 * The unnormalized butterfly on integers, in place: `q[group] ← q[group] · (√g · H_g)`. Exact as long
 * as g·max|q| < 2^31 (int8 codes give at most 128·g). {@link dequantizeConvRot} un-rotates this way:
 * the rotation of the integer codes is exact, and the scale is applied once at the end.
 * @param q         integer codes; the group is `q[offset .. offset + groupSize)`
 * @param groupSize g = 4^m
 * @param offset    first element of the group
 * @throws TpError E_ARG for a bad group size or a group past the end of `q`.
 */
export function hadamardTransformInt(q: Int32Array, groupSize = CONVROT_GROUP_SIZE, offset = 0): void {
  hadamardDigits(groupSize);
  if (offset < 0 || offset + groupSize > q.length) {
    throw new TpError(
      "E_ARG",
      `Hadamard group [${offset}, ${offset + groupSize}) outside ${q.length} values`,
    );
  }
  for (let s = 1; s < groupSize; s *= 4) {
    for (let base = 0; base < groupSize; base += 4 * s) {
      for (let o = 0; o < s; o++) {
        const p = offset + base + o;
        const a = q[p] as number;
        const b = q[p + s] as number;
        const c = q[p + 2 * s] as number;
        const d = q[p + 3 * s] as number;
        q[p] = a + b + c - d;
        q[p + s] = a + b - c + d;
        q[p + 2 * s] = a - b + c + d;
        q[p + 3 * s] = -a + b + c + d;
      }
    }
  }
}

/**
 * Rotate every row of a row-major [rows, k] matrix in place, group by group (ConvRot's
 * `x_rot[:, g] = x[:, g] · H`). Rows are never mixed.
 * @param v         [rows, k] values, f32 or f64 (arithmetic as {@link hadamardTransform})
 * @param k         row length (columns); a multiple of `groupSize`
 * @param groupSize g = 4^m (default 256)
 * @param tensor    tensor name for errors
 * @throws TpError E_SHAPE when k is not a multiple of the group size or `v.length` of k; E_ARG for a
 *   bad group size.
 */
export function rotateRows(
  v: Float32Array | Float64Array,
  k: number,
  groupSize = CONVROT_GROUP_SIZE,
  tensor?: string,
): void {
  hadamardDigits(groupSize, tensor);
  checkGroups(k, groupSize, tensor);
  if (v.length % k !== 0) {
    throw new TpError("E_SHAPE", `${v.length} values are not whole rows of ${k}`, ctx(tensor));
  }
  for (let off = 0; off < v.length; off += groupSize) hadamardTransform(v, groupSize, off);
}

/**
 * Check that a row of K columns splits into whole rotation groups.
 * @throws TpError E_SHAPE naming the tensor when K is not a positive multiple of the group size.
 */
export function checkGroups(k: number, groupSize: number, tensor?: string): void {
  if (!Number.isSafeInteger(k) || k <= 0 || k % groupSize !== 0) {
    throw new TpError(
      "E_SHAPE",
      `ConvRot: K = ${k} input columns is not a multiple of the rotation group size ${groupSize}`,
      ctx(tensor),
    );
  }
}
