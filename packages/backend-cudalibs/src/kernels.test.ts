// The cuda backend's own PTX kernels assembled by ptxas for sm_80 / 86 / 89 / 90 (skips, with the
// reason, without the CUDA toolkit), as @tp/backend-ptx's ptxas test does for its catalogue; and none reads a
// register before writing it (@tp/backend-ptx's uninitialisedReads, no toolkit needed).
import { describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ptx } from "@tp/backend-ptx";
import { absMaxKernel, dequantInt32Kernel, quantizeFp8Kernel } from "./kernels.ts";

const ptxas =
  process.env.TP_PTXAS ??
  Bun.which("ptxas") ??
  Bun.which("ptxas", { PATH: "/usr/local/cuda/bin:/usr/local/cuda-13.0/bin" });

describe("ptxas assembles the cuda backend's kernels", () => {
  if (ptxas === null) {
    test.skip("skipped: ptxas not found (install the CUDA toolkit, or set TP_PTXAS)", () => {});
    return;
  }
  for (const sm of [80, 86, 89, 90]) {
    test(`dequant_i32 (with and without bias), absmax${sm >= 89 ? ", quantize_fp8" : ""}: sm_${sm}`, () => {
      const dir = mkdtempSync(join(tmpdir(), "tp-cudalibs-ptx-"));
      try {
        const file = join(dir, "k.ptx");
        const fp8 = sm >= 89 ? [absMaxKernel(), quantizeFp8Kernel()] : [absMaxKernel()];
        writeFileSync(file, ptx.ptxModule(sm, [dequantInt32Kernel(false), dequantInt32Kernel(true), ...fp8]));
        const r = Bun.spawnSync([ptxas as string, `-arch=sm_${sm}`, "-o", join(dir, "k.cubin"), file]);
        expect(r.stderr.toString().trim()).toBe("");
        expect(r.exitCode).toBe(0);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    });
  }
  test("the fp8 quantizer needs sm_89 (cvt e4m3x2)", () => {
    expect(() => ptx.ptxModule(86, [quantizeFp8Kernel()])).toThrow("needs sm_89 or newer");
  });
  test("parameters in launch order", () => {
    expect(dequantInt32Kernel(true).params.map((p) => p.name)).toEqual([
      "out",
      "acc",
      "x_scale",
      "w_scale",
      "bias",
      "rows",
      "cols",
    ]);
  });
});

describe("the cuda backend's kernels", () => {
  test("no kernel reads a register before writing it (@tp/backend-ptx's uninitialisedReads)", () => {
    for (const sm of [80, 86, 89, 90]) {
      const fp8 = sm >= 89 ? [absMaxKernel(), quantizeFp8Kernel()] : [absMaxKernel()];
      const module = ptx.ptxModule(sm, [dequantInt32Kernel(false), dequantInt32Kernel(true), ...fp8]);
      const reads = ptx
        .uninitialisedReads(module)
        .map(
          (u) => `${u.kernel} sm_${sm}: ${u.register} read before written, line ${u.line}: ${u.instruction}`,
        );
      expect(reads).toEqual([]);
    }
  });
});
