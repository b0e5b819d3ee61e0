// The cuda backend's matmul routing without a GPU: a host whose "device memory" is the fake cuBLASLt's
// (./fake-cublaslt.ts), PTX launches checked against each kernel's .param list (packLaunch, as the real
// launch does) and recorded (the f32 → bf16 cast emulated on the host), and the ptx
// table's matmul as the fallback. Checks which path each format and token count takes, the launches
// around the int8 GEMM, one heuristic query per shape, and — bf16 — the numbers: y = x·wᵀ + b summed
// in float64 here (inputs exact in bf16, so the comparison is exact).
import { describe, expect, test } from "bun:test";
import { type LaunchArg, packLaunch, type ptx } from "@tp/backend-ptx";
import { BackendBase, dtypeBytes, type KernelTable, type Tensor, Weight } from "@tp/tensor";
import { type CudaOpHost, cublasLtRoute, cudaKernelTable } from "./backend.ts";
import { CublasLt } from "./cublaslt.ts";
import type { Cudnn } from "./cudnn.ts";
import { bf16Bits, fakeCublasLt } from "./fake-cublaslt.ts";
import { CUBLASLT_MATMUL_DESC, CUDA_DATA_TYPE } from "./nvidia-h.ts";
import { referenceLinear } from "./testing.ts";

interface FakeStorage {
  readonly bytes: Uint8Array;
  readonly addr: bigint;
}

class FakeHost extends BackendBase implements CudaOpHost {
  readonly name = "fake-cuda";
  readonly device = "fake";
  readonly sm = 90;
  readonly w4a4 = false;
  readonly stream = 7;
  fp8Activations = true;
  readonly cudnn: Cudnn | null = null;
  readonly cudnnF32Attention = false;
  readonly fake: ReturnType<typeof fakeCublasLt>;
  readonly lt: CublasLt;
  readonly launches: {
    name: string;
    grid: readonly number[];
    args: string[];
    numbers: Record<string, number>;
  }[] = [];
  readonly #kernels = new Map<string, ptx.KernelSource>();
  constructor(noAlgoFor?: number) {
    super("fake-cuda");
    this.fake = fakeCublasLt(noAlgoFor === undefined ? {} : { noAlgoFor });
    this.lt = new CublasLt(this.fake.symbols);
  }
  protected allocStorage(bytes: number): FakeStorage {
    const b = new Uint8Array(Math.max(bytes, 1));
    return { bytes: b, addr: this.fake.device(b) };
  }
  protected freeStorage(): void {}
  protected writeStorage(h: unknown, offset: number, data: Uint8Array): void {
    (h as FakeStorage).bytes.set(data, offset);
  }
  protected async readStorage(h: unknown, offset: number, length: number): Promise<Uint8Array> {
    return (h as FakeStorage).bytes.slice(offset, offset + length);
  }
  address(t: Tensor): bigint {
    return (t.storage.handle as FakeStorage).addr + BigInt(t.layout.offset * dtypeBytes(t.dtype));
  }
  bytesOf(t: Tensor): Uint8Array {
    return (t.storage.handle as FakeStorage).bytes;
  }
  workspace() {
    return { ptr: 0x10n, bytes: 1 << 20 };
  }
  kernel(name: string, make: () => ptx.KernelSource): ptx.KernelSource {
    let k = this.#kernels.get(name);
    if (k === undefined) {
      k = make();
      this.#kernels.set(name, k);
    }
    return k;
  }
  launch(
    kernel: ptx.KernelSource,
    grid: readonly [number, number, number],
    args: Record<string, LaunchArg>,
  ): void {
    // the arguments must match the kernel's .param list exactly (as the real launch checks)
    packLaunch(kernel, grid, args, (t) => this.address(t));
    const numbers = Object.fromEntries(
      Object.entries(args).filter((e): e is [string, number] => typeof e[1] === "number"),
    );
    this.launches.push({ name: kernel.name, grid, args: Object.keys(args).sort(), numbers });
    if (kernel.name.startsWith("map_cast_f32_to_bf16")) {
      const src = new Float32Array(this.bytesOf(args.in0 as Tensor).buffer);
      const dst = new Uint16Array(this.bytesOf(args.out as Tensor).buffer);
      // the test's values are exact in bf16: truncation is the rounding
      for (let i = 0; i < (args.n as number); i++) dst[i] = bf16Bits(src[i] as number);
    }
  }
  fill(): void {}
  weightBytes(w: Weight): Tensor {
    return this.upload(w.data, [w.data.byteLength], "u8", w.name);
  }
  weightScale(w: Weight): Tensor {
    const v = w.scale?.kind === "row" ? w.scale.values : new Float32Array(w.shape[0]);
    return this.upload(v, [v.length], "f32", `${w.name}.scale`);
  }
}

