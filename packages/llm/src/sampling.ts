/**
 * Token sampling on host logits, in the Hugging Face order (llm.md §11.2 decision 1):
 *
 *   penalties (repetition: divide positive / multiply negative; presence; frequency)
 *   → greedy argmax when temperature ≤ 0
 *   → temperature → top-k → top-p → min-p → renormalise → draw with a seeded PRNG.
 *
 * Because temperature comes first, top-p and min-p act on the tempered distribution, as in
 * transformers and vLLM; llama.cpp applies temperature last (llm.md §6.2), so its top-p/min-p sets
 * differ at T ≠ 1 (greedy decoding is the same in both).
 *
 * Sources: transformers `generation/logits_process.py` (`RepetitionPenaltyLogitsProcessor`,
 * `TemperatureLogitsWarper`, `TopKLogitsWarper`, `TopPLogitsWarper`, `MinPLogitsWarper`) and
 * `generation/utils.py` `_get_logits_processor` (the order); ../shared/spec/llm.md §6 (the Zig
 * sampler, defaults, seeding) and Appendix A (`top_k = 0` means no limit — no hidden 512 cap);
 * llama.cpp `src/llama-sampling.cpp` `llama_sampler_penalties_apply` (presence/frequency formula,
 * `repeat_last_n`).
 */
import { TpError } from "@tp/tensor";

/** Sampling parameters; field names follow llama.cpp's flags. */
export interface SamplingParams {
  /** Divides the logits; ≤ 0 means greedy (argmax). */
  temperature: number;
  /** Keep the k most likely tokens (ties with the k-th are kept, as transformers does); 0 = no limit. */
  topK: number;
  /** Keep the most likely tokens until their probability mass reaches top_p; 1 = off. */
  topP: number;
  /** Keep tokens whose probability is at least min_p × the top token's; 0 = off. */
  minP: number;
  /** Repetition penalty θ: a recent token's logit l becomes l/θ if l > 0, else l·θ; 1 = off. */
  repeatPenalty: number;
  /** How many of the most recent context tokens the penalties scan; 0 disables penalties, -1 = all. */
  repeatLastN: number;
  /** Subtracted once from the logit of every token in the window (OpenAI/llama.cpp); 0 = off. */
  presencePenalty: number;
  /** Subtracted per occurrence in the window; 0 = off. */
  frequencyPenalty: number;
}

/**
 * llama.cpp's defaults (`common/common.h` `common_params_sampling`): temperature 0.8, top-k 40,
 * top-p 0.95, min-p 0.05, repeat penalty off over the last 64 tokens. Model cards often recommend
 * others (Qwen3 thinking: 0.6 / 20 / 0.95 / 0; Gemma 3: 1.0 / 64 / 0.95), see llm.md §5.
 */
export const DEFAULT_SAMPLING: Readonly<SamplingParams> = Object.freeze({
  temperature: 0.8,
  topK: 40,
  topP: 0.95,
  minP: 0.05,
  repeatPenalty: 1,
  repeatLastN: 64,
  presencePenalty: 0,
  frequencyPenalty: 0,
});

/** Options of a {@link Sampler}: any sampling parameter, plus the seed. */
export interface SamplerOptions extends Partial<SamplingParams> {
  /** PRNG seed (any integer; reduced mod 2^64). Default: the wall clock, readable back as `sampler.seed`. */
  seed?: number | bigint;
}

/**
 * Check parameters; returns them with defaults filled in.
 * @throws TpError E_ARG naming the parameter, its value and the valid range
 */
export function samplingParams(options: Partial<SamplingParams> = {}): SamplingParams {
  const p: SamplingParams = { ...DEFAULT_SAMPLING };
  for (const [k, v] of Object.entries(options))
    if (v !== undefined && k in p) (p as unknown as Record<string, number>)[k] = v as number;
  const bad = (name: string, v: number, range: string) =>
    new TpError("E_ARG", `sampling parameter ${name} = ${v} is out of range; expected ${range}`);
  if (!Number.isFinite(p.temperature))
    throw bad("temperature", p.temperature, "a finite number (≤ 0 = greedy)");
  if (!Number.isInteger(p.topK) || p.topK < 0) throw bad("top_k", p.topK, "an integer ≥ 0 (0 = no limit)");
  if (!(p.topP >= 0 && p.topP <= 1)) throw bad("top_p", p.topP, "0 … 1 (1 = off)");
  if (!(p.minP >= 0 && p.minP <= 1)) throw bad("min_p", p.minP, "0 … 1 (0 = off)");
  if (!(p.repeatPenalty > 0 && Number.isFinite(p.repeatPenalty)))
    throw bad("repeat_penalty", p.repeatPenalty, "a number > 0 (1 = off)");
  if (!Number.isInteger(p.repeatLastN) || p.repeatLastN < -1)
    throw bad("repeat_last_n", p.repeatLastN, "an integer ≥ -1 (0 = off, -1 = whole context)");
  if (!Number.isFinite(p.presencePenalty))
    throw bad("presence_penalty", p.presencePenalty, "a finite number");
  if (!Number.isFinite(p.frequencyPenalty))
    throw bad("frequency_penalty", p.frequencyPenalty, "a finite number");
  return p;
}

