/**
 * Elementwise kernels: one thread per output element over strided operands (views, broadcast views
 * with stride 0), the loop index decomposed by the output's shape. The op, the dtypes and the rank
 * are folded in at generation; sizes, strides and scalars are kernel parameters (so one kernel serves
 * every shape of its rank). Two families: `map` (operands converted to f32, an f32 expression, the
 * result converted to the output dtype) and `move` (bits copied, any dtype: copy, slice, set, concat,
 * upsample through a broadcast view).
 *
 * Formulas: silu x·σ(x) (Elfwing et al. 2018); GELU ½x(1 + erf(x/√2)) and its tanh form
 * (Hendrycks & Gimpel 2016); softplus log(1 + e^x), x above 20 (ggml_softplus).
 */
import { TpError } from "@tp/tensor";
import { f32Imm, KernelBuilder as KB, type KernelBuilder, type KernelSource } from "./emit.ts";

/** Float dtypes the kernels read and write (converted to f32 inside). */
export type FloatDtype = "f32" | "f16" | "bf16";

/** Bytes of a float dtype. */
export function floatBytes(d: FloatDtype): number {
  return d === "f32" ? 4 : 2;
}

/** Load one element of `dtype` at `addr` as f32. */
export function loadF32(kb: KernelBuilder, addr: string, dtype: FloatDtype, space = "global"): string {
  const f = kb.reg("f32");
  if (dtype === "f32") kb.op(`ld.${space}.f32 ${f}, [${addr}];`);
  else if (dtype === "f16") {
    const h = kb.reg("b16");
    kb.op(`ld.${space}.b16 ${h}, [${addr}];`, `cvt.f32.f16 ${f}, ${h};`);
  } else {
    const r = kb.reg("b32");
    kb.op(`ld.${space}.u16 ${r}, [${addr}];`, `shl.b32 ${r}, ${r}, 16;`, `mov.b32 ${f}, ${r};`);
  }
  return f;
}

/** Largest finite value of each float dtype (for saturating casts). */
const FLOAT_MAX: Record<FloatDtype, number> = {
  f32: 3.4028234663852886e38,
  f16: 65504,
  bf16: 3.3895313892515355e38,
};

/** Store f32 `v` at `addr` as `dtype` (round to nearest even; `saturate` clamps to ±max, NaN kept). */
export function storeF32(
  kb: KernelBuilder,
  addr: string,
  v: string,
  dtype: FloatDtype,
  saturate = false,
): void {
  let x = v;
  if (saturate && dtype !== "f32") {
    x = kb.reg("f32");
    const m = f32Imm(FLOAT_MAX[dtype]);
    const nm = f32Imm(-FLOAT_MAX[dtype]);
    kb.op(`min.NaN.f32 ${x}, ${v}, ${m};`, `max.NaN.f32 ${x}, ${x}, ${nm};`);
  }
  if (dtype === "f32") kb.op(`st.global.f32 [${addr}], ${x};`);
  else {
    const h = kb.reg("b16");
    kb.op(`cvt.rn.${dtype}.f32 ${h}, ${x};`, `st.global.b16 [${addr}], ${h};`);
  }
}

/** The f32 expressions of the map kernels, by name, and how many operands each takes. */
export const MAP_OPS = {
  silu: 1,
  gelu: 1,
  gelu_tanh: 1,
  sigmoid: 1,
  softplus: 1,
  scale: 1,
  cast: 1,
  add: 2,
  sub: 2,
  mul: 2,
  swiglu: 2,
  modulate: 3,
} as const;

/** A map op name. */
export type MapOp = keyof typeof MAP_OPS;

