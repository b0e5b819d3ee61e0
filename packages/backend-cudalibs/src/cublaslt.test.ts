// CublasLt against a model of the library (./fake-cublaslt.ts): the plan per shape (heuristic asked
// once, cached; no algorithm → null, cached), the TN operand mapping checked numerically — the fake
// computes D from the layouts as cuBLASLt defines them and the test compares with y = x·wᵀ (+ b)
// summed in float64 here — and status codes as TpError naming the call and the shape.
import { describe, expect, test } from "bun:test";
import { thrownTpError } from "@tp/tensor/testing";
import { CublasLt, cublasError, cublasStatusCode, type GemmShape } from "./cublaslt.ts";
import { bf16Bits, e4m3, fakeCublasLt } from "./fake-cublaslt.ts";
import { CUBLAS_STATUS, CUDA_DATA_TYPE } from "./nvidia-h.ts";
import { referenceLinear } from "./testing.ts";

const WS = { ptr: 0x1000n, bytes: 1 << 20 };
/** Deterministic small integers in [-r, r]. */
const ints = (n: number, r: number, seed: number) =>
  Array.from({ length: n }, (_, i) => ((((i + 1) * 2654435761 + seed * 40503) >>> 0) % (2 * r + 1)) - r);
/** The e4m3 code of a value it holds exactly (found by decoding all 256 codes). */
const e4m3Code = (v: number) => {
  for (let c = 0; c < 256; c++) if (e4m3(c) === v) return c;
  throw new Error(`${v} is not an e4m3 value`);
};

describe("plans", () => {
  const shape: GemmShape = { kind: "bf16", tokens: 32, inFeatures: 64, outFeatures: 48, bias: false };
  test("the heuristic is asked once per shape; layouts are A = K×N, B = K×tokens, D = N×tokens (ld = rows)", () => {
    const f = fakeCublasLt();
    const lt = new CublasLt(f.symbols);
    const p = lt.plan(shape);
    expect(p).not.toBeNull();
    expect(lt.plan(shape)).toBe(p);
    expect(lt.heuristicQueries).toBe(1);
    expect(p?.workspaceBytes).toBe(4096);
    const [a, b, d] = (p?.layouts ?? []).map((h) => f.layouts.get(h));
    expect(a).toEqual({ type: CUDA_DATA_TYPE.CUDA_R_16BF, rows: 64, cols: 48, ld: 64 });
    expect(b).toEqual({ type: CUDA_DATA_TYPE.CUDA_R_16BF, rows: 64, cols: 32, ld: 64 });
    expect(d).toEqual({ type: CUDA_DATA_TYPE.CUDA_R_32F, rows: 48, cols: 32, ld: 48 });
    lt.plan({ ...shape, tokens: 33 });
    lt.plan({ ...shape, bias: true });
    expect(lt.heuristicQueries).toBe(3);
    expect(f.prefs.size).toBe(0); // preferences are freed once the algorithm is chosen
    lt.destroy();
    expect(f.descs.size).toBe(0);
    expect(f.layouts.size).toBe(0);
    expect(f.calls.at(-1)).toBe("destroy");
  });
  test("no algorithm (CUBLAS_STATUS_NOT_SUPPORTED): null, cached, descriptors released", () => {
    const f = fakeCublasLt({ noAlgoFor: CUDA_DATA_TYPE.CUDA_R_8I });
    const lt = new CublasLt(f.symbols);
    const s: GemmShape = { kind: "int8", tokens: 16, inFeatures: 32, outFeatures: 8, bias: false };
    expect(lt.plan(s)).toBeNull();
    expect(lt.plan(s)).toBeNull();
    expect(lt.heuristicQueries).toBe(1);
    expect(f.descs.size).toBe(0);
    expect(f.layouts.size).toBe(0);
  });
  test("bad shapes are E_ARG before any call", () => {
    const lt = new CublasLt(fakeCublasLt().symbols);
    expect(thrownTpError(() => lt.plan({ ...shape, tokens: 0 })).message).toBe(
      "cuBLASLt GEMM bf16:0x64x48:nobias: tokens = 0 is not a positive 32-bit size",
    );
    expect(lt.heuristicQueries).toBe(0);
  });
});

