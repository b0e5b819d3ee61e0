#!/usr/bin/env bun
/**
 * `bun run bench SUITE [options]`: run the benchmark suite `SUITE`, print a table and write
 * `bench-results/SUITE.json`, an array of rows `{case, metric, unit, ours, peer, peer_value, ratio,
 * runs, ours_min, ours_max, peer_min, peer_max, load_avg_min, load_avg_max, attempts, disturbed}`
 * (ratio > 1 means we are better; the fields are described at `BenchRow` in ./bench-harness.ts).
 * `bun run bench` alone lists the suites; `bun run bench SUITE --help` prints the options and the
 * suite's own usage.
 *
 * A suite is a file `packages/<pkg>/bench/<SUITE>.bench.ts` (or under apps/) whose default export is a
 * `BenchSuite` (./bench-harness.ts): `{ description, usage?, cases(context), teardown? }`, a case being
 *
 *   { case, metric, unit, better: "lower" | "higher", runs?, timed?, ours(), peer?: { name, run() }, baseline?() }
 *
 * `ours`, `peer.run` and `baseline` each perform one measurement and return its value in `unit` (they
 * time themselves, so a case can measure time, throughput or bytes). ./bench-harness.ts runs them
 * (warm-up, interleaved runs, min / median / max, load average, disturbed runs re-run and flagged).
 */
