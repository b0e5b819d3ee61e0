// Per-tensor format detection (krea2.md §1.4) on hand-made tensor tables: each rule, the order of
// preference, mixed files, and every error naming its tensor; then the same rules on opened files
// (detectTensorFormat, detectSourceFormats, loadWeight with the marker's rotation group). No
// tolerances: exact answers.
import { afterAll, describe, expect, test } from "bun:test";
import { join } from "node:path";
import type { TpError } from "@tp/tensor";
import { openSafetensors } from "../safetensors/file.ts";
import { type SafetensorsTensorInput, writeSafetensors } from "../safetensors/write.ts";
import { tempDir, thrown } from "../testing/util.ts";
import {
  detectSourceFormats,
  detectTensorFormat,
  detectTensorFormats,
  loadWeight,
  type TensorInfo,
} from "./tensor-format.ts";

const marker = (payload: unknown): TensorInfo => {
  const data = new TextEncoder().encode(JSON.stringify(payload));
  return { dtype: "U8", shape: [data.length], data };
};
const t = (dtype: string, ...shape: number[]): TensorInfo => ({ dtype, shape });

describe("rules", () => {
  test("comfy_quant markers: int8 ConvRot, int4 (convrot_w4a4 and int4_tensorwise alias), fp8; the rest dense", () => {
    const { tensors, auxiliary } = detectTensorFormats({
      tensors: {
        "m.a.weight": t("I8", 512, 768),
        "m.a.weight_scale": t("F32", 512, 1),
        "m.a.comfy_quant": marker({
          format: "int8_tensorwise",
          convrot: true,
          convrot_groupsize: 256,
          per_row: true,
        }),
        "m.b.weight": t("I8", 64, 128),
        "m.b.weight_scale": t("F32", 64),
        "m.b.comfy_quant": marker({ format: "convrot_w4a4", convrot_groupsize: 64, group_size: 64 }),
        "m.c.weight": t("U8", 64, 128),
        "m.c.weight_scale": t("F32", 64, 1),
        "m.c.comfy_quant": marker({ format: "int4_tensorwise" }),
        "m.d.weight": t("F8_E4M3", 32, 32),
        "m.d.weight_scale": t("F32"),
        "m.d.comfy_quant": marker({ format: "float8_e4m3fn" }),
        "m.d.bias": t("BF16", 32),
        "m.norm.scale": t("F32", 32),
      },
    });
    const f = (n: string) => tensors.get(n);
    expect(f("m.a.weight")).toMatchObject({
      format: "int8_convrot",
      shape: [512, 768],
      groupSize: 256,
      source: "comfy_quant",
    });
    expect(f("m.a.weight")?.marker).toEqual({
      format: "int8_tensorwise",
      convrot: true,
      convrot_groupsize: 256,
      per_row: true,
    });
    expect(f("m.b.weight")).toMatchObject({
      format: "int4_convrot",
      shape: [64, 256],
      groupSize: 64,
      storedDtype: "I8",
    });
    expect(f("m.c.weight")).toMatchObject({
      format: "int4_convrot",
      shape: [64, 256],
      groupSize: 256,
      storedDtype: "U8",
    });
    expect(f("m.d.weight")).toMatchObject({
      format: "f8_e4m3fn",
      scale: { tensor: "m.d.weight_scale", kind: "tensor" },
    });
    expect(f("m.d.bias")?.format).toBe("bf16");
    expect(f("m.norm.scale")?.format).toBe("f32");
    expect([...tensors.keys()].sort()).toEqual([
      "m.a.weight",
      "m.b.weight",
      "m.c.weight",
      "m.d.bias",
      "m.d.weight",
      "m.norm.scale",
    ]);
    expect(auxiliary.get("m.a.weight_scale")).toBe("m.a.weight");
    expect(auxiliary.get("m.b.comfy_quant")).toBe("m.b.weight");
  });

  test("__metadata__._quantization_metadata (full layer names) when there is no marker tensor", () => {
    const { tensors } = detectTensorFormats({
      tensors: { "model.x.weight": t("I8", 16, 256), "model.x.weight_scale": t("F32", 16, 1) },
      metadata: {
        _quantization_metadata: JSON.stringify({
          format_version: "1.0",
          layers: { "model.x": { format: "int8_tensorwise", convrot: true, convrot_groupsize: 16 } },
        }),
      },
    });
    expect(tensors.get("model.x.weight")).toMatchObject({
      format: "int8_convrot",
      groupSize: 16,
      source: "metadata",
    });
  });

  test("a marker tensor wins over the metadata", () => {
    const { tensors } = detectTensorFormats({
      tensors: {
        "x.weight": t("I8", 16, 128),
        "x.weight_scale": t("F32", 16),
        "x.comfy_quant": marker({ format: "convrot_w4a4", convrot_groupsize: 256 }),
      },
      metadata: {
        _quantization_metadata: JSON.stringify({
          layers: { x: { format: "int8_tensorwise", convrot: true } },
        }),
      },
    });
    expect(tensors.get("x.weight")).toMatchObject({
      format: "int4_convrot",
      source: "comfy_quant",
      shape: [16, 256],
    });
  });

  test("legacy scaled_fp8: root flag + <layer>.scale_weight", () => {
    const { tensors, auxiliary } = detectTensorFormats({
      tensors: {
        scaled_fp8: t("F8_E4M3", 0),
        "l.weight": t("F8_E4M3", 8, 8),
        "l.scale_weight": t("F32", 1),
        "l.scale_input": t("F32", 1),
        "raw.weight": t("F8_E4M3", 8, 8),
      },
    });
    expect(tensors.get("l.weight")).toMatchObject({
      format: "f8_e4m3fn",
      source: "scaled_fp8",
      scale: { tensor: "l.scale_weight", kind: "tensor" },
    });
    expect(tensors.get("raw.weight")?.scale).toBeUndefined();
    expect(auxiliary.has("scaled_fp8")).toBe(true);
    expect(auxiliary.has("l.scale_weight")).toBe(true);
    expect(tensors.get("l.scale_input")?.format).toBe("f32"); // an input scale is data we do not use
  });

  test("inference without markers: fp8 × weight_scale, I8 → int8, U8 → int4, I8 [N,K/2] → int4 when the shape says so", () => {
    const { tensors } = detectTensorFormats({
      tensors: {
        "f.weight": t("F8_E4M3", 8, 8),
        "f.weight_scale": t("F32"),
        "e.weight": t("F8_E5M2", 8, 8),
        "i8.weight": t("I8", 4, 256),
        "i8.weight_scale": t("F32", 4, 1),
        "u8.weight": t("U8", 4, 128),
        "u8.weight_scale": t("F32", 4),
        "i4.weight": t("I8", 4, 128),
        "i4.weight_scale": t("F32", 4),
        "bare.weight": t("I8", 4, 4),
        "ids.buffer": t("I64", 10),
      },
      expectedShapes: { "i4.weight": [4, 256], "i8.weight": [4, 256] },
    });
    expect(tensors.get("f.weight")).toMatchObject({
      format: "f8_e4m3fn",
      scale: { tensor: "f.weight_scale" },
      source: "inferred",
    });
    expect(tensors.get("e.weight")).toMatchObject({ format: "f8_e5m2" });
    expect(tensors.get("i8.weight")).toMatchObject({
      format: "int8_convrot",
      shape: [4, 256],
      groupSize: 256,
    });
    expect(tensors.get("u8.weight")).toMatchObject({ format: "int4_convrot", shape: [4, 256] });
    expect(tensors.get("i4.weight")).toMatchObject({ format: "int4_convrot", shape: [4, 256] });
    expect(tensors.get("bare.weight")?.format).toBe("i8"); // no scale: not ConvRot
    expect(tensors.get("ids.buffer")?.format).toBe("i64");
  });
});

