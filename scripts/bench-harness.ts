/**
 * The measuring half of `bun run bench` (scripts/bench.ts is the command line), shared by every suite:
 * how a case is run (warm-up, then ours / baseline / peer interleaved `runs` times), what is reported
 * with each median (the min and max of the same runs, the 1-minute load average sampled around every
 * run), when a case counts as disturbed (the load average above `maxLoad`, or a side's max / min above
 * `maxSpread`) and how often a disturbed case is re-run before it is reported flagged; how a suite
 * runs a child process whose own peak RSS it needs (`runChild`, through ./bench-child.ts); and how a
 * suite starts the PyTorch peer it compares against (`startTorch`: one Python process asked in JSON lines).
 *
 * Suites do not import this file (packages reach no file outside themselves, tests/workspace.test.ts):
 * they get what they need as the `BenchContext` argument of `cases()`, and declare the fields they use.
 */
import { existsSync, readFileSync } from "node:fs";
import { availableParallelism } from "node:os";
import { resolve } from "node:path";
import { TpError } from "@tp/tensor";

/** One benchmark case, as a suite's `cases()` returns it. */
export interface BenchCase {
  case: string;
  metric: string;
  unit: string;
  better: "lower" | "higher";
  /** Timed runs per side (default 7); `--runs N` overrides. */
  runs?: number;
  /**
   * False for a row computed from other cases' runs (a peak over them, a difference): it is read
   * once, with no warm-up, no load or spread check and no re-run. Default true.
   */
  timed?: boolean;
  /** One measurement of ours, in `unit` (the case times itself). */
  ours: () => number | Promise<number>;
  /** One measurement of another engine on the same work. */
  peer?: { name: string; run: () => number | Promise<number> };
  /** One measurement of ours as built in the `--baseline DIR` checkout (suites that support it). */
  baseline?: () => number | Promise<number>;
}

/** What the harness hands a suite's `cases()`. */
export interface BenchContext {
  /** The `--baseline DIR` checkout (absolute path, short commit, row label), or null. */
  baseline: { dir: string; rev: string; name: string } | null;
  /** `runChild`: a fresh `bun SCRIPT ARGS` process and its own peak RSS. */
  runChild: typeof runChild;
  /** `startTorch`: the suite's PyTorch peer script, started once (installed with apt-get when missing). */
  startTorch: typeof startTorch;
}

/** A suite: the default export of `packages/<pkg>/bench/<SUITE>.bench.ts`. */
export interface BenchSuite {
  description: string;
  /** Suite-specific usage lines for `bun run bench SUITE --help` (flags, environment variables). */
  usage?: string;
  cases: (context: BenchContext) => BenchCase[] | Promise<BenchCase[]>;
  teardown?: () => void | Promise<void>;
}

/** One row of bench-results/SUITE.json. */
export interface BenchRow {
  case: string;
  metric: string;
  unit: string;
  /** Median of ours over `runs` runs. */
  ours: number;
  peer: string | null;
  peer_value: number | null;
  /** peer / ours when lower is better, ours / peer when higher is: > 1 means ours is better. */
  ratio: number | null;
  /** Timed runs behind each median. */
  runs: number;
  ours_min: number;
  ours_max: number;
  peer_min: number | null;
  peer_max: number | null;
  /** Lowest and highest 1-minute load average sampled before and after every run (null: untimed, or no /proc/loadavg). */
  load_avg_min: number | null;
  load_avg_max: number | null;
  /** Attempts made: 1, plus one per re-run of a disturbed case. */
  attempts: number;
  /** Why the reported attempt counts as disturbed ("; "-joined), or null when it does not. */
  disturbed: string | null;
}

/** Min, median and max of a list. */
export interface Spread {
  min: number;
  median: number;
  max: number;
}

/** When a measurement counts as disturbed, and what to do about it. */
export interface HarnessOptions {
  /** Overrides every timed case's `runs`. */
  runs?: number;
  /** Re-runs of a disturbed case before it is reported flagged. */
  reruns: number;
  /**
   * A 1-minute load average above this flags the attempt. Default: the machine's cores + 0.5; a case
   * keeping every core busy reads about the core count alone, and one more busy thread adds 1.
   */
  maxLoad: number;
  /** A side's max / min above this flags the attempt. */
  maxSpread: number;
  /** Before a re-run, wait up to this many seconds for the load average to fall to `maxLoad`. */
  settleSeconds: number;
}