/** The f32 result of `op` on `xs` (scalar `s` for scale). */
function expression(kb: KernelBuilder, op: MapOp, xs: string[], s: string | null): string {
  const [a, b, c] = xs as [string, string, string];
  const r = kb.reg("f32");
  switch (op) {
    case "silu": {
      const sa = kb.sigmoid(a);
      kb.op(`mul.rn.f32 ${r}, ${a}, ${sa};`);
      return r;
    }
    case "sigmoid":
      return kb.sigmoid(a);
    case "gelu": {
      const t = kb.reg("f32");
      kb.op(`mul.rn.f32 ${t}, ${a}, ${f32Imm(Math.SQRT1_2)};`);
      const e = kb.erf(t);
      kb.op(
        `add.f32 ${e}, ${e}, 0f3F800000;`,
        `mul.rn.f32 ${r}, ${a}, 0f3F000000;`,
        `mul.rn.f32 ${r}, ${r}, ${e};`,
      );
      return r;
    }
    case "gelu_tanh": {
      const t = kb.reg("f32");
      kb.op(
        `mul.rn.f32 ${t}, ${a}, ${a};`,
        `mul.rn.f32 ${t}, ${t}, ${a};`,
        `fma.rn.f32 ${t}, ${t}, ${f32Imm(0.044715)}, ${a};`,
        `mul.rn.f32 ${t}, ${t}, ${f32Imm(Math.sqrt(2 / Math.PI))};`,
      );
      const th = kb.tanh(t);
      kb.op(
        `add.f32 ${th}, ${th}, 0f3F800000;`,
        `mul.rn.f32 ${r}, ${a}, 0f3F000000;`,
        `mul.rn.f32 ${r}, ${r}, ${th};`,
      );
      return r;
    }
    case "softplus": {
      const p = kb.reg("pred");
      const l = kb.log1p(kb.exp(a));
      kb.op(`setp.gt.f32 ${p}, ${a}, 0f41A00000;`, `selp.f32 ${r}, ${a}, ${l}, ${p};`);
      return r;
    }
    case "scale":
      kb.op(`mul.rn.f32 ${r}, ${a}, ${s};`);
      return r;
    case "cast":
      return a;
    case "add":
      kb.op(`add.rn.f32 ${r}, ${a}, ${b};`);
      return r;
    case "sub":
      kb.op(`sub.rn.f32 ${r}, ${a}, ${b};`);
      return r;
    case "mul":
      kb.op(`mul.rn.f32 ${r}, ${a}, ${b};`);
      return r;
    case "swiglu": {
      const sa = kb.sigmoid(a);
      kb.op(`mul.rn.f32 ${r}, ${a}, ${sa};`, `mul.rn.f32 ${r}, ${r}, ${b};`);
      return r;
    }
    case "modulate":
      kb.op(
        `add.rn.f32 ${r}, ${b}, 0f3F800000;`,
        `mul.rn.f32 ${r}, ${a}, ${r};`,
        `add.rn.f32 ${r}, ${r}, ${c};`,
      );
      return r;
  }
}

/** Threads per block of the elementwise kernels. */
export const ELEMENTWISE_BLOCK = 256;

/**
 * Decompose the thread's linear index over `rank` sizes into an element offset per operand.
 * Emits the bounds check (threads past n jump to `end`, to be placed after the body). Parameters, in
 * order: n, sizes[rank], then strides[rank] per strided operand. Returns the offsets (32-bit).
 */
export function stridedOffsets(
  kb: KernelBuilder,
  rank: number,
  operands: number,
  contiguousFirst: boolean,
): { offs: string[]; end: string } {
  const i = kb.globalIndex();
  const n = kb.ld("n", "u32");
  const p = kb.reg("pred");
  const end = kb.label("end");
  kb.op(`setp.ge.u32 ${p}, ${i}, ${n};`, `@${p} bra ${end};`);
  const sizes = Array.from({ length: rank }, (_, d) => kb.ld(`size${d}`, "u32"));
  const strides = Array.from({ length: operands }, (_, k) =>
    contiguousFirst && k === 0 ? [] : Array.from({ length: rank }, (_, d) => kb.ld(`stride${k}_${d}`, "u32")),
  );
  const offs = Array.from({ length: operands }, (_, k) => (contiguousFirst && k === 0 ? i : kb.reg("b32")));
  for (let k = 0; k < operands; k++) if (!(contiguousFirst && k === 0)) kb.op(`mov.u32 ${offs[k]}, 0;`);
  const rem = kb.reg("b32");
  const q = kb.reg("b32");
  const c = kb.reg("b32");
  kb.op(`mov.u32 ${rem}, ${i};`);
  for (let d = rank - 1; d >= 0; d--) {
    if (d > 0)
      kb.op(
        `div.u32 ${q}, ${rem}, ${sizes[d]};`,
        `mul.lo.u32 ${c}, ${q}, ${sizes[d]};`,
        `sub.u32 ${c}, ${rem}, ${c};`,
        `mov.u32 ${rem}, ${q};`,
      );
    else kb.op(`mov.u32 ${c}, ${rem};`);
    for (let k = 0; k < operands; k++) {
      const st = strides[k]?.[d];
      if (st !== undefined) kb.op(`mad.lo.u32 ${offs[k]}, ${c}, ${st}, ${offs[k]};`);
    }
  }
  return { offs, end };
}

/** What a map kernel computes: the op, operand and output dtypes, rank, and whether out is strided. */
export interface MapSpec {
  readonly op: MapOp;
  readonly inputs: readonly FloatDtype[];
  readonly out: FloatDtype;
  /** Rank of the (merged) iteration shape, 1..8. */
  readonly rank: number;
  /** The output is a strided view too (else contiguous: the offset is the index). */
  readonly outStrided?: boolean;
  /** Casts: clamp to the output's finite range. */
  readonly saturate?: boolean;
}

/** The entry name of a map kernel. */
export function mapKernelName(s: MapSpec): string {
  return `map_${s.op}_${s.inputs.join("_")}_to_${s.out}_r${s.rank}${s.outStrided ? "_so" : ""}${s.saturate ? "_sat" : ""}`;
}

