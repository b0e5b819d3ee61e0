// BackendBase, Tensor views and the registry, exercised through a minimal host-memory backend
// (testing.ts: its storage is a Uint8Array; it implements no ops, so every op must report E_UNSUPPORTED).
import { describe, expect, test } from "bun:test";
import { OP_METHODS, OP_NAMES, requireSupport } from "./backend.ts";
import { BackendRegistry } from "./registry.ts";
import { errorCode, HostBackend } from "./testing.ts";
import { Weight } from "./weight.ts";

describe("BackendBase and Tensor", () => {
  test("upload, views and read of strided views", async () => {
    const b = new HostBackend();
    const x = b.upload(
      Float32Array.from({ length: 24 }, (_, i) => i),
      [2, 3, 4],
      "f32",
      "x",
    );
    expect(x.describe()).toBe("x f32 [2, 3, 4] on host");
    expect(Array.from((await b.read(x)) as Float32Array)).toEqual(Array.from({ length: 24 }, (_, i) => i));
    // x.permute(2,0,1)[k, i, j] = x[i, j, k] = 12i + 4j + k
    const p = x.permute(2, 0, 1);
    const got = Array.from((await b.read(p)) as Float32Array);
    const want: number[] = [];
    for (let k = 0; k < 4; k++)
      for (let i = 0; i < 2; i++) for (let j = 0; j < 3; j++) want.push(12 * i + 4 * j + k);
    expect(got).toEqual(want);
    expect(Array.from((await b.read(x.slice(1, 1, 3).slice(2, 2))) as Float32Array)).toEqual([
      6, 7, 10, 11, 18, 19, 22, 23,
    ]);
    const h = b.upload(new Uint16Array([0x3c00, 0xc000]), [2], "f16");
    expect(Array.from((await b.read(h)) as Uint16Array)).toEqual([0x3c00, 0xc000]);
    expect(errorCode(() => b.upload(new Float32Array(5), [2, 3], "f32"))).toBe("E_SHAPE");
  });

  test("memory accounting, free, use after free, budgets, dispose", () => {
    const b = new HostBackend({ memoryBudget: 1024 });
    const a = b.alloc([64], "f32"); // 256 B
    const c = b.alloc([128], "f32"); // 512 B
    expect(b.memory.current).toBe(768);
    expect(errorCode(() => b.alloc([128], "f32"))).toBe("E_OOM");
    b.free(a);
    expect(b.memory.current).toBe(512);
    expect(b.memory.peak).toBe(768);
    expect(errorCode(() => b.free(a))).toBe("E_STATE");
    expect(errorCode(() => a.reshape(8, 8))).toBe("E_STATE");
    const other = new HostBackend();
    expect(errorCode(() => other.free(c))).toBe("E_STATE");
    b.dispose();
    expect(b.memory.current).toBe(0);
    expect(c.storage.freed).toBe(true);
    expect(errorCode(() => b.alloc([1], "f32"))).toBe("E_STATE");
  });

  test("every op not implemented is E_UNSUPPORTED naming op and backend", () => {
    const b = new HostBackend();
    const x = b.alloc([2, 2], "f32");
    const w = new Weight({ name: "w", format: "f32", shape: [2, 2], data: new Uint8Array(16) });
    expect(Object.keys(OP_METHODS).sort()).toEqual([...OP_NAMES].sort());
    for (const op of OP_NAMES) {
      if (op === "cast") continue;
      const method = b[OP_METHODS[op]] as (...args: unknown[]) => unknown;
      const args =
        op === "matmul" || op === "embedding"
          ? [op === "embedding" ? w : x, op === "embedding" ? x : w]
          : [x, x, x];
      expect(() => method.apply(b, args)).toThrow(`op ${op} is not implemented on backend host`);
    }
    expect(b.supports("cast", ["f16"])).toBe(true);
    expect(b.supports("cast", ["bf16"])).toBe(false);
    expect(() => requireSupport(b, "matmul", ["q4_k"])).toThrow(
      "backend host has no op matmul; it has: cast",
    );
    expect(() => requireSupport(b, "cast", ["bf16"])).toThrow("backend host cannot run cast with bf16");
  });
});

describe("Weight", () => {
  test("checks bytes, shape and scales against the format", () => {
    const ok = new Weight({
      name: "blocks.0.attn.wq.weight",
      format: "int4_convrot",
      shape: [2, 256],
      data: new Uint8Array(256),
      scale: { kind: "row", values: new Float32Array(2) },
    });
    expect(ok.k).toBe(256);
    expect(ok.rotationGroup).toBe(256);
    const g64 = new Weight({
      name: "l",
      format: "int8_convrot",
      shape: [1, 64],
      data: new Uint8Array(64),
      scale: { kind: "row", values: new Float32Array(1) },
      rotationGroup: 64,
    });
    expect(g64.rotationGroup).toBe(64);
    expect(
      () =>
        new Weight({
          name: "l",
          format: "int8_convrot",
          shape: [1, 96],
          data: new Uint8Array(96),
          scale: { kind: "row", values: new Float32Array(1) },
          rotationGroup: 32,
        }),
    ).toThrow("int8_convrot rotation group 32 is not a power of 4 (tensor l)");
    const bad = (init: Partial<ConstructorParameters<typeof Weight>[0]>) => () =>
      new Weight({ name: "w", format: "q8_0", shape: [2, 64], data: new Uint8Array(136), ...init });
    expect(bad({})).not.toThrow();
    expect(bad({ data: new Uint8Array(135) })).toThrow(
      "q8_0 weight [2, 64] needs 136 bytes, got 135 (tensor w)",
    );
    expect(bad({ shape: [2, 60] })).toThrow(/not a whole number of q8_0 blocks/);
    expect(bad({ scale: { kind: "tensor", value: 2 } })).toThrow(/carry their own scales/);
    expect(bad({ format: "int8_convrot", data: new Uint8Array(128) })).toThrow(/needs 2 per-row f32 scales/);
    expect(bad({ source: { file: "/x.gguf", byteOffset: 4096, byteLength: 100 } })).toThrow(
      "source byte range of 100 bytes, expected 136 (file /x.gguf, tensor w, offset 4096)",
    );
  });
});

describe("registry", () => {
  test("built-in names, custom factories, unknown names, skeleton backends", async () => {
    const r = new BackendRegistry();
    expect(r.names()).toEqual(["cpu", "vulkan", "ptx", "cuda"]);
    r.register("host", (o) => new HostBackend(o));
    const b = await r.load("host", { memoryBudget: 8 });
    expect(b.name).toBe("host");
    expect(b.memory.budget).toBe(8);
    await expect(r.load("metal")).rejects.toThrow(
      "unknown backend 'metal'; expected one of: cpu, vulkan, ptx, cuda, host",
    );
    expect(() => r.register("Bad Name", () => b)).toThrow(/must be lower-case/);
  });
});
