// Samplers: the PRNGs against their authors' reference outputs; each stage on a distribution whose
// probabilities are powers of two, so every expected number is derived by hand; the fast path against
// a literal stage-by-stage twin (transformers' masking semantics) on random logits, and bit for bit
// against a full-sort reference (distributions, draws, penalties, backend top-k candidates);
// determinism under a seed; and the edge cases (all −∞ but one, ties, k > vocab, top_k = 0).
import { describe, expect, test } from "bun:test";
import { TpError } from "@tp/tensor";
import {
  applyPenalties,
  argmax,
  DEFAULT_SAMPLING,
  Sampler,
  type SamplingParams,
  samplingDistribution,
  samplingParams,
  splitmix64,
  Xoshiro128,
} from "./sampling.ts";

/** f64 round-off of exp/log/sums: probabilities agree to this. */
const PROB_TOL = 1e-12;

/**
 * Logits whose softmax is [1/2, 1/4, 1/8, 1/8] (to f64 round-off): 0, −ln 2, −2 ln 2, −2 ln 2 in f64.
 * The thresholds below stay clear of exact ties with these values, so round-off cannot flip a test.
 */
const QUARTER = Float64Array.from([0, -Math.LN2, -2 * Math.LN2, -2 * Math.LN2]);

function dist(logits: ArrayLike<number>, p: Partial<SamplingParams>): [number[], number[]] {
  const d = samplingDistribution(logits, { temperature: 1, topK: 0, topP: 1, minP: 0, ...p });
  return [Array.from(d.ids), Array.from(d.probs)];
}

function expectProbs(got: number[], want: number[]): void {
  expect(got.length).toBe(want.length);
  for (const [i, g] of got.entries()) expect(Math.abs(g - (want[i] as number))).toBeLessThan(PROB_TOL);
}

function thrown(f: () => unknown): TpError {
  try {
    f();
  } catch (e) {
    if (e instanceof TpError) return e;
    throw e;
  }
  throw new Error("expected a TpError, none was thrown");
}

describe("PRNG", () => {
  test("xoshiro128** from state {1, 2, 3, 4} gives the reference outputs (xoshiro128starstar.c)", () => {
    const g = Xoshiro128.fromState(1, 2, 3, 4);
    const out = Array.from({ length: 10 }, () => g.nextU32());
    expect(out).toEqual([
      11520, 0, 5927040, 70819200, 2031721883, 1637235492, 1287239034, 3734860849, 3729100597, 4258142804,
    ]);
  });

  test("splitmix64 from 1234567 gives the reference outputs (splitmix64.c)", () => {
    let s = 1234567n;
    const out: bigint[] = [];
    for (let i = 0; i < 5; i++) {
      const [next, v] = splitmix64(s);
      s = next;
      out.push(v);
    }
    expect(out).toEqual([
      6457827717110365317n,
      3203168211198807973n,
      9817491932198370423n,
      4593380528125082431n,
      16408922859458223821n,
    ]);
  });

  test("doubles are in [0, 1) and a seed gives one stream", () => {
    const a = new Xoshiro128(42);
    const b = new Xoshiro128(42n);
    for (let i = 0; i < 1000; i++) {
      const x = a.nextDouble();
      expect(x).toBeGreaterThanOrEqual(0);
      expect(x).toBeLessThan(1);
      expect(b.nextDouble()).toBe(x);
    }
    expect(new Xoshiro128(43).nextDouble()).not.toBe(new Xoshiro128(42).nextDouble());
  });
});