/** Defaults of `HarnessOptions`: 2 re-runs, load ≤ cores + 0.5, max / min ≤ 1.25, 30 s to settle. */
export function defaultHarnessOptions(): HarnessOptions {
  return { reruns: 2, maxLoad: availableParallelism() + 0.5, maxSpread: 1.25, settleSeconds: 30 };
}

/** What measureCase reads from the machine (replaced in tests). */
export interface HarnessEnv {
  /** The 1-minute load average, or null where the system has none. */
  loadAverage: () => number | null;
  sleep: (ms: number) => Promise<void>;
  /** Progress (one line, stderr). */
  log: (line: string) => void;
}

/** The real machine: /proc/loadavg, Bun.sleep, stderr. */
export const machine: HarnessEnv = {
  loadAverage,
  sleep: (ms) => Bun.sleep(ms),
  log: (line) => process.stderr.write(`${line}\n`),
};

/** Median of a non-empty list (the mean of the middle two for an even length). */
export function median(xs: number[]): number {
  if (xs.length === 0) throw new TpError("E_ARG", "median of an empty list");
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2;
}

/** Min, median and max of a non-empty list. */
export function spread(xs: number[]): Spread {
  const med = median(xs);
  return { min: Math.min(...xs), median: med, max: Math.max(...xs) };
}

/**
 * The 1-minute load average from the text of /proc/loadavg ("0.52 0.58 0.59 1/467 12345"; proc(5)).
 * @throws TpError E_FORMAT when the first field is not a non-negative number
 */
export function parseLoadAverage(text: string): number {
  const first = text.trim().split(/\s+/)[0] ?? "";
  const x = Number(first);
  if (first === "" || !Number.isFinite(x) || x < 0) {
    throw new TpError("E_FORMAT", `/proc/loadavg: expected a load average first, got '${text.slice(0, 40)}'`);
  }
  return x;
}

/** The machine's 1-minute load average (/proc/loadavg), or null where there is none (not Linux). */
export function loadAverage(): number | null {
  if (!existsSync("/proc/loadavg")) return null;
  return parseLoadAverage(readFileSync("/proc/loadavg", "utf8"));
}

/**
 * A process's peak resident set size in bytes, from the text of /proc/PID/status (its `VmHWM: N kB`
 * line; proc(5)). VmHWM belongs to the process's own address space; `getrusage`'s ru_maxrss does not
 * do for a child: Linux carries the parent's peak across fork + exec into it, so every child of a
 * large harness reads the harness's own peak.
 * @throws TpError E_FORMAT when there is no VmHWM line
 */
export function parseVmHwm(status: string): number {
  const m = /^VmHWM:\s+(\d+) kB$/m.exec(status);
  if (m === null) throw new TpError("E_FORMAT", "/proc/self/status has no 'VmHWM: N kB' line");
  return Number(m[1]) * 1024;
}

/**
 * Why one attempt of a case counts as disturbed: its highest load average above `maxLoad`, or a
 * side's max / min above `maxSpread` (sides whose values are not all finite and positive have no
 * ratio and are not checked). An empty list means it does not.
 * @param sides each side's name and its timed values
 * @param loads 1-minute load averages sampled around the runs (nulls: none available)
 */
export function disturbance(
  sides: { name: string; values: number[] }[],
  loads: (number | null)[],
  bounds: { maxLoad: number; maxSpread: number },
): string[] {
  const reasons: string[] = [];
  let load = Number.NEGATIVE_INFINITY;
  for (const l of loads) if (l !== null && l > load) load = l;
  if (load > bounds.maxLoad) {
    reasons.push(`load average ${load.toFixed(2)} > ${bounds.maxLoad}`);
  }
  for (const side of sides) {
    if (side.values.length < 2 || !side.values.every((v) => Number.isFinite(v) && v > 0)) continue;
    const s = spread(side.values);
    const r = s.max / s.min;
    if (r > bounds.maxSpread) {
      reasons.push(`${side.name} max/min ${r.toFixed(2)} > ${bounds.maxSpread}`);
    }
  }
  return reasons;
}

