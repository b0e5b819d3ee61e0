// quantizeRows / createNativeQuantizer: argument checks (a TpError naming the tensor before any
// pointer crosses bun:ffi), independence from the thread count and the ISA level, and values that
// follow from the definitions alone (all-zero rows, a row whose rotation is known). Bit-exactness
// against @tp/quant's references is tested in packages/conformance/src/quantize-kernels.test.ts.
import { afterAll, describe, expect, test } from "bun:test";
import { f32ToBf16, TpError } from "@tp/tensor";
import { CPU_ISA, type CpuIsa, loadCpuLibrary } from "./ffi.ts";
import { createNativeQuantizer, NATIVE_QUANTIZE_FORMATS, quantizeRows } from "./quantize.ts";

const lib = loadCpuLibrary();
const ctx = lib.createContext(3);
const BEST = ctx.isa;
const ISAS = (Object.keys(CPU_ISA) as CpuIsa[]).filter((i) => CPU_ISA[i] <= CPU_ISA[BEST]);
afterAll(() => ctx.destroy());

function bf16(n: number, seed: number): Uint8Array {
  const out = new Uint16Array(n);
  let s = seed;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    out[i] = f32ToBf16((s / 4294967296 - 0.5) * 0.2);
  }
  return new Uint8Array(out.buffer);
}

function code(f: () => unknown): string {
  try {
    f();
  } catch (e) {
    if (e instanceof TpError) return `${e.code}${e.tensor ? ` (${e.tensor})` : ""}`;
    throw e;
  }
  return "no error";
}

describe("quantizeRows argument checks", () => {
  const b = { bytes: bf16(4 * 256, 1), dtype: "bf16" as const };
  const name = "blocks.0.attn.wq.weight";
  test("format, group, shape, input size: each a TpError naming the tensor", () => {
    expect(code(() => quantizeRows(ctx, "q5_k" as "q4_k", b, [4, 256], { name }))).toBe(
      `E_UNSUPPORTED (${name})`,
    );
    expect(code(() => quantizeRows(ctx, "int8_convrot", b, [4, 256], { name, groupSize: 32 }))).toBe(
      `E_ARG (${name})`,
    );
    expect(code(() => quantizeRows(ctx, "int8_convrot", b, [8, 128], { name }))).toBe(`E_SHAPE (${name})`);
    const odd = { bytes: bf16(4 * 48, 2), dtype: "bf16" as const };
    expect(code(() => quantizeRows(ctx, "int4_convrot", odd, [4, 48], { name, groupSize: 16 }))).toBe(
      "no error",
    );
    expect(
      code(() => quantizeRows(ctx, "q4_k", { bytes: bf16(4 * 96, 2), dtype: "bf16" }, [4, 96], { name })),
    ).toBe(`E_SHAPE (${name})`);
    expect(code(() => quantizeRows(ctx, "q8_0", b, [4, 255], { name }))).toBe(`E_SHAPE (${name})`);
    expect(code(() => quantizeRows(ctx, "q8_0", b, [5, 256], { name }))).toBe(`E_SHAPE (${name})`);
    expect(code(() => quantizeRows(ctx, "q8_0", { bytes: b.bytes, dtype: "f8" as "f16" }, [4, 256]))).toBe(
      "E_ARG",
    );
    expect(code(() => quantizeRows(ctx, "q8_0", b, [-1, 256]))).toBe("E_SHAPE");
    expect(code(() => quantizeRows(ctx, "q8_0", b, [4, 256.5]))).toBe("E_SHAPE");
  });

  test("fp8: NaN in the tensor is E_ARG naming it (the reference cannot invert a NaN scale)", () => {
    const f = new Float32Array(64).fill(0.5);
    f[17] = Number.NaN;
    expect(code(() => quantizeRows(ctx, "fp8_scaled", f, [1, 64], { name }))).toBe(`E_ARG (${name})`);
  });

  test("null options are the defaults; a group past int32 (2^32 looks like a power of 4 to 32-bit bit tests) is E_ARG", () => {
    const q = quantizeRows(ctx, "int8_convrot", b, [4, 256], null);
    expect(q.groupSize).toBe(256);
    expect(Buffer.from(q.data).equals(Buffer.from(quantizeRows(ctx, "int8_convrot", b, [4, 256]).data))).toBe(
      true,
    );
    const empty = { bytes: new Uint8Array(0), dtype: "bf16" as const };
    for (const groupSize of [2 ** 32, 2 ** 34]) {
      expect(code(() => quantizeRows(ctx, "int8_convrot", empty, [0, groupSize], { name, groupSize }))).toBe(
        `E_ARG (${name})`,
      );
    }
  });

  test("a destroyed context is E_STATE", () => {
    const c = lib.createContext(1);
    c.destroy();
    expect(code(() => quantizeRows(c, "q8_0", b, [4, 256]))).toBe("E_STATE");
  });

  test("empty tensors", () => {
    const empty = { bytes: new Uint8Array(0), dtype: "bf16" as const };
    expect(quantizeRows(ctx, "int8_convrot", empty, [0, 256]).scale.length).toBe(0);
    expect(Array.from(quantizeRows(ctx, "fp8_scaled", empty, [0, 256]).scale)).toEqual([1]);
    expect(quantizeRows(ctx, "q4_k", empty, [0, 256]).data.length).toBe(0);
  });
});