describe("stages, derived by hand on p = [1/2, 1/4, 1/8, 1/8]", () => {
  test("no filter: every id, in id order, with its probability", () => {
    const [ids, probs] = dist(QUARTER, {});
    expect(ids).toEqual([0, 1, 2, 3]);
    expectProbs(probs, [0.5, 0.25, 0.125, 0.125]);
  });

  test("temperature: p_i ∝ p_i^(1/T)", () => {
    // T = 0.5: squares 1/4, 1/16, 1/64, 1/64 sum to 22/64 → 16/22, 4/22, 1/22, 1/22
    expectProbs(dist(QUARTER, { temperature: 0.5 })[1], [8 / 11, 2 / 11, 1 / 22, 1 / 22]);
    // T = 2: square roots 1/√2, 1/2, 1/√8, 1/√8
    const r = [Math.SQRT1_2, 0.5, 1 / Math.sqrt(8), 1 / Math.sqrt(8)];
    const z = r.reduce((a, b) => a + b, 0);
    expectProbs(
      dist(QUARTER, { temperature: 2 })[1],
      r.map((x) => x / z),
    );
  });

  test("top-k: the k best renormalised; ties with the k-th are kept; k > vocab keeps all", () => {
    expect(dist(QUARTER, { topK: 1 })).toEqual([[0], [1]]);
    const [ids2, p2] = dist(QUARTER, { topK: 2 });
    expect(ids2).toEqual([0, 1]);
    expectProbs(p2, [2 / 3, 1 / 3]);
    // k = 3: the 3rd value (1/8) is tied with id 3, which stays (transformers: remove only < k-th)
    const [ids3, p3] = dist(QUARTER, { topK: 3 });
    expect(ids3).toEqual([0, 1, 2, 3]);
    expectProbs(p3, [0.5, 0.25, 0.125, 0.125]);
    expect(dist(QUARTER, { topK: 100 })[0]).toEqual([0, 1, 2, 3]);
  });

  test("top-p: keep tokens while the mass before them is below top_p", () => {
    expect(dist(QUARTER, { topP: 0.45 })[0]).toEqual([0]); // mass before id 1 is 1/2, not < 0.45
    const [ids, p] = dist(QUARTER, { topP: 0.7 });
    expect(ids).toEqual([0, 1]);
    expectProbs(p, [2 / 3, 1 / 3]);
    const [ids8, p8] = dist(QUARTER, { topP: 0.8 });
    expect(ids8).toEqual([0, 1, 2]);
    expectProbs(p8, [4 / 7, 2 / 7, 1 / 7]);
    expect(dist(QUARTER, { topP: 0 })[0]).toEqual([0]); // at least one token survives
  });

  test("min-p: keep p ≥ min_p · p_max", () => {
    const [ids, p] = dist(QUARTER, { minP: 0.3 }); // threshold 0.15
    expect(ids).toEqual([0, 1]);
    expectProbs(p, [2 / 3, 1 / 3]);
    expect(dist(QUARTER, { minP: 0.24 })[0]).toEqual([0, 1, 2, 3]); // threshold 0.12: both 1/8 stay
    expect(dist(QUARTER, { minP: 1 })[0]).toEqual([0]);
  });

  test("Hugging Face order: temperature before top-p and min-p", () => {
    // T = 0.5 gives [8/11, 2/11, 1/22, 1/22]; top-p 0.9 keeps two (8/11 < 0.9, 10/11 ≥ 0.9) → [0.8, 0.2].
    // (llama.cpp applies temperature last, so its top-p 0.9 would keep three: 1/2 + 1/4 < 0.9.)
    const [ids, p] = dist(QUARTER, { temperature: 0.5, topP: 0.9 });
    expect(ids).toEqual([0, 1]);
    expectProbs(p, [0.8, 0.2]);
    // min-p 0.2 at T = 0.5: threshold 0.2 · 8/11 = 0.145; 2/11 = 0.18 stays, 1/22 goes
    expect(dist(QUARTER, { temperature: 0.5, minP: 0.2 })[0]).toEqual([0, 1]);
    // and at T = 1 the same min-p keeps 1/8 = 0.125 ≥ 0.1
    expect(dist(QUARTER, { minP: 0.2 })[0]).toEqual([0, 1, 2, 3]);
  });

  test("stages compose: top-k 3 then top-p 0.8 then min-p 0.4", () => {
    // top-k 3 keeps all four (tie); top-p 0.8 keeps [0, 1, 2]; min-p 0.4 (≥ 0.2) keeps [0, 1]
    const [ids, p] = dist(QUARTER, { topK: 3, topP: 0.8, minP: 0.4 });
    expect(ids).toEqual([0, 1]);
    expectProbs(p, [2 / 3, 1 / 3]);
  });
});

