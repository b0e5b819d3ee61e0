/**
 * `bun run bench ops`: the non-matmul kernels of the cpu backend (all threads, best ISA level)
 * against plain TypeScript loops over Float32Array on the same data, in one process — the "naive
 * loop" a kernel has to beat by a wide margin. Attention is also measured at a Krea 2 DiT shape
 * (seq 1280, 48 / 12 heads of 128) without a peer. Units: GFLOP/s (attention, conv2d: 2 flops per
 * multiply-add, causal counts the visible half) or GB/s of input read (norm, softmax, silu).
 */
import { createBackend } from "@tp/backend-cpu";
import type { Tensor } from "@tp/tensor";

const b = createBackend();

function seconds(fn: () => void): number {
  const t0 = performance.now();
  fn();
  return (performance.now() - t0) / 1000;
}

function randn(n: number, seed: number): Float32Array {
  let s = seed >>> 0;
  return Float32Array.from({ length: n }, () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return (s / 2 ** 32 - 0.5) * 3.4;
  });
}

/** Time one op call (output freed). */
function timeOp(fn: () => Tensor): number {
  let out: Tensor | undefined;
  const t = seconds(() => {
    out = fn();
  });
  if (out) b.free(out);
  return t;
}

/**
 * A case of `work` units (GB of input read, or GFLOP) per call of `op`, reported in `unit` = work per
 * second, against the same work done by `naive`, a plain TS loop (null: no peer). `runs`: the case's own.
 */
function throughputCase(
  name: string,
  unit: "GB/s" | "GFLOP/s",
  work: number,
  op: () => Tensor,
  naive: (() => void) | null,
  runs?: number,
) {
  return {
    case: name,
    metric: "throughput",
    unit,
    better: "higher" as const,
    ...(runs === undefined ? {} : { runs }),
    ours: () => work / timeOp(op),
    ...(naive === null ? {} : { peer: { name: "naive TS loop", run: () => work / seconds(naive) } }),
  };
}

/** Naive attention: for each query, the whole score row, softmax, weighted sum (f32 arrays). */
function naiveAttention(
  q: Float32Array,
  k: Float32Array,
  v: Float32Array,
  h: number,
  hkv: number,
  s: number,
  d: number,
  causal: boolean,
): Float32Array {
  const out = new Float32Array(h * s * d);
  const row = new Float32Array(s);
  const scale = 1 / Math.sqrt(d);
  for (let hh = 0; hh < h; hh++) {
    const kh = Math.floor(hh / (h / hkv));
    for (let i = 0; i < s; i++) {
      const n = causal ? i + 1 : s;
      let m = -Infinity;
      for (let j = 0; j < n; j++) {
        let acc = 0;
        for (let t = 0; t < d; t++)
          acc += (q[(hh * s + i) * d + t] as number) * (k[(kh * s + j) * d + t] as number);
        row[j] = acc * scale;
        if ((row[j] as number) > m) m = row[j] as number;
      }
      let sum = 0;
      for (let j = 0; j < n; j++) {
        row[j] = Math.exp((row[j] as number) - m);
        sum += row[j] as number;
      }
      for (let j = 0; j < n; j++) {
        const w = (row[j] as number) / sum;
        for (let t = 0; t < d; t++)
          out[(hh * s + i) * d + t] =
            (out[(hh * s + i) * d + t] as number) + w * (v[(kh * s + j) * d + t] as number);
      }
    }
  }
  return out;
}

function attentionCase(h: number, hkv: number, s: number, d: number, causal: boolean, withPeer: boolean) {
  const q = randn(h * s * d, 1);
  const k = randn(hkv * s * d, 2);
  const v = randn(hkv * s * d, 3);
  const qt = b.upload(q, [1, h, s, d], "f32");
  const kt = b.upload(k, [1, hkv, s, d], "f32");
  const vt = b.upload(v, [1, hkv, s, d], "f32");
  const flops = 4 * h * s * s * d * (causal ? 0.5 : 1);
  return throughputCase(
    `attention ${h}/${hkv} heads × ${d}, seq ${s}${causal ? ", causal" : ""}`,
    "GFLOP/s",
    flops / 1e9,
    () => b.attention(qt, kt, vt, { causal }),
    withPeer ? () => naiveAttention(q, k, v, h, hkv, s, d, causal) : null,
    3,
  );
}

