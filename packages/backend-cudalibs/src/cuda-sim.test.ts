// The cuda backend's cuDNN start-up and fallbacks without a GPU:
// - openCudnn / librariesNote (what CudaBackend calls) with the stand-in libcudnn.so.9 built here with cc
//   and found through TP_CUDA_LIB_DIR: `device` names the cuDNN version that loaded; TP_CUDA_CUDNN=0 or
//   `cudnn: false` leaves it unloaded; an absent library is one line naming it and how to install it;
// - the real CudaBackend on @tp/backend-ptx's PTX simulator (which has no cuDNN: no real library can read
//   its buffers): `device` says so, and f16 attention and conv2d run on the simulated PTX kernels between
//   exact f16 ↔ f32 conversions, checked against the float64 references of ./testing.ts.
// Skips the stand-in parts without cc.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createBackend, librariesNote, openCudnn } from "./backend.ts";
import { buildFakeCudnn, referenceAttention, referenceConv2d } from "./testing.ts";

const cc = Bun.which("cc") ?? Bun.which("gcc");
const root = mkdtempSync(join(tmpdir(), "tp-cuda-sim-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const values = (n: number, seed: number) =>
  Array.from({ length: n }, (_, i) => (((i * 31 + seed * 17) % 83) / 83) * 2 - 1);
const f16 = (xs: number[]) => new Uint16Array(new Float16Array(xs).buffer);
const fromF16 = (b: ArrayLike<number>) => [...new Float16Array(new Uint16Array(b).buffer)];

describe("opening cuDNN (the stand-in library)", () => {
  if (cc === null) {
    test.skip("skipped: no C compiler (cc)", () => {});
    return;
  }
  const withDnn = join(root, "with");
  const without = join(root, "without");
  mkdirSync(withDnn);
  mkdirSync(without);
  const built = buildFakeCudnn(withDnn);
  test("the stand-in builds", () => {
    expect(built.exitCode).toBe(0);
  });
  test("loaded: device names cuBLASLt's and cuDNN's versions", () => {
    const { cudnn, missing } = openCudnn(5, {}, { TP_CUDA_LIB_DIR: withDnn }, false);
    expect(missing).toBeNull();
    expect(cudnn?.path).toBe(join(withDnn, "libcudnn.so.9"));
    expect(librariesNote(130002, cudnn)).toBe(", cuBLASLt 13.0.2, cuDNN 9.10.0");
    cudnn?.destroy();
  });
  test("TP_CUDA_CUDNN=0 or cudnn: false: not loaded, and said so", () => {
    for (const [options, env] of [
      [{}, { TP_CUDA_LIB_DIR: withDnn, TP_CUDA_CUDNN: "0" }],
      [{ cudnn: false }, { TP_CUDA_LIB_DIR: withDnn }],
    ] as const) {
      const { cudnn, missing } = openCudnn(5, options, env, false);
      expect(cudnn).toBeNull();
      expect(missing).toBe("cuDNN turned off (cudnn: false or TP_CUDA_CUDNN=0)");
      expect(librariesNote(130002, cudnn)).toBe(", cuBLASLt 13.0.2, no cuDNN (attention and conv2d on PTX)");
    }
    // the option wins over the environment
    const on = openCudnn(5, { cudnn: true }, { TP_CUDA_LIB_DIR: withDnn, TP_CUDA_CUDNN: "0" }, false);
    expect(on.cudnn).not.toBeNull();
    on.cudnn?.destroy();
  });
  test("absent: one line naming libcudnn.so.9, the places tried and how to install it", () => {
    const { cudnn, missing } = openCudnn(5, {}, { TP_CUDA_LIB_DIR: without }, false);
    expect(cudnn).toBeNull();
    expect(missing).toStartWith(
      `libcudnn.so.9 (cuDNN) was not found: tried ${without}/libcudnn.so.9, libcudnn.so.9 on the loader path; cuDNN 9 comes with PyTorch's nvidia-cudnn-cu13 wheel`,
    );
    expect(missing).not.toContain("\n");
  });
});

describe("CudaBackend on the PTX simulator (no cuDNN there)", () => {
  test("device and cudnnMissing say so; the f32 attention opt-in is read", () => {
    const be = createBackend({ simulate: "sm_86", env: { TP_CUDA_CUDNN_ATTENTION: "1" } });
    try {
      expect(be.cudnn).toBeNull();
      expect(be.cudnnMissing).toBe("the PTX simulator has no cuDNN");
      expect(be.device).toEndWith(", cuBLASLt model (float64), no cuDNN (attention and conv2d on PTX)");
      expect(be.cudnnF32Attention).toBe(true);
    } finally {
      be.dispose();
    }
    const off = createBackend({ simulate: "sm_86", env: {} });
    expect(off.cudnnF32Attention).toBe(false);
    off.dispose();
  });

  test("f16 attention (grouped heads, causal) and conv2d on the simulated PTX kernels", async () => {
    const be = createBackend({ simulate: "sm_86", env: {} });
    try {
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
        { padding: 1 },
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
