/**
 * The bun:ffi symbol table of the op kernels of libtp_cpu.so (native/include/tp.h, "ops on f32
 * activations"), spread into the table of `../ffi.ts`, which is the one file that calls `dlopen`.
 * Argument lists follow tp.h one for one; every entry point returns a tp_status (i32). The checked
 * wrappers are in `./native.ts`.
 */

/**
 * Symbols of the ops: copy, elementwise, norms, softmax, rope, attention, conv2d, upsample, sampling,
 * and the repacked-weight matmul.
 */
export const OP_SYMBOLS = {
  // layout
  tp_cpu_copy: {
    args: ["ptr", "ptr", "u64", "ptr", "ptr", "u64", "ptr", "ptr", "i32", "i32"],
    returns: "i32",
  },
  tp_cpu_upsample_nearest2d_f32: { args: ["ptr", "ptr", "ptr", "u64", "u64", "u64", "i32"], returns: "i32" },
  // elementwise
  tp_cpu_silu_f32: { args: ["ptr", "ptr", "ptr", "u64"], returns: "i32" },
  tp_cpu_sigmoid_f32: { args: ["ptr", "ptr", "ptr", "u64"], returns: "i32" },
  tp_cpu_gelu_f32: { args: ["ptr", "ptr", "ptr", "u64", "i32"], returns: "i32" },
  tp_cpu_scale_f32: { args: ["ptr", "ptr", "ptr", "u64", "f32"], returns: "i32" },
  tp_cpu_swiglu_f32: { args: ["ptr", "ptr", "ptr", "ptr", "u64"], returns: "i32" },
  tp_cpu_add_f32: {
    args: ["ptr", "ptr", "u64", "ptr", "ptr", "u64", "ptr", "ptr", "ptr", "i32"],
    returns: "i32",
  },
  tp_cpu_sub_f32: {
    args: ["ptr", "ptr", "u64", "ptr", "ptr", "u64", "ptr", "ptr", "ptr", "i32"],
    returns: "i32",
  },
  tp_cpu_mul_f32: {
    args: ["ptr", "ptr", "u64", "ptr", "ptr", "u64", "ptr", "ptr", "ptr", "i32"],
    returns: "i32",
  },
  tp_cpu_modulate_f32: {
    args: ["ptr", "ptr", "u64", "ptr", "ptr", "u64", "ptr", "ptr", "u64", "ptr", "ptr", "ptr", "i32"],
    returns: "i32",
  },
  // normalisation, softmax, position
  tp_cpu_softmax_f32: { args: ["ptr", "ptr", "ptr", "u64", "u64", "u64"], returns: "i32" },
  tp_cpu_rms_norm_f32: { args: ["ptr", "ptr", "ptr", "ptr", "u64", "u64", "f32", "u32"], returns: "i32" },
  tp_cpu_layer_norm_f32: { args: ["ptr", "ptr", "ptr", "ptr", "ptr", "u64", "u64", "f32"], returns: "i32" },
  tp_cpu_group_norm_f32: {
    args: ["ptr", "ptr", "ptr", "ptr", "ptr", "u64", "u64", "u64", "u64", "f32"],
    returns: "i32",
  },
  tp_cpu_rope_f32: {
    args: ["ptr", "ptr", "ptr", "u64", "u64", "u64", "u64", "ptr", "ptr", "i32", "i32", "i32", "f64", "f64"],
    returns: "i32",
  },
  // attention, convolution
  tp_cpu_attention_f32: {
    args: [
      "ptr",
      "ptr",
      "ptr",
      "ptr",
      "ptr",
      "u64",
      "u64",
      "u64",
      "u64",
      "u64",
      "u64",
      "u64",
      "f32",
      "i64",
      "i32",
      "i64",
      "i64",
      "f32",
    ],
    returns: "i32",
  },
  // (q, k, v, out, lens[4], strides[12], batch, heads, kv_heads, sq, skv, head_dim, head_dim_v, scale, q_offset, causal, window, full_prefix, softcap)
  tp_cpu_attention_strided_f32: {
    args: [
      "ptr",
      "ptr",
      "ptr",
      "ptr",
      "ptr",
      "ptr",
      "ptr",
      "u64",
      "u64",
      "u64",
      "u64",
      "u64",
      "u64",
      "u64",
      "f32",
      "i64",
      "i32",
      "i64",
      "i64",
      "f32",
    ],
    returns: "i32",
  },
  tp_cpu_conv2d_f32: {
    args: [
      "ptr",
      "ptr",
      "ptr",
      "ptr",
      "ptr",
      "u64",
      "u64",
      "u64",
      "u64",
      "u64",
      "u64",
      "u64",
      "i32",
      "i32",
      "i32",
      "i32",
    ],
    returns: "i32",
  },
  // repacked Q8_0 / Q4_0 weights for the GEMV (tp.h "weights"; wrappers in ./native.ts)
  tp_weight_repack_bytes: { args: ["i32", "i64", "i64"], returns: "i64" },
  tp_cpu_repack_weight: { args: ["ptr", "i32", "ptr", "u64", "i64", "i64", "ptr", "u64"], returns: "i32" },
  tp_cpu_matmul_repacked: {
    args: ["ptr", "ptr", "i64", "i64", "i32", "ptr", "u64", "i64", "ptr", "ptr"],
    returns: "i32",
  },
  // sampling helpers
  tp_cpu_argmax_f32: { args: ["ptr", "ptr", "ptr", "u64", "u64"], returns: "i32" },
  tp_cpu_top_k_f32: { args: ["ptr", "ptr", "ptr", "ptr", "u64", "u64", "u64"], returns: "i32" },
} as const;
