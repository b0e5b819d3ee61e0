/**
 * The compute kernels of the vulkan backend: one SPIR-V module per op, compiled at build time from
 * native/vulkan/shaders/<op>.comp into build/shaders/<op>.spv (scripts/build-native.ts). This table
 * says how many storage buffers each kernel binds and how many bytes of push constants it takes (they
 * must match the shader's `layout(push_constant)` block); {@link KernelCache} creates a pipeline per
 * kernel and specialization on first use and keeps it for the life of the context.
 *
 * Specialization constant 0 is always the workgroup size (local_size_x_id = 0); kernels that have
 * variants take more constants after it (copy: element bytes; cast: the conversion; matmul: the
 * weight format), listed with the kernel.
 *
 * Variants: a kernel whose shader (or an include) tests TP_SUBGROUP or TP_STORAGE16 is also built with
 * them — <name>.subgroup.spv (subgroup reductions), <name>.s16.spv (16-bit storage for f16 / bf16
 * weight reads), <name>.subgroup.s16.spv — and {@link KernelCache} loads the one the device can run
 * ({@link KernelFeatures}); the plain <name>.spv is the fallback for any Vulkan 1.1 device.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { TpError } from "@tp/tensor";
import type { VulkanContext, VulkanPipeline } from "./ffi.ts";

/** An optional build of a kernel: subgroup operations, or 16-bit storage (file-name order). */
export type KernelVariant = "subgroup" | "s16";

/** Which variants the kernels of a context use (device features, unless turned off). */
export interface KernelFeatures {
  /** Subgroup arithmetic and shuffles in compute shaders (reductions, matmul_vec's sums). */
  readonly subgroup: boolean;
  /** storageBuffer16BitAccess (f16 / bf16 weights and GGUF f16 scales read as 16-bit words). */
  readonly s16: boolean;
}

/** Bindings and push-constant bytes of a kernel (its shader's interface). */
export interface KernelSpec {
  /** Storage buffers, bindings 0..n-1 of set 0. */
  readonly bindings: number;
  /** Bytes of the push-constant block. */
  readonly push: number;
  /** Variants built besides the fallback (scripts/build-native.ts builds what the shader tests). */
  readonly variants?: readonly KernelVariant[];
}

/** The reductions of reduce.glsl / select.glsl have a subgroup variant. */
const SUBGROUP: readonly KernelVariant[] = ["subgroup"];

/** Push constants of the elementwise kernels (shaders/elementwise.glsl): 30 words. */
const ELEMENTWISE: KernelSpec = { bindings: 2, push: 120 };

/** Every kernel, by the name of its shader file. */
export const KERNELS = {
  silu: ELEMENTWISE,
  sigmoid: ELEMENTWISE,
  softplus: ELEMENTWISE,
  gelu: ELEMENTWISE,
  scale: ELEMENTWISE,
  add: { bindings: 3, push: 120 },
  sub: { bindings: 3, push: 120 },
  mul: { bindings: 3, push: 120 },
  swiglu: { bindings: 3, push: 120 },
  modulate: { bindings: 4, push: 120 },
  /** spec 1: element bytes (1, 2, 4, 8). */
  copy: { bindings: 2, push: 112 },
  /** spec 1: conversion (shaders/cast.comp MODE). */
  cast: { bindings: 2, push: 12 },
  softmax: { bindings: 2, push: 16, variants: SUBGROUP },
  rms_norm: { bindings: 3, push: 28, variants: SUBGROUP },
  layer_norm: { bindings: 4, push: 32, variants: SUBGROUP },
  group_norm: { bindings: 4, push: 44, variants: SUBGROUP },
  rope: { bindings: 4, push: 36 },
  /** spec 1: weight format (shaders/weights.glsl FORMAT). */
  matmul: { bindings: 4, push: 56, variants: ["s16"] },
  /** spec 1: weight format, 2: M. */
  matmul_vec: { bindings: 4, push: 56, variants: ["subgroup", "s16"] },
  /** spec 1: weight format, or 17 / 18 for INT8 / INT4 ConvRot (an expert stack; the ids bound at 3). */
  matmul_id: { bindings: 7, push: 68, variants: ["s16"] },
  /** spec 1: weight format. */
  embedding: { bindings: 3, push: 36, variants: ["s16"] },
  /** spec 1: shared floats, 2: head_dim, 3: head_dim_v. */
  attention: { bindings: 4, push: 120 },
  /** spec 1: head_dim_v. */
  attention_merge: { bindings: 2, push: 36 },
  argmax: { bindings: 2, push: 12, variants: SUBGROUP },
  top_k: { bindings: 3, push: 16, variants: SUBGROUP },
  count_nonfinite: { bindings: 2, push: 8 },
  conv2d: { bindings: 4, push: 68 },
  /** spec 1: largest rotation group. */
  convrot_quantize: { bindings: 4, push: 24, variants: SUBGROUP },
  matmul_convrot: { bindings: 7, push: 48 },
  /** GGUF activations as ggml's vec_dot_type (Q8_0 / Q8_1 / Q8_K), dequantized. */
  ggml_quantize: { bindings: 2, push: 12 },
  ssm_conv: { bindings: 3, push: 20 },
  gated_delta_net: { bindings: 7, push: 48 },
} as const satisfies Record<string, KernelSpec>;