/**
 * Apply the penalties in place, once per distinct token of the window (the last `repeatLastN` ids of
 * `recent`): `l ← l > 0 ? l / θ : l · θ` (transformers `RepetitionPenaltyLogitsProcessor`), then
 * `l ← l − (count · frequency + presence)` (llama.cpp). Ids outside `logits` are ignored.
 * @param logits [vocab] f32 or f64, modified
 * @param recent context token ids, oldest first (prompt included)
 */
export function applyPenalties(
  logits: Float32Array | Float64Array,
  recent: ArrayLike<number>,
  p: Pick<SamplingParams, "repeatPenalty" | "repeatLastN" | "presencePenalty" | "frequencyPenalty">,
): void {
  if (p.repeatLastN === 0) return;
  if (p.repeatPenalty === 1 && p.presencePenalty === 0 && p.frequencyPenalty === 0) return;
  const from = p.repeatLastN < 0 ? 0 : Math.max(0, recent.length - p.repeatLastN);
  const counts = new Map<number, number>();
  for (let i = from; i < recent.length; i++) {
    const id = recent[i] as number;
    if (Number.isInteger(id) && id >= 0 && id < logits.length) counts.set(id, (counts.get(id) ?? 0) + 1);
  }
  for (const [id, c] of counts) {
    let l = logits[id] as number;
    l = l > 0 ? l / p.repeatPenalty : l * p.repeatPenalty;
    logits[id] = l - (c * p.frequencyPenalty + p.presencePenalty);
  }
}

/**
 * Index of the largest value; the lowest index wins ties; NaN is never chosen.
 * @throws TpError E_ARG when no value is larger than −∞
 */
export function argmax(x: ArrayLike<number>): number {
  let best = -1;
  let bv = Number.NEGATIVE_INFINITY;
  for (let i = 0; i < x.length; i++) {
    const v = x[i] as number;
    if (v > bv) {
      bv = v;
      best = i;
    }
  }
  if (best < 0) throw new TpError("E_ARG", `no finite logit among ${x.length}: every logit is −∞ or NaN`);
  return best;
}

/** The tokens a draw chooses from and their probabilities (summing to 1). */
export interface Distribution {
  /** Token ids: descending probability (ties by ascending id) when a filter truncates; else every finite id in id order. */
  ids: Int32Array;
  /** [ids.length] probabilities, f64. */
  probs: Float64Array;
}

/**
 * The distribution after temperature, top-k, top-p and min-p (penalties already applied), with
 * transformers' semantics: top-k keeps every token tied with the k-th; top-p keeps tokens, best
 * first, while the mass before them is below top_p; min-p keeps p ≥ min_p · p_max; at least one
 * token always survives. Candidates come off a binary max-heap, so top-k costs O(V + k log V) rather
 * than a full sort.
 * @param logits [vocab] f32 or f64; NaN counts as −∞
 * @param p temperature must be > 0
 * @throws TpError E_ARG when every logit is −∞/NaN or the temperature is ≤ 0
 */
