/**
 * Cases of softplus, ssm_conv and gated_delta_net (Qwen 3.5's Gated DeltaNet layers): one token
 * (decode) and several, odd channel counts, strided views, Hv a multiple of Hk (value head j reads key
 * head j mod Hk), the token-by-token form and the chunked form with a partial last chunk, and the
 * state updated in place (read back as the second output).
 */
import type { Tensor } from "@tp/tensor";
import { type ConformanceCase, defineCase, type InputSpec } from "../case.ts";
import { gaussian, uniformF32 } from "../data.ts";
import { numelOf } from "../host.ts";
import { gatedDeltaNetRef, softplusRef, ssmConvRef } from "../reference/index.ts";
import { DELTA_NET, SOFTPLUS, SSM_CONV } from "../tolerances.ts";

function f32(
  name: string,
  shape: readonly number[],
  data: Float32Array,
  view?: InputSpec["view"],
): InputSpec {
  return { name, dtype: "f32", shape, data, ...(view ? { view } : {}) };
}

function softplusCases(): ConformanceCase[] {
  const shapes: { shape: number[]; view?: InputSpec["view"] }[] = [
    { shape: [0, 3] },
    { shape: [1] },
    { shape: [3, 37] },
    { shape: [64, 129] },
    { shape: [4, 33], view: { kind: "stride2" } },
  ];
  return shapes.map(({ shape, view }, i) => {
    const x = gaussian(900 + i, numelOf(shape), 8);
    x.set([-90, -20, -1e-4, 0, 19.9, 20, 20.1, 90].slice(0, x.length));
    return defineCase({
      op: "softplus",
      name: `softplus [${shape}]${view ? " (every other element)" : ""}`,
      tolerance: SOFTPLUS,
      inputs: [f32("x", shape, x, view)],
      call: (b, [t]) => b.softplus(t as Tensor),
      reference: ([t]) => [{ shape, dtype: "f32", data: softplusRef(t as never) }],
    });
  });
}

function convCases(): ConformanceCase[] {
  const cases: { t: number; c: number; k: number; view?: InputSpec["view"] }[] = [
    { t: 1, c: 37, k: 4 },
    { t: 9, c: 256, k: 4 },
    { t: 0, c: 5, k: 4 },
    { t: 3, c: 6, k: 1 },
    { t: 700, c: 64, k: 4 },
    { t: 5, c: 16, k: 3, view: { kind: "permute", perm: [1, 0] } },
  ];
  return cases.map(({ t, c, k, view }, i) => {
    const xShape = [t + k - 1, c];
    return defineCase({
      op: "ssm_conv",
      name: `ssm_conv x [${xShape}] weight [${c}, ${k}]${view ? " (permuted x)" : ""}`,
      tolerance: SSM_CONV,
      inputs: [
        f32("x", xShape, gaussian(920 + i, numelOf(xShape), 1), view),
        f32("weight", [c, k], gaussian(930 + i, c * k, 0.5)),
      ],
      call: (b, [x, w]) => b.ssmConv(x as Tensor, w as Tensor),
      reference: ([x, w]) => [{ shape: [t, c], dtype: "f32", data: ssmConvRef(x as never, w as never) }],
    });
  });
}

/** n rows of d values with unit L2 norm (the models L2-normalise q and k). */
function unitRows(seed: number, rows: number, d: number): Float32Array {
  const x = gaussian(seed, rows * d, 1);
  for (let r = 0; r < rows; r++) {
    let s = 0;
    for (let a = 0; a < d; a++) s += (x[r * d + a] as number) ** 2;
    const inv = 1 / Math.sqrt(s);
    for (let a = 0; a < d; a++) x[r * d + a] = (x[r * d + a] as number) * inv;
  }
  return x;
}

function deltaCases(): ConformanceCase[] {
  const cases: {
    n: number;
    hk: number;
    hv: number;
    dk: number;
    dv: number;
    chunk: number;
    permuteQ?: boolean;
  }[] = [
    { n: 1, hk: 2, hv: 4, dk: 8, dv: 8, chunk: 0 },
    { n: 19, hk: 2, hv: 4, dk: 16, dv: 12, chunk: 0 },
    { n: 19, hk: 2, hv: 4, dk: 16, dv: 12, chunk: 8 },
    { n: 70, hk: 1, hv: 3, dk: 32, dv: 32, chunk: 64 },
    { n: 1, hk: 1, hv: 1, dk: 5, dv: 3, chunk: 64 },
    { n: 6, hk: 3, hv: 3, dk: 4, dv: 4, chunk: 0, permuteQ: true },
  ];
  return cases.map(({ n, hk, hv, dk, dv, chunk, permuteQ }, i) => {
    const s = 940 + 10 * i;
    const qView: InputSpec["view"] | undefined = permuteQ ? { kind: "permute", perm: [1, 0, 2] } : undefined;
    const scale = 1 / Math.sqrt(dk);
    return defineCase({
      op: "gated_delta_net",
      name: `gated_delta_net n ${n} Hk ${hk} Hv ${hv} Dk ${dk} Dv ${dv} ${chunk === 0 ? "token by token" : `chunk ${chunk}`}${permuteQ ? " (permuted q)" : ""}`,
      tolerance: DELTA_NET,
      inputs: [
        f32("q", [n, hk, dk], unitRows(s, n * hk, dk), qView),
        f32("k", [n, hk, dk], unitRows(s + 1, n * hk, dk)),
        f32("v", [n, hv, dv], gaussian(s + 2, n * hv * dv, 1)),
        f32("g", [n, hv], uniformF32(s + 3, n * hv, -2, -0.01)),
        f32("beta", [n, hv], uniformF32(s + 4, n * hv, 0.05, 0.95)),
        f32("state", [hv, dk, dv], gaussian(s + 5, hv * dk * dv, 0.5)),
      ],
      call: (b, [q, k, v, g, beta, state]) => [
        b.gatedDeltaNet(q as Tensor, k as Tensor, v as Tensor, g as Tensor, beta as Tensor, state as Tensor, {
          chunk,
        }),
        state as Tensor,
      ],
      reference: ([q, k, v, g, beta, state]) => {
        const r = gatedDeltaNetRef(
          q as never,
          k as never,
          v as never,
          g as never,
          beta as never,
          state as never,
          scale,
        );
        return [
          { shape: [n, hv, dv], dtype: "f32", data: r.out },
          { shape: [hv, dk, dv], dtype: "f32", data: r.state },
        ];
      },
    });
  });
}

/** Every case of the state-space ops. */
export function ssmCases(): ConformanceCase[] {
  return [...softplusCases(), ...convCases(), ...deltaCases()];
}
