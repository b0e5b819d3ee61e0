// The bench harness's pure parts (spread, load and VmHWM parsing, the disturbed rule, re-runs, rows)
// against values worked out by hand, and runChild's peak RSS against a child of known size.
import { describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { availableParallelism, tmpdir } from "node:os";
import { join } from "node:path";
import type { TpErrorCode } from "@tp/tensor";
import {
  type BenchCase,
  caseRows,
  defaultHarnessOptions,
  disturbance,
  type HarnessEnv,
  type HarnessOptions,
  measureCase,
  median,
  parseLoadAverage,
  parseVmHwm,
  runChild,
  spread,
} from "./bench-harness.ts";

/** What `toThrow` matches a TpError of this code with: `expect(fn).toThrow(tpError("E_ARG"))`. */
const tpError = (code: TpErrorCode) => expect.objectContaining({ name: "TpError", code });

describe("spread", () => {
  test("min, median and max; the median of an even count is the mean of the middle two", () => {
    expect(spread([3, 1, 2])).toEqual({ min: 1, median: 2, max: 3 });
    expect(spread([35, 1.9, 34.5, 36])).toEqual({ min: 1.9, median: 34.75, max: 36 });
    expect(median([7])).toBe(7);
    expect(() => median([])).toThrow(tpError("E_ARG"));
  });
});

describe("/proc parsing", () => {
  test("the 1-minute load average is the first field of /proc/loadavg", () => {
    expect(parseLoadAverage("3.41 1.20 0.98 2/116 12068\n")).toBe(3.41);
    expect(() => parseLoadAverage("")).toThrow(tpError("E_FORMAT"));
    expect(() => parseLoadAverage("busy 1 2")).toThrow(tpError("E_FORMAT"));
  });

  test("VmHWM in bytes from /proc/PID/status, not VmPeak or VmRSS", () => {
    const status = [
      "Name:\tbun",
      "VmPeak:\t 9000000 kB",
      "VmSize:\t 8000000 kB",
      "VmHWM:\t  123456 kB",
      "VmRSS:\t  100000 kB",
      "",
    ].join("\n");
    expect(parseVmHwm(status)).toBe(123456 * 1024);
    expect(() => parseVmHwm("Name:\tbun\nVmRSS:\t 1 kB\n")).toThrow(tpError("E_FORMAT"));
  });
});

describe("disturbance", () => {
  test("by default half a thread of slack above the cores, 1.25 max / min, two re-runs", () => {
    const d = defaultHarnessOptions();
    expect([d.maxLoad, d.maxSpread, d.reruns]).toEqual([availableParallelism() + 0.5, 1.25, 2]);
  });
  const bounds = { maxLoad: 2, maxSpread: 1.25 };
  test("a quiet run with a tight spread passes", () => {
    expect(disturbance([{ name: "ours", values: [35, 36, 34] }], [1.1, 1.9, 2], bounds)).toEqual([]);
  });
  test("the highest load above the bound flags the run", () => {
    expect(disturbance([{ name: "ours", values: [35, 36] }], [1.5, 2.31, null], bounds)).toEqual([
      "load average 2.31 > 2",
    ]);
  });
  test("a side whose max / min exceeds the bound is named (the 35 → 1.9 tok/s llama.cpp run)", () => {
    const r = disturbance(
      [
        { name: "ours", values: [40, 41, 40.5] },
        { name: "llama.cpp", values: [35, 1.9, 34] },
      ],
      [1, 1],
      bounds,
    );
    expect(r).toEqual(["llama.cpp max/min 18.42 > 1.25"]);
  });
  test("one value, or values that are not all positive and finite, have no spread to check", () => {
    expect(disturbance([{ name: "ours", values: [1] }], [], bounds)).toEqual([]);
    expect(disturbance([{ name: "ours", values: [-5, 10, 0] }], [], bounds)).toEqual([]);
    expect(disturbance([{ name: "ours", values: [1, Number.NaN, 9] }], [null], bounds)).toEqual([]);
  });
});

/** A scripted machine: load averages served in order (the last repeats), sleeps recorded. */
function fakeEnv(loads: (number | null)[]): HarnessEnv & { slept: number[]; lines: string[] } {
  let i = 0;
  const slept: number[] = [];
  const lines: string[] = [];
  return {
    loadAverage: () => loads[Math.min(i++, loads.length - 1)] as number | null,
    sleep: async (ms) => {
      slept.push(ms);
    },
    log: (l) => lines.push(l),
    slept,
    lines,
  };
}

const options: HarnessOptions = { reruns: 2, maxLoad: 2, maxSpread: 1.25, settleSeconds: 12 };

/** A case "c" (metric "m", unit "s", lower is better) with the given runs and sides. */
function timedCase(sides: Pick<BenchCase, "ours" | "peer" | "baseline"> & { runs: number }): BenchCase {
  return { case: "c", metric: "m", unit: "s", better: "lower", ...sides };
}

describe("measureCase", () => {
  test("warm-up once per side, then ours, baseline, peer interleaved; medians and load range", async () => {
    const calls: string[] = [];
    let n = 0;
    const c = timedCase({
      runs: 3,
      ours: () => {
        calls.push("ours");
        return 10 + n++ * 0.1;
      },
      baseline: () => {
        calls.push("base");
        return 20;
      },
      peer: {
        name: "p",
        run: () => {
          calls.push("peer");
          return 30;
        },
      },
    });
    const r = await measureCase(c, options, fakeEnv([1, 1.5, 0.5]));
    expect(calls).toEqual(["ours", "base", "peer", ...Array(3).fill(["ours", "base", "peer"]).flat()]);
    // the warm-up returned 10; the timed runs 10.1, 10.2, 10.3
    expect(r.ours.min).toBeCloseTo(10.1, 12);
    expect(r.ours.median).toBeCloseTo(10.2, 12);
    expect(r.ours.max).toBeCloseTo(10.3, 12);
    expect(r.baseline).toEqual({ min: 20, median: 20, max: 20 });
    expect(r.peer).toEqual({ min: 30, median: 30, max: 30 });
    expect(r.load).toEqual([0.5, 1.5]);
    expect(r.attempts).toBe(1);
    expect(r.disturbed).toEqual([]);
  });

  test("a disturbed attempt is re-run after the load settles; the clean re-run is reported", async () => {
    const values = [5, 5, 9, 5, 5, 5]; // warm-up, attempt 1 (5, 9: max/min 1.8), attempt 2 (5, 5)
    let i = 0;
    const c = timedCase({ runs: 2, ours: () => values[i++] as number });
    // attempt 1 reads 3 loads; settle reads 3.0 twice (two 5 s waits), then 1.0; attempt 2 reads 1.0
    const env = fakeEnv([1, 1, 1, 3, 3, 1]);
    const r = await measureCase(c, options, env);
    expect(r.attempts).toBe(2);
    expect(r.disturbed).toEqual([]);
    expect(r.ours).toEqual({ min: 5, median: 5, max: 5 });
    expect(env.slept).toEqual([5000, 5000]);
    expect(env.lines).toEqual(["  c: disturbed (ours max/min 1.80 > 1.25); re-run 1 of 2"]);
  });

  test("after the last re-run a still-disturbed case is reported flagged; settling is bounded", async () => {
    const c = timedCase({ runs: 2, ours: () => 1 });
    const env = fakeEnv([4]);
    const r = await measureCase(c, options, env);
    expect(r.attempts).toBe(3);
    expect(r.disturbed).toEqual(["load average 4.00 > 2"]);
    expect(r.load).toEqual([4, 4]);
    // two settles of at most 12 s each: 5 + 5 + 2 seconds
    expect(env.slept).toEqual([5000, 5000, 2000, 5000, 5000, 2000]);
  });

  test("--runs overrides the case's runs; reruns 0 reports the first attempt", async () => {
    let calls = 0;
    const c = timedCase({ runs: 7, ours: () => ++calls });
    const r = await measureCase(c, { ...options, runs: 2, reruns: 0 }, fakeEnv([9]));
    expect(calls).toBe(3);
    expect(r.runs).toBe(2);
    expect(r.attempts).toBe(1);
    expect(r.disturbed).toEqual(["load average 9.00 > 2", "ours max/min 1.50 > 1.25"]);
  });

  test("an untimed case is read once: no warm-up, no load, no re-run", async () => {
    let calls = 0;
    const c: BenchCase = {
      case: "peak",
      metric: "m",
      unit: "MB",
      better: "lower",
      timed: false,
      ours: () => ++calls * 100,
      peer: { name: "p", run: () => 50 },
    };
    const r = await measureCase(c, options, fakeEnv([99]));
    expect(calls).toBe(1);
    expect(r).toEqual({
      runs: 1,
      ours: { min: 100, median: 100, max: 100 },
      peer: { min: 50, median: 50, max: 50 },
      baseline: null,
      load: null,
      attempts: 1,
      disturbed: [],
    });
  });
});

describe("caseRows", () => {
  const result = {
    runs: 3,
    ours: { min: 9, median: 10, max: 11 },
    peer: { min: 18, median: 20, max: 21 },
    baseline: { min: 7, median: 8, max: 8.5 },
    load: [0.5, 2.5] as [number, number],
    attempts: 3,
    disturbed: ["load average 2.50 > 2"],
  };
  test("a lower-is-better case: ratio peer / ours, and an @baseline row with ratio baseline / ours", () => {
    const c: BenchCase = {
      case: "step",
      metric: "s/step",
      unit: "s",
      better: "lower",
      ours: () => 0,
      peer: { name: "torch", run: () => 0 },
    };
    const [main, base, ...rest] = caseRows(c, result, "baseline abc1234");
    expect(rest).toEqual([]);
    expect(main).toEqual({
      case: "step",
      metric: "s/step",
      unit: "s",
      ours: 10,
      peer: "torch",
      peer_value: 20,
      ratio: 2,
      runs: 3,
      ours_min: 9,
      ours_max: 11,
      peer_min: 18,
      peer_max: 21,
      load_avg_min: 0.5,
      load_avg_max: 2.5,
      attempts: 3,
      disturbed: "load average 2.50 > 2",
    });
    // the fields rows had before the spread was added come first, in their order
    expect(Object.keys(main ?? {}).slice(0, 7)).toEqual([
      "case",
      "metric",
      "unit",
      "ours",
      "peer",
      "peer_value",
      "ratio",
    ]);
    expect(base?.case).toBe("step @baseline");
    expect(base?.peer).toBe("baseline abc1234");
    expect(base?.peer_value).toBe(8);
    expect(base?.ratio).toBe(0.8);
    expect([base?.peer_min, base?.peer_max]).toEqual([7, 8.5]);
  });
  test("a higher-is-better case without peer or baseline: one row, ratio null", () => {
    const c: BenchCase = { case: "tg", metric: "generation", unit: "tok/s", better: "higher", ours: () => 0 };
    const rows = caseRows(c, { ...result, peer: null, baseline: null, disturbed: [] }, null);
    expect(rows.length).toBe(1);
    expect(rows[0]?.ratio).toBeNull();
    expect(rows[0]?.peer_min).toBeNull();
    expect(rows[0]?.disturbed).toBeNull();
    const withPeer = caseRows(
      { ...c, peer: { name: "llama.cpp", run: () => 0 } },
      { ...result, baseline: null },
      null,
    );
    expect(withPeer[0]?.ratio).toBe(0.5);
  });
});

describe("runChild", () => {
  test("the child's own peak RSS, not the parent's, even when it exits with process.exit", () => {
    const dir = mkdtempSync(join(tmpdir(), "tp-bench-child-"));
    const parent = new Uint8Array(400 * 2 ** 20).fill(1); // this process: ≥ 400 MiB resident
    try {
      const script = join(dir, "child.ts");
      writeFileSync(
        script,
        [
          "const a = new Uint8Array(96 * 2 ** 20).fill(7);",
          "console.log('progress, not JSON');",
          "console.log(JSON.stringify({ ok: true, argv: process.argv.slice(2), sum: a[5] }));",
          "process.exit(3);",
        ].join("\n"),
      );
      const r = runChild(script, ["x", "--y"], { cwd: dir });
      expect(parent[123]).toBe(1);
      expect(process.resourceUsage().maxRSS * 1024).toBeGreaterThan(400 * 2 ** 20);
      expect(r.exitCode).toBe(3);
      expect(r.result).toEqual({ ok: true, argv: ["x", "--y"], sum: 7 });
      expect(r.peakRssBytes).toBeGreaterThan(96 * 2 ** 20);
      // ru_maxrss would carry the parent's ≥ 400 MiB into the child
      expect(r.peakRssBytes).toBeLessThan(300 * 2 ** 20);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
