/**
 * How many tokens speculative decoding (speculative.ts) drafts each round: the adaptive rule, cost-aware.
 * It only decides how many drafts are asked for, never which are accepted, so greedy output stays the
 * vanilla output whatever the clock says.
 *
 * - The acceptance rule (k): after a fully accepted round k grows by 1 (up to draftMax), after a
 *   rejection it becomes accepted + 1.
 * - The cost rule, from the medians of the last 5 samples of the wall time of a plain round (one
 *   decode step, `stepMs`), of the drafter per proposed token (`draftMs`) and per empty proposal
 *   (`emptyMs`), and of the verify step's extra time per drafted row over a plain step (`rowMs`);
 *   from an EMA (weight 0.3 on the new value) of the share q of proposals that are not empty; and
 *   from the per-token acceptance
 *   probability α = Σ accepted / Σ trials (sums decayed by 0.8 per drafted round; a round of m drafts
 *   with a accepted is a trials, and one more when a < m, the rejection). With drafts accepted
 *   independently with probability α, a round asking for j drafts yields
 *   q·E(j) + (1 − q) tokens, E(j) = Σ_{i=0..j} α^i (the accepted prefix plus the verify row's own
 *   token), and costs stepMs + q·j·(draftMs + rowMs) + (1 − q)·emptyMs, so its speed-up over plain
 *   decoding is gain(j) = stepMs · tokens / cost (Leviathan, Kalman & Matias, ICML 2023, §3.3, with the
 *   drafter's measured cost per token in place of their c). The rule drafts the j ≤ k of largest gain
 *   when that gain reaches {@link MIN_GAIN} or the round's predicted extra cost is within
 *   {@link CHEAP} of a step (a free drafter's misses cost nothing), and pauses drafting otherwise.
 *
 * A pause is long enough that the probe ending it loses at most {@link PROBE_SHARE} of the paused
 * time, taking the last probe's loss (wall time beyond plain decoding of the tokens it produced) as
 * the next one's: ⌈loss / (PROBE_SHARE · stepMs)⌉ rounds, at least 8 and at most 1024 — at most 32
 * for a cheap drafter (a call under a quarter of a step: prompt lookup), whose probe loses time only
 * to noise such as a garbage-collection pause. So a cheap drafter is probed often and a dear one (a
 * draft model, whose probe after a pause prefills every token it skipped) rarely. A probe is two drafted rounds whatever the estimates say: the
 * first two rounds of an answer draft nothing (they time a plain step), the next two are the first
 * probe (longer, one round at a time, until {@link MIN_TRIALS} acceptance trials when proposals
 * come), and each pause ends with one. The first drafted round after a plain one may carry a draft
 * model's catch-up prefill of the tokens it skipped (the whole prompt, the first time), so it does not
 * update draftMs / emptyMs, but its loss counts towards the next pause. Until the drafter's cost is
 * known the rule asks for at most {@link FIRST_PROBE} drafts.
 */

/** Smallest predicted speed-up for which a round drafts. */
export const MIN_GAIN = 1.05;
/**
 * A round whose predicted extra cost over a plain step is at most this share of the step asks
 * anyway, whatever its predicted gain (a free drafter such as prompt lookup: a miss costs nothing).
 */
export const CHEAP = 0.02;
/** Drafts asked for before the drafter's cost is known. */
export const FIRST_PROBE = 4;
/** Share of a pause that the following probe may lose (its wall time beyond plain decoding). */
export const PROBE_SHARE = 0.03;
/** Acceptance trials the first probe gathers (when proposals come) before its verdict. */
export const MIN_TRIALS = 4;
/** Shortest and longest pause (rounds). */
const MIN_PAUSE = 8;
const MAX_PAUSE = 1024;
/**
 * A drafter whose call costs less than this share of a decode step is cheap: its pauses stay within
 * {@link CHEAP_MAX_PAUSE} (a garbage-collection pause during a probe is not its cost).
 */
const DEAR = 0.25;
const CHEAP_MAX_PAUSE = 32;
const DECAY = 0.8;
/** Samples behind each duration's median. */
const WINDOW = 5;

/** Exponential moving average with weight 0.3 on the new value. */
function ema(prev: number | undefined, x: number): number {
  return prev === undefined ? x : 0.7 * prev + 0.3 * x;
}

/**
 * The median of the last {@link WINDOW} samples of a duration: a round slowed down by another process
 * (the only kind of timing noise: it never speeds a round up) moves it much less than a mean.
 */