describe("penalties", () => {
  test("repetition: divide positive, multiply negative, once per distinct id in the window", () => {
    const l = Float32Array.from([2, -1, 0.5, 3]);
    applyPenalties(l, [0, 1, 1, 2], {
      repeatPenalty: 2,
      repeatLastN: 64,
      presencePenalty: 0,
      frequencyPenalty: 0,
    });
    expect(Array.from(l)).toEqual([1, -2, 0.25, 3]);
  });

  test("only the last repeat_last_n ids count; 0 disables; -1 means all", () => {
    const base = { repeatPenalty: 2, presencePenalty: 0, frequencyPenalty: 0 };
    const a = Float32Array.from([2, 2, 2]);
    applyPenalties(a, [0, 1, 2], { ...base, repeatLastN: 2 });
    expect(Array.from(a)).toEqual([2, 1, 1]);
    const b = Float32Array.from([2, 2, 2]);
    applyPenalties(b, [0, 1, 2], { ...base, repeatLastN: 0 });
    expect(Array.from(b)).toEqual([2, 2, 2]);
    const c = Float32Array.from([2, 2, 2]);
    applyPenalties(c, [0, 1, 2], { ...base, repeatLastN: -1 });
    expect(Array.from(c)).toEqual([1, 1, 1]);
  });

  test("presence once, frequency per occurrence (llama.cpp)", () => {
    const l = Float64Array.from([1, 1, 1]);
    applyPenalties(l, [0, 0, 0, 1], {
      repeatPenalty: 1,
      repeatLastN: 64,
      presencePenalty: 0.5,
      frequencyPenalty: 0.25,
    });
    expect(Array.from(l)).toEqual([1 - 0.75 - 0.5, 1 - 0.25 - 0.5, 1]);
  });

  test("penalties change the greedy choice and do not touch the caller's logits", () => {
    const logits = Float32Array.from([1, 1.5]);
    const s = new Sampler({ temperature: 0, repeatPenalty: 2 });
    expect(s.sample(logits, [1])).toBe(0); // 1.5 / 2 = 0.75 < 1
    expect(s.sample(logits, [])).toBe(1);
    expect(Array.from(logits)).toEqual([1, 1.5]);
  });
});

describe("edge cases", () => {
  test("greedy at temperature ≤ 0: argmax, lowest id on ties, NaN never chosen", () => {
    expect(new Sampler({ temperature: 0 }).sample(Float32Array.from([1, 3, 3, 2]))).toBe(1);
    expect(new Sampler({ temperature: -1 }).sample(Float32Array.from([Number.NaN, 0, -1]))).toBe(1);
    expect(argmax([Number.NEGATIVE_INFINITY, -5])).toBe(1);
  });

  test("all −∞ but one: that one, whatever the settings", () => {
    const l = Float32Array.from([
      Number.NEGATIVE_INFINITY,
      Number.NEGATIVE_INFINITY,
      3,
      Number.NEGATIVE_INFINITY,
    ]);
    for (const p of [
      {},
      { topK: 0, topP: 1, minP: 0 },
      { temperature: 5 },
      { temperature: 0 },
      { topK: 3, topP: 0.1 },
    ]) {
      const s = new Sampler({ ...p, seed: 1 });
      for (let i = 0; i < 5; i++) expect(s.sample(l)).toBe(2);
    }
  });

  test("all −∞ (or NaN) is E_ARG", () => {
    const l = Float32Array.from([Number.NEGATIVE_INFINITY, Number.NaN]);
    expect(thrown(() => new Sampler({ seed: 1 }).sample(l)).code).toBe("E_ARG");
    expect(thrown(() => new Sampler({ temperature: 0 }).sample(l)).code).toBe("E_ARG");
  });

  test("top_k = 0 means no limit (no hidden 512 cap, llm.md Appendix A)", () => {
    const flat = new Float32Array(2000); // uniform over 2000 ids
    expect(dist(flat, { topK: 0, topP: 0.9999 })[0].length).toBe(2000);
    expect(dist(flat, { topK: 0, minP: 0.5 })[0].length).toBe(2000);
    expect(dist(flat, { topK: 600 })[0].length).toBe(2000); // all tied with the 600th
  });

  test("parameters out of range are E_ARG naming the parameter", () => {
    for (const [p, name] of [
      [{ topK: -1 }, "top_k"],
      [{ topK: 1.5 }, "top_k"],
      [{ topP: 1.5 }, "top_p"],
      [{ minP: -0.1 }, "min_p"],
      [{ repeatPenalty: 0 }, "repeat_penalty"],
      [{ repeatLastN: -2 }, "repeat_last_n"],
      [{ temperature: Number.NaN }, "temperature"],
    ] as const) {
      const e = thrown(() => samplingParams(p));
      expect(e.code).toBe("E_ARG");
      expect(e.message).toContain(name);
    }
    expect(samplingParams({})).toEqual({ ...DEFAULT_SAMPLING });
  });
});

