// No generated kernel reads a register before writing it: ptxas accepts such code, so this is the only
// CPU-side guard against an instruction emitted before the ones that compute its inputs. Every
// catalogued kernel of every family, in the module of each target (sm_80/86/89/90).
// The rule (./dataflow.ts has it in full): walk each `.entry` body in text order; sources (the guard
// predicate, address registers, every operand of st/red/bar/bra) are read before the destination is
// written; a read with no earlier write in the text fails, naming kernel, target, register and line.
// `ld.param` is an ordinary write. A loop (label … backward bra) that reads a value carried from the
// previous iteration before the body writes it reads, in text order, ahead of that write, so it
// passes only when a line before the loop writes the register too. Predicated writes and writes in a
// block a forward branch skips count as writes: this finds misordered and never-initialised reads,
// it does not prove a write on every path.
import { describe, expect, test } from "bun:test";
import { kernelCatalogue } from "./catalogue.ts";
import { uninitialisedReads } from "./dataflow.ts";
import { ptxModule } from "./emit.ts";

const TARGETS = [80, 86, 89, 90];

describe("uninitialisedReads", () => {
  test("finds a read ahead of its write, a loop-carried value never set before the loop; accepts the rest", () => {
    const body = [
      ".visible .entry k(",
      "\t.param .u64 k_out",
      ")",
      "{",
      "\t.reg .b32 %r<4>;",
      "\tld.param.u64 %rd0, [k_out];",
      "\tmad.wide.u32 %rd1, %r0, 4, %rd0;", // line 7: %r0 read before the div writes it
      "\tdiv.u32 %r0, %r1, 3;", // line 8: %r1 never written
      "\tmov.u32 %r2, 0;",
      "$L_loop_0:",
      "\tadd.u32 %r2, %r2, 1;", // carried, set before the loop: fine
      "\tadd.u32 %r3, %r3, %r2;", // line 12: carried, never set before the loop
      "\tsetp.lt.u32 %p0, %r2, 8;",
      "\t@%p0 bra $L_loop_0;",
      "\tst.global.u32 [%rd1+4], %r3;",
      "\tret;",
      "}",
    ].join("\n");
    expect(uninitialisedReads(body).map((u) => `${u.register}@${u.line}`)).toEqual([
      "%r0@7",
      "%r1@8",
      "%r3@12",
    ]);
  });
  test("vector destinations, mma accumulators and predicate guards", () => {
    const body = [
      ".visible .entry v()",
      "{",
      "\tld.global.v2.f32 {%f0, %f1}, [%rd0];", // %rd0 unwritten (address register)
      "\tmma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f2, %f3}, {%r0}, {%r1}, {%f2, %f3};",
      "\t@%p1 st.global.f32 [%rd0], %f0;",
    ].join("\n");
    expect(uninitialisedReads(body).map((u) => `${u.register}@${u.line}`)).toEqual([
      "%rd0@3",
      "%r0@4",
      "%r1@4",
      "%f2@4",
      "%f3@4",
      "%p1@5",
      "%rd0@5",
    ]);
  });
});

describe("every catalogued kernel writes each register before reading it", () => {
  const catalogue = kernelCatalogue();
  for (const sm of TARGETS) {
    for (const [family, kernels] of Object.entries(catalogue)) {
      test(`sm_${sm}: ${family} (${kernels.length} kernels)`, () => {
        const module = ptxModule(
          sm,
          kernels.filter((k) => k.minSm <= sm),
        );
        const reads = uninitialisedReads(module).map(
          (u) => `${u.kernel} sm_${sm}: ${u.register} read before written, line ${u.line}: ${u.instruction}`,
        );
        expect(reads).toEqual([]);
      });
    }
  }
});
