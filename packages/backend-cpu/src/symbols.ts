/**
 * native/include/tp.h for bun:ffi: the numbers of its enums and flags, and the symbol table of
 * libtp_cpu.so, one group per section of the header and in its order. Written once beside the header;
 * `symbols.test.ts` parses tp.h and fails when a prototype, an argument type or a number differs, so
 * the two cannot drift. `./ffi.ts` is the one file that calls `dlopen` with this table.
 *
 * Argument types map C to bun:ffi one for one: int32_t i32, uint32_t u32, int64_t i64, uint64_t u64,
 * float f32, double f64, any pointer or array ptr; tp_status is i32; `const char *` returns cstring.
 *
 * Source: native/include/tp.h; ../shared/STYLE.md §4.
 */
import type { FFIFunction } from "bun:ffi";

/** The ABI version this package was written for (tp.h `TP_ABI_VERSION`); other libraries are refused. */
export const TP_ABI_VERSION = 1;

/** Status codes of tp.h (`tp_status`). */
export const TP_STATUS = { OK: 0, ERR_ARG: 1, ERR_OOM: 2, ERR_UNSUPPORTED: 3, ERR_INTERNAL: 4 } as const;

/** Element types of `tp_cpu_cast` and their tp.h `tp_dtype` codes (part of the ABI). */
export const CAST_DTYPES = { f32: 0, f16: 1, bf16: 2, f8_e4m3fn: 3, f8_e5m2: 4 } as const;

/** Flag of `tp_cpu_cast`: f32 -> fp8 clamps overflow and ±inf to ±max finite (tp.h `TP_CAST_SATURATE`). */
export const CAST_SATURATE = 1;

/** Interrupt cleanup slots and the longest path one holds, in bytes (tp.h `TP_CLEANUP_*`). */
export const CLEANUP = { slots: 64, path_bytes: 4096 } as const;

/** Instruction-set levels of the kernels and their tp.h `tp_isa` codes, lowest first. */
export const CPU_ISA = { scalar: 0, avx2: 1, avx512: 2 } as const;

/** CPU feature bits of `tp_cpu_features()` (tp.h `TP_CPU_*`), by name. */
export const CPU_FEATURES = {
  avx2: 1 << 0,
  fma: 1 << 1,
  f16c: 1 << 2,
  avx512f: 1 << 3,
  avx512bw: 1 << 4,
  avx512vl: 1 << 5,
  avx512vnni: 1 << 6,
  avx512bf16: 1 << 7,
  avxvnni: 1 << 8,
  avx512vbmi: 1 << 9,
} as const;

/**
 * Weight formats of the native matmul / get_rows kernels and their tp.h `tp_wformat` codes (part of the
 * ABI). Names are @tp/tensor `WeightFormat`s.
 */
export const NATIVE_WEIGHT_FORMATS = {
  f32: 0,
  f16: 1,
  bf16: 2,
  f8_e4m3fn: 3,
  f8_e5m2: 4,
  int8_convrot: 5,
  int4_convrot: 6,
  q4_0: 7,
  q4_1: 8,
  q5_0: 9,
  q5_1: 10,
  q8_0: 11,
  q2_k: 12,
  q3_k: 13,
  q4_k: 14,
  q5_k: 15,
  q6_k: 16,
  iq4_nl: 17,
  iq4_xs: 18,
} as const;

/**
 * Activation block types of `tp_cpu_quantize_act` (tp.h `TP_ACT_BLOCK_*`): code, elements and bytes
 * per block (ggml block_q8_0, block_q8_1, block_q8_K).
 */
export const ACT_BLOCKS = {
  q8_0: { code: 0, elems: 32, bytes: 34 },
  q8_1: { code: 1, elems: 32, bytes: 36 },
  q8_k: { code: 2, elems: 256, bytes: 292 },
} as const;

/** Flag of `tp_cpu_rms_norm_f32`: scale by (1 + weight) (tp.h `TP_NORM_UNIT_OFFSET`). */
export const NORM_UNIT_OFFSET = 1;

