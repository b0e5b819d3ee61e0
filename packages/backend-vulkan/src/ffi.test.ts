// The shim (native/vulkan through ./ffi.ts): its error paths — no loader, a library that is not a
// loader, a bad device index or name, buffer bounds, bad pipelines and bindings — checked both in
// TypeScript and in C (raw calls past the TypeScript checks), plus batching, deferred frees, the
// staging path, timestamps and buffer ownership. Skips, saying why, where the backend is not built or
// no Vulkan device is present.
import { afterAll, describe, expect, test } from "bun:test";
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { thrown as errorOf } from "@tp/tensor/testing";
import {
  checkLibraryFile,
  defaultShaderDir,
  defaultVulkanLibraryPath,
  loadVulkanLibrary,
  TP_VK_STATUS,
  type VulkanContext,
  type VulkanLibrary,
} from "./ffi.ts";

let lib: VulkanLibrary | null = null;
let ctx: VulkanContext | null = null;
let why = "";
try {
  lib = loadVulkanLibrary();
  ctx = lib.createContext();
} catch (e) {
  why = e instanceof Error ? e.message : String(e);
}
afterAll(() => ctx?.destroy());

const built = lib !== null;
const live = ctx !== null;

if (!built) test.skip(`vulkan shim not built here: ${why}`, () => {});
else if (!live) test.skip(`no Vulkan device here: ${why}`, () => {});

