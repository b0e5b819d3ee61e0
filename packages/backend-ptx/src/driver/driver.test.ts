// The driver layer without a GPU: library lookup and its errors (absent, damaged, lacking symbols),
// CUresult → TpError mapping, kernel-argument packing, the caching allocator's bookkeeping and the
// staging chunking, with a fake driver where a real one would be needed.
import { describe, expect, test } from "bun:test";
import { copyFileSync, existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { TpError } from "@tp/tensor";
import { thrownTpError } from "@tp/tensor/testing";
import { CachingAllocator, PinnedStaging, type StagingDriver, sizeClass } from "./allocator.ts";
import {
  CU_RESULT,
  cudaLibraryCandidates,
  cuResultCode,
  cuResultError,
  loadCudaDriver,
  packKernelArgs,
} from "./cuda.ts";

const hasDriver = (() => {
  try {
    loadCudaDriver({});
    return true;
  } catch {
    return false;
  }
})();

describe("loading libcuda.so.1", () => {
  test("candidates: TP_CUDA_LIB_DIR first, then the loader path", () => {
    expect(cudaLibraryCandidates({ TP_CUDA_LIB_DIR: "/opt/nv" })).toEqual([
      "/opt/nv/libcuda.so.1",
      "libcuda.so.1",
    ]);
    expect(cudaLibraryCandidates({})).toEqual(["libcuda.so.1"]);
    expect(cudaLibraryCandidates({ TP_CUDA_LIB_DIR: "/a:/b" })).toEqual([
      "/a/libcuda.so.1",
      "/b/libcuda.so.1",
      "libcuda.so.1",
    ]);
  });
  test.skipIf(hasDriver)(
    "absent: E_UNSUPPORTED naming the library, the places tried and how to get it",
    () => {
      const dir = mkdtempSync(join(tmpdir(), "tp-nocuda-"));
      try {
        const e = thrownTpError(() => loadCudaDriver({ TP_CUDA_LIB_DIR: dir }));
        expect(e.code).toBe("E_UNSUPPORTED");
        expect(e.message).toContain(`tried ${dir}/libcuda.so.1, libcuda.so.1 on the loader path`);
        expect(e.message).toContain("comes with the NVIDIA driver");
        expect(e.message).toContain("TP_CUDA_LIB_DIR");
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
  );
  test("TP_CUDA_LIB_DIR holding a truncated file: E_IO naming it", () => {
    const dir = mkdtempSync(join(tmpdir(), "tp-badcuda-"));
    try {
      writeFileSync(join(dir, "libcuda.so.1"), new Uint8Array([0x7f, 0x45, 0x4c, 0x46, 2, 1]));
      const e = thrownTpError(() => loadCudaDriver({ TP_CUDA_LIB_DIR: dir }));
      expect(e.code).toBe("E_IO");
      expect(e.message).toContain(`${dir}/libcuda.so.1 (TP_CUDA_LIB_DIR) is not a usable libcuda.so.1`);
      expect(e.message).toContain("truncated");
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
  const libm = [
    "/lib/x86_64-linux-gnu/libm.so.6",
    "/usr/lib/x86_64-linux-gnu/libm.so.6",
    "/lib64/libm.so.6",
  ].find(existsSync);
  test.skipIf(libm === undefined)(
    "TP_CUDA_LIB_DIR holding a library without the driver API: E_UNSUPPORTED naming the symbol",
    () => {
      const dir = mkdtempSync(join(tmpdir(), "tp-notcuda-"));
      try {
        copyFileSync(libm as string, join(dir, "libcuda.so.1"));
        const e = thrownTpError(() => loadCudaDriver({ TP_CUDA_LIB_DIR: dir }));
        expect(e.code).toBe("E_UNSUPPORTED");
        expect(e.message).toMatch(/cannot serve as libcuda\.so\.1: Symbol "cu\w+" not found/);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
  );
});

describe("CUresult → TpError", () => {
  const names = (r: number) =>
    r === 2
      ? { name: "CUDA_ERROR_OUT_OF_MEMORY", text: "out of memory" }
      : r === 218
        ? { name: "CUDA_ERROR_INVALID_PTX", text: "a PTX JIT compilation failed" }
        : null;
  test("codes by kind", () => {
    expect(cuResultCode(CU_RESULT.CUDA_ERROR_OUT_OF_MEMORY)).toBe("E_OOM");
    expect(cuResultCode(CU_RESULT.CUDA_ERROR_NO_DEVICE)).toBe("E_UNSUPPORTED");
    expect(cuResultCode(CU_RESULT.CUDA_ERROR_UNSUPPORTED_PTX_VERSION)).toBe("E_UNSUPPORTED");
    expect(cuResultCode(CU_RESULT.CUDA_ERROR_INVALID_VALUE)).toBe("E_ARG");
    expect(cuResultCode(CU_RESULT.CUDA_ERROR_ILLEGAL_ADDRESS)).toBe("E_INTERNAL");
  });
  test("the message names the call, the error's name and number, and the detail", () => {
    const e = cuResultError("cuMemAlloc_v2", 2, names);
    expect(e.code).toBe("E_OOM");
    expect(e.message).toBe("cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory");
    const j = cuResultError("cuModuleLoadDataEx", 218, names, "kernel softmax_f32, JIT log: line 3 error");
    expect(j.message).toBe(
      "cuModuleLoadDataEx failed: CUDA_ERROR_INVALID_PTX (218): a PTX JIT compilation failed; kernel softmax_f32, JIT log: line 3 error",
    );
    expect(cuResultError("cuInit", 999, names).message).toBe("cuInit failed: CUresult 999");
  });
});

describe("kernel arguments", () => {
  test("each value in an 8-byte slot, pointers to the slots", () => {
    const { values, pointers } = packKernelArgs([
      { u64: 0x1122334455667788n },
      { u32: 7 },
      { i32: -2 },
      { f32: 1.5 },
    ]);
    const v = new DataView(values.buffer);
    expect(v.getBigUint64(0, true)).toBe(0x1122334455667788n);
    expect(v.getUint32(8, true)).toBe(7);
    expect(v.getInt32(16, true)).toBe(-2);
    expect(v.getFloat32(24, true)).toBe(1.5);
    expect(pointers.length).toBe(4);
    expect(pointers[1] as bigint).toBe((pointers[0] as bigint) + 8n);
  });
  test("values that do not fit are E_ARG", () => {
    expect(thrownTpError(() => packKernelArgs([{ u32: -1 }])).code).toBe("E_ARG");
    expect(thrownTpError(() => packKernelArgs([{ i32: 2 ** 31 }])).message).toContain("not a 32-bit integer");
  });
});

/** A fake device: addresses from a counter, a byte budget, a log of calls. */
function fakeRaw(capacity: number) {
  let next = 0x1000n;
  let used = 0;
  const live = new Map<bigint, number>();
  const log: string[] = [];
  return {
    log,
    live,
    alloc(bytes: number): bigint {
      if (used + bytes > capacity)
        throw new TpError("E_OOM", "cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory");
      const p = next;
      next += BigInt(bytes);
      used += bytes;
      live.set(p, bytes);
      log.push(`alloc ${bytes}`);
      return p;
    },
    free(p: bigint): void {
      used -= live.get(p) as number;
      live.delete(p);
      log.push(`free ${p}`);
    },
  };
}

describe("caching allocator", () => {
  test("size classes: 512 B minimum, powers of two to 1 MiB, then 2 MiB steps", () => {
    expect([1, 512, 513, 4096, 4097, 1 << 20].map(sizeClass)).toEqual([512, 512, 1024, 4096, 8192, 1 << 20]);
    expect(sizeClass((1 << 20) + 1)).toBe(2 << 20);
    expect(sizeClass(5 << 20)).toBe(6 << 20);
  });
  test("a freed block is reused for the same class without a driver call; bytes are counted", () => {
    const raw = fakeRaw(1 << 30);
    const a = new CachingAllocator(raw);
    const x = a.alloc(1000);
    expect(a.stats()).toMatchObject({ inUse: 1024, cached: 0, reserved: 1024, driverAllocs: 1 });
    a.free(x);
    expect(a.stats()).toMatchObject({ inUse: 0, cached: 1024 });
    const y = a.alloc(700);
    expect(y.ptr).toBe(x.ptr);
    expect(a.stats()).toMatchObject({ inUse: 1024, cached: 0, driverAllocs: 1, cacheHits: 1 });
    expect(() => {
      a.free(y);
      a.free(y);
    }).toThrow("freed twice");
  });
  test("out of device memory: the cache is emptied and the allocation retried once, then E_OOM", () => {
    const raw = fakeRaw(6 << 20);
    const a = new CachingAllocator(raw);
    const big = a.alloc(4 << 20);
    a.free(big); // 4 MiB cached
    const other = a.alloc(3 << 20); // 4 MiB class: reused
    expect(other.ptr).toBe(big.ptr);
    a.free(other);
    const c = a.alloc(5 << 20); // 6 MiB class: does not fit beside the cached 4 MiB → empty, retry
    expect(raw.log).toContain(`free ${big.ptr}`);
    expect(a.stats()).toMatchObject({ inUse: 6 << 20, cached: 0 });
    const e = thrownTpError(() => a.alloc(1 << 20));
    expect(e.code).toBe("E_OOM");
    expect(e.message).toContain("device allocation of 1.00 MiB failed with 6.00 MiB in use and 0 B cached");
    a.free(c);
    a.emptyCache();
    expect(raw.live.size).toBe(0);
  });
});

describe("pinned staging", () => {
  test("uploads are cut into chunks, each copied after its chunk's previous copy has passed", () => {
    const log: string[] = [];
    const memory = new Map<number, Uint8Array>();
    let nextHost = 1;
    const device = new Uint8Array(64);
    const drv: StagingDriver = {
      memAllocHost: (bytes) => {
        const b = new Uint8Array(bytes);
        const address = nextHost++;
        memory.set(address, b);
        return { address, bytes: b };
      },
      memFreeHost: (a) => log.push(`freeHost ${a}`),
      copyHtoDAsync: (dst, src, bytes) => {
        device.set((memory.get(src) as Uint8Array).subarray(0, bytes), Number(dst));
        log.push(`HtoD ${dst} ${bytes}`);
      },
      copyDtoHAsync: (dst, src, bytes) => {
        (memory.get(dst) as Uint8Array).set(device.subarray(Number(src), Number(src) + bytes));
      },
      eventCreate: () => 0,
      eventDestroy: () => {},
      eventRecord: () => {},
      eventSynchronize: () => log.push("wait"),
      streamSynchronize: () => {},
    };
    const s = new PinnedStaging(drv, 0, 16, 2);
    const data = Uint8Array.from({ length: 40 }, (_, i) => i + 1);
    s.upload(4n, data);
    expect(log).toEqual(["HtoD 4 16", "HtoD 20 16", "wait", "HtoD 36 8"]);
    expect([...s.download(4n, 40)]).toEqual([...data]);
    s.dispose();
    expect(log.filter((l) => l.startsWith("freeHost"))).toEqual(["freeHost 1", "freeHost 2"]);
  });
});
