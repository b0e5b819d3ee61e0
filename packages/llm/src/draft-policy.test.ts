/**
 * The cost-aware draft-length rule (draft-policy.ts) on a fake clock: every duration is chosen by the
 * test, and each expected decision is derived by hand from the module's formula
 * gain(j) = stepMs·(q·E(j) + 1 − q) / (stepMs + q·j·(draftMs + rowMs) + (1 − q)·emptyMs),
 * E(j) = Σ_{i=0..j} α^i.
 */
import { describe, expect, test } from "bun:test";
import { DraftPolicy, expectedTokens, FIRST_PROBE } from "./draft-policy.ts";

/** A policy on a fake clock and a driver for one round at a time. */
function harness(draftMax = 8, adaptive = true) {
  let t = 0;
  const policy = new DraftPolicy(draftMax, adaptive, () => t);
  /**
   * One round: plan with `room`, then the drafter takes `proposeMs` and offers `offered(j)` drafts,
   * the verify step takes `verifyMs(n)` and accepts `accepted(n)`. Returns the planned j.
   */
  const round = (r: {
    room?: number;
    proposeMs?: (j: number) => number;
    offered?: (j: number) => number;
    verifyMs: (n: number) => number;
    accepted?: (n: number) => number;
  }): number => {
    const j = policy.plan(r.room ?? 100);
    const n = j > 0 ? (r.offered ?? ((x) => x))(j) : 0;
    if (j > 0) t += (r.proposeMs ?? (() => 0))(j);
    policy.proposed(n);
    t += r.verifyMs(n);
    policy.verified(n > 0 ? (r.accepted ?? ((x) => x))(n) : 0);
    return j;
  };
  return { policy, round };
}

