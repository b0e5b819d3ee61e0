// The public surface of @tp/backend-cpu: exactly what other packages import (issue 30), and an import
// that never touches the native library, so the package loads where the library is not built.
import { expect, test } from "bun:test";
import { resolve } from "node:path";
import * as pkg from "./index.ts";

test("the package exports the backend, the native library's loader and names, and the quantizers", () => {
  expect(Object.keys(pkg).sort()).toEqual(
    [
      "CPU_FEATURES",
      "CPU_ISA",
      "CpuBackend",
      "NATIVE_WEIGHT_FORMATS",
      "createBackend",
      "createNativeQuantizer",
      "loadCpuLibrary",
      "nativeInterruptHandler",
      "quantizeRows",
      "resolveThreads",
    ].sort(),
  );
});

test("importing the package without a library works; creating a backend is E_IO naming the file", () => {
  const index = resolve(import.meta.dir, "index.ts");
  const src = `const m = await import(${JSON.stringify(index)});
try { m.createBackend({ threads: 1 }); console.log("created"); } catch (e) { console.log(e.code + " " + e.file); }`;
  const r = Bun.spawnSync([process.execPath, "-e", src], {
    env: { ...process.env, TP_CPU_LIB: "/nonexistent/libtp_cpu.so" },
    stdout: "pipe",
    stderr: "pipe",
    timeout: 20_000,
  });
  expect(r.stderr.toString()).toBe("");
  expect(r.stdout.toString().trim()).toBe("E_IO /nonexistent/libtp_cpu.so");
});