export function samplingDistribution(
  logits: ArrayLike<number>,
  p: Pick<SamplingParams, "temperature" | "topK" | "topP" | "minP">,
): Distribution {
  if (!(p.temperature > 0))
    throw new TpError("E_ARG", `samplingDistribution needs temperature > 0, got ${p.temperature}`);
  const n = logits.length;
  const s = new Float64Array(n); // tempered logits
  const heap = new Int32Array(n); // ids of finite entries
  let size = 0;
  for (let i = 0; i < n; i++) {
    const v = (logits[i] as number) / p.temperature;
    s[i] = v;
    if (v > Number.NEGATIVE_INFINITY) heap[size++] = i; // drops −∞ and NaN
  }
  if (size === 0) throw new TpError("E_ARG", `no finite logit among ${n}: every logit is −∞ or NaN`);
  const truncates = (p.topK > 0 && p.topK < size) || p.topP < 1 || p.minP > 0;
  if (!truncates) {
    // nothing to cut: every finite id, in id order
    const ids = heap.slice(0, size);
    return { ids, probs: softmaxOf(s, ids) };
  }
  // max-heap on (s desc, id asc)
  const above = (a: number, b: number) => (s[a] as number) > (s[b] as number) || (s[a] === s[b] && a < b);
  const siftDown = (i0: number) => {
    const x = heap[i0] as number;
    let i = i0;
    for (;;) {
      let c = 2 * i + 1;
      if (c >= size) break;
      if (c + 1 < size && above(heap[c + 1] as number, heap[c] as number)) c++;
      if (!above(heap[c] as number, x)) break;
      heap[i] = heap[c] as number;
      i = c;
    }
    heap[i] = x;
  };
  for (let i = (size >> 1) - 1; i >= 0; i--) siftDown(i);
  const pop = (): number => {
    const top = heap[0] as number;
    heap[0] = heap[--size] as number;
    if (size > 0) siftDown(0);
    return top;
  };
  const sMax = s[heap[0] as number] as number;
  const cand: number[] = [];
  let z: number; // softmax normaliser over what survives top-k
  if (p.topK > 0 && p.topK < size) {
    while (cand.length < p.topK) cand.push(pop());
    const kth = s[cand[cand.length - 1] as number] as number;
    while (size > 0 && s[heap[0] as number] === kth) cand.push(pop()); // ties with the k-th stay
    z = 0;
    for (const id of cand) z += Math.exp((s[id] as number) - sMax);
  } else {
    z = 0;
    for (let i = 0; i < size; i++) z += Math.exp((s[heap[i] as number] as number) - sMax);
  }
  const kept: number[] = [];
  const pMax = 1 / z;
  let cum = 0;
  for (let i = 0; ; i++) {
    let id: number;
    if (i < cand.length) id = cand[i] as number;
    else if (cand.length === 0 && size > 0) id = pop();
    else break;
    const pi = Math.exp((s[id] as number) - sMax) / z;
    if (kept.length > 0) {
      if (cum >= p.topP) break; // top-p: the mass before this token already reaches top_p
      if (pi < p.minP * pMax) break; // min-p (descending, so everything after fails too)
    }
    kept.push(id);
    cum += pi;
  }
  const ids = Int32Array.from(kept);
  return { ids, probs: softmaxOf(s, ids) };
}

/** Softmax of `s` restricted to `ids` (max-subtracted, f64). */
function softmaxOf(s: Float64Array, ids: Int32Array): Float64Array {
  let m = Number.NEGATIVE_INFINITY;
  for (const id of ids) m = Math.max(m, s[id] as number);
  const out = new Float64Array(ids.length);
  let z = 0;
  for (let i = 0; i < ids.length; i++) {
    const e = Math.exp((s[ids[i] as number] as number) - m);
    out[i] = e;
    z += e;
  }
  for (let i = 0; i < out.length; i++) out[i] = (out[i] as number) / z;
  return out;
}

const MASK64 = (1n << 64n) - 1n;

/**
 * splitmix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014;
 * Vigna's `splitmix64.c`): advance `state` by the golden gamma and return the mixed output.
 * @returns [new state, output], both u64 as bigint
 */
export function splitmix64(state: bigint): [bigint, bigint] {
  const next = (state + 0x9e3779b97f4a7c15n) & MASK64;
  let z = next;
  z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK64;
  z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK64;
  return [next, z ^ (z >> 31n)];
}

/**
 * xoshiro128** 1.1 (Blackman & Vigna, "Scrambled linear pseudorandom number generators", 2018;
 * `xoshiro128starstar.c`): 32-bit outputs, period 2^128 − 1. The 128-bit state is filled from two
 * splitmix64 outputs of the seed, as the authors recommend.
 */
export class Xoshiro128 {
  readonly #s = new Uint32Array(4);

