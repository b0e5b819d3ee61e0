// Host-side facts of the block decoders: the block table agrees with @tp/tensor's GGUF table (elements
// and bytes per block, from ggml-common.h), row lengths, and the kernels' parameters. What the decoders
// compute is checked by the conformance suite on the simulator (embedding: bit for bit against
// @tp/quant's dequantizeGgml; matmul / matmul_id against its references).
import { describe, expect, test } from "bun:test";
import { weightBytes, weightFormatInfo } from "@tp/tensor";
import { BLOCKS, type BlockFormat, blockRowBytes, ggmlQuantizeKernel, isBlockFormat } from "./blocks.ts";
import { GGUF_BLOCK_FORMATS } from "./catalogue.ts";
import { rowBytes } from "./gather.ts";

describe("GGUF block table", () => {
  test("every decoded type has @tp/tensor's elements and bytes per block", () => {
    for (const f of Object.keys(BLOCKS) as BlockFormat[]) {
      const info = weightFormatInfo(f);
      expect([f, BLOCKS[f].elems, BLOCKS[f].bytes]).toEqual([f, info.blockElems, info.blockBytes]);
    }
    expect(GGUF_BLOCK_FORMATS.map(String).sort()).toEqual(Object.keys(BLOCKS).sort());
  });
  test("row bytes equal weightBytes of one row; iq* and q8_k are not block formats here", () => {
    for (const f of GGUF_BLOCK_FORMATS) {
      expect(blockRowBytes(f, 512)).toBe(weightBytes(f, [1, 512]));
      expect(rowBytes(f, 768 * 4)).toBe(weightBytes(f, [1, 768 * 4]));
    }
    for (const f of ["iq4_nl", "iq4_xs", "q8_1", "q8_k", "f32", "tq1_0"])
      expect(isBlockFormat(f)).toBe(false);
  });
  test("activation quantizers: one per block size, parameters out, x, n", () => {
    const q0 = ggmlQuantizeKernel(32);
    const qk = ggmlQuantizeKernel(256);
    expect([q0.name, qk.name]).toEqual(["ggml_quantize_q8_0", "ggml_quantize_q8_k"]);
    expect(q0.params.map((p) => `${p.name}:${p.type}`)).toEqual(["out:u64", "x:u64", "n:u32"]);
    expect(qk.block).toEqual([256, 1]);
  });
});
