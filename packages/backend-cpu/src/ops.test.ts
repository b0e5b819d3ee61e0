// Direct tests of the cpu backend's op layer: argument checks (E_SHAPE naming the shapes, E_STATE for
// freed or foreign tensors, E_UNSUPPORTED naming op, backend and dtype, E_ARG for bad options), the
// checks before bun:ffi (short, misaligned or out-of-bounds regions never reach native code), the
// native checks behind them, scratch accounting, thread-count determinism and cpu-specific NaN
// order. The numerics of every op are in @tp/conformance (packages/conformance), run on this backend
// at every ISA level.
import { afterAll, describe, expect, test } from "bun:test";
import { isTpError, type Tensor, type TpErrorCode } from "@tp/tensor";
import { createBackend } from "./backend.ts";
import type { Pointer } from "./ffi.ts";
import { binaryF32, copyStrided, unary } from "./ops/native.ts";

const b = createBackend({ threads: 2 });
const other = createBackend({ threads: 1 });
afterAll(() => {
  b.dispose();
  other.dispose();
});

function thrown(fn: () => unknown): { code: TpErrorCode; message: string } {
  try {
    fn();
  } catch (e) {
    if (isTpError(e)) return { code: e.code, message: e.message };
    throw e;
  }
  throw new Error("expected a TpError");
}

const f32 = (shape: number[], fill = 1) =>
  b.upload(new Float32Array(shape.reduce((a, c) => a * c, 1)).fill(fill), shape, "f32");

describe("shape errors name the shapes", () => {
  test.each([
    ["add", () => b.add(f32([2, 3]), f32([4])), ["[2, 3]", "[4]"]],
    ["swiglu", () => b.swiglu(f32([2, 3]), f32([3, 2])), ["[2, 3]", "[3, 2]"]],
    ["modulate", () => b.modulate(f32([2, 3]), f32([4]), f32([3])), ["[4]", "[2, 3]"]],
    ["rms_norm", () => b.rmsNorm(f32([2, 8]), f32([7]), { eps: 1e-6 }), ["[7]", "[2, 8]"]],
    ["layer_norm", () => b.layerNorm(f32([2, 8]), null, f32([2]), { eps: 1e-6 }), ["[2]", "[2, 8]"]],
    [
      "group_norm",
      () => b.groupNorm(f32([1, 6, 4]), 4, null, null, { eps: 1e-6 }),
      ["[1, 6, 4]", "4 groups"],
    ],
    ["softmax", () => b.softmax(f32([2, 3]), { dim: 2 }), ["dim 2", "rank 2"]],
    [
      "attention",
      () => b.attention(f32([1, 3, 4, 8]), f32([1, 2, 4, 8]), f32([1, 2, 4, 8])),
      ["q [1, 3, 4, 8]", "k [1, 2, 4, 8]", "3 query heads", "2 kv heads"],
    ],
    [
      "attention",
      () => b.attention(f32([1, 2, 4, 8]), f32([1, 2, 4, 6]), f32([1, 2, 4, 8])),
      ["head_dim differ"],
    ],
    ["conv2d", () => b.conv2d(f32([1, 3, 5, 5]), f32([4, 2, 3, 3]), null), ["[1, 3, 5, 5]", "[4, 2, 3, 3]"]],
    ["conv2d", () => b.conv2d(f32([1, 1, 2, 2]), f32([1, 1, 3, 3]), null), ["3×3 kernel", "2×2"]],
    [
      "rope",
      () => b.rope(f32([1, 4, 2, 8]), b.upload(new Int32Array(3), [3], "i32"), { mode: "neox", theta: 1e4 }),
      ["[3]", "[4]", "[1, 4, 2, 8]"],
    ],
    ["concat", () => b.concat([f32([2, 3]), f32([2, 4])], 0), ["[2, 3], [2, 4]", "dim 0"]],
    ["argmax", () => b.argmax(f32([3, 0])), ["[3, 0]"]],
  ] as const)("%s", (_op, fn, parts) => {
    const e = thrown(fn);
    expect(e.code).toBe("E_SHAPE");
    for (const p of parts) expect(e.message).toContain(p);
  });
});

