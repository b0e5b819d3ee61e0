/**
 * Every kernel family with the variants the backend generates (dtypes, formats, folded options, a
 * spread of ranks and geometries), for the `ptxas` test and the package README's table. The backend
 * generates the same templates on demand with the exact folded values of each call.
 */
import { fakeQuantizeQ8_0Kernel, fakeQuantizeQ8_KKernel } from "./activations.ts";
import { type AttentionSpec, attentionKernel } from "./attention.ts";
import type { BlockFormat } from "./blocks.ts";
import { CAST_FLOATS, castKernel } from "./casts.ts";
import {
  countNonFiniteKernel,
  type FloatDtype,
  MAP_OPS,
  type MapOp,
  mapKernel,
  moveKernel,
} from "./elementwise.ts";
import type { KernelSource } from "./emit.ts";
import {
  conv2dKernel,
  embeddingKernel,
  gatedDeltaNetKernel,
  ropeKernel,
  rotateKernel,
  ssmConvKernel,
} from "./gather.ts";
import { gemvIdKernel, gemvKernel, mmaIntKernel, mmaKernel, tiledKernel } from "./matmul.ts";
import { type MmaOperand, mmaTiledKernel } from "./mma-tiled.ts";
import { groupedKernel, groupedMmaKernel, moeCountKernel, moeScanKernel, moeScatterKernel } from "./moe.ts";
import {
  argmaxKernel,
  fakeQuantizeRowsKernel,
  groupNormKernel,
  layerNormKernel,
  quantizeRowsFp8Kernel,
  quantizeRowsInt4Kernel,
  quantizeRowsInt8Kernel,
  rmsNormKernel,
  softmaxKernel,
  topKKernel,
} from "./rows.ts";

const FLOATS: readonly FloatDtype[] = ["f32", "f16", "bf16"];

/** The GGUF block types with decoders (blocks.ts). */
export const GGUF_BLOCK_FORMATS = [
  "q8_0",
  "q4_0",
  "q4_1",
  "q5_0",
  "q5_1",
  "q2_k",
  "q3_k",
  "q4_k",
  "q5_k",
  "q6_k",
  "iq4_nl",
  "iq4_xs",
] as const satisfies readonly BlockFormat[];
/** Table formats of the embedding kernel: the floats, fp8 and the GGUF blocks. */
export const EMBEDDING_FORMATS = [
  "f32",
  "f16",
  "bf16",
  "f8_e4m3fn",
  "f8_e5m2",
  ...GGUF_BLOCK_FORMATS,
] as const;
/** Weight formats of the matmul kernels: the embedding formats and ConvRot int8 / int4. */
export const MATMUL_FORMATS = [...EMBEDDING_FORMATS, "int8_convrot", "int4_convrot"] as const;
/** Weight formats of matmul_id (fp8 raw or with a tensor scale; ConvRot with its row scales). */
export const MATMUL_ID_FORMATS = MATMUL_FORMATS;

