// A seeded differential fuzz of the ptx kernels on the PTX simulator (sm_86) against the cpu backend:
// every op of the Backend interface the ptx backend has, on random shapes (odd sizes around powers of
// two, size-1 dimensions), broadcast / transposed / sliced / stepped / offset views, and edge inputs
// (ties, NaN, ids out of range). The simulator checks every global and shared access against live
// allocations and alignment, so an E_INTERNAL from it is a kernel bug (on a GPU it would corrupt
// memory or fault silently). Shapes a kernel cannot take must be refused with one TpError
// (E_UNSUPPORTED / E_SHAPE / E_ARG naming the op), never a simulator fault.
//
// Reproduce a failure: TP_FUZZ_SEED=<seed printed in the failure> bun test src/sim-fuzz.test.ts
// (TP_FUZZ_CASES scales the case count per op family; the default fits ~60 s on two cores;
// TP_FUZZ_SM=sm_80 / sm_89 / sm_90 simulates another device).
//
// Tolerances: those of packages/conformance/src/tolerances.ts (conformance sits above this package,
// so the values are restated here with their reasons), compared against the cpu backend rather than an
// f64 reference — both backends sit inside them of the reference, so the bound between them is taken
// twice as wide for the "close" ones.
import { afterAll, describe, expect, test } from "bun:test";
import { createBackend as createCpu } from "@tp/backend-cpu";
import {
  type Backend,
  bf16ToF32,
  type DTypeName,
  dtypeBytes,
  encodeFromF32,
  f16ToF32,
  f32ToF16,
  type HostArray,
  type Tensor,
  TpError,
  Weight,
  type WeightFormat,
  type WeightScale,
  weightBytes,
  weightFormatInfo,
} from "@tp/tensor";
import { createBackend } from "./index.ts";
import { MATMUL_FORMATS as CATALOGUE_MATMUL_FORMATS } from "./ptx/catalogue.ts";

const SEED = Number(process.env.TP_FUZZ_SEED ?? 20261202) >>> 0;
const SCALE = Number(process.env.TP_FUZZ_CASES ?? 1);

// ------------------------------------------------------------------ tolerances

type Tolerance =
  | { kind: "exact" }
  | { kind: "close"; atol: number; rtol: number }
  | { kind: "nmse"; max: number };
const EXACT: Tolerance = { kind: "exact" };
/** conformance SIGMOID_FAMILY (f32 exp, a few ulp) ×2: two backends each within it of f64. */
const SIGMOID_FAMILY: Tolerance = { kind: "close", atol: 2e-7, rtol: 8e-6 };
/** conformance GELU ×2. */
const GELU: Tolerance = { kind: "close", atol: 2e-6, rtol: 8e-6 };
/** conformance SOFTPLUS ×2. */
const SOFTPLUS: Tolerance = { kind: "close", atol: 2e-7, rtol: 8e-6 };
/** conformance MODULATE ×2. */
const MODULATE: Tolerance = { kind: "close", atol: 2e-6, rtol: 2e-6 };
/** conformance SOFTMAX ×2 (rows here reach 1025 terms, as the conformance bound's 1000). */
const SOFTMAX: Tolerance = { kind: "close", atol: 2e-8, rtol: 1e-5 };
/** conformance NORM ×2. */
const NORM: Tolerance = { kind: "close", atol: 2e-6, rtol: 1e-5 };
/** conformance ROPE ×2 (positions here stay below 4e4, the conformance bound's angles). */
const ROPE: Tolerance = { kind: "close", atol: 4e-6, rtol: 4e-6 };
/** conformance ATTENTION (nmse 1e-7 of f64); between two f32 backends it is the same order. */
const ATTENTION: Tolerance = { kind: "nmse", max: 4e-7 };
/** conformance CONV2D. */
const CONV2D: Tolerance = { kind: "nmse", max: 4e-7 };
/**
 * conformance MATMUL (llama.cpp's 5e-4 for mul_mat) — the bf16 / fp8 / Q8 activation rounding of
 * each backend against f64; both are within it, so the difference is too (nmse of a difference of two
 * errors each ≤ 5e-4 is ≤ 2e-3).
 */
const MATMUL: Tolerance = { kind: "nmse", max: 2e-3 };
/**
 * The opt-in fp8 W8A8 matmul (x rounded per row to e4m3, 3 mantissa bits): the README measures NMSE
 * ≈ 6.5e-4 against the f32-x product on Gaussian x — over the conformance bound, hence opt-in; 3× that.
 */
const MATMUL_FP8_W8A8: Tolerance = { kind: "nmse", max: 2e-3 };
/** f32 matmul: no activation rounding, sums of K ≤ 1025 products in different orders. */
const MATMUL_F32: Tolerance = { kind: "nmse", max: 1e-9 };
/** conformance EMBEDDING ×2 (one or two f32 roundings per dequantized value). */
const EMBEDDING: Tolerance = { kind: "close", atol: 0, rtol: 2e-6 };
/** conformance SSM_CONV ×2. */
const SSM_CONV: Tolerance = { kind: "close", atol: 2e-6, rtol: 2e-5 };
/** conformance DELTA_NET ×4 (two f32 recurrences, each within 1e-9 of f64). */
const DELTA_NET: Tolerance = { kind: "nmse", max: 4e-9 };

/**
 * A "close" tolerance for an f16 / bf16 output: the two backends' f32 values, each within `t`, may
 * round to neighbouring codes, so one ulp of the output dtype more (relative 2^-10 for f16, 2^-7 for
 * bf16; f16's smallest subnormal 2^-24 absolute).
 */
function inDtype(t: Tolerance, dtype: DTypeName): Tolerance {
  if (t.kind !== "close" || dtype === "f32") return t;
  return dtype === "f16"
    ? { kind: "close", atol: t.atol + 2 ** -24, rtol: t.rtol + 2 ** -10 }
    : { kind: "close", atol: t.atol, rtol: t.rtol + 2 ** -7 };
}

// ------------------------------------------------------------------ seeded data

/** mulberry32 (Tommy Ettinger 2017). */
function rng(seed: number) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const r = {
    next,
    int: (lo: number, hi: number) => lo + Math.floor(next() * (hi - lo + 1)),
    pick: <T>(xs: readonly T[]): T => xs[Math.floor(next() * xs.length)] as T,
    chance: (p: number) => next() < p,
    normal(n: number, sigma = 1): Float32Array {
      const out = new Float32Array(n);
      for (let i = 0; i < n; i++) {
        const u = 1 - next();
        out[i] = sigma * Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * next());
      }
      return out;
    },
  };
  return r;
}
type Rng = ReturnType<typeof rng>;

/** Sizes around the kernels' boundaries (warps, blocks, tiles). */
const ODD = [1, 2, 3, 7, 31, 32, 33, 63, 64, 65, 127, 255, 256, 257];
const ODD_LONG = [...ODD, 1023, 1024, 1025];

// ------------------------------------------------------------------ inputs as views

/** One input: the bytes of a base tensor and how the op's operand is viewed from it. */
interface Input {
  readonly dtype: DTypeName;
  readonly base: readonly number[];
  readonly data: HostArray;
  readonly view: (t: Tensor) => Tensor;
  readonly label: string;
}

function floatData(r: Rng, n: number, dtype: DTypeName, sigma = 1, specials = false): HostArray {
  const v = r.normal(n, sigma);
  if (specials && n > 0)
    for (let i = 0; i < Math.max(1, n >> 6); i++)
      v[r.int(0, n - 1)] = r.pick([Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY, 0, -0]);
  if (dtype === "f32") return v;
  // fp8: every code (NaN, subnormals, the largest finite) as often as any other
  if (dtype === "f8_e4m3fn" || dtype === "f8_e5m2")
    return Uint8Array.from({ length: n }, () => r.int(0, 255));
  return encodeFromF32(v, dtype);
}

