/**
 * Initial noise that reproduces PyTorch's CPU generator bit for bit: `torch.manual_seed(seed);
 * torch.randn(shape)` (float32), so that one seed gives ComfyUI's image. Noise is input data, made on
 * the host and uploaded (see {@link randnTensor}).
 *
 * Engine: MT19937 (Matsumoto & Nishimura 1998) seeded with the low 32 bits of the seed, as
 * c10/core/MT19937RNGEngine.h. Floats: aten/src/ATen/core/TransformationHelper.h `uniform_real`
 * (24 random bits × 2^-24). Normals: aten/src/ATen/native/cpu/DistributionTemplates.h `normal_fill`
 * (uniforms for the whole tensor, Box–Muller in blocks of 16, the last 16 redrawn when n mod 16 ≠ 0) —
 * with the scalar `normal_fill_16` of a build without AVX2 (`ATEN_CPU_CAPABILITY=default`, also Arm
 * Macs), or the AVX2 `normal_fill_16_AVX2` with the Cephes-style `log256_ps`/`sincos256_ps` of
 * avx_mathfun.h as the shipping x86-64 wheels compute them (fused multiply-adds included). Fewer than
 * 16 elements: torch's `normal_distribution<double>` (two 64-bit uniforms, cached second sample).
 *
 * Spec: ../shared/spec/krea2.md §4.3–4.5.
 */
import { type Backend, type Shape, type Tensor, TpError } from "@tp/tensor";

// ---------------------------------------------------------------------------------------- MT19937

const N = 624;
const M = 397;

/**
 * The 32-bit Mersenne Twister as torch's CPU generator uses it (`at::mt19937`), with the state of
 * `torch.manual_seed(seed)`: only the low 32 bits of the seed are used.
 * Source: c10/core/MT19937RNGEngine.h; krea2.md §4.4 "Engine".
 */
export class Mt19937 {
  readonly #state = new Uint32Array(N);
  #index = N;

  /** @param seed any integer 0 ≤ seed < 2^64 (number or bigint); low 32 bits are used */
  constructor(seed: number | bigint) {
    const s = Number(BigInt.asUintN(32, BigInt(seed)));
    const st = this.#state;
    st[0] = s;
    for (let i = 1; i < N; i++) {
      const prev = st[i - 1] as number;
      st[i] = (Math.imul(1812433253, (prev ^ (prev >>> 30)) >>> 0) + i) >>> 0;
    }
  }

  #twist(): void {
    const st = this.#state;
    for (let k = 0; k < N; k++) {
      const y = ((st[k] as number) & 0x80000000) | ((st[(k + 1) % N] as number) & 0x7fffffff);
      st[k] = ((st[(k + M) % N] as number) ^ (y >>> 1) ^ (y & 1 ? 0x9908b0df : 0)) >>> 0;
    }
    this.#index = 0;
  }

  /** Next tempered 32-bit output, as an unsigned number. */
  nextU32(): number {
    if (this.#index >= N) this.#twist();
    let y = this.#state[this.#index++] as number;
    y ^= y >>> 11;
    y ^= (y << 7) & 0x9d2c5680;
    y ^= (y << 15) & 0xefc60000;
    y ^= y >>> 18;
    return y >>> 0;
  }

  /** torch's float uniform in [0, 1): `(r & (2^24 − 1)) · 2^-24` from one 32-bit draw (exact in f32). */
  nextFloat(): number {
    return (this.nextU32() & 0xffffff) * 2 ** -24;
  }

  /** torch's double uniform in [0, 1): 53 bits of `(r1 << 32) | r2`, × 2^-53 (TransformationHelper.h). */
  nextDouble(): number {
    const hi = this.nextU32();
    const lo = this.nextU32();
    // ((hi << 32) | lo) & (2^53 − 1) = (hi & 0x1fffff) · 2^32 + lo, exact in a double.
    return ((hi & 0x1fffff) * 2 ** 32 + lo) * 2 ** -53;
  }
}