describe("errors name the tensor", () => {
  const expectError = (
    input: Parameters<typeof detectTensorFormats>[0],
    code: string,
    tensor: string,
    text: string,
  ) => {
    const e = thrown(() => detectTensorFormats(input)) as TpError;
    expect(e.name).toBe("TpError");
    expect(e.code).toBe(code as TpError["code"]);
    expect(e.tensor).toBe(tensor);
    expect(e.message).toContain(text);
  };

  test("unknown marker format is E_UNSUPPORTED and lists the known ones", () => {
    expectError(
      { tensors: { "a.weight": t("U8", 4, 4), "a.comfy_quant": marker({ format: "nvfp4" }) } },
      "E_UNSUPPORTED",
      "a.weight",
      "unknown comfy_quant format 'nvfp4'; expected one of: float8_e4m3fn",
    );
  });

  test("convrot: false (plain per-row int8 / int4, qwen-image.md §10.2) is E_UNSUPPORTED naming the tensor", () => {
    for (const payload of [
      { format: "int8_tensorwise" },
      { format: "int8_tensorwise", convrot: false },
      { format: "convrot_w4a4", convrot: false },
      { format: "int4_tensorwise", convrot: false },
    ]) {
      expectError(
        {
          tensors: {
            "a.weight": t("I8", 4, 256),
            "a.weight_scale": t("F32", 4),
            "a.comfy_quant": marker(payload),
          },
        },
        "E_UNSUPPORTED",
        "a.weight",
        "without convrot: true is plain",
      );
    }
    // The same entry in __metadata__._quantization_metadata.
    expectError(
      {
        tensors: { "m.a.weight": t("I8", 4, 256), "m.a.weight_scale": t("F32", 4, 1) },
        metadata: {
          _quantization_metadata: JSON.stringify({
            layers: { "m.a": { format: "int8_tensorwise", convrot: false } },
          }),
        },
      },
      "E_UNSUPPORTED",
      "m.a.weight",
      "qwen-image.md §10.2",
    );
  });

  test("a marker that is not JSON, or has no format, is E_FORMAT", () => {
    const bad = { dtype: "U8", shape: [3], data: new Uint8Array([123, 34, 0]) };
    expectError(
      { tensors: { "a.weight": t("I8", 4, 4), "a.comfy_quant": bad } },
      "E_FORMAT",
      "a.comfy_quant",
      "not UTF-8 JSON",
    );
    expectError(
      { tensors: { "a.weight": t("I8", 4, 4), "a.comfy_quant": marker({ convrot: true }) } },
      "E_FORMAT",
      "a.comfy_quant",
      "format",
    );
  });

  test("scale shape mismatch (rows, and non-scalar fp8 scale) is E_FORMAT", () => {
    expectError(
      {
        tensors: {
          "a.weight": t("I8", 4, 256),
          "a.weight_scale": t("F32", 5, 1),
          "a.comfy_quant": marker({ format: "int8_tensorwise", convrot: true }),
        },
      },
      "E_FORMAT",
      "a.weight",
      "scale shape mismatch",
    );
    expectError(
      { tensors: { "a.weight": t("F8_E4M3", 4, 4), "a.weight_scale": t("F32", 4) } },
      "E_FORMAT",
      "a.weight",
      "scale shape mismatch",
    );
  });

  test("missing row scale, wrong dtype for the marker: E_FORMAT", () => {
    expectError(
      { tensors: { "a.weight": t("I8", 4, 256), "a.comfy_quant": marker({ format: "convrot_w4a4" }) } },
      "E_FORMAT",
      "a.weight",
      "has no 'a.weight_scale'",
    );
    expectError(
      {
        tensors: {
          "a.weight": t("BF16", 4, 256),
          "a.weight_scale": t("F32", 4),
          "a.comfy_quant": marker({ format: "int8_tensorwise", convrot: true }),
        },
      },
      "E_FORMAT",
      "a.weight",
      "must be I8",
    );
  });

  test("K not a multiple of the group size is E_SHAPE; a group size that is not a power of 4 is E_FORMAT", () => {
    expectError(
      {
        tensors: {
          "a.weight": t("I8", 4, 80),
          "a.weight_scale": t("F32", 4, 1),
          "a.comfy_quant": marker({ format: "int8_tensorwise", convrot: true, convrot_groupsize: 64 }),
        },
      },
      "E_SHAPE",
      "a.weight",
      "K = 80",
    );
    expectError(
      {
        tensors: {
          "a.weight": t("I8", 4, 256),
          "a.weight_scale": t("F32", 4, 1),
          "a.comfy_quant": marker({ format: "int8_tensorwise", convrot: true, convrot_groupsize: 128 }),
        },
      },
      "E_FORMAT",
      "a.weight",
      "not a power of 4",
    );
  });

  test("a marker or metadata entry without its weight is E_FORMAT", () => {
    expectError(
      { tensors: { "a.comfy_quant": marker({ format: "float8_e4m3fn" }) } },
      "E_FORMAT",
      "a",
      "no 'a.weight'",
    );
    expectError(
      {
        tensors: {},
        metadata: { _quantization_metadata: JSON.stringify({ layers: { b: { format: "float8_e4m3fn" } } }) },
      },
      "E_FORMAT",
      "b",
      "no 'b.weight'",
    );
  });

  test("stored shape that fits neither int8 nor int4 of the expected shape is E_SHAPE", () => {
    expectError(
      {
        tensors: { "a.weight": t("I8", 4, 100), "a.weight_scale": t("F32", 4) },
        expectedShapes: { "a.weight": [4, 256] },
      },
      "E_SHAPE",
      "a.weight",
      "expected logical shape",
    );
  });

  test("the file, when given, is named too", () => {
    const e = thrown(() =>
      detectTensorFormats({
        tensors: { "a.weight": t("U8", 4, 4), "a.comfy_quant": marker({ format: "mxfp8" }) },
        file: "/m/x.safetensors",
      }),
    ) as TpError;
    expect(e.file).toBe("/m/x.safetensors");
    expect(e.message).toContain("file /m/x.safetensors");
  });
});

