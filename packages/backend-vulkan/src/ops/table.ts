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
import { CONVROT_FORMATS, embedding, matmul, WEIGHT_FORMAT_CODES } from "./matmul.ts";
import * as norm from "./norm.ts";
import { rope } from "./rope.ts";
import * as sample from "./sample.ts";
import { softmax } from "./softmax.ts";

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
  return {
    silu: { dtypes: F32, run: (out, x) => elementwise.silu(host, out, x) },
    sigmoid: { dtypes: F32, run: (out, x) => elementwise.sigmoid(host, out, x) },
    gelu: { dtypes: F32, run: (out, x, approximate) => elementwise.gelu(host, out, x, approximate) },
    scale: { dtypes: F32, run: (out, x, s) => elementwise.scale(host, out, x, s) },
    add: { dtypes: F32, run: (out, a, b) => elementwise.binary(host, "add", out, a, b) },
    sub: { dtypes: F32, run: (out, a, b) => elementwise.binary(host, "sub", out, a, b) },
    mul: { dtypes: F32, run: (out, a, b) => elementwise.binary(host, "mul", out, a, b) },
    swiglu: { dtypes: F32, run: (out, gate, up) => elementwise.swiglu(host, out, gate, up) },
    modulate: {
      dtypes: F32,
      run: (out, x, scale, shift) => elementwise.modulate(host, out, x, scale, shift),
    },
    copy: { dtypes: DTYPE_NAMES, run: (out, x) => layout.copy(host, out, x) },
    set: { dtypes: DTYPE_NAMES, run: (dst, src) => layout.set(host, dst, src) },
    slice: { dtypes: DTYPE_NAMES, run: (out, view) => layout.slice(host, out, view) },
    concat: { dtypes: DTYPE_NAMES, run: (out, inputs, dim) => layout.concat(host, out, inputs, dim) },
    upsample_nearest2d: {
      dtypes: F32,
      run: (out, x, factor) => layout.upsampleNearest2d(host, out, x, factor),
    },
    cast: { dtypes: layout.CAST_DTYPES, run: (out, x, saturate) => layout.cast(host, out, x, saturate) },
    softmax: { dtypes: F32, run: (out, x, dim) => softmax(host, out, x, dim) },
    rms_norm: {
      dtypes: F32,
      run: (out, x, weight, eps, unitOffset) => norm.rmsNorm(host, out, x, weight, eps, unitOffset),
    },
    layer_norm: {
      dtypes: F32,
      run: (out, x, weight, bias, eps) => norm.layerNorm(host, out, x, weight, bias, eps),
    },
    group_norm: {
      dtypes: F32,
      run: (out, x, groups, weight, bias, eps) => norm.groupNorm(host, out, x, groups, weight, bias, eps),
    },
    rope: {
      dtypes: F32,
      run: (out, x, positions, mode, theta, ropeDims, freqScale, sections) =>
        rope(host, out, x, positions, mode, theta, ropeDims, freqScale, sections),
    },
    matmul: {
      dtypes: F32,
      weightFormats: MATMUL_FORMATS,
      run: (out, x, w, bias) => matmul(host, out, x, w, bias),
    },
    embedding: {
      dtypes: F32,
      weightFormats: EMBEDDING_FORMATS,
      run: (out, table, ids) => embedding(host, out, table, ids),
    },
    attention: { dtypes: F32, run: (out, q, k, v, p) => attention(host, out, q, k, v, p) },
    conv2d: {
      dtypes: F32,
      run: (out, x, weight, bias, stride, padding) => conv2d(host, out, x, weight, bias, stride, padding),
    },
    argmax: { dtypes: F32, run: (out, x) => sample.argmax(host, out, x) },
    top_k: { dtypes: F32, run: (values, indices, x, k) => sample.topK(host, values, indices, x, k) },
  };
}