/** The result of measureCase. */
export interface CaseResult {
  runs: number;
  ours: Spread;
  peer: Spread | null;
  baseline: Spread | null;
  /** Lowest and highest load average of the reported attempt (null: untimed, or none available). */
  load: [number, number] | null;
  attempts: number;
  /** Why the reported attempt is disturbed; empty when it is not. */
  disturbed: string[];
}

/**
 * Measure one case: for a timed case one warm-up of each side, then `runs` rounds of ours, baseline,
 * peer (interleaved, so a slow spell of the machine hits every side), the load average read before
 * the first round and after every run. An attempt that `disturbance` flags is re-run (after waiting up
 * to `settleSeconds` for the load to fall) up to `reruns` times; the last attempt is reported, with its
 * reasons when it is still disturbed. An untimed case (`timed: false`) is read once.
 */
export async function measureCase(
  c: BenchCase,
  options: HarnessOptions,
  env: HarnessEnv = machine,
): Promise<CaseResult> {
  if (c.timed === false) {
    const o = await c.ours();
    const b = c.baseline ? await c.baseline() : null;
    const p = c.peer ? await c.peer.run() : null;
    const one = (x: number | null) => (x === null ? null : { min: x, median: x, max: x });
    return {
      runs: 1,
      ours: one(o) as Spread,
      peer: one(p),
      baseline: one(b),
      load: null,
      attempts: 1,
      disturbed: [],
    };
  }
  const runs = options.runs ?? c.runs ?? 7;
  await c.ours();
  if (c.baseline) await c.baseline();
  if (c.peer) await c.peer.run();
  const attempts = 1 + options.reruns;
  for (let attempt = 1; ; attempt++) {
    const ours: number[] = [];
    const base: number[] = [];
    const peer: number[] = [];
    const loads: (number | null)[] = [env.loadAverage()];
    for (let i = 0; i < runs; i++) {
      ours.push(await c.ours());
      loads.push(env.loadAverage());
      if (c.baseline) {
        base.push(await c.baseline());
        loads.push(env.loadAverage());
      }
      if (c.peer) {
        peer.push(await c.peer.run());
        loads.push(env.loadAverage());
      }
    }
    const sides = [{ name: "ours", values: ours }];
    if (c.baseline) sides.push({ name: "baseline", values: base });
    if (c.peer) sides.push({ name: c.peer.name, values: peer });
    const reasons = disturbance(sides, loads, options);
    if (reasons.length === 0 || attempt >= attempts) {
      const known = loads.filter((l): l is number => l !== null);
      return {
        runs,
        ours: spread(ours),
        peer: c.peer ? spread(peer) : null,
        baseline: c.baseline ? spread(base) : null,
        load: known.length === 0 ? null : [Math.min(...known), Math.max(...known)],
        attempts: attempt,
        disturbed: reasons,
      };
    }
    env.log(`  ${c.case}: disturbed (${reasons.join("; ")}); re-run ${attempt} of ${options.reruns}`);
    await settle(options, env);
  }
}

/** Wait (polling every 5 s, at most `settleSeconds` in all) until the load average is at most `maxLoad`. */
async function settle(options: HarnessOptions, env: HarnessEnv): Promise<void> {
  const limit = options.settleSeconds * 1000;
  for (let waited = 0; ; ) {
    const load = env.loadAverage();
    if (load === null || load <= options.maxLoad || waited >= limit) return;
    const ms = Math.min(5000, limit - waited);
    await env.sleep(ms);
    waited += ms;
  }
}

/** ours vs other as a ratio > 1 when ours is better; null when either is 0 or missing. */
function ratio(better: "lower" | "higher", ours: number, other: number | null): number | null {
  if (other === null || ours === 0 || other === 0) return null;
  return better === "lower" ? other / ours : ours / other;
}

/**
 * The rows of one measured case: ours against its peer (or alone), and with a baseline a second row,
 * case suffixed " @baseline", whose peer is the baseline and whose ratio is ours against it.
 */
