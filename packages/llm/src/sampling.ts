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
  /**
   * Keep the most likely tokens until their probability mass reaches top_p; 1 = off; 0 keeps only
   * the most likely token (the lowest id among equal ones), as llama.cpp's and transformers' top-p 0.
   */
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
  if (!(p.topP >= 0 && p.topP <= 1)) throw bad("top_p", p.topP, "0 … 1 (1 = off, 0 = the most likely token)");
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
 * token always survives. Cost O(V) plus a sort of the few candidates (see {@link SamplingWorkspace}).
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
  const ws = new SamplingWorkspace();
  const m = ws.dense(logits, p, logits instanceof Float32Array || maxAbs(logits) <= SAFE_ABS);
  return ws.distribution(m);
}

/** Largest |v| over the finite entries (0 when none). */
function maxAbs(x: ArrayLike<number>): number {
  let a = 0;
  for (let i = 0; i < x.length; i++) {
    const v = Math.abs(x[i] as number);
    if (v > a && v < Number.POSITIVE_INFINITY) a = v;
  }
  return a;
}

/**
 * Scale bounds of the fast paths. With |logit| ≤ SAFE_ABS and SAFE_T_MIN ≤ T ≤ SAFE_T_MAX, l / T
 * neither overflows nor underflows to a subnormal, so l / T is −∞ exactly when l is, and the
 * monotonicity arguments below hold; anything else takes the exact all-entries path.
 */
const SAFE_ABS = 1e100;
const SAFE_T_MIN = 1e-200;
const SAFE_T_MAX = 1e200;
/** Histogram bins per nat of the top-p threshold search, and the bin count (the last is open-ended). */
const BINS_PER_NAT = 8;
const BINS = 64 * BINS_PER_NAT;

/**
 * Reusable buffers and the sampling pipeline on them: after warm-up no vocab-sized array is allocated
 * per token. Every path ends in {@link SamplingWorkspace.resolve}, which does exactly what the
 * stage-by-stage definition does on a set of candidates known to be the head of the full order
 * (descending tempered logit s, ties by ascending id):
 *
 * - top-k (k < number of finite logits): one pass finds the k-th largest logit l_k with a bounded
 *   buffer (values above a rising threshold; when it fills, a native sort keeps the best k), a second
 *   pass collects l ≥ τ for a τ just below l_k with τ/T < l_k/T checked, then exact s = l/T keeps
 *   s ≥ l_k/T — every tie with the k-th. Since l ↦ l/T is monotone, the k-th largest s is l_k/T.
 *   The sum for the normaliser runs over the survivors in sorted order, as before: the result is
 *   bit-identical to a full sort.
 * - top_k = 0 with top-p and/or min-p: a pass for the maximum, a pass summing exp(s − s_max) (the
 *   normaliser over the whole vocabulary, in id order) into a histogram of s_max − s in 1/8-nat
 *   bins; the candidates are the entries above the bin where the mass first exceeds top_p (plus 1e-9
 *   for round-off) and above s_max + ln(min_p) (plus a margin). Only they are sorted. The walk then
 *   checks that the best entry left out would have been cut too (and that no left-out entry ties
 *   with the last candidate); if not — only possible by round-off — it redoes the step over every
 *   entry. The kept set equals the full sort's except where the cumulative mass lies within f64
 *   round-off of top_p (the normaliser's summation order is id order, not a heap's).
 * - no truncation: every finite id in id order, one exp each, no sort.
 */
export class SamplingWorkspace {
  /** Candidate ids, their tempered logits, and (after resolve) the kept prefix's probabilities. */
  ids = new Int32Array(0);
  s = new Float64Array(0);
  probs = new Float64Array(0);
  #buf = new Float64Array(0);
  #hist = new Float64Array(BINS);
  /** f64 copy of a row, for the penalties (which must not touch the caller's logits). */
  row64 = new Float64Array(0);

  /** Make the candidate arrays hold at least n entries. */
  reserve(n: number): void {
    if (this.ids.length >= n) return;
    const cap = Math.max(n, this.ids.length * 2, 64);
    this.ids = new Int32Array(cap);
    this.s = new Float64Array(cap);
    this.probs = new Float64Array(cap);
  }

  /** A fresh {@link Distribution} of the first m candidates. */
  distribution(m: number): Distribution {
    return { ids: this.ids.slice(0, m), probs: this.probs.slice(0, m) };
  }

