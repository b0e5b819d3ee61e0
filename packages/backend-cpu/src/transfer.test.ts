// BackendBase.readSync and transfer (@tp/tensor base.ts) between two cpu backends: the crossing of a
// placed LLM (@tp/llm placement.ts). The values must arrive bit for bit, a strided view as its
// row-major elements, and the source must stay its owner's.
import { expect, test } from "bun:test";
import { TpError, transfer } from "@tp/tensor";
import { createBackend } from "./backend.ts";

test("transfer: a copy on the other backend, bit for bit; a strided view row-major; the same backend: itself", async () => {
  const a = createBackend({ threads: 1 });
  const b = createBackend({ threads: 1 });
  try {
    const data = Float32Array.from({ length: 12 }, (_, i) => i * 1.5 - 4 + 1e-7 * i);
    const x = a.upload(data, [3, 4], "f32", "hidden");
    expect(transfer(x, a)).toBe(x);
    const y = transfer(x, b);
    expect(y.backend).toBe(b);
    expect(y.name).toBe("hidden");
    expect(Array.from((await b.read(y)) as Float32Array)).toEqual(Array.from(data));
    const col = x.slice(1, 1, 3); // [3, 2], strided
    const z = transfer(col, b);
    expect(z.shape).toEqual([3, 2]);
    expect(Array.from((await b.read(z)) as Float32Array)).toEqual(
      [1, 2, 5, 6, 9, 10].map((i) => data[i] as number),
    );
    expect(a.memory.current).toBe(x.storage.byteLength); // the strided view's copy was freed
    let err: unknown;
    try {
      a.readSync(col);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(TpError);
    expect((err as TpError).code).toBe("E_UNSUPPORTED");
  } finally {
    a.dispose();
    b.dispose();
  }
});
