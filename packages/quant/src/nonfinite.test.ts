// Quantizers refuse non-finite input (issue 21 item 3): NaN or ±∞ in a source weight would become NaN
// scales (ConvRot, fp8) or garbage blocks (ggml) that load and decode silently. Each quantizer, and
// the checkpoint writer for every quantizer it is given (and for the tensors it copies), stops with
// E_NUMERIC naming the tensor and the element, and leaves no output file.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { writeSafetensors } from "@tp/formats";
import type { TpError } from "@tp/tensor";
import { quantizeCheckpoint, type WeightQuantizer } from "./checkpoint.ts";
import { quantizeConvRot } from "./convrot.ts";
import { quantizeFp8Scaled } from "./fp8.ts";
import { quantizeGgml } from "./ggml-quantize.ts";
import { bf16Bytes, tempFolder } from "./testing/checkpoints.ts";
import { thrown as thrownAny } from "./testing/fixtures.ts";

/** The TpError a call throws (its code and message). */
const thrown = (f: () => unknown): TpError => thrownAny(f) as TpError;

const tmp = tempFolder("nonfinite");
afterAll(tmp.cleanup);

/** 64 × 256 values of a smooth pattern with `bad` at element `at`. */
function weights(at: number, bad: number): Float32Array {
  const w = Float32Array.from({ length: 64 * 256 }, (_, i) => Math.sin(i * 0.37) * 0.1);
  w[at] = bad;
  return w;
}

describe("each quantizer: E_NUMERIC naming the tensor and the element", () => {
  for (const bad of [Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY]) {
    test(`${bad}`, () => {
      const w = weights(300, bad);
      const expectIt = (e: { code: string; message: string }) => {
        expect(e.code).toBe("E_NUMERIC");
        expect(e.message).toContain(`element 300 is ${bad}`);
        expect(e.message).toContain("tensor blocks.0.attn.wq.weight");
      };
      for (const format of ["int8_convrot", "int4_convrot"] as const) {
        expectIt(thrown(() => quantizeConvRot(w, [64, 256], { format, name: "blocks.0.attn.wq.weight" })));
      }
      expectIt(thrown(() => quantizeFp8Scaled(w, w.length, { name: "blocks.0.attn.wq.weight" })));
      for (const format of ["q8_0", "q4_0", "q4_k", "q6_k"] as const) {
        expectIt(thrown(() => quantizeGgml(format, w, w.length, "blocks.0.attn.wq.weight")));
      }
      // bf16 bytes are widened first: the same answer.
      const bytes = new Uint8Array(
        new Uint16Array(
          Array.from(w, (v) => (new Uint32Array(Float32Array.of(v).buffer)[0] as number) >>> 16),
        ).buffer,
      );
      expectIt(
        thrown(() =>
          quantizeConvRot({ bytes, dtype: "bf16" }, [64, 256], { name: "blocks.0.attn.wq.weight" }),
        ),
      );
    });
  }
});

describe("quantizeCheckpoint: checked before any byte is written, whatever the quantizer", () => {
  const wq = bf16Bytes(64 * 256, 3);
  const nanWq = wq.slice();
  nanWq.set([0xc0, 0x7f], 2 * 1234); // bf16 NaN at element 1234
  const nanWeight = join(tmp.dir, "nan-weight.safetensors");
  writeSafetensors(nanWeight, [
    { name: "blocks.0.attn.wq.weight", dtype: "BF16", shape: [64, 256], data: nanWq },
  ]);
  const infBias = join(tmp.dir, "inf-bias.safetensors");
  writeSafetensors(infBias, [
    { name: "blocks.0.attn.wq.weight", dtype: "BF16", shape: [64, 256], data: wq },
    {
      name: "blocks.0.attn.wq.bias",
      dtype: "F32",
      shape: [4],
      data: new Uint8Array(new Float32Array([0, 1, Number.POSITIVE_INFINITY, 3]).buffer),
    },
  ]);
  // A quantizer that would write whatever it gets: the writer must refuse before calling it.
  const blind: WeightQuantizer = {
    name: "blind",
    convRot: () => {
      throw new Error("called");
    },
    fp8Scaled: () => {
      throw new Error("called");
    },
  };
  const cases = [
    ["int8_convrot", undefined, nanWeight, "element 1234 is NaN", "blocks.0.attn.wq.weight"],
    ["fp8_scaled", undefined, nanWeight, "element 1234 is NaN", "blocks.0.attn.wq.weight"],
    ["int8_convrot", blind, nanWeight, "element 1234 is NaN", "blocks.0.attn.wq.weight"],
    ["fp8_scaled", blind, nanWeight, "element 1234 is NaN", "blocks.0.attn.wq.weight"],
    ["int8_convrot", undefined, infBias, "element 2 is Infinity", "blocks.0.attn.wq.bias"],
  ] as const;
  for (const [i, [format, quantizer, input, what, tensor]] of cases.entries()) {
    test(`${format}${quantizer ? " (a quantizer that checks nothing)" : ""}: ${tensor}`, () => {
      const out = join(tmp.dir, `out-${i}.safetensors`);
      const e = thrown(() =>
        quantizeCheckpoint(input, out, {
          format,
          layers: ["blocks.0.attn.wq"],
          ...(quantizer ? { quantizer } : {}),
        }),
      );
      expect(e.code).toBe("E_NUMERIC");
      expect(e.message).toContain(what);
      expect(e.message).toContain(`tensor ${tensor}`);
      expect(existsSync(out)).toBe(false);
      expect(readdirSync(tmp.dir).filter((f) => f.startsWith("out-"))).toEqual([]);
    });
  }
});