  /**
   * The distribution of a full row, into ids/probs[0, m); returns m.
   * @param bounded every finite |logit| ≤ 1e100 (always true of f32)
   */
  dense(
    row: ArrayLike<number>,
    p: Pick<SamplingParams, "temperature" | "topK" | "topP" | "minP">,
    bounded: boolean,
  ): number {
    const n = row.length;
    const t = p.temperature;
    if (!(bounded && t >= SAFE_T_MIN && t <= SAFE_T_MAX)) return this.#exact(row, p);
    const k = p.topK;
    const filters = p.topP < 1 || p.minP > 0;
    if (k > 0 && k < n) {
      const vk = this.#kthLargest(row, k);
      if (!Number.isNaN(vk)) return this.#topK(row, vk, p);
      // at most k finite logits: top-k cuts nothing
    }
    let vMax = Number.NEGATIVE_INFINITY;
    for (let i = 0; i < n; i++) {
      const v = row[i] as number;
      if (v > vMax) vMax = v;
    }
    if (vMax === Number.NEGATIVE_INFINITY)
      throw new TpError("E_ARG", `no finite logit among ${n}: every logit is −∞ or NaN`);
    if (vMax === Number.POSITIVE_INFINITY) return this.#exact(row, p);
    const sMax = vMax / t;
    if (!filters) {
      // every finite id in id order: softmax with the max subtracted, summed in id order
      this.reserve(n);
      const ids = this.ids;
      const pr = this.probs;
      let m = 0;
      let z = 0;
      for (let i = 0; i < n; i++) {
        const v = row[i] as number;
        if (v > Number.NEGATIVE_INFINITY) {
          const e = Math.exp(v / t - sMax);
          ids[m] = i;
          pr[m++] = e;
          z += e;
        }
      }
      for (let i = 0; i < m; i++) pr[i] = (pr[i] as number) / z;
      return m;
    }
    // normaliser over everything, and where the top-p mass is reached
    const hist = this.#hist;
    const useHist = p.topP < 1;
    if (useHist) hist.fill(0);
    let z = 0;
    for (let i = 0; i < n; i++) {
      const v = row[i] as number;
      if (v > Number.NEGATIVE_INFINITY) {
        const x = v / t - sMax;
        const e = Math.exp(x);
        z += e;
        if (useHist) {
          const b = -x * BINS_PER_NAT;
          (hist[b < BINS - 1 ? b | 0 : BINS - 1] as number) += e;
        }
      }
    }
    let dCut = Number.POSITIVE_INFINITY; // candidates: s ≥ s_max − dCut
    if (useHist) {
      const target = (p.topP + 1e-9) * z;
      let acc = 0;
      for (let b = 0; b < BINS - 1; b++) {
        acc += hist[b] as number;
        if (acc >= target) {
          dCut = (b + 1) / BINS_PER_NAT;
          break;
        }
      }
    }
    if (p.minP > 0) dCut = Math.min(dCut, -Math.log(p.minP) * (1 + 1e-9) + 1e-9);
    let tau = Number.NEGATIVE_INFINITY;
    if (dCut < Number.POSITIVE_INFINITY) {
      const sCut = sMax - dCut - 1e-9 * (1 + Math.abs(sMax));
      tau = sCut * t;
    }
    // collect l ≥ τ, and the largest logit left out
    this.reserve(1024);
    let ids = this.ids;
    let m = 0;
    let outMax = Number.NEGATIVE_INFINITY;
    for (let i = 0; i < n; i++) {
      const v = row[i] as number;
      if (v >= tau) {
        if (m === ids.length) {
          this.#grow(m);
          ids = this.ids;
        }
        ids[m++] = i;
      } else if (v > outMax) outMax = v;
    }
    const s = this.s;
    let w = 0;
    for (let j = 0; j < m; j++) {
      const id = ids[j] as number;
      const v = row[id] as number;
      if (v > Number.NEGATIVE_INFINITY) {
        ids[w] = id;
        s[w++] = v / t;
      }
    }
    const kept = this.resolve(w, p, sMax, z, outMax / t);
    return kept >= 0 ? kept : this.#exact(row, p);
  }

