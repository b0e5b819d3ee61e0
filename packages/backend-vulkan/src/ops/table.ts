/**
 * The kernel table of the vulkan backend (@tp/tensor KernelTable): one entry per op it has, naming
 * the dtypes and weight formats its kernel takes. @tp/tensor's op front-end checks arguments against
 * these lists and calls `run`; `supports()` and `capabilities()` are derived from the table, so they
 * list exactly what has a kernel here and passes the conformance suite. An op missing here is
 * E_UNSUPPORTED naming backend, op and format.
 */
import { DTYPE_NAMES, type DTypeName, type KernelTable, type WeightFormat } from "@tp/tensor";
import { attention } from "./attention.ts";
import type { VkOpHost } from "./common.ts";
import { conv2d } from "./conv.ts";
import * as elementwise from "./elementwise.ts";
import * as layout from "./layout.ts";
import { CONVROT_FORMATS, embedding, matmul, matmulId, WEIGHT_FORMAT_CODES } from "./matmul.ts";
import * as norm from "./norm.ts";
import { rope } from "./rope.ts";
import * as sample from "./sample.ts";
import { softmax } from "./softmax.ts";
import { gatedDeltaNet, ssmConv } from "./ssm.ts";

/** f32 activations only. */
const F32: readonly DTypeName[] = ["f32"];

/** Weight formats of embedding: those the kernels decode (shaders/weights.glsl). */
const EMBEDDING_FORMATS: readonly WeightFormat[] = Object.keys(WEIGHT_FORMAT_CODES) as WeightFormat[];

/** Weight formats of matmul: the decoded ones and INT8 / INT4 ConvRot. */
const MATMUL_FORMATS: readonly WeightFormat[] = [...EMBEDDING_FORMATS, ...CONVROT_FORMATS];

/**
 * The kernels of `host`: activations are f32 (rope's positions, embedding's ids and the sampling
 * indices are i32 by the op contract); the layout ops move any dtype; cast converts between f32 and
 * the narrow floats.
 */
export function vulkanKernelTable(host: VkOpHost): KernelTable {
  // Each entry is its kernel with the host bound: (out, ...inputs, ...options) as KernelSignatures.
  return {
    silu: { dtypes: F32, run: elementwise.silu.bind(null, host) },
    sigmoid: { dtypes: F32, run: elementwise.sigmoid.bind(null, host) },
    softplus: { dtypes: F32, run: elementwise.softplus.bind(null, host) },
    gelu: { dtypes: F32, run: elementwise.gelu.bind(null, host) },
    scale: { dtypes: F32, run: elementwise.scale.bind(null, host) },
    add: { dtypes: F32, run: elementwise.binary.bind(null, host, "add") },
    sub: { dtypes: F32, run: elementwise.binary.bind(null, host, "sub") },
    mul: { dtypes: F32, run: elementwise.binary.bind(null, host, "mul") },
    swiglu: { dtypes: F32, run: elementwise.swiglu.bind(null, host) },
    modulate: { dtypes: F32, run: elementwise.modulate.bind(null, host) },
    copy: { dtypes: DTYPE_NAMES, run: layout.copy.bind(null, host) },
    set: { dtypes: DTYPE_NAMES, run: layout.set.bind(null, host) },
    slice: { dtypes: DTYPE_NAMES, run: layout.slice.bind(null, host) },
    concat: { dtypes: DTYPE_NAMES, run: layout.concat.bind(null, host) },
    upsample_nearest2d: { dtypes: F32, run: layout.upsampleNearest2d.bind(null, host) },
    cast: { dtypes: layout.CAST_DTYPES, run: layout.cast.bind(null, host) },
    softmax: { dtypes: F32, run: softmax.bind(null, host) },
    rms_norm: { dtypes: F32, run: norm.rmsNorm.bind(null, host) },
    layer_norm: { dtypes: F32, run: norm.layerNorm.bind(null, host) },
    group_norm: { dtypes: F32, run: norm.groupNorm.bind(null, host) },
    rope: { dtypes: F32, run: rope.bind(null, host) },
    matmul: { dtypes: F32, weightFormats: MATMUL_FORMATS, run: matmul.bind(null, host) },
    // the formats of matmul: shaders/matmul_id.comp (ConvRot after convrot_quantize.comp)
    matmul_id: { dtypes: F32, weightFormats: MATMUL_FORMATS, run: matmulId.bind(null, host) },
    embedding: { dtypes: F32, weightFormats: EMBEDDING_FORMATS, run: embedding.bind(null, host) },
    attention: { dtypes: F32, run: attention.bind(null, host) },
    conv2d: { dtypes: F32, run: conv2d.bind(null, host) },
    argmax: { dtypes: F32, run: sample.argmax.bind(null, host) },
    top_k: { dtypes: F32, run: sample.topK.bind(null, host) },
    count_nonfinite: { dtypes: F32, run: sample.countNonFinite.bind(null, host) },
    ssm_conv: { dtypes: F32, run: ssmConv.bind(null, host) },
    gated_delta_net: { dtypes: F32, run: gatedDeltaNet.bind(null, host) },
  };
}