// ------------------------------------------------------------------------------ f32 arithmetic

const fr = Math.fround;
const F64 = new Float64Array(1);
const U64 = new BigUint64Array(F64.buffer);
const F32 = new Float32Array(1);
const U32 = new Uint32Array(F32.buffer);

/**
 * Single-rounding f32 fused multiply-add of f32 inputs: a·b is exact in f64, the f64 sum is rounded to
 * odd (sticky bit kept) and then to f32, which equals one rounding of the exact a·b + c.
 * Source: krea2.md §4.4, "JavaScript/TypeScript implementation notes" (Boldo & Melquiond 2008).
 */
export function fmaf(a: number, b: number, c: number): number {
  const p = a * b;
  const s = p + c;
  if (!Number.isFinite(s)) return fr(s);
  const bp = s - c;
  const bc = s - bp;
  const err = p - bp + (c - bc);
  if (err === 0) return fr(s);
  F64[0] = s;
  const bits = U64[0] as bigint;
  if ((bits & 1n) === 0n) {
    // Round to odd: move one ulp toward the exact value (magnitude up when err has the sign of s).
    U64[0] = err > 0 === s > 0 ? bits + 1n : bits - 1n;
    return fr(F64[0] as number);
  }
  return fr(s);
}

const f32Bits = (x: number): number => {
  F32[0] = x;
  return U32[0] as number;
};
const bitsF32 = (b: number): number => {
  U32[0] = b >>> 0;
  return F32[0] as number;
};

// f32 constants of avx_mathfun.h (every decimal rounded to the nearest f32 first).
const C = (x: number): number => fr(x);
const LOG_P = [
  -1.151461031e-1, 1.167699874e-1, -1.2420140846e-1, 1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1,
  -2.4999993993e-1, 3.3333331174e-1,
].map(C);
const LOG_P0 = C(7.0376836292e-2);
const LOG_Q1 = C(-2.1219444e-4);
const LOG_Q2 = C(0.693359375);
const SQRTHF = C(Math.SQRT1_2);
const MIN_NORM = 2 ** -126;
const FOPI = C(1.27323954473516);
const DP1 = C(-0.78515625);
const DP2 = C(-2.4187564849853516e-4);
const DP3 = C(-3.774894977445941e-8);
const COS_P0 = C(2.443315711809948e-5);
const COS_P1 = C(-1.388731625493765e-3);
const COS_P2 = C(4.166664568298827e-2);
const SIN_P0 = C(-1.9515295891e-4);
const SIN_P1 = C(8.3321608736e-3);
const SIN_P2 = C(-1.6666654611e-1);
const TWO_PI_F32 = C(2 * Math.PI);

/** avx_mathfun.h `log256_ps` on one lane, with the wheel's fused multiply-adds (krea2.md §4.4 LOG). */
function logAvx(x0: number): number {
  let x = Math.max(x0, MIN_NORM);
  const bits = f32Bits(x);
  const ei = ((bits >>> 23) & 0xff) - 127;
  x = bitsF32((bits & ~0x7f800000) | 0x3f000000);
  let e = fr(ei + 1);
  if (x < SQRTHF) {
    const t = x;
    x = fr(x - 1);
    e = fr(e - 1);
    x = fr(x + t);
  } else {
    x = fr(x - 1);
  }
  const z = fr(x * x);
  let y = LOG_P0;
  for (const c of LOG_P) y = fmaf(y, x, c);
  y = fr(y * x);
  y = fmaf(y, z, fr(e * LOG_Q1));
  y = fmaf(z, -0.5, y);
  x = fr(x + y);
  return fmaf(e, LOG_Q2, x);
}

