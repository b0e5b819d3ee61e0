// KvCache on the CPU backend: the growth policy of llm.md §7.3 (first commit max(rows + 1, 4096) capped
// at the context; then ×1.5, at least +1024, capped), rows kept across growth (read back exactly), the
// [1, kv_heads, rows, head_dim] views attention reads, truncate, bytes = the backend's account, errors.
import { afterAll, describe, expect, test } from "bun:test";
import { createBackend } from "@tp/backend-cpu";
import { TpError } from "@tp/tensor";
import { KvCache } from "./kv-cache.ts";

const backend = createBackend({ threads: 1 });
afterAll(() => backend.dispose());

const KVH = 2;
const HD = 4;

/** Rows [from, from + n) of a layer: value = layer·1000 + row·10 + (head·HD + d) / 10, K positive, V negative. */
function rows(layer: number, from: number, n: number, sign: 1 | -1): Float32Array {
  return Float32Array.from({ length: n * KVH * HD }, (_, i) => {
    const r = from + Math.floor(i / (KVH * HD));
    return sign * (layer * 1000 + r * 10 + (i % (KVH * HD)) / 10);
  });
}

function append(kv: KvCache, n: number): void {
  const at = kv.length;
  kv.reserve(at + n);
  for (let l = 0; l < kv.layers; l++) {
    const k = backend.upload(rows(l, at, n, 1), [n, KVH, HD], "f32");
    const v = backend.upload(rows(l, at, n, -1), [n, KVH, HD], "f32");
    kv.write(l, k, v);
    backend.free(k);
    backend.free(v);
  }
  kv.commit(n);
}

