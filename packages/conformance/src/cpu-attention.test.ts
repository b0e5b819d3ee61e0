/**
 * Attention of the cpu backend on KV-cache views at decoding sizes, at every ISA level this CPU has and
 * on 1 and 2 threads, against the f64 reference (./reference/attention.ts). The shared suite
 * (./cases/attention.ts) has the same layouts at sizes every backend runs; these are the larger ones
 * that take the cpu kernel's decoding paths: K and V read in place through the cache's strides,
 * S from K rows without a transposed block, V rows read in place (head_dim_v a multiple of 64), and
 * the keys split over threads when there are fewer (batch × kv head) tasks than threads (then merged).
 * Also: the native entry point's own checks (a view past its buffer, aliasing or overlapping output).
 */
import { afterAll, describe, expect, test } from "bun:test";
import { CPU_ISA, type CpuIsa, createBackend, loadCpuLibrary } from "@tp/backend-cpu";
import { type AttentionOptions, type Backend, type Tensor, TpError } from "@tp/tensor";
import { compare } from "./compare.ts";
import { gaussian } from "./data.ts";
import { attentionRef } from "./reference/index.ts";
import { ATTENTION } from "./tolerances.ts";

const lib = loadCpuLibrary();
const BEST = lib.createContext(1).isa;
const ISAS = (Object.keys(CPU_ISA) as CpuIsa[]).filter((i) => CPU_ISA[i] <= CPU_ISA[BEST]);
const backends: Backend[] = [];
afterAll(() => {
  for (const b of backends) b.dispose();
});
function backendFor(isa: CpuIsa, threads: number): Backend {
  const b = createBackend({ threads, maxIsa: isa });
  backends.push(b);
  return b;
}

interface CacheCase {
  heads: number;
  kvHeads: number;
  sq: number;
  len: number;
  capacity: number;
  dim: number;
  options: AttentionOptions;
  note: string;
}

const CASES: CacheCase[] = [
  { heads: 16, kvHeads: 8, sq: 1, len: 257, capacity: 300, dim: 128, options: {}, note: "Qwen3-0.6B decode" },
  {
    heads: 4,
    kvHeads: 1,
    sq: 1,
    len: 1500,
    capacity: 1600,
    dim: 64,
    options: {},
    note: "one kv head: split",
  },
  {
    heads: 8,
    kvHeads: 1,
    sq: 1,
    len: 2100,
    capacity: 2100,
    dim: 128,
    options: { causal: true, window: 1000, softcap: 30 },
    note: "split, window (early chunks see nothing), softcap",
  },
  {
    heads: 8,
    kvHeads: 2,
    sq: 7,
    len: 300,
    capacity: 512,
    dim: 64,
    options: { causal: true },
    note: "chunk of 7",
  },
];

/** Run one case on `b`: q [1, sq, heads, dim] permuted, k / v views of caches whose unused rows are NaN. */
async function runCacheCase(b: Backend, c: CacheCase, seed: number): Promise<string[]> {
  const { heads, kvHeads, sq, len, capacity, dim } = c;
  const qData = gaussian(seed, heads * sq * dim);
  const kData = gaussian(seed + 1, kvHeads * len * dim);
  const vData = gaussian(seed + 2, kvHeads * len * dim);
  // the caches: row j of kv head h at (j · kvHeads + h) · dim; rows ≥ len are NaN
  const cache = (data: Float32Array) => {
    const out = new Float32Array(capacity * kvHeads * dim).fill(Number.NaN);
    for (let h = 0; h < kvHeads; h++)
      for (let j = 0; j < len; j++)
        for (let t = 0; t < dim; t++)
          out[(j * kvHeads + h) * dim + t] = data[(h * len + j) * dim + t] as number;
    return out;
  };
  const qStored = new Float32Array(sq * heads * dim); // [1, sq, heads, dim]
  for (let h = 0; h < heads; h++)
    for (let i = 0; i < sq; i++)
      for (let t = 0; t < dim; t++)
        qStored[(i * heads + h) * dim + t] = qData[(h * sq + i) * dim + t] as number;
  const q = b.upload(qStored, [1, sq, heads, dim], "f32");
  const kc = b.upload(cache(kData), [capacity, kvHeads, dim], "f32");
  const vc = b.upload(cache(vData), [capacity, kvHeads, dim], "f32");
  const view = (t: Tensor) => t.slice(0, 0, len).reshape(1, len, kvHeads, dim).permute(0, 2, 1, 3);
  const before = b.memory.current;
  const out = b.attention(q.permute(0, 2, 1, 3), view(kc), view(vc), c.options);
  // nothing but the output was allocated: no contiguous copies of q, k or v
  const extra = b.memory.current - before - out.byteLength;
  const got = await b.read(out);
  for (const t of [out, q, kc, vc]) b.free(t);
  const want = attentionRef(
    { shape: [1, heads, sq, dim], data: qData },
    { shape: [1, kvHeads, len, dim], data: kData },
    { shape: [1, kvHeads, len, dim], data: vData },
    c.options,
  );
  const mismatch = compare(got as Float32Array, want, ATTENTION);
  const problems = mismatch === null ? [] : [mismatch];
  if (extra !== 0) problems.push(`${extra} bytes besides the output were allocated (a copy of a view?)`);
  return problems;
}