describe("on an opened checkpoint", () => {
  const tmp = tempDir("tensor-format");
  afterAll(tmp.cleanup);
  const T = (name: string, dtype: string, shape: number[], fill = 1): SafetensorsTensorInput => {
    const bytes = dtype === "F32" ? 4 : dtype === "BF16" ? 2 : 1;
    const n = shape.reduce((a, b) => a * b, 1) * bytes;
    return { name, dtype, shape, data: new Uint8Array(n).fill(fill) };
  };
  const M = (name: string, payload: unknown): SafetensorsTensorInput => {
    const data = new TextEncoder().encode(JSON.stringify(payload));
    return { name, dtype: "U8", shape: [data.length], data };
  };
  const path = join(tmp.dir, "mixed.safetensors");
  writeSafetensors(path, [
    T("g64.weight", "I8", [8, 128]),
    T("g64.weight_scale", "F32", [8, 1], 0),
    M("g64.comfy_quant", { format: "int8_tensorwise", convrot: true, convrot_groupsize: 64 }),
    T("i4.weight", "I8", [8, 128]),
    T("i4.weight_scale", "F32", [8], 0),
    T("f8.weight", "F8_E4M3", [4, 16]),
    T("f8.weight_scale", "F32", [], 0),
    M("f8.comfy_quant", { format: "float8_e4m3fn" }),
    T("plain.weight", "I8", [8, 256]),
    T("plain.weight_scale", "F32", [8], 0),
    M("plain.comfy_quant", { format: "int8_tensorwise", convrot: false }),
    T("norm.weight", "BF16", [16]),
  ]);

  test("detectTensorFormat and loadWeight: the marker's convrot_groupsize becomes Weight.rotationGroup", () => {
    const src = openSafetensors(path);
    expect(detectTensorFormat(src, "g64.weight")).toMatchObject({
      format: "int8_convrot",
      groupSize: 64,
      source: "comfy_quant",
    });
    const w = loadWeight(src, "g64.weight");
    expect([w.format, w.shape, w.rotationGroup, w.scale?.kind]).toEqual([
      "int8_convrot",
      [8, 128],
      64,
      "row",
    ]);
    // Unmarked I8 [8, 128] with a scale: int8 by default (here K = 128 does not fit group 256: E_SHAPE),
    // int4 [8, 256] when the caller knows K.
    expect((thrown(() => detectTensorFormat(src, "i4.weight")) as TpError).code).toBe("E_SHAPE");
    const w4 = loadWeight(src, "i4.weight", 256);
    expect([w4.format, w4.shape, w4.rotationGroup]).toEqual(["int4_convrot", [8, 256], 256]);
    const f8 = loadWeight(src, "f8.weight");
    expect([f8.format, f8.scale?.kind, f8.rotationGroup]).toEqual(["f8_e4m3fn", "tensor", undefined]);
    expect(loadWeight(src, "norm.weight").shape).toEqual([1, 16]);
  });

  test("convrot: false through loadWeight is one E_UNSUPPORTED naming the tensor and the file", () => {
    const src = openSafetensors(path);
    const e = thrown(() => loadWeight(src, "plain.weight")) as TpError;
    expect([e.code, e.tensor, e.file]).toEqual(["E_UNSUPPORTED", "plain.weight", path]);
    expect(e.message).toContain("quantize --format int8-convrot");
    // The other tensors of the same file still load.
    expect(loadWeight(src, "g64.weight").rotationGroup).toBe(64);
  });

  test("detectSourceFormats = detectTensorFormats on the file's table (markers read from the mapping)", () => {
    const src = openSafetensors(path);
    const e = thrown(() =>
      detectSourceFormats(src, { expectedShapes: { "i4.weight": [8, 256] } }),
    ) as TpError;
    expect([e.code, e.tensor]).toEqual(["E_UNSUPPORTED", "plain.weight"]);
    const ok = join(tmp.dir, "ok.safetensors");
    writeSafetensors(ok, [
      T("g64.weight", "I8", [8, 128]),
      T("g64.weight_scale", "F32", [8, 1], 0),
      M("g64.comfy_quant", { format: "int8_tensorwise", convrot: true, convrot_groupsize: 64 }),
      T("i4.weight", "I8", [8, 128]),
      T("i4.weight_scale", "F32", [8], 0),
    ]);
    const r = detectSourceFormats(openSafetensors(ok), { expectedShapes: { "i4.weight": [8, 256] } });
    expect([...r.tensors.keys()].sort()).toEqual(["g64.weight", "i4.weight"]);
    expect(r.tensors.get("i4.weight")?.format).toBe("int4_convrot");
    expect([...r.auxiliary.keys()].sort()).toEqual([
      "g64.comfy_quant",
      "g64.weight_scale",
      "i4.weight_scale",
    ]);
  });
});
