/**
 * The state-space / linear-attention kernels of the cpu backend on f32: softplus, ssm_conv and
 * gated_delta_net (Qwen 3.5's Gated DeltaNet layers). Strided inputs are copied first; the state of
 * gated_delta_net is contiguous (the front-end checks it) and updated in place. Arguments are checked
 * by @tp/tensor's front-end; kernels: native/cpu/ssm.c.
 */
import type { DTypeName, KernelSignatures, KernelTable } from "@tp/tensor";
import { type CpuOpHost, dense, onDense, region, strided } from "./common.ts";
import { gatedDeltaNetF32, softplusF32, ssmConvF32 } from "./native.ts";

const F32: readonly DTypeName[] = ["f32"];

/** The kernel-table entries of softplus, ssm_conv and gated_delta_net (f32). */
export function ssmKernels(host: CpuOpHost): Pick<KernelTable, "softplus" | "ssm_conv" | "gated_delta_net"> {
  const softplus: KernelSignatures["softplus"] = (out, x) => {
    if (strided(x)) {
      onDense(host, "softplus", x, null, null, (x) => softplus(out, x));
      return;
    }
    softplusF32(host.ctx, region(host, x, "softplus"), region(host, out, "softplus"), x.numel);
  };

  const ssmConv: KernelSignatures["ssm_conv"] = (out, x, weight) => {
    const op = "ssm_conv";
    if (strided(x, weight)) {
      onDense(host, op, x, weight, null, (x, weight) => ssmConv(out, x, weight));
      return;
    }
    const [tOut, channels] = out.shape as [number, number];
    ssmConvF32(
      host.ctx,
      region(host, x, op),
      region(host, weight, op),
      region(host, out, op),
      tOut,
      channels,
      weight.shape[1] as number,
    );
  };

  const gatedDeltaNet: KernelSignatures["gated_delta_net"] = (out, q, k, v, g, beta, state, scale, chunk) => {
    const op = "gated_delta_net";
    if (strided(q, k, v) || strided(g, beta)) {
      host.scope(() =>
        gatedDeltaNet(
          out,
          dense(host, q, op),
          dense(host, k, op),
          dense(host, v, op),
          dense(host, g, op),
          dense(host, beta, op),
          state,
          scale,
          chunk,
        ),
      );
      return;
    }
    const [n, kHeads, dk] = q.shape as [number, number, number];
    const [, vHeads, dv] = v.shape as [number, number, number];
    gatedDeltaNetF32(
      host.ctx,
      region(host, q, op),
      region(host, k, op),
      region(host, v, op),
      region(host, g, op),
      region(host, beta, op),
      region(host, state, op),
      region(host, out, op),
      { n, kHeads, vHeads, dk, dv },
      scale,
      chunk,
    );
  };

  return {
    softplus: { dtypes: F32, run: softplus },
    ssm_conv: { dtypes: F32, run: ssmConv },
    gated_delta_net: { dtypes: F32, run: gatedDeltaNet },
  };
}
