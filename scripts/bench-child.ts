/**
 * `bun scripts/bench-child.ts SCRIPT ARGS...`: run SCRIPT in this process as if started as `bun SCRIPT
 * ARGS...` (it sees ARGS at `process.argv.slice(2)`), and as the process exits print one line
 * `{"tp_bench_child":{"peak_rss_bytes":N}}`, N being this process's VmHWM (/proc/self/status, proc(5)).
 * The bench harness (./bench-harness.ts, `runChild`) starts every worker through it, so each engine's
 * peak RSS is its own process's, measured the same way for ours, a peer and a baseline checkout:
 * a child's getrusage ru_maxrss would be the harness's (Linux carries it across fork + exec).
 */
import { readFileSync, writeSync } from "node:fs";
import { resolve } from "node:path";

const script = process.argv[2];
if (script === undefined) {
  process.stderr.write("usage: bun scripts/bench-child.ts SCRIPT ARGS...\n");
  process.exit(2);
}
process.argv.splice(1, 1); // [bun, SCRIPT, ARGS...], as a direct start would give
process.on("exit", () => {
  const m = /^VmHWM:\s+(\d+) kB$/m.exec(readFileSync("/proc/self/status", "utf8"));
  const peak = m === null ? null : Number(m[1]) * 1024;
  writeSync(1, `${JSON.stringify({ tp_bench_child: { peak_rss_bytes: peak } })}\n`);
});
await import(resolve(script));
