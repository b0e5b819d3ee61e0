// Bad input from a user or a careless program: each case must be a TpError with the right code and a
// message naming what is wrong — never another exception, a wrong result or a bad pointer. The cases
// come from an adversarial review of this package.
import { describe, expect, test } from "bun:test";
import { decodeTable, decodeToF32, encodeFromF32 } from "./convert.ts";
import { weightBytes, weightFormatFromGgml } from "./dtype.ts";
import { MemoryAccount } from "./memory.ts";
import { BackendRegistry } from "./registry.ts";
import { contiguousLayout, reshape, slice } from "./shape.ts";
import { Tensor } from "./tensor.ts";
import { errorCode, HostBackend } from "./testing.ts";
import { Weight, type WeightInit } from "./weight.ts";

describe("views", () => {
  test("fractional or NaN slice bounds are E_SHAPE", () => {
    const l = contiguousLayout([8]);
    expect(errorCode(() => slice(l, 0, 1.5, 4))).toBe("E_SHAPE");
    expect(errorCode(() => slice(l, 0, 0, 2.5))).toBe("E_SHAPE");
    expect(errorCode(() => slice(l, 0, Number.NaN))).toBe("E_SHAPE");
    expect(slice(l, 0, -3).shape).toEqual([3]);
  });

  test("layouts with negative, fractional or NaN strides or offsets, or the wrong stride count, are E_SHAPE", async () => {
    const b = new HostBackend();
    const x = b.upload(Float32Array.from([0, 1, 2, 3]), [4], "f32", "x");
    for (const layout of [
      { shape: [4], strides: [-1], offset: 3 },
      { shape: [4], strides: [Number.NaN], offset: 0 },
      { shape: [2, 2], strides: [], offset: 0 },
      { shape: [4], strides: [1], offset: Number.NaN },
      { shape: [4], strides: [1], offset: 0.5 },
      { shape: [3], strides: [1.5], offset: 0 },
    ]) {
      expect(() => x.view(layout)).toThrow(/bad layout/);
    }
    expect(() => x.view({ shape: [4], strides: [1], offset: 1 })).toThrow(/reaches past its storage/);
    expect(
      errorCode(() => new Tensor(b, x.storage, "f32", { shape: null as never, strides: [], offset: 0 })),
    ).toBe("E_SHAPE");
  });

  test("a zero-element non-contiguous view reshapes", () => {
    const t = reshape({ shape: [0, 3], strides: [1, 0], offset: 0 }, [0]);
    expect(t.shape).toEqual([0]);
  });
});

describe("memory", () => {
  test("a failed allocation changes neither current nor peak", () => {
    class Failing extends HostBackend {
      protected override allocStorage(bytes: number): Uint8Array {
        if (bytes > 1024) throw new RangeError("host says no");
        return super.allocStorage(bytes);
      }
    }
    const b = new Failing();
    b.alloc([16], "f32");
    expect(() => b.alloc([4096], "f32")).toThrow("host says no");
    expect(b.memory.stats()).toMatchObject({ current: 64, peak: 64, allocations: 1 });
    expect(errorCode(() => new MemoryAccount("m").release(Number.NaN))).toBe("E_ARG");
    expect(errorCode(() => b.free({} as Tensor))).toBe("E_STATE");
  });

  test("upload takes the dtype's host array or raw bytes, nothing else", () => {
    const b = new HostBackend();
    expect(errorCode(() => b.upload(new Float64Array(2), [4], "f32"))).toBe("E_ARG");
    expect(() => b.upload(new Float32Array(4), [2], "i64")).toThrow(
      "expected a BigInt64Array (or raw bytes as a Uint8Array), got Float32Array(16 bytes)",
    );
    expect(errorCode(() => b.upload(new DataView(new ArrayBuffer(16)) as never, [4], "f32"))).toBe("E_ARG");
    expect(errorCode(() => b.upload(null as never, [4], "f32"))).toBe("E_ARG");
    const gone = new Float32Array(4);
    structuredClone(gone.buffer, { transfer: [gone.buffer] });
    expect(() => b.upload(gone, [0], "f32")).toThrow("detached");
    expect(b.upload(new Uint8Array(16), [4], "f32").numel).toBe(4);
  });

  test("reading a view larger than one host array is E_UNSUPPORTED, not a RangeError", async () => {
    const b = new HostBackend();
    const x = b.upload(new Float32Array([1]), [1], "f32");
    await expect(b.read(x.broadcastTo([2 ** 40]))).rejects.toThrow(/past the 4 GiB of one JavaScript array/);
  });
});

describe("conversions", () => {
  test("array helpers check their arguments", () => {
    expect(errorCode(() => decodeToF32(new Uint8Array(8), "f16", -1))).toBe("E_ARG");
    expect(errorCode(() => decodeToF32(new Uint8Array(8), "f16", 1.5))).toBe("E_ARG");
    expect(errorCode(() => decodeToF32(new Uint16Array(4) as never, "f16"))).toBe("E_ARG");
    expect(errorCode(() => encodeFromF32(new Float64Array(2) as never, "f16"))).toBe("E_ARG");
    expect(errorCode(() => encodeFromF32([1, 2] as never, "bf16"))).toBe("E_ARG");
    expect(encodeFromF32(new Float32Array([1]), "f8_e4m3fn", null as never)).toEqual(new Uint8Array([0x38]));
    expect(errorCode(() => decodeTable("f32" as never))).toBe("E_UNSUPPORTED");
  });
});

describe("tables, weights and the registry", () => {
  test("type ids and shapes of the wrong kind", () => {
    expect(errorCode(() => weightFormatFromGgml(null as never))).toBe("E_UNSUPPORTED");
    expect(errorCode(() => weightFormatFromGgml("0" as never))).toBe("E_UNSUPPORTED");
    expect(errorCode(() => weightBytes("f32", null as never))).toBe("E_SHAPE");
  });

  test("Weight init objects that do not describe a weight", () => {
    const good: WeightInit = { name: "w", format: "f32", shape: [1, 2], data: new Uint8Array(8) };
    expect(new Weight(good).n).toBe(1);
    const bad = (patch: Record<string, unknown>) =>
      errorCode(() => new Weight({ ...good, ...patch } as WeightInit));
    expect(errorCode(() => new Weight(null as never))).toBe("E_ARG");
    expect(bad({ data: undefined })).toBe("E_FORMAT");
    expect(bad({ data: new Float32Array(2) })).toBe("E_FORMAT");
    expect(bad({ shape: null })).toBe("E_FORMAT");
    expect(bad({ format: "q9_z" })).toBe("E_FORMAT");
    expect(() => new Weight({ ...good, format: "q9_z" as never })).toThrow(
      "unknown weight format 'q9_z' (tensor w)",
    );
    expect(bad({ scale: { kind: "tensor", value: Number.NaN } })).toBe("E_FORMAT");
    expect(bad({ scale: { kind: "bogus" } })).toBe("E_FORMAT");
    expect(bad({ source: { file: "/x", byteOffset: -5, byteLength: 8 } })).toBe("E_FORMAT");
  });

  test("object property names are not backends; factories must be functions returning backends", async () => {
    const r = new BackendRegistry();
    for (const name of ["constructor", "toString", "__proto__", "hasOwnProperty"]) {
      await expect(r.load(name)).rejects.toThrow(`unknown backend '${name}'`);
    }
    expect(errorCode(() => r.register("x", 42 as never))).toBe("E_ARG");
    r.register("nothing", () => undefined as never);
    await expect(r.load("nothing")).rejects.toThrow(
      "the factory of backend 'nothing' returned undefined, not a Backend",
    );
  });
});
