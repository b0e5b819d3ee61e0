// The cpu Backend: memory, views, budgets and the cast op, checked against @tp/tensor's TypeScript
// conversions (themselves tested against independent references) bit for bit.
import { describe, expect, test } from "bun:test";
import {
  f16BitsToF32Bits,
  f32BitsToBf16Bits,
  f32BitsToF8e4m3fnBits,
  isTpError,
  loadBackend,
  type TpErrorCode,
  Weight,
} from "@tp/tensor";
import { CpuBackend, createBackend, resolveThreads } from "./backend.ts";

function code(fn: () => unknown): TpErrorCode {
  try {
    fn();
  } catch (e) {
    if (isTpError(e)) return e.code;
    throw e;
  }
  throw new Error("expected a TpError");
}

function randomF32(n: number, seed: number): Float32Array {
  const bits = new Uint32Array(n);
  let s = seed;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    bits[i] = (s & 0x807fffff) | ((((s >>> 8) % 40) + 100) << 23); // |x| in about [2^-27, 2^13)
  }
  return new Float32Array(bits.buffer);
}

describe("cpu backend", () => {
  test("keeps freed blocks for reuse up to blockCacheBytes, outside the memory account", async () => {
    const b = createBackend({ threads: 1, blockCacheBytes: 4096 });
    const a = b.upload(new Float32Array([1, 2, 3, 4]), [4], "f32");
    const ptr = b.elementPointer(a, "test");
    b.free(a);
    expect(b.cachedBytes).toBe(16);
    expect(b.memory.current).toBe(0); // no tensor holds it
    const again = b.alloc([2, 2], "f32"); // same byte size: the kept block
    expect(b.elementPointer(again, "test")).toBe(ptr);
    expect(b.cachedBytes).toBe(0);
    const other = b.alloc([3], "f32"); // another size: a fresh block
    b.free(other);
    b.free(again);
    expect(b.cachedBytes).toBe(28);
    const big = b.alloc([2048], "f32"); // 8 KiB: over the limit, so freed at once
    b.free(big);
    expect(b.cachedBytes).toBe(28);
    expect(b.releaseCachedMemory()).toBe(28);
    expect(b.cachedBytes).toBe(0);
    const x = b.upload(new Float32Array([5, 6]), [2], "f32");
    expect(Array.from((await b.read(x)) as Float32Array)).toEqual([5, 6]);
    b.free(x);
    b.dispose(); // gives the kept blocks back too
    expect(b.cachedBytes).toBe(0);
    const off = createBackend({ threads: 1, blockCacheBytes: 0 });
    off.free(off.alloc([4], "f32"));
    expect(off.cachedBytes).toBe(0);
    off.dispose();
    expect(code(() => createBackend({ blockCacheBytes: -1 }))).toBe("E_ARG");
  });

  test("loads through the registry and reports its device", async () => {
    const b = await loadBackend("cpu", { threads: 2 });
    expect(b).toBeInstanceOf(CpuBackend);
    expect(b.device).toMatch(/\((scalar|avx2|avx512), 2 threads\)$/);
    b.dispose();
    const one = createBackend({ threads: 1 });
    expect(one.device).toEndWith(", 1 thread)");
    one.dispose();
    const defaults = createBackend(null); // null options: the defaults
    expect(defaults.memory.stats().budget).toBeNull();
    defaults.dispose();
  });

  test("upload and read back, including strided views", async () => {
    const b = createBackend({ threads: 1 });
    const x = b.upload(
      Float32Array.from({ length: 6 }, (_, i) => i + 1),
      [2, 3],
      "f32",
      "x",
    );
    expect(Array.from((await b.read(x)) as Float32Array)).toEqual([1, 2, 3, 4, 5, 6]);
    expect(Array.from((await b.read(x.transpose(0, 1))) as Float32Array)).toEqual([1, 4, 2, 5, 3, 6]);
    const ids = b.upload(new Int32Array([7, -1, 151935]), [3], "i32");
    expect(Array.from((await b.read(ids)) as Int32Array)).toEqual([7, -1, 151935]);
    const empty = b.alloc([0, 4], "f32");
    expect(((await b.read(empty)) as Float32Array).length).toBe(0);
    b.dispose();
  });

  test("cast matches the TypeScript conversions bit for bit", async () => {
    const b = createBackend({ threads: 2 });
    const n = 100_003; // large enough to split over threads, with a tail
    const src = randomF32(n, 42);
    const bits = new Uint32Array(src.buffer);
    const x = b.upload(src, [n], "f32");
    const bf = (await b.read(b.cast(x, "bf16"))) as Uint16Array;
    const e4 = (await b.read(b.cast(x, "f8_e4m3fn", { saturate: true }))) as Uint8Array;
    let bad = 0;
    for (let i = 0; i < n; i++) {
      if (bf[i] !== f32BitsToBf16Bits(bits[i] as number)) bad++;
      if (e4[i] !== f32BitsToF8e4m3fnBits(bits[i] as number, true)) bad++;
    }
    expect(bad).toBe(0);
    const all = b.upload(
      Uint16Array.from({ length: 65536 }, (_, i) => i),
      [256, 256],
      "f16",
    );
    const wide = new Uint32Array(((await b.read(b.cast(all, "f32"))) as Float32Array).buffer);
    for (let i = 0; i < 65536; i++) if (wide[i] !== f16BitsToF32Bits(i)) bad++;
    expect(bad).toBe(0);
    const same = (await b.read(b.cast(x.slice(0, 5, 9), "f32"))) as Float32Array;
    expect(Array.from(same)).toEqual(Array.from(src.subarray(5, 9)));
    expect(code(() => b.cast(all, "bf16"))).toBe("E_UNSUPPORTED");
    // an unknown dtype is a bad argument, not an unsupported pair; so is a saturate that is no boolean
    expect(() => b.cast(x, "f128" as "f16")).toThrow(
      'op cast on backend cpu: unknown dtype "f128"; expected one of: f64, f32',
    );
    expect(code(() => b.cast(x, "f128" as "f16"))).toBe("E_ARG");
    expect(code(() => b.cast(x, "i32"))).toBe("E_UNSUPPORTED"); // known, no conversion
    expect(() => b.cast(x, "f8_e4m3fn", { saturate: "no" as unknown as boolean })).toThrow(
      'op cast on backend cpu: saturate must be a boolean, got "no"',
    );
    expect(code(() => b.cast(x.slice(0, 0, 6).reshape(2, 3).transpose(0, 1), "f16"))).toBe("E_UNSUPPORTED");
    b.dispose();
  });

  test("memory accounting, budgets, free and dispose", () => {
    const b = createBackend({ threads: 1, memoryBudget: 4096 });
    const a = b.alloc([512], "f32"); // 2048 B
    const c = b.alloc([256], "bf16"); // 512 B
    expect(b.memory.stats()).toMatchObject({ current: 2560, peak: 2560, allocations: 2 });
    expect(code(() => b.alloc([512], "f32"))).toBe("E_OOM");
    b.free(a);
    expect(b.memory.current).toBe(512);
    expect(code(() => b.free(a))).toBe("E_STATE");
    expect(code(() => b.cast(a, "f16"))).toBe("E_STATE");
    b.dispose();
    expect(b.memory.current).toBe(0);
    expect(c.storage.freed).toBe(true);
    expect(b.ctx.destroyed).toBe(true);
  });

  test("tensors past 4 GiB: allocated lazily, read in slices, refused whole; a failed allocation costs nothing", async () => {
    const b = createBackend({ threads: 1 });
    const big = b.alloc([2 ** 32 + 64], "u8", "big"); // malloc'd but untouched: no RSS
    expect(b.memory.current).toBe(2 ** 32 + 64);
    const tail = big.slice(0, 2 ** 32);
    expect(Array.from((await b.read(tail)) as Uint8Array).length).toBe(64);
    await expect(b.read(big)).rejects.toThrow(/past the 4 GiB of one JavaScript array/);
    expect(code(() => b.cast(big, "u8"))).toBe("E_UNSUPPORTED");
    b.free(big);
    expect(code(() => b.alloc([2 ** 52], "f32"))).toBe("E_ARG"); // more bytes than a safe integer
    expect(b.memory.stats()).toMatchObject({ current: 0, peak: 2 ** 32 + 64 });
    b.dispose();
  });

  test("ops without kernels are E_UNSUPPORTED naming op and backend", () => {
    const b = createBackend({ threads: 1 });
    const x = b.alloc([1, 256], "f32");
    // matmul / embedding exist (matmul.test.ts); a weight format without kernels is E_UNSUPPORTED
    const w = new Weight({ name: "w", format: "iq2_xxs", shape: [2, 256], data: new Uint8Array(132) });
    expect(() => b.matmul(x, w)).toThrow("op matmul on backend cpu does not support weight format iq2_xxs");
    expect(b.supports("silu", ["f32"])).toBe(true); // ops.test.ts tests the implemented ops
    expect(b.supports("silu", ["f16"])).toBe(false);
    expect(b.supports("cast", ["bf16"])).toBe(true);
    expect(b.supports("matmul", ["q4_k"])).toBe(true);
    expect(b.supports("matmul", ["iq2_xxs"])).toBe(false);
    b.dispose();
  });

  test("threads come from the option, else TP_THREADS, and bad values are named", () => {
    expect(resolveThreads(3, "8")).toBe(3);
    expect(resolveThreads(undefined, "8")).toBe(8);
    expect(resolveThreads(undefined, undefined)).toBe(0);
    expect(() => resolveThreads(undefined, "lots")).toThrow(
      "TP_THREADS must be an integer from 0 (all CPUs) to 256, got 'lots'",
    );
    expect(() => resolveThreads(-2)).toThrow("--threads must be");
    expect(resolveThreads(undefined, "")).toBe(0); // `TP_THREADS= cmd`: as unset
    for (const env of ["0x10", "1e2", " 3 ", " ", "abc"]) {
      expect(() => resolveThreads(undefined, env)).toThrow(
        `TP_THREADS must be an integer from 0 (all CPUs) to 256, got '${env}'`,
      );
    }
    expect(resolveThreads(null as never, "4")).toBe(4);
  });
});
