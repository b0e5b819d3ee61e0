/**
 * Cases of matmul, matmul_id and embedding for every weight format of @tp/quant, on weights quantized by
 * @tp/quant's own quantizers (f16 / bf16 / fp8 encoders, quantizeFp8Scaled, quantizeConvRot,
 * quantizeGgml) or, for block types without a quantizer here, blocks of random codes with sane
 * f16 scales. Shapes: M = 1 (decoding), odd N, several rows with a bias, 3-D activations.
 */
import { quantizeConvRot, quantizeFp8Scaled, quantizeGgml } from "@tp/quant";
import {
  encodeFromF32,
  f32ToF16,
  type Tensor,
  Weight,
  type WeightFormat,
  type WeightScale,
  weightBytes,
  weightFormatInfo,
} from "@tp/tensor";
import { type ConformanceCase, defineCase, type InputSpec } from "../case.ts";
import { gaussian, integers, uniform } from "../data.ts";
import { numelOf } from "../host.ts";
import { embeddingRef, matmulIdRef, matmulRef } from "../reference/index.ts";
import { EMBEDDING, MATMUL } from "../tolerances.ts";

/** A weight format under test; fp8 appears twice (raw codes, and with a per-tensor scale). */
interface FormatCase {
  readonly format: WeightFormat;
  readonly scaled?: boolean;
  /** ConvRot rotation group (default 256). */
  readonly group?: number;
}

/** Every weight format the issue lists (issue 7: matmul "for every weight format of @tp/quant"). */
export const MATMUL_FORMATS: readonly FormatCase[] = [
  { format: "f32" },
  { format: "f16" },
  { format: "bf16" },
  { format: "f8_e4m3fn" },
  { format: "f8_e4m3fn", scaled: true },
  { format: "f8_e5m2" },
  { format: "int8_convrot" },
  { format: "int4_convrot" },
  { format: "q8_0" },
  { format: "q4_0" },
  { format: "q4_1" },
  { format: "q5_0" },
  { format: "q5_1" },
  { format: "q2_k" },
  { format: "q3_k" },
  { format: "q4_k" },
  { format: "q5_k" },
  { format: "q6_k" },
  { format: "iq4_nl" },
  { format: "iq4_xs" },
];

/**
 * Byte offsets of the f16 scale fields ("d", and "m" / "dmin") inside one block of the GGUF types
 * that have no quantizer in @tp/quant; the other bytes are codes and may be random.
 * Source: ggml/src/ggml-common.h (block_q4_1, block_q5_0, block_q5_1, block_q2_K, block_q3_K, block_q5_K).
 */
const RANDOM_BLOCKS: Partial<Record<WeightFormat, { d: number; min?: number; scales?: [number, number] }>> = {
  q4_1: { d: 0, min: 2 },
  q5_0: { d: 0 },
  q5_1: { d: 0, min: 2 },
  q2_k: { d: 80, min: 82 },
  q3_k: { d: 108 },
  q5_k: { d: 0, min: 2 },
};

function putF16(bytes: Uint8Array, at: number, v: number): void {
  const h = f32ToF16(v);
  bytes[at] = h & 0xff;
  bytes[at + 1] = h >> 8;
}

/** A Weight [n, k] of `fc.format` made from seeded normal values. */
export function makeWeight(fc: FormatCase, n: number, k: number, seed: number, name = "w"): Weight {
  const f = fc.format;
  const w = gaussian(seed, n * k, 0.5);
  let data: Uint8Array;
  let scale: WeightScale | undefined;
  let rotationGroup: number | undefined;
  if (f === "f32") data = new Uint8Array(w.buffer);
  else if (f === "f16" || f === "bf16") data = encodeFromF32(w, f);
  else if (f === "f8_e4m3fn" || f === "f8_e5m2") {
    if (fc.scaled) {
      const q = quantizeFp8Scaled(w, n * k, { dtype: f });
      data = q.data;
      scale = { kind: "tensor", value: q.scale };
    } else data = encodeFromF32(w, f, { saturate: true });
  } else if (f === "int8_convrot" || f === "int4_convrot") {
    const q = quantizeConvRot(w, [n, k], { format: f, ...(fc.group ? { groupSize: fc.group } : {}) });
    data = q.data;
    scale = { kind: "row", values: q.scale };
    rotationGroup = q.groupSize;
  } else if (
    f === "q8_0" ||
    f === "q4_0" ||
    f === "q4_k" ||
    f === "q6_k" ||
    f === "iq4_nl" ||
    f === "iq4_xs"
  ) {
    data = quantizeGgml(f, w, n * k, name);
  } else {
    const layout = RANDOM_BLOCKS[f];
    if (layout === undefined) throw new Error(`no test weights for ${f}`);
    const info = weightFormatInfo(f);
    const u = uniform(seed);
    data = Uint8Array.from({ length: weightBytes(f, [n, k]) }, () => Math.floor(u() * 256));
    for (let at = 0; at < data.length; at += info.blockBytes) {
      putF16(data, at + layout.d, 0.002 + 0.01 * u());
      if (layout.min !== undefined)
        putF16(data, at + layout.min, (f === "q4_1" || f === "q5_1" ? -0.05 : 0.004) * u());
    }
  }
  return new Weight({
    name,
    format: f,
    shape: [n, k],
    data,
    ...(scale ? { scale } : {}),
    ...(rotationGroup ? { rotationGroup } : {}),
  });
}