/** avx_mathfun.h `sincos256_ps` on one lane → [sin, cos] (krea2.md §4.4 SINCOS). */
function sincosAvx(theta: number): [number, number] {
  let signSin = theta < 0 || Object.is(theta, -0);
  let x = Math.abs(theta);
  let j = Math.trunc(fr(x * FOPI)) | 0;
  j = (j + 1) & ~1;
  const yq = fr(j);
  const swap = (j & 4) !== 0;
  signSin = signSin !== swap;
  const signCos = (~(j - 2) & 4) !== 0;
  const poly1 = (j & 2) === 0;
  x = fmaf(yq, DP1, x);
  x = fmaf(yq, DP2, x);
  x = fmaf(yq, DP3, x);
  const z = fr(x * x);
  let c = fmaf(COS_P0, z, COS_P1);
  c = fmaf(c, z, COS_P2);
  c = fr(c * z);
  c = fmaf(c, z, -fr(z * 0.5));
  c = fr(c + 1);
  let s = fmaf(SIN_P0, z, SIN_P1);
  s = fmaf(s, z, SIN_P2);
  s = fr(s * z);
  s = fmaf(s, x, x);
  let sin = poly1 ? s : c;
  let cos = poly1 ? c : s;
  if (signSin) sin = -sin;
  if (signCos) cos = -cos;
  return [sin, cos];
}

// ------------------------------------------------------------- glibc logf / sinf / cosf (f32)
//
// torch's scalar kernel calls the platform libm's float `log`, `cos`, `sin`. These are glibc's (2.28+,
// from Arm's optimized-routines: sysdeps/ieee754/flt-32/e_logf.c, e_logf_data.c, s_sinf.c, s_cosf.c,
// sincosf.h, sincosf_data.c), evaluated in double as there, with the fused multiply-adds that the x86-64
// FMA builds of glibc (the ifunc variant chosen on every AVX2 CPU) contract. They are not correctly
// rounded (logf ≤ 0.82 ulp), so `Math.fround(Math.log(x))` differs from them in ~2 % of the values.

const hex = (s: string): number => {
  // "0x1.661ec79f8f3bep+0" → number (C99 hexadecimal float literal)
  const m = /^(-?)0x([0-9a-f]+)(?:\.([0-9a-f]*))?p([+-]?\d+)$/i.exec(s);
  if (!m) throw new Error(`bad hex float ${s}`);
  const frac = m[3] ?? "";
  const mant = Number.parseInt((m[2] as string) + frac, 16);
  return (m[1] ? -1 : 1) * mant * 2 ** (Number(m[4]) - 4 * frac.length);
};

/** (invc, logc) per 1/16 of the mantissa range; e_logf_data.c. */
const LOGF_TAB = [
  ["0x1.661ec79f8f3bep+0", "-0x1.57bf7808caadep-2"],
  ["0x1.571ed4aaf883dp+0", "-0x1.2bef0a7c06ddbp-2"],
  ["0x1.49539f0f010bp+0", "-0x1.01eae7f513a67p-2"],
  ["0x1.3c995b0b80385p+0", "-0x1.b31d8a68224e9p-3"],
  ["0x1.30d190c8864a5p+0", "-0x1.6574f0ac07758p-3"],
  ["0x1.25e227b0b8eap+0", "-0x1.1aa2bc79c81p-3"],
  ["0x1.1bb4a4a1a343fp+0", "-0x1.a4e76ce8c0e5ep-4"],
  ["0x1.12358f08ae5bap+0", "-0x1.1973c5a611cccp-4"],
  ["0x1.0953f419900a7p+0", "-0x1.252f438e10c1ep-5"],
  ["0x1p+0", "0x0p+0"],
  ["0x1.e608cfd9a47acp-1", "0x1.aa5aa5df25984p-5"],
  ["0x1.ca4b31f026aap-1", "0x1.c5e53aa362eb4p-4"],
  ["0x1.b2036576afce6p-1", "0x1.526e57720db08p-3"],
  ["0x1.9c2d163a1aa2dp-1", "0x1.bc2860d22477p-3"],
  ["0x1.886e6037841edp-1", "0x1.1058bc8a07ee1p-2"],
  ["0x1.767dcf5534862p-1", "0x1.4043057b6ee09p-2"],
].map(([a, b]) => [hex(a as string), hex(b as string)] as const);
const LOGF_LN2 = hex("0x1.62e42fefa39efp-1");
const LOGF_A = ["-0x1.00ea348b88334p-2", "0x1.5575b0be00b6ap-2", "-0x1.ffffef20a4123p-2"].map(hex);