describe("the linear layer through the TN layout", () => {
  test("bf16 with bias: y = x·wᵀ + b", () => {
    const [T, K, N] = [5, 8, 3];
    const x = ints(T * K, 6, 1).map((v) => v / 8);
    const w = ints(N * K, 5, 2).map((v) => v / 4);
    const b = [0.5, -1.25, 2];
    const f = fakeCublasLt();
    const lt = new CublasLt(f.symbols);
    const plan = lt.plan({ kind: "bf16", tokens: T, inFeatures: K, outFeatures: N, bias: true });
    const y = new Float32Array(T * N);
    const ops = {
      w: f.device(new Uint8Array(new Uint16Array(w.map(bf16Bits)).buffer)),
      x: f.device(new Uint8Array(new Uint16Array(x.map(bf16Bits)).buffer)),
      y: f.device(new Uint8Array(y.buffer)),
      bias: f.device(new Uint8Array(new Float32Array(b).buffer)),
    };
    lt.matmul(plan as NonNullable<typeof plan>, ops, WS, 0);
    // exact: every product and partial sum is a small multiple of 1/32 (f32 holds it)
    expect([...y]).toEqual(referenceLinear(x, w, b, T, K, N));
  });
  test("int8 → int32: q_x·q_wᵀ exactly", () => {
    const [T, K, N] = [16, 32, 4];
    const x = ints(T * K, 127, 3);
    const w = ints(N * K, 127, 4);
    const f = fakeCublasLt();
    const lt = new CublasLt(f.symbols);
    const plan = lt.plan({ kind: "int8", tokens: T, inFeatures: K, outFeatures: N, bias: false });
    const y = new Int32Array(T * N);
    lt.matmul(
      plan as NonNullable<typeof plan>,
      {
        w: f.device(new Uint8Array(new Int8Array(w).buffer)),
        x: f.device(new Uint8Array(new Int8Array(x).buffer)),
        y: f.device(new Uint8Array(y.buffer)),
      },
      WS,
      0,
    );
    expect([...y]).toEqual(referenceLinear(x, w, null, T, K, N));
  });
  test("fp8 e4m3 with per-tensor scales: y = (s_w·s_x)·(x_fp8·w_fp8ᵀ)", () => {
    const [T, K, N] = [4, 16, 2];
    const x = ints(T * K, 8, 5);
    const w = ints(N * K, 8, 6);
    const f = fakeCublasLt();
    const lt = new CublasLt(f.symbols);
    const plan = lt.plan({ kind: "fp8_e4m3", tokens: T, inFeatures: K, outFeatures: N, bias: false });
    const y = new Float32Array(T * N);
    const ops = {
      w: f.device(new Uint8Array(w.map(e4m3Code))),
      x: f.device(new Uint8Array(x.map(e4m3Code))),
      y: f.device(new Uint8Array(y.buffer)),
      wScale: f.device(new Uint8Array(new Float32Array([0.5]).buffer)),
      xScale: f.device(new Uint8Array(new Float32Array([0.25]).buffer)),
    };
    lt.matmul(plan as NonNullable<typeof plan>, ops, WS, 0);
    expect([...y]).toEqual(referenceLinear(x, w, null, T, K, N).map((v) => v * 0.125));
    expect(
      thrownTpError(() => lt.matmul(plan as NonNullable<typeof plan>, { ...ops, wScale: undefined }, WS, 0))
        .code,
    ).toBe("E_ARG");
  });
});

describe("cublasStatus_t → TpError", () => {
  test("codes by kind", () => {
    expect(cublasStatusCode(CUBLAS_STATUS.CUBLAS_STATUS_ALLOC_FAILED)).toBe("E_OOM");
    expect(cublasStatusCode(CUBLAS_STATUS.CUBLAS_STATUS_NOT_SUPPORTED)).toBe("E_UNSUPPORTED");
    expect(cublasStatusCode(CUBLAS_STATUS.CUBLAS_STATUS_ARCH_MISMATCH)).toBe("E_UNSUPPORTED");
    expect(cublasStatusCode(CUBLAS_STATUS.CUBLAS_STATUS_INVALID_VALUE)).toBe("E_ARG");
    expect(cublasStatusCode(CUBLAS_STATUS.CUBLAS_STATUS_EXECUTION_FAILED)).toBe("E_INTERNAL");
    expect(cublasError("cublasLtMatmul", 99).message).toBe("cublasLtMatmul failed: cublasStatus_t (99)");
  });
  test("a failing create names the call and status", () => {
    const e = thrownTpError(() => new CublasLt(fakeCublasLt({ failCreate: 3 }).symbols));
    expect(e.code).toBe("E_OOM");
    expect(e.message).toBe("cublasLtCreate failed: CUBLAS_STATUS_ALLOC_FAILED (3)");
  });
  test("a failing matmul names the call and the shape; a small workspace or a missing bias is E_ARG", () => {
    const f = fakeCublasLt({ failMatmul: 13 });
    const lt = new CublasLt(f.symbols);
    const plan = lt.plan({
      kind: "f16",
      tokens: 9,
      inFeatures: 16,
      outFeatures: 16,
      bias: true,
    }) as NonNullable<ReturnType<CublasLt["plan"]>>;
    const ops = { w: 1n, x: 2n, y: 3n, bias: 4n };
    const e = thrownTpError(() => lt.matmul(plan, ops, WS, 0));
    expect(e.message).toBe("cublasLtMatmul failed: CUBLAS_STATUS_EXECUTION_FAILED (13); f16:9x16x16:bias");
    expect(thrownTpError(() => lt.matmul(plan, ops, { ptr: 1n, bytes: 100 }, 0)).message).toBe(
      "cuBLASLt GEMM f16:9x16x16:bias: needs 4096 B of workspace, given 100",
    );
    expect(thrownTpError(() => lt.matmul(plan, { w: 1n, x: 2n, y: 3n }, WS, 0)).message).toContain(
      "bias missing",
    );
  });
});
