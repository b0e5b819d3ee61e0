import { describe, expect, test } from "bun:test";
import { TpError } from "./errors.ts";
import {
  describeResidencyPlan,
  parseByteSize,
  parseVramBudget,
  planResidency,
  residentBytesOf,
} from "./residency.ts";
import { Weight } from "./weight.ts";

// Weights of 100, 300, 200, 50 bytes in order of use; one pass peaks at 1000 bytes with all streamed.
const W = [
  { name: "a", bytes: 100 },
  { name: "b", bytes: 300 },
  { name: "c", bytes: 200 },
  { name: "d", bytes: 50 },
];

describe("planResidency (hand-derived cases)", () => {
  test("a budget with room for every weight keeps them all resident", () => {
    // room = 1650 − 1000 = 650 = 100 + 300 + 200 + 50
    const p = planResidency({ budget: 1650, weights: W, workingPeak: 1000 });
    expect(p.resident).toEqual([0, 1, 2, 3]);
    expect(p.streamed).toEqual([]);
    expect([p.residentBytes, p.streamedBytesPerPass, p.expectedPeak]).toEqual([650, 0, 1650]);
  });

  test("first fit in order of use: a weight past the room streams, a later smaller one still fits", () => {
    // room 350: a (100, left 250), b (300 > 250: streamed), c (200, left 50), d (50, left 0)
    const p = planResidency({ budget: 1350, weights: W, workingPeak: 1000 });
    expect(p.resident).toEqual([0, 2, 3]);
    expect(p.streamed).toEqual([1]);
    expect([p.residentBytes, p.streamedBytesPerPass, p.expectedPeak]).toEqual([350, 300, 1350]);
  });

  test("a budget of exactly the working peak streams everything; min is that budget", () => {
    const exact = planResidency({ budget: 1000, weights: W, workingPeak: 1000 });
    expect(exact.resident).toEqual([]);
    expect(exact.streamedBytesPerPass).toBe(650);
    const min = planResidency({ budget: "min", weights: W, workingPeak: 1000 });
    expect([min.budget, min.min, min.minBytes, min.residentBytes, min.streamedBytesPerPass]).toEqual([
      1000,
      true,
      1000,
      0,
      650,
    ]);
  });

  test("a budget below the working peak is E_OOM naming the flag and the bytes needed", () => {
    let err: unknown;
    try {
      planResidency({ budget: 999, weights: W, workingPeak: 1000, flag: "vramBudget" });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(TpError);
    expect((err as TpError).code).toBe("E_OOM");
    expect((err as TpError).message).toMatch(/vramBudget .*999 bytes.* at least 1000 bytes or use min/);
  });

  test("a later phase (the VAE decode) larger than the pass raises min; residents still fit budget − the pass's peak", () => {
    // laterPeak 1200 > workingPeak 1000: min = 1200; at 1200 the room is 200: a (100), b (300 > 100:
    // streamed), c (200 > 100: streamed), d (50, left 50)
    const min = planResidency({ budget: "min", weights: W, workingPeak: 1000, laterPeak: 1200 });
    expect([min.budget, min.minBytes, min.workingPeak, min.laterPeak, min.expectedPeak]).toEqual([
      1200, 1200, 1000, 1200, 1200,
    ]);
    const p = planResidency({ budget: 1200, weights: W, workingPeak: 1000, laterPeak: 1200 });
    expect(p.resident).toEqual([0, 3]);
    expect([p.residentBytes, p.expectedPeak]).toEqual([150, 1200]); // max(150 + 1000, 1200)
    let err: unknown;
    try {
      planResidency({ budget: 1199, weights: W, workingPeak: 1000, laterPeak: 1200 });
    } catch (e) {
      err = e;
    }
    expect((err as TpError).code).toBe("E_OOM");
    expect((err as TpError).message).toMatch(/decode after sampling needs.* at least 1200 bytes/);
  });

  test("bad sizes are E_ARG", () => {
    expect(() => planResidency({ budget: 1.5, weights: W, workingPeak: 0 })).toThrow(/budget/);
    expect(() => planResidency({ budget: 10, weights: [{ name: "x", bytes: -1 }], workingPeak: 0 })).toThrow(
      /weight x/,
    );
  });

  test("the report names resident and streamed MiB, per step with CFG's two passes", () => {
    const mib = 1024 * 1024;
    const p = planResidency({
      budget: 5 * mib,
      weights: [
        { name: "a", bytes: 2 * mib },
        { name: "b", bytes: 2 * mib },
      ],
      workingPeak: 2 * mib,
    });
    expect(describeResidencyPlan(p, 2)).toBe(
      "residency: budget 5.00 MiB; 1 weights resident (2.00 MiB), 1 streamed (4.00 MiB uploaded per step); " +
        "working peak 2.00 MiB, expected peak ≤ 4.00 MiB",
    );
  });
});

describe("parseVramBudget", () => {
  test("min, bytes and units", () => {
    expect(parseVramBudget("min")).toBe("min");
    expect(parseVramBudget("1048576")).toBe(1048576);
    expect(parseVramBudget("512MiB")).toBe(512 * 1024 * 1024);
    expect(parseVramBudget("1.5G")).toBe(1.5 * 1024 ** 3);
    expect(parseVramBudget("800MB")).toBe(800e6);
    expect(parseVramBudget("1TiB")).toBe(2 ** 40);
    expect(parseVramBudget("2TB")).toBe(2e12);
    expect(parseVramBudget("0.5KiB")).toBe(512);
  });
  test("anything else is E_ARG naming the flag", () => {
    expect(() => parseVramBudget("lots")).toThrow(/--vram-budget takes min or a size/);
    expect(() => parseVramBudget("-1")).toThrow(TpError);
    expect(() => parseVramBudget("5 parsecs")).toThrow(TpError);
    // a byte count is whole: 0.5 bytes would floor to a 0-byte budget
    expect(() => parseVramBudget("0.5")).toThrow(/got '0.5'/);
    expect(() => parseVramBudget("1.5B")).toThrow(TpError);
    expect(() => parseVramBudget("8PiB")).toThrow(TpError);
  });
  test("parseByteSize: a size without min, the message naming the flag and what it takes", () => {
    expect(parseByteSize("4GiB", "--ram-budget")).toBe(4 * 2 ** 30);
    expect(() => parseByteSize("min", "--ram-budget")).toThrow(
      "--ram-budget takes a size such as 2GiB, 512M or 1048576 bytes, got 'min'",
    );
  });
});

describe("residentBytesOf", () => {
  test("data bytes, plus f32 row scales for ConvRot", () => {
    const f32 = new Weight({ name: "w", format: "f32", shape: [2, 3], data: new Uint8Array(24) });
    expect(residentBytesOf(f32)).toBe(24);
  });
});
