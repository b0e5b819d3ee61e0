// The real CudaBackend on @tp/backend-ptx's PTX simulator (TP_PTX_SIMULATE / `simulate`), with the
// stand-in libcublasLt.so.13 and libcudnn.so.9 built here with cc and found through TP_CUDA_LIB_DIR:
// `device` names the cuDNN version that loaded; without libcudnn.so.9 the backend starts, says so in
// `device`, keeps the one-line reason in `cudnnMissing`, and runs f16 attention and conv2d on the
// (simulated) PTX kernels between exact f16 ↔ f32 conversions, checked against the float64
// references of ./testing.ts. (The stand-in cuDNN reads host memory, so no cuDNN op runs on the
// simulator's device memory here; ./cudnn-backend.test.ts runs those on a host-memory backend.)
// Skips without cc.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createBackend } from "./backend.ts";
import { buildFakeCudnn, referenceAttention, referenceConv2d } from "./testing.ts";

const cc = Bun.which("cc") ?? Bun.which("gcc");
const root = mkdtempSync(join(tmpdir(), "tp-cuda-sim-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const values = (n: number, seed: number) =>
  Array.from({ length: n }, (_, i) => (((i * 31 + seed * 17) % 83) / 83) * 2 - 1);
const f16 = (xs: number[]) => new Uint16Array(new Float16Array(xs).buffer);
const fromF16 = (b: ArrayLike<number>) => [...new Float16Array(new Uint16Array(b).buffer)];

describe("CudaBackend on the PTX simulator with stand-in NVIDIA libraries", () => {
  if (cc === null) {
    test.skip("skipped: no C compiler (cc)", () => {});
    return;
  }
  const both = join(root, "both");
  const ltOnly = join(root, "lt-only");
  for (const d of [both, ltOnly]) {
    mkdirSync(d);
    Bun.spawnSync([
      cc,
      "-O1",
      "-shared",
      "-fPIC",
      "-o",
      join(d, "libcublasLt.so.13"),
      join(import.meta.dir, "../test/fake-cublaslt.c"),
    ]);
  }
  const built = buildFakeCudnn(both);
  test("the stand-ins build", () => {
    expect(built.exitCode).toBe(0);
  });

  test("with libcudnn.so.9: device names cuBLASLt's and cuDNN's versions", () => {
    const be = createBackend({ simulate: "sm_86", env: { TP_CUDA_LIB_DIR: both } });
    try {
      expect(be.device).toEndWith(", cuBLASLt 13.0.2, cuDNN 9.10.0");
      expect(be.cudnn?.path).toBe(join(both, "libcudnn.so.9"));
      expect(be.cudnnMissing).toBeNull();
      expect(be.cudnnF32Attention).toBe(false);
      const caps = be.capabilities();
      expect(caps.dtypes).toContain("f16");
      expect(be.supports("attention")).toBe(true);
    } finally {
      be.dispose();
    }
  });

  test("TP_CUDA_CUDNN=0 or cudnn: false leaves cuDNN unloaded, and says so", () => {
    for (const options of [
      { env: { TP_CUDA_LIB_DIR: both, TP_CUDA_CUDNN: "0" } },
      { env: { TP_CUDA_LIB_DIR: both }, cudnn: false },
    ]) {
      const be = createBackend({ simulate: "sm_86", ...options });
      expect(be.cudnn).toBeNull();
      expect(be.cudnnMissing).toBe("cuDNN turned off (cudnn: false or TP_CUDA_CUDNN=0)");
      expect(be.device).toEndWith("no cuDNN (attention and conv2d on PTX)");
      be.dispose();
    }
  });

  test("the f32 → bf16 attention route is opt-in: option or TP_CUDA_CUDNN_ATTENTION=1", () => {
    for (const [options, want] of [
      [{ env: { TP_CUDA_LIB_DIR: both, TP_CUDA_CUDNN_ATTENTION: "1" } }, true],
      [{ env: { TP_CUDA_LIB_DIR: both }, cudnnF32Attention: true }, true],
      [{ env: { TP_CUDA_LIB_DIR: both, TP_CUDA_CUDNN_ATTENTION: "0" } }, false],
    ] as const) {
      const be = createBackend({ simulate: "sm_86", ...options });
      expect(be.cudnnF32Attention).toBe(want);
      be.dispose();
    }
  });

  test("without libcudnn.so.9: one line naming it and how to install it; f16 attention and conv2d on PTX", async () => {
    const be = createBackend({ simulate: "sm_86", env: { TP_CUDA_LIB_DIR: ltOnly } });
    try {
      expect(be.cudnn).toBeNull();
      expect(be.device).toEndWith(", cuBLASLt 13.0.2, no cuDNN (attention and conv2d on PTX)");
      expect(be.cudnnMissing).toStartWith(
        `libcudnn.so.9 (cuDNN) was not found: tried ${ltOnly}/libcudnn.so.9, libcudnn.so.9 on the loader path; cuDNN 9 comes with PyTorch's nvidia-cudnn-cu13 wheel`,
      );
      expect(be.cudnnMissing).not.toContain("\n");

      const p = { batch: 1, heads: 2, kvHeads: 1, sq: 3, skv: 5, headDim: 8 };
      const q = fromF16(f16(values(p.heads * p.sq * 8, 1)));
      const k = fromF16(f16(values(p.skv * 8, 2)));
      const v = fromF16(f16(values(p.skv * 8, 3)));
      const y = be.attention(
        be.upload(f16(q), [1, 2, 3, 8], "f16"),
        be.upload(f16(k), [1, 1, 5, 8], "f16"),
        be.upload(f16(v), [1, 1, 5, 8], "f16"),
        { causal: true },
      );
      expect(y.dtype).toBe("f16");
      const want = referenceAttention(q, k, v, { ...p, scale: 1 / Math.sqrt(8), causal: true, qOffset: 2 });
      const got = fromF16((await be.read(y)) as Uint16Array);
      // f32 kernel, one rounding to f16 at the end
      for (let i = 0; i < got.length; i++)
        expect(Math.abs((got[i] as number) - (want[i] as number))).toBeLessThan(1e-3);

      const x = fromF16(f16(values(2 * 5 * 5, 4)));
      const w = fromF16(f16(values(3 * 2 * 3 * 3, 5)));
      const out = be.conv2d(
        be.upload(f16(x), [1, 2, 5, 5], "f16"),
        be.upload(f16(w), [3, 2, 3, 3], "f16"),
        null,
        {
          padding: 1,
        },
      );
      expect(out.dtype).toBe("f16");
      const wantC = referenceConv2d(x, w, null, {
        n: 1,
        c: 2,
        h: 5,
        w: 5,
        k: 3,
        r: 3,
        s: 3,
        stride: [1, 1],
        pad: [1, 1],
      });
      const gotC = fromF16((await be.read(out)) as Uint16Array);
      for (let i = 0; i < gotC.length; i++)
        expect(Math.abs((gotC[i] as number) - (wantC[i] as number))).toBeLessThan(4e-3);
    } finally {
      be.dispose();
    }
  });
});