  /**
   * The distribution from a backend's top candidates (the m largest logits, ties in any order,
   * NaN allowed), into ids/probs[0, count); returns the count, or -1 when the candidates do not
   * determine it (a NaN among them, or ties with the k-th reaching past them, or no top-k to cut the
   * row to what they hold). Never consults the rest of the row, so only valid without penalties.
   */
  candidates(
    values: ArrayLike<number>,
    cids: ArrayLike<number>,
    p: Pick<SamplingParams, "temperature" | "topK" | "topP" | "minP">,
  ): number {
    const m = values.length;
    const t = p.temperature;
    if (m === 0 || cids.length !== m || !(t >= SAFE_T_MIN && t <= SAFE_T_MAX)) return -1;
    this.reserve(m);
    const ids = this.ids;
    const s = this.s;
    let f = 0; // finite candidates
    for (let j = 0; j < m; j++) {
      const v = values[j] as number;
      if (Number.isNaN(v) || v === Number.POSITIVE_INFINITY || Math.abs(v) > SAFE_ABS) return -1;
      if (v > Number.NEGATIVE_INFINITY) {
        ids[f] = cids[j] as number;
        s[f++] = v / t;
      }
    }
    if (f === 0)
      throw new TpError("E_ARG", `no finite logit among the ${m} largest: every logit is −∞ or NaN`);
    if (f < m) {
      // a −∞ among the largest: every finite logit of the row is here
      this.#sort(0, f, true);
      return this.#exactOnCandidates(f, p);
    }
    const k = p.topK;
    if (k <= 0 || k >= m) return -1;
    this.#sort(0, m, false);
    const kth = s[k - 1] as number;
    if (!((s[k] as number) < kth)) return -1; // ties with the k-th may reach past the candidates
    return this.resolve(k, p, s[0] as number, Number.NaN, Number.NEGATIVE_INFINITY);
  }

  /**
   * Walk candidates [0, m) of ids/s — a set that holds the head of the full order — sorted here by
   * (s desc, id asc): top-p then min-p with normaliser z (NaN: sum over the candidates, in order),
   * then the kept prefix's probabilities (softmax over it, max-subtracted) into probs.
   * @param sOut the largest tempered logit not among the candidates (−∞ when none)
   * @returns the kept count, or -1 when the candidates might not suffice (round-off at the edge)
   */
  resolve(
    m: number,
    p: Pick<SamplingParams, "topP" | "minP">,
    sMax: number,
    z: number,
    sOut: number,
  ): number {
    if (m === 0) return -1;
    this.#sort(0, m, false);
    const s = this.s;
    const out = sOut > Number.NEGATIVE_INFINITY;
    if (out && !(sOut < (s[m - 1] as number))) return -1; // a left-out entry could rank among them
    if (Number.isNaN(z)) {
      z = 0;
      for (let i = 0; i < m; i++) z += Math.exp((s[i] as number) - sMax);
    }
    const pMax = 1 / z;
    const minPMax = p.minP * pMax;
    let cum = 0;
    let kept = 0;
    for (; kept < m; kept++) {
      const pi = Math.exp((s[kept] as number) - sMax) / z;
      if (kept > 0) {
        if (cum >= p.topP) break; // top-p: the mass before this token already reaches top_p
        if (pi < minPMax) break; // min-p (descending, so everything after fails too)
      }
      cum += pi;
    }
    if (kept === m && out && !(cum >= p.topP) && !(Math.exp(sOut - sMax) / z < minPMax)) return -1;
    // softmax over the kept prefix (as over any id list: max, exps and sum in list order)
    const pr = this.probs;
    let mx = Number.NEGATIVE_INFINITY;
    for (let i = 0; i < kept; i++) mx = Math.max(mx, s[i] as number);
    let zz = 0;
    for (let i = 0; i < kept; i++) {
      const e = Math.exp((s[i] as number) - mx);
      pr[i] = e;
      zz += e;
    }
    for (let i = 0; i < kept; i++) pr[i] = (pr[i] as number) / zz;
    return kept;
  }