/** Row-major strides of `shape`. */
function rowMajor(shape: readonly number[]): number[] {
  const st: number[] = [];
  let s = 1;
  for (let d = shape.length - 1; d >= 0; d--) {
    st[d] = s;
    s *= shape[d] as number;
  }
  return st;
}

/**
 * The bytes of a base tensor [base] holding `values` (row-major over `shape`) at the elements of the
 * view (strides, offset in elements), every other byte 0x7f (3.4e38 as f32, an id far out of range as
 * i32: a kernel reading outside its view shows it).
 */
function scatter(
  values: HostArray,
  dtype: DTypeName,
  shape: readonly number[],
  base: readonly number[],
  strides: readonly number[],
  offset: number,
): Uint8Array {
  const eb = dtypeBytes(dtype);
  const src = new Uint8Array(values.buffer, values.byteOffset, values.byteLength);
  const out = new Uint8Array(base.reduce((a, b) => a * b, 1) * eb).fill(0x7f);
  const n = shape.reduce((a, b) => a * b, 1);
  const idx = new Array(shape.length).fill(0);
  for (let i = 0; i < n; i++) {
    let at = offset;
    for (let d = 0; d < shape.length; d++) at += (idx[d] as number) * (strides[d] as number);
    out.set(src.subarray(i * eb, (i + 1) * eb), at * eb);
    for (let d = shape.length - 1; d >= 0; d--) {
      idx[d]++;
      if (idx[d] < (shape[d] as number)) break;
      idx[d] = 0;
    }
  }
  return out;
}

/**
 * An operand of `shape` holding `gen(numel)` (row-major), laid out at random: contiguous, a
 * transposed base, a slice of a longer base, a stepped slice, or at an element offset into a larger
 * buffer. `plain` keeps it contiguous.
 */
function operand(
  r: Rng,
  shape: readonly number[],
  dtype: DTypeName = "f32",
  opts: {
    sigma?: number;
    specials?: boolean;
    /** Values for n elements (row-major); a generator that ignores n makes the operand never broadcast. */
    gen?: (n: number) => HostArray;
    /** `gen` honours its n: the operand may also be a broadcast view (stride 0) of a smaller base. */
    sized?: boolean;
    plain?: boolean;
  } = {},
): Input {
  const gen = opts.gen ?? ((n: number) => floatData(r, n, dtype, opts.sigma ?? 1, opts.specials ?? false));
  const numel = shape.reduce((a, b) => a * b, 1);
  const spread = shape.map((d, i) => (d > 1 ? i : -1)).filter((i) => i >= 0);
  if (!opts.plain && (opts.gen === undefined || opts.sized) && spread.length > 0 && r.chance(0.12)) {
    // a broadcast view: some dimensions of the base are 1, read with stride 0
    const base = shape.map((d, i) => (spread.includes(i) && r.chance(0.6) ? 1 : d));
    if (base.every((d, i) => d === shape[i])) base[spread[0] as number] = 1;
    return {
      dtype,
      base,
      data: gen(base.reduce((a, b) => a * b, 1)),
      view: (t) => t.broadcastTo([...shape]),
      label: `broadcast of [${base}]`,
    };
  }
  const values = gen(numel);
  const kind =
    opts.plain || numel === 0
      ? "contiguous"
      : r.pick(["contiguous", "transposed", "sliced", "stepped", "offset"]);
  const rank = shape.length;
  const make = (
    base: number[],
    strides: number[],
    offset: number,
    view: (t: Tensor) => Tensor,
    label: string,
  ) => ({
    dtype,
    base,
    data: scatter(values, dtype, shape, base, strides, offset),
    view,
    label,
  });
  if (kind === "transposed" && rank >= 2) {
    const a = r.int(0, rank - 2);
    const b = r.int(a + 1, rank - 1);
    const base = [...shape];
    [base[a], base[b]] = [base[b] as number, base[a] as number];
    const st = rowMajor(base);
    [st[a], st[b]] = [st[b] as number, st[a] as number];
    return make(base, st, 0, (t) => t.transpose(a, b), `transpose(${a},${b}) of [${base}]`);
  }
  if ((kind === "sliced" || kind === "stepped") && rank >= 1) {
    const d = r.int(0, rank - 1);
    const len = shape[d] as number;
    const base = [...shape];
    if (kind === "stepped") {
      base[d] = 2 * len;
      const st = rowMajor(base);
      st[d] = 2 * (st[d] as number);
      return make(
        base,
        st,
        0,
        (t) => t.slice(d, 0, 2 * len, 2),
        `slice(${d}, 0, ${2 * len}, 2) of [${base}]`,
      );
    }
    const pre = r.int(0, 3);
    base[d] = len + pre + r.int(0, 3);
    const st = rowMajor(base);
    return make(
      base,
      st,
      pre * (st[d] as number),
      (t) => t.slice(d, pre, pre + len),
      `slice(${d}, ${pre}, ${pre + len}) of [${base}]`,
    );
  }
  if (kind === "offset") {
    const off = r.int(1, 5);
    const strides = rowMajor(shape);
    return make(
      [numel + off],
      [...strides],
      off,
      (t) => t.view({ shape: [...shape], strides, offset: off }),
      `offset ${off} into [${numel + off}]`,
    );
  }
  return { dtype, base: [...shape], data: values, view: (t) => t, label: `[${shape}]` };
}

function plain(shape: readonly number[], dtype: DTypeName, data: HostArray): Input {
  return { dtype, base: [...shape], data, view: (t) => t, label: `[${shape}]` };
}

// ------------------------------------------------------------------ weights

/** Byte offsets of the f16 d (and min) fields per GGUF block (ggml-common.h block_q*). */
const BLOCK_SCALES: Partial<Record<WeightFormat, { d: number; min?: number }>> = {
  q8_0: { d: 0 },
  q4_0: { d: 0 },
  q4_1: { d: 0, min: 2 },
  q5_0: { d: 0 },
  q5_1: { d: 0, min: 2 },
  q2_k: { d: 80, min: 82 },
  q3_k: { d: 108 },
  q4_k: { d: 0, min: 2 },
  q5_k: { d: 0, min: 2 },
  q6_k: { d: 208 },
  iq4_nl: { d: 0 },
  iq4_xs: { d: 0 },
};

/**
 * A Weight [n, k] of `format` from random bytes: float formats from normal values, GGUF blocks of
 * random codes with sane f16 scales, ConvRot random codes with positive row scales. Both backends read
 * the same bytes, so no quantizer is needed.
 */
function makeWeight(r: Rng, format: WeightFormat, n: number, k: number, fp8Scale = false): Weight {
  let data: Uint8Array;
  let scale: WeightScale | undefined;
  let rotationGroup: number | undefined;
  const v = r.normal(n * k, 0.5);
  if (format === "f32") data = new Uint8Array(v.buffer);
  else if (format === "f16" || format === "bf16") data = encodeFromF32(v, format);
  else if (format === "f8_e4m3fn" || format === "f8_e5m2") {
    data = encodeFromF32(v, format, { saturate: true });
    if (fp8Scale) scale = { kind: "tensor", value: 0.25 + r.next() };
  } else if (format === "int8_convrot" || format === "int4_convrot") {
    data = Uint8Array.from({ length: weightBytes(format, [n, k]) }, () => r.int(0, 255));
    scale = { kind: "row", values: Float32Array.from({ length: n }, () => 0.001 + 0.01 * r.next()) };
    rotationGroup = k % 256 === 0 ? 256 : 64;
  } else {
    const layout = BLOCK_SCALES[format];
    if (layout === undefined) throw new Error(`no fuzz weights for ${format}`);
    const info = weightFormatInfo(format);
    data = Uint8Array.from({ length: weightBytes(format, [n, k]) }, () => r.int(0, 255));
    const put = (at: number, x: number) => {
      const h = f32ToF16(x);
      data[at] = h & 0xff;
      data[at + 1] = h >> 8;
    };
    for (let at = 0; at < data.length; at += info.blockBytes) {
      put(at + layout.d, 0.002 + 0.01 * r.next());
      if (layout.min !== undefined) put(at + layout.min, (format.endsWith("_1") ? -0.05 : 0.004) * r.next());
    }
  }
  return new Weight({
    name: `w_${format}`,
    format,
    shape: [n, k],
    data,
    ...(scale ? { scale } : {}),
    ...(rotationGroup ? { rotationGroup } : {}),
  });
}

