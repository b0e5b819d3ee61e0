/**
 * Test helpers of the cuda backend (test code only): the float64 references its matmul, attention and
 * conv2d tests compare with, computed here from the definitions, independently of cuBLASLt's layouts
 * and cuDNN's graphs; bf16 rounding; the build of the stand-in libcudnn.so.9.
 */
import { join } from "node:path";

/**
 * y[t, o] = Σ_k x[t, k] · w[o, k] (+ b[o]) in float64: x [T, K], w [N, K] and y [T, N] row-major, b [N]
 * or null (the linear layer y = x·wᵀ + b).
 */
export function referenceLinear(
  x: readonly number[],
  w: readonly number[],
  b: readonly number[] | null,
  T: number,
  K: number,
  N: number,
): number[] {
  const y: number[] = [];
  for (let t = 0; t < T; t++)
    for (let o = 0; o < N; o++) {
      let s = b === null ? 0 : (b[o] as number);
      for (let k = 0; k < K; k++) s += (x[t * K + k] as number) * (w[o * K + k] as number);
      y.push(s);
    }
  return y;
}

/** The bf16 bits of `v` rounded to nearest even (from its f32 value; NaN → the quiet NaN 0x7fc0). */
export function bf16BitsRne(v: number): number {
  const u = new Uint32Array(new Float32Array([v]).buffer)[0] as number;
  if ((u & 0x7fffffff) > 0x7f800000) return 0x7fc0;
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}

/** The value of bf16 bits. */
export function bf16Value(bits: number): number {
  return new Float32Array(new Uint32Array([bits << 16]).buffer)[0] as number;
}

/**
 * Scaled dot-product attention in float64: q [B, H, Sq, D], k / v [B, Hk, Skv, D] row-major; query
 * head h reads kv head ⌊h / (H / Hk)⌋; with `causal`, query i sees key j only when j ≤ qOffset + i.
 * out[b, h, i] = Σ_j softmax_j(scale · q_i·k_j) v_j (the definition of "Attention Is All You Need" §3.2.1).
 */
export function referenceAttention(
  q: ArrayLike<number>,
  k: ArrayLike<number>,
  v: ArrayLike<number>,
  s: {
    batch: number;
    heads: number;
    kvHeads: number;
    sq: number;
    skv: number;
    headDim: number;
    scale: number;
    causal: boolean;
    qOffset: number;
  },
): number[] {
  const { batch, heads, kvHeads, sq, skv, headDim: d } = s;
  const out: number[] = [];
  for (let b = 0; b < batch; b++)
    for (let h = 0; h < heads; h++) {
      const kh = Math.floor(h / (heads / kvHeads));
      for (let i = 0; i < sq; i++) {
        const logits: number[] = [];
        for (let j = 0; j < skv; j++) {
          if (s.causal && j > s.qOffset + i) {
            logits.push(Number.NEGATIVE_INFINITY);
            continue;
          }
          let dot = 0;
          for (let e = 0; e < d; e++)
            dot +=
              (q[((b * heads + h) * sq + i) * d + e] as number) *
              (k[((b * kvHeads + kh) * skv + j) * d + e] as number);
          logits.push(s.scale * dot);
        }
        const m = Math.max(...logits);
        const w = logits.map((x) => Math.exp(x - m));
        const z = w.reduce((a, x) => a + x, 0);
        for (let e = 0; e < d; e++) {
          let acc = 0;
          for (let j = 0; j < skv; j++)
            acc += (w[j] as number) * (v[((b * kvHeads + kh) * skv + j) * d + e] as number);
          out.push(acc / z);
        }
      }
    }
  return out;
}

/**
 * conv2d (cross-correlation, as torch.nn.functional.conv2d) in float64: x [N, C, H, W], w [K, C, R, S],
 * out [N, K, Ho, Wo] with Ho = ⌊(H + 2·ph − R) / sh⌋ + 1 (zero padding), plus bias [K] when given.
 */
export function referenceConv2d(
  x: ArrayLike<number>,
  w: ArrayLike<number>,
  bias: ArrayLike<number> | null,
  s: {
    n: number;
    c: number;
    h: number;
    w: number;
    k: number;
    r: number;
    s: number;
    stride: [number, number];
    pad: [number, number];
  },
): number[] {
  const ho = Math.floor((s.h + 2 * s.pad[0] - s.r) / s.stride[0]) + 1;
  const wo = Math.floor((s.w + 2 * s.pad[1] - s.s) / s.stride[1]) + 1;
  const out: number[] = [];
  for (let n = 0; n < s.n; n++)
    for (let k = 0; k < s.k; k++)
      for (let oy = 0; oy < ho; oy++)
        for (let ox = 0; ox < wo; ox++) {
          let acc = bias === null ? 0 : (bias[k] as number);
          for (let c = 0; c < s.c; c++)
            for (let r = 0; r < s.r; r++)
              for (let t = 0; t < s.s; t++) {
                const iy = oy * s.stride[0] - s.pad[0] + r;
                const ix = ox * s.stride[1] - s.pad[1] + t;
                if (iy < 0 || ix < 0 || iy >= s.h || ix >= s.w) continue;
                acc +=
                  (x[((n * s.c + c) * s.h + iy) * s.w + ix] as number) *
                  (w[((k * s.c + c) * s.r + r) * s.s + t] as number);
              }
          out.push(acc);
        }
  return out;
}

/**
 * Build the stand-in cuDNN (../test/fake-cudnn.c) into `folder` as libcudnn.so.9 with the C compiler
 * `cc`; returns the compiler's stderr and exit code.
 */
export function buildFakeCudnn(
  folder: string,
  cc = Bun.which("cc") ?? Bun.which("gcc") ?? "cc",
): {
  stderr: string;
  exitCode: number;
} {
  const r = Bun.spawnSync([
    cc,
    "-O1",
    "-shared",
    "-fPIC",
    "-o",
    join(folder, "libcudnn.so.9"),
    join(import.meta.dir, "../test/fake-cudnn.c"),
    "-lm",
  ]);
  return { stderr: r.stderr.toString(), exitCode: r.exitCode };
}