/** The catalogue: family name → its variants. */
export function kernelCatalogue(): Record<string, KernelSource[]> {
  const map: KernelSource[] = [];
  for (const op of Object.keys(MAP_OPS) as MapOp[]) {
    const arity = MAP_OPS[op];
    if (op === "cast") continue; // the cast op runs ./casts.ts
    for (const d of FLOATS)
      for (const rank of [1, 4]) map.push(mapKernel({ op, inputs: Array(arity).fill(d), out: d, rank }));
  }
  map.push(mapKernel({ op: "add", inputs: ["f32", "f32"], out: "f32", rank: 8 }));
  const casts: KernelSource[] = [];
  for (const from of CAST_FLOATS)
    for (const to of CAST_FLOATS) {
      if (from === to) continue;
      const fp8 = to === "f8_e4m3fn" || to === "f8_e5m2";
      for (const saturate of fp8 ? [false, true] : [false])
        casts.push(castKernel({ from, to, rank: from === "f32" ? 1 : 3, saturate }));
    }
  const move: KernelSource[] = [];
  for (const bytes of [1, 2, 4, 8] as const)
    for (const outStrided of [false, true])
      for (const rank of [1, 3, 6]) move.push(moveKernel({ bytes, rank, outStrided }));
  const rows = [
    ...(["none", "weight", "unit_offset"] as const).map(rmsNormKernel),
    ...[false, true].flatMap((w) => [false, true].map((b) => layerNormKernel(w, b))),
    ...[false, true].flatMap((w) => [false, true].map((b) => groupNormKernel(w, b))),
    softmaxKernel(),
    argmaxKernel(),
    topKKernel(),
    countNonFiniteKernel(),
  ];
  const rope = [
    ropeKernel({ mode: "neox", ropeDims: 128, sections: [] }),
    ropeKernel({ mode: "neox", ropeDims: 64, sections: [] }),
    ropeKernel({ mode: "interleaved", ropeDims: 128, sections: [] }),
    ropeKernel({ mode: "neox", ropeDims: 128, sections: [16, 24, 24] }),
    ropeKernel({ mode: "interleaved", ropeDims: 128, sections: [8, 28, 28] }),
  ];
  const matmul: KernelSource[] = [];
  for (const format of MATMUL_FORMATS) {
    const convrot = format === "int8_convrot" || format === "int4_convrot";
    const fp8 = format === "f8_e4m3fn" || format === "f8_e5m2";
    for (const bias of [false, true]) {
      for (const scaled of convrot ? [true] : fp8 ? [false, true] : [false])
        matmul.push(gemvKernel({ format, bias, scaled }), tiledKernel({ format, bias, scaled }));
      if (format === "f16" || format === "bf16") matmul.push(mmaKernel({ format, bias, scaled: false }));
    }
  }
  const moe: KernelSource[] = [moeCountKernel(), moeScanKernel(), moeScatterKernel()];
  for (const format of MATMUL_ID_FORMATS) {
    const convrot = format === "int8_convrot" || format === "int4_convrot";
    const fp8 = format === "f8_e4m3fn" || format === "f8_e5m2";
    for (const scaled of convrot ? [true] : fp8 ? [false, true] : [false])
      moe.push(gemvIdKernel(format, scaled), groupedKernel({ format, scaled }));
  }
  moe.push(groupedMmaKernel("f16"), groupedMmaKernel("bf16"));
  matmul.push(fakeQuantizeQ8_0Kernel(), fakeQuantizeQ8_KKernel());
  const convrot = [
    rotateKernel(256),
    rotateKernel(64),
    rotateKernel(16),
    quantizeRowsInt8Kernel(),
    quantizeRowsInt4Kernel(),
    fakeQuantizeRowsKernel(8),
    fakeQuantizeRowsKernel(4),
    ...([8, 4] as const).flatMap((bits) => [mmaIntKernel(bits, false), mmaIntKernel(bits, true)]),
  ];
  // shared-memory tiled mma (prefill); e4m3 (fp8 W8A8) and its row quantizer need sm_89
  const mmaTiled: KernelSource[] = [quantizeRowsFp8Kernel()];
  for (const operand of ["f16", "bf16", "s8", "s4", "e4m3"] as MmaOperand[])
    for (const bias of [false, true])
      for (const scaled of operand === "e4m3" ? [false, true] : [operand === "s8" || operand === "s4"])
        mmaTiled.push(mmaTiledKernel({ operand, bias, scaled }));
  const attention: KernelSource[] = [];
  const specs: AttentionSpec[] = [];
  for (const headDim of [64, 128, 256])
    for (const causal of [false, true])
      for (const softcap of [false, true]) specs.push({ headDim, headDimV: headDim, causal, softcap });
  specs.push({ headDim: 192, headDimV: 128, causal: true, softcap: false });
  for (const s of specs) attention.push(attentionKernel(s));
  const conv = [
    conv2dKernel({ kh: 3, kw: 3, stride: [1, 1], padding: [1, 1], bias: true }),
    conv2dKernel({ kh: 1, kw: 1, stride: [1, 1], padding: [0, 0], bias: false }),
    conv2dKernel({ kh: 3, kw: 3, stride: [2, 2], padding: [0, 0], bias: true }),
    ssmConvKernel(4),
    gatedDeltaNetKernel(),
  ];
  return {
    map,
    casts,
    move,
    rows,
    rope,
    embedding: EMBEDDING_FORMATS.map(embeddingKernel),
    matmul,
    moe,
    convrot,
    mma_tiled: mmaTiled,
    attention,
    conv,
  };
}