describe("set: the checks of @tp/tensor checkSetArgs", () => {
  test("shape and dtype mismatches, a broadcast or shared-storage dst; the target is left unchanged", async () => {
    const dst = f32([4, 3], 7);
    expect(thrown(() => b.set(dst.slice(0, 0, 2), f32([3, 2]))).code).toBe("E_SHAPE");
    const half = b.upload(new Uint16Array(6), [2, 3], "f16");
    const e = thrown(() => b.set(dst.slice(0, 0, 2), half));
    expect([e.code, e.message.includes("f16")]).toEqual(["E_ARG", true]);
    expect(thrown(() => b.set(f32([1, 3]).broadcastTo([4, 3]), f32([4, 3]))).message).toContain("broadcast");
    expect(thrown(() => b.set(dst.slice(0, 0, 2), dst.slice(0, 2, 4))).message).toContain("share storage");
    expect(Array.from((await b.read(dst)) as Float32Array)).toEqual(new Array(12).fill(7));
  });
});

describe("bad options are E_ARG naming the option", () => {
  test.each([
    ["gelu approximate", () => b.gelu(f32([2]), { approximate: "fast" as "tanh" }), "approximate"],
    [
      "window without causal",
      () => b.attention(f32([1, 1, 2, 4]), f32([1, 1, 2, 4]), f32([1, 1, 2, 4]), { window: 4 }),
      "window needs causal",
    ],
    [
      "softcap 0",
      () => b.attention(f32([1, 1, 2, 4]), f32([1, 1, 2, 4]), f32([1, 1, 2, 4]), { softcap: 0 }),
      "softcap",
    ],
    [
      "qOffset 1.5",
      () => b.attention(f32([1, 1, 2, 4]), f32([1, 1, 2, 4]), f32([1, 1, 2, 4]), { qOffset: 1.5 }),
      "qOffset",
    ],
    ["conv stride 0", () => b.conv2d(f32([1, 1, 4, 4]), f32([1, 1, 3, 3]), null, { stride: 0 }), "stride"],
    [
      "conv padding −1",
      () => b.conv2d(f32([1, 1, 4, 4]), f32([1, 1, 3, 3]), null, { padding: [-1, 0] }),
      "padding",
    ],
    ["top_k k > n", () => b.topK(f32([2, 5]), 6), "k must be an integer in [0, 5]"],
    ["upsample factor 0", () => b.upsampleNearest2d(f32([1, 2, 2]), 0), "factor"],
    ["negative eps", () => b.rmsNorm(f32([2, 4]), null, { eps: -1 }), "eps"],
    [
      "rope odd ropeDims",
      () =>
        b.rope(f32([1, 2, 1, 8]), b.upload(new Int32Array(2), [2], "i32"), {
          mode: "neox",
          theta: 1e4,
          ropeDims: 5,
        }),
      "even",
    ],
    [
      "rope sections sum",
      () =>
        b.rope(f32([1, 2, 1, 8]), b.upload(new Int32Array(4), [2, 2], "i32"), {
          mode: "interleaved",
          theta: 1e4,
          sections: [1, 2],
        }),
      "sum to 3 pairs",
    ],
    [
      "rope mode",
      () =>
        b.rope(f32([1, 2, 1, 8]), b.upload(new Int32Array(2), [2], "i32"), {
          mode: "gptj" as "neox",
          theta: 1e4,
        }),
      "mode",
    ],
    ["concat of nothing", () => b.concat([], 0), "at least one"],
    [
      "concat dtypes",
      () => b.concat([f32([2]), b.upload(new Int32Array(2), [2], "i32")], 0),
      "share a dtype",
    ],
  ] as const)("%s", (_what, fn, part) => {
    const e = thrown(fn);
    expect(e.code).toBe("E_ARG");
    expect(e.message).toContain(part);
  });
});