/** Veltkamp split constant 2^27 + 1, for the exact product of {@link fma64}. */
const SPLIT = 134217729;

/**
 * Double fused multiply-add a·b + c: the exact product (Dekker) and a compensated sum. Faithful, and
 * correctly rounded except in exact-halfway corner cases that do not survive the final f32 rounding.
 */
function fma64(a: number, b: number, c: number): number {
  const p = a * b;
  let t = SPLIT * a;
  const ah = t - (t - a);
  const al = a - ah;
  t = SPLIT * b;
  const bh = t - (t - b);
  const bl = b - bh;
  const pe = al * bl - (p - ah * bh - al * bh - ah * bl); // p + pe = a·b exactly
  const s = p + c;
  const bb = s - p;
  const se = p - (s - bb) + (c - bb); // s + se = p + c exactly
  return s + (se + pe);
}

/** glibc `logf` (e_logf.c) for the finite positive normal inputs Box–Muller gives it. */
export function glibcLogf(x: number): number {
  let ix = f32Bits(x);
  if (ix === 0x3f800000) return 0;
  if ((ix - 0x00800000) >>> 0 >= 0x7f800000 - 0x00800000) {
    if (ix * 2 === 0) return Number.NEGATIVE_INFINITY;
    if (ix === 0x7f800000) return x;
    if (ix & 0x80000000 || ix * 2 >= 0xff000000) return Number.NaN;
    ix = (f32Bits(fr(x * 2 ** 23)) - (23 << 23)) >>> 0; // subnormal: normalise
  }
  const tmp = (ix - 0x3f330000) >>> 0;
  const i = (tmp >>> 19) % 16;
  const k = (tmp | 0) >> 23; // arithmetic shift
  const iz = (ix - (tmp & (0x1ff << 23))) >>> 0;
  const [invc, logc] = LOGF_TAB[i] as readonly [number, number];
  const z = bitsF32(iz);
  const r = fma64(z, invc, -1);
  const y0 = fma64(k, LOGF_LN2, logc);
  const r2 = r * r;
  let y = fma64(LOGF_A[1] as number, r, LOGF_A[2] as number);
  y = fma64(LOGF_A[0] as number, r2, y);
  y = fma64(y, r2, y0 + r);
  return fr(y);
}

// sincosf_data.c: the 2nd table computes −cos to get the negation for free.
const SC_HPI_INV = hex("0x1.45F306DC9C883p+23");
const SC_HPI = hex("0x1.921FB54442D18p0");
const SC_SIGN = [1, -1, -1, 1] as const;
const SC_S = ["-0x1.555545995a603p-3", "0x1.1107605230bc4p-7", "-0x1.994eb3774cf24p-13"].map(hex);
const SC_C = [
  [
    "0x1p0",
    "-0x1.ffffffd0c621cp-2",
    "0x1.55553e1068f19p-5",
    "-0x1.6c087e89a359dp-10",
    "0x1.99343027bf8c3p-16",
  ],
  [
    "-0x1p0",
    "0x1.ffffffd0c621cp-2",
    "-0x1.55553e1068f19p-5",
    "0x1.6c087e89a359dp-10",
    "-0x1.99343027bf8c3p-16",
  ],
].map((row) => row.map(hex));
const abstop12 = (x: number): number => (f32Bits(x) >>> 20) & 0x7ff;
const TOP_PIO4 = abstop12(hex("0x1.921FB6p-1"));
const TOP_TINY = abstop12(2 ** -12);
const TOP_120 = abstop12(120);