export function caseRows(c: BenchCase, r: CaseResult, baselineName: string | null): BenchRow[] {
  const row = (name: string, peer: string | null, other: Spread | null): BenchRow => ({
    case: name,
    metric: c.metric,
    unit: c.unit,
    ours: r.ours.median,
    peer,
    peer_value: other?.median ?? null,
    ratio: ratio(c.better, r.ours.median, other?.median ?? null),
    runs: r.runs,
    ours_min: r.ours.min,
    ours_max: r.ours.max,
    peer_min: other?.min ?? null,
    peer_max: other?.max ?? null,
    load_avg_min: r.load?.[0] ?? null,
    load_avg_max: r.load?.[1] ?? null,
    attempts: r.attempts,
    disturbed: r.disturbed.length === 0 ? null : r.disturbed.join("; "),
  });
  const rows = [row(c.case, c.peer?.name ?? null, r.peer)];
  if (r.baseline !== null) rows.push(row(`${c.case} @baseline`, baselineName ?? "baseline", r.baseline));
  return rows;
}

/** What `runChild` returns. */
export interface ChildRun {
  /** The last line of the script's stdout that parses as a JSON object, or null. */
  result: Record<string, unknown> | null;
  /** The child's own peak RSS (its VmHWM as it exits), or null when it did not get to exit normally. */
  peakRssBytes: number | null;
  exitCode: number | null;
  /** The end of its stderr (for error messages). */
  stderr: string;
}

const CHILD = resolve(import.meta.dir, "bench-child.ts");
/** The key of the line ./bench-child.ts prints as the child exits. */
export const CHILD_KEY = "tp_bench_child";

/**
 * Run `bun SCRIPT ...args` in a fresh process (in `cwd`, default this one's), through ./bench-child.ts,
 * which records the process's own peak RSS as it exits: the same measurement for our worker, a peer's
 * and a baseline checkout's, whatever each reports itself.
 */
export function runChild(script: string, args: string[], options: { cwd?: string } = {}): ChildRun {
  const p = Bun.spawnSync([process.execPath, CHILD, script, ...args], {
    cwd: options.cwd ?? process.cwd(),
    stdout: "pipe",
    stderr: "pipe",
  });
  let result: Record<string, unknown> | null = null;
  let peakRssBytes: number | null = null;
  for (const line of p.stdout.toString().split("\n")) {
    if (!line.startsWith("{")) continue;
    let v: unknown;
    try {
      v = JSON.parse(line);
    } catch {
      continue;
    }
    if (typeof v !== "object" || v === null || Array.isArray(v)) continue;
    const o = v as Record<string, unknown>;
    const child = o[CHILD_KEY] as { peak_rss_bytes?: unknown } | undefined;
    if (child !== undefined && typeof child.peak_rss_bytes === "number") peakRssBytes = child.peak_rss_bytes;
    else result = o;
  }
  return { result, peakRssBytes, exitCode: p.exitCode, stderr: p.stderr.toString().trim().slice(-400) };
}

/** A running PyTorch peer (`startTorch`). */
export interface TorchPeer {
  /** What the peer's `{"op": "info"}` answered: torch's version, its threads, whether it has sdpa, its BLAS. */
  info: {
    torch: string;
    threads: number;
    sdpa: boolean;
    blas: string;
    /** The CUDA device torch sees (`torch.cuda.get_device_name()`, when the script reports it), else null. */
    cuda: string | null;
  };
  /** Send one request; the `seconds` it answers (any other answer throws). */
  ask(req: Record<string, unknown>): Promise<number>;
  close(): void;
}

/** Run a command, echoing it (quiet: no echo, no output); the exit code. */
function sh(argv: string[], quiet = false): number {
  if (!quiet) console.log(`$ ${argv.join(" ")}`);
  const r = Bun.spawnSync(argv, {
    stdout: quiet ? "ignore" : "inherit",
    stderr: quiet ? "ignore" : "inherit",
  });
  return r.exitCode ?? 1;
}

/**
 * The Python that imports torch: Debian's /usr/bin/python3 (where apt installs python3-torch), else
 * the `python3` on PATH; null when neither does.
 */
function torchPython(): string | null {
  for (const py of ["/usr/bin/python3", "python3"]) {
    if ((py.startsWith("/") ? existsSync(py) : Bun.which(py)) && sh([py, "-c", "import torch"], true) === 0)
      return py;
  }
  return null;
}

