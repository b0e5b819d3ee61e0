// symbols.ts against native/include/tp.h, parsed here: every TP_API prototype is in the table, in the
// header's order, with the argument and return types its C declaration maps to, and every number of
// the header's enums and flags equals the one TypeScript passes. The header is read as text, so the
// test needs no compiler and no built library.
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import {
  ACT_BLOCKS,
  CAST_DTYPES,
  CAST_SATURATE,
  CLEANUP,
  CPU_FEATURES,
  CPU_ISA,
  NATIVE_WEIGHT_FORMATS,
  NORM_UNIT_OFFSET,
  ROPE_MODES,
  TP_ABI_VERSION,
  TP_STATUS,
  TP_SYMBOLS,
} from "./symbols.ts";

const header = readFileSync(resolve(import.meta.dir, "../../../native/include/tp.h"), "utf8");
/** The header without comments, so that a prototype quoted in a comment is not counted. */
const code = header.replace(/\/\*[\s\S]*?\*\//g, " ").replace(/\/\/[^\n]*/g, " ");

/** The bun:ffi type of a C type as symbols.ts writes it; pointers and arrays are ptr. */
function ffiType(c: string, isReturn: boolean): string {
  const t = c.replace(/\bconst\b/g, "").trim();
  if (t.includes("*")) return isReturn && /^char\s*\*$/.test(t) ? "cstring" : "ptr";
  const scalar: Record<string, string> = {
    void: "void",
    int32_t: "i32",
    uint32_t: "u32",
    int64_t: "i64",
    uint64_t: "u64",
    float: "f32",
    double: "f64",
    tp_status: "i32",
  };
  const mapped = scalar[t];
  if (mapped === undefined) throw new Error(`tp.h: no bun:ffi type for C type "${c}"`);
  return mapped;
}

/** One parameter "const int64_t *src_strides" / "const uint64_t lens[4]" → its bun:ffi type. */
function paramType(p: string): string {
  const array = /\[\s*\w*\s*\]$/.test(p);
  const m = /^(.*?)\s*\b(\w+)\s*(\[\s*\w*\s*\])?$/.exec(p.trim());
  if (m === null) throw new Error(`tp.h: cannot read parameter "${p}"`);
  return array ? "ptr" : ffiType(m[1] as string, false);
}

interface Prototype {
  name: string;
  args: string[];
  returns: string;
}

function prototypes(): Prototype[] {
  const out: Prototype[] = [];
  for (const m of code.matchAll(/\bTP_API\s+([\w\s*]+?)\s*\b(tp_\w+)\s*\(([^)]*)\)\s*;/g)) {
    const params = (m[3] as string).trim();
    out.push({
      name: m[2] as string,
      returns: ffiType(m[1] as string, true),
      args: params === "void" || params === "" ? [] : params.split(",").map(paramType),
    });
  }
  return out;
}

/** The value of `#define NAME value` or of an enum member `NAME = value`; (1u << n) is evaluated. */
function constant(name: string): number {
  const m =
    new RegExp(`#define\\s+${name}\\s+(\\(?[0-9u <]+\\)?)\\s*$`, "m").exec(code) ??
    new RegExp(`\\b${name}\\s*=\\s*(\\d+)`).exec(code);
  if (m === null) throw new Error(`tp.h defines no ${name}`);
  const text = (m[1] as string).replace(/[()u\s]/g, "");
  const shift = /^(\d+)<<(\d+)$/.exec(text);
  return shift ? Number(shift[1]) << Number(shift[2]) : Number(text);
}