describe("DraftPolicy (fake clock)", () => {
  test("expectedTokens: Σ α^i for i = 0 … j", () => {
    expect(expectedTokens(0.5, 0)).toBe(1);
    expect(expectedTokens(0.5, 2)).toBe(1.75);
    expect(expectedTokens(1, 7)).toBe(8);
    expect(expectedTokens(0, 5)).toBe(1);
  });

  test("a free drafter fully accepted: the two plain rounds, two probes of FIRST_PROBE, then draftMax", () => {
    const { policy, round } = harness(8);
    // a plain step 10 ms; a verify of 1 + n rows 10 + n ms; drafting free, everything accepted
    const r = { verifyMs: (n: number) => 10 + n };
    expect(round(r)).toBe(0);
    expect(round(r)).toBe(0);
    expect(round(r)).toBe(FIRST_PROBE); // draftMs unknown: the catch-up round after a plain one is not timed
    expect(round(r)).toBe(FIRST_PROBE);
    expect(policy.estimates).toEqual({
      stepMs: 10,
      draftMs: 0,
      emptyMs: undefined,
      rowMs: 1,
      q: 1,
      alpha: 1,
    });
    // gain(j) = 10 (j + 1) / (10 + j) grows with j: j = 8 gives 90 / 18 = 5
    expect(policy.gain(8)).toBeCloseTo(5, 12);
    expect(round(r)).toBe(8);
    expect(round({ ...r, room: 3 })).toBe(3); // the budget caps it
    // one verify slowed down 5× by another process: the medians of the last 5 samples do not move
    expect(round({ verifyMs: (n: number) => 5 * (10 + n) })).toBe(8);
    expect(policy.estimates.rowMs).toBe(1);
    expect(round(r)).toBe(8);
  });

  test("a draft model as slow as a decode step pauses for its first probe's loss (194 rounds), probes with j = 1, pauses 174", () => {
    const { policy, round } = harness(8);
    // draft 10 ms per token; 50 ms of catch-up prefill in the first drafted round after plain ones
    let plainBefore = true;
    const slow = {
      proposeMs: (j: number) => 10 * j + (plainBefore ? 50 : 0),
      verifyMs: (n: number) => 10 + n,
    };
    const go = () => {
      const j = round(slow);
      plainBefore = j === 0;
      return j;
    };
    expect([go(), go(), go(), go()]).toEqual([0, 0, FIRST_PROBE, FIRST_PROBE]);
    // draftMs 40 / 4 = 10 (the 90 ms catch-up round not counted), rowMs 1, α = 1:
    // gain(j) = 10 (j + 1) / (10 + 11 j), largest at j = 1: 20 / 21 < 1.05 ⇒ pause
    expect(policy.estimates).toEqual({
      stepMs: 10,
      draftMs: 10,
      emptyMs: undefined,
      rowMs: 1,
      q: 1,
      alpha: 1,
    });
    expect(policy.gain(1)).toBeCloseTo(20 / 21, 12);
    // the first probe's loss: (90 + 14) − 5 · 10 = 54, then (40 + 14) − 50 = 4; 58 ms ⇒ the pause is
    // ⌈58 / (0.03 · 10)⌉ = 194 rounds
    const paused = Array.from({ length: 194 }, go);
    expect(paused.every((j) => j === 0)).toBe(true);
    // the probe: two rounds of j = 1 whatever the gain
    expect([go(), go()]).toEqual([1, 1]);
    // its loss: round 1 = (10 + 50) + 11 ms for 2 tokens of 10 ms → 51; round 2 = 21 − 20 → 1; 52 ms.
    // The pause is ⌈52 / 0.3⌉ = 174 rounds.
    expect(policy.estimates.draftMs).toBeCloseTo(10, 12);
    const next = Array.from({ length: 175 }, go);
    expect(next.slice(0, 174).every((j) => j === 0)).toBe(true);
    expect(next[174]).toBe(1);
  });

  test("a cheap drafter accepted half the time drafts 1 (gain 15/13), not 2 (17.5/16) or 3 (18.75/19)", () => {
    const { policy, round } = harness(8);
    const r = {
      proposeMs: (j: number) => 2 * j,
      verifyMs: (n: number) => 10 + n,
      accepted: () => 1,
    };
    // after the first probe (1 of 4 accepted) k = accepted + 1 = 2
    expect([round(r), round(r), round(r), round(r)]).toEqual([0, 0, FIRST_PROBE, 2]);
    // α = (0.8 · 1 + 1) / (0.8 · 2 + 2) = 0.5; draftMs 4 / 2; rowMs (14 − 10) / 4 = (12 − 10) / 2 = 1
    expect(policy.estimates).toEqual({
      stepMs: 10,
      draftMs: 2,
      emptyMs: undefined,
      rowMs: 1,
      q: 1,
      alpha: 0.5,
    });
    expect(policy.k).toBe(2);
    expect(policy.best(3)).toEqual({ j: 1, gain: 15 / 13 });
    expect(policy.gain(2)).toBeCloseTo(17.5 / 16, 12);
    expect(policy.gain(3)).toBeCloseTo(18.75 / 19, 12);
    expect(round(r)).toBe(1);
  });

  test("drafts never accepted pause drafting even when they are free: α = 0 ⇒ gain(1) = 10 / 11", () => {
    const { policy, round } = harness(8);
    const r = { verifyMs: (n: number) => 10 + n, accepted: () => 0 };
    // the first probe runs to MIN_TRIALS = 4 rejections (one a round)
    const first = Array.from({ length: 6 }, () => round(r));
    expect(first).toEqual([0, 0, FIRST_PROBE, 1, 1, 1]);
    expect(policy.gain(1)).toBeCloseTo(10 / 11, 12);
    // the probe lost 14 − 10 + 3 · (11 − 10) = 7 ms: a pause of ⌈7 / 0.3⌉ = 24 rounds (≥ 8), then a probe
    const after = Array.from({ length: 25 }, () => round(r));
    expect(after).toEqual([...Array(24).fill(0), 1]);
  });

  test("a cheap drafter's probe slowed down by 50 ms (a GC pause) pauses it 32 rounds, not ⌈50 / 0.3⌉", () => {
    const { round } = harness(8);
    let hiccup = false;
    const r = {
      proposeMs: () => (hiccup ? 50 : 0),
      verifyMs: (n: number) => 10 + n,
      accepted: () => 0,
    };
    expect(Array.from({ length: 6 }, () => round(r))).toEqual([0, 0, FIRST_PROBE, 1, 1, 1]);
    // α = 0: paused 24 rounds (as above), then the probe: its first round takes 50 ms more
    expect(Array.from({ length: 24 }, () => round(r)).every((j) => j === 0)).toBe(true);
    hiccup = true;
    expect(round(r)).toBe(1);
    hiccup = false;
    expect(round(r)).toBe(1);
    // the probe lost 50 + 1 + 1 = 52 ms ⇒ ⌈52 / 0.3⌉ = 174, but the drafter's calls cost 0 ms (its
    // slow round followed plain ones: not timed) < 0.25 · 10: a cheap drafter pauses at most 32 rounds
    const after = Array.from({ length: 33 }, () => round(r));
    expect(after).toEqual([...Array(32).fill(0), 1]);
  });

  test("a costly drafter whose proposals are always empty (q = 0) is paused", () => {
    const { policy, round } = harness(8);
    const r = { proposeMs: () => 10, offered: () => 0, verifyMs: () => 10 };
    expect([round(r), round(r), round(r), round(r)]).toEqual([0, 0, FIRST_PROBE, FIRST_PROBE]);
    // q = 0, emptyMs = 10 (the first, catch-up round untimed): gain = 10 / (10 + 10) = 0.5
    expect(policy.estimates.q).toBe(0);
    expect(policy.gain(1)).toBe(0.5);
    expect(round(r)).toBe(0);
  });

  test("a free drafter that finds nothing keeps asking: its extra cost 0 is within CHEAP", () => {
    const { policy, round } = harness(8);
    const r = { offered: () => 0, verifyMs: () => 10 };
    expect([round(r), round(r), round(r), round(r)]).toEqual([0, 0, FIRST_PROBE, FIRST_PROBE]);
    // q = 0: every j predicts gain 1 (< MIN_GAIN), at no cost; the best is the first, j = 1
    expect(policy.gain(1)).toBe(1);
    expect([round(r), round(r), round(r)]).toEqual([1, 1, 1]);
  });

  test("a free drafter empty every other round and then always right keeps drafting", () => {
    const { policy, round } = harness(4);
    let i = 0;
    const r = { offered: (j: number) => (i++ % 2 === 0 ? j : 0), verifyMs: (n: number) => 10 + n };
    // rounds 3 … 6: 4 drafts, none, 4 (k stays at draftMax 4), none
    expect([round(r), round(r), round(r), round(r), round(r), round(r)]).toEqual([0, 0, 4, 4, 4, 4]);
    // q = EMA of 1, 0, 1, 0: 1 → 0.7 → 0.7 · 0.7 + 0.3 = 0.79 → 0.7 · 0.79 = 0.553
    expect(policy.estimates.q).toBeCloseTo(0.553, 12);
    // gain(4) = 10 (0.553 · 5 + 0.447) / (10 + 0.553 · 4 · 1) = 32.12 / 12.212
    expect(policy.gain(4)).toBeCloseTo(32.12 / 12.212, 12);
    expect(round(r)).toBe(4);
  });

  test("not adaptive: always draftMax (or the room), whatever the clock", () => {
    const { round } = harness(6, false);
    const r = { proposeMs: () => 1000, verifyMs: () => 1000, accepted: () => 0 };
    expect([round(r), round(r), round({ ...r, room: 2 }), round(r)]).toEqual([6, 6, 2, 6]);
  });
});