/** sincosf.h `sinf_poly`: sin (n even) or cos (n odd) of the reduced argument, with table `t`. */
function sinfPoly(x: number, x2: number, t: number, n: number): number {
  if ((n & 1) === 0) {
    const x3 = x * x2;
    const s1 = fma64(x2, SC_S[2] as number, SC_S[1] as number);
    const x7 = x3 * x2;
    const s = fma64(x3, SC_S[0] as number, x);
    return fr(fma64(x7, s1, s));
  }
  const c = SC_C[t] as number[];
  const x4 = x2 * x2;
  const c2 = fma64(x2, c[4] as number, c[3] as number);
  const c1 = fma64(x2, c[1] as number, c[0] as number);
  const x6 = x4 * x2;
  const cc = fma64(x4, c[2] as number, c1);
  return fr(fma64(x6, c2, cc));
}

/** glibc `sinf` (cos = false) or `cosf` (cos = true) for |x| < 120 (Box–Muller angles are in [0, 2π)). */
function glibcSinCosf(y: number, cos: boolean): number {
  const top = abstop12(y);
  if (top < TOP_PIO4) {
    if (top < TOP_TINY) return cos ? 1 : y;
    return sinfPoly(y, y * y, 0, cos ? 1 : 0);
  }
  if (top >= TOP_120) throw new Error("glibcSinCosf: |x| >= 120 is not needed here");
  const r = y * SC_HPI_INV;
  const n = ((Math.trunc(r) | 0) + 0x800000) >> 24;
  const x = fma64(-n, SC_HPI, y);
  const s = SC_SIGN[n & 3] as number;
  return sinfPoly(x * s, x * x, n & 2 ? 1 : 0, cos ? n ^ 1 : n);
}

/** glibc `sinf` for |x| < 120. */
export function glibcSinf(x: number): number {
  return glibcSinCosf(x, false);
}

/** glibc `cosf` for |x| < 120. */
export function glibcCosf(x: number): number {
  return glibcSinCosf(x, true);
}

// ---------------------------------------------------------------------------------- Box–Muller

/** Which torch CPU kernel to reproduce (the machine that ran ComfyUI decides). */
export type TorchCpuCapability = "avx2" | "default";

/**
 * `normal_fill_16` (scalar): u1 = 1 − d[j] (f32), radius = sqrtf(−2·logf(u1)), θ = 2π·u2 in double,
 * d[j] = f32(radius · cos θ), d[j+8] = f32(radius · sin θ) with double cos/sin.
 */
function fill16Default(d: Float32Array, at: number): void {
  for (let j = 0; j < 8; j++) {
    const u1 = fr(1 - (d[at + j] as number));
    const u2 = d[at + j + 8] as number;
    const radius = fr(Math.sqrt(fr(-2 * glibcLogf(u1))));
    const theta = fr(2 * Math.PI * u2);
    d[at + j] = fr(radius * glibcCosf(theta));
    d[at + j + 8] = fr(radius * glibcSinf(theta));
  }
}

/** `normal_fill_16_AVX2`: the same in f32 with avx_mathfun.h log and sincos (krea2.md §4.4). */
function fill16Avx2(d: Float32Array, at: number): void {
  for (let j = 0; j < 8; j++) {
    const u1 = fr(1 - (d[at + j] as number));
    const u2 = d[at + j + 8] as number;
    const radius = fr(Math.sqrt(fr(-2 * logAvx(u1))));
    const [s, c] = sincosAvx(fr(TWO_PI_F32 * u2));
    d[at + j] = fr(radius * c);
    d[at + j + 8] = fr(radius * s);
  }
}

/** Options of {@link randn}. */
export interface RandnOptions {
  /**
   * torch kernel to match: "avx2" (x86-64 wheels on an AVX2 CPU — what ComfyUI runs on almost every PC;
   * the default) or "default" (no AVX2: `ATEN_CPU_CAPABILITY=default`, Arm). They differ in ~17 % of
   * values by up to ~5e-7; only matters for bit-exact parity.
   */
  capability?: TorchCpuCapability;
}