function label(fc: FormatCase): string {
  return fc.scaled ? `${fc.format} scaled` : fc.format;
}

function matmulCases(): ConformanceCase[] {
  const shapes: { x: number[]; n: number; bias: boolean; view?: InputSpec["view"] }[] = [
    { x: [1, 256], n: 17, bias: false },
    { x: [5, 512], n: 9, bias: true },
    { x: [2, 3, 256], n: 16, bias: false },
    // prefill-sized (32 tokens, every dimension a multiple of 16): the GEMM paths (ptx's mma kernels,
    // the cuda backend's cuBLASLt) rather than the decode GEMV
    { x: [32, 256], n: 48, bias: true },
  ];
  const out: ConformanceCase[] = [];
  MATMUL_FORMATS.forEach((fc, f) => {
    shapes.forEach(({ x, n, bias }, s) => {
      const k = x[x.length - 1] as number;
      const weight = makeWeight(fc, n, k, 2100 + 10 * f + s, `w_${fc.format}`);
      const inputs: InputSpec[] = [
        { name: "x", dtype: "f32", shape: x, data: gaussian(2200 + 10 * f + s, numelOf(x)) },
      ];
      if (bias) inputs.push({ name: "bias", dtype: "f32", shape: [n], data: gaussian(2300 + 10 * f + s, n) });
      out.push(
        defineCase({
          op: "matmul",
          name: `matmul ${label(fc)} x [${x}] · w [${n}, ${k}]ᵀ${bias ? " + bias" : ""}`,
          formats: [fc.format],
          tolerance: MATMUL,
          inputs,
          weights: [weight],
          call: (b, [xt, bt], [w]) => b.matmul(xt as Tensor, w as Weight, bt ? { bias: bt } : {}),
          reference: ([xt, bt]) => [
            {
              shape: [...x.slice(0, -1), n],
              dtype: "f32",
              data: matmulRef(xt?.data as Float32Array, weight, bt ? (bt.data as Float32Array) : null),
            },
          ],
        }),
      );
    });
  });
  return out;
}

function embeddingCases(): ConformanceCase[] {
  const formats = MATMUL_FORMATS.filter((fc) => weightFormatInfo(fc.format).family !== "convrot");
  const out: ConformanceCase[] = [];
  formats.forEach((fc, f) => {
    const table = makeWeight(fc, 37, 256, 2400 + f, `table_${fc.format}`);
    for (const idsShape of [[5], [2, 3]]) {
      const ids = integers(2500 + f + idsShape.length, numelOf(idsShape), 0, 36);
      out.push(
        defineCase({
          op: "embedding",
          name: `embedding ${label(fc)} table [37, 256] ids [${idsShape}]`,
          formats: [fc.format],
          tolerance: EMBEDDING,
          inputs: [{ name: "ids", dtype: "i32", shape: idsShape, data: ids }],
          weights: [table],
          call: (b, [idt], [t]) => b.embedding(t as Weight, idt as Tensor),
          reference: () => [{ shape: [...idsShape, 256], dtype: "f32", data: embeddingRef(table, ids) }],
        }),
      );
    }
  });
  return out;
}

/**
 * matmul_id on stacks of experts in every weight format: tokens routed unevenly (one expert takes
 * most rows, one none), one input row per token for every slot ([T, 1, K], as the gate / up
 * projections of a MoE block) or one per slot ([T, S, K], as the down projection), a strided x, a
 * decoding step (T = 1), a K past one dispatch's chunk of K on vulkan (MATMUL_K_CHUNK.vec = 65536:
 * the f32 sums add across dispatches, ConvRot's exact i32 partial sums carry over), and two prefill
 * batches (64 and 160 routed rows over 8 experts, some empty, one past a 64-row tile) that take the
 * ptx backend's grouped GEMM (ptx/moe.ts groupedMatmulId).
 */
