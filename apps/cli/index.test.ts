// The CLI as a user runs it: a child process, its stdout, its one-line errors and exit codes.
import { expect, test } from "bun:test";
import { resolve } from "node:path";

const cli = resolve(import.meta.dir, "index.ts");
const run = (...args: string[]) => {
  const r = Bun.spawnSync([process.execPath, cli, ...args], { stdout: "pipe", stderr: "pipe" });
  return { code: r.exitCode, out: r.stdout.toString(), err: r.stderr.toString() };
};

test("backends --json lists every backend; cpu starts here, the others start or say why not", () => {
  const r = run("backends", "--json", "--threads", "1");
  expect(r.code).toBe(0);
  const rows = JSON.parse(r.out) as {
    backend: string;
    available: boolean;
    device: string | null;
    error: string | null;
  }[];
  expect(rows.map((x) => x.backend)).toEqual(["cpu", "vulkan", "ptx", "cuda"]);
  expect(rows[0]).toMatchObject({ available: true, error: null });
  expect(rows[0]?.device).toEndWith(", 1 thread)");
  for (const row of rows.slice(1)) {
    if (row.backend === "vulkan" && row.available) {
      // where the Vulkan backend is built and a device is present (Mesa's llvmpipe in CI)
      expect(row).toMatchObject({ error: null });
      expect(row.device?.length).toBeGreaterThan(0);
      continue;
    }
    expect(row.available).toBe(false);
    expect(row.error).toStartWith("E_UNSUPPORTED: backend ");
  }
});

test("usage errors are one line on stderr with exit status 2", () => {
  for (const [args, message] of [
    [
      ["frob"],
      "error E_ARG: unknown command 'frob'; expected one of: generate, decode, encode, backends, inspect, quantize, help\n",
    ],
    [
      ["backends", "--threads", "x"],
      "error E_ARG: --threads must be an integer from 0 (all CPUs) to 256, got 'x'\n",
    ],
    [["backends", "--bogus"], "error E_ARG: Unknown option '--bogus'\n"],
  ] as const) {
    const r = run(...args);
    expect(r.err).toBe(message);
    expect(r.code).toBe(2);
  }
  expect(run("help").out).toStartWith("usage: bun apps/cli <command>");
});

test("no command is a usage error: the usage on stderr, exit 2; help / --help / -h: stdout, exit 0", () => {
  const none = run();
  expect(none.code).toBe(2);
  expect(none.out).toBe("");
  expect(none.err).toStartWith("usage: bun apps/cli <command>");
  for (const h of ["help", "--help", "-h"]) {
    const r = run(h);
    expect(r.code).toBe(0);
    expect(r.out).toStartWith("usage: bun apps/cli <command>");
    expect(r.err).toBe("");
  }
});