  /** @param seed any integer, reduced mod 2^64 */
  constructor(seed: number | bigint) {
    let st = BigInt.asUintN(64, BigInt(seed));
    let out: bigint;
    for (let i = 0; i < 2; i++) {
      [st, out] = splitmix64(st);
      this.#s[2 * i] = Number(out & 0xffffffffn);
      this.#s[2 * i + 1] = Number(out >> 32n);
    }
    if (this.#s.every((w) => w === 0)) this.#s[0] = 1; // the all-zero state is a fixed point
  }

  /** Set the raw state (for tests against the reference vectors). */
  static fromState(s0: number, s1: number, s2: number, s3: number): Xoshiro128 {
    const g = new Xoshiro128(0);
    g.#s.set([s0, s1, s2, s3]);
    return g;
  }

  /** The next 32-bit output, as an unsigned integer. */
  nextU32(): number {
    const s = this.#s;
    const s1 = s[1] as number;
    const x = Math.imul(s1, 5);
    const result = Math.imul((x << 7) | (x >>> 25), 9) >>> 0;
    const t = s1 << 9;
    s[2] = (s[2] as number) ^ (s[0] as number);
    s[3] = (s[3] as number) ^ s1;
    s[1] = s1 ^ (s[2] as number);
    s[0] = (s[0] as number) ^ (s[3] as number);
    s[2] = (s[2] as number) ^ t;
    const s3 = s[3] as number;
    s[3] = (s3 << 11) | (s3 >>> 21);
    return result;
  }

  /** A uniform double in [0, 1) with 53 random bits (two outputs). */
  nextDouble(): number {
    const hi = this.nextU32() >>> 5; // 27 bits
    const lo = this.nextU32() >>> 6; // 26 bits
    return (hi * 67108864 + lo) / 9007199254740992;
  }
}

/**
 * A sampler: penalties, temperature, top-k, top-p, min-p, and a seeded xoshiro128** stream, so a
 * fixed seed reproduces every draw. Greedy (temperature ≤ 0) uses no randomness.
 *
 * @example
 * const s = new Sampler({ temperature: 0.7, topK: 20, topP: 0.8, seed: 42 });
 * const id = s.sample(logits, contextIds); // logits: Float32Array [vocab]
 */
export class Sampler {
  /** The parameters in force (defaults filled in). */
  readonly params: Readonly<SamplingParams>;
  /** The seed of the current stream (u64). */
  seed: bigint;
  #rng: Xoshiro128;

  /** @throws TpError E_ARG for a parameter out of range (see {@link samplingParams}) */
  constructor(options: SamplerOptions = {}) {
    const { seed, ...rest } = options;
    this.params = Object.freeze(samplingParams(rest));
    this.seed = BigInt.asUintN(64, BigInt(seed ?? Date.now()));
    this.#rng = new Xoshiro128(this.seed);
  }

  /** Restart the random stream from `seed`. */
  reseed(seed: number | bigint): void {
    this.seed = BigInt.asUintN(64, BigInt(seed));
    this.#rng = new Xoshiro128(this.seed);
  }

  /**
   * The distribution a draw would use (after penalties and every filter), without drawing.
   * At temperature ≤ 0 it is the argmax with probability 1.
   * @param logits [vocab] f32 (or f64) from the model's last position; not modified
   * @param recent context ids, oldest first (prompt and generated), for the penalties
   */
  distribution(logits: Float32Array | Float64Array, recent: ArrayLike<number> = []): Distribution {
    const work = Float64Array.from(logits);
    applyPenalties(work, recent, this.params);
    if (this.params.temperature <= 0) return { ids: Int32Array.of(argmax(work)), probs: Float64Array.of(1) };
    return samplingDistribution(work, this.params);
  }

  /**
   * Pick the next token: argmax at temperature ≤ 0, else one draw r ∈ [0, 1) walked along the
   * cumulative probabilities of {@link distribution} (the last candidate if rounding leaves r
   * beyond the sum).
   * @throws TpError E_ARG when every logit is −∞ or NaN
   */
  sample(logits: Float32Array | Float64Array, recent: ArrayLike<number> = []): number {
    const d = this.distribution(logits, recent);
    if (d.ids.length === 1) {
      if (this.params.temperature > 0) this.#rng.nextDouble(); // one draw per sampled step, whatever survives
      return d.ids[0] as number;
    }
    const r = this.#rng.nextDouble();
    let cum = 0;
    for (let i = 0; i < d.ids.length; i++) {
      cum += d.probs[i] as number;
      if (r < cum) return d.ids[i] as number;
    }
    return d.ids[d.ids.length - 1] as number;
  }
}
