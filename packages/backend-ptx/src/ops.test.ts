// The ptx kernel table without a GPU: a stand-in backend keeps tensors in host memory and records
// every launch through the real packLaunch, so each op is checked to pick the kernel it should (by
// format, M and device) and to pass exactly the parameters that kernel declares (a missing or extra
// argument is E_INTERNAL). What the kernels compute needs a GPU (`bun run test:gpu`).
import { describe, expect, test } from "bun:test";
import {
  BackendBase,
  type DTypeName,
  type KernelTable,
  type Shape,
  type Tensor,
  Weight,
  type WeightFormat,
  weightBytes,
} from "@tp/tensor";
import { packLaunch, scaleValues } from "./backend.ts";
import { type LaunchArg, type PtxOpHost, ptxKernelTable } from "./ops.ts";
import type { KernelSource } from "./ptx/emit.ts";

interface Launch {
  readonly kernel: string;
  readonly grid: readonly number[];
}

class Recorder extends BackendBase implements PtxOpHost {
  readonly name = "ptx";
  readonly device = "recorder";
  readonly launches: Launch[] = [];
  readonly #kernels = new Map<string, KernelSource>();
  override readonly kernelTable: KernelTable;
  constructor(
    readonly sm: number,
    readonly w4a4 = false,
    readonly fp8Mma = false,
  ) {
    super("ptx");
    this.kernelTable = ptxKernelTable(this);
  }
  protected allocStorage(bytes: number) {
    return new Uint8Array(bytes);
  }
  protected freeStorage() {}
  protected writeStorage(h: unknown, offset: number, data: Uint8Array) {
    (h as Uint8Array).set(data, offset);
  }
  protected async readStorage(h: unknown, offset: number, length: number) {
    return (h as Uint8Array).slice(offset, offset + length);
  }
  launch(kernel: KernelSource, grid: readonly [number, number, number], args: Record<string, LaunchArg>) {
    packLaunch(kernel, grid, args, () => 0x1000n);
    this.launches.push({ kernel: kernel.name, grid });
  }
  fill() {}
  weightBytes(w: Weight): Tensor {
    return this.persist(this.upload(w.data, [w.data.byteLength], "u8"));
  }
  weightScale(w: Weight): Tensor {
    const v = scaleValues(w);
    return this.persist(this.upload(v, [v.length], "f32"));
  }
  table(_key: string, make: () => Float64Array): Tensor {
    const d = make();
    return this.persist(this.upload(d, [d.length], "f64"));
  }
  kernel(name: string, make: () => KernelSource): KernelSource {
    let k = this.#kernels.get(name);
    if (k === undefined) {
      k = make();
      this.#kernels.set(name, k);
    }
    return k;
  }
  names(): string[] {
    return this.launches.splice(0).map((l) => l.kernel);
  }
}

const f32 = (b: Recorder, shape: Shape, dtype: DTypeName = "f32") => b.alloc(shape, dtype);
function weight(format: WeightFormat, n: number, k: number): Weight {
  const convrot = format.endsWith("convrot");
  return new Weight({
    name: `w.${format}`,
    format,
    shape: [n, k],
    data: new Uint8Array(weightBytes(format, [n, k])),
    ...(convrot ? { scale: { kind: "row" as const, values: new Float32Array(n) } } : {}),
  });
}

