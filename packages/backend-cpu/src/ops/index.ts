/**
 * The kernel table of the cpu backend: one entry per op (@tp/tensor KernelTable), assembled from the
 * op families of this folder. The op methods themselves (checks, output allocation) are @tp/tensor's.
 */
import type { KernelTable } from "@tp/tensor";
import { attentionKernels } from "./attention.ts";
import type { CpuOpHost } from "./common.ts";
import { conv2dKernels } from "./conv2d.ts";
import { elementwiseKernels } from "./elementwise.ts";
import { embeddingKernels } from "./embedding.ts";
import { type CpuCastHost, layoutKernels } from "./layout.ts";
import { matmulKernels } from "./matmul.ts";
import { normKernels } from "./norm.ts";
import { ropeKernels } from "./rope.ts";
import { sampleKernels } from "./sample.ts";
import { ssmKernels } from "./ssm.ts";

export type { CpuOpHost } from "./common.ts";
export type { CpuCastHost } from "./layout.ts";
export type { NativeRegion } from "./native.ts";

/** Every kernel of the cpu backend, bound to `host` (built once per backend; entries allocate nothing). */
export function cpuKernels(host: CpuCastHost): KernelTable {
  const h: CpuOpHost = host;
  return {
    ...matmulKernels(h),
    ...attentionKernels(h),
    ...normKernels(h),
    ...ropeKernels(h),
    ...elementwiseKernels(h),
    ...embeddingKernels(h),
    ...conv2dKernels(h),
    ...layoutKernels(host),
    ...sampleKernels(h),
    ...ssmKernels(h),
  };
}
