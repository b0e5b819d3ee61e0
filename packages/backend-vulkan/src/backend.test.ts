// The vulkan Backend beyond the conformance suite (which checks every op's values): registry, device
// selection, capabilities and E_UNSUPPORTED messages, memory accounting and budgets, device limits,
// tensors freed while queued work uses them, batching, resident weights, views of buffers past
// maxStorageBufferRange, attention's split of long key ranges, and disposal. Skips, saying why, where the backend cannot start.
import { afterAll, describe, expect, test } from "bun:test";
import { readdirSync } from "node:fs";
import {
  defaultVramBudget,
  f16ToF32,
  f32ToBf16,
  f32ToF16,
  loadBackend,
  OP_NAMES,
  type Tensor,
  Weight,
  type WeightFormat,
} from "@tp/tensor";
import { thrown as errorOf } from "@tp/tensor/testing";
import { createBackend, kernelFeatures, parseDeviceSelector, VulkanBackend } from "./backend.ts";
import { defaultShaderDir, type VulkanBuffer } from "./ffi.ts";
import { KERNELS, type KernelName, kernelFile } from "./kernels.ts";
import { ATTENTION_LOOP_BUDGET, attention, attentionPlan } from "./ops/attention.ts";

/** [B, H, Hkv, Sq, Skv, D] */
type Dims = readonly [number, number, number, number, number, number];

/** Plain f64 attention (causal, qOffset, window, fullPrefix) over contiguous [B, H, S, D] arrays. */
function attentionF64(
  q: Float32Array,
  k: Float32Array,
  v: Float32Array,
  [bs, h, hkv, sq, skv, d]: Dims,
  o: { causal?: boolean; qOffset?: number; window?: number; fullPrefix?: number },
): Float64Array {
  const out = new Float64Array(bs * h * sq * d);
  const scale = 1 / Math.sqrt(d);
  const qOffset = o.qOffset ?? skv - sq;
  for (let bh = 0; bh < bs * h; bh++) {
    const kvh = Math.floor(bh / h) * hkv + Math.floor((bh % h) / (h / hkv));
    for (let i = 0; i < sq; i++) {
      const p = qOffset + i;
      const s: number[] = [];
      for (let j = 0; j < skv; j++) {
        const seen =
          j < (o.fullPrefix ?? 0) || !o.causal || (j <= p && (o.window === undefined || j > p - o.window));
        let dot = 0;
        for (let t = 0; t < d; t++)
          dot += (q[(bh * sq + i) * d + t] as number) * (k[(kvh * skv + j) * d + t] as number);
        s.push(seen ? dot * scale : Number.NEGATIVE_INFINITY);
      }
      const m = Math.max(...s);
      if (m === Number.NEGATIVE_INFINITY) continue;
      let sum = 0;
      const acc = new Float64Array(d);
      for (let j = 0; j < skv; j++) {
        const e = Math.exp((s[j] as number) - m);
        sum += e;
        for (let t = 0; t < d; t++) acc[t] = (acc[t] as number) + e * (v[(kvh * skv + j) * d + t] as number);
      }
      for (let t = 0; t < d; t++) out[(bh * sq + i) * d + t] = (acc[t] as number) / sum;
    }
  }
  return out;
}

/** A weight [n, k] from f32 values: f16 / bf16 rounded, or GGUF Q8_0 blocks (ggml quantize_row_q8_0). */
function weightOf(format: WeightFormat, values: Float32Array, [n, k]: [number, number]): Weight {
  let data: Uint8Array;
  if (format === "f16" || format === "bf16") {
    const h = Uint16Array.from(values, (v) => (format === "f16" ? f32ToF16(v) : f32ToBf16(v)));
    data = new Uint8Array(h.buffer);
  } else if (format === "q8_0") {
    data = new Uint8Array((values.length / 32) * 34);
    const view = new DataView(data.buffer);
    for (let blk = 0; blk < values.length / 32; blk++) {
      const xs = values.subarray(blk * 32, blk * 32 + 32);
      const amax = xs.reduce((a, v) => Math.max(a, Math.abs(v)), 0);
      const d = amax / 127;
      view.setUint16(blk * 34, f32ToF16(d), true);
      for (let i = 0; i < 32; i++)
        view.setInt8(blk * 34 + 2 + i, d === 0 ? 0 : Math.round((xs[i] as number) / d));
    }
  } else throw new Error(`weightOf: ${format}`);
  return new Weight({ name: `w_${format}`, format, shape: [n, k], data });
}

let backend: VulkanBackend | null = null;
let why = "";
try {
  backend = createBackend();
} catch (e) {
  why = e instanceof Error ? e.message : String(e);
}
afterAll(() => backend?.dispose());
const b = () => backend as VulkanBackend;
/** What the device offers the kernel variants (auto mode picks these). */
const has = {
  subgroup: (backend?.info.features.includes("subgroup") ?? false) && (backend?.info.subgroupSize ?? 0) >= 4,
  s16: backend?.info.features.includes("storage16") ?? false,
};

if (backend === null) test.skip(`vulkan backend cannot start here: ${why}`, () => {});

