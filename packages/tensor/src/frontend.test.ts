// The op front-end (src/ops, BackendBase's op methods) against a table-driven host backend
// (testing.ts TableBackend): every check runs before the kernel and leaves memory where it was, the
// kernel gets a new output of the inferred shape and normalised options, a throwing kernel's output is
// freed, a missing entry is E_UNSUPPORTED naming backend, op and format, and supports() / capabilities()
// come from the table.
import { describe, expect, test } from "bun:test";
import type { TpErrorCode } from "./errors.ts";
import type { AttentionParams } from "./kernels.ts";
import type { Tensor } from "./tensor.ts";
import { TableBackend, thrown } from "./testing.ts";
import { Weight } from "./weight.ts";

/** What the kernels saw, call by call. */
interface Seen {
  op: string;
  args: unknown[];
}

/**
 * A backend with rms_norm (computed here, f32), add (computed, reading broadcast views), softmax,
 * conv2d, rope, attention, top_k and matmul (recording only), and one kernel that always throws (silu).
 */
function backend(budget: number | null = null) {
  const seen: Seen[] = [];
  const b = new TableBackend(
    (h) => ({
      rms_norm: {
        dtypes: ["f32"],
        run: (out, x, w, eps, unitOffset) => {
          seen.push({ op: "rms_norm", args: [out.shape, x.shape, w?.shape ?? null, eps, unitOffset] });
          const xs = h.f32(x);
          const ws = w === null ? null : h.f32(w);
          const d = x.shape[x.rank - 1] as number;
          const y = new Float32Array(xs.length);
          for (let r = 0; r < xs.length / d; r++) {
            let ss = 0;
            for (let i = 0; i < d; i++) ss += (xs[r * d + i] as number) ** 2;
            const inv = 1 / Math.sqrt(ss / d + eps);
            for (let i = 0; i < d; i++) {
              const g = ws === null ? 1 : unitOffset ? 1 + (ws[i] as number) : (ws[i] as number);
              y[r * d + i] = (xs[r * d + i] as number) * inv * g;
            }
          }
          h.write(out, y);
        },
      },
      add: {
        dtypes: ["f32"],
        run: (out, a, c) => {
          seen.push({ op: "add", args: [out.shape, a.shape, a.strides, c.shape, c.strides] });
          const av = h.f32(a);
          const cv = h.f32(c);
          h.write(
            out,
            av.map((v, i) => v + (cv[i] as number)),
          );
        },
      },
      softmax: {
        dtypes: ["f32"],
        run: (out, _x, dim) => void seen.push({ op: "softmax", args: [out.shape, dim] }),
      },
      conv2d: {
        dtypes: ["f32"],
        run: (out, _x, _w, _b, stride, padding) =>
          void seen.push({ op: "conv2d", args: [out.shape, stride, padding] }),
      },
      rope: {
        dtypes: ["f32"],
        run: (out, _x, positions, mode, theta, ropeDims, freqScale, sections) =>
          void seen.push({
            op: "rope",
            args: [out.shape, positions.dtype, mode, theta, ropeDims, freqScale, sections],
          }),
      },
      attention: {
        dtypes: ["f32"],
        run: (out, _q, _k, _v, p: AttentionParams) =>
          void seen.push({ op: "attention", args: [out.shape, p] }),
      },
      top_k: {
        dtypes: ["f32"],
        run: (values, indices, _x, k) =>
          void seen.push({
            op: "top_k",
            args: [values.shape, values.dtype, indices.shape, indices.dtype, k],
          }),
      },
      matmul: {
        dtypes: ["f32"],
        weightFormats: ["f32", "q8_0"],
        run: (out, x, w, bias) =>
          void seen.push({ op: "matmul", args: [out.shape, x.shape, w.format, bias] }),
      },
      silu: {
        dtypes: ["f32"],
        run: () => {
          seen.push({ op: "silu", args: [] });
          throw new Error("kernel failed");
        },
      },
      copy: {
        dtypes: ["f32"],
        maxBytes: 64,
        run: (out) => void seen.push({ op: "copy", args: [out.shape] }),
      },
    }),
    { memoryBudget: budget },
  );
  const f32 = (shape: number[], values?: number[]) =>
    b.upload(Float32Array.from(values ?? new Array(shape.reduce((a, c) => a * c, 1)).fill(1)), shape, "f32");
  return { b, seen, f32 };
}