/**
 * A map kernel. Parameters: out, inputs…, n, size0..size{rank−1}, strides of out (when strided) then
 * of each input, [s (scale)]. Offsets are element offsets from each pointer (the host adds the view
 * offset to the pointer).
 */
export function mapKernel(s: MapSpec): KernelSource {
  if (s.inputs.length !== MAP_OPS[s.op])
    throw new TpError("E_INTERNAL", `map ${s.op} takes ${MAP_OPS[s.op]} operands`);
  if (!Number.isInteger(s.rank) || s.rank < 1 || s.rank > 8)
    throw new TpError("E_INTERNAL", `map rank ${s.rank}`);
  const kb = new KB(mapKernelName(s));
  const out = kb.ld("out", "u64");
  const ins = s.inputs.map((_, k) => kb.ld(`in${k}`, "u64"));
  const { offs, end } = stridedOffsets(kb, s.rank, 1 + ins.length, !s.outStrided);
  const sc = s.op === "scale" ? kb.ld("s", "f32") : null;
  const xs = ins.map((base, k) =>
    loadF32(
      kb,
      kb.addr(base, offs[k + 1] as string, floatBytes(s.inputs[k] as FloatDtype)),
      s.inputs[k] as FloatDtype,
    ),
  );
  const r = expression(kb, s.op, xs, sc);
  storeF32(kb, kb.addr(out, offs[0] as string, floatBytes(s.out)), r, s.out, s.saturate === true);
  kb.place(end);
  return kb.build([ELEMENTWISE_BLOCK, 1]);
}

/** A move (bit copy) kernel of `bytes`-wide elements: out[strided or contiguous] ← in[strided]. */
export interface MoveSpec {
  readonly bytes: 1 | 2 | 4 | 8;
  readonly rank: number;
  readonly outStrided?: boolean;
}

export function moveKernelName(s: MoveSpec): string {
  return `move_b${s.bytes * 8}_r${s.rank}${s.outStrided ? "_so" : ""}`;
}

/** A move kernel. Parameters: out, in, n, sizes, strides of out (when strided), strides of in. */
export function moveKernel(s: MoveSpec): KernelSource {
  const kb = new KB(moveKernelName(s));
  const out = kb.ld("out", "u64");
  const src = kb.ld("in0", "u64");
  const { offs, end } = stridedOffsets(kb, s.rank, 2, !s.outStrided);
  const t = s.bytes === 8 ? "b64" : s.bytes === 2 ? "b16" : "b32";
  const v = kb.reg(t);
  const ty = s.bytes === 1 ? "u8" : `b${s.bytes * 8}`;
  const srcAt = kb.addr(src, offs[1] as string, s.bytes);
  kb.op(`ld.global.${ty} ${v}, [${srcAt}];`);
  const outAt = kb.addr(out, offs[0] as string, s.bytes);
  kb.op(`st.global.${ty} [${outAt}], ${v};`);
  kb.place(end);
  return kb.build([ELEMENTWISE_BLOCK, 1]);
}

/**
 * count_nonfinite over a contiguous f32 array: each warp counts its NaN / ±∞ lanes with a ballot and
 * one lane adds the count to out (u32, zeroed by the host first). Parameters: out, in, n.
 */
export function countNonFiniteKernel(): KernelSource {
  const kb = new KB("count_nonfinite_f32");
  const out = kb.ld("out", "u64");
  const src = kb.ld("in0", "u64");
  const n = kb.ld("n", "u32");
  const i = kb.globalIndex();
  const inb = kb.reg("pred");
  const bad = kb.reg("pred");
  const x = kb.reg("b32");
  const bits = kb.reg("b32");
  const cnt = kb.reg("b32");
  const lane = kb.reg("b32");
  const lead = kb.reg("pred");
  const skip = kb.label("skip");
  const srcAt = kb.addr(src, i, 4);
  kb.op(
    `setp.lt.u32 ${inb}, ${i}, ${n};`,
    `mov.u32 ${x}, 0;`,
    `@${inb} ld.global.b32 ${x}, [${srcAt}];`,
    // exponent all ones: NaN or ±∞ (IEEE 754)
    `and.b32 ${bits}, ${x}, 2139095040;`,
    `setp.eq.u32 ${bad}, ${bits}, 2139095040;`,
    `and.pred ${bad}, ${bad}, ${inb};`,
    `vote.sync.ballot.b32 ${cnt}, ${bad}, -1;`,
    `popc.b32 ${cnt}, ${cnt};`,
    `mov.u32 ${lane}, %laneid;`,
    `setp.eq.u32 ${lead}, ${lane}, 0;`,
    `setp.ne.and.u32 ${lead}, ${cnt}, 0, ${lead};`,
    `@!${lead} bra ${skip};`,
    `red.global.add.u32 [${out}], ${cnt};`,
  );
  kb.place(skip);
  return kb.build([ELEMENTWISE_BLOCK, 1]);
}