test("device selectors: digits are an index, anything else part of a name", () => {
  expect(parseDeviceSelector("1")).toEqual({ deviceIndex: 1 });
  expect(parseDeviceSelector(" RTX 4090 ")).toEqual({ deviceName: "RTX 4090" });
  expect(parseDeviceSelector(undefined)).toEqual({});
  expect(errorOf(() => parseDeviceSelector(" ")).code).toBe("E_ARG");
});

test("a missing shim is E_UNSUPPORTED naming the build, never a fallback", () => {
  const saved = process.env.TP_VULKAN_LIB;
  process.env.TP_VULKAN_LIB = "/nonexistent/libtp_vulkan.so";
  try {
    const e = errorOf(() => createBackend());
    expect(e.code).toBe("E_UNSUPPORTED");
    expect(e.message).toContain("vulkan");
  } finally {
    if (saved === undefined) delete process.env.TP_VULKAN_LIB;
    else process.env.TP_VULKAN_LIB = saved;
  }
});

describe.skipIf(backend === null)("vulkan backend", () => {
  test("loads through the registry and names its device", async () => {
    const v = await loadBackend("vulkan");
    expect(v).toBeInstanceOf(VulkanBackend);
    expect(v.name).toBe("vulkan");
    expect(v.device).toContain(b().info.name);
    v.dispose();
  });

  test("no loader, or no such device: E_UNSUPPORTED with the reason", () => {
    const e1 = errorOf(() => createBackend({ loader: "/nonexistent/libvulkan.so.1" }));
    expect(e1.code).toBe("E_UNSUPPORTED");
    expect(e1.message).toContain("Vulkan loader");
    const e2 = errorOf(() => createBackend({ device: "42" }));
    expect(e2.code).toBe("E_UNSUPPORTED");
    expect(e2.message).toContain("out of range");
    const e3 = errorOf(() => createBackend({ device: "no such GPU" }));
    expect(e3.message).toContain(b().info.name);
  });

  test("supports() answers per op, dtype and weight format", () => {
    expect(b().supports("silu", ["f32"])).toBe(true);
    expect(b().supports("silu", ["f16"])).toBe(false);
    expect(b().supports("copy", ["u8"])).toBe(true);
    expect(b().supports("matmul", ["q4_k", "f32"])).toBe(true);
    expect(b().supports("matmul", ["int4_convrot"])).toBe(true);
    expect(b().supports("embedding", ["int4_convrot"])).toBe(false);
    expect(b().supports("matmul", ["iq2_xxs"])).toBe(false);
    const caps = b().capabilities();
    for (const op of caps.ops) expect(b().supports(op)).toBe(true);
    expect(caps.weightFormats).toContain("q6_k");
    // Derived from the kernel table, which has every op of the Backend interface.
    expect(caps.ops).toEqual([...OP_NAMES]);
    expect(Object.keys(b().kernelTable).sort()).toEqual([...OP_NAMES].sort());
    expect(b().supports("rope", ["f32", "i32"])).toBe(true); // positions: i32 by the op contract
    expect(b().supports("cast", ["i32"])).toBe(false);
  });

  test("what is missing is E_UNSUPPORTED naming op, backend and format", () => {
    const x = b().upload(new Float32Array(256), [1, 256], "f32");
    const w = new Weight({ name: "w", format: "q8_k", shape: [2, 256], data: new Uint8Array(584) });
    const e = errorOf(() => b().matmul(x, w));
    expect(e.code).toBe("E_UNSUPPORTED");
    expect(e.message).toMatch(/op matmul on backend vulkan does not support weight format q8_k/);
    const i = b().upload(new Int32Array(4), [4], "i32");
    expect(errorOf(() => b().silu(i)).message).toContain("does not support dtype i32");
    expect(errorOf(() => b().cast(i, "f32")).message).toContain("no conversion i32 → f32");
    b().free(x);
    b().free(i);
  });

  test("set into a destination whose elements overlap is E_ARG (@tp/tensor checkSetArgs), as on cpu", async () => {
    const base = b().upload(new Float32Array(16).fill(7), [16], "f32");
    const src = b().upload(new Float32Array(16).fill(1), [4, 4], "f32");
    const e = errorOf(() => b().set(base.view({ shape: [4, 4], strides: [1, 1], offset: 0 }), src));
    expect(e.code).toBe("E_ARG");
    expect(e.message).toContain("op set on backend vulkan: dst");
    expect(e.message).toContain("share an address (strides [1, 1])");
    expect(Array.from((await b().read(base)) as Float32Array)).toEqual(new Array(16).fill(7));
    b().free(base);
    b().free(src);
  });

  test("attention's scale and softcap must survive the f32 kernel argument (@tp/tensor attentionScalars)", () => {
    const x = b().upload(new Float32Array(8), [1, 1, 2, 4], "f32");
    for (const [options, text] of [
      [{ softcap: 1e-50 }, "softcap must be positive, got 1e-50 (it rounds to 0 in f32"],
      [{ softcap: 0 }, "softcap must be positive, got 0"],
      [{ softcap: 1e300 }, "softcap must be finite in f32"],
      [{ scale: -1e300 }, "scale must be finite in f32"],
    ] as const) {
      const e = errorOf(() => b().attention(x, x, x, options));
      expect({ code: e.code, message: e.message }).toEqual({
        code: "E_ARG",
        message: expect.stringContaining(`op attention on backend vulkan: ${text}`),
      });
    }
    b().free(x);
  });

  test("memory is accounted, budgets hold, device limits name the device", () => {
    const before = b().memory.current;
    const t = b().alloc([256], "f32");
    expect(b().memory.current - before).toBe(1024);
    b().free(t);
    expect(b().memory.current).toBe(before);
    const small = createBackend({ memoryBudget: 4096 });
    try {
      small.alloc([1024], "f32");
      expect(errorOf(() => small.alloc([1], "f32")).code).toBe("E_OOM");
    } finally {
      small.dispose();
    }
    const e = errorOf(() => b().alloc([b().info.maxMemoryAllocationSize + 16], "u8"));
    expect(e.code).toBe("E_OOM");
    expect(e.message).toContain(b().info.name);
    expect(b().memory.current).toBe(before);
  });

  test("kernel entries run after the front-end's checks; their scratch goes with the op's scope", async () => {
    const v = b();
    const before = v.memory.current;
    const dispatches = () => v.ctx.stats().dispatches;
    // A strided x: rms_norm copies it to contiguous scratch, which the op's scope frees.
    const rows = 3;
    const d = 5;
    const xs = Float32Array.from({ length: rows * d }, (_, i) => Math.sin(i) * 2);
    const base = v.upload(xs, [d, rows], "f32");
    const xt = base.transpose(0, 1); // [rows, d], strides [1, rows]
    const y = v.rmsNorm(xt, null, { eps: 1e-6 });
    expect(v.memory.current - before).toBe(base.byteLength + y.byteLength);
    const got = (await v.read(y)) as Float32Array;
    for (let r = 0; r < rows; r++) {
      let ss = 0;
      for (let j = 0; j < d; j++) ss += (xs[j * rows + r] as number) ** 2;
      const inv = 1 / Math.sqrt(ss / d + 1e-6);
      for (let j = 0; j < d; j++)
        expect(Math.abs((got[r * d + j] as number) - (xs[j * rows + r] as number) * inv)).toBeLessThan(1e-5);
    }
    // A bad argument is refused before the kernel records anything or an output is kept.
    const w = v.upload(new Float32Array(d + 1), [d + 1], "f32");
    const n0 = dispatches();
    const m0 = v.memory.current;
    expect(errorOf(() => v.rmsNorm(xt, w, { eps: 1e-6 })).code).toBe("E_SHAPE");
    expect(errorOf(() => v.rmsNorm(xt, null, { eps: -1 })).code).toBe("E_ARG");
    expect(dispatches()).toBe(n0);
    expect(v.memory.current).toBe(m0);
    // A kernel that throws after making scratch (a contiguous copy of x, then a ConvRot rotation group
    // past the quantize kernel's shared memory): the scratch and the output are both freed.
    const k = 16384;
    const wide = v.upload(new Float32Array(2 * 2 * k), [2, 2 * k], "f32");
    const convrot = new Weight({
      name: "w_convrot",
      format: "int8_convrot",
      shape: [1, k],
      data: new Uint8Array(k),
      scale: { kind: "row", values: new Float32Array(1) },
      rotationGroup: k,
    });
    const m1 = v.memory.current;
    const e = errorOf(() => v.matmul(wide.slice(1, 0, k), convrot));
    expect(e.code).toBe("E_UNSUPPORTED");
    expect(e.message).toContain("op matmul on backend vulkan: ConvRot rotation group 16384");
    expect(v.memory.current).toBe(m1);
    for (const t of [base, y, w, wide]) v.free(t);
    expect(v.memory.current).toBe(before);
  });

  test("ops are recorded and run at read; freeing an input before that is safe", async () => {
    const stats0 = b().ctx.stats();
    const x = b().upload(Float32Array.from([1, -1, 2, -2]), [4], "f32");
    let y: Tensor = x;
    for (let i = 0; i < 20; i++) y = b().add(y, x);
    const s = b().scale(y, 0.5);
    b().free(x); // the queued ops still use its buffer: freed once they have run
    const stats1 = b().ctx.stats();
    expect(stats1.dispatches - stats0.dispatches).toBe(21);
    expect(stats1.batches).toBe(stats0.batches);
    expect([...((await b().read(s)) as Float32Array)]).toEqual([10.5, -10.5, 21, -21]);
    expect(b().ctx.stats().pendingFrees).toBe(0);
  });

  test("a resident weight is uploaded once and accounted; streaming frees its copy", async () => {
    const w = new Weight({
      name: "w",
      format: "f32",
      shape: [2, 4],
      data: new Uint8Array(Float32Array.from([1, 2, 3, 4, 5, 6, 7, 8]).buffer),
    });
    const x = b().upload(Float32Array.from([1, 1, 1, 1]), [1, 4], "f32");
    const before = b().memory.current;
    const y1 = b().matmul(x, w);
    expect(b().memory.current - before).toBe(8); // the output only: the streamed copy is gone
    b().makeResident(w);
    expect(b().isResident(w)).toBe(true);
    expect(b().memory.current - before).toBe(8 + 32);
    const y2 = b().matmul(x, w);
    expect([...((await b().read(y1)) as Float32Array)]).toEqual([10, 26]);
    expect([...((await b().read(y2)) as Float32Array)]).toEqual([10, 26]);
    b().evict(w);
    expect(b().memory.current - before).toBe(16);
    // A copy made inside a scope is persisted: it outlives the scope and stays until evict.
    b().scope(() => b().makeResident(w));
    expect(b().isResident(w)).toBe(true);
    expect(b().memory.current - before).toBe(16 + 32);
    const y3 = b().matmul(x, w); // the resident copy
    expect([...((await b().read(y3)) as Float32Array)]).toEqual([10, 26]);
    b().evict(w);
    expect(b().memory.current - before).toBe(16 + 8);
    for (const t of [x, y1, y2, y3]) b().free(t);
  });

  for (const staged of [false, true]) {
    test(`the stream ring${staged ? " through host staging buffers (TP_VULKAN_STAGING path)" : ""}: streamed weights go through its 2 slots in turn (accounted, no per-op copy); a weight past a slot is copied per op`, async () => {
      const v = staged ? createBackend({ forceStaging: true }) : b();
      try {
        if (staged) expect(v.info.unifiedMemory).toBe(false);
        const f32w = (name: string, rows: number, values: number[]) =>
          new Weight({
            name,
            format: "f32",
            shape: [rows, 4],
            data: new Uint8Array(Float32Array.from(values).buffer),
          });
        const w1 = f32w("w1", 2, [1, 2, 3, 4, 5, 6, 7, 8]);
        const w2 = f32w("w2", 3, [1, 0, 0, 0, 0, 1, 0, 0, -1, -1, -1, -1]);
        const big = f32w("big", 4, [...Array(16).keys()]); // 64 bytes: past a 48-byte slot
        const x = v.upload(Float32Array.from([1, 2, 3, 4]), [1, 4], "f32");
        // x · Wᵀ by hand
        const want = { w1: [30, 70], w2: [1, 2, -10], big: [20, 60, 100, 140] };
        expect(errorOf(() => v.setStreamRing(-1, 48, 0)).code).toBe("E_ARG");
        const before = v.memory.current;
        const s0 = v.streamStats;
        v.setStreamRing(2, 48, 0);
        expect(v.streamRingBytes).toBe(96);
        expect(v.memory.current - before).toBe(96); // staging buffers are host memory, not accounted
        const ys = [w1, w2, w1, w2, w1].map((w) => v.matmul(x, w));
        const s1 = v.streamStats;
        expect([s1.uploads - s0.uploads, s1.bytes - s0.bytes]).toEqual([5, 32 * 3 + 48 * 2]);
        // the outputs (8 + 12 + 8 + 12 + 8 bytes) and the ring: no copy of its own per op
        expect(v.memory.current - before).toBe(96 + 48);
        const yBig = v.matmul(x, big);
        expect(v.streamStats.uploads).toBe(s1.uploads); // copied per op, not through the ring
        const got = await Promise.all(
          [...ys, yBig].map(async (y) => [...((await v.read(y)) as Float32Array)]),
        );
        expect(got).toEqual([want.w1, want.w2, want.w1, want.w2, want.w1, want.big]);
        v.setStreamRing(0, 0, 0);
        expect(v.streamRingBytes).toBe(0);
        expect(v.memory.current - before).toBe(48 + 16);
        for (const t of [x, ...ys, yBig]) v.free(t);
      } finally {
        if (staged) v.dispose();
      }
    });
  }

  test("device memory: the heap size where the device lacks VK_EXT_memory_budget; the default budget is that less the margin", () => {
    const m = b().deviceMemory();
    expect(m.totalBytes).toBe(b().info.deviceLocalBytes);
    const d = defaultVramBudget(b(), 0.1, 256 * 2 ** 20);
    if (d === null) throw new Error("vulkan reports device memory");
    const margin = Math.max(256 * 2 ** 20, Math.floor(m.totalBytes * 0.1));
    expect(d.bytes).toBe(b().memory.current + Math.max(0, m.freeBytes - margin));
    if (!m.reported) {
      expect(m.freeBytes).toBe(m.totalBytes);
      expect(d.note).toContain("no VK_EXT_memory_budget");
    }
  });

  test.skipIf(backend !== null && !b().ctx.memoryBudget().extension)(
    `device memory from VK_EXT_memory_budget: usage rises by what is allocated${backend !== null && !b().ctx.memoryBudget().extension ? ` (skipped: ${b().info.name} ${b().info.driver} lacks the extension)` : ""}`,
    () => {
      const m0 = b().ctx.memoryBudget();
      expect(m0.budget).toBeGreaterThan(0);
      expect(m0.budget).toBeLessThanOrEqual(m0.heapBytes);
      const bytes = 64 * 2 ** 20;
      const t = b().alloc([bytes], "u8", "budget probe");
      const m1 = b().ctx.memoryBudget();
      b().free(t);
      // the driver may round or allocate in blocks: at least the bytes, at most a few MiB more
      expect(m1.usage - m0.usage).toBeGreaterThanOrEqual(bytes);
      expect(m1.usage - m0.usage).toBeLessThan(bytes + 16 * 2 ** 20);
      const info = b().deviceMemory();
      expect([info.reported, info.source]).toEqual([true, "VK_EXT_memory_budget"]);
    },
  );

  test("views of a buffer past maxStorageBufferRange are bound in windows, work split to fit", async () => {
    const range = b().info.maxStorageBufferRange;
    if (range > 2 ** 28) return; // only where that is cheap to allocate (llvmpipe: 128 MiB)
    const n = range / 4 + 1024;
    const big = b().alloc([n], "f32", "big");
    const tail = Float32Array.from({ length: 64 }, (_, i) => i - 32);
    const buffer = (big.storage.handle as { buffer: VulkanBuffer }).buffer;
    b().ctx.write(buffer, (n - 64) * 4, new Uint8Array(tail.buffer));
    const view = big.slice(0, n - 64, n);
    const y = b().scale(view, 2);
    expect([...((await b().read(y)) as Float32Array)]).toEqual([...tail].map((v) => v * 2));
    // the whole buffer: the work is split in pieces that fit
    const all = b().scale(big, 2);
    expect([...((await b().read(all.slice(0, n - 64, n))) as Float32Array)]).toEqual(
      [...tail].map((v) => v * 2),
    );
    // a transposed view: split by columns, each piece within the limit
    const col = Float32Array.from({ length: 64 }, (_, i) => 1000 + i);
    b().ctx.write(buffer, (n - 2048) * 4, new Uint8Array(col.buffer)); // row 32767 of [32768, 1024]
    const tr = b().copy(
      big
        .slice(0, 0, n - 1024)
        .reshape(-1, 1024)
        .transpose(0, 1),
    ); // [1024, 32768]
    const last = (await b().read(tr.slice(1, 32767, 32768).slice(0, 0, 64))) as Float32Array;
    expect([...last]).toEqual([...col]);
    b().free(tr);
    for (const x of [y, all, big]) b().free(x);
  }, 60_000);

  test("grids past 65535 workgroups wrap into a second dimension", async () => {
    const n = 65536 * 256 + 300; // one more workgroup row than one dimension holds at 256 per group
    const data = new Float32Array(n);
    for (let i = 0; i < n; i++) data[i] = i % 1000;
    const x = b().upload(data, [n], "f32");
    const y = b().scale(x, 2);
    const out = (await b().read(y)) as Float32Array;
    for (const i of [0, 999, 65535 * 256 + 5, n - 1]) expect(out[i]).toBe((i % 1000) * 2);
    const rows = 65600; // row kernels: one workgroup per row
    const pairs = new Float32Array(2 * rows);
    for (let i = 1; i < 2 * rows; i += 2) pairs[i] = 1;
    const r = b().upload(pairs, [rows, 2], "f32");
    const am = (await b().read(b().argmax(r))) as Int32Array;
    expect(am.length).toBe(rows);
    expect(am.every((v) => v === 1)).toBe(true);
    for (const t of [x, y, r]) b().free(t);
  }, 60_000);

  test("attention: every invocation's loop iterations are bounded whatever the number of keys", () => {
    // llvmpipe ends all loops of an invocation after 65535 iterations together: attention splits keys.
    for (const [d, dv] of [
      [64, 64],
      [128, 128],
      [256, 256],
      [64, 200],
      [4000, 4000],
    ] as const) {
      const p = attentionPlan(d, dv, 1_000_000, 32768);
      expect(p.iterations).toBeLessThanOrEqual(ATTENTION_LOOP_BUDGET);
      expect(p.chunk).toBeGreaterThanOrEqual(1);
      expect(p.chunks).toBe(Math.ceil(1_000_000 / p.chunk));
      expect(p.maxMerge).toBeGreaterThan(100);
    }
    expect(attentionPlan(128, 128, 90, 32768).chunks).toBe(1); // short ranges: one pass
    expect(errorOf(() => attentionPlan(8192, 8192, 10, 32768)).code).toBe("E_UNSUPPORTED");
  });

  test("attention: long key ranges, folded in several dispatches, queries in several groups", async () => {
    // [B, H, Hkv, Sq, Skv, D]; scratch of 3 tile-slots: 1 tile and 2 ranges per dispatch
    const cases: [Dims, { causal?: boolean; qOffset?: number; window?: number; fullPrefix?: number }][] = [
      [[1, 4, 1, 1, 1500, 64], { causal: true }],
      [[2, 2, 1, 70, 900, 32], { causal: true, window: 400, fullPrefix: 30, qOffset: 800 }],
      [[1, 2, 2, 3, 1100, 128], {}],
    ];
    for (const [dims, o] of cases) {
      const [bs, h, hkv, sq, skv, d] = dims;
      const qs = Float32Array.from({ length: bs * h * sq * d }, (_, i) => Math.sin(i * 0.37));
      const ks = Float32Array.from({ length: bs * hkv * skv * d }, (_, i) => Math.cos(i * 0.11));
      const vs = Float32Array.from({ length: bs * hkv * skv * d }, (_, i) => Math.sin(i * 0.23 + 1));
      const want = attentionF64(qs, ks, vs, dims, o);
      expect(attentionPlan(d, d, skv, b().info.maxComputeSharedMemory).chunks).toBeGreaterThan(2);
      const q = b().upload(qs, [bs, h, sq, d], "f32");
      const k = b().upload(ks, [bs, hkv, skv, d], "f32");
      const v = b().upload(vs, [bs, hkv, skv, d], "f32");
      // The kernel entry itself for a small scratch cap; the op front-end for the default one.
      const params = {
        batch: bs,
        heads: h,
        kvHeads: hkv,
        sq,
        skv,
        headDim: d,
        headDimV: d,
        scale: 1 / Math.sqrt(d),
        causal: o.causal ?? false,
        qOffset: o.qOffset ?? skv - sq,
        window: o.window ?? 0,
        fullPrefix: o.fullPrefix ?? 0,
        softcap: 0,
      };
      for (const scratch of [undefined, 3 * 64 * (d + 2) * 4]) {
        let y: Tensor;
        if (scratch === undefined) y = b().attention(q, k, v, o);
        else {
          y = b().alloc([bs, h, sq, d], "f32");
          attention(b(), y, q, k, v, params, scratch);
        }
        const got = (await b().read(y)) as Float32Array;
        b().free(y);
        let worst = 0;
        for (let i = 0; i < got.length; i++)
          worst = Math.max(worst, Math.abs((got[i] as number) - (want[i] as number)));
        expect(worst).toBeLessThan(1e-5);
      }
      for (const t of [q, k, v]) b().free(t);
    }
  });

  test("attention reads KV-cache views in place: nothing but the output is allocated", async () => {
    const [h, hkv, len, cap, d] = [4, 2, 300, 320, 64];
    const cache = b().upload(new Float32Array(cap * hkv * d).fill(0.5), [cap, hkv, d], "f32");
    const view = cache.slice(0, 0, len).reshape(1, len, hkv, d).permute(0, 2, 1, 3);
    const q = b()
      .upload(new Float32Array(h * d).fill(1), [1, 1, h, d], "f32")
      .permute(0, 2, 1, 3);
    const before = b().memory.current;
    const y = b().attention(q, view, view, { causal: true });
    expect(b().memory.current - before).toBe(y.byteLength);
    expect(Array.from((await b().read(y)) as Float32Array).every((x) => Math.abs(x - 0.5) < 1e-6)).toBe(true);
    for (const t of [y, q, cache]) b().free(t);
  });

  test("matmul: the subgroup kernels and their shared-memory fallbacks agree with a plain loop", async () => {
    const [m, n, k] = [3, 37, 96];
    const xs = Float32Array.from({ length: m * k }, (_, i) => Math.sin(i));
    const ws = Float32Array.from({ length: n * k }, (_, i) => Math.cos(i * 0.7));
    const w = new Weight({ name: "w", format: "f32", shape: [n, k], data: new Uint8Array(ws.buffer) });
    const want = Array.from({ length: m * n }, (_, o) => {
      let s = 0;
      for (let t = 0; t < k; t++)
        s += (xs[Math.floor(o / n) * k + t] as number) * (ws[(o % n) * k + t] as number);
      return s;
    });
    for (const subgroups of [true, false]) {
      if (subgroups && !has.subgroup) continue;
      const v = createBackend({ subgroups });
      expect(v.subgroups).toBe(subgroups);
      const got = (await v.read(v.matmul(v.upload(xs, [m, k], "f32"), w))) as Float32Array;
      for (let i = 0; i < m * n; i++)
        expect(Math.abs((got[i] as number) - (want[i] as number))).toBeLessThan(1e-4);
      v.dispose();
    }
  });

  test("kernel variants: subgroup reductions and 16-bit weight reads give the fallbacks' results", async () => {
    // Every op whose kernel has a variant, on every combination the device can run; the all-fallback
    // backend is the baseline (it also runs the whole conformance suite with TP_VULKAN_SUBGROUPS=0
    // TP_VULKAN_STORAGE16=0). Selection / maxima / 16-bit reads are exact; sums differ by rounding.
    const [rows, d] = [6, 1000];
    const xs = Float32Array.from(
      { length: rows * d },
      (_, i) => Math.sin(i * 0.37) * 3 + 100 * Math.floor(i / d),
    );
    for (let r = 0; r < rows; r++) xs[r * d + 700] = xs[r * d + 300] = 200 + 100 * r; // ties: the lower index wins
    const k = 96;
    const xa = Float32Array.from({ length: 12 * k }, (_, i) => Math.sin(i * 0.37) * 3);
    const ws = Float32Array.from({ length: 40 * k }, (_, i) => Math.cos(i * 0.11) * (1 + (i % 5)));
    const weights = [
      weightOf("f16", ws, [40, k]),
      weightOf("bf16", ws, [40, k]),
      weightOf("q8_0", ws, [40, k]),
    ];
    const run = async (v: VulkanBackend) => {
      const x = v.upload(xs, [rows, d], "f32");
      const out: Record<string, number[]> = {
        softmax: [...((await v.read(v.softmax(x))) as Float32Array)],
        rms_norm: [...((await v.read(v.rmsNorm(x, null, { eps: 1e-6 }))) as Float32Array)],
        layer_norm: [...((await v.read(v.layerNorm(x, null, null, { eps: 1e-5 }))) as Float32Array)],
        group_norm: [
          ...((await v.read(
            v.groupNorm(v.upload(xs, [2, rows, d / 2], "f32"), 3, null, null, { eps: 1e-5 }),
          )) as Float32Array),
        ],
        argmax: [...((await v.read(v.argmax(x))) as Int32Array)],
        top_k: [...((await v.read(v.topK(x, 5).indices)) as Int32Array)],
      };
      for (const w of weights) {
        for (const m of [1, 3, 12]) {
          const a = v.upload(xa.subarray(0, m * k), [m, k], "f32");
          out[`matmul ${w.format} M=${m}`] = [...((await v.read(v.matmul(a, w))) as Float32Array)];
        }
        const ids = v.upload(Int32Array.from([3, 0, 39, 3]), [4], "i32");
        out[`embedding ${w.format}`] = [...((await v.read(v.embedding(w, ids))) as Float32Array)];
      }
      return out;
    };
    const base = createBackend({ subgroups: false, storage16: false });
    expect(base.kernels.features).toEqual({ subgroup: false, s16: false });
    const want = await run(base);
    base.dispose();
    // The baseline against plain references.
    for (let r = 0; r < rows; r++) expect(want.argmax?.[r]).toBe(300);
    expect(want.top_k?.slice(0, 2)).toEqual([300, 700]);
    const wf16 = Float32Array.from(ws, (v) => f16ToF32(f32ToF16(v)));
    const mm = want["matmul f16 M=3"] as number[];
    for (let i = 0; i < 3 * 40; i++) {
      let s = 0;
      for (let t = 0; t < k; t++)
        s += (xa[Math.floor(i / 40) * k + t] as number) * (wf16[(i % 40) * k + t] as number);
      expect(Math.abs((mm[i] as number) - s)).toBeLessThan(1e-4 * (1 + Math.abs(s)));
    }
    for (const [subgroups, storage16] of [
      [true, false],
      [false, true],
      [true, true],
    ] as const) {
      if ((subgroups && !has.subgroup) || (storage16 && !has.s16)) {
        expect(errorOf(() => createBackend({ subgroups, storage16 })).code).toBe("E_UNSUPPORTED");
        continue;
      }
      const v = createBackend({ subgroups, storage16 });
      expect(v.kernels.features).toEqual({ subgroup: subgroups, s16: storage16 });
      const got = await run(v);
      v.dispose();
      for (const [op, values] of Object.entries(want)) {
        const g = got[op] as number[];
        expect(g.length).toBe(values.length);
        // Exact: selections, 16-bit reads without a subgroup sum (the same kernel arithmetic).
        const exact =
          op === "argmax" ||
          op === "top_k" ||
          op.startsWith("embedding") ||
          (!subgroups && op.startsWith("matmul"));
        for (let i = 0; i < values.length; i++) {
          const [a, e] = [g[i] as number, values[i] as number];
          if (exact) expect(`${op} ${i}: ${a}`).toBe(`${op} ${i}: ${e}`);
          else if (Math.abs(a - e) > (op.startsWith("matmul") ? 1e-4 : 2e-6) * Math.max(1, Math.abs(e)))
            expect(`${op} ${i}: ${a}`).toBe(`${op} ${i}: ${e}`);
        }
      }
    }
  }, 120_000); // four backends, each compiling its pipelines on first use (~10 s on llvmpipe, 2 cores)

  test("kernel variants follow the device's features; one asked for but missing names device and feature", () => {
    const info = b().info;
    const bare = { ...info, index: 3, name: "Example GPU", features: [] as typeof info.features };
    expect(kernelFeatures(bare, {}, {})).toEqual({ subgroup: false, s16: false });
    expect(kernelFeatures(info, {}, {})).toEqual(has);
    expect(kernelFeatures(info, {}, { TP_VULKAN_SUBGROUPS: "0", TP_VULKAN_STORAGE16: "0" })).toEqual({
      subgroup: false,
      s16: false,
    });
    expect(kernelFeatures(info, { subgroups: false }, { TP_VULKAN_SUBGROUPS: "1" }).subgroup).toBe(false);
    const e1 = errorOf(() => kernelFeatures(bare, { storage16: true }, {}));
    expect(e1.code).toBe("E_UNSUPPORTED");
    expect(e1.message).toContain("Vulkan device 3 (Example GPU)");
    expect(e1.message).toContain("storageBuffer16BitAccess");
    const e2 = errorOf(() => kernelFeatures(bare, {}, { TP_VULKAN_SUBGROUPS: "1" }));
    expect(e2.code).toBe("E_UNSUPPORTED");
    expect(e2.message).toMatch(/TP_VULKAN_SUBGROUPS=1 needs subgroup arithmetic .* \(Example GPU\) lacks/);
    expect(e2.message).not.toContain("\n");
    expect(errorOf(() => kernelFeatures(info, {}, { TP_VULKAN_STORAGE16: "yes" })).code).toBe("E_ARG");
    // A small GPU-like subgroup is not enough for matmul_vec's per-subgroup slots.
    expect(kernelFeatures({ ...info, subgroupSize: 2 }, {}, {}).subgroup).toBe(false);
  });

  test("every kernel variant of KERNELS is built, and nothing else", () => {
    const dir = defaultShaderDir();
    const built = new Set(readdirSync(dir).filter((f) => f.endsWith(".spv")));
    const expected = new Set<string>();
    for (const name of Object.keys(KERNELS) as KernelName[]) {
      for (const subgroup of [false, true])
        for (const s16 of [false, true]) expected.add(`${kernelFile(name, { subgroup, s16 })}.spv`);
    }
    expect([...built].sort()).toEqual([...expected].sort());
    expect(kernelFile("matmul_vec", { subgroup: true, s16: true })).toBe("matmul_vec.subgroup.s16");
    expect(kernelFile("add", { subgroup: true, s16: true })).toBe("add");
  });

  test("profiling: GPU timestamps per batch and per dispatch, reported by kernel", async () => {
    if (!b().info.features.includes("timestamps")) {
      const e = errorOf(() => b().profile(true));
      expect(e.code).toBe("E_UNSUPPORTED");
      expect(e.message).toContain(b().info.name);
      return;
    }
    b().profile(true);
    const x = b().upload(
      Float32Array.from({ length: 64 * 512 }, (_, i) => Math.sin(i)),
      [64, 512],
      "f32",
    );
    const w = weightOf(
      "f16",
      Float32Array.from({ length: 256 * 512 }, (_, i) => Math.cos(i)),
      [256, 512],
    );
    const y = b().softmax(b().matmul(x, w));
    const r = b().profileReport();
    const names = r.kernels.map((k) => k.kernel.split(":")[0]);
    expect(names).toContain(b().storage16 ? "matmul.s16" : "matmul");
    expect(names).toContain(b().subgroups ? "softmax.subgroup" : "softmax");
    for (const k of r.kernels) {
      expect(k.dispatches).toBeGreaterThan(0);
      expect(k.ms).toBeGreaterThanOrEqual(0);
    }
    const sum = r.kernels.reduce((a, k) => a + k.ms, 0);
    expect(sum).toBeGreaterThan(0);
    expect(sum).toBeLessThanOrEqual(r.totalMs * 1.01 + 0.01);
    b().profile(false);
    for (const t of [x, y]) b().free(t);
  });

  test("--verbose: the device, its limits and the kernels chosen, on stderr", () => {
    const code = `const { createBackend } = await import(${JSON.stringify(`${import.meta.dir}/backend.ts`)});
      createBackend({ verbose: true }).dispose();`;
    const p = Bun.spawnSync([process.execPath, "-e", code], {
      stderr: "pipe",
      stdout: "pipe",
      env: process.env,
    });
    const err = p.stderr.toString();
    expect(p.exitCode).toBe(0);
    expect(err).toContain(`vulkan: device ${b().info.index} of ${b().info.count}: ${b().info.name}`);
    expect(err).toContain("max storage-buffer range");
    expect(err).toContain("subgroup reductions");
    expect(err).toContain("16-bit weight reads");
  });

  test("a budget's E_OOM names the device", () => {
    const small = createBackend({ memoryBudget: 4096 });
    try {
      small.alloc([1024], "f32");
      const e = errorOf(() => small.alloc([1], "f32"));
      expect(e.code).toBe("E_OOM");
      expect(e.message).toContain(`vulkan (${b().info.name})`);
      expect(e.message).toContain("budget");
    } finally {
      small.dispose();
    }
  });

  test("a weight or table past maxStorageBufferRange is bound in windows of whole rows", async () => {
    const range = b().info.maxStorageBufferRange;
    if (range > 2 ** 28) return; // only where that is cheap (llvmpipe: 128 MiB)
    const k = 256;
    const n = range / (4 * k) + 100; // rows of 1 KiB: past one window
    const data = new Float32Array(n * k);
    for (let r = 0; r < n; r++) data[r * k + (r % k)] = (r % 7) + 1;
    const w = new Weight({ name: "big", format: "f32", shape: [n, k], data: new Uint8Array(data.buffer) });
    const x = b().upload(new Float32Array(k).fill(1), [1, k], "f32");
    const y = (await b().read(b().matmul(x, w))) as Float32Array;
    for (const r of [0, 1, n / 2, range / (4 * k) - 1, range / (4 * k), n - 1])
      expect(y[r]).toBe((r % 7) + 1);
    b().free(x);
  });

  test("tensors of another backend, freed tensors and a disposed backend are E_STATE", () => {
    const other = createBackend();
    const x = other.upload(new Float32Array(4), [4], "f32");
    expect(errorOf(() => b().silu(x)).code).toBe("E_STATE");
    other.free(x);
    expect(errorOf(() => other.silu(x)).code).toBe("E_STATE");
    other.dispose();
    expect(errorOf(() => other.alloc([1], "f32")).code).toBe("E_STATE");
    other.dispose(); // twice is fine
  });
});
