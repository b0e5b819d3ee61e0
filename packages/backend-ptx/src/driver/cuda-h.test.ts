// The FFI declarations of ./cuda.ts against cuda.h: a C probe compiled against the header prints the
// sizes, enum values and exported names (what cuda.h's macros map each API name to) that the TS
// constants assume, and the test compares them. Skips, with the reason, where cuda.h or cc is absent.
import { describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CU_DEVICE_ATTRIBUTE, CU_ENUM, CU_RESULT, CU_SIZES, CUDA_SYMBOL_NAMES } from "./cuda.ts";

const include = [process.env.CUDA_HOME, "/usr/local/cuda", "/usr/local/cuda-13.0"]
  .filter((d): d is string => d !== undefined)
  .map((d) => join(d, "include"))
  .find((d) => existsSync(join(d, "cuda.h")));
const cc = Bun.which("cc") ?? Bun.which("gcc");
const why =
  include === undefined
    ? "cuda.h not found (CUDA_HOME, /usr/local/cuda)"
    : cc === null
      ? "no C compiler (cc)"
      : null;

function probe(): Record<string, number | string> {
  const dir = mkdtempSync(join(tmpdir(), "tp-cuda-h-"));
  try {
    const lines: string[] = [];
    const num = (key: string, expr: string) =>
      lines.push(`printf("\\"${key}\\": %lld,\\n", (long long)(${expr}));`);
    num("sizeof.CUresult", "sizeof(CUresult)");
    num("sizeof.CUdevice", "sizeof(CUdevice)");
    num("sizeof.CUdeviceptr", "sizeof(CUdeviceptr)");
    num("sizeof.handle", "sizeof(CUstream)");
    num("sizeof.CUjit_option", "sizeof(CUjit_option)");
    for (const k of Object.keys(CU_RESULT)) num(`result.${k}`, k);
    for (const k of Object.keys(CU_DEVICE_ATTRIBUTE)) num(`attr.${k}`, `CU_DEVICE_ATTRIBUTE_${k}`);
    for (const k of Object.keys(CU_ENUM)) num(`enum.${k}`, k);
    for (const k of Object.keys(CUDA_SYMBOL_NAMES))
      lines.push(`printf("\\"symbol.${k}\\": \\"%s\\",\\n", XSTR(${k}));`);
    const src = `#include <cuda.h>\n#include <stdio.h>\n#define STR(x) #x\n#define XSTR(x) STR(x)\nint main(void){printf("{\\n");\n${lines.join("\n")}\nprintf("\\"end\\": 0}\\n");return 0;}\n`;
    writeFileSync(join(dir, "probe.c"), src);
    const build = Bun.spawnSync([
      cc as string,
      "-I",
      include as string,
      "-o",
      join(dir, "probe"),
      join(dir, "probe.c"),
    ]);
    if (build.exitCode !== 0) throw new Error(`probe did not compile: ${build.stderr.toString()}`);
    const out = Bun.spawnSync([join(dir, "probe")]);
    return JSON.parse(out.stdout.toString());
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

describe("cuda.h agrees with the FFI declarations", () => {
  if (why !== null) {
    test.skip(`skipped: ${why}`, () => {});
    return;
  }
  const got = probe();
  test("sizes of CUresult, CUdevice, CUdeviceptr, handles, CUjit_option", () => {
    for (const [k, v] of Object.entries(CU_SIZES)) expect([k, got[`sizeof.${k}`]]).toEqual([k, v]);
  });
  test("CUresult codes", () => {
    for (const [k, v] of Object.entries(CU_RESULT)) expect([k, got[`result.${k}`]]).toEqual([k, v]);
  });
  test("device attributes and other enum values", () => {
    for (const [k, v] of Object.entries(CU_DEVICE_ATTRIBUTE)) expect([k, got[`attr.${k}`]]).toEqual([k, v]);
    for (const [k, v] of Object.entries(CU_ENUM)) expect([k, got[`enum.${k}`]]).toEqual([k, v]);
  });
  test("exported names: what cuda.h maps each API name to", () => {
    for (const [k, v] of Object.entries(CUDA_SYMBOL_NAMES)) expect([k, got[`symbol.${k}`]]).toEqual([k, v]);
  });
});