function rmsNormCase(rows: number, dim: number) {
  const x = randn(rows * dim, 4);
  const w = randn(dim, 5);
  const xt = b.upload(x, [rows, dim], "f32");
  const wt = b.upload(w, [dim], "f32");
  const out = new Float32Array(rows * dim);
  const gb = (rows * dim * 4) / 1e9;
  return throughputCase(
    `rms_norm [${rows}, ${dim}], 1 + weight`,
    "GB/s",
    gb,
    () => b.rmsNorm(xt, wt, { eps: 1e-6, unitOffset: true }),
    () => {
      for (let r = 0; r < rows; r++) {
        let ss = 0;
        for (let i = 0; i < dim; i++) ss += (x[r * dim + i] as number) ** 2;
        const inv = 1 / Math.sqrt(ss / dim + 1e-6);
        for (let i = 0; i < dim; i++)
          out[r * dim + i] = (x[r * dim + i] as number) * inv * (1 + (w[i] as number));
      }
    },
  );
}

function softmaxCase(rows: number, n: number) {
  const x = randn(rows * n, 6);
  const xt = b.upload(x, [rows, n], "f32");
  const out = new Float32Array(rows * n);
  const gb = (rows * n * 4) / 1e9;
  return throughputCase(
    `softmax [${rows}, ${n}]`,
    "GB/s",
    gb,
    () => b.softmax(xt),
    () => {
      for (let r = 0; r < rows; r++) {
        let m = -Infinity;
        for (let i = 0; i < n; i++) m = Math.max(m, x[r * n + i] as number);
        let s = 0;
        for (let i = 0; i < n; i++) {
          const e = Math.exp((x[r * n + i] as number) - m);
          out[r * n + i] = e;
          s += e;
        }
        for (let i = 0; i < n; i++) out[r * n + i] = (out[r * n + i] as number) / s;
      }
    },
  );
}

function siluCase(n: number) {
  const x = randn(n, 7);
  const xt = b.upload(x, [n], "f32");
  const out = new Float32Array(n);
  const gb = (n * 4) / 1e9;
  return throughputCase(
    `silu [${n}]`,
    "GB/s",
    gb,
    () => b.silu(xt),
    () => {
      for (let i = 0; i < n; i++) out[i] = (x[i] as number) / (1 + Math.exp(-(x[i] as number)));
    },
  );
}

function conv2dCase(c: number, hw: number) {
  const x = randn(c * hw * hw, 8);
  const w = randn(c * c * 9, 9);
  const xt = b.upload(x, [1, c, hw, hw], "f32");
  const wt = b.upload(w, [c, c, 3, 3], "f32");
  const out = new Float32Array(c * hw * hw);
  const flops = 2 * c * c * 9 * hw * hw;
  return throughputCase(
    `conv2d 3×3 ${c} → ${c}, ${hw}×${hw}, padding 1`,
    "GFLOP/s",
    flops / 1e9,
    () => b.conv2d(xt, wt, null, { padding: 1 }),
    () => {
      out.fill(0);
      for (let co = 0; co < c; co++)
        for (let ci = 0; ci < c; ci++)
          for (let dy = 0; dy < 3; dy++)
            for (let dx = 0; dx < 3; dx++) {
              const wv = w[((co * c + ci) * 3 + dy) * 3 + dx] as number;
              for (let y = 0; y < hw; y++) {
                const iy = y + dy - 1;
                if (iy < 0 || iy >= hw) continue;
                for (let xx = 0; xx < hw; xx++) {
                  const ix = xx + dx - 1;
                  if (ix < 0 || ix >= hw) continue;
                  out[(co * hw + y) * hw + xx] =
                    (out[(co * hw + y) * hw + xx] as number) + wv * (x[(ci * hw + iy) * hw + ix] as number);
                }
              }
            }
    },
    3,
  );
}

export default {
  description: `non-matmul kernels of the cpu backend (${b.device}) vs naive TypeScript loops`,
  cases: () => [
    attentionCase(4, 1, 512, 128, false, true),
    attentionCase(4, 1, 512, 128, true, true),
    attentionCase(48, 12, 1280, 128, false, false),
    rmsNormCase(1024, 6144),
    softmaxCase(16, 151936),
    siluCase(1 << 22),
    conv2dCase(64, 64),
  ],
  teardown: () => b.dispose(),
};