describe("tensors: freed or foreign are E_STATE, other dtypes E_UNSUPPORTED", () => {
  test("a freed input, also as the second operand and in a list", () => {
    const x = f32([4]);
    const y = f32([4]);
    b.free(y);
    expect(thrown(() => b.silu(y)).code).toBe("E_STATE");
    expect(thrown(() => b.add(x, y)).code).toBe("E_STATE");
    expect(thrown(() => b.concat([x, y], 0)).code).toBe("E_STATE");
    expect(thrown(() => b.copy(y.reshape(2, 2))).code).toBe("E_STATE");
    expect(thrown(() => b.attention(f32([1, 1, 1, 4]), f32([1, 1, 1, 4]), y.reshape(1, 1, 1, 4))).code).toBe(
      "E_STATE",
    );
  });

  test("a tensor of another backend instance", () => {
    const mine = f32([2, 4]);
    const theirs = other.upload(new Float32Array(8), [2, 4], "f32");
    const e = thrown(() => b.mul(mine, theirs));
    expect(e.code).toBe("E_STATE");
    expect(e.message).toContain("belongs to backend cpu, not this cpu backend");
    expect(
      thrown(() => b.rmsNorm(mine, other.upload(new Float32Array(4), [4], "f32"), { eps: 1e-6 })).code,
    ).toBe("E_STATE");
  });

  test("dtypes the op does not take name op, backend and dtype", () => {
    const h = b.upload(new Uint16Array(4), [4], "f16");
    const e = thrown(() => b.silu(h));
    expect(e.code).toBe("E_UNSUPPORTED");
    expect(e.message).toContain("op silu on backend cpu does not support dtype f16");
    expect(e.message).toContain("supported: f32");
    const p = thrown(() => b.rope(f32([1, 2, 1, 4]), f32([2]), { mode: "neox", theta: 1e4 }));
    expect(p.code).toBe("E_UNSUPPORTED");
    expect(p.message).toContain("dtype f32 (positions [2]); supported: i32");
    expect(b.supports("rope", ["f32", "i32"])).toBe(true);
    expect(b.supports("softmax", ["bf16"])).toBe(false);
    expect(b.supports("copy", ["i64"])).toBe(true);
    expect(b.capabilities().ops).toContain("attention");
  });
});

describe("every pointer and length is checked before bun:ffi", () => {
  const buf = b.upload(new Float32Array(16), [16], "f32");
  const region = b.viewRegion(buf);

  test("a region too short for n elements", () => {
    const e = thrown(() => unary(b.ctx, "silu", region, region, 17));
    expect(e.code).toBe("E_ARG");
    expect(e.message).toBe("silu: x holds 64 bytes, 68 are needed");
  });

  test("a misaligned pointer, a null pointer, a bad count", () => {
    const odd = { ptr: ((region.ptr as number) + 2) as Pointer, bytes: 60 };
    expect(thrown(() => unary(b.ctx, "sigmoid", odd, region, 4)).message).toBe(
      "sigmoid: x is not aligned to 4 bytes",
    );
    expect(thrown(() => unary(b.ctx, "sigmoid", { ptr: null, bytes: 0 }, region, 4)).message).toBe(
      "sigmoid: x is null but 16 bytes are needed",
    );
    expect(thrown(() => unary(b.ctx, "sigmoid", region, region, -1)).code).toBe("E_ARG");
  });

  test("strides that reach past the region", () => {
    const e = thrown(() =>
      binaryF32(b.ctx, "add", { region, strides: [4, 1] }, { region, strides: [0, 1] }, region, [4, 5]),
    );
    expect(e.code).toBe("E_ARG");
    expect(e.message).toBe("add: a holds 64 bytes, 68 are needed");
  });

  test("the native side checks again (rank, negative strides, reach)", () => {
    const raw = b.lib.raw;
    const shape = new BigInt64Array(17).fill(1n);
    expect(raw.tp_cpu_copy(b.ctx.handle, region.ptr, 16, shape, region.ptr, 16, shape, shape, 17, 4)).toBe(1);
    expect(b.ctx.lastError()).toContain("rank 17 is outside [0, 16]");
    const dims = BigInt64Array.from([4n]);
    const out = b.alloc([4], "f32");
    const big = BigInt64Array.from([6n]);
    expect(
      raw.tp_cpu_add_f32(
        b.ctx.handle,
        region.ptr,
        16,
        big,
        region.ptr,
        16,
        dims,
        b.elementPointer(out, "t"),
        dims,
        1,
      ),
    ).toBe(1);
    expect(b.ctx.lastError()).toBe("tp_cpu_add_f32: a's view reaches element 18 but only 16 are given");
    const negative = BigInt64Array.from([-1n]);
    expect(raw.tp_cpu_copy(b.ctx.handle, region.ptr, 16, negative, region.ptr, 16, dims, dims, 1, 4)).toBe(1);
    expect(b.ctx.lastError()).toContain("a stride is negative");
    expect(raw.tp_cpu_gelu_f32(b.ctx.handle, region.ptr, region.ptr, 4, 7)).toBe(1);
    expect(b.ctx.lastError()).toContain("approximate must be 0 (erf) or 1 (tanh)");
    expect(() => copyStrided(b.ctx, region, [1], region, [0], [2], 4)).toThrow();
  });
});