describe("checks run before the kernel and allocate nothing", () => {
  test("shape, dtype, option and ownership errors: the kernel is not called, memory is unchanged", () => {
    const { b, seen, f32 } = backend();
    const other = backend().b;
    const x = f32([2, 4]);
    const v3 = f32([3]);
    const freed = f32([4]);
    b.free(freed);
    const half = b.upload(new Uint16Array(4), [4], "f16");
    const foreign = other.upload(new Float32Array(4), [4], "f32");
    const img = f32([1, 1, 3, 3]);
    const kernel2 = f32([1, 1, 2, 2]);
    const x8 = f32([1, 2, 1, 8]);
    const pos2x2 = b.upload(new Int32Array(4), [2, 2], "i32");
    const posF32 = f32([2]);
    const q = f32([1, 1, 2, 4]);
    const q3 = f32([1, 3, 1, 4]);
    const kv2 = f32([1, 2, 1, 4]);
    const w23 = new Weight({ name: "w", format: "f32", shape: [2, 3], data: new Uint8Array(24) });
    const long = f32([32]);
    const cases: [TpErrorCode, string[], () => unknown][] = [
      ["E_SHAPE", ["op rms_norm on backend table", "[3]", "[2, 4]"], () => b.rmsNorm(x, v3, { eps: 1e-6 })],
      [
        "E_UNSUPPORTED",
        ["op rms_norm on backend table does not support dtype f16 (weight [4]); supported: f32"],
        () => b.rmsNorm(x, half, { eps: 1e-6 }),
      ],
      ["E_ARG", ["op rms_norm on backend table: eps must be >= 0"], () => b.rmsNorm(x, null, { eps: -1 })],
      [
        "E_ARG",
        ["unitOffset must be a boolean"],
        () => b.rmsNorm(x, null, { eps: 1e-6, unitOffset: 1 as unknown as boolean }),
      ],
      ["E_STATE", ["freed"], () => b.rmsNorm(x, freed, { eps: 1e-6 })],
      ["E_STATE", ["belongs to backend table, not this table backend"], () => b.add(x, foreign)],
      ["E_SHAPE", ["op add on backend table", "[2, 4]", "[3]"], () => b.add(x, v3)],
      ["E_SHAPE", ["dim 2 is out of range for rank 2"], () => b.softmax(x, { dim: 2 })],
      ["E_ARG", ["stride must be an integer"], () => b.conv2d(img, kernel2, null, { stride: 0 })],
      [
        "E_ARG",
        ["sections [1, 2] sum to 3 pairs; ropeDims/2 is 4"],
        () => b.rope(x8, pos2x2, { mode: "neox", theta: 1e4, sections: [1, 2] }),
      ],
      [
        "E_UNSUPPORTED",
        ["dtype f32 (positions [2]); supported: i32"],
        () => b.rope(x8, posF32, { mode: "neox", theta: 1e4 }),
      ],
      ["E_ARG", ["window needs causal"], () => b.attention(q, q, q, { window: 2 })],
      ["E_SHAPE", ["3 query heads are not a multiple of 2 kv heads"], () => b.attention(q3, kv2, kv2)],
      ["E_ARG", ["k must be an integer in [0, 4]"], () => b.topK(x, 5)],
      ["E_SHAPE", ["x [2, 4] does not end in K = 3 of weight w f32 [2, 3]"], () => b.matmul(x, w23)],
      [
        "E_ARG",
        ["the weight must be a Weight of @tp/tensor", "got an object of class Object"],
        () => b.matmul(x, {} as Weight),
      ],
      [
        "E_UNSUPPORTED",
        ["op copy on backend table: x [32] holds 128 bytes; the kernel takes at most 64"],
        () => b.copy(long),
      ],
    ];
    const at = b.memory.current;
    for (const [code, parts, fn] of cases) {
      const e = thrown(fn);
      expect([e.code, e.message]).toEqual([code, expect.stringContaining(parts[0] as string)]);
      for (const p of parts) expect(e.message).toContain(p);
      expect(b.memory.current).toBe(at);
    }
    expect(seen).toEqual([]);
  });

  test("a kernel that throws: its output is freed and the error passes through", () => {
    const { b, seen, f32 } = backend();
    const x = f32([2, 8]);
    const at = b.memory.current;
    expect(() => b.silu(x)).toThrow("kernel failed");
    expect(seen.map((s) => s.op)).toEqual(["silu"]);
    expect(b.memory.current).toBe(at);
  });

  test("an output over the budget is E_OOM before the kernel runs", () => {
    const { b, seen, f32 } = backend(48);
    const x = f32([2, 4]); // 32 B; the output needs 32 more
    expect(thrown(() => b.rmsNorm(x, null, { eps: 1e-6 })).code).toBe("E_OOM");
    expect(seen).toEqual([]);
    expect(b.memory.current).toBe(32);
  });
});