function setup(noAlgoFor?: number) {
  const host = new FakeHost(noAlgoFor);
  const ptxCalls: string[] = [];
  const base: KernelTable = {
    matmul: {
      dtypes: ["f32"],
      weightFormats: ["f32", "bf16", "f16", "q8_0", "int8_convrot", "f8_e4m3fn"],
      run: (_o, _x, w) => {
        ptxCalls.push(w.format);
      },
    },
  };
  const table = cudaKernelTable(host, base);
  const run = (out: Tensor, x: Tensor, w: Weight, bias: Tensor | null) =>
    (table.matmul as NonNullable<KernelTable["matmul"]>).run(out, x, w, bias);
  return { host, ptxCalls, run };
}

describe("routing", () => {
  test("bf16 / f16 from 9 tokens, INT8 ConvRot from 16 (K a multiple of 16); the rest stays on PTX", () => {
    expect(cublasLtRoute("bf16", 9, 64, 64, 90)).toBe("bf16");
    expect(cublasLtRoute("f16", 4096, 64, 64, 80)).toBe("f16");
    expect(cublasLtRoute("bf16", 8, 64, 64, 90)).toBeNull(); // decode: the PTX gemv reads f32 x directly
    expect(cublasLtRoute("int8_convrot", 16, 256, 64, 90)).toBe("int8");
    expect(cublasLtRoute("int8_convrot", 15, 256, 64, 90)).toBeNull();
    expect(cublasLtRoute("int8_convrot", 64, 24, 64, 90)).toBeNull();
    expect(cublasLtRoute("f8_e4m3fn", 16, 256, 64, 89)).toBe("fp8_e4m3");
    expect(cublasLtRoute("f8_e4m3fn", 16, 256, 64, 86)).toBeNull(); // no fp8 tensor cores before Ada
    expect(cublasLtRoute("f8_e4m3fn", 24, 256, 64, 90)).toBeNull(); // tokens not a multiple of 16
    expect(cublasLtRoute("f8_e4m3fn", 32, 256, 72, 90)).toBeNull();
    for (const f of ["f32", "q8_0", "q4_0", "int4_convrot", "f8_e5m2"])
      expect(cublasLtRoute(f, 1024, 256, 256, 90)).toBeNull();
  });
});