describe("scratch, threads and order", () => {
  test("views are copied to scratch that is freed again (only the output stays)", () => {
    const x = b.upload(
      Float32Array.from({ length: 64 }, (_, i) => i),
      [8, 8],
      "f32",
    );
    const before = b.memory.current;
    const y = b.softmax(x.transpose(0, 1));
    expect(b.memory.current - before).toBe(256);
    expect(b.memory.peak).toBeGreaterThanOrEqual(before + 512); // the scratch copy existed
    b.free(y);
    const q = b.upload(new Float32Array(3 * 2 * 8).fill(0.5), [1, 3, 2, 8], "f32");
    const before2 = b.memory.current;
    const o = b.attention(q.permute(0, 2, 1, 3), q.permute(0, 2, 1, 3), q.permute(0, 2, 1, 3));
    expect(b.memory.current - before2).toBe(o.byteLength);
  });

  test("a failed op frees its output and scratch", () => {
    const before = b.memory.current;
    const x = f32([2, 3]);
    expect(thrown(() => b.softmax(x.transpose(0, 1), { dim: 5 })).code).toBe("E_SHAPE");
    b.free(x);
    expect(b.memory.current).toBe(before);
  });

  test("results do not depend on the thread count", async () => {
    const one = createBackend({ threads: 1 });
    const three = createBackend({ threads: 3 });
    try {
      const n = 300_001;
      const data = Float32Array.from({ length: n }, (_, i) => Math.sin(i * 0.37) * 9);
      const run = async (bk: typeof b, f: (t: Tensor) => Tensor) =>
        (await bk.read(f(bk.upload(data, [n], "f32")))) as Float32Array;
      const ops: ((t: Tensor) => Tensor)[] = [
        (t) => t.backend.silu(t),
        (t) => t.backend.gelu(t, { approximate: "tanh" }),
        (t) => t.backend.softmax(t.slice(0, 0, 300_000).reshape(600, 500)),
        (t) => t.backend.rmsNorm(t.slice(0, 0, 300_000).reshape(300, 1000), null, { eps: 1e-6 }),
        (t) => t.backend.add(t.slice(0, 0, 300_000).reshape(600, 500), t.slice(0, 0, 500)),
      ];
      for (const op of ops) expect(Array.from(await run(one, op))).toEqual(Array.from(await run(three, op)));
    } finally {
      one.dispose();
      three.dispose();
    }
  });

  test("argmax and topK put NaN first (as torch), then larger values, ties to the lower index", async () => {
    const x = b.upload(new Float32Array([1, Number.NaN, 3, Number.NaN, 3, -1]), [6], "f32");
    expect(Array.from((await b.read(b.argmax(x))) as Int32Array)).toEqual([1]);
    const { values, indices } = b.topK(x, 4);
    expect(Array.from((await b.read(indices)) as Int32Array)).toEqual([1, 3, 2, 4]);
    expect(Array.from((await b.read(values)) as Float32Array).slice(2)).toEqual([3, 3]);
  });

  test("attention of a query that sees no key is zeros; no key at all is zeros", async () => {
    const q = f32([1, 1, 2, 4]);
    const k = b.alloc([1, 1, 0, 4], "f32");
    const v = b.alloc([1, 1, 0, 4], "f32");
    expect(Array.from((await b.read(b.attention(q, k, v))) as Float32Array)).toEqual(new Array(8).fill(0));
    const o = b.attention(q, f32([1, 1, 2, 4]), f32([1, 1, 2, 4], 3), { causal: true, qOffset: -1 });
    expect(Array.from((await b.read(o)) as Float32Array)).toEqual([0, 0, 0, 0, 3, 3, 3, 3]);
  });
});
