/**
 * Compare a backend's output with its reference under a {@link Tolerance}; the result says why it
 * failed (the metric, the worst element) so a failing test reads on its own.
 */
import type { Tolerance } from "./tolerances.ts";

/** Outcome of {@link compare}: null when within tolerance, else a message. */
export type Mismatch = string | null;

function same(a: number, e: number): boolean {
  return a === e || (Number.isNaN(a) && Number.isNaN(e));
}

/** Compare `actual` with `expected` element by element (lengths must agree). */
export function compare(actual: ArrayLike<number>, expected: ArrayLike<number>, tol: Tolerance): Mismatch {
  if (actual.length !== expected.length) {
    return `length ${actual.length}, expected ${expected.length}`;
  }
  const n = actual.length;
  if (tol.kind === "exact") {
    const bad: string[] = [];
    let count = 0;
    for (let i = 0; i < n; i++) {
      const a = Number(actual[i]);
      const e = Number(expected[i]);
      if (!same(a, e)) {
        count++;
        if (bad.length < 5) bad.push(`[${i}] ${a} vs ${e}`);
      }
    }
    return count === 0 ? null : `${count} of ${n} differ (exact): ${bad.join(", ")}`;
  }
  if (tol.kind === "close") {
    let worst = -1;
    let worstExcess = 0;
    let count = 0;
    for (let i = 0; i < n; i++) {
      const a = actual[i] as number;
      const e = expected[i] as number;
      if (same(a, e)) continue;
      const err = Math.abs(a - e);
      const limit = tol.atol + tol.rtol * Math.abs(e);
      if (!(err <= limit)) {
        count++;
        const excess = Number.isFinite(err)
          ? err / Math.max(limit, Number.MIN_VALUE)
          : Number.POSITIVE_INFINITY;
        if (worst < 0 || excess > worstExcess) {
          worst = i;
          worstExcess = excess;
        }
      }
    }
    if (count === 0) return null;
    const a = actual[worst] as number;
    const e = expected[worst] as number;
    return (
      `${count} of ${n} outside atol ${tol.atol} + rtol ${tol.rtol}; worst [${worst}] ${a} vs ${e} ` +
      `(error ${Math.abs(a - e).toExponential(3)})`
    );
  }
  let num = 0;
  let den = 0;
  for (let i = 0; i < n; i++) {
    const e = expected[i] as number;
    const d = (actual[i] as number) - e;
    num += d * d;
    den += e * e;
  }
  const nmse = den === 0 ? (num === 0 ? 0 : Number.POSITIVE_INFINITY) : num / den;
  return nmse <= tol.max ? null : `NMSE ${nmse.toExponential(3)} > ${tol.max}`;
}

/** Largest |a − e| / (|e| + tiny) and NMSE, for reports and for choosing tolerances. */
export function errorStats(
  actual: ArrayLike<number>,
  expected: ArrayLike<number>,
): { maxAbs: number; nmse: number } {
  let maxAbs = 0;
  let num = 0;
  let den = 0;
  for (let i = 0; i < actual.length; i++) {
    const e = expected[i] as number;
    const d = (actual[i] as number) - e;
    if (!Number.isNaN(d)) maxAbs = Math.max(maxAbs, Math.abs(d));
    num += d * d;
    den += e * e;
  }
  return { maxAbs, nmse: den === 0 ? 0 : num / den };
}