describe("the kernel gets a new output of the inferred shape and normalised options", () => {
  test("rms_norm: values against a hand computation, unitOffset and a null weight", () => {
    const { b, seen, f32 } = backend();
    const x = f32([2, 2], [3, 4, 1, -1]);
    const w = f32([2], [0.5, 2]);
    const y = b.rmsNorm(x, w, { eps: 0 });
    // row 0: rms = sqrt((9 + 16) / 2) = 3.5355; row 1: rms = 1
    const r0 = Math.sqrt(12.5);
    const want = [(3 / r0) * 0.5, (4 / r0) * 2, 1 * 0.5, -1 * 2];
    const got = Array.from(b.f32(y));
    for (let i = 0; i < 4; i++) expect(got[i]).toBeCloseTo(want[i] as number, 5);
    const u = Array.from(b.f32(b.rmsNorm(x, w, { eps: 0, unitOffset: true })));
    expect(u[1]).toBeCloseTo((4 / r0) * 3, 5);
    expect(seen[0]?.args).toEqual([[2, 2], [2, 2], [2], 0, false]);
    expect(seen[1]?.args).toEqual([[2, 2], [2, 2], [2], 0, true]);
    expect(y.storage).not.toBe(x.storage);
  });

  test("add: the operands arrive broadcast to the output's shape (stride 0 where broadcast)", () => {
    const { b, seen, f32 } = backend();
    const a = f32([2, 3], [1, 2, 3, 4, 5, 6]);
    const c = f32([3], [10, 20, 30]);
    const y = b.add(a, c);
    expect(y.shape).toEqual([2, 3]);
    expect(Array.from(b.f32(y))).toEqual([11, 22, 33, 14, 25, 36]);
    expect(seen[0]?.args).toEqual([
      [2, 3],
      [2, 3],
      [3, 1],
      [2, 3],
      [0, 1],
    ]);
    // [2, 1] + [3] → [2, 3]: both broadcast
    const col = f32([2, 1], [100, 200]);
    expect(Array.from(b.f32(b.add(col, c)))).toEqual([110, 120, 130, 210, 220, 230]);
    expect(seen[1]?.args).toEqual([
      [2, 3],
      [2, 3],
      [1, 0],
      [2, 3],
      [0, 1],
    ]);
  });

  test("softmax dim −1 → rank − 1; conv2d numbers → pairs and output size; rope defaults", () => {
    const { b, seen, f32 } = backend();
    b.softmax(f32([2, 3, 5]));
    b.softmax(f32([2, 3, 5]), { dim: -2 });
    // H' = ⌊(7 + 2·1 − 3) / 2⌋ + 1 = 4; W' = ⌊(5 + 2·1 − 3) / 2⌋ + 1 = 3
    b.conv2d(f32([1, 2, 7, 5]), f32([4, 2, 3, 3]), null, { stride: 2, padding: 1 });
    b.rope(f32([1, 3, 2, 8]), b.upload(new Int32Array(3), [3], "i32"), { mode: "interleaved", theta: 500 });
    expect(seen.map((s) => s.args)).toEqual([
      [[2, 3, 5], 2],
      [[2, 3, 5], 1],
      [
        [1, 4, 4, 3],
        [2, 2],
        [1, 1],
      ],
      [[1, 3, 2, 8], "i32", "interleaved", 500, 8, 1, []],
    ]);
  });

  test("attention: defaults filled in; an empty output skips the kernel", () => {
    const { b, seen, f32 } = backend();
    const y = b.attention(f32([1, 4, 2, 8]), f32([1, 2, 5, 8]), f32([1, 2, 5, 6]), { causal: true });
    expect(y.shape).toEqual([1, 4, 2, 6]);
    expect(seen[0]?.args[1]).toEqual({
      batch: 1,
      heads: 4,
      kvHeads: 2,
      sq: 2,
      skv: 5,
      headDim: 8,
      headDimV: 6,
      scale: 1 / Math.sqrt(8),
      causal: true,
      qOffset: 3,
      window: 0,
      fullPrefix: 0,
      softcap: 0,
    });
    expect(b.attention(f32([1, 4, 0, 8]), f32([1, 2, 5, 8]), f32([1, 2, 5, 6])).shape).toEqual([1, 4, 0, 6]);
    expect(seen.length).toBe(1);
  });

  test("top_k: two outputs, values of x's dtype and i32 indices; matmul [..., K] → [..., N]", () => {
    const { b, seen, f32 } = backend();
    const { values, indices } = b.topK(f32([3, 7]), 2);
    expect([values.shape, values.dtype, indices.shape, indices.dtype]).toEqual([
      [3, 2],
      "f32",
      [3, 2],
      "i32",
    ]);
    const w = new Weight({ name: "w", format: "q8_0", shape: [5, 32], data: new Uint8Array(5 * 34) });
    expect(b.matmul(f32([2, 3, 32]), w).shape).toEqual([2, 3, 5]);
    expect(seen.map((s) => s.args)).toEqual([
      [[3, 2], "f32", [3, 2], "i32", 2],
      [[2, 3, 5], [2, 3, 32], "q8_0", null],
    ]);
  });
});