describe("draws", () => {
  test("a seed reproduces the stream; another seed gives another; reseed restarts", () => {
    const r = Float32Array.from({ length: 50 }, (_, i) => Math.sin(i) * 3);
    const run = (s: Sampler) => Array.from({ length: 200 }, () => s.sample(r));
    const a = run(new Sampler({ seed: 7, topK: 0, topP: 1, minP: 0 }));
    expect(run(new Sampler({ seed: 7, topK: 0, topP: 1, minP: 0 }))).toEqual(a);
    expect(run(new Sampler({ seed: 8, topK: 0, topP: 1, minP: 0 }))).not.toEqual(a);
    const s = new Sampler({ seed: 7, topK: 0, topP: 1, minP: 0 });
    run(s);
    s.reseed(7);
    expect(run(s)).toEqual(a);
    expect(new Sampler({ seed: 7 }).seed).toBe(7n);
  });

  test("draw frequencies follow the distribution (20,000 seeded draws, within 0.01)", () => {
    const s = new Sampler({ seed: 12345, temperature: 1, topK: 0, topP: 1, minP: 0 });
    const n = 20000;
    const counts = [0, 0, 0, 0];
    for (let i = 0; i < n; i++) (counts[s.sample(QUARTER)] as number)++;
    for (const [i, p] of [0.5, 0.25, 0.125, 0.125].entries())
      expect(Math.abs((counts[i] as number) / n - p)).toBeLessThan(0.01);
  });
});

describe("top_p = 0 (llama.cpp and transformers: the most likely token only)", () => {
  // 1000 logits in [-4, 4) from a fixed LCG; the largest computed here with a plain loop.
  let x = 12345;
  const row = Float32Array.from({ length: 1000 }, () => {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    return (x / 2 ** 32) * 8 - 4;
  });
  let top = 0;
  for (let i = 1; i < row.length; i++) if ((row[i] as number) > (row[top] as number)) top = i;

  test("the distribution is the top token with probability 1, whatever the other filters", () => {
    for (const temperature of [1e-6, 0.7, 1, 5])
      for (const topK of [0, 1, 40])
        for (const minP of [0, 0.05]) {
          const [ids, p] = dist(row, { temperature, topK, topP: 0, minP });
          expect([ids, p]).toEqual([[top], [1]]);
        }
    expect(samplingParams({ topP: 0 }).topP).toBe(0);
  });

  test("every draw is the top token, from the full row and from a backend's candidates", () => {
    const s = new Sampler({ seed: 3, temperature: 1.5, topK: 40, topP: 0, minP: 0 });
    const order = Array.from(row.keys()).sort((a, b) => (row[b] as number) - (row[a] as number));
    const cand = order.slice(0, s.candidateCount(row.length));
    for (let i = 0; i < 50; i++) {
      expect(s.sample(row)).toBe(top);
      expect(
        s.sampleFromCandidates(
          Float32Array.from(cand, (j) => row[j] as number),
          cand,
        ),
      ).toBe(top);
    }
    const wide = new Sampler({ seed: 4, temperature: 1, topK: 0, topP: 0, minP: 0 });
    for (let i = 0; i < 50; i++) expect(wide.sample(row)).toBe(top);
  });

  test("equal largest logits: the lowest id", () => {
    const tie = Float32Array.from([0, 2, 1, 2, 2, -1]);
    expect(dist(tie, { topP: 0 })).toEqual([[1], [1]]);
    const s = new Sampler({ seed: 5, temperature: 1, topK: 0, topP: 0, minP: 0 });
    for (let i = 0; i < 20; i++) expect(s.sample(tie)).toBe(1);
  });
});

/**
 * The naive twin: transformers' warpers applied literally on the full vocabulary — mask with −∞,
 * full sorts, softmax over everything — in f64.
 */