// ------------------------------------------------------------------ running a case on both backends

interface Case {
  readonly name: string;
  readonly inputs: readonly Input[];
  readonly weights?: readonly Weight[];
  /** The op; returns the tensors to compare. */
  readonly call: (b: Backend, t: Tensor[], w: Weight[]) => Tensor | Tensor[];
  readonly tol: Tolerance | readonly Tolerance[];
  /**
   * Ids out of range: the cpu backend refuses them (E_ARG) and ptx gives rows of NaN (a queued kernel
   * cannot throw; backend.ts allows both). The cpu side then runs `reference` (the ids replaced by
   * valid ones) and rows `rows` of the first output (of `rowLen` values) must be NaN on ptx and are
   * left out of the comparison.
   */
  /** The ptx backend to run on (default: sm_86, default options). */
  readonly on?: Backend;
  readonly outOfRange?: {
    readonly reference: Case;
    readonly rows: readonly boolean[];
    readonly rowLen: number;
  };
}

/** The simulated device: sm_86 unless TP_FUZZ_SM names another (sm_80, sm_89, sm_90). */
const ptx = createBackend({ simulate: process.env.TP_FUZZ_SM ?? "sm_86" });
/** The opt-in fp8 W8A8 path (sm_89+, TP_PTX_FP8_MMA). */
const ptxFp8 = createBackend({ simulate: "sm_89", fp8Mma: true });
const cpu = createCpu();
afterAll(() => {
  ptx.dispose();
  ptxFp8.dispose();
  cpu.dispose();
});

function numbers(a: HostArray, dtype: DTypeName): Float64Array {
  const out = new Float64Array(a.length);
  for (let i = 0; i < a.length; i++) {
    const x = a[i] as number | bigint;
    out[i] = dtype === "f16" ? f16ToF32(x as number) : dtype === "bf16" ? bf16ToF32(x as number) : Number(x);
  }
  return out;
}

/** Why `got` (ptx) is not `want` (cpu) under `tol`, or null. */
function mismatch(got: Float64Array, want: Float64Array, tol: Tolerance): string | null {
  if (got.length !== want.length) return `length ${got.length} vs ${want.length}`;
  if (tol.kind === "nmse") {
    let num = 0;
    let den = 0;
    for (let i = 0; i < got.length; i++) {
      const g = got[i] as number;
      const w = want[i] as number;
      if (Number.isNaN(w) !== Number.isNaN(g)) return `[${i}] ${g} vs ${w} (NaN on one side only)`;
      if (Number.isNaN(w)) continue;
      num += (g - w) ** 2;
      den += w * w;
    }
    const e = den === 0 ? num : num / den;
    return e <= tol.max ? null : `nmse ${e.toExponential(3)} > ${tol.max}`;
  }
  let bad = 0;
  let first = "";
  for (let i = 0; i < got.length; i++) {
    const g = got[i] as number;
    const w = want[i] as number;
    const ok =
      (Number.isNaN(g) && Number.isNaN(w)) ||
      g === w ||
      (tol.kind === "close" && Math.abs(g - w) <= tol.atol + tol.rtol * Math.abs(w));
    if (!ok) {
      if (bad === 0) first = `[${i}] ptx ${g} vs cpu ${w}`;
      bad++;
    }
  }
  return bad === 0 ? null : `${bad}/${got.length} differ, first ${first}`;
}

type Outcome =
  | { ok: true; values: { dtype: DTypeName; data: Float64Array }[] }
  | { ok: false; error: unknown };

async function runOn(b: Backend, c: Case): Promise<Outcome> {
  let outs: Tensor[];
  try {
    outs = b.scope(() => {
      let ts: Tensor[];
      try {
        ts = c.inputs.map((i) => i.view(b.upload(i.data, i.base, i.dtype)));
      } catch (e) {
        throw new Error(`test setup (upload / view) failed: ${describeError(e)}`);
      }
      const o = c.call(b, ts, [...(c.weights ?? [])]);
      return Array.isArray(o) ? o : [o];
    });
  } catch (error) {
    return { ok: false, error };
  }
  try {
    const values = [];
    for (const t of outs) values.push({ dtype: t.dtype, data: numbers(await b.read(t), t.dtype) });
    return { ok: true, values };
  } catch (error) {
    return { ok: false, error };
  } finally {
    for (const t of outs) b.free(t);
  }
}

const describeError = (e: unknown) =>
  e instanceof TpError ? `${e.code}: ${e.message}` : `${(e as Error)?.stack ?? String(e)}`;

/**
 * Run `c` on both backends: null when they agree (or both refuse, or ptx refuses with a clear
 * E_UNSUPPORTED naming the op — recorded in `refusals`, or a failure when `refusals` is null), else
 * what went wrong.
 */
async function check(c: Case, refusals: string[] | null): Promise<string | null> {
  const [p, q] = [await runOn(c.on ?? ptx, c), await runOn(cpu, c.outOfRange?.reference ?? c)];
  const where = `${c.name} [inputs ${c.inputs.map((i) => i.label).join("; ")}]`;
  if (!p.ok) {
    const e = p.error;
    if (!(e instanceof TpError)) return `${where}: ptx threw a non-TpError: ${describeError(e)}`;
    if (e.code === "E_INTERNAL") return `${where}: ptx E_INTERNAL (kernel bug): ${e.message}`;
    if (q.ok && e.code !== "E_UNSUPPORTED")
      return `${where}: ptx refused (${describeError(e)}) what cpu runs`;
    const op = c.name.split(" ")[0] as string;
    if (q.ok && !e.message.includes(op)) return `${where}: ptx's refusal does not name ${op}: ${e.message}`;
    if (q.ok && refusals === null) return `${where}: ptx refused what cpu runs: ${e.message}`;
    if (q.ok) refusals?.push(`${c.name}: ${e.message}`);
    return null;
  }
  const oob = c.outOfRange;
  if (oob && q.ok) {
    const got = (p.values[0] as { data: Float64Array }).data;
    const want = (q.values[0] as { data: Float64Array }).data;
    for (let r = 0; r < oob.rows.length; r++) {
      if (!oob.rows[r]) continue;
      for (let j = r * oob.rowLen; j < (r + 1) * oob.rowLen; j++) {
        if (!Number.isNaN(got[j] as number))
          return `${where}: row ${r} (id out of range) is not NaN on ptx: [${j}] = ${got[j]}`;
        want[j] = Number.NaN;
      }
    }
  }
  if (!q.ok) {
    const e = q.error;
    if (e instanceof TpError && e.code !== "E_INTERNAL") return null; // both refuse (front-end checks)
    return `${where}: cpu failed: ${describeError(e)}`;
  }
  const tols = Array.isArray(c.tol) ? c.tol : [c.tol];
  for (let i = 0; i < p.values.length; i++) {
    const pv = p.values[i] as { data: Float64Array };
    const qv = q.values[i] as { data: Float64Array };
    const m = mismatch(pv.data, qv.data, (tols[i] ?? tols[0]) as Tolerance);
    if (m !== null) return `${where}: output ${i}: ${m}`;
  }
  return null;
}