  /** The k-th largest logit (multiplicity counted), or NaN when at most k are finite. */
  #kthLargest(row: ArrayLike<number>, k: number): number {
    const n = row.length;
    const cap = Math.min(n, Math.max(4 * k, 256));
    if (this.#buf.length < cap) this.#buf = new Float64Array(cap);
    const buf = this.#buf;
    let len = 0;
    let thr = Number.NEGATIVE_INFINITY; // ≤ the k-th largest seen so far; accept only above
    let flushed = false;
    for (let i = 0; i < n; i++) {
      const v = row[i] as number;
      if (v > thr) {
        if (len === cap) {
          // keep the best k: dropped values are ≤ the new threshold, so the k-th largest is unchanged
          buf.subarray(0, cap).sort();
          buf.copyWithin(0, cap - k, cap);
          len = k;
          thr = buf[0] as number;
          flushed = true;
          if (!(v > thr)) continue;
        }
        buf[len++] = v;
      }
    }
    if (!flushed && len <= k) return Number.NaN;
    const head = buf.subarray(0, len);
    head.sort();
    return head[len - k] as number;
  }

  /** Top-k with l_k the k-th largest logit (and more than k finite), then top-p, min-p. */
  #topK(
    row: ArrayLike<number>,
    vk: number,
    p: Pick<SamplingParams, "temperature" | "topK" | "topP" | "minP">,
  ): number {
    const t = p.temperature;
    const kth = vk / t;
    const tau = vk - Math.max(Math.abs(vk) * 2 ** -20, 1e-30);
    if (!(kth > Number.NEGATIVE_INFINITY && kth < Number.POSITIVE_INFINITY && tau / t < kth))
      return this.#exact(row, p);
    // l < τ ⇒ l/T ≤ τ/T < l_k/T: collect l ≥ τ, keep exact s ≥ l_k/T
    this.reserve(Math.max(1024, 2 * p.topK));
    let ids = this.ids;
    let m = 0;
    for (let i = 0; i < row.length; i++) {
      if ((row[i] as number) >= tau) {
        if (m === ids.length) {
          this.#grow(m);
          ids = this.ids;
        }
        ids[m++] = i;
      }
    }
    const s = this.s;
    let w = 0;
    let sMax = Number.NEGATIVE_INFINITY;
    for (let j = 0; j < m; j++) {
      const id = ids[j] as number;
      const sv = (row[id] as number) / t;
      if (sv >= kth) {
        ids[w] = id;
        s[w++] = sv;
        if (sv > sMax) sMax = sv;
      }
    }
    return this.resolve(w, p, sMax, Number.NaN, Number.NEGATIVE_INFINITY);
  }

  /** Grow the candidate arrays, keeping the first m ids and s. */
  #grow(m: number): void {
    const ids = this.ids;
    const s = this.s;
    this.ids = new Int32Array(ids.length * 2);
    this.s = new Float64Array(ids.length * 2);
    this.probs = new Float64Array(ids.length * 2);
    this.ids.set(ids.subarray(0, m));
    this.s.set(s.subarray(0, m));
  }

  /** Every entry, exactly as defined: s = l/T for all, no scale assumptions. */
  #exact(row: ArrayLike<number>, p: Pick<SamplingParams, "temperature" | "topK" | "topP" | "minP">): number {
    const n = row.length;
    this.reserve(n);
    const ids = this.ids;
    const s = this.s;
    let f = 0;
    for (let i = 0; i < n; i++) {
      const v = (row[i] as number) / p.temperature;
      if (v > Number.NEGATIVE_INFINITY) {
        ids[f] = i;
        s[f++] = v;
      }
    }
    if (f === 0) throw new TpError("E_ARG", `no finite logit among ${n}: every logit is −∞ or NaN`);
    return this.#exactOnCandidates(f, p);
  }

  /** ids/s[0, f) hold every finite entry in id order: apply the whole definition to them. */
  #exactOnCandidates(f: number, p: Pick<SamplingParams, "topK" | "topP" | "minP">): number {
    const s = this.s;
    const pr = this.probs;
    let sMax = Number.NEGATIVE_INFINITY;
    for (let i = 0; i < f; i++) sMax = Math.max(sMax, s[i] as number);
    const k = p.topK;
    if (!((k > 0 && k < f) || p.topP < 1 || p.minP > 0)) {
      // nothing to cut: every finite id, in id order
      let z = 0;
      for (let i = 0; i < f; i++) {
        const e = Math.exp((s[i] as number) - sMax);
        pr[i] = e;
        z += e;
      }
      for (let i = 0; i < f; i++) pr[i] = (pr[i] as number) / z;
      return f;
    }
    if (k > 0 && k < f) {
      this.#sort(0, f, false);
      const kth = s[k - 1] as number;
      let j = k;
      while (j < f && s[j] === kth) j++;
      return this.resolve(j, p, sMax, Number.NaN, Number.NEGATIVE_INFINITY);
    }
    let z = 0;
    for (let i = 0; i < f; i++) z += Math.exp((s[i] as number) - sMax);
    return this.resolve(f, p, sMax, z, Number.NEGATIVE_INFINITY);
  }

  /** Sort ids/s[lo, hi) by (s desc, id asc), or by id asc when `byId`: quicksort, insertion below 16. */
  #sort(lo: number, hi: number, byId: boolean): void {
    const ids = this.ids;
    const s = this.s;
    // a before b: (s desc, id asc), or id asc — written out, as this loop is the hot part of top-p
    for (;;) {
      if (hi - lo <= 16) {
        for (let i = lo + 1; i < hi; i++) {
          const ai = ids[i] as number;
          const as = s[i] as number;
          let j = i;
          for (; j > lo; j--) {
            const bi = ids[j - 1] as number;
            const bs = s[j - 1] as number;
            if (!(byId ? ai < bi : as > bs || (as === bs && ai < bi))) break;
            ids[j] = bi;
            s[j] = bs;
          }
          ids[j] = ai;
          s[j] = as;
        }
        return;
      }
      // pivot: the median of lo, mid and hi - 1
      const mid = (lo + hi) >>> 1;
      this.#order3(lo, mid, hi - 1, byId);
      const pi = ids[mid] as number;
      const ps = s[mid] as number;
      // Hoare partition; lo and hi - 1 are sentinels after the median of three
      let i = lo;
      let j = hi - 1;
      for (;;) {
        let x: number;
        let xs: number;
        do {
          i++;
          x = ids[i] as number;
          xs = s[i] as number;
        } while (byId ? x < pi : xs > ps || (xs === ps && x < pi));
        do {
          j--;
          x = ids[j] as number;
          xs = s[j] as number;
        } while (byId ? pi < x : ps > xs || (ps === xs && pi < x));
        if (i >= j) break;
        const ti = ids[i] as number;
        const ts = s[i] as number;
        ids[i] = ids[j] as number;
        s[i] = s[j] as number;
        ids[j] = ti;
        s[j] = ts;
      }
      // [lo, j] precede or equal the pivot, [j + 1, hi) follow or equal it; recurse on the smaller
      if (j + 1 - lo < hi - j - 1) {
        this.#sort(lo, j + 1, byId);
        lo = j + 1;
      } else {
        this.#sort(j + 1, hi, byId);
        hi = j + 1;
      }
    }
  }

  /** Order entries a, b, c of ids/s (a first). */
  #order3(a: number, b: number, c: number, byId: boolean): void {
    const ids = this.ids;
    const s = this.s;
    const before = (x: number, y: number): boolean => {
      const xi = ids[x] as number;
      const yi = ids[y] as number;
      if (byId) return xi < yi;
      const xs = s[x] as number;
      const ys = s[y] as number;
      return xs > ys || (xs === ys && xi < yi);
    };
    const swap = (x: number, y: number): void => {
      const t = ids[x] as number;
      ids[x] = ids[y] as number;
      ids[y] = t;
      const u = s[x] as number;
      s[x] = s[y] as number;
      s[y] = u;
    };
    if (before(b, a)) swap(a, b);
    if (before(c, b)) {
      swap(b, c);
      if (before(b, a)) swap(a, b);
    }
  }
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
 * fixed seed reproduces every draw. Greedy (temperature ≤ 0) uses no randomness. Reuses its buffers
 * from token to token (see {@link SamplingWorkspace}); not for concurrent use.
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
  readonly #ws = new SamplingWorkspace();
  readonly #penalties: boolean;

  /** @throws TpError E_ARG for a parameter out of range (see {@link samplingParams}) */
  constructor(options: SamplerOptions = {}) {
    const { seed, ...rest } = options;
    this.params = Object.freeze(samplingParams(rest));
    this.seed = BigInt.asUintN(64, BigInt(seed ?? Date.now()));
    this.#rng = new Xoshiro128(this.seed);
    const p = this.params;
    this.#penalties =
      p.repeatLastN !== 0 && !(p.repeatPenalty === 1 && p.presencePenalty === 0 && p.frequencyPenalty === 0);
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
    const [row, bounded] = this.#penalised(logits, recent);
    if (this.params.temperature <= 0) return { ids: Int32Array.of(argmax(row)), probs: Float64Array.of(1) };
    return this.#ws.distribution(this.#ws.dense(row, this.params, bounded));
  }

  /**
   * Pick the next token: argmax at temperature ≤ 0, else one draw r ∈ [0, 1) walked along the
   * cumulative probabilities of {@link distribution} (the last candidate if rounding leaves r
   * beyond the sum).
   * @throws TpError E_ARG when every logit is −∞ or NaN
   */
  sample(logits: Float32Array | Float64Array, recent: ArrayLike<number> = []): number {
    const [row, bounded] = this.#penalised(logits, recent);
    if (this.params.temperature <= 0) return argmax(row);
    return this.#draw(this.#ws.dense(row, this.params, bounded));
  }

  /**
   * How many of the largest logits {@link sampleFromCandidates} wants (top_k + 1, so that it can tell
   * whether ties with the k-th reach past them), or 0 when candidates cannot stand in for the row:
   * greedy (use argmax), top_k = 0, top_k + 1 > vocab, or a penalty active (it can change which ids
   * are in the top k).
   */
  candidateCount(vocab: number): number {
    const p = this.params;
    if (p.temperature <= 0 || p.topK === 0 || p.topK + 1 > vocab || this.#penalties) return 0;
    return p.topK + 1;
  }

  /**
   * Whether {@link sampleFromCandidates} would draw from these candidates (it consumes no randomness).
   * False when a penalty is active, a candidate is NaN, or the k-th value's ties may reach past the
   * candidates; then sample from the full row.
   */
  candidatesSuffice(values: ArrayLike<number>, ids: ArrayLike<number>): boolean {
    if (this.params.temperature <= 0 || this.#penalties) return false;
    return this.#ws.candidates(values, ids, this.params) >= 0;
  }

  /**
   * {@link sample} from a backend's top candidates instead of the full row (`backend.topK(logits,
   * sampler.candidateCount(vocab))`, values and indices read back): the same draw, the same id, as
   * `sample` on the full row, when the candidates determine the distribution — else `undefined`, no
   * randomness consumed, and the caller samples the full row (see {@link candidatesSuffice}).
   * @param values the m largest logits, in any order (the backend's is descending)
   * @param ids their token ids
   */
  sampleFromCandidates(values: ArrayLike<number>, ids: ArrayLike<number>): number | undefined {
    if (this.params.temperature <= 0 || this.#penalties) return undefined;
    const m = this.#ws.candidates(values, ids, this.params);
    return m < 0 ? undefined : this.#draw(m);
  }

  /** One draw over the workspace's first m candidates. */
  #draw(m: number): number {
    const ids = this.#ws.ids;
    if (m === 1) {
      this.#rng.nextDouble(); // one draw per sampled step, whatever survives
      return ids[0] as number;
    }
    const probs = this.#ws.probs;
    const r = this.#rng.nextDouble();
    let cum = 0;
    for (let i = 0; i < m; i++) {
      cum += probs[i] as number;
      if (r < cum) return ids[i] as number;
    }
    return ids[m - 1] as number;
  }

  /** The row after the penalties (a reused f64 copy when any applies), and whether |l| ≤ 1e100. */
  #penalised(
    logits: Float32Array | Float64Array,
    recent: ArrayLike<number>,
  ): [Float32Array | Float64Array, boolean] {
    const f32 = logits instanceof Float32Array;
    if (!this.#penalties || recent.length === 0) return [logits, f32 || maxAbs(logits) <= SAFE_ABS];
    const ws = this.#ws;
    if (ws.row64.length < logits.length) ws.row64 = new Float64Array(logits.length);
    const row = ws.row64.subarray(0, logits.length);
    row.set(logits);
    applyPenalties(row, recent, this.params);
    if (!f32) return [row, maxAbs(row) <= SAFE_ABS];
    const n = this.params.repeatLastN;
    const from = n < 0 ? 0 : Math.max(0, recent.length - n);
    for (let i = from; i < recent.length; i++) {
      const v = row[recent[i] as number];
      if (v !== undefined && Math.abs(v) > SAFE_ABS && v > Number.NEGATIVE_INFINITY) return [row, false];
    }
    return [row, true];
  }
}