function naiveDistribution(logits: Float64Array, p: SamplingParams): Map<number, number> {
  let s = Array.from(logits, (v) => v / p.temperature);
  const softmax = (x: number[]) => {
    const m = Math.max(...x);
    const e = x.map((v) => (v === Number.NEGATIVE_INFINITY ? 0 : Math.exp(v - m)));
    const z = e.reduce((a, b) => a + b, 0);
    return e.map((v) => v / z);
  };
  const order = () =>
    s
      .map((v, i) => [v, i] as const)
      .filter(([v]) => v > Number.NEGATIVE_INFINITY)
      .sort((a, b) => b[0] - a[0] || a[1] - b[1])
      .map(([, i]) => i);
  if (p.topK > 0) {
    const sorted = [...s].sort((a, b) => b - a);
    const kth = sorted[Math.min(p.topK, s.length) - 1] as number;
    s = s.map((v) => (v < kth ? Number.NEGATIVE_INFINITY : v));
  }
  if (p.topP < 1) {
    const probs = softmax(s);
    let before = 0;
    const keep = new Set<number>();
    for (const i of order()) {
      if (keep.size > 0 && before >= p.topP) break;
      keep.add(i);
      before += probs[i] as number;
    }
    s = s.map((v, i) => (keep.has(i) ? v : Number.NEGATIVE_INFINITY));
  }
  if (p.minP > 0) {
    const probs = softmax(s);
    const top = Math.max(...probs);
    s = s.map((v, i) => ((probs[i] as number) < p.minP * top ? Number.NEGATIVE_INFINITY : v));
  }
  const probs = softmax(s);
  return new Map(order().map((i) => [i, probs[i] as number]));
}

describe("the heap-based distribution equals the literal stage-by-stage twin", () => {
  test("300 random logit vectors and parameter sets", () => {
    let seed = 99;
    const rand = () => {
      seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0;
      return seed / 4294967296;
    };
    for (let t = 0; t < 300; t++) {
      const n = 2 + Math.floor(rand() * 300);
      // coarse values so that ties occur
      const logits = Float64Array.from({ length: n }, () => Math.round((rand() * 8 - 4) * 4) / 4);
      const p: SamplingParams = {
        ...DEFAULT_SAMPLING,
        temperature: [0.3, 0.7, 1, 1.5][t % 4] as number,
        topK: [0, 1, 5, 40, 1000][Math.floor(rand() * 5)] as number,
        topP: [1, 0.95, 0.5, 0.1][Math.floor(rand() * 4)] as number,
        minP: [0, 0.05, 0.3][Math.floor(rand() * 3)] as number,
      };
      const want = naiveDistribution(logits, p);
      const got = samplingDistribution(logits, p);
      expect([...got.ids].sort((a, b) => a - b)).toEqual([...want.keys()].sort((a, b) => a - b));
      for (const [i, id] of got.ids.entries())
        expect(Math.abs((got.probs[i] as number) - (want.get(id) as number))).toBeLessThan(PROB_TOL);
    }
  });

  test("a 151,936-token vocabulary samples with top-k, and top_k = 0 with top-p keeps a wide set", () => {
    const n = 151936;
    const logits = new Float32Array(n);
    for (let i = 0; i < n; i++) logits[i] = Math.sin(i * 12.9898) * 8;
    const s = new Sampler({ seed: 1, temperature: 0.7, topK: 20, topP: 0.8, minP: 0 });
    const id = s.sample(logits, [1, 2, 3]);
    expect(s.distribution(logits, [1, 2, 3]).ids).toContain(id);
    const wide = new Sampler({ seed: 1, temperature: 1, topK: 0, topP: 0.9, minP: 0 }).distribution(logits);
    expect(wide.ids.length).toBeGreaterThan(512);
  });
});

// ------------------------------------------------------------------ fast paths against a full-sort reference

type Filters = Pick<SamplingParams, "temperature" | "topK" | "topP" | "minP">;

/**
 * The reference, written for obviousness: s = l/T for every entry (NaN and −∞ dropped), one full sort
 * by (s desc, id asc), f64 throughout, each stage exactly as defined. Its arithmetic is the one the
 * definition fixes: the normaliser of the cut is the sum over the top-k survivors in sorted order, or
 * over every finite entry in id order when top-k cuts nothing; the result is the softmax of the kept
 * ids in their order (id order when nothing is cut). So the fast paths must match it bit for bit.
 */