/** Fuzz one op family: `count` cases from `make`, each with its own seed (printed on failure). */
function fuzz(family: string, count: number, make: (r: Rng, i: number) => Case): void {
  test(family, async () => {
    const failures: string[] = [];
    const refusals: string[] = [];
    const n = Math.max(1, Math.round(count * SCALE));
    for (let i = 0; i < n; i++) {
      const seed = (SEED ^ Math.imul(hash(family), 0x9e3779b1) ^ Math.imul(i + 1, 0x85ebca6b)) >>> 0;
      let c: Case;
      try {
        c = make(rng(seed), i);
      } catch (e) {
        failures.push(`case ${i}: generator: ${describeError(e)}`);
        continue;
      }
      const f = await check(c, refusals);
      if (f !== null) failures.push(`TP_FUZZ_SEED=${SEED} case ${i} (seed ${seed}): ${f}`);
    }
    if (refusals.length > 0 && process.env.TP_FUZZ_VERBOSE)
      console.log(`${family}: ${refusals.length} refusals\n${refusals.join("\n")}`);
    expect(failures).toEqual([]);
  }, 120_000);
}

function hash(s: string): number {
  let h = 2166136261;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 16777619);
  return h >>> 0;
}

/** Random shape of rank 1..4 with dimensions from `sizes`, at most `cap` elements. */
function shapeOf(r: Rng, sizes: readonly number[], cap = 4096, minRank = 1, maxRank = 4): number[] {
  for (;;) {
    const rank = r.int(minRank, maxRank);
    const s = Array.from({ length: rank }, () => (r.chance(0.3) ? r.int(1, 5) : r.pick(sizes)));
    if (r.chance(0.04)) s[r.int(0, rank - 1)] = 0; // an empty tensor now and then
    if (s.reduce((a, b) => a * b, 1) <= cap) return s;
  }
}

// ------------------------------------------------------------------ the families

