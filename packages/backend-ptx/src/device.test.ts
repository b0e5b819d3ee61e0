// On a machine with an NVIDIA driver and GPU (the GPU host, `bun run test:gpu`): the driver layer and
// the backend's memory for real. Values are checked against independent host results: bytes read back
// equal the bytes uploaded, f32 addition is one IEEE rounding (Math.fround(a + b)) on any backend.
// Skips, with the reason, where libcuda.so.1 is absent.
import { describe, expect, test } from "bun:test";
import { TpError } from "@tp/tensor";
import { createBackend } from "./backend.ts";
import { loadCudaDriver } from "./driver/cuda.ts";

const why = (() => {
  try {
    const d = loadCudaDriver();
    return d.deviceCount() > 0 ? null : "the CUDA driver reports no device";
  } catch (e) {
    return `no CUDA device here (${(e as Error).message.slice(0, 80)}…); runs on the GPU host`;
  }
})();

describe("ptx on a CUDA device", () => {
  if (why !== null) {
    test.skip(`skipped: ${why}`, () => {});
    return;
  }
  test("device report names the GPU, its memory and compute capability", () => {
    const b = createBackend();
    try {
      expect(b.device).toMatch(/\(sm_\d+, [\d.]+ GiB, \d+ SMs, CUDA driver \d+\.\d+\)$/);
    } finally {
      b.dispose();
    }
  });
  test("upload / read round trip across staging chunks, with byte accounting", async () => {
    const b = createBackend();
    try {
      const n = (40 << 20) + 123; // past two 16 MiB staging chunks
      const data = new Uint8Array(n);
      for (let i = 0; i < n; i++) data[i] = (i * 2654435761) >>> 24;
      const before = b.memory.current;
      const t = b.upload(data, [n], "u8");
      expect(b.memory.current - before).toBe(n);
      expect(b.allocatorStats().reserved).toBeGreaterThanOrEqual(n);
      const back = (await b.read(t)) as Uint8Array;
      expect(back.length).toBe(n);
      let diff = 0;
      for (let i = 0; i < n; i++) if (back[i] !== data[i]) diff++;
      expect(diff).toBe(0);
      b.free(t);
      expect(b.memory.current).toBe(before);
    } finally {
      b.dispose();
    }
  });
  test("add of two f32 arrays is one IEEE rounding per element (exact match)", async () => {
    const b = createBackend();
    try {
      const a = Float32Array.from({ length: 1000 }, (_, i) => Math.sin(i) * 1e3);
      const c = Float32Array.from({ length: 1000 }, (_, i) => Math.cos(i * 0.7) * 1e-2);
      const out = (await b.read(
        b.add(b.upload(a, [1000], "f32"), b.upload(c, [1000], "f32")),
      )) as Float32Array;
      const want = a.map((v, i) => Math.fround(v + (c[i] as number)));
      expect([...out]).toEqual([...want]);
    } finally {
      b.dispose();
    }
  });
  test("a PTX module the JIT refuses is a TpError naming cuModuleLoadDataEx and the kernel", () => {
    const b = createBackend();
    try {
      let err: unknown;
      try {
        b.driver.loadPtx(
          ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry broken() { bogus; }",
          "broken",
        );
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(TpError);
      expect((err as TpError).message).toMatch(
        /^cuModuleLoadDataEx failed: CUDA_ERROR_\w+ \(\d+\).*kernel broken/,
      );
    } finally {
      b.dispose();
    }
  });
  test("events time queued work (elapsed ≥ 0 ms)", async () => {
    const b = createBackend();
    try {
      const d = b.driver;
      const [e0, e1] = [d.eventCreate(), d.eventCreate()];
      d.eventRecord(e0, b.stream);
      b.scale(b.upload(new Float32Array(1 << 20).fill(1), [1 << 20], "f32"), 2);
      d.eventRecord(e1, b.stream);
      d.eventSynchronize(e1);
      expect(d.eventElapsedMs(e0, e1)).toBeGreaterThanOrEqual(0);
      d.eventDestroy(e0);
      d.eventDestroy(e1);
    } finally {
      b.dispose();
    }
  });
});