describe("ptx kernel table: choice of kernel and its parameters", () => {
  test("matmul: gemv for M ≤ 8, tiled above, mma.sync for f16 / bf16 from M = 16 on sm_80+", () => {
    const b = new Recorder(86);
    for (const format of ["f32", "q8_0", "q4_0", "f16", "bf16"] as const) {
      const w = weight(format, 96, 64);
      b.matmul(f32(b, [1, 64]), w);
      b.matmul(f32(b, [12, 64]), w, { bias: f32(b, [96]) });
      b.matmul(f32(b, [32, 64]), w);
    }
    expect(b.names()).toEqual([
      "matmul_gemv_f32",
      "matmul_tiled_f32_b",
      "matmul_tiled_f32",
      "ggml_fake_quantize_q8_0", // x as ggml's Q8_0 activations
      "matmul_gemv_q8_0",
      "ggml_fake_quantize_q8_0",
      "matmul_tiled_q8_0_b",
      "ggml_fake_quantize_q8_0",
      "matmul_tiled_q8_0",
      "ggml_fake_quantize_q8_0", // x as ggml's Q8_0 activations
      "matmul_gemv_q4_0",
      "ggml_fake_quantize_q8_0",
      "matmul_tiled_q4_0_b",
      "ggml_fake_quantize_q8_0",
      "matmul_tiled_q4_0",
      "matmul_gemv_f16",
      "matmul_tiled_f16_b",
      "matmul_mma_f16",
      "matmul_gemv_bf16",
      "matmul_tiled_bf16_b",
      "matmul_mma_bf16",
    ]);
  });
  test("matmul ConvRot: rotate, then W8A8 (quantize rows + int8 mma) at every M; weight-only INT4 through the scaled f32 kernels", () => {
    const b = new Recorder(90);
    const w8 = weight("int8_convrot", 40, 512);
    b.matmul(f32(b, [2, 512]), w8);
    b.matmul(f32(b, [16, 512]), w8, { bias: f32(b, [40]) });
    b.matmul(f32(b, [16, 512]), weight("int4_convrot", 40, 512));
    expect(b.names()).toEqual([
      "convrot_rotate_g256",
      "convrot_quantize_rows_int8", // W8A8 at every M: bit for bit with the cpu backend
      "matmul_mma_s8_int8_convrot_s",
      "convrot_rotate_g256",
      "convrot_quantize_rows_int8",
      "matmul_mma_s8_int8_convrot_b_s",
      "convrot_rotate_g256",
      "matmul_tiled_int4_convrot_s",
    ]);
    // grids: rotation (K / 256 groups, rows); int8 mma (N / 128, M / 16)
    expect(b.supports("matmul", ["iq2_xxs"])).toBe(false);
  });
  test("GGUF legacy blocks, k-quants and IQ4: x quantized to Q8_0 / Q8_K blocks, then gemv / tiled / matmul_id / embedding", () => {
    const b = new Recorder(86);
    const formats = [
      "q4_1",
      "q5_0",
      "q5_1",
      "q2_k",
      "q3_k",
      "q4_k",
      "q5_k",
      "q6_k",
      "iq4_nl",
      "iq4_xs",
    ] as const;
    for (const format of formats) {
      expect(b.supports("matmul", [format])).toBe(true);
      expect(b.supports("matmul_id", [format])).toBe(true);
      expect(b.supports("embedding", [format])).toBe(true);
      const w = weight(format, 40, 512);
      b.matmul(f32(b, [1, 512]), w);
      b.matmul(f32(b, [20, 512]), w, { bias: f32(b, [40]) });
      b.matmulId(f32(b, [3, 1, 512]), weight(format, 4 * 10, 512), b.alloc([3, 2], "i32"), { experts: 4 });
      b.embedding(weight(format, 7, 256), b.alloc([5], "i32"));
      // ggml's vec_dot_type: Q8_K for the k-quants and IQ4_XS, Q8_0 for the rest
      const q8k = format.endsWith("_k") || format === "iq4_xs";
      const q = q8k ? "ggml_fake_quantize_q8_k" : "ggml_fake_quantize_q8_0";
      // grids: quantize ⌈(M·K / block) / 8⌉; gemv (⌈N / 8⌉, M); tiled (⌈N / 64⌉, ⌈M / 64⌉); matmul_id
      // (⌈N / 8⌉, T·S); embedding ⌈rows·D / 256⌉
      const blocksOf = (m: number) => Math.ceil((m * 512) / (q8k ? 256 : 32) / 8);
      expect(b.launches.splice(0).map((l) => [l.kernel, ...l.grid])).toEqual([
        [q, blocksOf(1), 1, 1],
        [`matmul_gemv_${format}`, 5, 1, 1],
        [q, blocksOf(20), 1, 1],
        [`matmul_tiled_${format}_b`, 1, 1, 1],
        [q, blocksOf(3), 1, 1],
        [`matmul_id_gemv_${format}`, 2, 6, 1],
        [`embedding_${format}`, 5, 1, 1],
      ]);
    }
  });
  test("matmul INT4 ConvRot as W4A4 (the default): rotate, int4 rows, mma.sync s4 at every M", () => {
    const b = new Recorder(90, true);
    b.matmul(f32(b, [16, 512]), weight("int4_convrot", 40, 512));
    b.matmul(f32(b, [8, 512]), weight("int4_convrot", 40, 512));
    expect(b.names()).toEqual([
      "convrot_rotate_g256",
      "convrot_quantize_rows_int4",
      "matmul_mma_s4_int4_convrot_s",
      "convrot_rotate_g256",
      "convrot_quantize_rows_int4",
      "matmul_mma_s4_int4_convrot_s",
    ]);
  });
  test("matmul from M = 64: the shared-memory tiled mma kernels (f16, bf16, W8A8, W4A4), grid (N / 128, M / 64)", () => {
    const b = new Recorder(86, true);
    b.matmul(f32(b, [130, 96]), weight("f16", 200, 96), { bias: f32(b, [200]) });
    b.matmul(f32(b, [64, 40]), weight("bf16", 8, 40)); // K = 40: a multiple of 8, not of 16 or 32
    b.matmul(f32(b, [63, 64]), weight("bf16", 8, 64)); // M = 63: the direct mma kernel
    b.matmul(f32(b, [64, 36]), weight("f16", 8, 36)); // K not a multiple of 8: tiled FMA
    b.matmul(f32(b, [200, 512]), weight("int8_convrot", 300, 512), { bias: f32(b, [300]) });
    b.matmul(f32(b, [64, 256]), weight("int4_convrot", 8, 256));
    expect(b.launches.map((l) => [l.kernel, ...l.grid])).toEqual([
      ["matmul_mma_tiled_f16_b", 2, 3, 1],
      ["matmul_mma_tiled_bf16", 1, 1, 1],
      ["matmul_mma_bf16", 1, 4, 1],
      ["matmul_tiled_f16", 1, 1, 1],
      ["convrot_rotate_g256", 2, 200, 1],
      ["convrot_quantize_rows_int8", 200, 1, 1],
      ["matmul_mma_tiled_s8_int8_convrot_b_s", 3, 4, 1],
      ["convrot_rotate_g256", 1, 64, 1],
      ["convrot_quantize_rows_int4", 64, 1, 1],
      ["matmul_mma_tiled_s4_int4_convrot_s", 1, 1, 1],
    ]);
  });
  test("fp8 mma (TP_PTX_FP8_MMA): e4m3 weights on sm_89+ quantise x per row and take the fp8 tensor cores; else the f32-x path", () => {
    const raw = new Weight({
      name: "w.e4m3",
      format: "f8_e4m3fn",
      shape: [24, 64],
      data: new Uint8Array(24 * 64),
    });
    const scaled = new Weight({ ...raw, name: "w.e4m3.s", scale: { kind: "tensor", value: 0.5 } });
    const e5m2 = new Weight({ ...raw, name: "w.e5m2", format: "f8_e5m2" });
    const ada = new Recorder(89, false, true);
    ada.matmul(f32(ada, [20, 64]), raw, { bias: f32(ada, [24]) });
    ada.matmul(f32(ada, [16, 64]), scaled);
    ada.matmul(f32(ada, [4, 64]), raw); // decode stays on the gemv
    ada.matmul(f32(ada, [16, 64]), e5m2); // e5m2 has no fp8 mma here
    expect(ada.launches.map((l) => [l.kernel, ...l.grid])).toEqual([
      ["quantize_rows_fp8_e4m3", 20, 1, 1],
      ["matmul_mma_tiled_e4m3_f8_e4m3fn_b", 1, 1, 1],
      ["quantize_rows_fp8_e4m3", 16, 1, 1],
      ["matmul_mma_tiled_e4m3_f8_e4m3fn_s", 1, 1, 1],
      ["matmul_gemv_f8_e4m3fn", 3, 4, 1],
      ["matmul_tiled_f8_e5m2", 1, 1, 1],
    ]);
    for (const b of [new Recorder(86, false, true), new Recorder(90)]) {
      b.matmul(f32(b, [20, 64]), raw);
      expect(b.names()).toEqual(["matmul_tiled_f8_e4m3fn"]);
    }
  });
  test("strided operands: copies to contiguous before row kernels; broadcast views go to map kernels as strides", () => {
    const b = new Recorder(86);
    const x = f32(b, [4, 6]);
    b.add(x, f32(b, [6]));
    b.rmsNorm(x.transpose(0, 1), f32(b, [4]), { eps: 1e-6 });
    b.softmax(x, { dim: 0 });
    b.layerNorm(x, null, f32(b, [6]), { eps: 1e-5 });
    expect(b.names()).toEqual([
      "map_add_f32_f32_to_f32_r2",
      "move_b32_r2",
      "rms_norm_f32_weight",
      "move_b32_r2",
      "softmax_f32",
      "move_b32_r2_so",
      "layer_norm_f32_b",
    ]);
  });
  test("elementwise, layout, sampling, conv and attention ops each launch their kernel", () => {
    const b = new Recorder(90);
    const x = f32(b, [2, 3, 4, 8]);
    b.silu(x);
    b.gelu(x, { approximate: "tanh" });
    b.scale(x, 0.5);
    b.modulate(x, f32(b, [8]), f32(b, [8]));
    b.cast(x, "bf16", { saturate: true });
    b.concat([x, x], 1);
    b.upsampleNearest2d(x, 2);
    b.argmax(x);
    b.countNonFinite(x);
    b.rope(f32(b, [1, 5, 2, 8]), b.alloc([5], "i32"), { mode: "neox", theta: 10000 });
    b.embedding(weight("q8_0", 10, 64), b.alloc([3], "i32"));
    b.conv2d(f32(b, [1, 3, 8, 8]), f32(b, [4, 3, 3, 3]), null, { padding: 1 });
    b.attention(f32(b, [1, 4, 3, 16]), f32(b, [1, 2, 7, 16]), f32(b, [1, 2, 7, 16]), {
      causal: true,
      window: 4,
      softcap: 30,
    });
    expect(b.names()).toEqual([
      "map_silu_f32_to_f32_r1",
      "map_gelu_tanh_f32_to_f32_r1",
      "map_scale_f32_to_f32_r1",
      "map_modulate_f32_f32_f32_to_f32_r2",
      "cast_f32_to_bf16_r1", // saturate changes fp8 outputs only (as the cpu backend)
      // concat: [2, 3, 4, 8] into slices of [2, 6, 4, 8], the inner 4 × 8 merged: rank 2
      "move_b32_r2_so",
      "move_b32_r2_so",
      // upsample: the view [2·3·4 → 24, 2 (stride 0), 8, 2 (stride 0)]: rank 4
      "move_b32_r4",
      "argmax_f32",
      "count_nonfinite_f32",
      "rope_f32_neox_d8",
      "embedding_q8_0",
      "conv2d_f32_k3x3_s1x1_p1x1",
      "attention_f32_d16_dv16_causal_softcap",
    ]);
  });
  test("fp8 weights: raw through the plain kernels, scaled through the scaled ones; top_k, matmul_id", () => {
    const b = new Recorder(89);
    const raw = new Weight({
      name: "w.e4m3",
      format: "f8_e4m3fn",
      shape: [16, 64],
      data: new Uint8Array(16 * 64),
    });
    const scaled = new Weight({
      ...raw,
      name: "w.e5m2",
      format: "f8_e5m2",
      scale: { kind: "tensor", value: 0.5 },
    });
    b.matmul(f32(b, [1, 64]), raw);
    b.matmul(f32(b, [20, 64]), scaled);
    b.topK(f32(b, [3, 50]), 5);
    const experts = weight("q4_0", 4 * 24, 64); // 4 experts of N = 24
    b.matmulId(f32(b, [2, 1, 64]), experts, b.alloc([2, 3], "i32"), { experts: 4 });
    expect(b.launches.map((l) => [l.kernel, ...l.grid])).toEqual([
      ["matmul_gemv_f8_e4m3fn", 2, 1, 1],
      ["matmul_tiled_f8_e5m2_s", 1, 1, 1],
      ["top_k_f32", 3, 1, 1],
      ["ggml_fake_quantize_q8_0", 1, 1, 1],
      ["matmul_id_gemv_q4_0", 3, 6, 1],
    ]);
  });
  test("casts: fp8 through ptx/casts.ts, a dtype to itself as a bit copy, other pairs E_UNSUPPORTED", () => {
    const b = new Recorder(86);
    const x = f32(b, [4, 6]);
    b.cast(x, "f8_e4m3fn", { saturate: true });
    b.cast(x.transpose(0, 1), "f8_e5m2");
    b.cast(b.alloc([7], "f8_e4m3fn"), "f32");
    b.cast(b.alloc([7], "f8_e5m2"), "bf16");
    b.cast(b.alloc([3, 5], "i32"), "i32");
    b.cast(b.alloc([9], "u8"), "u8");
    expect(b.names()).toEqual([
      "cast_f32_to_f8_e4m3fn_r1_sat",
      "cast_f32_to_f8_e5m2_r2",
      "cast_f8_e4m3fn_to_f32_r1",
      "cast_f8_e5m2_to_bf16_r1",
      "move_b32_r1",
      "move_b8_r1",
    ]);
    for (const [from, to] of [
      ["i32", "f32"],
      ["f32", "i32"],
      ["i8", "i16"],
      ["f64", "f32"],
    ] as const) {
      expect(() => b.cast(b.alloc([2], from), to)).toThrow(
        `op cast on backend ptx: no conversion ${from} → ${to}`,
      );
    }
    expect(b.supports("cast", ["f8_e4m3fn", "f8_e5m2", "i64", "bool"])).toBe(true);
  });
  test("matmul_id: GEMV per row below the threshold, else routing + one grouped GEMM launch", () => {
    const b = new Recorder(86);
    const experts = weight("q8_0", 8 * 40, 64); // 8 experts of N = 40
    // 63 rows: GEMV; 64 rows over 8 experts: grouped; 64 rows over 32 experts (< 4 per expert): GEMV
    b.matmulId(f32(b, [21, 1, 64]), experts, b.alloc([21, 3], "i32"), { experts: 8 });
    b.matmulId(f32(b, [16, 4, 64]), experts, b.alloc([16, 4], "i32"), { experts: 8 });
    b.matmulId(f32(b, [16, 4, 64]), weight("q8_0", 32 * 10, 64), b.alloc([16, 4], "i32"), { experts: 32 });
    // 1000 rows (x one slot per token), f16 on tensor cores: the tile bound is ⌈1000 / 64⌉ + 9 buckets
    b.matmulId(f32(b, [250, 1, 64]), weight("f16", 8 * 40, 64), b.alloc([250, 4], "i32"), { experts: 8 });
    // q8_0 experts take x quantized as ggml's Q8_0 first (blocks of 32, 8 per CTA)
    expect(b.launches.map((l) => [l.kernel, ...l.grid])).toEqual([
      ["ggml_fake_quantize_q8_0", 6, 1, 1],
      ["matmul_id_gemv_q8_0", 5, 63, 1],
      ["ggml_fake_quantize_q8_0", 16, 1, 1],
      ["moe_route_count", 1, 1, 1],
      ["moe_route_scan", 1, 1, 1],
      ["moe_route_scatter", 1, 1, 1],
      ["matmul_id_grouped_q8_0", 1, 1 + 9, 1],
      ["ggml_fake_quantize_q8_0", 16, 1, 1],
      ["matmul_id_gemv_q8_0", 2, 64, 1],
      ["moe_route_count", 4, 1, 1],
      ["moe_route_scan", 1, 1, 1],
      ["moe_route_scatter", 4, 1, 1],
      ["matmul_id_grouped_mma_f16", 1, 16 + 9, 1],
    ]);
  });
  test("matmul_id ConvRot and scaled fp8 experts: x rotated (W8A8-rounded for int8; this host is weight-only for int4), then the scaled kernels", () => {
    const b = new Recorder(90);
    const w8 = weight("int8_convrot", 4 * 16, 256);
    b.matmulId(f32(b, [2, 1, 256]), w8, b.alloc([2, 2], "i32"), { experts: 4 });
    b.matmulId(f32(b, [40, 2, 256]), weight("int4_convrot", 4 * 16, 256), b.alloc([40, 2], "i32"), {
      experts: 4,
    });
    const e5 = new Weight({
      name: "exps.e5m2",
      format: "f8_e5m2",
      shape: [4 * 16, 64],
      data: new Uint8Array(4 * 16 * 64),
      scale: { kind: "tensor", value: 0.25 },
    });
    b.matmulId(f32(b, [3, 1, 64]), e5, b.alloc([3, 2], "i32"), { experts: 4 });
    expect(b.names()).toEqual([
      "convrot_rotate_g256",
      "convrot_fake_quantize_rows_int8",
      "matmul_id_gemv_int8_convrot_s",
      "convrot_rotate_g256",
      "moe_route_count",
      "moe_route_scan",
      "moe_route_scatter",
      "matmul_id_grouped_int4_convrot_s",
      "matmul_id_gemv_f8_e5m2_s",
    ]);
  });
  test("gated_delta_net: one thread per (value head, value dim), all tokens in order", () => {
    const b = new Recorder(90);
    b.gatedDeltaNet(
      f32(b, [3, 1, 4]),
      f32(b, [3, 1, 4]),
      f32(b, [3, 2, 200]),
      f32(b, [3, 2]),
      f32(b, [3, 2]),
      f32(b, [2, 4, 200]),
    );
    expect(b.launches.map((l) => [l.kernel, ...l.grid])).toEqual([["gated_delta_net_f32", 2, 2, 1]]);
  });
  test("formats without a kernel (iq* but IQ4_NL / IQ4_XS) are E_UNSUPPORTED naming op and format", () => {
    const b = new Recorder(90);
    const iq = new Weight({
      name: "blk.0.ffn_up.weight",
      format: "iq2_xxs",
      shape: [4, 256],
      data: new Uint8Array(4 * 66),
    });
    expect(() => b.matmul(f32(b, [1, 256]), iq)).toThrow(/ptx.*matmul.*iq2_xxs|matmul.*ptx.*iq2_xxs/);
    expect(() => b.embedding(iq, b.alloc([2], "i32"))).toThrow(
      /ptx.*embedding.*iq2_xxs|embedding.*ptx.*iq2_xxs/,
    );
    expect(() => b.matmulId(f32(b, [1, 1, 256]), iq, b.alloc([1, 1], "i32"), { experts: 4 })).toThrow(
      /ptx.*matmul_id.*iq2_xxs|matmul_id.*ptx.*iq2_xxs/,
    );
    for (const op of ["matmul", "matmul_id", "embedding"] as const)
      for (const format of ["iq2_xxs", "iq3_s", "q8_k"] as const) {
        expect(b.supports(op, [format])).toBe(false);
        for (const iq4 of ["iq4_nl", "iq4_xs"] as const) expect(b.supports(op, [iq4])).toBe(true);
      }
  });
});