describe(`ptx on the simulator (${process.env.TP_FUZZ_SM ?? "sm_86"}) vs cpu (seed ${SEED})`, () => {
  const FLOAT_DTYPES: DTypeName[] = ["f32", "f16", "bf16"];

  fuzz("unary elementwise (silu, gelu, sigmoid, softplus, scale)", 48, (r) => {
    const op = r.pick(["silu", "gelu", "gelu_tanh", "sigmoid", "softplus", "scale"] as const);
    const shape = shapeOf(r, ODD_LONG);
    const dtype = r.pick(FLOAT_DTYPES);
    const s = r.normal(1)[0] as number;
    return {
      name: `${op} ${dtype} [${shape}]`,
      inputs: [operand(r, shape, dtype, { sigma: 3, specials: true })],
      call: (b, [x]) => {
        const t = x as Tensor;
        if (op === "silu") return b.silu(t);
        if (op === "gelu") return b.gelu(t);
        if (op === "gelu_tanh") return b.gelu(t, { approximate: "tanh" });
        if (op === "sigmoid") return b.sigmoid(t);
        if (op === "softplus") return b.softplus(t);
        return b.scale(t, s);
      },
      tol: inDtype(
        op === "scale" ? EXACT : op === "softplus" ? SOFTPLUS : op.startsWith("gelu") ? GELU : SIGMOID_FAMILY,
        dtype,
      ),
    };
  });

  fuzz("binary elementwise with broadcast (add, sub, mul, swiglu, modulate)", 60, (r) => {
    const op = r.pick(["add", "sub", "mul", "swiglu", "modulate"] as const);
    const shape = shapeOf(r, ODD, 4096, 1, 4);
    const dtype = r.pick(FLOAT_DTYPES);
    // b broadcast: size-1 dims, or fewer leading dims
    const bcast = (): number[] => {
      if (op === "swiglu") return [...shape];
      const drop = r.int(0, shape.length - 1);
      return shape.slice(drop).map((d) => (r.chance(0.4) ? 1 : d));
    };
    const bs = bcast();
    const inputs = [operand(r, shape, dtype, { specials: op !== "modulate" }), operand(r, bs, dtype)];
    if (op === "modulate") inputs.push(operand(r, bcast(), dtype));
    const swap = op !== "modulate" && op !== "swiglu" && r.chance(0.3);
    return {
      name: `${op} ${dtype} [${swap ? bs : shape}] ∘ [${swap ? shape : bs}]`,
      inputs: swap ? [inputs[1] as Input, inputs[0] as Input] : inputs,
      call: (b, [x, y, z]) => {
        const [p, q] = [x as Tensor, y as Tensor];
        if (op === "add") return b.add(p, q);
        if (op === "sub") return b.sub(p, q);
        if (op === "mul") return b.mul(p, q);
        if (op === "swiglu") return b.swiglu(p, q);
        return b.modulate(p, q, z as Tensor);
      },
      tol: inDtype(op === "swiglu" ? SIGMOID_FAMILY : op === "modulate" ? MODULATE : EXACT, dtype),
    };
  });

  fuzz("norms (rms_norm, layer_norm, group_norm)", 40, (r) => {
    const op = r.pick(["rms", "rms_unit", "rms_none", "ln", "ln_none", "gn"] as const);
    if (op === "gn") {
      const groups = r.pick([1, 2, 3, 4]);
      const channels = groups * r.int(1, 5);
      const shape = [r.int(1, 2), channels, ...shapeOf(r, [1, 3, 7, 16, 33], 600, 0, 2)];
      const affine = r.chance(0.6);
      return {
        name: `group_norm groups ${groups} [${shape}] affine ${affine}`,
        inputs: [operand(r, shape, "f32", { sigma: 2 }), operand(r, [channels]), operand(r, [channels])],
        call: (b, [x, w, bias]) =>
          b.groupNorm(x as Tensor, groups, affine ? (w as Tensor) : null, affine ? (bias as Tensor) : null, {
            eps: 1e-5,
          }),
        tol: NORM,
      };
    }
    const d = r.pick([...ODD_LONG, 4095, 4097]);
    const shape = [...shapeOf(r, [1, 2, 3, 5], 16, 0, 2), d];
    const inputs = [operand(r, shape, "f32", { sigma: 2 }), operand(r, [d]), operand(r, [d])];
    return {
      name: `${op} [${shape}]`,
      inputs,
      call: (b, [x, w, bias]) => {
        const t = x as Tensor;
        if (op === "rms") return b.rmsNorm(t, w as Tensor, { eps: 1e-6 });
        if (op === "rms_unit") return b.rmsNorm(t, w as Tensor, { eps: 1e-6, unitOffset: true });
        if (op === "rms_none") return b.rmsNorm(t, null, { eps: 1e-6 });
        if (op === "ln") return b.layerNorm(t, w as Tensor, bias as Tensor, { eps: 1e-5 });
        return b.layerNorm(t, null, null, { eps: 1e-5 });
      },
      tol: NORM,
    };
  });

  fuzz("softmax along every dim", 30, (r) => {
    const shape = shapeOf(r, ODD_LONG, 4096, 1, 4);
    const dim = r.int(-shape.length, shape.length - 1);
    return {
      name: `softmax dim ${dim} [${shape}]`,
      inputs: [operand(r, shape, "f32", { sigma: 4 })],
      call: (b, [x]) => b.softmax(x as Tensor, { dim }),
      tol: SOFTMAX,
    };
  });

  fuzz("rope (neox, interleaved, partial, sections, freqScale)", 40, (r) => {
    const mode = r.pick(["neox", "interleaved"] as const);
    const headDim = 2 * r.pick([1, 2, 4, 8, 16, 32, 33, 64]);
    const seq = r.pick([1, 2, 7, 17, 33]);
    const heads = r.int(1, 4);
    const batch = r.int(1, 2);
    const ropeDims = r.chance(0.3) ? 2 * r.int(1, headDim / 2) : headDim;
    const useSections = r.chance(0.3) && ropeDims / 2 >= 2;
    let sections: number[] | undefined;
    if (useSections) {
      const pairs = ropeDims / 2;
      const a = r.int(1, pairs - 1);
      sections = a < pairs - 1 && r.chance(0.5) ? [a, 1, pairs - a - 1] : [a, pairs - a];
    }
    const axes = sections?.length ?? 0;
    const posShape = axes > 0 ? [axes, seq] : [seq];
    const pos = Int32Array.from({ length: posShape.reduce((x, y) => x * y, 1) }, () => r.int(0, 4000));
    const theta = r.pick([10000, 1e6, 500]);
    const freqScale = r.chance(0.3) ? 0.25 : 1;
    const shape = [batch, seq, heads, headDim];
    return {
      name: `rope ${mode} [${shape}] ropeDims ${ropeDims} sections ${sections ?? "-"} theta ${theta} freqScale ${freqScale}`,
      inputs: [operand(r, shape), operand(r, posShape, "i32", { gen: () => pos })],
      call: (b, [x, p]) =>
        b.rope(x as Tensor, p as Tensor, {
          mode,
          theta,
          ropeDims,
          freqScale,
          ...(sections ? { sections } : {}),
        }),
      tol: ROPE,
    };
  });

  fuzz("attention (GQA, causal with offsets, windows, prefix, softcap)", 32, (r) => {
    const kvHeads = r.int(1, 3);
    const heads = kvHeads * r.pick([1, 2, 3]);
    const batch = r.int(1, 2);
    const headDim = r.pick([1, 7, 16, 32, 33, 64, 80, 128, 256]);
    const headDimV = r.chance(0.2) ? r.pick([8, 33, 64]) : headDim;
    const sq = r.pick([1, 2, 5, 17, 33]);
    const skv = r.chance(0.3) ? sq : r.pick([1, 3, 31, 33, 65, 130, 257]);
    const causal = r.chance(0.6);
    const opts: Record<string, number | boolean> = { causal };
    if (r.chance(0.5)) opts.qOffset = r.int(0, Math.max(0, skv - 1));
    if (causal && r.chance(0.3)) opts.window = r.int(1, 40);
    if (r.chance(0.2)) opts.fullPrefix = r.int(0, skv);
    if (r.chance(0.3)) opts.softcap = r.pick([5, 30, 50]);
    if (r.chance(0.3)) opts.scale = 0.05 + r.next();
    return {
      name: `attention b ${batch} h ${heads}/${kvHeads} sq ${sq} skv ${skv} d ${headDim}/${headDimV} ${JSON.stringify(opts)}`,
      inputs: [
        operand(r, [batch, heads, sq, headDim], "f32", { sigma: r.pick([0.3, 1, 3]) }),
        operand(r, [batch, kvHeads, skv, headDim]),
        operand(r, [batch, kvHeads, skv, headDimV]),
      ],
      call: (b, [q, k, v]) => b.attention(q as Tensor, k as Tensor, v as Tensor, opts),
      tol: ATTENTION,
    };
  });

  // every format the kernels take (ptx/catalogue.ts), so a new one is fuzzed without touching this file
  const MATMUL_FORMATS: readonly WeightFormat[] = CATALOGUE_MATMUL_FORMATS;
  const MS = [1, 2, 7, 8, 9, 15, 16, 17, 63, 64, 65, 130];
  /** K for a format: ragged where the format allows (floats), else multiples of its block. */
  const kFor = (r: Rng, f: WeightFormat): number => {
    const info = weightFormatInfo(f);
    if (info.family === "convrot") return r.pick([64, 128, 256, 320, 512]);
    if (info.family === "ggml")
      return (info.blockElems as number) * r.int(1, info.blockElems === 256 ? 3 : 9);
    return r.pick([1, 7, 16, 31, 33, 64, 100, 255, 256, 257, 512, 1025]);
  };

  fuzz("matmul in every weight format, M across the kernel switches", 48, (r) => {
    const format = r.pick(MATMUL_FORMATS);
    const M = r.pick(MS);
    const K = kFor(r, format);
    const N = r.pick([1, 3, 8, 17, 31, 33, 64, 65, 130, 257]);
    const scaled = format === "f8_e4m3fn" && r.chance(0.5);
    const w = makeWeight(r, format, N, K, scaled);
    const bias = r.chance(0.4);
    const x3 = r.chance(0.3) && M % 2 === 0;
    const xShape = x3 ? [2, M / 2, K] : [M, K];
    return {
      name: `matmul ${format}${scaled ? " scaled" : ""} x [${xShape}] · w [${N}, ${K}]ᵀ${bias ? " + bias" : ""}`,
      inputs: [operand(r, xShape), operand(r, [N])],
      weights: [w],
      call: (b, [x, bb], [wt]) => b.matmul(x as Tensor, wt as Weight, bias ? { bias: bb as Tensor } : {}),
      tol: format === "f32" ? MATMUL_F32 : MATMUL,
    };
  });

  fuzz("matmul f8_e4m3fn as fp8 W8A8 (sm_89, fp8Mma)", 10, (r) => {
    const M = r.pick([15, 16, 17, 63, 64, 65, 130]);
    const K = r.pick([32, 64, 96, 256, 33, 255]);
    const N = r.pick([1, 8, 17, 64, 65, 130]);
    const scaled = r.chance(0.5);
    const w = makeWeight(r, "f8_e4m3fn", N, K, scaled);
    const bias = r.chance(0.4);
    return {
      name: `matmul f8_e4m3fn${scaled ? " scaled" : ""} W8A8 x [${M}, ${K}] · w [${N}, ${K}]ᵀ${bias ? " + bias" : ""}`,
      inputs: [operand(r, [M, K]), operand(r, [N])],
      weights: [w],
      on: ptxFp8,
      call: (b, [x, bb], [wt]) => b.matmul(x as Tensor, wt as Weight, bias ? { bias: bb as Tensor } : {}),
      tol: MATMUL_FP8_W8A8,
    };
  });

  fuzz("matmul_id with ids out of range", 24, (r) => {
    const format = r.pick(MATMUL_FORMATS.filter((f) => !f.endsWith("convrot")));
    // R = T·S routed rows on both sides of the grouped path's threshold (moe.ts: R ≥ 64 and ≥ 4 · experts)
    const experts = r.pick([1, 2, 3, 5, 8, 9]);
    const T = r.pick([1, 2, 5, 9, 17, 33, 64, 65]);
    const S = r.int(1, 3);
    const K = kFor(r, format);
    const N = r.pick([1, 3, 8, 33]);
    const w = makeWeight(r, format, experts * N, K, format === "f8_e4m3fn" && r.chance(0.5));
    const oob = r.chance(0.4);
    const ids = Int32Array.from({ length: T * S }, () =>
      oob && r.chance(0.3) ? r.pick([-1, experts, experts + 7, -(2 ** 31)]) : r.int(0, experts - 1),
    );
    const perSlot = r.chance(0.5);
    const x = operand(r, [T, perSlot ? S : 1, K]);
    const bad = [...ids].map((id) => id < 0 || id >= experts);
    const c: Case = {
      name: `matmul_id ${format} experts ${experts} T ${T} S ${S} K ${K} N ${N} x ${perSlot ? "[T,S,K]" : "[T,1,K]"} ids ${oob ? "with out-of-range" : "in range"}`,
      inputs: [x, operand(r, [T, S], "i32", { gen: () => ids })],
      weights: [w],
      call: (b, [xt, id], [wt]) => b.matmulId(xt as Tensor, wt as Weight, id as Tensor, { experts }),
      tol: MATMUL,
    };
    if (!bad.includes(true)) return c;
    const fixed = ids.map((id, i) => (bad[i] ? 0 : id));
    return {
      ...c,
      outOfRange: { reference: { ...c, inputs: [x, plain([T, S], "i32", fixed)] }, rows: bad, rowLen: N },
    };
  });

  fuzz("embedding with out-of-range ids", 40, (r) => {
    const format = r.pick(MATMUL_FORMATS.filter((f) => !f.endsWith("convrot")));
    const vocab = r.pick([1, 5, 33]);
    const d = kFor(r, format);
    const table = makeWeight(r, format, vocab, d, format === "f8_e4m3fn" && r.chance(0.5));
    const idsShape = shapeOf(r, [1, 2, 3, 7], 40, 1, 2);
    const oob = r.chance(0.4);
    const ids = Int32Array.from({ length: idsShape.reduce((a, b) => a * b, 1) }, () =>
      oob && r.chance(0.3) ? r.pick([-1, vocab, vocab + 100, 2 ** 31 - 1]) : r.int(0, vocab - 1),
    );
    const c: Case = {
      name: `embedding ${format} table [${vocab}, ${d}] ids [${idsShape}]${oob ? " with out-of-range" : ""}`,
      inputs: [operand(r, idsShape, "i32", { gen: () => ids })],
      weights: [table],
      call: (b, [id], [t]) => b.embedding(t as Weight, id as Tensor),
      tol: EMBEDDING,
    };
    const bad = [...ids].map((id) => id < 0 || id >= vocab);
    if (!bad.includes(true)) return c;
    const fixed = ids.map((id, i) => (bad[i] ? 0 : id));
    return {
      ...c,
      outOfRange: { reference: { ...c, inputs: [plain(idsShape, "i32", fixed)] }, rows: bad, rowLen: d },
    };
  });

  fuzz("conv2d with stride and padding", 32, (r) => {
    const batch = r.int(1, 2);
    const cin = r.int(1, 4);
    const cout = r.int(1, 5);
    const kh = r.pick([1, 2, 3, 5]);
    const kw = r.pick([1, 3, 4]);
    const stride: [number, number] = [r.int(1, 3), r.int(1, 3)];
    const padding: [number, number] = [r.int(0, 2), r.int(0, 2)];
    const h = r.int(Math.max(1, kh - 2 * padding[0]), 17);
    const w = r.int(Math.max(1, kw - 2 * padding[1]), 17);
    const bias = r.chance(0.5);
    return {
      name: `conv2d x [${batch}, ${cin}, ${h}, ${w}] w [${cout}, ${cin}, ${kh}, ${kw}] stride ${stride} padding ${padding}`,
      inputs: [operand(r, [batch, cin, h, w]), operand(r, [cout, cin, kh, kw]), operand(r, [cout])],
      call: (b, [x, wt, bb]) =>
        b.conv2d(x as Tensor, wt as Tensor, bias ? (bb as Tensor) : null, { stride, padding }),
      tol: CONV2D,
    };
  });

  fuzz("argmax / top_k with ties and NaN", 40, (r) => {
    const d = r.pick(ODD_LONG);
    const shape = [...shapeOf(r, [1, 2, 3], 6, 0, 2), d];
    const numel = shape.reduce((a, b) => a * b, 1);
    const ties = r.chance(0.5);
    const nan = r.chance(0.3);
    const gen = () => {
      const v = r.normal(numel);
      for (let i = 0; i < numel; i++) {
        if (ties) v[i] = Math.round((v[i] as number) * 2) / 2;
        if (nan && r.chance(0.05)) v[i] = Number.NaN;
        if (r.chance(0.02)) v[i] = r.pick([Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY, -0, 0]);
      }
      return v;
    };
    const op = r.chance(0.4) ? "argmax" : "top_k";
    const k = r.pick([1, 2, 5, d]);
    const kk = Math.min(k, d);
    return {
      name: `${op} [${shape}]${op === "top_k" ? ` k ${kk}` : ""} ties ${ties} nan ${nan}`,
      inputs: [operand(r, shape, "f32", { gen })],
      call: (b, [x]) => {
        if (op === "argmax") return b.argmax(x as Tensor);
        const { values, indices } = b.topK(x as Tensor, kk);
        return [values, indices];
      },
      tol: EXACT,
    };
  });

  fuzz("cast between f32 / f16 / bf16 / fp8 (saturating and not)", 32, (r) => {
    const CASTS: DTypeName[] = [...FLOAT_DTYPES, "f8_e4m3fn", "f8_e5m2"];
    const from = r.pick(CASTS);
    const to = r.pick(CASTS);
    const shape = shapeOf(r, ODD_LONG);
    const saturate = r.chance(0.3);
    return {
      name: `cast ${from} → ${to} [${shape}] saturate ${saturate}`,
      inputs: [operand(r, shape, from, { sigma: r.pick([1, 300, 1e5]), specials: true })],
      call: (b, [x]) => b.cast(x as Tensor, to, { saturate }),
      tol: EXACT,
    };
  });

  const MOVE_DTYPES: DTypeName[] = ["f32", "f16", "i32", "u8", "i8", "bf16", "i64", "f64"];
  const moveData =
    (r: Rng, dtype: DTypeName) =>
    (n: number): HostArray => {
      if (dtype === "i64") return BigInt64Array.from({ length: n }, () => BigInt(r.int(-1e9, 1e9)) * 7919n);
      if (dtype === "f64") return Float64Array.from({ length: n }, () => r.next() - 0.5);
      if (dtype === "u8" || dtype === "i8") return Uint8Array.from({ length: n }, () => r.int(0, 255));
      if (dtype === "i32") return Int32Array.from({ length: n }, () => r.int(-(2 ** 31), 2 ** 31 - 1));
      return floatData(r, n, dtype, 1, true);
    };

  fuzz("copy / slice / concat / set / upsample on views", 80, (r) => {
    const op = r.pick(["copy", "slice", "concat", "set", "upsample"] as const);
    const dtype = r.pick(MOVE_DTYPES);
    const shape = shapeOf(r, ODD, 3000, 1, 4);
    const g = moveData(r, dtype);
    if (op === "copy")
      return {
        name: `copy ${dtype} [${shape}]`,
        inputs: [operand(r, shape, dtype, { gen: g, sized: true })],
        call: (b, [x]) => b.copy(x as Tensor),
        tol: EXACT,
      };
    if (op === "upsample") {
      const s = [...shapeOf(r, [1, 2, 3], 6, 0, 2), r.int(1, 9), r.int(1, 9)];
      const f = r.int(1, 3);
      return {
        name: `upsample_nearest2d ${dtype} [${s}] × ${f}`,
        inputs: [operand(r, s, dtype, { gen: g, sized: true })],
        call: (b, [x]) => b.upsampleNearest2d(x as Tensor, f),
        tol: EXACT,
      };
    }
    const dim = r.int(0, shape.length - 1);
    const len = shape[dim] as number;
    if (op === "slice") {
      const start = r.int(0, len);
      const end = r.int(start, len);
      return {
        name: `slice ${dtype} [${shape}] dim ${dim} [${start}, ${end})`,
        inputs: [operand(r, shape, dtype, { gen: g, sized: true })],
        call: (b, [x]) => b.slice(x as Tensor, dim, start, end),
        tol: EXACT,
      };
    }
    if (op === "concat") {
      const parts = r.int(1, 4);
      const shapes = Array.from({ length: parts }, () => {
        const s = [...shape];
        s[dim] = r.int(0, 9);
        return s;
      });
      return {
        name: `concat ${dtype} dim ${dim} of ${shapes.map((s) => `[${s}]`).join(", ")}`,
        inputs: shapes.map((s) => operand(r, s, dtype, { gen: g, sized: true })),
        call: (b, ts) => b.concat(ts, dim),
        tol: EXACT,
      };
    }
    // set: write src into a slice / transposed view of a larger destination
    const pre = r.int(0, 3);
    const dstShape = [...shape];
    dstShape[dim] = len + pre + r.int(0, 3);
    const transposeDst = shape.length >= 2 && r.chance(0.4);
    return {
      name: `set ${dtype} dst [${dstShape}] dim ${dim} [${pre}, ${pre + len})${transposeDst ? " transposed" : ""} ← [${shape}]`,
      inputs: [
        plain(dstShape, dtype, g(dstShape.reduce((a, b) => a * b, 1))),
        operand(r, shape, dtype, { gen: g, sized: true }),
      ],
      call: (b, [dst, src]) => {
        const d0 = dst as Tensor;
        let view = d0.slice(dim, pre, pre + len);
        let s = src as Tensor;
        if (transposeDst) {
          view = view.transpose(0, shape.length - 1);
          s = s.transpose(0, shape.length - 1);
        }
        b.set(view, s);
        return b.copy(d0);
      },
      tol: EXACT,
    };
  });

  fuzz("count_nonfinite, ssm_conv, gated_delta_net", 40, (r) => {
    const op = r.pick(["count", "ssm", "gdn"] as const);
    if (op === "count") {
      const shape = shapeOf(r, ODD_LONG);
      return {
        name: `count_nonfinite [${shape}]`,
        inputs: [operand(r, shape, "f32", { specials: true })],
        call: (b, [x]) => b.countNonFinite(x as Tensor),
        tol: EXACT,
      };
    }
    if (op === "ssm") {
      const K = r.int(1, 5);
      const T = r.pick([0, 1, 2, 7, 33]);
      const C = r.pick([1, 3, 31, 33, 257]);
      return {
        name: `ssm_conv T ${T} K ${K} C ${C}`,
        inputs: [operand(r, [T + K - 1, C]), operand(r, [C, K])],
        call: (b, [x, w]) => b.ssmConv(x as Tensor, w as Tensor),
        tol: SSM_CONV,
      };
    }
    const n = r.pick([1, 2, 5]);
    const hk = r.int(1, 2);
    const hv = hk * r.int(1, 2);
    const dk = r.pick([1, 4, 16, 33]);
    const dv = r.pick([1, 5, 16, 33, 130]);
    const norm = (len: number) => () => {
      const v = r.normal(n * len * dk);
      for (let i = 0; i < v.length; i += dk) {
        let s = 0;
        for (let j = 0; j < dk; j++) s += (v[i + j] as number) ** 2;
        for (let j = 0; j < dk; j++) v[i + j] = (v[i + j] as number) / Math.sqrt(s + 1e-6);
      }
      return v;
    };
    // the chunked form (cpu) is the same function up to rounding; ptx runs token by token
    const options = {
      ...(r.chance(0.3) ? { chunk: r.pick([1, 2, 64]) } : {}),
      ...(r.chance(0.3) ? { scale: 0.3 } : {}),
    };
    return {
      name: `gated_delta_net n ${n} hk ${hk} hv ${hv} dk ${dk} dv ${dv} ${JSON.stringify(options)}`,
      inputs: [
        operand(r, [n, hk, dk], "f32", { gen: norm(hk) }),
        operand(r, [n, hk, dk], "f32", { gen: norm(hk) }),
        operand(r, [n, hv, dv]),
        operand(r, [n, hv], "f32", { gen: (m) => Float32Array.from({ length: m }, () => -r.next()) }),
        operand(r, [n, hv], "f32", { gen: (m) => Float32Array.from({ length: m }, () => r.next()) }),
        plain([hv, dk, dv], "f32", r.normal(hv * dk * dv, 0.1)),
      ],
      call: (b, [q, k, v, g, beta, state]) => {
        const out = b.gatedDeltaNet(
          q as Tensor,
          k as Tensor,
          v as Tensor,
          g as Tensor,
          beta as Tensor,
          state as Tensor,
          options,
        );
        return [out, b.copy(state as Tensor)];
      },
      tol: DELTA_NET,
    };
  });
});

