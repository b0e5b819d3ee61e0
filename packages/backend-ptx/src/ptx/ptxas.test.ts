// Every generated kernel of the catalogue is assembled by ptxas for sm_80 / sm_86 (Ampere), sm_89 (Ada)
// and sm_90 (Hopper), a kernel whose minSm is newer than a target (the fp8 ones: sm_89) only from its minSm:
// one module per family and target; a family that fails is assembled kernel by kernel so the failure
// names the kernel and the ptxas message. Skips with the reason where ptxas is absent (CUDA toolkit).
import { describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { kernelCatalogue } from "./catalogue.ts";
import { type KernelSource, ptxModule } from "./emit.ts";

const ptxas =
  process.env.TP_PTXAS ?? Bun.which("ptxas") ?? Bun.which("ptxas", { PATH: "/usr/local/cuda/bin" });
const TARGETS = [80, 86, 89, 90];

function assemble(sm: number, kernels: readonly KernelSource[], dir: string): string | null {
  const file = join(dir, `k_${sm}.ptx`);
  writeFileSync(file, ptxModule(sm, kernels));
  const r = Bun.spawnSync([ptxas as string, `-arch=sm_${sm}`, "-o", join(dir, "out.cubin"), file]);
  return r.exitCode === 0 ? null : r.stderr.toString().trim();
}

describe("ptxas assembles every generated kernel", () => {
  if (ptxas === null) {
    test.skip("skipped: ptxas not found (install the CUDA toolkit, or set TP_PTXAS)", () => {});
    return;
  }
  const catalogue = kernelCatalogue();
  for (const sm of TARGETS) {
    for (const [family, all] of Object.entries(catalogue)) {
      // a kernel for newer devices (fp8 mma: sm_89) is assembled only for those
      const kernels = all.filter((k) => k.minSm <= sm);
      test(`sm_${sm}: ${family} (${kernels.length} kernels)`, () => {
        const dir = mkdtempSync(join(tmpdir(), "tp-ptxas-"));
        try {
          const names = new Set(kernels.map((k) => k.name));
          expect(names.size).toBe(kernels.length); // entry names are unique
          if (assemble(sm, kernels, dir) === null) return;
          const failures = kernels.map((k) => [k.name, assemble(sm, [k], dir)]).filter(([, e]) => e !== null);
          expect(failures).toEqual([]);
        } finally {
          rmSync(dir, { recursive: true, force: true });
        }
      }, 60_000);
    }
  }
});
