// Interrupting `bun apps/cli` while it writes (issue 21, items 1–2): SIGINT / SIGTERM during the write
// remove the unfinished output and exit 130 / 143 with one line; a SIGKILL leaves the temporary file,
// which the next run removes, saying so. The window is made reliable by the test-only hook
// TP_TEST_PAUSE_AFTER_TEMP_MS, which blocks the (synchronous) writer right after it creates its
// temporary file — so the test also proves the handler runs while JavaScript is busy.
import { afterAll, describe, expect, test } from "bun:test";
import {
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  rmSync,
  statSync,
  truncateSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

const cli = resolve(import.meta.dir, "index.ts");
const tmp = mkdtempSync(join(tmpdir(), "tp-cli-interrupt-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const input = resolve(
  import.meta.dir,
  "../../../shared/testdata/krea2-tiny/checkpoints/krea2_tiny_bf16.safetensors",
);
const lib = resolve(import.meta.dir, "../../packages/backend-cpu/build/libtp_cpu.so");
const why = !existsSync(input)
  ? ` [skipped: shared fixture missing: ${input}]`
  : !existsSync(lib)
    ? ` [skipped: ${lib} not built (bun run build)]`
    : "";

/** Start `quantize IN dir/out.safetensors`, paused after its temporary file exists; wait for that file. */
async function startPaused(dir: string): Promise<Bun.Subprocess<"ignore", "pipe", "pipe">> {
  mkdirSync(dir);
  const p = Bun.spawn(
    [process.execPath, cli, "quantize", "--format", "int8-convrot", input, join(dir, "out.safetensors")],
    { stdout: "pipe", stderr: "pipe", env: { ...process.env, TP_TEST_PAUSE_AFTER_TEMP_MS: "30000" } },
  );
  const t0 = performance.now();
  while (!readdirSync(dir).some((n) => n.startsWith("out.safetensors.tmp-"))) {
    if (performance.now() - t0 > 20_000 || p.exitCode !== null) {
      p.kill("SIGKILL");
      throw new Error(`no temporary file appeared: ${await new Response(p.stderr).text()}`);
    }
    await Bun.sleep(10);
  }
  return p;
}

describe.skipIf(why !== "")(`signals during a write${why}`, () => {
  for (const [signal, status] of [
    ["SIGINT", 130],
    ["SIGTERM", 143],
  ] as const) {
    test(`${signal}: exit ${status}, one line, no file left`, async () => {
      const dir = join(tmp, signal);
      const p = await startPaused(dir);
      const t0 = performance.now();
      p.kill(signal);
      expect(await p.exited).toBe(status);
      // at once, although JavaScript was blocked for 30 s
      expect(performance.now() - t0).toBeLessThan(5000);
      const err = await new Response(p.stderr).text();
      expect(err.trimEnd().split("\n").at(-1)).toBe(
        `interrupted by ${signal}: 1 unfinished output file removed`,
      );
      expect(err).not.toContain("    at "); // no stack
      expect(readdirSync(dir)).toEqual([]);
    }, 30_000);
  }

  test("IN truncated while quantize runs: E_IO naming IN and its sizes, no output, no temporary file", async () => {
    const dir = join(tmp, "truncated");
    mkdirSync(dir);
    const copy = join(dir, "in.safetensors");
    copyFileSync(input, copy);
    const size = statSync(copy).size;
    const p = Bun.spawn(
      [process.execPath, cli, "quantize", "--format", "int8-convrot", copy, join(dir, "out.safetensors")],
      { stdout: "pipe", stderr: "pipe", env: { ...process.env, TP_TEST_PAUSE_AFTER_TEMP_MS: "1500" } },
    );
    while (!readdirSync(dir).some((n) => n.startsWith("out.safetensors.tmp-"))) await Bun.sleep(10);
    truncateSync(copy, 100_000);
    expect(await p.exited).toBe(1);
    const err = (await new Response(p.stderr).text()).trim();
    expect(err).toStartWith(
      `error E_IO: ${copy} changed while in use (its size went from ${size} to 100000 bytes)`,
    );
    expect(err.split("\n").length).toBe(1);
    expect(readdirSync(dir)).toEqual(["in.safetensors"]);
  }, 60_000);

  test("SIGKILL leaves the temporary file; the next run removes it and says so", async () => {
    const dir = join(tmp, "killed");
    const p = await startPaused(dir);
    const left = readdirSync(dir);
    p.kill("SIGKILL");
    await p.exited;
    expect(left.length).toBe(1);
    expect(readdirSync(dir)).toEqual(left);
    const r = Bun.spawnSync(
      [process.execPath, cli, "quantize", "--format", "int8-convrot", input, join(dir, "out.safetensors")],
      { stdout: "pipe", stderr: "pipe" },
    );
    expect(r.exitCode).toBe(0);
    expect(r.stderr.toString()).toContain(
      `note: removed ${join(dir, left[0] as string)}, a temporary file left by process ${p.pid}, which is no longer running`,
    );
    expect(readdirSync(dir)).toEqual(["out.safetensors"]);
  }, 60_000);
});