// ------------------------------------------------------------------ defects the fuzz found (fixed)

/** An f32 input viewed as every other element of a base twice as long along dim 0. */
function steppedF32(shape: readonly number[], data: Float32Array): Input {
  const base = [2 * (shape[0] as number), ...shape.slice(1)];
  const full = new Float32Array(2 * data.length).fill(1e3);
  const row = data.length / (shape[0] as number);
  for (let i = 0; i < (shape[0] as number); i++) full.set(data.subarray(i * row, (i + 1) * row), 2 * i * row);
  return {
    dtype: "f32",
    base,
    data: full,
    view: (t) => t.slice(0, 0, base[0], 2),
    label: `every other row of [${base}]`,
  };
}

describe("defects found by the fuzz", () => {
  const seq = (n: number, f: (i: number) => number) => Float32Array.from({ length: n }, (_, i) => f(i));
  test("matmul with a strided bias view (read as contiguous: bias[n] came from element n of the base)", async () => {
    const failures: string[] = [];
    for (const [format, M] of [
      ["f32", 1],
      ["f16", 9],
      ["f16", 64],
      ["int4_convrot", 64],
    ] as const) {
      const N = 3;
      const K = format === "int4_convrot" ? 64 : 32;
      const w = makeWeight(rng(7), format, N, K);
      const f = await check(
        {
          name: `matmul ${format} M ${M} bias every other element of [6]`,
          inputs: [
            plain(
              [M, K],
              "f32",
              seq(M * K, (i) => Math.sin(0.37 * i)),
            ),
            steppedF32(
              [N],
              seq(N, (i) => i + 1),
            ),
          ],
          weights: [w],
          call: (b, [x, bias], [wt]) => b.matmul(x as Tensor, wt as Weight, { bias: bias as Tensor }),
          tol: format === "f32" ? MATMUL_F32 : MATMUL,
        },
        null,
      );
      if (f !== null) failures.push(f);
    }
    expect(failures).toEqual([]);
  });

  test("argmax / top_k with NaN (ptx skipped NaN — an all-NaN row gave index −1 — where cpu and torch take NaN as the largest)", async () => {
    const N = Number.NaN;
    const rows = Float32Array.from([N, N, N, N, N, 1, 2, N, N, 2, 3, 3, -1, N, 5, -Infinity]);
    const failures: string[] = [];
    for (const c of [
      { name: "argmax", call: (b: Backend, x: Tensor) => b.argmax(x) },
      { name: "top_k 3", call: (b: Backend, x: Tensor) => Object.values(b.topK(x, 3)) },
      { name: "top_k 4", call: (b: Backend, x: Tensor) => Object.values(b.topK(x, 4)) },
    ]) {
      const f = await check(
        {
          name: `${c.name} [4, 4] rows: all NaN, NaN among numbers, ties, −∞`,
          inputs: [plain([4, 4], "f32", rows)],
          call: (b, [x]) => c.call(b, x as Tensor),
          tol: EXACT,
        },
        null,
      );
      if (f !== null) failures.push(f);
    }
    expect(failures).toEqual([]);
    // and by hand: the first NaN of each row, else the first maximum
    const got = await ptx.read(ptx.argmax(ptx.upload(rows, [4, 4], "f32")));
    expect([...(got as Int32Array)]).toEqual([0, 0, 0, 1]);
  });

  test("cast with saturate to f16 / bf16 (ptx clamped ±∞ and overflow to ±max finite; saturate is the fp8 rule)", async () => {
    const v = Float32Array.from([Infinity, -Infinity, 70000, -1e39 * 0, 3.4e38, Number.NaN, 65519, 65520]);
    const failures: string[] = [];
    for (const [from, to] of [
      ["f32", "f16"],
      ["f32", "bf16"],
      ["f16", "f16"],
    ] as const) {
      const f = await check(
        {
          name: `cast ${from} → ${to} saturate`,
          inputs: [plain([v.length], from, from === "f32" ? v : encodeFromF32(v, from))],
          call: (b, [x]) => b.cast(x as Tensor, to, { saturate: true }),
          tol: EXACT,
        },
        null,
      );
      if (f !== null) failures.push(f);
    }
    expect(failures).toEqual([]);
  });

  test("empty tensors: rms_norm / layer_norm / group_norm / softmax refused ([0, 8], [3, 0]: an empty grid) and group_norm over 0 spatial values read outside every allocation (E_INTERNAL)", async () => {
    const zeros = (shape: number[]) =>
      plain(shape, "f32", new Float32Array(shape.reduce((a, b) => a * b, 1)));
    const cases: Case[] = [
      {
        name: "rms_norm [0, 8]",
        inputs: [zeros([0, 8])],
        call: (b, [x]) => b.rmsNorm(x as Tensor, null, { eps: 1e-6 }),
        tol: EXACT,
      },
      {
        name: "rms_norm [3, 0]",
        inputs: [zeros([3, 0]), zeros([0])],
        call: (b, [x, w]) => b.rmsNorm(x as Tensor, w as Tensor, { eps: 1e-6 }),
        tol: EXACT,
      },
      {
        name: "layer_norm [2, 0]",
        inputs: [zeros([2, 0])],
        call: (b, [x]) => b.layerNorm(x as Tensor, null, null, { eps: 1e-5 }),
        tol: EXACT,
      },
      {
        name: "group_norm [0, 4, 3]",
        inputs: [zeros([0, 4, 3])],
        call: (b, [x]) => b.groupNorm(x as Tensor, 2, null, null, { eps: 1e-5 }),
        tol: EXACT,
      },
      {
        name: "group_norm [1, 4, 0]",
        inputs: [zeros([1, 4, 0])],
        call: (b, [x]) => b.groupNorm(x as Tensor, 2, null, null, { eps: 1e-5 }),
        tol: EXACT,
      },
      {
        name: "softmax [2, 0]",
        inputs: [zeros([2, 0])],
        call: (b, [x]) => b.softmax(x as Tensor),
        tol: EXACT,
      },
      {
        name: "softmax [0, 3] dim 0",
        inputs: [zeros([0, 3])],
        call: (b, [x]) => b.softmax(x as Tensor, { dim: 0 }),
        tol: EXACT,
      },
    ];
    const failures: string[] = [];
    for (const c of cases) {
      const f = await check(c, null);
      if (f !== null) failures.push(f);
    }
    expect(failures).toEqual([]);
  });

  test("matmul with K = 0 (ptx launched over M = 0 rows — a refused empty grid — where out is the bias or zeros)", async () => {
    const failures: string[] = [];
    // GGUF formats are left out at M ≥ 16: the cpu backend drops the bias there (0 instead of bias)
    for (const [format, M] of [
      ["f32", 1],
      ["f16", 9],
      ["bf16", 64],
      ["q8_0", 1],
      ["int8_convrot", 64],
      ["int4_convrot", 2],
    ] as const) {
      for (const withBias of [false, true]) {
        const w = new Weight({
          name: `w_${format}`,
          format,
          shape: [3, 0],
          data: new Uint8Array(0),
          ...(format.endsWith("convrot")
            ? { scale: { kind: "row", values: new Float32Array(3).fill(1) } }
            : {}),
        });
        const f = await check(
          {
            name: `matmul ${format} x [${M}, 0] · w [3, 0]ᵀ${withBias ? " + bias" : ""}`,
            inputs: [
              plain([M, 0], "f32", new Float32Array(0)),
              plain([3], "f32", Float32Array.from([1, -2, 3])),
            ],
            weights: [w],
            call: (b, [x, bias], [wt]) =>
              b.matmul(x as Tensor, wt as Weight, withBias ? { bias: bias as Tensor } : {}),
            tol: EXACT,
          },
          null,
        );
        if (f !== null) failures.push(f);
      }
    }
    expect(failures).toEqual([]);
  });

  test("concat of empty tensors along a non-empty dim ([0, 5] ++ [0, 4] along 1: ptx sliced the 0-byte result at an offset, an E_SHAPE)", async () => {
    const failures: string[] = [];
    for (const dtype of ["i32", "f32"] as const) {
      const e = (shape: number[]) =>
        plain(shape, dtype, dtype === "i32" ? new Int32Array(0) : new Float32Array(0));
      const f = await check(
        {
          name: `concat ${dtype} dim 1 of [0, 5], [0, 4], [0, 1]`,
          inputs: [e([0, 5]), e([0, 4]), e([0, 1])],
          call: (b, ts) => b.concat(ts, 1),
          tol: EXACT,
        },
        null,
      );
      if (f !== null) failures.push(f);
    }
    expect(failures).toEqual([]);
  });
});

