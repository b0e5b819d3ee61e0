// The CLI as a user runs it: a child process, its stdout, its one-line errors and exit codes.
import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { resolve } from "node:path";

const cli = resolve(import.meta.dir, "index.ts");
const spawn = (args: string[], env: Record<string, string>) => {
  const r = Bun.spawnSync([process.execPath, cli, ...args], {
    stdout: "pipe",
    stderr: "pipe",
    env: { ...process.env, ...env },
  });
  return { code: r.exitCode, out: r.stdout.toString(), err: r.stderr.toString() };
};
const run = (...args: string[]) => spawn(args, {});
// FORCE_COLOR=1: Bun colours console.error on a pipe as on a terminal (error lines are red on purpose).
const runColoured = (...args: string[]) => spawn(args, { FORCE_COLOR: "1" });
const COMMANDS = ["generate", "decode", "encode", "backends", "inspect", "quantize", "models"];

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
      "error E_ARG: unknown command 'frob'; expected one of: generate, decode, encode, backends, inspect, quantize, models, help\n",
    ],
    [
      ["backends", "--threads", "x"],
      "error E_ARG: --threads must be an integer from 0 (all CPUs) to 256, got 'x'\n",
    ],
    [
      ["backends", "--bogus"],
      "error E_ARG: unknown flag --bogus for backends; see 'bun apps/cli backends --help'\n",
    ],
    [
      ["backends", "--thread", "2"],
      "error E_ARG: unknown flag --thread for backends; did you mean --threads?\n",
    ],
    [["backends", "--jsno"], "error E_ARG: unknown flag --jsno for backends; did you mean --json?\n"],
    [
      ["inspect", "--arraylimit", "2", "x"],
      "error E_ARG: unknown flag --arraylimit for inspect; did you mean --array-limit?\n",
    ],
    [["inpsect", "x"], "error E_ARG: unknown command 'inpsect'; did you mean inspect?\n"],
    [["quantise"], "error E_ARG: unknown command 'quantise'; did you mean quantize?\n"],
    [
      ["help", "frob"],
      "error E_ARG: help takes at most one COMMAND, one of: generate, decode, encode, backends, inspect, quantize, models; got 'frob'\n",
    ],
  ] as const) {
    const r = run(...args);
    expect(r.err).toBe(message);
    expect(r.code).toBe(2);
  }
  expect(run("help").out).toStartWith("usage: bun apps/cli <command>");
});

test("no command is a usage error: the usage on stderr (not red), exit 2; help / --help / -h: stdout, exit 0", () => {
  const none = runColoured();
  expect(none.code).toBe(2);
  expect(none.out).toBe("");
  expect(none.err).toStartWith("usage: bun apps/cli <command>");
  expect(none.err).not.toContain("\x1b[");
  for (const h of ["help", "--help", "-h"]) {
    const r = run(h);
    expect(r.code).toBe(0);
    expect(r.out).toStartWith("usage: bun apps/cli <command>");
    expect(r.err).toBe("");
  }
});

test("every command answers --help, -h and help COMMAND with its own usage on stdout, exit 0", () => {
  const all = run("help").out;
  for (const command of COMMANDS) {
    expect(all).toContain(`\n  ${command} `);
    for (const args of [
      [command, "--help"],
      [command, "-h"],
      ["help", command],
    ]) {
      const r = run(...args);
      expect([args, r.code, r.err]).toEqual([args, 0, ""]);
      expect(r.out).toStartWith("usage: bun apps/cli\n");
      expect(r.out).toContain(`\n  ${command} `);
      expect(r.out).not.toContain("<command>"); // not the global usage
      expect(r.out).not.toContain("../shared");
    }
  }
  expect(run("backends", "--help").out).toBe(
    "usage: bun apps/cli\n" +
      "  backends [--threads N] [--json] [--verbose]\n" +
      "                                    list the compute backends and whether each can start here\n" +
      "                                    (--threads 0: all CPUs, the default; --verbose: each backend\n" +
      "                                    prints its device and limits on stderr, e.g. vulkan's device\n" +
      "                                    choice, memory, limits, features and kernel variants)\n",
  );
  // --help wins over missing arguments
  expect(run("inspect", "--help").code).toBe(0);
  expect(run("quantize", "-h").code).toBe(0);
  expect(all).not.toContain("../shared");
  expect(all).not.toMatch(/\bbench\b/); // commands that do not exist yet are not listed
});

test("the default --out of generate / decode (out.png) is git-ignored, wherever it is written", () => {
  const root = resolve(import.meta.dir, "../..");
  const isRepo = Bun.spawnSync(["git", "rev-parse", "--is-inside-work-tree"], { cwd: root, stdout: "pipe" });
  if (isRepo.exitCode !== 0) return; // a copy without git: nothing to check
  for (const p of ["out.png", "apps/cli/out.png"]) {
    const r = Bun.spawnSync(["git", "check-ignore", "--no-index", "-q", p], { cwd: root });
    expect([p, r.exitCode]).toEqual([p, 0]);
  }
  expect(Bun.spawnSync(["git", "check-ignore", "--no-index", "-q", "x.png"], { cwd: root }).exitCode).toBe(1);
});

test("README.md lists exactly the commands that exist, and every flag it names is one they accept", () => {
  const readme = readFileSync(resolve(import.meta.dir, "README.md"), "utf8");
  const rows = readme
    .split("\n")
    .filter((l) => l.startsWith("| `"))
    .map((l) => (l.split(/(?<!\\)\|/)[1] ?? "").trim().replace(/^`|`$/g, ""));
  const commandRows = rows.filter((r) => /^[a-z]+( |$)/.test(r));
  expect(commandRows.map((r) => r.split(" ")[0]).sort()).toEqual([...COMMANDS, "help"].sort());
  // the generate flag table's rows (`--prompt P`, `--dit F`, `--vae F`, …) belong to generate
  const flagRows = rows.filter((r) => r.startsWith("--")).join(" ");
  for (const row of [...commandRows.filter((r) => !r.startsWith("help")), `generate ${flagRows}`]) {
    const command = row.split(" ")[0] as string;
    const flags = [...new Set(row.match(/--[a-z][a-z-]*/g) ?? [])];
    // every flag with a value (`--flag=x`), booleans bare; then --help: exit 0 means all were accepted
    const bare = new Set<string>();
    let r = run(command, ...flags.map((f) => `${f}=x`), "--help");
    for (let tries = 0; r.code !== 0 && tries < flags.length; tries++) {
      const boolean = /Option '(?:-\w, )?(--[a-z-]+)' does not take an argument/.exec(r.err)?.[1];
      expect([command, boolean === undefined ? r.err : "ok"]).toEqual([command, "ok"]);
      bare.add(boolean as string);
      r = run(command, ...flags.map((f) => (bare.has(f) ? f : `${f}=x`)), "--help");
    }
    expect([command, r.code, r.err]).toEqual([command, 0, ""]);
  }
});
