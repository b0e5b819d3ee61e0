/**
 * References of the state-space / linear-attention ops, in f64: softplus, ssm_conv (the depthwise
 * causal conv over time) and gated_delta_net (the gated delta rule, token by token).
 * Sources: Yang et al. 2024, "Gated Delta Networks" eq. 10; ../shared/spec/llm.md §3.4 (the GDN
 * layer as llama.cpp runs it); ggml `ggml_ssm_conv`, `ggml_softplus`.
 */
import { type HostTensor, numelOf } from "../host.ts";

/** log(1 + e^x), and x above 20 (ggml). */
export function softplusRef(x: HostTensor): Float64Array {
  const out = new Float64Array(numelOf(x.shape));
  for (let i = 0; i < out.length; i++) {
    const v = x.data[i] as number;
    out[i] = v > 20 ? v : Math.log1p(Math.exp(v));
  }
  return out;
}

/** x [T + K − 1, C], w [C, K] → [T, C]: out[t][c] = Σ_j w[c][j] · x[t + j][c]. */
export function ssmConvRef(x: HostTensor, w: HostTensor): Float64Array {
  const [C, K] = w.shape as [number, number];
  const T = (x.shape[0] as number) - (K - 1);
  const out = new Float64Array(T * C);
  for (let t = 0; t < T; t++)
    for (let c = 0; c < C; c++) {
      let s = 0;
      for (let j = 0; j < K; j++) s += (w.data[c * K + j] as number) * (x.data[(t + j) * C + c] as number);
      out[t * C + c] = s;
    }
  return out;
}

/**
 * The gated delta rule token by token: q, k [n, Hk, Dk], v [n, Hv, Dv], g, beta [n, Hv], state
 * [Hv, Dk, Dv]; value head j uses key head j mod Hk. Per token: S ← e^g S; δ = β(v − Sᵀk);
 * S ← S + kδᵀ; o = scale · Sᵀq.
 * @returns out [n, Hv, Dv] and the final state [Hv, Dk, Dv]
 */
export function gatedDeltaNetRef(
  q: HostTensor,
  k: HostTensor,
  v: HostTensor,
  g: HostTensor,
  beta: HostTensor,
  state: HostTensor,
  scale: number,
): { out: Float64Array; state: Float64Array } {
  const [n, hk, dk] = q.shape as [number, number, number];
  const [, hv, dv] = v.shape as [number, number, number];
  const S = Float64Array.from(state.data as ArrayLike<number>);
  const out = new Float64Array(n * hv * dv);
  const m = new Float64Array(dv);
  for (let t = 0; t < n; t++)
    for (let j = 0; j < hv; j++) {
      const i = j % hk;
      const qo = (t * hk + i) * dk;
      const decay = Math.exp(g.data[t * hv + j] as number);
      const b = beta.data[t * hv + j] as number;
      const base = j * dk * dv;
      for (let e = 0; e < dk * dv; e++) S[base + e] = (S[base + e] as number) * decay;
      m.fill(0);
      for (let a = 0; a < dk; a++)
        for (let c = 0; c < dv; c++)
          m[c] = (m[c] as number) + (S[base + a * dv + c] as number) * (k.data[qo + a] as number);
      for (let c = 0; c < dv; c++) m[c] = b * ((v.data[(t * hv + j) * dv + c] as number) - (m[c] as number));
      for (let a = 0; a < dk; a++)
        for (let c = 0; c < dv; c++)
          S[base + a * dv + c] =
            (S[base + a * dv + c] as number) + (k.data[qo + a] as number) * (m[c] as number);
      for (let c = 0; c < dv; c++) {
        let o = 0;
        for (let a = 0; a < dk; a++) o += (S[base + a * dv + c] as number) * (q.data[qo + a] as number);
        out[(t * hv + j) * dv + c] = scale * o;
      }
    }
  return { out, state: S };
}