describe("shapes the kernels cannot take are refused with one TpError naming the op", () => {
  /** ptx either refuses `call` with E_UNSUPPORTED naming `op` (never a simulator fault), or agrees with cpu. */
  async function refusedOrRight(op: string, c: Case): Promise<string | null> {
    const p = await runOn(ptx, c);
    if (!p.ok) {
      const e = p.error;
      if (!(e instanceof TpError)) return `${c.name}: not a TpError: ${describeError(e)}`;
      if (e.code !== "E_UNSUPPORTED") return `${c.name}: ${e.code}, not E_UNSUPPORTED: ${e.message}`;
      if (!e.message.includes(op)) return `${c.name}: the refusal does not name ${op}: ${e.message}`;
      return null;
    }
    return check(c, null);
  }
  test("grid dimensions past 65535 (matmul_id rows, attention / gated_delta_net heads)", async () => {
    const ones = (n: number) => new Float32Array(n).fill(0.5);
    const rows = 65536;
    const failures = [
      // fewer than 4 rows per expert: the GEMV path, one grid row per routed row
      await refusedOrRight("matmul_id", {
        name: `matmul_id f32 T ${rows} S 1 K 1 N 1 over ${rows / 4 + 1} experts`,
        inputs: [plain([rows, 1, 1], "f32", ones(rows)), plain([rows, 1], "i32", new Int32Array(rows))],
        weights: [
          new Weight({
            name: "w",
            format: "f32",
            shape: [rows / 4 + 1, 1],
            data: new Uint8Array(ones(rows / 4 + 1).buffer),
          }),
        ],
        call: (b, [x, ids], [w]) =>
          b.matmulId(x as Tensor, w as Weight, ids as Tensor, { experts: rows / 4 + 1 }),
        tol: MATMUL_F32,
      }),
      await refusedOrRight("attention", {
        name: `attention heads ${rows}`,
        inputs: [
          plain([1, rows, 1, 1], "f32", ones(rows)),
          plain([1, 1, 1, 1], "f32", ones(1)),
          plain([1, 1, 1, 1], "f32", ones(1)),
        ],
        call: (b, [q, k, v]) => b.attention(q as Tensor, k as Tensor, v as Tensor),
        tol: ATTENTION,
      }),
      await refusedOrRight("gated_delta_net", {
        name: `gated_delta_net ${rows} value heads`,
        inputs: [
          plain([1, 1, 1], "f32", ones(1)),
          plain([1, 1, 1], "f32", ones(1)),
          plain([1, rows, 1], "f32", ones(rows)),
          plain([1, rows], "f32", new Float32Array(rows)),
          plain([1, rows], "f32", ones(rows)),
          plain([rows, 1, 1], "f32", ones(rows)),
        ],
        call: (b, [q, k, v, g, beta, state]) =>
          b.gatedDeltaNet(
            q as Tensor,
            k as Tensor,
            v as Tensor,
            g as Tensor,
            beta as Tensor,
            state as Tensor,
          ),
        tol: DELTA_NET,
      }),
    ].filter((f) => f !== null);
    expect(failures).toEqual([]);
  }, 120_000);
});