/** Modes of `tp_cpu_rope_f32` (tp.h `TP_ROPE_*`): neox pairs (i, i + d/2), interleaved (2i, 2i + 1). */
export const ROPE_MODES = { neox: 0, interleaved: 1 } as const;

/** The symbol table of libtp_cpu.so: every `TP_API` function of tp.h, grouped as the header is. */
// biome-ignore format: one line per tp.h prototype, so that a row reads against the header
export const TP_SYMBOLS = {
  // version, CPU, contexts, host memory
  tp_abi_version: { args: [], returns: "i32" },
  tp_cpu_features: { args: [], returns: "u32" },
  tp_cpu_count: { args: [], returns: "i32" },
  tp_ctx_create: { args: ["i32", "i32"], returns: "ptr" },
  tp_ctx_destroy: { args: ["ptr"], returns: "void" },
  tp_ctx_threads: { args: ["ptr"], returns: "i32" },
  tp_ctx_isa: { args: ["ptr"], returns: "i32" },
  tp_ctx_error: { args: ["ptr"], returns: "cstring" },
  tp_alloc: { args: ["u64"], returns: "ptr" },
  tp_free: { args: ["ptr"], returns: "void" },
  tp_cpu_cast: { args: ["ptr", "ptr", "i32", "ptr", "i32", "u64", "u32"], returns: "i32" },

  // ---- weights: matmul, get_rows, dequantization, quantizers
  tp_weight_row_bytes: { args: ["i32", "i64"], returns: "i64" },
  tp_cpu_matmul: { args: ["ptr", "ptr", "i64", "i64", "i32", "ptr", "u64", "i64", "ptr", "i64", "i32", "ptr", "ptr"], returns: "i32" },
  tp_cpu_matmul_id: { args: ["ptr", "ptr", "i64", "i64", "i64", "i32", "ptr", "u64", "i64", "i64", "ptr", "i64", "i32", "ptr", "i64", "ptr"], returns: "i32" },
  tp_weight_repack_bytes: { args: ["i32", "i64", "i64"], returns: "i64" },
  tp_cpu_repack_weight: { args: ["ptr", "i32", "ptr", "u64", "i64", "i64", "ptr", "u64"], returns: "i32" },
  tp_cpu_matmul_repacked: { args: ["ptr", "ptr", "i64", "i64", "i32", "ptr", "u64", "i64", "ptr", "ptr"], returns: "i32" },
  tp_cpu_get_rows: { args: ["ptr", "i32", "ptr", "u64", "i64", "i64", "ptr", "i64", "i32", "ptr", "i64", "ptr"], returns: "i32" },
  tp_cpu_quantize_act: { args: ["ptr", "i32", "ptr", "i64", "i64", "ptr", "u64"], returns: "i32" },
  tp_cpu_convrot_quantize: { args: ["ptr", "ptr", "i64", "i64", "i32", "i32", "ptr", "ptr"], returns: "i32" },
  tp_cpu_quantize_weight: { args: ["ptr", "i32", "ptr", "i32", "u64", "i64", "i64", "i32", "ptr", "u64", "ptr", "i64"], returns: "i32" },

  // ---- ops on f32 activations
  tp_cpu_copy: { args: ["ptr", "ptr", "u64", "ptr", "ptr", "u64", "ptr", "ptr", "i32", "i32"], returns: "i32" },
  tp_cpu_silu_f32: { args: ["ptr", "ptr", "ptr", "u64"], returns: "i32" },
  tp_cpu_sigmoid_f32: { args: ["ptr", "ptr", "ptr", "u64"], returns: "i32" },
  tp_cpu_gelu_f32: { args: ["ptr", "ptr", "ptr", "u64", "i32"], returns: "i32" },
  tp_cpu_scale_f32: { args: ["ptr", "ptr", "ptr", "u64", "f32"], returns: "i32" },
  tp_cpu_swiglu_f32: { args: ["ptr", "ptr", "ptr", "ptr", "u64"], returns: "i32" },
  tp_cpu_add_f32: { args: ["ptr", "ptr", "u64", "ptr", "ptr", "u64", "ptr", "ptr", "ptr", "i32"], returns: "i32" },
  tp_cpu_sub_f32: { args: ["ptr", "ptr", "u64", "ptr", "ptr", "u64", "ptr", "ptr", "ptr", "i32"], returns: "i32" },
  tp_cpu_mul_f32: { args: ["ptr", "ptr", "u64", "ptr", "ptr", "u64", "ptr", "ptr", "ptr", "i32"], returns: "i32" },
  tp_cpu_modulate_f32: { args: ["ptr", "ptr", "u64", "ptr", "ptr", "u64", "ptr", "ptr", "u64", "ptr", "ptr", "ptr", "i32"], returns: "i32" },
  tp_cpu_softmax_f32: { args: ["ptr", "ptr", "ptr", "u64", "u64", "u64"], returns: "i32" },
  tp_cpu_rms_norm_f32: { args: ["ptr", "ptr", "ptr", "ptr", "u64", "u64", "f32", "u32"], returns: "i32" },
  tp_cpu_layer_norm_f32: { args: ["ptr", "ptr", "ptr", "ptr", "ptr", "u64", "u64", "f32"], returns: "i32" },
  tp_cpu_group_norm_f32: { args: ["ptr", "ptr", "ptr", "ptr", "ptr", "u64", "u64", "u64", "u64", "f32"], returns: "i32" },
  tp_cpu_softplus_f32: { args: ["ptr", "ptr", "ptr", "u64"], returns: "i32" },
  tp_cpu_ssm_conv_f32: { args: ["ptr", "ptr", "ptr", "ptr", "u64", "u64", "u64"], returns: "i32" },
  tp_cpu_gated_delta_net_f32: { args: ["ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "u64", "u64", "u64", "u64", "u64", "f32", "i32"], returns: "i32" },
  tp_cpu_rope_f32: { args: ["ptr", "ptr", "ptr", "u64", "u64", "u64", "u64", "ptr", "ptr", "i32", "i32", "i32", "f64", "f64"], returns: "i32" },
  tp_cpu_attention_f32: { args: ["ptr", "ptr", "ptr", "ptr", "ptr", "u64", "u64", "u64", "u64", "u64", "u64", "u64", "f32", "i64", "i32", "i64", "i64", "f32"], returns: "i32" },
  tp_cpu_attention_strided_f32: { args: ["ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "u64", "u64", "u64", "u64", "u64", "u64", "u64", "f32", "i64", "i32", "i64", "i64", "f32"], returns: "i32" },
  tp_cpu_conv2d_f32: { args: ["ptr", "ptr", "ptr", "ptr", "ptr", "u64", "u64", "u64", "u64", "u64", "u64", "u64", "i32", "i32", "i32", "i32"], returns: "i32" },
  tp_cpu_upsample_nearest2d_f32: { args: ["ptr", "ptr", "ptr", "u64", "u64", "u64", "i32"], returns: "i32" },
  tp_cpu_argmax_f32: { args: ["ptr", "ptr", "ptr", "u64", "u64"], returns: "i32" },
  tp_cpu_top_k_f32: { args: ["ptr", "ptr", "ptr", "ptr", "u64", "u64", "u64"], returns: "i32" },
  tp_cpu_count_nonfinite_f32: { args: ["ptr", "ptr", "u64", "ptr"], returns: "i32" },


  // interrupt cleanup
  tp_cleanup_install: { args: ["i32"], returns: "i32" },
  tp_cleanup_arm: { args: ["i32", "ptr", "u64"], returns: "i32" },
  tp_cleanup_disarm: { args: ["i32"], returns: "i32" },
} as const satisfies Record<string, FFIFunction>;