function reference(logits: ArrayLike<number>, p: Filters): { ids: number[]; probs: number[] } {
  const s = new Map<number, number>();
  for (let i = 0; i < logits.length; i++) {
    const v = (logits[i] as number) / p.temperature;
    if (v > Number.NEGATIVE_INFINITY) s.set(i, v);
  }
  if (s.size === 0) throw new TpError("E_ARG", "no finite logit");
  const sv = (i: number) => s.get(i) as number;
  const finite = [...s.keys()]; // id order
  let sMax = Number.NEGATIVE_INFINITY;
  for (const i of finite) if (sv(i) > sMax) sMax = sv(i);
  const softmax = (ids: number[]) => {
    let m = Number.NEGATIVE_INFINITY;
    for (const i of ids) m = Math.max(m, sv(i));
    const e = ids.map((i) => Math.exp(sv(i) - m));
    let z = 0;
    for (const x of e) z += x;
    return { ids, probs: e.map((x) => x / z) };
  };
  const topKCuts = p.topK > 0 && p.topK < finite.length;
  if (!topKCuts && p.topP >= 1 && p.minP <= 0) return softmax(finite);
  const sorted = [...finite].sort((a, b) => (sv(a) > sv(b) ? -1 : sv(a) < sv(b) ? 1 : a - b));
  let head = sorted;
  let z = 0;
  if (topKCuts) {
    const kth = sv(sorted[p.topK - 1] as number);
    head = sorted.filter((i) => sv(i) >= kth);
    for (const i of head) z += Math.exp(sv(i) - sMax);
  } else for (const i of finite) z += Math.exp(sv(i) - sMax);
  const kept: number[] = [];
  let cum = 0;
  for (const i of head) {
    const pi = Math.exp(sv(i) - sMax) / z;
    if (kept.length > 0 && (cum >= p.topP || pi < p.minP * (1 / z))) break;
    kept.push(i);
    cum += pi;
  }
  return softmax(kept);
}

/** The reference draw: one r from the stream, walked along the cumulative probabilities. */
function referenceDraw(d: { ids: number[]; probs: number[] }, rng: Xoshiro128): number {
  const r = rng.nextDouble();
  if (d.ids.length === 1) return d.ids[0] as number;
  let cum = 0;
  for (const [i, id] of d.ids.entries()) {
    cum += d.probs[i] as number;
    if (r < cum) return id;
  }
  return d.ids[d.ids.length - 1] as number;
}

/** A small deterministic generator for test data. */
function lcg(seed: number): () => number {
  let x = seed >>> 0;
  return () => {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    return x / 4294967296;
  };
}

const KINDS = ["smooth", "coarse", "holes", "peaked", "flat", "ramp", "fewFinite", "wide"] as const;

/** A random row of kind `kind`: ties (coarse, flat), −∞ and NaN (holes), ascending order (ramp), … */
function randomRow(
  n: number,
  kind: (typeof KINDS)[number],
  rand: () => number,
  f64 = false,
): Float32Array | Float64Array {
  const l = f64 ? new Float64Array(n) : new Float32Array(n);
  for (let i = 0; i < n; i++) {
    const u = rand() * 2 - 1;
    switch (kind) {
      case "smooth":
        l[i] = u * 6;
        break;
      case "coarse":
        l[i] = Math.round(u * 12) / 4;
        break;
      case "holes": {
        const h = rand();
        l[i] = h < 0.25 ? Number.NEGATIVE_INFINITY : h < 0.35 ? Number.NaN : Math.round(u * 16) / 4;
        break;
      }
      case "peaked":
        l[i] = rand() < 0.01 ? 10 + u * 4 : u * 3;
        break;
      case "flat":
        l[i] = 1.5;
        break;
      case "ramp":
        l[i] = i / 64;
        break;
      case "fewFinite":
        l[i] = rand() < 3 / n ? u * 4 : Number.NEGATIVE_INFINITY;
        break;
      case "wide":
        l[i] = u * 40;
        break;
    }
  }
  if (kind === "fewFinite") l[Math.floor(rand() * n)] = 0.5; // at least one finite
  return l;
}

function randomFilters(rand: () => number, n: number): Filters {
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)] as T;
  return {
    temperature: pick([0.05, 0.3, 0.7, 1, 1.5, 4]),
    topK: pick([0, 0, 1, 2, 5, 40, 300, n, n + 7]),
    topP: pick([1, 1, 0.99, 0.95, 0.8, 0.5, 0.1, 0]),
    minP: pick([0, 0, 0.01, 0.05, 0.3, 1]),
  };
}

function expectSameDistribution(
  got: { ids: Int32Array; probs: Float64Array },
  want: { ids: number[]; probs: number[] },
): void {
  expect(Array.from(got.ids)).toEqual(want.ids);
  expect(Array.from(got.probs)).toEqual(want.probs); // bit for bit
}

