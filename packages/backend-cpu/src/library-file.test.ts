// A damaged TP_CPU_LIB must be a TpError E_IO, never a crash or a hang: dlopen of a truncated library
// dies of SIGBUS, dlopen of a FIFO blocks forever. Each load runs in a child process, so a crash shows
// up as a signal exit instead of taking the test runner down.
import { afterAll, expect, test } from "bun:test";
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { defaultCpuLibraryPath } from "./ffi.ts";

const dir = mkdtempSync(join(tmpdir(), "tp-libfile-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const real = defaultCpuLibraryPath();
const ffi = resolve(import.meta.dir, "ffi.ts"); // the loader alone, not the whole backend

/** Load the library at `path` in a child process; its stdout is the error code or "ok". */
function loadInChild(path: string): { status: number | null; signal: string | null; out: string } {
  const src = `import { loadCpuLibrary } from ${JSON.stringify(ffi)};
try { loadCpuLibrary(${JSON.stringify(path)}); console.log("ok"); } catch (e) { console.log(e.code + " " + e.message); }`;
  const r = Bun.spawnSync([process.execPath, "-e", src], { stdout: "pipe", stderr: "pipe", timeout: 20_000 });
  return {
    status: r.exitCode,
    signal: r.signalCode === undefined || r.signalCode === null ? null : String(r.signalCode),
    out: r.stdout.toString().trim(),
  };
}

test("truncated copies of the library are E_IO naming the file", () => {
  const bytes = readFileSync(real);
  for (const cut of [64, 1000, 4096, 8192, Math.floor(bytes.length * 0.75), bytes.length - 100]) {
    const path = join(dir, `cut-${cut}.so`);
    writeFileSync(path, bytes.subarray(0, cut));
    const r = loadInChild(path);
    expect({ cut, signal: r.signal, status: r.status }).toEqual({ cut, signal: null, status: 0 });
    expect(r.out).toStartWith(`E_IO ${path} is not a usable shared library: `);
  }
  copyFileSync(real, join(dir, "whole.so"));
  expect(loadInChild(join(dir, "whole.so")).out).toBe("ok");
});

test("a FIFO, a directory and a text file are E_IO, without blocking", () => {
  const fifo = join(dir, "fifo.so");
  Bun.spawnSync(["mkfifo", fifo]);
  const text = join(dir, "text.so");
  writeFileSync(text, "not a library\n".repeat(10));
  for (const [path, why] of [
    [fifo, "not a regular file"],
    [dir, "not a regular file"],
    [text, "no ELF magic"],
  ] as const) {
    const r = loadInChild(path);
    expect(r.signal).toBeNull();
    expect(r.out).toContain(why);
    expect(r.out).toStartWith("E_IO ");
  }
});

test("a missing file is E_IO that blames TP_CPU_LIB when it came from there, else says to build", () => {
  const missing = join(dir, "no-such.so");
  const src = `import { loadCpuLibrary } from ${JSON.stringify(ffi)};
try { loadCpuLibrary(); console.log("ok"); } catch (e) { console.log(e.code + " " + e.message); }`;
  const viaEnv = Bun.spawnSync([process.execPath, "-e", src], {
    env: { ...process.env, TP_CPU_LIB: missing },
    stdout: "pipe",
    timeout: 20_000,
  });
  expect(viaEnv.stdout.toString().trim()).toStartWith(
    `E_IO TP_CPU_LIB points at ${missing}, which does not exist; unset it to use the library 'bun run build' makes`,
  );
  const r = loadInChild(missing);
  expect(r.out).toStartWith(`E_IO CPU library not built: ${missing} is missing; run 'bun run build'`);
});