describe("quantizeRows values", () => {
  test("the same bytes on 1 and 3 threads and at every ISA level, for every format", () => {
    const input = { bytes: bf16(37 * 512, 3), dtype: "bf16" as const };
    for (const format of NATIVE_QUANTIZE_FORMATS) {
      const scalar = lib.createContext(1, "scalar");
      const base = quantizeRows(scalar, format, input, [37, 512]);
      scalar.destroy();
      for (const isa of ISAS) {
        for (const threads of [1, 3]) {
          const c = lib.createContext(threads, isa);
          const q = quantizeRows(c, format, input, [37, 512]);
          c.destroy();
          expect(`${format} ${isa} × ${threads}: ${Buffer.from(q.data).equals(Buffer.from(base.data))}`).toBe(
            `${format} ${isa} × ${threads}: true`,
          );
          expect(Array.from(q.scale)).toEqual(Array.from(base.scale));
        }
      }
    }
  });

  test("all-zero rows: int8 scale f32(1e-30), int4 f32(1e-10)/7, zero codes; GGUF all-zero blocks", () => {
    const z = { bytes: new Uint8Array(2 * 2 * 256), dtype: "bf16" as const };
    const q8 = quantizeRows(ctx, "int8_convrot", z, [2, 256]);
    expect(Array.from(q8.scale)).toEqual([Math.fround(1e-30), Math.fround(1e-30)]);
    expect(q8.data.every((v) => v === 0)).toBe(true);
    const q4 = quantizeRows(ctx, "int4_convrot", z, [2, 256]);
    expect(q4.scale[0]).toBe(Math.fround(Math.fround(1e-10) / 7));
    for (const f of ["q8_0", "q4_k", "q6_k"] as const) {
      expect(quantizeRows(ctx, f, z, [2, 256]).data.every((v) => v === 0)).toBe(true);
    }
  });

  test("int8 ConvRot of a row whose rotation is one spike: codes ±127 at the spike's Hadamard signs", () => {
    // w = 16 · e_0 · H (H symmetric, entries ±1/16): w_i = ±1, so w · H = 16 · e_0 exactly: scale
    // 16/127, code 127 at column 0 and 0 elsewhere.
    const w = new Float32Array(256);
    for (let i = 0; i < 256; i++) {
      let sign = 1;
      for (let a = 0, b = i; a < 4; a++, b >>= 2) if ((b & 3) === 3) sign = -sign; // H[0][i] sign: digit pairs (0, 3)
      w[i] = sign;
    }
    const q = quantizeRows(ctx, "int8_convrot", w, [1, 256]);
    expect(q.scale[0]).toBe(Math.fround(16 / 127));
    expect(new Int8Array(q.data.buffer)[0]).toBe(127);
    expect(q.data.subarray(1).every((v) => v === 0)).toBe(true);
  });

  test("createNativeQuantizer: the @tp/quant WeightQuantizer shape, disposable", () => {
    const nq = createNativeQuantizer({ threads: 2 });
    expect(nq.name).toContain("native cpu");
    const input = { bytes: bf16(4 * 256, 9), dtype: "bf16" as const };
    const a = nq.convRot(input, [4, 256], { format: "int4_convrot", groupSize: 256 });
    const b = quantizeRows(ctx, "int4_convrot", input, [4, 256]);
    expect(Buffer.from(a.data).equals(Buffer.from(b.data))).toBe(true);
    expect(nq.fp8Scaled(input, 1024).scale).toBe(
      quantizeRows(ctx, "fp8_scaled", input, [1, 1024]).scale[0] as number,
    );
    expect(code(() => nq.fp8Scaled(input, 1024, { dtype: "f8_e5m2", name: "x" }))).toBe("E_UNSUPPORTED (x)");
    expect(nq.fp8Scaled(input, 1024, null as never).scale).toBe(nq.fp8Scaled(input, 1024).scale);
    nq.dispose();
    expect(code(() => nq.convRot(input, [4, 256], {}))).toBe("E_STATE");
  });
});
