// The bun:ffi declarations of ./cublaslt.ts called for real: a stand-in libcublasLt.so.13 built here with
// cc (../test/fake-cublaslt.c, cublasLt.h's prototypes, a bf16 TN GEMM on host memory) is loaded through
// TP_CUDA_LIB_DIR like the real one, and a linear layer with bias goes through CublasLt: plan,
// heuristic, matmul with host addresses standing for device ones. Checks the marshalling of every
// argument (the stand-in refuses wrong types, sizes, transposes, workspace or stream) and
// y = x·wᵀ + b against float64 sums here (inputs exact in bf16, so exact). Skips without cc.

import { dlopen, ptr } from "bun:ffi";
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { TpError } from "@tp/tensor";
import { CublasLt, loadCublasLt } from "./cublaslt.ts";
import { bf16Bits } from "./fake-cublaslt.ts";
import { referenceLinear } from "./testing.ts";

const cc = Bun.which("cc") ?? Bun.which("gcc");
const dir = mkdtempSync(join(tmpdir(), "tp-fake-lt-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("cuBLASLt through bun:ffi (a stand-in library built with cc)", () => {
  if (cc === null) {
    test.skip("skipped: no C compiler (cc)", () => {});
    return;
  }
  const so = join(dir, "libcublasLt.so.13");
  const build = Bun.spawnSync([
    cc,
    "-O1",
    "-shared",
    "-fPIC",
    "-o",
    so,
    join(import.meta.dir, "../test/fake-cublaslt.c"),
  ]);
  test("the stand-in builds", () => {
    expect(build.stderr.toString()).toBe("");
    expect(build.exitCode).toBe(0);
  });
  test("load from TP_CUDA_LIB_DIR, plan, matmul: y = x·wᵀ + b; descriptors released on destroy", () => {
    const lib = loadCublasLt({ TP_CUDA_LIB_DIR: dir });
    expect(lib.path).toBe(so);
    const lt = new CublasLt(lib.symbols);
    expect(lt.version()).toBe(130002);
    const [T, K, N] = [6, 24, 5];
    const x = Array.from({ length: T * K }, (_, i) => ((i * 7) % 17) / 8 - 1);
    const w = Array.from({ length: N * K }, (_, i) => ((i * 3) % 13) / 4 - 1.5);
    const b = [0.5, -1, 2, 0, 0.25];
    const plan = lt.plan({ kind: "bf16", tokens: T, inFeatures: K, outFeatures: N, bias: true });
    expect(plan?.workspaceBytes).toBe(256);
    const wb = new Uint16Array(w.map(bf16Bits));
    const xb = new Uint16Array(x.map(bf16Bits));
    const bias = new Float32Array(b);
    const y = new Float32Array(T * N);
    const ws = new Uint8Array(256);
    const addr = (a: Uint8Array | Uint16Array | Float32Array) => BigInt(ptr(a));
    lt.matmul(
      plan as NonNullable<typeof plan>,
      { w: addr(wb), x: addr(xb), y: addr(y), bias: addr(bias) },
      { ptr: addr(ws), bytes: ws.byteLength },
      5,
    );
    expect([...y]).toEqual(referenceLinear(x, w, b, T, K, N));
    const live = dlopen(so, { tp_fake_live: { args: [], returns: "i32" } });
    expect(live.symbols.tp_fake_live()).toBe(4); // one descriptor and three layouts kept by the plan
    lt.destroy();
    expect(live.symbols.tp_fake_live()).toBe(0);
    live.close();
  });
  test("a failing call: TpError naming it, the status, the library's text and the shape", () => {
    const lt = new CublasLt(loadCublasLt({ TP_CUDA_LIB_DIR: dir }).symbols);
    let e: unknown;
    try {
      lt.plan({ kind: "bf16", tokens: 8, inFeatures: 1 << 21, outFeatures: 8, bias: false });
    } catch (err) {
      e = err;
    }
    expect(e).toBeInstanceOf(TpError);
    expect((e as TpError).code).toBe("E_ARG");
    expect((e as TpError).message).toBe(
      "cublasLtMatrixLayoutCreate failed: CUBLAS_STATUS_INVALID_VALUE (7): fake: an invalid value; bf16:8x2097152x8:nobias, 2097152 × 8",
    );
    lt.destroy();
  });
});
