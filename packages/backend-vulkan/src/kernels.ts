/**
 * The compute kernels of the vulkan backend: one SPIR-V module per op, compiled at build time from
 * native/vulkan/shaders/<op>.comp into build/shaders/<op>.spv (scripts/build-native.ts). This table
 * says how many storage buffers each kernel binds and how many bytes of push constants it takes (they
 * must match the shader's `layout(push_constant)` block); {@link KernelCache} creates a pipeline per
 * kernel and specialization on first use and keeps it for the life of the context.
 *
 * Specialization constant 0 is always the workgroup size (local_size_x_id = 0); kernels that have
 * variants take more constants after it (copy: element bytes; cast: the conversion; matmul: the
 * weight format), listed with the kernel. A kernel whose shader tests TP_SUBGROUP is also built as
 * <name>.subgroup.spv, with subgroup operations, for devices that have them.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { TpError } from "@tp/tensor";
import type { VulkanContext, VulkanPipeline } from "./ffi.ts";

/** Bindings and push-constant bytes of a kernel (its shader's interface). */
export interface KernelSpec {
  /** Storage buffers, bindings 0..n-1 of set 0. */
  readonly bindings: number;
  /** Bytes of the push-constant block. */
  readonly push: number;
}

/** Push constants of the elementwise kernels (shaders/elementwise.glsl): 30 words. */
const ELEMENTWISE: KernelSpec = { bindings: 2, push: 120 };

/** Every kernel, by the name of its shader file. */
export const KERNELS = {
  silu: ELEMENTWISE,
  sigmoid: ELEMENTWISE,
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
  softmax: { bindings: 2, push: 16 },
  rms_norm: { bindings: 3, push: 28 },
  layer_norm: { bindings: 4, push: 32 },
  group_norm: { bindings: 4, push: 44 },
  rope: { bindings: 4, push: 36 },
  /** spec 1: weight format (shaders/weights.glsl FORMAT). */
  matmul: { bindings: 4, push: 56 },
  /** spec 1: weight format, 2: M; a subgroup variant. */
  matmul_vec: { bindings: 4, push: 56 },
  /** spec 1: weight format. */
  embedding: { bindings: 3, push: 36 },
  /** spec 1: shared floats, 2: head_dim, 3: head_dim_v. */
  attention: { bindings: 4, push: 120 },
  /** spec 1: head_dim_v. */
  attention_merge: { bindings: 2, push: 36 },
  argmax: { bindings: 2, push: 12 },
  top_k: { bindings: 3, push: 16 },
  conv2d: { bindings: 4, push: 68 },
  /** spec 1: largest rotation group. */
  convrot_quantize: { bindings: 4, push: 24 },
  matmul_convrot: { bindings: 7, push: 48 },
  /** GGUF activations as ggml's vec_dot_type (Q8_0 / Q8_1 / Q8_K), dequantized. */
  ggml_quantize: { bindings: 2, push: 12 },
} as const satisfies Record<string, KernelSpec>;

/** A kernel name of {@link KERNELS}. */
export type KernelName = keyof typeof KERNELS;

/**
 * Pipelines of one context, created on first use from the .spv files of `dir` and cached by kernel
 * and specialization constants.
 */
export class KernelCache {
  readonly #ctx: VulkanContext;
  readonly #dir: string;
  readonly #pipelines = new Map<string, VulkanPipeline>();
  readonly #code = new Map<string, Uint8Array>();

  /**
   * @param ctx the context pipelines are created on
   * @param dir folder of the compiled kernels (build/shaders)
   */
  constructor(ctx: VulkanContext, dir: string) {
    this.#ctx = ctx;
    this.#dir = dir;
  }

  /**
   * The pipeline of `name` with specialization constants `spec` (spec[0]: workgroup size), from the
   * plain module or its `subgroup` variant.
   * @throws TpError E_IO when the .spv file is missing (rebuild); E_UNSUPPORTED when the device
   *   rejects the module
   */
  get(name: KernelName, spec: readonly number[], variant: "" | "subgroup" = ""): VulkanPipeline {
    const file = variant === "" ? name : `${name}.${variant}`;
    const key = `${file}:${spec.join(",")}`;
    const hit = this.#pipelines.get(key);
    if (hit) return hit;
    const k: KernelSpec = KERNELS[name];
    const pipeline = this.#ctx.createPipeline(this.#spirv(file), k.bindings, k.push, spec);
    this.#pipelines.set(key, pipeline);
    return pipeline;
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