describe(`attention on KV-cache views (${ISAS.join(", ")}; 1 and 2 threads)`, () => {
  for (const isa of ISAS) {
    for (const threads of [1, 2]) {
      const b = backendFor(isa, threads);
      CASES.forEach((c, i) => {
        test(`${isa}, ${threads} thread(s): heads ${c.heads}/${c.kvHeads}, sq ${c.sq}, ${c.len} of ${c.capacity} cached, dim ${c.dim}: ${c.note}`, async () => {
          expect(await runCacheCase(b, c, 5000 + 10 * i)).toEqual([]);
        });
      });
    }
  }
});

describe("tp_cpu_attention_strided_f32 checks its views (no native crash)", () => {
  const ctx = lib.createContext(2);
  afterAll(() => ctx.destroy());
  const call = (lens: number[], strides: number[], out: Float32Array, q: Float32Array) =>
    ctx.lib.raw.tp_cpu_attention_strided_f32(
      ctx.handle,
      q,
      q,
      q,
      out,
      BigUint64Array.from(lens, BigInt),
      BigInt64Array.from(strides, BigInt),
      1,
      2,
      1,
      1,
      4,
      8,
      8,
      1,
      0,
      0,
      0,
      0,
      0,
    );
  const q = new Float32Array(64);
  const out = new Float32Array(16);
  // q [1, 2, 1, 8] contiguous; k = v [1, 1, 4, 8] in q's buffer; out [1, 2, 1, 8]
  const good = [16, 8, 8, 32, 32, 8, 32, 32, 8, 16, 8, 8];
  test("a good call passes; a view past its len, aliasing out strides, a negative stride are E_ARG", () => {
    expect(call([64, 64, 64, 16], good, out, q)).toBe(0);
    const bad: [number[], number[], RegExp][] = [
      [[64, 31, 64, 16], good, /reaches past its buffer/],
      [[64, 64, 64, 16], [...good.slice(0, 9), 16, 0, 8], /map two elements to one address/],
      [[64, 64, 64, 16], [...good.slice(0, 3), -1, ...good.slice(4)], /outside \[0, 2\^40\]/],
    ];
    for (const [lens, strides, message] of bad) {
      expect(call(lens, strides, out, q)).not.toBe(0);
      expect(ctx.lastError()).toMatch(message);
    }
    expect(call([64, 64, 64, 64], good, q, q)).not.toBe(0); // out = q
    expect(ctx.lastError()).toMatch(/out overlaps q, k or v/);
  });
  test("a view with a strided last dimension is read through a copy; a freed view is E_STATE", () => {
    const b = backendFor(BEST, 2);
    const k = b.upload(gaussian(1, 2 * 16 * 8), [1, 2, 16, 8], "f32");
    const k2 = k.slice(-1, 0, 8, 2); // [1, 2, 16, 4], last stride 2
    const qq = b.upload(gaussian(2, 2 * 4), [1, 2, 1, 4], "f32");
    const o = b.attention(qq, k2, k2);
    expect(o.shape).toEqual([1, 2, 1, 4]);
    b.free(o);
    b.free(qq);
    b.free(k);
    expect(() => b.attention(qq, k2, k2)).toThrow(TpError); // freed
  });
});
