// Per-tensor format detection on the krea2-tiny checkpoints (../shared/testdata/krea2-tiny, made by
// ComfyUI / comfy-kitchen from one set of bf16 values): every variant gives the manifest's per-layer
// formats, group sizes and scales; loadWeight carries each layer's convrot_groupsize; without markers
// dtype/shape inference finds the same layers. Exact answers, no tolerances.
import { describe, expect, test } from "bun:test";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { openSafetensors, type SafetensorsFile } from "../safetensors/file.ts";
import { SHARED } from "../testing/util.ts";
import {
  detectInputOf,
  detectSourceFormats,
  detectTensorFormats,
  loadWeight,
  type TensorInfo,
} from "./tensor-format.ts";

const dir = join(SHARED, "testdata/krea2-tiny");
const ckpt = (v: string) => join(dir, "checkpoints", `krea2_tiny_${v}.safetensors`);
const needed = [
  join(dir, "config/krea2_tiny.json"),
  ...["bf16", "fp8_e4m3fn", "fp8_scaled", "int8_convrot", "int4_convrot"].map(ckpt),
];
const missing = needed.filter((p) => !existsSync(p));
const skip = missing.length > 0;
const note = skip ? ` [skipped: shared fixture missing: ${missing.join(", ")}]` : "";

const opened = new Map<string, SafetensorsFile>();
function load(v: string): SafetensorsFile {
  let f = opened.get(v);
  if (!f) {
    f = openSafetensors(ckpt(v));
    opened.set(v, f);
  }
  return f;
}

interface Variant {
  file: string;
  layers: Record<string, Record<string, unknown>>;
}
const config = () =>
  JSON.parse(readFileSync(join(dir, "config/krea2_tiny.json"), "utf8")) as {
    variants: Record<string, Variant>;
  };

describe("krea2-tiny: format detection", () => {
  test.skipIf(skip)(`int8 / int4 / fp8-scaled markers give the manifest's per-layer formats${note}`, () => {
    const cfg = config();
    const expectFormat = {
      int8_convrot: "int8_convrot",
      int4_convrot: "int4_convrot",
      fp8_scaled: "f8_e4m3fn",
    } as const;
    for (const [variant, format] of Object.entries(expectFormat)) {
      const f = load(variant);
      const { tensors, auxiliary } = detectSourceFormats(f);
      const layers = cfg.variants[variant]?.layers ?? {};
      let marked = 0;
      for (const [name, t] of tensors) {
        const layer = name.replace(/\.weight$/, "");
        const payload = name.endsWith(".weight") ? layers[layer] : undefined;
        if (payload) {
          marked++;
          expect(t.format).toBe(format);
          expect(t.source).toBe("comfy_quant");
          expect(t.marker).toEqual(payload);
          if (format !== "f8_e4m3fn") {
            expect(t.groupSize).toBe(payload.convrot_groupsize as number);
            expect(t.scale).toEqual({ tensor: `${layer}.weight_scale`, kind: "row" });
            expect(t.shape).toEqual(load("bf16").tensor(name).shape);
            // loadWeight hands the layer's group to the Weight.
            expect(loadWeight(f, name).rotationGroup).toBe(payload.convrot_groupsize as number);
          } else expect(t.scale).toEqual({ tensor: `${layer}.weight_scale`, kind: "tensor" });
        } else {
          expect(t.format).toBe("bf16"); // everything else stays BF16 in these files
        }
      }
      expect(marked).toBe(Object.keys(layers).length);
      // Every marker and scale is auxiliary, nothing else.
      for (const a of auxiliary.keys())
        expect(a.endsWith(".comfy_quant") || a.endsWith(".weight_scale")).toBe(true);
      expect(tensors.size + auxiliary.size).toBe(f.tensors.length);
    }
  });

  test.skipIf(skip)(`raw fp8 and bf16 files: every tensor is f8_e4m3fn (unscaled) / bf16${note}`, () => {
    for (const [variant, format] of [
      ["fp8_e4m3fn", "f8_e4m3fn"],
      ["bf16", "bf16"],
    ] as const) {
      const { tensors, auxiliary } = detectSourceFormats(load(variant));
      expect(auxiliary.size).toBe(0);
      for (const t of tensors.values()) {
        expect(t.format).toBe(format);
        expect(t.scale).toBeUndefined();
      }
    }
  });

  test.skipIf(skip)(
    `without markers, dtype/shape inference finds the same int8 / int4 layers (group 256)${note}`,
    () => {
      for (const [variant, format] of [
        ["int8_convrot", "int8_convrot"],
        ["int4_convrot", "int4_convrot"],
      ] as const) {
        const f = load(variant);
        const table = new Map(detectInputOf(f).tensors as ReadonlyMap<string, TensorInfo>);
        for (const name of [...table.keys()]) if (name.endsWith(".comfy_quant")) table.delete(name);
        // Shapes from the bf16 file tell an I8 int4 weight [N, K/2] from an int8 one.
        const expectedShapes: Record<string, [number, number]> = {};
        for (const t of load("bf16").tensors)
          if (t.shape.length === 2) expectedShapes[t.name] = t.shape as [number, number];
        // Group-16 layers (K = 80) cannot be inferred with the default group 256: drop them for this check.
        for (const t of f.tensors) {
          if (t.name.endsWith(".weight") && (t.dtype === "I8" || t.dtype === "U8")) {
            const k = expectedShapes[t.name]?.[1] as number;
            if (k % 256 !== 0) {
              table.delete(t.name);
              table.delete(t.name.replace(/\.weight$/, ".weight_scale"));
            }
          }
        }
        const { tensors } = detectTensorFormats({ tensors: table, expectedShapes });
        let quantized = 0;
        for (const t of tensors.values()) {
          if (t.storedDtype === "I8") {
            expect(t.format).toBe(format);
            expect(t.source).toBe("inferred");
            expect(t.groupSize).toBe(256);
            quantized++;
          }
        }
        expect(quantized).toBeGreaterThan(0);
      }
    },
  );
});