describe("KvCache", () => {
  test("growth policy (llm.md §7.3) and bytes counted by the backend", () => {
    const kv = new KvCache(backend, { layers: 2, numKvHeads: KVH, headDim: HD, maxContext: 10000 });
    expect(kv.capacity).toBe(0);
    kv.reserve(5);
    expect(kv.capacity).toBe(4096); // max(5 + 1, 4096)
    expect(kv.bytes).toBe(2 * 2 * 4096 * KVH * HD * 4);
    expect(backend.memory.current).toBe(kv.bytes);
    kv.reserve(4097);
    expect(kv.capacity).toBe(6144); // ×1.5 (≥ +1024)
    kv.reserve(6145);
    expect(kv.capacity).toBe(9216);
    kv.reserve(9217);
    expect(kv.capacity).toBe(10000); // capped at maxContext
    kv.dispose();
    expect(backend.memory.current).toBe(0);

    const big = new KvCache(backend, { layers: 1, numKvHeads: 1, headDim: 2, maxContext: 100000 });
    big.reserve(5000);
    expect(big.capacity).toBe(5001); // prompt + 1 above 4096
    big.reserve(5002);
    expect(big.capacity).toBe(Math.ceil(5001 * 1.5));
    big.dispose();

    const small = new KvCache(backend, { layers: 1, numKvHeads: 1, headDim: 2, maxContext: 100, minRows: 8 });
    small.reserve(3);
    expect(small.capacity).toBe(8);
    small.reserve(9);
    expect(small.capacity).toBe(100); // +1024 at least, capped at 100
    small.dispose();
  });

  test("rows survive growth; views are [1, kv_heads, rows, head_dim]; truncate", async () => {
    const kv = new KvCache(backend, { layers: 2, numKvHeads: KVH, headDim: HD, maxContext: 64, minRows: 2 });
    append(kv, 3); // capacity 4
    expect(kv.capacity).toBe(4);
    append(kv, 2); // grows to 64 (cap)
    append(kv, 1);
    expect(kv.capacity).toBe(64);
    expect(kv.length).toBe(6);
    for (let l = 0; l < 2; l++) {
      const k = kv.keys(l, 6);
      expect(k.shape).toEqual([1, KVH, 6, HD]);
      const got = (await backend.read(k)) as Float32Array; // row-major [1, kvh, rows, hd]
      const want = rows(l, 0, 6, 1);
      for (let h = 0; h < KVH; h++)
        for (let r = 0; r < 6; r++)
          for (let d = 0; d < HD; d++)
            expect(got[(h * 6 + r) * HD + d]).toBe(want[(r * KVH + h) * HD + d] as number);
      const v = (await backend.read(kv.values(l, 6))) as Float32Array;
      expect(v[0]).toBe(rows(l, 0, 1, -1)[0] as number);
    }
    kv.truncate(2);
    expect(kv.length).toBe(2);
    append(kv, 1); // overwrites row 2 with the same pattern
    const k0 = (await backend.read(kv.keys(0, 3))) as Float32Array;
    expect(k0[2 * HD]).toBe(20); // layer 0, row 2, head 0, d 0
    kv.dispose();
    expect(backend.memory.current).toBe(0);
  });

  test("a cache that grows inside a backend.scope keeps its rows after the scope closes", async () => {
    const kv = new KvCache(backend, { layers: 1, numKvHeads: KVH, headDim: HD, maxContext: 100 });
    backend.scope(() => append(kv, 3)); // reserve allocates inside the scope
    const got = (await backend.read(kv.keys(0, 3))) as Float32Array; // [1, kvh, 3, hd]
    const want = rows(0, 0, 3, 1); // [3, kvh, hd]
    for (let h = 0; h < KVH; h++)
      for (let r = 0; r < 3; r++)
        for (let d = 0; d < HD; d++)
          expect(got[(h * 3 + r) * HD + d]).toBe(want[(r * KVH + h) * HD + d] as number);
    kv.dispose();
    expect(backend.memory.current).toBe(0);
  });

  test("errors: context window full, write before reserve, bad truncate, use after dispose", () => {
    const kv = new KvCache(backend, { layers: 1, numKvHeads: 1, headDim: 2, maxContext: 8 });
    const code = (fn: () => unknown) => {
      try {
        fn();
      } catch (e) {
        return e instanceof TpError ? e.code : "not a TpError";
      }
      return "no error";
    };
    expect(() => kv.reserve(9)).toThrow(/context window full.*--ctx/);
    const t = backend.upload(new Float32Array(2), [1, 1, 2], "f32");
    expect(code(() => kv.write(0, t, t))).toBe("E_STATE");
    kv.reserve(1);
    expect(kv.capacity).toBe(8);
    expect(code(() => kv.truncate(1))).toBe("E_ARG");
    expect(code(() => kv.commit(9))).toBe("E_STATE");
    expect(code(() => new KvCache(backend, { layers: 0, numKvHeads: 1, headDim: 2, maxContext: 8 }))).toBe(
      "E_ARG",
    );
    kv.dispose();
    expect(code(() => kv.reserve(1))).toBe("E_STATE");
    backend.free(t);
    expect(backend.memory.current).toBe(0);
  });

  test("sliding-window rings: W + ringBatch rows, the last W − 1 positions kept in order as it moves on", async () => {
    // layer 0 full, layer 1 a ring: window 3, batch 2 → 5 rows
    const kv = new KvCache(backend, {
      layers: 2,
      numKvHeads: KVH,
      headDim: HD,
      maxContext: 100,
      minRows: 8,
      slidingWindow: [0, 3],
      ringBatch: 2,
    });
    expect(kv.maxStep).toBe(2);
    append(kv, 2);
    expect(kv.bytes).toBe(2 * (8 + 5) * KVH * HD * 4);
    expect(backend.memory.current).toBe(kv.bytes);
    append(kv, 2);
    append(kv, 1); // positions 0..4 fill the ring
    expect([kv.start(0), kv.start(1), kv.truncateFloor]).toEqual([0, 0, 0]);
    append(kv, 2); // positions 5, 6: the ring keeps 3, 4 (W − 1 = 2) at its front
    expect([kv.start(0), kv.start(1), kv.truncateFloor]).toEqual([0, 3, 5]);
    append(kv, 1);
    append(kv, 2); // 7, then 8, 9: rows 3..7 → keeps 6, 7
    expect([kv.length, kv.start(1)]).toEqual([10, 6]);
    const k = kv.keys(1, 10); // positions [6, 10)
    expect(k.shape).toEqual([1, KVH, 4, HD]);
    const got = (await backend.read(k)) as Float32Array;
    const want = rows(1, 6, 4, 1);
    for (let h = 0; h < KVH; h++)
      for (let r = 0; r < 4; r++)
        for (let d = 0; d < HD; d++)
          expect(got[(h * 4 + r) * HD + d]).toBe(want[(r * KVH + h) * HD + d] as number);
    const v = (await backend.read(kv.values(1, 10))) as Float32Array;
    expect(v[0]).toBe(rows(1, 6, 1, -1)[0] as number);
    // the full layer still holds everything
    expect((await backend.read(kv.keys(0, 10))).length).toBe(10 * KVH * HD);
    expect(kv.bytes).toBe(2 * (100 + 5) * KVH * HD * 4); // the full layer grew (+1024, capped at 100), the ring did not
    const code = (fn: () => unknown) => {
      try {
        fn();
      } catch (e) {
        return e instanceof TpError ? e.code : "not a TpError";
      }
      return "no error";
    };
    expect(code(() => kv.reserve(13))).toBe("E_STATE"); // 3 rows in one step > ringBatch 2
    expect(code(() => kv.truncate(7))).toBe("E_STATE"); // position 7's window starts at 5: dropped
    expect(code(() => kv.keys(1, 5))).toBe("E_ARG"); // before the ring's start
    kv.truncate(8); // window of 8 starts at 6: still held
    append(kv, 1);
    expect((await backend.read(kv.keys(1, 9)))[2 * HD]).toBe(1000 + 80); // position 8 rewritten
    kv.truncate(0);
    expect([kv.length, kv.start(1), kv.truncateFloor]).toEqual([0, 0, 0]);
    append(kv, 2);
    expect((await backend.read(kv.keys(1, 2)))[HD]).toBe(1000 + 10);
    kv.dispose();
    expect(backend.memory.current).toBe(0);
  });
});
