/**
 * The front-end of the state-space / linear-attention ops of Qwen 3.5 / 3.6's Gated DeltaNet layers:
 * ssm_conv (the depthwise causal conv over time, ggml_ssm_conv) and gated_delta_net (the gated delta
 * rule, updating its state in place, ggml_gated_delta_net). Checks, then the kernel on a new output.
 * Semantics and sources: `Backend` in ../backend.ts.
 */
import { opError } from "../op-args.ts";
import { formatShape, type Shape } from "../shape.ts";
import type { Tensor } from "../tensor.ts";
import { checkInput, discard, kernel, type OpHost, run } from "./common.ts";

/** The largest chunk of the chunked delta rule (the kernels' scratch grows with chunk²). */
export const MAX_DELTA_CHUNK = 1024;

/**
 * ssm_conv: x [T + K − 1, C], weight [C, K] → [T, C].
 * @throws TpError E_SHAPE naming both shapes; E_STATE; E_UNSUPPORTED
 */
export function ssmConv(host: OpHost, x: Tensor, weight: Tensor): Tensor {
  const op = "ssm_conv";
  const k = kernel(host, op);
  checkInput(host, op, k, x, "x");
  checkInput(host, op, k, weight, "weight");
  const C = weight.shape[0] as number;
  const K = weight.shape[1] as number;
  if (weight.rank !== 2 || K < 1 || x.rank !== 2 || x.shape[1] !== C || (x.shape[0] as number) < K - 1) {
    throw opError(
      "E_SHAPE",
      host.name,
      op,
      `x ${formatShape(x.shape)} must be [T + K - 1, C] for weight ${formatShape(weight.shape)} [C, K] (K >= 1)`,
    );
  }
  const T = (x.shape[0] as number) - (K - 1);
  return run(host, host.alloc([T, C], x.dtype, x.name), k.run, x, weight);
}

/**
 * gated_delta_net: q, k [n, Hk, Dk], v [n, Hv, Dv], g, beta [n, Hv], state [Hv, Dk, Dv] (in place)
 * → out [n, Hv, Dv].
 * @throws TpError E_SHAPE naming the shapes; E_ARG for a strided state, one sharing storage with an
 *   input, a non-finite scale or a chunk outside [0, 1024]; E_STATE; E_UNSUPPORTED
 */
export function gatedDeltaNet(
  host: OpHost,
  q: Tensor,
  k: Tensor,
  v: Tensor,
  g: Tensor,
  beta: Tensor,
  state: Tensor,
  options?: { scale?: number; chunk?: number } | null,
): Tensor {
  const op = "gated_delta_net";
  const e = kernel(host, op);
  const inputs: [Tensor, string][] = [
    [q, "q"],
    [k, "k"],
    [v, "v"],
    [g, "g"],
    [beta, "beta"],
  ];
  for (const [t, what] of inputs) checkInput(host, op, e, t, what);
  checkInput(host, op, e, state, "state");
  const [n, hk, dk] = q.shape as [number, number, number];
  const hv = v.shape[1] as number;
  const dv = v.shape[2] as number;
  const same = (a: Shape, b: readonly number[]) => a.length === b.length && a.every((d, i) => d === b[i]);
  if (
    q.rank !== 3 ||
    v.rank !== 3 ||
    !same(k.shape, [n, hk, dk]) ||
    v.shape[0] !== n ||
    !same(g.shape, [n, hv]) ||
    !same(beta.shape, [n, hv]) ||
    !same(state.shape, [hv, dk, dv]) ||
    hk < 1 ||
    hv % hk !== 0
  ) {
    throw opError(
      "E_SHAPE",
      host.name,
      op,
      `q ${formatShape(q.shape)}, k ${formatShape(k.shape)} must be [n, Hk, Dk], v ${formatShape(v.shape)} [n, Hv, Dv] with Hv a multiple of Hk, g ${formatShape(g.shape)} and beta ${formatShape(beta.shape)} [n, Hv], state ${formatShape(state.shape)} [Hv, Dk, Dv]`,
    );
  }
  if (!state.isContiguous) {
    throw opError(
      "E_ARG",
      host.name,
      op,
      `state ${formatShape(state.shape)} must be contiguous (it is updated in place)`,
    );
  }
  for (const [t, what] of inputs) {
    if (t.storage === state.storage) {
      throw opError("E_ARG", host.name, op, `state shares its storage with ${what}; it is updated in place`);
    }
  }
  const scale = options?.scale ?? 1 / Math.sqrt(dk);
  if (typeof scale !== "number" || !Number.isFinite(Math.fround(scale))) {
    throw opError("E_ARG", host.name, op, `scale must be a number finite in f32, got ${String(scale)}`);
  }
  const chunk = options?.chunk ?? 0;
  if (!Number.isSafeInteger(chunk) || chunk < 0 || chunk > MAX_DELTA_CHUNK) {
    throw opError(
      "E_ARG",
      host.name,
      op,
      `chunk must be an integer in [0, ${MAX_DELTA_CHUNK}], got ${String(chunk)}`,
    );
  }
  const out = host.alloc([n, hv, dv], v.dtype, v.name);
  if (out.numel === 0) return out;
  try {
    e.run(out, q, k, v, g, beta, state, scale, chunk);
  } catch (err) {
    discard(host, out, err);
  }
  return out;
}
