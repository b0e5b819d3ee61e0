// backend.scope(fn) and Tensor[Symbol.dispose]: which tensors a scope frees, which it hands on, and
// the memory account before and after (HostBackend of testing.ts: every byte is accounted).
import { describe, expect, test } from "bun:test";
import type { Tensor } from "./tensor.ts";
import { errorCode, HostBackend } from "./testing.ts";

describe("backend.scope and using", () => {
  test("frees what was allocated inside except the result; the result outlives the scope", () => {
    const b = new HostBackend();
    const outside = b.alloc([4], "f32"); // 16 B, not the scope's
    let temp: Tensor | undefined;
    const y = b.scope(() => {
      temp = b.alloc([8], "f32"); // 32 B
      return b.alloc([2], "f32").reshape(1, 2); // 8 B, a view of it is returned
    });
    expect(b.memory.current).toBe(16 + 8);
    expect(temp?.storage.freed).toBe(true);
    expect(y.storage.freed).toBe(false);
    expect(y.shape).toEqual([1, 2]);
    expect(outside.storage.freed).toBe(false);
  });

  test("results inside arrays, plain objects and Maps survive; nested scopes hand survivors up", () => {
    const b = new HostBackend();
    const r = b.scope(() => {
      const inner = b.scope(() => {
        b.alloc([100], "f32"); // 400 B: freed by the inner scope
        return { a: b.alloc([1], "f32"), list: [b.alloc([2], "f32")] };
      });
      expect(b.memory.current).toBe(4 + 8);
      b.alloc([3], "f32"); // 12 B: freed by the outer scope
      return new Map([["k", inner.a]]); // inner.list[0] is not returned: the outer scope frees it
    });
    expect(b.memory.current).toBe(4);
    expect(r.get("k")?.storage.freed).toBe(false);
  });

  test("a throw frees everything allocated inside; a Promise result is E_ARG and frees too", () => {
    const b = new HostBackend();
    expect(() =>
      b.scope(() => {
        b.alloc([10], "f32");
        throw new Error("boom");
      }),
    ).toThrow("boom");
    expect(b.memory.current).toBe(0);
    expect(errorCode(() => b.scope(async () => b.alloc([1], "f32")))).toBe("E_ARG");
    expect(b.memory.current).toBe(0);
  });

  test("a tensor freed inside a scope is not freed twice; using frees at the end of the block", () => {
    const b = new HostBackend();
    b.scope(() => {
      const t = b.alloc([5], "f32");
      b.free(t);
      return null;
    });
    expect(b.memory.current).toBe(0);
    {
      using t = b.alloc([6], "f32");
      expect(b.memory.current).toBe(24);
      expect(t.numel).toBe(6);
    }
    expect(b.memory.current).toBe(0);
    const u = b.alloc([1], "f32");
    b.free(u);
    u[Symbol.dispose](); // already freed: nothing happens
    expect(b.memory.current).toBe(0);
  });

  test("persist takes tensors out of every open scope: they live until free", () => {
    const b = new HostBackend();
    let kept: { w: Tensor } | undefined;
    b.scope(() =>
      b.scope(() => {
        kept = b.persist({ w: b.alloc([4], "f32") });
        b.alloc([2], "f32"); // freed with the inner scope
        return null;
      }),
    );
    expect(b.memory.current).toBe(16);
    expect(kept?.w.storage.freed).toBe(false);
    b.free(kept?.w as Tensor);
    expect(b.memory.current).toBe(0);
    const t = b.alloc([1], "f32");
    expect(b.persist(t)).toBe(t); // outside any scope: nothing to do
  });
});