function matmulIdCases(): ConformanceCase[] {
  const shapes: {
    x: [number, number, number];
    ids: number[];
    slots: number;
    experts: number;
    n: number;
    view?: InputSpec["view"];
  }[] = [
    // expert 2 of 4 gets no row; expert 0 gets four of ten
    { x: [5, 1, 256], ids: [0, 3, 1, 0, 3, 0, 1, 3, 0, 1], slots: 2, experts: 4, n: 9 },
    // one input per slot; experts 1 and 4 unused, expert 3 twice for one token's neighbours
    { x: [3, 2, 256], ids: [3, 0, 2, 3, 3, 0], slots: 2, experts: 5, n: 16, view: { kind: "stride2" } },
    // decoding: one token, three of six experts
    { x: [1, 1, 512], ids: [5, 0, 2], slots: 3, experts: 6, n: 17 },
    // K = 257 · 256: past 65536, in whole blocks of every format (and ConvRot groups of 256)
    { x: [2, 1, 65792], ids: [1, 0], slots: 1, experts: 2, n: 3 },
    // prefill, 64 routed rows over 8 experts (ptx: the grouped GEMM): experts 2 and 5 get none,
    // expert 0 a third; N = 72 is one whole and one partial column tile of 64
    {
      x: [16, 4, 256],
      ids: Array.from({ length: 64 }, (_, i) => (i % 3 === 0 ? 0 : ([1, 3, 4, 6, 7][(i * 7) % 5] as number))),
      slots: 4,
      experts: 8,
      n: 72,
    },
    // 160 rows from one input row per token: expert 6 takes 70 (two row tiles), experts 1 and 4 none
    {
      x: [40, 1, 256],
      ids: Array.from({ length: 160 }, (_, i) => (i < 70 ? 6 : ([0, 2, 3, 5, 7][i % 5] as number))),
      slots: 4,
      experts: 8,
      n: 24,
    },
  ];
  const out: ConformanceCase[] = [];
  MATMUL_FORMATS.forEach((fc, f) => {
    shapes.forEach(({ x, ids, slots, experts, n, view }, s) => {
      const [t, sx, k] = x;
      const stack = makeWeight(fc, experts * n, k, 2600 + 10 * f + s, `exps_${fc.format}`);
      const idData = Int32Array.from(ids);
      out.push(
        defineCase({
          op: "matmul_id",
          name: `matmul_id ${label(fc)} x [${x}] · ${experts} experts [${n}, ${k}]ᵀ ids [${t}, ${slots}]${view ? ` (${view.kind})` : ""}`,
          formats: [fc.format],
          tolerance: MATMUL,
          inputs: [
            {
              name: "x",
              dtype: "f32",
              shape: x,
              data: gaussian(2700 + 10 * f + s, t * sx * k),
              ...(view ? { view } : {}),
            },
            { name: "ids", dtype: "i32", shape: [t, slots], data: idData },
          ],
          weights: [stack],
          call: (b, [xt, it], [w]) => b.matmulId(xt as Tensor, w as Weight, it as Tensor, { experts }),
          reference: ([xt]) => [
            {
              shape: [t, slots, n],
              dtype: "f32",
              data: matmulIdRef(xt?.data as Float32Array, stack, idData, t, sx, slots, experts),
            },
          ],
        }),
      );
    });
  });
  return out;
}

/**
 * Prefill past one block tile of ptx's shared-memory mma kernels (64 × 128 outputs, 64 bytes of each
 * row a k step): M = 130 and N = 200 leave ragged tiles at both edges (2 full + 2 rows, 1 full + 72
 * columns), and K ends inside a k step (f16 K = 104: 3¼ steps of 32; int8 K = 208 with rotation
 * groups of 16: 3¼ steps of 64; int4 K = 192: 1½ steps of 128, W4A4 only with TP_PTX_W4A4=1), or
 * fills it exactly (bf16, fp8: 96).
 */
function prefillTileCases(): ConformanceCase[] {
  const shapes: { fc: FormatCase; m: number; k: number; bias: boolean }[] = [
    { fc: { format: "f16" }, m: 130, k: 104, bias: true },
    { fc: { format: "bf16" }, m: 130, k: 96, bias: false },
    { fc: { format: "f8_e4m3fn" }, m: 130, k: 96, bias: true },
    { fc: { format: "f8_e4m3fn", scaled: true }, m: 70, k: 96, bias: false },
    { fc: { format: "int8_convrot", group: 16 }, m: 130, k: 208, bias: true },
    { fc: { format: "int4_convrot", group: 16 }, m: 70, k: 192, bias: false },
  ];
  const n = 200;
  return shapes.map(({ fc, m, k, bias }, s) => {
    const weight = makeWeight(fc, n, k, 2800 + s, `w_${fc.format}`);
    const inputs: InputSpec[] = [{ name: "x", dtype: "f32", shape: [m, k], data: gaussian(2850 + s, m * k) }];
    if (bias) inputs.push({ name: "bias", dtype: "f32", shape: [n], data: gaussian(2900 + s, n) });
    const group = fc.group ? ` (rotation group ${fc.group})` : "";
    return defineCase({
      op: "matmul",
      name: `matmul ${label(fc)}${group} x [${m}, ${k}] · w [${n}, ${k}]ᵀ${bias ? " + bias" : ""} (prefill tiles)`,
      formats: [fc.format],
      tolerance: MATMUL,
      inputs,
      weights: [weight],
      call: (b, [xt, bt], [w]) => b.matmul(xt as Tensor, w as Weight, bt ? { bias: bt } : {}),
      reference: ([xt, bt]) => [
        {
          shape: [m, n],
          dtype: "f32",
          data: matmulRef(xt?.data as Float32Array, weight, bt ? (bt.data as Float32Array) : null),
        },
      ],
    });
  });
}

/** Every matmul, matmul_id and embedding case (they skip where `supports` says no). */
export function weightCases(): ConformanceCase[] {
  return [...matmulCases(), ...prefillTileCases(), ...matmulIdCases(), ...embeddingCases()];
}