describe("the symbol table matches native/include/tp.h", () => {
  const declared = prototypes();

  test("the parser reads every TP_API prototype of the header", () => {
    const apiLines = code.match(/\bTP_API\s+[\w\s*]+?\btp_\w+\s*\(/g) ?? [];
    expect(declared.length).toBe(apiLines.length);
    expect(declared.length).toBeGreaterThan(40);
    // hand-checked rows, so that a parser bug cannot make both sides agree by accident
    expect(declared.find((p) => p.name === "tp_ctx_error")).toEqual({
      name: "tp_ctx_error",
      args: ["ptr"],
      returns: "cstring",
    });
    expect(declared.find((p) => p.name === "tp_cpu_cast")?.args).toEqual([
      "ptr",
      "ptr",
      "i32",
      "ptr",
      "i32",
      "u64",
      "u32",
    ]);
    expect(declared.find((p) => p.name === "tp_cpu_attention_strided_f32")?.args.slice(4, 8)).toEqual([
      "ptr",
      "ptr",
      "ptr",
      "u64",
    ]);
  });

  test("the same functions, in the header's order", () => {
    expect(Object.keys(TP_SYMBOLS)).toEqual(declared.map((p) => p.name));
  });

  test("every function has the argument count and types of its prototype", () => {
    const table = TP_SYMBOLS as Record<string, { args: readonly string[]; returns: string }>;
    for (const p of declared) {
      const row = table[p.name];
      expect({ name: p.name, argc: row?.args.length }).toEqual({ name: p.name, argc: p.args.length });
      expect({ name: p.name, args: row?.args, returns: row?.returns }).toEqual(p);
    }
  });
});

describe("the numbers match native/include/tp.h", () => {
  const upper = (s: string) => s.toUpperCase();

  test("ABI version, status codes, flags and modes", () => {
    expect(constant("TP_ABI_VERSION")).toBe(TP_ABI_VERSION);
    expect(constant("TP_OK")).toBe(TP_STATUS.OK);
    for (const [name, value] of Object.entries(TP_STATUS)) {
      if (name !== "OK") expect([name, constant(`TP_${name}`)]).toEqual([name, value]);
    }
    expect(constant("TP_CAST_SATURATE")).toBe(CAST_SATURATE);
    expect(constant("TP_NORM_UNIT_OFFSET")).toBe(NORM_UNIT_OFFSET);
    expect({ neox: constant("TP_ROPE_NEOX"), interleaved: constant("TP_ROPE_INTERLEAVED") }).toEqual(
      ROPE_MODES,
    );
  });

  test("enums: tp_dtype, tp_isa, tp_wformat, activation blocks, CPU feature bits", () => {
    const cases: [string, Record<string, number>, (name: string) => string][] = [
      ["tp_dtype", CAST_DTYPES, (n) => `TP_${upper(n)}`],
      ["tp_isa", CPU_ISA, (n) => `TP_ISA_${upper(n)}`],
      ["tp_wformat", NATIVE_WEIGHT_FORMATS, (n) => `TP_W_${upper(n)}`],
      [
        "TP_ACT_BLOCK_*",
        Object.fromEntries(Object.entries(ACT_BLOCKS).map(([n, b]) => [n, b.code])),
        (n) => `TP_ACT_BLOCK_${upper(n)}`,
      ],
      ["TP_CPU_*", CPU_FEATURES, (n) => `TP_CPU_${upper(n)}`],
      ["TP_CLEANUP_*", CLEANUP, (n) => `TP_CLEANUP_${upper(n)}`],
    ];
    for (const [what, table, cName] of cases) {
      for (const [name, value] of Object.entries(table)) {
        expect([what, name, value]).toEqual([what, name, constant(cName(name))]);
      }
    }
    // and the header holds no member TypeScript lacks
    const members = (prefix: string) => [...code.matchAll(new RegExp(`\\b(${prefix}\\w+)\\s*=`, "g"))].length;
    expect(members("TP_B?F")).toBe(Object.keys(CAST_DTYPES).length);
    expect(members("TP_W_")).toBe(Object.keys(NATIVE_WEIGHT_FORMATS).length);
    expect(members("TP_ISA_")).toBe(Object.keys(CPU_ISA).length);
    expect([...code.matchAll(/#define\s+TP_CPU_\w+/g)].length).toBe(Object.keys(CPU_FEATURES).length);
    expect([...code.matchAll(/#define\s+TP_ACT_BLOCK_\w+/g)].length).toBe(Object.keys(ACT_BLOCKS).length);
  });

  test("the parser reads values it was not written for as errors, not as zeros", () => {
    expect(() => constant("TP_NO_SUCH_NAME")).toThrow("tp.h defines no TP_NO_SUCH_NAME");
    expect(constant("TP_CPU_AVX512VBMI")).toBe(512);
    expect(constant("TP_W_Q6_K")).toBe(16);
  });
});