/** Options of {@link startTorch}. */
export interface StartTorchOptions {
  /**
   * Install PyTorch with apt-get when missing (default true). False for a peer that needs the torch
   * already there (an offline GPU host's pip torch with CUDA): then a missing torch is the reason
   * returned, and OpenBLAS is not asked for.
   */
  install?: boolean;
}

/**
 * Start a suite's PyTorch peer, `python3 SCRIPT THREADS`: PyTorch (python3-torch + OpenBLAS from Debian)
 * is installed with apt-get when missing (unless `options.install` is false). The script reads one JSON
 * request a line on stdin and answers each with one JSON line on stdout: `{"op": "info"}` with `torch`,
 * `threads`, `sdpa`, `config` (torch's build configuration) and optionally `cuda` (the CUDA device
 * name, or null), every other request with `seconds`.
 * @returns the peer, or why there is none (a peer that exits before answering `info` included)
 */
export async function startTorch(
  script: string,
  threads: number,
  options: StartTorchOptions = {},
): Promise<TorchPeer | string> {
  if (options.install === false) {
    const py = torchPython();
    if (py === null) return "no python3 here imports torch (this suite does not install it)";
    return spawnTorch(py, script, threads);
  }
  const openblas = sh(["dpkg", "-s", "libopenblas0-pthread"], true) === 0;
  let py = torchPython();
  if (py === null || !openblas) {
    if (!Bun.which("apt-get")) return "python3-torch is not installed and there is no apt-get";
    console.log("installing PyTorch for the comparison (python3-torch, libopenblas0-pthread) ...");
    sh(["apt-get", "update"]);
    const policy = Bun.spawnSync(["apt-cache", "policy", "python3-torch"], {
      stdout: "pipe",
    }).stdout.toString();
    console.log(policy.trim());
    if (!/Candidate: (?!\(none\))/.test(policy)) return "apt has no python3-torch candidate";
    if (sh(["apt-get", "install", "-y", "python3-torch", "libopenblas0-pthread"]) !== 0) {
      return "apt-get install python3-torch libopenblas0-pthread failed";
    }
    py = torchPython();
    if (py === null) return "python3-torch installed, but no python3 imports torch";
  }
  return spawnTorch(py, script, threads);
}

/** `py SCRIPT THREADS` as a {@link TorchPeer}, after its `info` answer; why not, when it exits first. */
async function spawnTorch(py: string, script: string, threads: number): Promise<TorchPeer | string> {
  const proc = Bun.spawn([py, script, String(threads)], {
    stdin: "pipe",
    stdout: "pipe",
    stderr: "inherit",
  });
  const reader = proc.stdout.getReader();
  let buffered = "";
  const decoder = new TextDecoder();
  async function line(): Promise<string> {
    for (;;) {
      const nl = buffered.indexOf("\n");
      if (nl >= 0) {
        const l = buffered.slice(0, nl);
        buffered = buffered.slice(nl + 1);
        return l;
      }
      const { value, done } = await reader.read();
      if (done) throw new Error("the torch peer exited");
      buffered += decoder.decode(value);
    }
  }
  async function send(req: Record<string, unknown>): Promise<Record<string, unknown>> {
    proc.stdin.write(`${JSON.stringify(req)}\n`);
    proc.stdin.flush();
    return JSON.parse(await line()) as Record<string, unknown>;
  }
  let raw: Record<string, unknown>;
  try {
    raw = await send({ op: "info" });
  } catch (e) {
    proc.kill();
    return `the torch peer ${script} did not answer info: ${(e as Error).message}`;
  }
  const blas = /BLAS_INFO=(\w+)/.exec(String(raw.config))?.[1] ?? "?";
  return {
    info: {
      torch: String(raw.torch),
      threads: Number(raw.threads),
      sdpa: Boolean(raw.sdpa),
      blas,
      cuda: typeof raw.cuda === "string" ? raw.cuda : null,
    },
    ask: async (req) => {
      const r = await send(req);
      if (typeof r.seconds !== "number") throw new Error(`torch peer: ${JSON.stringify(r)}`);
      return r.seconds;
    },
    close: () => {
      proc.stdin.end();
      proc.kill();
    },
  };
}
