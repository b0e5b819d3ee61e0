/**
 * The state-space / linear-attention ops of the vulkan backend: ssm_conv (shaders/ssm_conv.comp, one
 * invocation per output) and gated_delta_net (shaders/gated_delta_net.comp, one workgroup per value
 * head, each invocation owning state columns; token by token for any `chunk`: the chunked form is the
 * same function, and the cpu backend's prefill form). softplus is elementwise (./elementwise.ts).
 * Kernel-table entries: arguments arrive checked (@tp/tensor's op front-end).
 * Source: ggml `ggml_ssm_conv`, `ggml_gated_delta_net`; Yang et al. 2024 eq. 10.
 */
import { dispatch1d, dispatchGroups, Push, type VkKernel } from "./common.ts";
import { contiguous } from "./layout.ts";

/** Invocations per workgroup of gated_delta_net (state columns per pass). */
const DELTA_WORKGROUP = 64;

/** ssm_conv ({@link KernelSignatures.ssm_conv}): out [T, C] from x [T + K − 1, C] and weight [C, K]. */
export const ssmConv: VkKernel<"ssm_conv"> = (host, out, x, weight) => {
  const op = "ssm_conv";
  if (out.numel === 0) return;
  host.scope(() => {
    const a = host.bind(contiguous(host, op, x), op);
    const w = host.bind(contiguous(host, op, weight), op);
    const y = host.bind(out, op);
    const push = new Push(20)
      .u32(out.numel)
      .u32(out.shape[1] as number)
      .u32(weight.shape[1] as number)
      .u32(a.offset)
      .u32(w.offset);
    dispatch1d(host, op, "ssm_conv", [], [y.binding, a.binding, w.binding], push, out.numel);
  });
};

/** gated_delta_net ({@link KernelSignatures.gated_delta_net}); the state is updated in place. */
export const gatedDeltaNet: VkKernel<"gated_delta_net"> = (host, out, q, k, v, g, beta, state, scale) => {
  const op = "gated_delta_net";
  const [n, hk, dk] = q.shape as [number, number, number];
  const [, hv, dv] = v.shape as [number, number, number];
  host.scope(() => {
    const b = [q, k, v, g, beta].map((t) => host.bind(contiguous(host, op, t), op));
    const s = host.bind(state, op);
    const y = host.bind(out, op);
    const push = new Push(48).u32(n).u32(hk).u32(hv).u32(dk).u32(dv).f32(scale);
    for (const t of b) push.u32(t.offset);
    push.u32(s.offset);
    dispatchGroups(
      host,
      op,
      "gated_delta_net",
      [DELTA_WORKGROUP],
      [y.binding, ...b.map((t) => t.binding), s.binding],
      push,
      hv,
    );
  });
};