describe("the fast paths equal a full-sort reference bit for bit", () => {
  test("1,500 random rows × kinds × parameter sets (ties, −∞, NaN, k > vocab, top_p = 1, min_p = 0)", () => {
    const rand = lcg(2024);
    for (let t = 0; t < 1500; t++) {
      const kind = KINDS[t % KINDS.length] as (typeof KINDS)[number];
      const n = 1 + Math.floor(rand() * (t % 5 === 0 ? 3000 : 300));
      const row = randomRow(n, kind, rand, t % 7 === 0);
      const p = randomFilters(rand, n);
      let want: ReturnType<typeof reference>;
      try {
        want = reference(row, p);
      } catch {
        expect(thrown(() => samplingDistribution(row, p)).code).toBe("E_ARG");
        continue;
      }
      expectSameDistribution(samplingDistribution(row, p), want);
    }
  });

  test("151,936-entry rows: top-k 40, top-k 0 with top-p / min-p, ties past the k-th, ascending order", () => {
    const n = 151936;
    const rand = lcg(7);
    const cases: [(typeof KINDS)[number], Filters][] = [
      ["smooth", { temperature: 0.8, topK: 40, topP: 0.95, minP: 0.05 }],
      ["peaked", { temperature: 0.8, topK: 0, topP: 0.95, minP: 0 }],
      ["peaked", { temperature: 0.8, topK: 0, topP: 1, minP: 0.05 }],
      ["smooth", { temperature: 1, topK: 0, topP: 0.9, minP: 0 }],
      ["coarse", { temperature: 0.7, topK: 20, topP: 0.8, minP: 0 }],
      ["ramp", { temperature: 0.6, topK: 40, topP: 1, minP: 0 }],
      ["holes", { temperature: 1.2, topK: 0, topP: 0.5, minP: 0.01 }],
      ["wide", { temperature: 1, topK: 0, topP: 1, minP: 0 }],
    ];
    for (const [kind, p] of cases) {
      const row = randomRow(n, kind, rand);
      expectSameDistribution(samplingDistribution(row, p), reference(row, p));
    }
  }, 60_000);

  test("scales outside the fast paths' bounds (|l| > 1e100, T < 1e-200 or > 1e200) take the exact path", () => {
    const rand = lcg(31);
    for (let t = 0; t < 200; t++) {
      const n = 1 + Math.floor(rand() * 200);
      const row = randomRow(n, KINDS[t % KINDS.length] as (typeof KINDS)[number], rand, true);
      const scale = [1e150, 1, 1e-150][t % 3] as number;
      for (let i = 0; i < n; i++) row[i] = (row[i] as number) * scale;
      const p = { ...randomFilters(rand, n), temperature: [1e-201, 1e201, 1e-300, 0.5][t % 4] as number };
      let want: ReturnType<typeof reference>;
      try {
        want = reference(row, p);
      } catch {
        expect(thrown(() => samplingDistribution(row, p)).code).toBe("E_ARG");
        continue;
      }
      expectSameDistribution(samplingDistribution(row, p), want);
    }
  });

  test("Sampler draws equal reference draws, penalties included, and leave the logits alone", () => {
    const rand = lcg(99);
    for (let t = 0; t < 300; t++) {
      const n = 2 + Math.floor(rand() * 400);
      const row = randomRow(n, KINDS[t % KINDS.length] as (typeof KINDS)[number], rand) as Float32Array;
      const before = Array.from(row);
      const p = randomFilters(rand, n);
      const pen = {
        repeatPenalty: [1, 1.3, 0.8][t % 3] as number,
        repeatLastN: [64, -1, 0, 5][Math.floor(rand() * 4)] as number,
        presencePenalty: t % 4 === 0 ? 0.5 : 0,
        frequencyPenalty: t % 5 === 0 ? 0.25 : 0,
      };
      const recent = Array.from({ length: Math.floor(rand() * 100) }, () => Math.floor(rand() * n));
      const penalised = Float64Array.from(row);
      applyPenalties(penalised, recent, pen);
      let want: ReturnType<typeof reference>;
      try {
        want = reference(penalised, p);
      } catch {
        continue;
      }
      const seed = 1000 + t;
      const s = new Sampler({ ...p, ...pen, seed });
      const rng = new Xoshiro128(seed);
      expectSameDistribution(s.distribution(row, recent), want);
      for (let i = 0; i < 4; i++) expect(s.sample(row, recent)).toBe(referenceDraw(want, rng));
      expect(Array.from(row)).toEqual(before);
    }
  });
});