describe("what a backend supports is its table", () => {
  test("a missing entry is E_UNSUPPORTED naming backend and op; a missing weight format names it", () => {
    const { b, f32 } = backend();
    const x = f32([2, 2]);
    expect(thrown(() => b.gelu(x))).toEqual({
      code: "E_UNSUPPORTED",
      message: "op gelu is not implemented on backend table",
    });
    // the entry is looked up first: garbage arguments to a missing op are still E_UNSUPPORTED
    expect(thrown(() => b.layerNorm(null as unknown as Tensor, null, null, { eps: -1 })).code).toBe(
      "E_UNSUPPORTED",
    );
    const q4 = new Weight({ name: "w", format: "q4_k", shape: [1, 256], data: new Uint8Array(144) });
    const e = thrown(() => b.matmul(f32([1, 256]), q4));
    expect(e.code).toBe("E_UNSUPPORTED");
    expect(e.message).toContain("op matmul on backend table does not support weight format q4_k");
    expect(e.message).toContain("supported: f32, q8_0");
  });

  test("supports() and capabilities() are derived from the entries", () => {
    const { b } = backend();
    expect(b.supports("rms_norm")).toBe(true);
    expect(b.supports("rms_norm", ["f32"])).toBe(true);
    expect(b.supports("rms_norm", ["f16"])).toBe(false);
    expect(b.supports("gelu")).toBe(false);
    expect(b.supports("rope", ["f32", "i32"])).toBe(true); // positions: the op's index dtype
    expect(b.supports("softmax", ["i32"])).toBe(false);
    expect(b.supports("matmul", ["q8_0", "f32"])).toBe(true);
    expect(b.supports("matmul", ["q4_k"])).toBe(false);
    const caps = b.capabilities();
    expect(caps.ops).toEqual([
      "matmul",
      "attention",
      "rms_norm",
      "rope",
      "silu",
      "softmax",
      "add",
      "conv2d",
      "copy",
      "top_k",
    ]);
    expect(caps.weightFormats).toEqual(["f32", "q8_0"]);
    expect([...caps.dtypes].sort()).toEqual(["f32", "i32"]);
  });
});
