// Type tables against the values in ../shared/spec/llm.md §1.1 and §2 (hand-copied expectations) and
// the safetensors dtype strings of huggingface/safetensors.
import { describe, expect, test } from "bun:test";
import {
  type DTYPES,
  dtypeFromSafetensors,
  dtypeInfo,
  rowBytes,
  WEIGHT_FORMATS,
  weightBytes,
  weightFormatFromGgml,
} from "./dtype.ts";
import { isTpError } from "./errors.ts";

describe("dtypes", () => {
  test("element sizes and safetensors names", () => {
    const want: Record<string, [number, string]> = {
      f32: [4, "F32"],
      f16: [2, "F16"],
      bf16: [2, "BF16"],
      f8_e4m3fn: [1, "F8_E4M3"],
      f8_e5m2: [1, "F8_E5M2"],
      i8: [1, "I8"],
      u8: [1, "U8"],
      i16: [2, "I16"],
      u16: [2, "U16"],
      i32: [4, "I32"],
      u32: [4, "U32"],
      i64: [8, "I64"],
      bool: [1, "BOOL"],
    };
    for (const [name, [bytes, st]] of Object.entries(want)) {
      expect(dtypeInfo(name).bytes).toBe(bytes);
      expect(dtypeInfo(name).safetensors).toBe(st);
      expect(dtypeFromSafetensors(st)).toBe(name as keyof typeof DTYPES);
    }
    expect(dtypeFromSafetensors("F4")).toBeNull();
    expect(() => dtypeInfo("f24")).toThrow(/unknown dtype 'f24'; expected one of: f64, f32/);
  });

  test("ggml ids, block sizes and block bytes (llm.md §1.1, §2)", () => {
    // [ggml id, format, elements per block, bytes per block]
    const table: [number, string, number, number][] = [
      [0, "f32", 1, 4],
      [1, "f16", 1, 2],
      [2, "q4_0", 32, 18],
      [3, "q4_1", 32, 20],
      [6, "q5_0", 32, 22],
      [7, "q5_1", 32, 24],
      [8, "q8_0", 32, 34],
      [10, "q2_k", 256, 84],
      [11, "q3_k", 256, 110],
      [12, "q4_k", 256, 144],
      [13, "q5_k", 256, 176],
      [14, "q6_k", 256, 210],
      [15, "q8_k", 256, 292],
      [16, "iq2_xxs", 256, 66],
      [20, "iq4_nl", 32, 18],
      [23, "iq4_xs", 256, 136],
      [24, "i8", 1, 1],
      [28, "f64", 1, 8],
      [30, "bf16", 1, 2],
      [35, "tq2_0", 256, 66],
      [39, "mxfp4", 32, 17],
    ];
    for (const [id, name, elems, bytes] of table) {
      const f = weightFormatFromGgml(id);
      expect(f).toBe(name as typeof f);
      expect(WEIGHT_FORMATS[f].blockElems).toBe(elems);
      expect(WEIGHT_FORMATS[f].blockBytes).toBe(bytes);
    }
    expect(WEIGHT_FORMATS.q4_k.ggufName).toBe("Q4_K");
    for (const bad of [4, 31, 99]) {
      try {
        weightFormatFromGgml(bad, "blk.0.attn_q.weight");
        throw new Error("no error");
      } catch (e) {
        expect(isTpError(e, "E_UNSUPPORTED")).toBe(true);
        expect((e as Error).message).toContain(`ggml type id ${bad}`);
        expect((e as Error).message).toContain("blk.0.attn_q.weight");
      }
    }
  });

  test("weight byte sizes, ConvRot packing, and whole-block checks", () => {
    expect(weightBytes("q4_k", [4096, 4096])).toBe(4096 * 16 * 144);
    expect(weightBytes("q8_0", [3, 64])).toBe(3 * 2 * 34);
    expect(weightBytes("int8_convrot", [6144, 6144])).toBe(6144 * 6144);
    expect(weightBytes("int4_convrot", [64, 6144])).toBe(64 * 3072); // two nibbles a byte (krea2.md §1.8)
    expect(WEIGHT_FORMATS.int4_convrot.rotationGroup).toBe(256);
    expect(weightBytes("f32", [])).toBe(4);
    expect(() => rowBytes("q4_0", 33)).toThrow(/33 elements is not a whole number of q4_0 blocks \(32/);
    expect(() => weightBytes("q4_k", [])).toThrow(/not a whole number/);
  });
});