function checkCount(n: number, what: string): void {
  if (!Number.isSafeInteger(n) || n < 0 || n > 2 ** 31) {
    throw new TpError("E_ARG", `${what}: element count must be an integer in [0, 2^31], got ${n}`);
  }
}

/**
 * `torch.manual_seed(seed); torch.rand(n)` on CPU, float32: uniforms in [0, 1).
 * @param seed integer in [0, 2^64) (number or bigint); only the low 32 bits matter
 * @returns Float32Array of n values
 * @throws TpError E_ARG for a negative or fractional seed or a bad count
 * Source: aten/src/ATen/native/cpu/DistributionKernels.cpp `uniform_kernel`.
 */
export function rand(seed: number | bigint, n: number): Float32Array {
  checkCount(n, "rand");
  const g = new Mt19937(checkSeed(seed));
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = g.nextFloat();
  return out;
}

function checkSeed(seed: number | bigint): bigint {
  const ok =
    typeof seed === "bigint" ? seed >= 0n && seed < 2n ** 64n : Number.isSafeInteger(seed) && seed >= 0;
  if (!ok) throw new TpError("E_ARG", `seed must be an integer in [0, 2^64), got ${String(seed)}`);
  return BigInt(seed);
}

/**
 * `torch.manual_seed(seed); torch.randn(shape)` on CPU, float32, in C-contiguous order (a fresh
 * generator per call, as ComfyUI's `prepare_noise` for a batch of one).
 * @param seed  integer in [0, 2^64) (number or bigint); only the low 32 bits seed MT19937
 * @param shape any shape, e.g. a latent [1, 16, 1, H/8, W/8]; only the element count matters
 * @returns Float32Array of numel(shape) standard normal values
 * @throws TpError E_ARG for a bad seed, shape or capability
 * Source: DistributionTemplates.h `normal_fill` / `normal_kernel`; krea2.md §4.4.
 */
export function randn(seed: number | bigint, shape: Shape, options: RandnOptions = {}): Float32Array {
  const n = shape.reduce((a, b) => a * b, 1);
  if (!shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
    throw new TpError("E_ARG", `randn: shape must hold non-negative integers, got [${shape.join(", ")}]`);
  }
  checkCount(n, "randn");
  const capability = options.capability ?? "avx2";
  if (capability !== "avx2" && capability !== "default") {
    throw new TpError("E_ARG", `randn: capability must be "avx2" or "default", got ${String(capability)}`);
  }
  const g = new Mt19937(checkSeed(seed));
  const out = new Float32Array(n);
  if (n < 16) {
    // normal_distribution<double>: u1, u2 from 64-bit draws; r·cos θ now, r·sin θ cached for the next.
    for (let i = 0; i < n; i += 2) {
      const u1 = g.nextDouble();
      const u2 = g.nextDouble();
      const r = Math.sqrt(-2 * Math.log1p(-u2));
      const theta = 2 * Math.PI * u1;
      out[i] = r * Math.cos(theta);
      if (i + 1 < n) out[i + 1] = r * Math.sin(theta);
    }
    return out;
  }
  const fill16 = capability === "avx2" ? fill16Avx2 : fill16Default;
  for (let i = 0; i < n; i++) out[i] = g.nextFloat();
  for (let i = 0; i + 16 <= n; i += 16) fill16(out, i);
  if (n % 16 !== 0) {
    for (let i = n - 16; i < n; i++) out[i] = g.nextFloat();
    fill16(out, n - 16);
  }
  return out;
}

/**
 * {@link randn} uploaded to a backend as an f32 tensor of `shape` (the initial latent noise; with
 * sigma_0 = 1 it is also the first sampler state, krea2.md §4.3).
 * @throws TpError as {@link randn}; E_OOM from the backend
 */
export function randnTensor(
  backend: Backend,
  seed: number | bigint,
  shape: Shape,
  options: RandnOptions = {},
): Tensor {
  return backend.upload(randn(seed, shape, options), shape, "f32", `noise(seed ${String(seed)})`);
}
