// The emitter's own rules: module header by compute capability, exact float immediates, kernels
// refused below their minimum sm, parameter lists in declaration order, unique names.
import { describe, expect, test } from "bun:test";
import { mergeDims } from "../ops.ts";
import { kernelCatalogue } from "./catalogue.ts";
import { mapKernel } from "./elementwise.ts";
import { f32Imm, f64Imm, KernelBuilder, ptxHeader, ptxModule } from "./emit.ts";
import { mmaKernel } from "./matmul.ts";
import { mmaTiledKernel } from "./mma-tiled.ts";

describe("PTX emitter", () => {
  test("header: .version by target, .target sm_XX, .address_size 64; below sm_80 E_UNSUPPORTED", () => {
    expect(ptxHeader(86)).toBe(".version 7.8\n.target sm_86\n.address_size 64\n");
    expect(ptxHeader(90)).toBe(".version 8.1\n.target sm_90\n.address_size 64\n");
    expect(ptxHeader(89)).toBe(".version 8.1\n.target sm_89\n.address_size 64\n");
    expect(() => ptxHeader(75)).toThrow("sm_75 is older than sm_80");
  });
  test("a kernel needing a newer PTX ISA raises the module's .version (fp8 mma: 8.4); fp8 mma below sm_89 is E_UNSUPPORTED", () => {
    const fp8 = mmaTiledKernel({ operand: "e4m3", bias: false, scaled: false });
    const f16 = mmaTiledKernel({ operand: "f16", bias: false, scaled: false });
    expect(fp8.ptxIsa).toBe("8.4");
    expect(ptxModule(89, [f16, fp8]).startsWith(".version 8.4\n.target sm_89\n")).toBe(true);
    expect(ptxModule(90, [f16]).startsWith(".version 8.1\n.target sm_90\n")).toBe(true);
    expect(ptxHeader(86, "7.0")).toBe(ptxHeader(86)); // never lowered
    expect(() => ptxModule(86, [fp8])).toThrow(
      "kernel matmul_mma_tiled_e4m3_f8_e4m3fn needs sm_89 or newer; this device is sm_86",
    );
  });
  test("float immediates are the exact IEEE bits", () => {
    expect(f32Imm(1)).toBe("0f3F800000");
    expect(f32Imm(-0.5)).toBe("0fBF000000");
    expect(f32Imm(Number.NEGATIVE_INFINITY)).toBe("0fFF800000");
    expect(f64Imm(1)).toBe("0d3FF0000000000000");
    expect(f32Imm(0.1)).toBe("0f3DCCCCCD"); // 0.1 rounded to f32
  });
  test("a kernel needing a newer sm than the module's is E_UNSUPPORTED naming it", () => {
    const k = { ...mmaKernel({ format: "f16", bias: false, scaled: false }), minSm: 89 };
    expect(() => ptxModule(86, [k])).toThrow(
      "kernel matmul_mma_f16 needs sm_89 or newer; this device is sm_86",
    );
  });
  test("parameters in declaration order, with types; a name twice is refused", () => {
    const k = mapKernel({ op: "scale", inputs: ["f16"], out: "bf16", rank: 2 });
    expect(k.params.map((p) => `${p.name}:${p.type}`)).toEqual([
      "out:u64",
      "in0:u64",
      "n:u32",
      "size0:u32",
      "size1:u32",
      "stride1_0:u32",
      "stride1_1:u32",
      "s:f32",
    ]);
    expect(k.body).toContain("cvt.rn.bf16.f32");
    expect(k.body).toContain("cvt.f32.f16");
    const kb = new KernelBuilder("twice");
    kb.param("x", "u64");
    expect(() => kb.param("x", "u32")).toThrow("parameter x twice");
  });
  test("an emitting helper inside op's arguments is refused (its lines would precede the op's)", () => {
    const kb = new KernelBuilder("misordered");
    const [base, i] = [kb.reg("b64"), kb.reg("b32")];
    const v = kb.reg("f32");
    // the mad.wide of kb.addr would come out ahead of the div that computes i
    expect(() => kb.op(`div.u32 ${i}, ${i}, 3;`, `ld.global.f32 ${v}, [${kb.addr(base, i, 4)}];`)).toThrow(
      "instructions were emitted while evaluating the arguments of op('div.u32 %r0, %r0, 3;', …)",
    );
    const ok = new KernelBuilder("ordered");
    const [b2, i2] = [ok.reg("b64"), ok.reg("b32")];
    const v2 = ok.reg("f32");
    ok.op(`div.u32 ${i2}, ${i2}, 3;`);
    const at = ok.addr(b2, i2, 4);
    ok.op(`ld.global.f32 ${v2}, [${at}];`);
    const body = ok.build([32, 1]).body;
    expect(body.indexOf("div.u32")).toBeLessThan(body.indexOf("mad.wide.u32"));
    expect(body.indexOf("mad.wide.u32")).toBeLessThan(body.indexOf("ld.global.f32"));
  });
  test("every catalogued kernel has a unique entry name", () => {
    const all = Object.values(kernelCatalogue()).flat();
    expect(new Set(all.map((k) => k.name)).size).toBe(all.length);
    expect(all.length).toBeGreaterThan(150);
  });
  test("mergeDims: contiguous runs merge, size-1 dimensions drop, broadcast stays apart", () => {
    expect(
      mergeDims(
        [2, 3, 4],
        [
          [12, 4, 1],
          [12, 4, 1],
        ],
      ),
    ).toEqual({ shape: [24], strides: [[1], [1]] });
    expect(
      mergeDims(
        [2, 1, 4],
        [
          [4, 4, 1],
          [0, 0, 1],
        ],
      ),
    ).toEqual({
      shape: [2, 4],
      strides: [
        [4, 1],
        [0, 1],
      ],
    });
    expect(mergeDims([1, 1], [[1, 1]])).toEqual({ shape: [1], strides: [[0]] });
  });
});
