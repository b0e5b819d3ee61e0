// The krea2-tiny checkpoints (../shared/testdata/krea2-tiny, made by ComfyUI / comfy-kitchen from one
// set of bf16 values): our quantizers reproducing ComfyUI's int8 / int4 ConvRot and fp8-scaled files
// from the bf16 checkpoint — every quantized layer, group sizes 256, 64 and 16 — and decoding them.
// (Format detection on these files is tested in @tp/formats, layouts/krea2-tiny.test.ts.)
//
// Tolerances (from issue 4): same shapes; scales within 1e-6 relative; codes equal except where the
// rotated value sits on a rounding boundary — then at most 1 apart, in no more than 0.1% of values.
// Measured: every code and every fp8 byte equal, scales within 1.2e-7 relative.
import { describe, expect, test } from "bun:test";
import {
  detectSourceFormats,
  loadWeight,
  openSafetensors,
  type SafetensorsFile,
  type TensorFormat,
} from "@tp/formats";
import { decodeToF32 } from "@tp/tensor";
import { convRotCodes, convRotFromWeight, dequantizeConvRot, quantizeConvRot } from "./convrot.ts";
import { dequantizeFp8, quantizeFp8Scaled } from "./fp8.ts";
import { missingReason, readF32, sharedPath, skipNote } from "./testing/fixtures.ts";

const dir = sharedPath("testdata/krea2-tiny");
const ckpt = (v: string) => `${dir}/checkpoints/krea2_tiny_${v}.safetensors`;
const reason = missingReason(
  `${dir}/config/krea2_tiny.json`,
  ...["bf16", "fp8_e4m3fn", "fp8_scaled", "int8_convrot", "int4_convrot"].map(ckpt),
);

const opened = new Map<string, SafetensorsFile>();
function load(v: string): SafetensorsFile {
  let f = opened.get(v);
  if (!f) {
    f = openSafetensors(ckpt(v));
    opened.set(v, f);
  }
  return f;
}

/** Detected formats of a file's data tensors. */
const formatsOf = (f: SafetensorsFile): Iterable<TensorFormat> => detectSourceFormats(f).tensors.values();

describe("krea2-tiny: quantizing the bf16 checkpoint reproduces ComfyUI's files", () => {
  for (const variant of ["int8_convrot", "int4_convrot"] as const) {
    const groupsText = variant === "int8_convrot" ? "256, 64, 16" : "256, 64";
    test.skipIf(reason !== null)(
      `${variant}: every quantized layer (groups ${groupsText}), codes and scales${skipNote(reason)}`,
      () => {
        const bf = load("bf16");
        const q = load(variant);
        let layers = 0;
        let values = 0;
        let off1 = 0;
        let worstScale = 0;
        let worstCode = 0;
        const groups = new Set<number>();
        for (const t of formatsOf(q)) {
          if (t.format !== variant) continue;
          const stored = convRotFromWeight(loadWeight(q, t.name));
          expect(bf.tensor(t.name).shape).toEqual([...stored.shape]);
          const mine = quantizeConvRot({ bytes: bf.data(t.name), dtype: "bf16" }, stored.shape, {
            format: variant,
            groupSize: stored.groupSize,
            name: t.name,
          });
          expect(mine.data.length).toBe(stored.data.length);
          for (let r = 0; r < stored.scale.length; r++) {
            worstScale = Math.max(
              worstScale,
              Math.abs((mine.scale[r] as number) / (stored.scale[r] as number) - 1),
            );
          }
          const a = convRotCodes(mine);
          const b = convRotCodes(stored);
          for (let i = 0; i < a.length; i++) {
            const d = Math.abs((a[i] as number) - (b[i] as number));
            if (d > 1) worstCode = Math.max(worstCode, d);
            off1 += d;
          }
          values += a.length;
          layers++;
          groups.add(stored.groupSize);
        }
        expect(layers).toBe(variant === "int8_convrot" ? 48 : 20);
        expect([...groups].sort((x, y) => x - y)).toEqual(
          variant === "int8_convrot" ? [16, 64, 256] : [64, 256],
        );
        expect(worstCode).toBe(0); // no code more than 1 apart
        expect(worstScale).toBeLessThan(1e-6);
        expect(off1 / values).toBeLessThanOrEqual(0.001);
        expect(off1).toBe(0); // measured: bit for bit; the looser limits above are the contract
      },
    );
  }

  test.skipIf(reason !== null)(
    `fp8-scaled: codes bit for bit, scale = absmax/448 exactly${skipNote(reason)}`,
    () => {
      const bf = load("bf16");
      const q = load("fp8_scaled");
      let layers = 0;
      for (const t of formatsOf(q)) {
        if (t.format !== "f8_e4m3fn") continue;
        const src = bf.data(t.name);
        const mine = quantizeFp8Scaled({ bytes: src, dtype: "bf16" }, src.length / 2, { name: t.name });
        const scale = readScalar(q.data((t.scale as { tensor: string }).tensor));
        expect(mine.scale).toBe(scale);
        expect(Buffer.from(mine.data).equals(Buffer.from(q.data(t.name)))).toBe(true);
        layers++;
      }
      expect(layers).toBe(48);
    },
  );
});

describe("krea2-tiny: decoding matches ComfyUI's dequantized weights", () => {
  test.skipIf(reason !== null)(
    `fp8-scaled blocks.1.attn.wk = f32(fp8)·scale bit for bit${skipNote(reason)}`,
    () => {
      const q = load("fp8_scaled");
      const want = readF32(`${dir}/linear/blocks_1_attn_wk_w_fp8_scaled_dequant.bin`);
      const got = dequantizeFp8(
        q.data("blocks.1.attn.wk.weight"),
        "f8_e4m3fn",
        readScalar(q.data("blocks.1.attn.wk.weight_scale")),
      );
      expect(Buffer.from(got.buffer).equals(Buffer.from(want.buffer))).toBe(true);
    },
  );

  test.skipIf(reason !== null)(
    `int8 / int4 group 16 and 256 layers decode close to the bf16 source${skipNote(reason)}`,
    () => {
      // No ComfyUI golden for group 16; check decode against the bf16 weights it was made from: the
      // error must look like quantization noise (rel. RMSE < 1.5% int8, < 20% int4), not a wrong layout.
      const bf = load("bf16");
      for (const [variant, limit] of [
        ["int8_convrot", 0.015],
        ["int4_convrot", 0.2],
      ] as const) {
        const q = load(variant);
        for (const t of formatsOf(q)) {
          if (t.format !== variant) continue;
          const got = dequantizeConvRot(convRotFromWeight(loadWeight(q, t.name)), t.name);
          const ref = decodeToF32(bf.data(t.name), "bf16");
          let e = 0;
          let r = 0;
          for (let i = 0; i < ref.length; i++) {
            e += ((got[i] as number) - (ref[i] as number)) ** 2;
            r += (ref[i] as number) ** 2;
          }
          expect(Math.sqrt(e / r)).toBeLessThan(limit);
        }
      }
    },
  );
});

function readScalar(bytes: Uint8Array): number {
  return new DataView(bytes.buffer, bytes.byteOffset, 4).getFloat32(0, true);
}