describe("matmul through cuBLASLt", () => {
  test("bf16 + bias: cast, one GEMM with bias epilogue, y = x·wᵀ + b; the plan is reused", async () => {
    const { host, ptxCalls, run } = setup();
    const [T, K, N] = [12, 16, 5];
    const x = Array.from({ length: T * K }, (_, i) => ((i * 7) % 13) / 4 - 1.5);
    const w = Array.from({ length: N * K }, (_, i) => ((i * 5) % 11) / 8 - 0.625);
    const b = [1, -2, 0.5, 0.25, 3];
    const weight = new Weight({
      name: "blk.0.attn_q.weight",
      format: "bf16",
      shape: [N, K],
      data: new Uint8Array(new Uint16Array(w.map(bf16Bits)).buffer),
    });
    const xt = host.upload(new Float32Array(x), [T, K], "f32", "x");
    const bt = host.upload(new Float32Array(b), [N], "f32", "bias");
    const out = host.alloc([T, N], "f32", "y");
    run(out, xt, weight, bt);
    run(out, xt, weight, bt);
    expect(ptxCalls).toEqual([]);
    expect(host.launches.map((l) => l.name)).toEqual(["map_cast_f32_to_bf16_r2", "map_cast_f32_to_bf16_r2"]);
    expect(host.lt.heuristicQueries).toBe(1);
    expect(host.fake.calls.filter((c) => c === "matmul").length).toBe(2);
    const y = new Float32Array((await host.read(out)).buffer);
    expect([...y]).toEqual(referenceLinear(x, w, b, T, K, N));
  });
  test("a strided bias view: no epilogue; the ptx add kernel adds it with its stride", async () => {
    const { host, run } = setup();
    const [T, K, N] = [16, 16, 4];
    const weight = new Weight({
      name: "w",
      format: "bf16",
      shape: [N, K],
      data: new Uint8Array(new Uint16Array(N * K).fill(bf16Bits(0.5)).buffer),
    });
    const bias = host.upload(new Float32Array([1, 9, 2, 9, 3, 9, 4, 9]), [8], "f32").slice(0, 0, 8, 2);
    expect(bias.isContiguous).toBe(false);
    run(host.alloc([T, N], "f32"), host.upload(new Float32Array(T * K).fill(1), [T, K], "f32"), weight, bias);
    expect(host.launches.map((l) => l.name)).toEqual([
      "map_cast_f32_to_bf16_r2",
      "map_add_f32_f32_to_f32_r2",
    ]);
    const desc = [...host.fake.descs.values()][0];
    expect(desc?.attrs.has(CUBLASLT_MATMUL_DESC.CUBLASLT_MATMUL_DESC_BIAS_POINTER)).toBe(false);
    // out [16, 4] walked as rows × columns; the bias broadcast over rows with its element stride 2
    expect(host.launches[1]?.numbers).toEqual({
      n: 64,
      size0: 16,
      size1: 4,
      stride1_0: 4,
      stride1_1: 1,
      stride2_0: 0,
      stride2_1: 2,
    });
  });
  test("INT8 ConvRot: rotate, quantize rows, int8 GEMM into int32, dequantize with both scales and the bias", () => {
    const { host, ptxCalls, run } = setup();
    const [T, K, N] = [16, 256, 8];
    const weight = new Weight({
      name: "blk.0.ffn_up.weight",
      format: "int8_convrot",
      shape: [N, K],
      data: new Uint8Array(N * K).fill(3),
      scale: { kind: "row", values: new Float32Array(N).fill(0.01) },
      rotationGroup: 256,
    });
    const out = host.alloc([T, N], "f32", "y");
    run(out, host.upload(new Float32Array(T * K).fill(0.5), [T, K], "f32"), weight, host.alloc([N], "f32"));
    expect(ptxCalls).toEqual([]);
    expect(host.launches.map((l) => [l.name, l.grid.join("x")])).toEqual([
      ["convrot_rotate_g256", "1x16x1"],
      ["convrot_quantize_rows_int8", "16x1x1"],
      ["cudalibs_dequant_i32_bias", "1x1x1"],
    ]);
    expect(host.launches[2]?.args).toEqual(["acc", "bias", "cols", "out", "rows", "w_scale", "x_scale"]);
    expect(host.fake.calls.filter((c) => c === "matmul").length).toBe(1);
  });
  test("fp8 e4m3: absmax, per-tensor quantization, fp8 GEMM with the weight's and x's scales, bias added after", () => {
    for (const scaled of [true, false]) {
      const { host, ptxCalls, run } = setup();
      const [T, K, N] = [16, 32, 16];
      const weight = new Weight({
        name: "blk.0.ffn_down.weight",
        format: "f8_e4m3fn",
        shape: [N, K],
        data: new Uint8Array(N * K).fill(0x38),
        ...(scaled ? { scale: { kind: "tensor" as const, value: 0.5 } } : {}),
      });
      run(host.alloc([T, N], "f32"), host.alloc([T, K], "f32"), weight, host.alloc([N], "f32"));
      expect(ptxCalls).toEqual([]);
      expect(host.launches.map((l) => [l.name, l.grid.join("x")])).toEqual([
        ["cudalibs_absmax_f32", "2x1x1"],
        ["cudalibs_quantize_fp8_e4m3", "1x1x1"],
        ["map_add_f32_f32_to_f32_r2", "1x1x1"],
      ]);
      const desc = [...host.fake.descs.values()][0];
      expect(desc?.attrs.get(CUBLASLT_MATMUL_DESC.CUBLASLT_MATMUL_DESC_B_SCALE_POINTER)).toBeGreaterThan(0n);
      const a = desc?.attrs.get(CUBLASLT_MATMUL_DESC.CUBLASLT_MATMUL_DESC_A_SCALE_POINTER);
      if (scaled) expect(a).toBeGreaterThan(0n);
      else expect(a).toBe(0n);
      expect(host.fake.calls.filter((c) => c === "matmul").length).toBe(1);
    }
  });
  test("fp8 without the opt-in stays on the PTX kernels", () => {
    const { host, ptxCalls, run } = setup();
    host.fp8Activations = false;
    const weight = new Weight({ name: "w", format: "f8_e4m3fn", shape: [16, 32], data: new Uint8Array(512) });
    run(host.alloc([16, 16], "f32"), host.alloc([16, 32], "f32"), weight, null);
    expect(ptxCalls).toEqual(["f8_e4m3fn"]);
    expect(host.lt.heuristicQueries).toBe(0);
  });
  test("decode-sized bf16, q8_0 and shapes without a cuBLASLt algorithm stay on the PTX kernels", () => {
    const { host, ptxCalls, run } = setup();
    const bf = new Weight({ name: "w", format: "bf16", shape: [4, 16], data: new Uint8Array(128) });
    run(host.alloc([1, 4], "f32"), host.alloc([1, 16], "f32"), bf, null);
    const q8 = new Weight({ name: "q", format: "q8_0", shape: [4, 32], data: new Uint8Array(4 * 34) });
    run(host.alloc([64, 4], "f32"), host.alloc([64, 32], "f32"), q8, null);
    expect(ptxCalls).toEqual(["bf16", "q8_0"]);
    expect(host.lt.heuristicQueries).toBe(0);
    const none = setup(CUDA_DATA_TYPE.CUDA_R_16BF);
    for (let i = 0; i < 2; i++)
      none.run(none.host.alloc([32, 4], "f32"), none.host.alloc([32, 16], "f32"), bf, null);
    expect(none.ptxCalls).toEqual(["bf16", "bf16"]);
    expect(none.host.lt.heuristicQueries).toBe(1);
    expect(none.host.launches).toEqual([]);
  });
});
