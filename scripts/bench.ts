#!/usr/bin/env bun
/**
 * `bun run bench SUITE [--runs N] [--filter REGEX]`: run the benchmark suite `SUITE`, print a table
 * and write `bench-results/SUITE.json`, an array of rows `{case, metric, unit, ours, peer, peer_value,
 * ratio}` (ratio > 1 means we are better). `bun run bench` alone lists the suites. `--filter` runs only
 * the cases whose "case metric peer" text matches REGEX (case-insensitive; e.g. `--filter 'GEMM bf16'`)
 * and writes `bench-results/SUITE.filtered.json` instead, so a partial run never replaces a whole table.
 *
 * A suite is a file `packages/<pkg>/bench/<SUITE>.bench.ts` (or under apps/) whose default export is
 * `{ description: string, cases(): BenchCase[] | Promise<BenchCase[]>, teardown?(): void }`, where a
 * case is
 *
 *   { case, metric, unit, better: "lower" | "higher", runs?, ours(): number, peer?: { name, run(): number } }
 *
 * `ours` and `peer.run` each perform one measurement and return its value in `unit` (they time
 * themselves, so a case can measure time, throughput or bytes). The harness alternates ours and peer
 * in the same process, `runs` times (default 7, after one warm-up each), and reports medians: this
 * machine is noisy, and medians of interleaved runs are what we compare.
 */
import { existsSync, mkdirSync, readdirSync, renameSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { runCli, TpError } from "@tp/tensor";

interface BenchCase {
  case: string;
  metric: string;
  unit: string;
  better: "lower" | "higher";
  runs?: number;
  ours: () => number | Promise<number>;
  peer?: { name: string; run: () => number | Promise<number> };
}

interface BenchSuite {
  description: string;
  cases: () => BenchCase[] | Promise<BenchCase[]>;
  teardown?: () => void | Promise<void>;
}

/** One row of bench-results/SUITE.json. */
export interface BenchRow {
  case: string;
  metric: string;
  unit: string;
  ours: number;
  peer: string | null;
  peer_value: number | null;
  ratio: number | null;
}

const root = resolve(import.meta.dir, "..");

function findSuites(): Map<string, string> {
  const suites = new Map<string, string>();
  for (const top of ["packages", "apps"]) {
    for (const pkg of readdirSync(join(root, top))) {
      const dir = join(root, top, pkg, "bench");
      if (!existsSync(dir)) continue;
      for (const f of readdirSync(dir)) {
        if (f.endsWith(".bench.ts")) suites.set(f.slice(0, -".bench.ts".length), join(dir, f));
      }
    }
  }
  return suites;
}

/** Median of a non-empty list. */
export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2;
}

function fmt(x: number | null): string {
  if (x === null) return "—";
  if (x === 0) return "0";
  const a = Math.abs(x);
  return a >= 1000 ? x.toFixed(0) : a >= 1 ? x.toFixed(3) : x.toPrecision(3);
}

await runCli(async () => {
  const { values, positionals } = parseArgs({
    args: Bun.argv.slice(2),
    options: { runs: { type: "string" }, filter: { type: "string" } },
    allowPositionals: true,
  });
  const suites = findSuites();
  const name = positionals[0];
  if (name === undefined) {
    console.log(
      `suites: ${[...suites.keys()].sort().join(", ") || "none"}\nusage: bun run bench SUITE [--runs N] [--filter REGEX]`,
    );
    return 0;
  }
  const file = suites.get(name);
  if (file === undefined) {
    throw new TpError(
      "E_ARG",
      `unknown bench suite '${name}'; expected one of: ${[...suites.keys()].sort().join(", ")}`,
    );
  }
  const runsOverride = values.runs === undefined ? undefined : Number(values.runs);
  if (runsOverride !== undefined && !(Number.isInteger(runsOverride) && runsOverride >= 1)) {
    throw new TpError("E_ARG", `--runs must be a positive integer, got '${values.runs}'`);
  }
  let filter: RegExp | null = null;
  if (values.filter !== undefined) {
    try {
      filter = new RegExp(values.filter, "i");
    } catch (e) {
      throw new TpError(
        "E_ARG",
        `--filter '${values.filter}' is not a regular expression: ${(e as Error).message}`,
      );
    }
  }
  const suite = (await import(file)).default as BenchSuite;
  console.log(`# ${name}: ${suite.description}`);
  const rows: BenchRow[] = [];
  const runCounts = new Set<number>(); // for the closing line: what the medians are over
  try {
    const all = await suite.cases();
    const selected =
      filter === null ? all : all.filter((c) => filter.test(`${c.case} ${c.metric} ${c.peer?.name ?? ""}`));
    if (selected.length === 0) {
      throw new TpError(
        "E_ARG",
        `--filter '${values.filter}' matches none of the ${all.length} cases of '${name}'`,
      );
    }
    for (const c of selected) {
      const runs = runsOverride ?? c.runs ?? 7;
      runCounts.add(runs);
      await c.ours();
      if (c.peer) await c.peer.run();
      const ours: number[] = [];
      const peer: number[] = [];
      for (let i = 0; i < runs; i++) {
        ours.push(await c.ours());
        if (c.peer) peer.push(await c.peer.run());
      }
      const o = median(ours);
      const p = c.peer ? median(peer) : null;
      const ratio = p === null || o === 0 || p === 0 ? null : c.better === "lower" ? p / o : o / p;
      rows.push({
        case: c.case,
        metric: c.metric,
        unit: c.unit,
        ours: o,
        peer: c.peer?.name ?? null,
        peer_value: p,
        ratio,
      });
    }
  } finally {
    await suite.teardown?.();
  }
  const header = ["case", "metric", "unit", "ours", "peer", "peer_value", "ratio"];
  const table = rows.map((r) => [
    r.case,
    r.metric,
    r.unit,
    fmt(r.ours),
    r.peer ?? "—",
    fmt(r.peer_value),
    fmt(r.ratio),
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...table.map((t) => (t[i] as string).length)));
  const line = (cells: string[]) => cells.map((c, i) => c.padEnd(widths[i] as number)).join("  ");
  console.log(line(header));
  for (const t of table) console.log(line(t));
  const outDir = join(root, "bench-results");
  mkdirSync(outDir, { recursive: true });
  const out = join(outDir, filter === null ? `${name}.json` : `${name}.filtered.json`);
  writeFileSync(`${out}.tmp`, `${JSON.stringify(rows, null, 2)}\n`);
  renameSync(`${out}.tmp`, out);
  const counts = [...runCounts].sort((x, y) => y - x).join(" or ");
  console.log(`wrote ${out} (medians of ${counts} runs per case; ratio > 1 means ours is better)`);
  return 0;
});