describe.skipIf(!built)("loading", () => {
  test("a bogus loader path is E_UNSUPPORTED naming the path and the package", () => {
    const e = errorOf(() => lib?.createContext({ loader: "/nonexistent/libvulkan.so.1" }));
    expect(e.code).toBe("E_UNSUPPORTED");
    expect(e.message).toContain("/nonexistent/libvulkan.so.1");
    expect(e.message).toContain("apt-get install libvulkan1");
  });

  test("a library that is not a Vulkan loader is E_UNSUPPORTED", () => {
    const e = errorOf(() => lib?.createContext({ loader: "libm.so.6" }));
    expect(e.code).toBe("E_UNSUPPORTED");
    expect(e.message).toContain("not a Vulkan loader");
  });

  test("damaged library files are E_IO before dlopen", () => {
    const dir = mkdtempSync(join(tmpdir(), "tp-vk-lib-"));
    try {
      const bytes = readFileSync(defaultVulkanLibraryPath());
      const cut = join(dir, "cut.so");
      writeFileSync(cut, bytes.subarray(0, Math.floor(bytes.length / 2)));
      expect(errorOf(() => checkLibraryFile(cut)).code).toBe("E_IO");
      expect(errorOf(() => loadVulkanLibrary(cut)).message).toContain("truncated");
      const text = join(dir, "text.so");
      writeFileSync(text, "not an ELF file at all, just some text that is long enough".repeat(4));
      expect(errorOf(() => loadVulkanLibrary(text)).message).toContain("no ELF magic");
      const copy = join(dir, "copy.so");
      copyFileSync(defaultVulkanLibraryPath(), copy);
      expect(() => checkLibraryFile(copy)).not.toThrow();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("a missing library names the build", () => {
    const e = errorOf(() => loadVulkanLibrary("/nonexistent/libtp_vulkan.so"));
    expect(e.code).toBe("E_UNSUPPORTED");
    expect(e.message).toContain("bun run build");
  });
});

describe.skipIf(!live)("device selection", () => {
  test("the chosen device reports its limits", () => {
    const info = (ctx as VulkanContext).info;
    expect(info.name.length).toBeGreaterThan(0);
    expect(info.count).toBeGreaterThanOrEqual(1);
    expect(info.maxStorageBufferRange).toBeGreaterThan(0);
    expect(info.maxMemoryAllocationSize).toBeGreaterThan(0);
    expect(info.maxPushConstants).toBeGreaterThanOrEqual(128);
    expect(info.minStorageBufferOffsetAlignment).toBeGreaterThan(0);
  });

  test("a device index out of range is E_UNSUPPORTED listing the devices", () => {
    const e = errorOf(() => lib?.createContext({ deviceIndex: 99 }));
    expect(e.code).toBe("E_UNSUPPORTED");
    expect(e.message).toContain("index 99 is out of range");
    expect(e.message).toContain((ctx as VulkanContext).info.name);
  });

  test("a device name that matches nothing is E_UNSUPPORTED listing the devices", () => {
    const e = errorOf(() => lib?.createContext({ deviceName: "no such GPU 9000" }));
    expect(e.code).toBe("E_UNSUPPORTED");
    expect(e.message).toContain("no such GPU 9000");
    expect(e.message).toContain((ctx as VulkanContext).info.name);
  });

  test("a device chosen by index and by name is the same device", () => {
    const info = (ctx as VulkanContext).info;
    for (const c of [
      lib?.createContext({ deviceIndex: info.index }),
      lib?.createContext({ deviceName: info.name.slice(0, 4) }),
    ]) {
      expect(c?.info.deviceId).toBe(info.deviceId);
      c?.destroy();
    }
  });

  test("a negative or fractional index is E_ARG", () => {
    expect(errorOf(() => lib?.createContext({ deviceIndex: -2 })).code).toBe("E_ARG");
    expect(errorOf(() => lib?.createContext({ deviceIndex: 0.5 })).code).toBe("E_ARG");
  });
});

describe.skipIf(!live)("buffers", () => {
  const c = () => ctx as VulkanContext;

  test("write, copy, fill and read round-trip; the caller's array is not kept", () => {
    const a = c().createBuffer(64);
    const b = c().createBuffer(64);
    const data = Uint8Array.from({ length: 64 }, (_, i) => i);
    c().write(a, 0, data);
    data.fill(0xee); // the native side copied it during the call
    c().copy(a, 8, b, 0, 32);
    c().fill(b, 32, 16, 0x01020304);
    const out = c().read(b, 0, 48);
    expect([...out.subarray(0, 32)]).toEqual(Array.from({ length: 32 }, (_, i) => i + 8));
    expect([...out.subarray(32, 36)]).toEqual([4, 3, 2, 1]);
    c().destroyBuffer(a);
    c().destroyBuffer(b);
  });

  test("sizes and ranges are checked in TypeScript", () => {
    const b = c().createBuffer(16);
    expect(errorOf(() => c().createBuffer(0)).code).toBe("E_ARG");
    expect(errorOf(() => c().createBuffer(-1)).code).toBe("E_ARG");
    expect(errorOf(() => c().write(b, 8, new Uint8Array(9))).code).toBe("E_ARG");
    expect(errorOf(() => c().read(b, 17, 0)).code).toBe("E_ARG");
    expect(errorOf(() => c().read(b, 0, 1.5)).code).toBe("E_ARG");
    expect(errorOf(() => c().copy(b, 0, b, 4, 8)).code).toBe("E_ARG");
    expect(errorOf(() => c().fill(b, 2, 4, 0)).code).toBe("E_ARG");
    c().destroyBuffer(b);
    expect(errorOf(() => c().destroyBuffer(b)).code).toBe("E_STATE");
    expect(errorOf(() => c().read(b, 0, 4)).code).toBe("E_STATE");
  });

  test("the C side checks the same ranges (raw calls past the TypeScript checks)", () => {
    const b = c().createBuffer(16);
    const raw = c().lib.raw;
    expect(raw.tp_vk_buffer_write(c().handle, b.ptr, 8, new Uint8Array(16), 16)).toBe(TP_VK_STATUS.ERR_ARG);
    expect(c().lastError()).toContain("outside a buffer of 16 bytes");
    expect(raw.tp_vk_buffer_read(c().handle, b.ptr, 0, new Uint8Array(32), 32)).toBe(TP_VK_STATUS.ERR_ARG);
    expect(raw.tp_vk_buffer_copy(c().handle, b.ptr, 0, b.ptr, 4, 8)).toBe(TP_VK_STATUS.ERR_ARG);
    expect(c().lastError()).toContain("overlap");
    expect(raw.tp_vk_buffer_fill(c().handle, b.ptr, 1, 4, 0)).toBe(TP_VK_STATUS.ERR_ARG);
    expect(raw.tp_vk_buffer_create(c().handle, 0, new BigUint64Array(1))).toBe(TP_VK_STATUS.ERR_ARG);
    c().destroyBuffer(b);
  });

  test("a buffer past the device's largest allocation is E_OOM naming the device and the limit", () => {
    const info = c().info;
    const e = errorOf(() => c().createBuffer(info.maxMemoryAllocationSize + 1));
    expect(e.code).toBe("E_OOM");
    expect(e.message).toContain(info.name);
    expect(e.message).toContain("maxMemoryAllocationSize");
  });

  test("the staging path (as on discrete GPUs) moves data larger than its staging buffer", () => {
    const s = lib?.createContext({ forceStaging: true }) as VulkanContext;
    try {
      expect(s.info.unifiedMemory).toBe(false);
      const n = (40 << 20) + 12; // past the 32 MiB staging buffer, not a multiple of it
      const data = new Uint8Array(n);
      for (let i = 0; i < n; i += 4093) data[i] = (i / 4093) & 0xff;
      const b = s.createBuffer(n);
      s.write(b, 0, data);
      const back = s.read(b, 0, n);
      expect(back.length).toBe(n);
      let same = true;
      for (let i = 0; i < n; i += 4093) same &&= back[i] === data[i];
      expect(same).toBe(true);
      expect([...s.read(b, n - 12, 12)]).toEqual([...data.subarray(n - 12)]);
      s.destroyBuffer(b);
    } finally {
      s.destroy();
    }
  });
});

describe.skipIf(!live)("pipelines and batches", () => {
  const c = () => ctx as VulkanContext;
  /** The copy kernel moving `n` words: its push constants (shaders/copy.comp). */
  const copyPush = (n: number) => {
    const p = new Uint32Array(28);
    p[0] = n;
    p[1] = 1;
    p[2] = n; // shape[0]
    p[11] = 1; // src_strides[0]
    p[20] = 1; // dst_strides[0]
    return new Uint8Array(p.buffer);
  };
  const copySpirv = () => new Uint8Array(readFileSync(join(defaultShaderDir(), "copy.spv")));

  test("a bad SPIR-V module or interface is E_ARG", () => {
    expect(errorOf(() => c().createPipeline(new Uint8Array(64), 2, 112)).code).toBe("E_ARG");
    expect(errorOf(() => c().createPipeline(copySpirv(), 9, 112)).code).toBe("E_ARG");
    expect(errorOf(() => c().createPipeline(copySpirv(), 2, 130)).code).toBe("E_ARG");
  });

  test("dispatch bindings are checked: count, range, alignment, the device limit", () => {
    const p = c().createPipeline(copySpirv(), 2, 112, [64, 4]);
    const a = c().createBuffer(256);
    const whole = { buffer: a, offset: 0, range: 256 };
    expect(errorOf(() => c().dispatch(p, [whole], copyPush(4), [1, 1, 1])).code).toBe("E_ARG");
    expect(
      errorOf(() => c().dispatch(p, [whole, { ...whole, range: 512 }], copyPush(4), [1, 1, 1])).code,
    ).toBe("E_ARG");
    const align = c().info.minStorageBufferOffsetAlignment;
    if (align > 1) {
      expect(
        errorOf(() => c().dispatch(p, [whole, { buffer: a, offset: 1, range: 16 }], copyPush(4), [1, 1, 1]))
          .message,
      ).toContain("not a multiple");
    }
    expect(errorOf(() => c().dispatch(p, [whole, whole], new Uint8Array(8), [1, 1, 1])).code).toBe("E_ARG");
    // the C side refuses a range past maxStorageBufferRange even when TypeScript is bypassed
    const table = new BigUint64Array([
      BigInt(a.ptr),
      0n,
      256n,
      BigInt(a.ptr),
      0n,
      BigInt(c().info.maxStorageBufferRange) + 16n,
    ]);
    const status = c().lib.raw.tp_vk_dispatch(c().handle, p.ptr, table, 2, copyPush(4), 112, 1, 1, 1);
    expect(status).toBe(TP_VK_STATUS.ERR_ARG);
    c().destroyBuffer(a);
  });

  test("many dispatches run as one batch; a full batch submits itself; reads wait", () => {
    const p = c().createPipeline(copySpirv(), 2, 112, [64, 4]);
    const a = c().createBuffer(1024);
    const b = c().createBuffer(1024);
    c().write(a, 0, new Uint8Array(new Float32Array(256).fill(3).buffer));
    c().wait();
    const before = c().stats();
    for (let i = 0; i < 10; i++) {
      c().dispatch(
        p,
        [
          i % 2 ? { buffer: a, offset: 0, range: 1024 } : { buffer: b, offset: 0, range: 1024 },
          i % 2 ? { buffer: b, offset: 0, range: 1024 } : { buffer: a, offset: 0, range: 1024 },
        ],
        copyPush(256),
        [4, 1, 1],
      );
    }
    const mid = c().stats();
    expect(mid.dispatches - before.dispatches).toBe(10);
    expect(mid.batches).toBe(before.batches); // recorded, not submitted
    expect([...new Float32Array(c().read(b, 0, 1024).buffer)].every((v) => v === 3)).toBe(true);
    expect(c().stats().batches).toBe(before.batches + 1);
    for (let i = 0; i < 600; i++) {
      c().dispatch(
        p,
        [
          { buffer: b, offset: 0, range: 1024 },
          { buffer: a, offset: 0, range: 1024 },
        ],
        copyPush(256),
        [4, 1, 1],
      );
    }
    expect(c().stats().batches).toBeGreaterThan(before.batches + 1); // 512 commands per batch
    c().wait();
    c().destroyBuffer(a);
    c().destroyBuffer(b);
  });

  test("a buffer destroyed while queued work uses it lives until that work is done", () => {
    const p = c().createPipeline(copySpirv(), 2, 112, [64, 4]);
    const a = c().createBuffer(1024);
    const b = c().createBuffer(1024);
    c().write(a, 0, new Uint8Array(new Float32Array(256).fill(7).buffer));
    c().dispatch(
      p,
      [
        { buffer: b, offset: 0, range: 1024 },
        { buffer: a, offset: 0, range: 1024 },
      ],
      copyPush(256),
      [4, 1, 1],
    );
    const live0 = c().stats().liveBuffers;
    c().destroyBuffer(a);
    expect(c().stats().pendingFrees).toBe(1);
    expect(c().stats().liveBuffers).toBe(live0 - 1);
    expect([...new Float32Array(c().read(b, 0, 1024).buffer)].every((v) => v === 7)).toBe(true);
    expect(c().stats().pendingFrees).toBe(0);
    c().destroyBuffer(b);
  });

  test("timestamps measure the GPU time of batches where the device has them", () => {
    if (!c().info.features.includes("timestamps")) {
      expect(errorOf(() => c().profile(true)).code).toBe("E_UNSUPPORTED");
      return;
    }
    const p = c().createPipeline(copySpirv(), 2, 112, [64, 4]);
    const a = c().createBuffer(1 << 20);
    const b = c().createBuffer(1 << 20);
    c().profile(true);
    c().dispatch(
      p,
      [
        { buffer: b, offset: 0, range: 1 << 20 },
        { buffer: a, offset: 0, range: 1 << 20 },
      ],
      copyPush(1 << 18),
      [4096, 1, 1],
    );
    c().wait();
    expect(c().stats().gpuNs).toBeGreaterThan(0);
    // Per dispatch: credited to the pipeline; fills and copies between them are not; batches that
    // fill up (512 commands) and submit themselves are timed too.
    expect(c().pipelineStats(p).dispatches).toBe(1);
    expect(c().pipelineStats(p).gpuNs).toBeGreaterThan(0);
    expect(c().pipelineStats(p).gpuNs).toBeLessThanOrEqual(c().stats().gpuNs);
    c().profile(true);
    expect(c().pipelineStats(p)).toEqual({ dispatches: 0, gpuNs: 0 });
    for (let i = 0; i < 700; i++) {
      if (i % 3 === 0) c().fill(a, 0, 64, i);
      c().dispatch(
        p,
        [
          { buffer: b, offset: 0, range: 1 << 20 },
          { buffer: a, offset: 0, range: 1 << 20 },
        ],
        copyPush(64),
        [1, 1, 1],
      );
    }
    c().wait();
    const s = c().pipelineStats(p);
    expect(s.dispatches).toBe(700);
    expect(s.gpuNs).toBeLessThanOrEqual(c().stats().gpuNs);
    c().profile(false);
    c().destroyBuffer(a);
    c().destroyBuffer(b);
  });
});