import { existsSync, mkdirSync, readdirSync, renameSync, statSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { runCli, TpError } from "@tp/tensor";
import {
  type BenchContext,
  type BenchRow,
  type BenchSuite,
  caseRows,
  defaultHarnessOptions,
  type HarnessOptions,
  measureCase,
  runChild,
  startTorch,
} from "./bench-harness.ts";

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

function fmt(x: number | null): string {
  if (x === null) return "—";
  if (x === 0) return "0";
  const a = Math.abs(x);
  return a >= 1000 ? x.toFixed(0) : a >= 1 ? x.toFixed(3) : x.toPrecision(3);
}

/** "median [min–max]", or the median alone when the runs agree or there is one. */
function fmtSpread(med: number | null, min: number | null, max: number | null): string {
  if (med === null) return "—";
  if (min === null || max === null || fmt(min) === fmt(max)) return fmt(med);
  return `${fmt(med)} [${fmt(min)}–${fmt(max)}]`;
}

function usage(defaults: HarnessOptions): string {
  return [
    "usage: bun run bench SUITE [options]",
    "  --runs N          timed runs per case and side (overrides each case's own count)",
    "  --filter REGEX    only the cases whose 'case metric peer' matches (case-insensitive);",
    "                    writes bench-results/SUITE.filtered.json instead of SUITE.json",
    "  --baseline DIR    also run ours as built in DIR (another commit's checkout after",
    "                    `bun install && bun run build` there), interleaved with this tree's; each",
    "                    row gets a 'CASE @baseline' row beside it, ratio this tree vs DIR's",
    "                    (suites that support it say so in their usage below)",
    `  --reruns N        re-runs of a disturbed case before it is reported flagged (default ${defaults.reruns})`,
    `  --max-load X      a 1-minute load average above X flags a run (default ${defaults.maxLoad}: cores + 0.5)`,
    `  --max-spread X    a side's max/min above X flags a run (default ${defaults.maxSpread})`,
    `  --settle S        before a re-run, wait up to S seconds for the load to fall (default ${defaults.settleSeconds})`,
  ].join("\n");
}

function number(
  flag: string,
  text: string | undefined,
  fallback: number,
  integer: boolean,
  min: number,
): number {
  if (text === undefined) return fallback;
  const x = Number(text);
  if (text.trim() === "" || !Number.isFinite(x) || (integer && !Number.isInteger(x)) || x < min) {
    throw new TpError(
      "E_ARG",
      `--${flag} must be ${integer ? "an integer" : "a number"} ≥ ${min}, got '${text}'`,
    );
  }
  return x;
}

/** The --baseline checkout: it must hold an installed tensorpencil tree. */
function baselineOf(dirText: string): NonNullable<BenchContext["baseline"]> {
  const dir = resolve(dirText);
  if (!existsSync(dir) || !statSync(dir).isDirectory()) {
    throw new TpError("E_ARG", `--baseline '${dirText}': no such directory`);
  }
  for (const need of ["package.json", "node_modules"]) {
    if (!existsSync(join(dir, need))) {
      throw new TpError(
        "E_ARG",
        `--baseline '${dirText}' has no ${need}: run \`bun install --frozen-lockfile && bun run build\` in that checkout first`,
      );
    }
  }
  const git = Bun.spawnSync(["git", "-C", dir, "rev-parse", "--short", "HEAD"], {
    stdout: "pipe",
    stderr: "pipe",
  });
  const rev = git.exitCode === 0 ? git.stdout.toString().trim() : "unknown commit";
  return { dir, rev, name: `baseline ${rev}` };
}

await runCli(async () => {
  const { values, positionals } = parseArgs({
    args: Bun.argv.slice(2),
    options: {
      runs: { type: "string" },
      filter: { type: "string" },
      baseline: { type: "string" },
      reruns: { type: "string" },
      "max-load": { type: "string" },
      "max-spread": { type: "string" },
      settle: { type: "string" },
      help: { type: "boolean", short: "h" },
    },
    allowPositionals: true,
  });
  const defaults = defaultHarnessOptions();
  const suites = findSuites();
  const name = positionals[0];
  if (name === undefined) {
    console.log(`suites: ${[...suites.keys()].sort().join(", ") || "none"}\n${usage(defaults)}`);
    return 0;
  }
  const file = suites.get(name);
  if (file === undefined) {
    throw new TpError(
      "E_ARG",
      `unknown bench suite '${name}'; expected one of: ${[...suites.keys()].sort().join(", ")}`,
    );
  }
  const runs = values.runs === undefined ? undefined : number("runs", values.runs, 1, true, 1);
  const options: HarnessOptions = {
    ...(runs === undefined ? {} : { runs }),
    reruns: number("reruns", values.reruns, defaults.reruns, true, 0),
    maxLoad: number("max-load", values["max-load"], defaults.maxLoad, false, 0),
    maxSpread: number("max-spread", values["max-spread"], defaults.maxSpread, false, 1),
    settleSeconds: number("settle", values.settle, defaults.settleSeconds, false, 0),
  };
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
  if (values.help) {
    console.log(`${name}: ${suite.description}\n${usage(defaults)}`);
    if (suite.usage) console.log(`\n${name}:\n${suite.usage}`);
    return 0;
  }
  const baseline = values.baseline === undefined ? null : baselineOf(values.baseline);
  console.log(`# ${name}: ${suite.description}`);
  if (baseline) console.log(`# ${baseline.name}: ${baseline.dir}`);
  const rows: BenchRow[] = [];
  const runCounts = new Set<number>(); // for the closing line: what the medians are over
  try {
    const all = await suite.cases({ baseline, runChild, startTorch });
    const selected =
      filter === null ? all : all.filter((c) => filter.test(`${c.case} ${c.metric} ${c.peer?.name ?? ""}`));
    if (selected.length === 0) {
      throw new TpError(
        "E_ARG",
        `--filter '${values.filter}' matches none of the ${all.length} cases of '${name}'`,
      );
    }
    if (baseline && !selected.some((c) => c.baseline)) {
      throw new TpError(
        "E_ARG",
        `--baseline: suite '${name}' has no case that runs a baseline${filter ? " among those --filter selects" : ""} (see bun run bench ${name} --help)`,
      );
    }
    for (const c of selected) {
      const r = await measureCase(c, options);
      if (c.timed !== false) runCounts.add(r.runs);
      rows.push(...caseRows(c, r, baseline?.name ?? null));
    }
  } finally {
    await suite.teardown?.();
  }
  const header = [
    "case",
    "metric",
    "unit",
    "ours [min–max]",
    "peer",
    "peer_value [min–max]",
    "ratio",
    "load avg",
    "flag",
  ];
  const table = rows.map((r) => [
    r.case,
    r.metric,
    r.unit,
    fmtSpread(r.ours, r.ours_min, r.ours_max),
    r.peer ?? "—",
    fmtSpread(r.peer_value, r.peer_min, r.peer_max),
    fmt(r.ratio),
    r.load_avg_max === null ? "—" : `${(r.load_avg_min as number).toFixed(1)}–${r.load_avg_max.toFixed(1)}`,
    r.disturbed === null ? "" : `DISTURBED${r.attempts > 1 ? ` (${r.attempts} attempts)` : ""}`,
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...table.map((t) => (t[i] as string).length)));
  const line = (cells: string[]) =>
    cells
      .map((c, i) => c.padEnd(widths[i] as number))
      .join("  ")
      .trimEnd();
  console.log(line(header));
  for (const t of table) console.log(line(t));
  for (const r of rows)
    if (r.disturbed !== null && !r.case.endsWith(" @baseline"))
      console.log(`disturbed: ${r.case}: ${r.disturbed}`);
  const outDir = join(root, "bench-results");
  mkdirSync(outDir, { recursive: true });
  const out = join(outDir, filter === null ? `${name}.json` : `${name}.filtered.json`);
  writeFileSync(`${out}.tmp`, `${JSON.stringify(rows, null, 2)}\n`);
  renameSync(`${out}.tmp`, out);
  const counts = [...runCounts].sort((x, y) => y - x).join(" or ");
  console.log(
    `wrote ${out} (medians of ${counts || 1} run${counts === "1" || counts === "" ? "" : "s"} per case; ratio > 1 means ours is better; ` +
      `disturbed: load average > ${options.maxLoad} or max/min > ${options.maxSpread}, after up to ${options.reruns} re-runs)`,
  );
  return 0;
});