class Recent {
  #xs: number[] = [];
  push(x: number): void {
    this.#xs.push(x);
    if (this.#xs.length > WINDOW) this.#xs.shift();
  }
  /** The median (the mean of the middle two for an even count); undefined before any sample. */
  get value(): number | undefined {
    const n = this.#xs.length;
    if (n === 0) return undefined;
    const xs = [...this.#xs].sort((a, b) => a - b);
    return n % 2 === 1 ? (xs[n >> 1] as number) : ((xs[n / 2 - 1] as number) + (xs[n / 2] as number)) / 2;
  }
}

/** Expected tokens of a round of j drafts, each accepted with probability α: Σ_{i=0..j} α^i. */
export function expectedTokens(alpha: number, j: number): number {
  let s = 0;
  let p = 1;
  for (let i = 0; i <= j; i++) {
    s += p;
    p *= alpha;
  }
  return s;
}

/** The estimates behind a decision (ms, and α in [0, 1]); undefined: not measured yet. */
export interface DraftEstimates {
  stepMs: number | undefined;
  draftMs: number | undefined;
  emptyMs: number | undefined;
  rowMs: number | undefined;
  /** Share of proposals that are not empty. */
  q: number | undefined;
  alpha: number | undefined;
}

/**
 * The per-round decision of speculative decoding. Call {@link plan} at the start of a round,
 * {@link proposed} after the drafter answered, {@link verified} after the verify step and its emits.
 */
export class DraftPolicy {
  readonly draftMax: number;
  readonly adaptive: boolean;
  /** The acceptance rule's draft length. */
  k: number;
  readonly #now: () => number;
  readonly #stepMs = new Recent();
  readonly #draftMs = new Recent();
  readonly #emptyMs = new Recent();
  readonly #rowMs = new Recent();
  #yield: number | undefined;
  #acc = 0;
  #trials = 0;
  #cooldown = 0;
  /** Drafted rounds of the current probe still due (2 after a pause, and the first two drafted). */
  #probe = 0;
  /** Acceptance trials seen (undecayed), for {@link MIN_TRIALS}. */
  #trialCount = 0;
  /** No pause yet: the first probe runs until MIN_TRIALS. */
  #first = true;
  /** Wall ms of the probe so far beyond plain decoding of the tokens it produced. */
  #probeLoss = 0;
  /** The last round drafted nothing (a draft model then catches up on the skipped tokens). */
  #lastPlain = true;
  #asked = 0;
  #drafted = 0;
  #start = 0;
  #proposedAt = 0;

  /**
   * @param draftMax most drafts per round (already checked, 1 … 16)
   * @param adaptive false: always ask for draftMax
   * @param now the clock in ms (default performance.now; tests pass a fake one)
   */
  constructor(draftMax: number, adaptive: boolean, now: () => number = () => performance.now()) {
    this.draftMax = draftMax;
    this.adaptive = adaptive;
    this.k = draftMax;
    this.#now = now;
    // the first two rounds draft nothing, to time a plain step; the next two are the first probe
    this.#cooldown = adaptive ? 2 : 0;
    this.#probe = adaptive ? 2 : 0;
  }

  /** The current estimates. */
  get estimates(): DraftEstimates {
    return {
      stepMs: this.#stepMs.value,
      draftMs: this.#draftMs.value,
      emptyMs: this.#emptyMs.value,
      rowMs: this.#rowMs.value,
      q: this.#yield,
      alpha: this.#trials > 0 ? this.#acc / this.#trials : undefined,
    };
  }

  /** Predicted speed-up of a round asking for j drafts, or undefined while an estimate is missing. */
  gain(j: number): number | undefined {
    const p = this.#predict(j);
    return p === undefined ? undefined : (p.stepMs * p.tokens) / (p.stepMs + p.extraMs);
  }

  /** Predicted tokens and wall ms beyond a plain step of a round asking for j drafts. */
  #predict(j: number): { tokens: number; extraMs: number; stepMs: number } | undefined {
    const { stepMs, draftMs, emptyMs, rowMs, q, alpha } = this.estimates;
    if (stepMs === undefined || !(stepMs > 0) || q === undefined) return undefined;
    if (q > 0 && alpha === undefined) return undefined;
    // one cost measured stands in for the other (a call of the drafter either way)
    const perDraft = draftMs ?? emptyMs;
    const perEmpty = emptyMs ?? draftMs;
    if (perDraft === undefined || perEmpty === undefined) return undefined;
    const tokens = q * expectedTokens(alpha ?? 0, j) + (1 - q);
    // no drafted row verified yet (every proposal was empty): extra rows taken as free
    const extraMs = q * j * (perDraft + (rowMs ?? 0)) + (1 - q) * perEmpty;
    return { tokens, extraMs, stepMs };
  }

  /** Whether a round asking for j drafts pays: gain ≥ MIN_GAIN, or an extra cost within CHEAP. */
  pays(j: number): boolean {
    const p = this.#predict(j);
    if (p === undefined) return false;
    return (p.stepMs * p.tokens) / (p.stepMs + p.extraMs) >= MIN_GAIN || p.extraMs <= CHEAP * p.stepMs;
  }

  /** The j in 1 … cap of largest {@link gain}, with that gain (undefined while unmeasured). */
  best(cap: number): { j: number; gain: number | undefined } {
    let j = 1;
    let g = this.gain(1);
    if (g === undefined) return { j: Math.max(1, Math.min(cap, FIRST_PROBE)), gain: undefined };
    for (let i = 2; i <= cap; i++) {
      const x = this.gain(i) as number;
      if (x > g) {
        g = x;
        j = i;
      }
    }
    return { j, gain: g };
  }

  /**
   * Start a round: the number of drafts to ask for (0: a plain decode step).
   * @param room the most drafts this round may carry (budget − 1, context room)
   */
  plan(room: number): number {
    this.#start = this.#now();
    this.#asked = this.#plan(room);
    return this.#asked;
  }

  #plan(room: number): number {
    if (!this.adaptive) return Math.max(0, Math.min(this.draftMax, room));
    if (this.#cooldown > 0) {
      this.#cooldown--;
      return 0;
    }
    const cap = Math.min(this.k, room);
    if (cap <= 0) return 0;
    const { j, gain } = this.best(cap);
    if (gain === undefined || this.#probe > 0 || this.pays(j)) return j;
    this.#startPause();
    this.#cooldown--; // this round is the pause's first
    return 0;
  }

  /** The drafter answered with `n` drafts (after the caller's own filters). */
  proposed(n: number): void {
    this.#proposedAt = this.#now();
    this.#drafted = n;
  }

  /** The round ended with `accepted` of its drafts accepted (0 … the `n` of {@link proposed}). */
  verified(accepted: number): void {
    if (!this.adaptive) return;
    const end = this.#now();
    const n = this.#drafted;
    const draftMs = this.#proposedAt - this.#start;
    const verifyMs = end - this.#proposedAt;
    const catchUp = this.#lastPlain;
    this.#lastPlain = this.#asked === 0;
    if (this.#asked === 0) {
      this.#stepMs.push(verifyMs);
      return;
    }
    this.#yield = ema(this.#yield, n > 0 ? 1 : 0);
    if (n > 0) this.#trialCount += accepted + (accepted < n ? 1 : 0);
    this.#afterProbeRound(end - this.#start, accepted + 1);
    if (n === 0) {
      if (!catchUp) this.#emptyMs.push(draftMs);
      return;
    }
    // a draft model's catch-up prefill after a plain round is not its steady cost per token
    if (!catchUp) this.#draftMs.push(draftMs / n);
    this.#rowMs.push(Math.max(0, verifyMs - (this.#stepMs.value ?? verifyMs)) / n);
    this.#acc = DECAY * this.#acc + accepted;
    this.#trials = DECAY * this.#trials + accepted + (accepted < n ? 1 : 0);
    this.k = accepted === n ? Math.min(this.draftMax, this.k + 1) : Math.max(1, accepted + 1);
    if (this.#probe === 0 && this.pays(this.best(this.k).j)) this.#probeLoss = 0;
  }

  /** Book a drafted round's loss against the running probe. */
  #afterProbeRound(wallMs: number, tokens: number): void {
    if (this.#probe === 0) return;
    this.#probeLoss += Math.max(0, wallMs - tokens * (this.#stepMs.value ?? wallMs / tokens));
    this.#probe--;
    // the first verdict rests on a few acceptance trials, not on one unlucky round
    if (this.#probe === 0 && this.#first && (this.#yield ?? 0) > 0 && this.#trialCount < MIN_TRIALS)
      this.#probe = 1;
  }

  /** Pause drafting: the next rounds are plain (see the module doc), then a probe of two drafted rounds. */
  #startPause(): void {
    const step = this.#stepMs.value;
    const byLoss = step !== undefined && step > 0 ? Math.ceil(this.#probeLoss / (PROBE_SHARE * step)) : 0;
    const perCall = this.#draftMs.value ?? this.#emptyMs.value;
    const cheap = step !== undefined && perCall !== undefined && perCall < DEAR * step;
    this.#cooldown = Math.min(cheap ? CHEAP_MAX_PAUSE : MAX_PAUSE, Math.max(MIN_PAUSE, byLoss));
    this.#first = false;
    this.#probe = 2;
    this.#probeLoss = 0;
  }
}
