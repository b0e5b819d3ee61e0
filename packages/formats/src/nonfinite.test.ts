// The weight scan that explains an E_NUMERIC stage failure: the first tensor holding NaN / ±∞, by the
// bits of each type (hand-made values: f32, f64, f16, bf16, fp8 E4M3 / E5M2 codes and GGUF block
// scales), in file order; finite extremes, integers and unlisted block types never count.
import { afterAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { ggufKv, serializeGguf } from "./gguf/write.ts";
import { openCheckpoint } from "./layouts/detect.ts";
import { explainNonFiniteWeights, findNonFiniteWeight } from "./nonfinite.ts";
import { serializeSafetensors } from "./safetensors/write.ts";
import { tempDir } from "./testing/util.ts";

const tmp = tempDir("nonfinite");
afterAll(tmp.cleanup);

const u16 = (...v: number[]) => new Uint8Array(Uint16Array.from(v).buffer);
const f32 = (...v: number[]) => new Uint8Array(Float32Array.from(v).buffer);

function scanSafetensors(tensors: { name: string; dtype: string; shape: number[]; data: Uint8Array }[]) {
  const path = join(tmp.dir, `s${Math.random().toString(36).slice(2)}.safetensors`);
  writeFileSync(path, serializeSafetensors(tensors as never));
  const src = openCheckpoint(path);
  try {
    return { path, found: findNonFiniteWeight(src) };
  } finally {
    src.close();
  }
}

describe("findNonFiniteWeight", () => {
  test("finite extremes of every float type are not flagged", () => {
    const { found } = scanSafetensors([
      { name: "a", dtype: "F32", shape: [3], data: f32(3.4028234663852886e38, -1e-45, -0) },
      { name: "b", dtype: "F16", shape: [3], data: u16(0x7bff, 0x8001, 0xfbff) }, // 65504, −subnormal, −65504
      { name: "c", dtype: "BF16", shape: [2], data: u16(0x7f7f, 0xff7f) }, // ±3.39e38
      { name: "d", dtype: "F8_E4M3", shape: [4], data: new Uint8Array([0x7e, 0xfe, 0x78, 0x00]) }, // ±448
      { name: "e", dtype: "F8_E5M2", shape: [2], data: new Uint8Array([0x7b, 0xfb]) }, // ±57344
      {
        name: "f",
        dtype: "F64",
        shape: [1],
        data: new Uint8Array(Float64Array.of(1.7976931348623157e308).buffer),
      },
      { name: "g", dtype: "I8", shape: [2], data: new Uint8Array([0x7f, 0xff]) },
    ]);
    expect(found).toBeNull();
  });
  test("each type's NaN / ∞ code, the first tensor in file order and its element", () => {
    const cases: [string, Uint8Array, number, number][] = [
      ["F32", f32(1, 2, Number.NEGATIVE_INFINITY), 2, Number.NEGATIVE_INFINITY],
      ["F16", u16(0x3c00, 0x7c00), 1, Number.POSITIVE_INFINITY],
      ["F16", u16(0x7c01), 0, Number.NaN],
      ["BF16", u16(0, 0, 0, 0xffc1), 3, Number.NaN],
      ["F8_E4M3", new Uint8Array([1, 2, 0xff]), 2, Number.NaN],
      ["F8_E5M2", new Uint8Array([0x7c]), 0, Number.POSITIVE_INFINITY],
      ["F8_E5M2", new Uint8Array([0, 0xfd]), 1, Number.NaN],
      ["F64", new Uint8Array(Float64Array.of(0, Number.NaN).buffer), 1, Number.NaN],
    ];
    for (const [dtype, data, index, value] of cases) {
      const size = dtype === "F64" ? 8 : dtype.startsWith("F8") ? 1 : dtype === "F32" ? 4 : 2;
      const { path, found } = scanSafetensors([
        { name: "ok", dtype: "F32", shape: [1], data: f32(1) },
        { name: "bad", dtype, shape: [data.length / size], data },
        { name: "later", dtype: "F32", shape: [1], data: f32(2) },
      ]);
      expect(found).toEqual({ file: path, tensor: "bad", index, value });
    }
  });
  test("of two damaged tensors, the one stored first", () => {
    const { path, found } = scanSafetensors([
      { name: "x", dtype: "F32", shape: [2], data: f32(0, Number.NaN) },
      { name: "y", dtype: "BF16", shape: [1], data: u16(0x7f80) },
    ]);
    const src = openCheckpoint(path);
    const first = [...src.tensors].sort((a, b) => a.byteOffset - b.byteOffset)[0]?.name;
    src.close();
    expect(found?.tensor).toBe(first as string);
    expect(found?.index).toBe(first === "x" ? 1 : 0);
  });
  test("GGUF blocks: the f16 scale of Q8_0 block 2 and the dmin of Q4_K block 0", () => {
    const q8 = new Uint8Array(34 * 3);
    new DataView(q8.buffer).setUint16(68, 0x7e00, true); // block 2's d: NaN
    const q4k = new Uint8Array(144);
    new DataView(q4k.buffer).setUint16(2, 0xfc00, true); // dmin: −∞
    for (const [type, data, elems, index, value] of [
      ["q8_0", q8, 96, 64, Number.NaN],
      ["q4_k", q4k, 256, 0, Number.NEGATIVE_INFINITY],
    ] as const) {
      const path = join(tmp.dir, `${type}.gguf`);
      writeFileSync(
        path,
        serializeGguf(
          [ggufKv("general.architecture", "str", "llama")],
          [{ name: "blk.0.ffn_up.weight", type, shape: [1, elems], data }],
        ),
      );
      const src = openCheckpoint(path);
      try {
        expect(findNonFiniteWeight(src)).toEqual({ file: path, tensor: "blk.0.ffn_up.weight", index, value });
      } finally {
        src.close();
      }
      expect(explainNonFiniteWeights([{ what: "model", path }], false)).toBe(
        `the model file holds ${value} in tensor blk.0.ffn_up.weight (element ${index}): the checkpoint is damaged`,
      );
    }
  });
  test("explainNonFiniteWeights: the first listed file with one; unreadable and clean files are passed over", () => {
    const { path: clean } = scanSafetensors([{ name: "w", dtype: "F32", shape: [1], data: f32(1) }]);
    const { path: bad } = scanSafetensors([{ name: "w", dtype: "F32", shape: [1], data: f32(Number.NaN) }]);
    expect(
      explainNonFiniteWeights([
        { what: "text encoder", path: undefined },
        { what: "DiT", path: join(tmp.dir, "absent.safetensors") },
        { what: "VAE", path: clean },
        { what: "other", path: bad },
      ]),
    ).toBe(`the other file ${bad} holds NaN in tensor w (element 0): the checkpoint is damaged`);
    expect(explainNonFiniteWeights([{ what: "VAE", path: clean }])).toBeUndefined();
  });
});