/** What a backend's topK(x, m) returns: the m largest, descending, NaN first, ties by ascending id. */
function backendTopK(row: ArrayLike<number>, m: number): { values: Float32Array; ids: Int32Array } {
  const key = (i: number) => (Number.isNaN(row[i] as number) ? Number.POSITIVE_INFINITY : (row[i] as number));
  const order = Array.from({ length: row.length }, (_, i) => i)
    .sort((a, b) => (key(a) > key(b) ? -1 : key(a) < key(b) ? 1 : a - b))
    .slice(0, m);
  return { values: Float32Array.from(order, (i) => row[i] as number), ids: Int32Array.from(order) };
}

describe("sampling from a backend's top candidates", () => {
  test("candidateCount: top_k + 1, or 0 for greedy, top_k = 0, k + 1 > vocab, or an active penalty", () => {
    expect(new Sampler({ topK: 40 }).candidateCount(151936)).toBe(41);
    expect(new Sampler({ topK: 40, temperature: 0 }).candidateCount(151936)).toBe(0);
    expect(new Sampler({ topK: 0 }).candidateCount(151936)).toBe(0);
    expect(new Sampler({ topK: 40 }).candidateCount(40)).toBe(0);
    expect(new Sampler({ topK: 40, repeatPenalty: 1.1 }).candidateCount(151936)).toBe(0);
    expect(new Sampler({ topK: 40, presencePenalty: 0.5 }).candidateCount(151936)).toBe(0);
    expect(new Sampler({ topK: 40, repeatPenalty: 1.1, repeatLastN: 0 }).candidateCount(151936)).toBe(41);
  });

  test("the same ids as sampling the full row, or undefined (no draw consumed) when they do not suffice", () => {
    const rand = lcg(5);
    let used = 0;
    let declined = 0;
    for (let t = 0; t < 600; t++) {
      const n = 2 + Math.floor(rand() * 500);
      const kind = KINDS[t % KINDS.length] as (typeof KINDS)[number];
      const row = randomRow(n, kind, rand) as Float32Array;
      const p = { ...randomFilters(rand, n), topK: [1, 2, 5, 40][t % 4] as number, seed: t };
      const a = new Sampler(p);
      const b = new Sampler(p);
      const m = a.candidateCount(n);
      if (m === 0) continue;
      const c = backendTopK(row, m);
      if (t % 3 === 0) {
        // any order will do
        const perm = Array.from({ length: m }, (_, i) => i).sort(() => rand() - 0.5);
        c.values = Float32Array.from(perm, (i) => c.values[i] as number);
        c.ids = Int32Array.from(perm, (i) => c.ids[i] as number);
      }
      let full: number | undefined;
      try {
        full = b.sample(row);
      } catch {
        continue; // all −∞/NaN
      }
      const suffice = a.candidatesSuffice(c.values, c.ids);
      const got = a.sampleFromCandidates(c.values, c.ids);
      expect(got !== undefined).toBe(suffice);
      if (got === undefined) {
        declined++;
        expect(a.sample(row)).toBe(full); // the stream was not touched
      } else {
        used++;
        expect(got).toBe(full);
        expect(a.sampleFromCandidates(c.values, c.ids)).toBe(b.sample(row)); // and stays in step
      }
    }
    expect(used).toBeGreaterThan(200);
    expect(declined).toBeGreaterThan(10); // ties past the k-th (coarse, flat), NaN
  });

  test("penalties and greedy never use the candidates", () => {
    const row = Float32Array.from([3, 2, 1, 0]);
    const c = backendTopK(row, 3);
    expect(
      new Sampler({ topK: 2, repeatPenalty: 2, seed: 1 }).sampleFromCandidates(c.values, c.ids),
    ).toBeUndefined();
    expect(new Sampler({ topK: 2, temperature: 0 }).sampleFromCandidates(c.values, c.ids)).toBeUndefined();
    expect(new Sampler({ topK: 2, seed: 1 }).sampleFromCandidates(c.values, c.ids)).toBeOneOf([0, 1]);
  });
});