/** A kernel name of {@link KERNELS}. */
export type KernelName = keyof typeof KERNELS;

/** The SPIR-V file (without .spv) of kernel `name` for a device with `features`. */
export function kernelFile(name: KernelName, features: KernelFeatures): string {
  const variants: readonly KernelVariant[] = (KERNELS[name] as KernelSpec).variants ?? [];
  return [name, ...variants.filter((v) => features[v])].join(".");
}

/**
 * Pipelines of one context, created on first use from the .spv files of `dir` and cached by kernel
 * and specialization constants.
 */
export class KernelCache {
  readonly #ctx: VulkanContext;
  readonly #dir: string;
  /** The variants this cache loads. */
  readonly features: KernelFeatures;
  readonly #pipelines = new Map<string, VulkanPipeline>();
  readonly #code = new Map<string, Uint8Array>();

  /**
   * @param ctx the context pipelines are created on
   * @param dir folder of the compiled kernels (build/shaders)
   * @param features the variants to load where a kernel has them (the device must support them)
   */
  constructor(ctx: VulkanContext, dir: string, features: KernelFeatures = { subgroup: false, s16: false }) {
    this.#ctx = ctx;
    this.#dir = dir;
    this.features = features;
  }

  /**
   * The pipeline of `name` with specialization constants `spec` (spec[0]: workgroup size), from the
   * variant of {@link features} the kernel has ({@link kernelFile}), else the plain module.
   * @throws TpError E_IO when the .spv file is missing (rebuild); E_UNSUPPORTED when the device
   *   rejects the module
   */
  get(name: KernelName, spec: readonly number[]): VulkanPipeline {
    const file = kernelFile(name, this.features);
    const key = `${file}:${spec.join(",")}`;
    const hit = this.#pipelines.get(key);
    if (hit) return hit;
    const k: KernelSpec = KERNELS[name];
    const pipeline = this.#ctx.createPipeline(this.#spirv(file), k.bindings, k.push, spec);
    this.#pipelines.set(key, pipeline);
    return pipeline;
  }

  /** The pipelines created so far, by "<file>:<spec constants>" (profiling reports). */
  entries(): [string, VulkanPipeline][] {
    return [...this.#pipelines.entries()];
  }

  #spirv(name: string): Uint8Array {
    const cached = this.#code.get(name);
    if (cached) return cached;
    const path = join(this.#dir, `${name}.spv`);
    let code: Uint8Array;
    try {
      code = new Uint8Array(readFileSync(path));
    } catch (cause) {
      throw new TpError(
        "E_IO",
        `kernel ${name} of backend vulkan is missing (${path}); run 'bun run build'`,
        {
          file: path,
          cause,
        },
      );
    }
    this.#code.set(name, code);
    return code;
  }
}
