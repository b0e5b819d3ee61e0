/**
 * Compile one parsed PTX entry to a JavaScript generator function: one call per thread, registers as
 * local variables (32-bit integers as uint32 numbers, f32 as rounded doubles, 64-bit values as
 * numbers — addresses stay far below 2^53 — or bigints for raw 64-bit data, predicates as booleans),
 * basic blocks as the cases of a `switch` inside a loop (branches set the case), and every warp- or
 * block-wide instruction (bar.sync, shfl.sync, vote.sync, mma.sync, ldmatrix) a `yield` that the
 * machine (./machine.ts) resolves once all the threads it involves have arrived.
 *
 * Numbers follow the PTX ISA: f32 add / sub / mul / div / sqrt rounded to nearest even (computed in
 * f64 and rounded once, which is exact for these), fma as a·b + c in f64 then rounded (the product is
 * exact; the sum may round twice in rare ties), the `.approx` functions as exact ones (the hardware
 * is within a few ulp), conversions bit-exact (./numeric.ts).
 *
 * Source: NVIDIA "Parallel Thread Execution ISA" 8.x, §9.7 (instruction semantics), §9.7.14 (mma
 * fragments, resolved in ./machine.ts).
 */
import { TpError } from "@tp/tensor";
import type { PtxEntry, PtxInstr } from "./parse.ts";

/** The device address of the simulator's first byte of global memory (2^36: above 32 bits, so a kernel that truncates an address to 32 bits faults). */
export const BASE_ADDRESS = 2 ** 36;

/** A warp- or block-wide instruction site: what the machine needs to resolve it. */
export interface CollectiveSite {
  readonly kind: "bar" | "shfl" | "vote" | "mma" | "ldmatrix";
  readonly line: number;
  readonly text: string;
  /** Opcode parts (mode, shape, types). */
  readonly opcode: readonly string[];
}

/** How an instruction touches shared memory, for the race check (atomics never race). */
type SharedAccess = "read" | "write" | "atomic";

/** A memory instruction site (for error messages). */
export interface MemorySite {
  readonly line: number;
  readonly text: string;
}

/** A compiled entry. */
export interface CompiledKernel {
  readonly name: string;
  readonly params: PtxEntry["params"];
  readonly maxntid: PtxEntry["maxntid"];
  /** Static shared bytes and the offset where dynamic (`.extern`) shared memory starts. */
  readonly staticShared: number;
  readonly sites: readonly CollectiveSite[];
  readonly memSites: readonly MemorySite[];
  /** The generated source (for debugging the simulator). */
  readonly source: string;
  /** Make the per-thread generator over the machine's helpers (memory views, checks). */
  readonly factory: (M: unknown) => (T: unknown) => Generator<number, void, unknown>;
}

type Storage = "i32" | "f32" | "i64" | "f64" | "i16" | "pred";

function storageOf(type: string): Storage {
  if (type === "pred") return "pred";
  if (type === "f32") return "f32";
  if (type === "f64") return "f64";
  if (/^[bsu]64$/.test(type)) return "i64";
  if (/^[bsu]32$/.test(type)) return "i32";
  if (/^([bsu]16|f16|bf16|[bsu]8)$/.test(type)) return "i16";
  throw new TpError("E_UNSUPPORTED", `PTX simulator: register type .${type} is not simulated`);
}

/** Value classes an instruction reads or writes. */
type Cls = "u32" | "s32" | "f32" | "f64" | "u64" | "s64" | "b64" | "u16" | "s16" | "u8" | "s8" | "pred";

function clsOf(type: string): Cls {
  switch (type) {
    case "u32":
    case "b32":
      return "u32";
    case "s32":
      return "s32";
    case "f32":
      return "f32";
    case "f64":
      return "f64";
    case "u64":
      return "u64";
    case "s64":
      return "s64";
    case "b64":
      return "b64";
    case "u16":
    case "b16":
    case "f16":
    case "bf16":
      return "u16";
    case "s16":
      return "s16";
    case "u8":
    case "b8":
      return "u8";
    case "s8":
      return "s8";
    case "pred":
      return "pred";
    default:
      throw new TpError("E_UNSUPPORTED", `PTX simulator: type .${type} is not simulated`);
  }
}

const BYTES: Record<string, number> = {
  u8: 1,
  s8: 1,
  b8: 1,
  u16: 2,
  s16: 2,
  b16: 2,
  f16: 2,
  bf16: 2,
  u32: 4,
  s32: 4,
  b32: 4,
  f32: 4,
  u64: 8,
  s64: 8,
  b64: 8,
  f64: 8,
};

const TYPES = new Set(Object.keys(BYTES).concat(["pred", "f16x2", "bf16x2", "e4m3x2", "e5m2x2"]));

/** Modifiers the simulator ignores: caching / ordering hints with no effect on one thread's values. */
const HINTS = new Set([
  "global",
  "shared",
  "param",
  "nc",
  "ca",
  "cg",
  "cs",
  "lu",
  "cv",
  "wb",
  "wt",
  "volatile",
  "relaxed",
  "acquire",
  "release",
  "gpu",
  "cta",
  "sys",
  "aligned",
  "sync",
  "uni",
  "L1::no_allocate",
  "L2::128B",
  "L2::256B",
]);

class KernelCompiler {
  readonly storage = new Map<string, Storage>();
  readonly sharedOffset = new Map<string, number>();
  readonly sites: CollectiveSite[] = [];
  readonly memSites: MemorySite[] = [];
  readonly labels = new Map<string, number>();
  readonly params = new Set<string>();
  staticShared = 0;
  tmp = 0;
  instr!: PtxInstr;

  constructor(readonly entry: PtxEntry) {
    for (const p of entry.params) this.params.add(p.name);
  }

  fail(why: string): never {
    throw new TpError(
      "E_UNSUPPORTED",
      `PTX simulator: kernel ${this.entry.name}, line ${this.instr.line}: ${why}: ${this.instr.text}`,
    );
  }

  v(reg: string): string {
    return `R${reg.slice(1).replace(/\W/g, "_")}`;
  }

  regStorage(reg: string): Storage {
    const s = this.storage.get(reg);
    if (s === undefined) this.fail(`register ${reg} is not declared`);
    return s;
  }

  /** A JS expression reading operand `op` as class `c`. */
  read(op: string, c: Cls): string {
    op = op.trim();
    if (op.startsWith("%")) {
      const special = /^%(tid|ntid|ctaid|nctaid)\.([xyz])$/.exec(op);
      if (special !== null) return `T.${special[1]}${special[2]}`;
      if (op === "%laneid") return "T.lane";
      if (op === "%warpid") return "T.warp";
      const s = this.regStorage(op);
      const x = this.v(op);
      return convertRead(x, s, c, () => this.fail(`reading a .${s} register as .${c}`));
    }
    if (op.startsWith("!%")) {
      if (c !== "pred") this.fail("a negated operand that is not a predicate");
      return `!${this.read(op.slice(1), "pred")}`;
    }
    if (/^0[fF][0-9a-fA-F]{8}$/.test(op)) {
      const bits = Number.parseInt(op.slice(2), 16);
      if (c === "f32") return `M.bitsFloat(${bits})`;
      if (c === "u32" || c === "s32") return String(bits >>> 0);
      this.fail(`an f32 literal read as .${c}`);
    }
    if (/^0[dD][0-9a-fA-F]{16}$/.test(op)) {
      if (c === "f64") return `M.bitsDouble(0x${op.slice(2)}n)`;
      if (c === "b64" || c === "u64") return `0x${op.slice(2)}n`;
      this.fail(`an f64 literal read as .${c}`);
    }
    if (/^-?(0[xX][0-9a-fA-F]+|\d+)U?$/.test(op)) {
      const n = Number(op.replace(/U$/, "").replace(/^-/, "")) * (op.startsWith("-") ? -1 : 1);
      switch (c) {
        case "u32":
          return String(n >>> 0);
        case "s32":
          return String(n | 0);
        case "f32":
        case "f64":
          return String(n);
        case "u16":
          return String(n & 0xffff);
        case "s16":
          return String((n << 16) >> 16);
        case "u8":
          return String(n & 0xff);
        case "s8":
          return String((n << 24) >> 24);
        case "pred":
          return n !== 0 ? "true" : "false";
        default:
          return String(n);
      }
    }
    if (/^-?\d*\.\d+(e[-+]?\d+)?$/i.test(op) && (c === "f32" || c === "f64"))
      return c === "f32" ? `Math.fround(${op})` : op;
    const off = this.sharedOffset.get(op);
    if (off !== undefined) {
      if (c === "u32" || c === "u64" || c === "s32" || c === "b64" || c === "s64") return String(off);
      this.fail(`the shared address ${op} read as .${c}`);
    }
    this.fail(`operand ${op} is not simulated`);
  }

  /** A statement writing expression `e` (of class `c`) to register operand `op`. */
  write(op: string, c: Cls, e: string): string {
    op = op.trim();
    if (op === "_") return `${e};`;
    if (!op.startsWith("%")) this.fail(`destination ${op} is not a register`);
    const s = this.regStorage(op);
    const x = this.v(op);
    switch (s) {
      case "i32":
        if (c === "f32") return `${x} = M.floatBits(${e});`;
        if (c === "u64" || c === "s64" || c === "b64") return `${x} = M.lo32(${e});`;
        if (c === "f64") this.fail("an f64 value written to a 32-bit register");
        return `${x} = (${e}) >>> 0;`;
      case "f32":
        if (c === "f32") return `${x} = ${e};`;
        if (c === "u32" || c === "s32") return `${x} = M.bitsFloat(${e});`;
        this.fail(`a .${c} value written to an f32 register`);
        break;
      case "i64":
        if (c === "f64") return `${x} = M.doubleBits(${e});`;
        if (c === "u32" || c === "u16" || c === "u8") return `${x} = (${e}) >>> 0;`;
        if (c === "s32" || c === "s16" || c === "s8") return `${x} = (${e}) | 0;`;
        return `${x} = ${e};`;
      case "f64":
        if (c === "f64") return `${x} = ${e};`;
        if (c === "b64" || c === "u64" || c === "s64") return `${x} = M.bitsDouble(${e});`;
        this.fail(`a .${c} value written to an f64 register`);
        break;
      case "i16":
        if (c === "f32" || c === "f64" || c === "pred")
          this.fail(`a .${c} value written to a 16-bit register`);
        return `${x} = (${e}) & 0xffff;`;
      case "pred":
        if (c !== "pred") this.fail(`a .${c} value written to a predicate`);
        return `${x} = ${e};`;
    }
    this.fail("unreachable");
  }

  /** Operands of a `{a, b, …}` vector. */
  vector(op: string): string[] {
    const t = op.trim();
    if (!t.startsWith("{") || !t.endsWith("}")) this.fail(`expected a vector operand, got ${op}`);
    return t
      .slice(1, -1)
      .split(",")
      .map((s) => s.trim());
  }

  /** `[reg+off]` / `[name]` → { base expression (u64 or u32), offset }. */
  address(
    op: string,
    space: "global" | "shared" | "param",
  ): { base: string; offset: number; param?: string } {
    const m = /^\[\s*([^\]+\-\s]+)\s*(?:([+-])\s*(-?\d+|0x[0-9a-fA-F]+))?\s*\]$/.exec(op.trim());
    if (m === null) this.fail(`address ${op} is not simulated`);
    const what = m[1] as string;
    const offset = m[3] === undefined ? 0 : Number(m[3]) * (m[2] === "-" ? -1 : 1);
    if (space === "param") {
      if (!this.params.has(what)) this.fail(`parameter ${what} is not declared`);
      return { base: "", offset, param: what };
    }
    if (what.startsWith("%")) return { base: this.read(what, space === "shared" ? "u32" : "u64"), offset };
    const sh = this.sharedOffset.get(what);
    if (sh !== undefined && space === "shared") return { base: String(sh), offset };
    if (/^\d+$/.test(what)) return { base: what, offset };
    this.fail(`address ${op} is not simulated`);
  }

  memSite(): number {
    this.memSites.push({ line: this.instr.line, text: this.instr.text });
    return this.memSites.length - 1;
  }

  site(kind: CollectiveSite["kind"]): number {
    this.sites.push({ kind, line: this.instr.line, text: this.instr.text, opcode: this.instr.opcode });
    return this.sites.length - 1;
  }

  /** Load expression of a `type` value at global address index `a` (already checked). */
  loadGlobal(type: string, idx: string, arr = "M"): string {
    return this.loadFrom(type, idx).replace(/^M\./, `${arr}.`).replace("(M.u32,", `(${arr}.u32,`);
  }

  loadFrom(type: string, idx: string): string {
    switch (type) {
      case "u8":
      case "b8":
        return `M.u8[${idx}]`;
      case "s8":
        return `M.i8[${idx}]`;
      case "u16":
      case "b16":
      case "f16":
      case "bf16":
        return `M.u16[(${idx}) >>> 1]`;
      case "s16":
        return `M.i16[(${idx}) >>> 1]`;
      case "u32":
      case "b32":
        return `M.u32[(${idx}) >>> 2]`;
      case "s32":
        return `M.i32[(${idx}) >>> 2]`;
      case "f32":
        return `M.f32[(${idx}) >>> 2]`;
      case "f64":
        return `M.f64[(${idx}) >>> 3]`;
      case "u64":
      case "s64":
      case "b64":
        return `M.ld64(M.u32, ${idx})`;
    }
    this.fail(`a .${type} load is not simulated`);
  }

  storeGlobal(type: string, idx: string, value: string, arr = "M"): string {
    switch (type) {
      case "u8":
      case "b8":
      case "s8":
        return `${arr}.u8[${idx}] = ${value};`;
      case "u16":
      case "b16":
      case "s16":
      case "f16":
      case "bf16":
        return `${arr}.u16[(${idx}) >>> 1] = ${value};`;
      case "u32":
      case "b32":
      case "s32":
        return `${arr}.u32[(${idx}) >>> 2] = ${value};`;
      case "f32":
        return `${arr}.f32[(${idx}) >>> 2] = ${value};`;
      case "f64":
        return `${arr}.f64[(${idx}) >>> 3] = ${value};`;
      case "u64":
      case "s64":
      case "b64":
        return `M.st64(${arr}.u32, ${idx}, ${value});`;
    }
    this.fail(`a .${type} store is not simulated`);
  }

  /** The class a loaded / stored `type` is read or written as. */
  memCls(type: string): Cls {
    if (type === "f16" || type === "bf16" || type === "b16") return "u16";
    if (type === "b8") return "u8";
    return clsOf(type);
  }

  /** A checked global / shared address index: statements, and the index expression. */
  checked(
    space: "global" | "shared",
    op: string,
    bytes: number,
    access: SharedAccess = "read",
  ): { pre: string; idx: string } {
    const a = this.address(op, space);
    const t = `a${this.tmp++}`;
    const site = this.memSite();
    if (space === "global") {
      const b = `b${t}`;
      return {
        pre: `const ${b} = ${a.base} + ${a.offset}; const ${t} = ${b} >= M.lo[${site}] && ${b} + ${bytes} <= M.hi[${site}] && (${b} & ${bytes - 1}) === 0 ? ${b} - ${BASE_ADDRESS} : M.index(${b}, ${bytes}, ${site});`,
        idx: t,
      };
    }
    const mode = access === "read" ? 0 : access === "write" ? 1 : 2;
    return {
      pre: `const ${t} = T.sharedIndex(${a.base} + ${a.offset}, ${bytes}, ${site}, ${mode});`,
      idx: t,
    };
  }

  compileInstr(ins: PtxInstr): string {
    this.instr = ins;
    const parts = ins.opcode;
    const op = parts[0] as string;
    const ops = ins.operands;
    const types = parts.filter((p) => TYPES.has(p));
    const mods = parts.slice(1).filter((p) => !TYPES.has(p));
    const type = types[types.length - 1] ?? "";
    const o = (i: number): string => {
      const s = ops[i];
      if (s === undefined) this.fail(`operand ${i + 1} is missing`);
      return s;
    };
    const known = (allowed: readonly string[]): void => {
      for (const m of mods)
        if (!allowed.includes(m) && !HINTS.has(m)) this.fail(`modifier .${m} is not simulated`);
    };
    switch (op) {
      case "mov": {
        known([]);
        const c = clsOf(type);
        const d = o(0);
        const s = o(1);
        if (d.startsWith("{")) {
          // unpack: mov.b32 {lo, hi}, %r  /  mov.b64 {lo, hi}, %rd
          const parts2 = this.vector(d);
          const t = `t${this.tmp++}`;
          if (type === "b32") {
            return `{ const ${t} = ${this.read(s, "u32")}; ${this.write(parts2[0] as string, "u16", `${t} & 0xffff`)} ${this.write(parts2[1] as string, "u16", `${t} >>> 16`)} }`;
          }
          if (type === "b64") {
            return `{ const ${t} = M.toBig(${this.read(s, "b64")}); ${this.write(parts2[0] as string, "u32", `Number(${t} & 0xffffffffn)`)} ${this.write(parts2[1] as string, "u32", `Number(${t} >> 32n)`)} }`;
          }
          this.fail("an unpacking mov of this type");
        }
        if (s.startsWith("{")) {
          const parts2 = this.vector(s);
          if (type === "b32")
            return this.write(
              d,
              "u32",
              `(${this.read(parts2[0] as string, "u16")} | (${this.read(parts2[1] as string, "u16")} << 16)) >>> 0`,
            );
          if (type === "b64")
            return this.write(
              d,
              "b64",
              `M.pack64(${this.read(parts2[0] as string, "u32")}, ${this.read(parts2[1] as string, "u32")})`,
            );
          this.fail("a packing mov of this type");
        }
        return this.write(d, c, this.read(s, c));
      }
      case "ld": {
        const space = parts.includes("param")
          ? "param"
          : parts.includes("shared")
            ? "shared"
            : parts.includes("global")
              ? "global"
              : null;
        if (space === null) this.fail("generic-address loads are not simulated (use ld.global / ld.shared)");
        const vec = parts.find((p) => /^v[248]$/.test(p));
        const n = vec === undefined ? 1 : Number(vec.slice(1));
        known(["v2", "v4", "v8"]);
        const size = BYTES[type];
        if (size === undefined) this.fail(`a .${type} load`);
        if (space === "param") {
          const a = this.address(o(1), "param");
          if (a.offset !== 0 || n !== 1) this.fail("a parameter load with an offset or vector");
          return this.write(o(0), this.memCls(type), `T.params[${JSON.stringify(a.param)}]`);
        }
        const { pre, idx } = this.checked(space, o(1), size * n);
        const dsts = n === 1 ? [o(0)] : this.vector(o(0));
        const arr = space === "global" ? "M" : "T.S";
        const body = dsts
          .map((d, k) => {
            const at = k === 0 ? idx : `${idx} + ${k * size}`;
            const load = this.loadGlobal(type, at, arr);
            return this.write(d, this.memCls(type), load);
          })
          .join(" ");
        return `{ ${pre} ${body} }`;
      }
      case "st": {
        const space = parts.includes("shared") ? "shared" : parts.includes("global") ? "global" : null;
        if (space === null) this.fail("generic-address stores are not simulated (use st.global / st.shared)");
        const vec = parts.find((p) => /^v[248]$/.test(p));
        const n = vec === undefined ? 1 : Number(vec.slice(1));
        known(["v2", "v4", "v8"]);
        const size = BYTES[type];
        if (size === undefined) this.fail(`a .${type} store`);
        const { pre, idx } = this.checked(space, o(0), size * n, "write");
        const srcs = n === 1 ? [o(1)] : this.vector(o(1));
        const arr = space === "global" ? "M" : "T.S";
        const c = this.memCls(type);
        const body = srcs
          .map((s, k) => this.storeGlobal(type, k === 0 ? idx : `${idx} + ${k * size}`, this.read(s, c), arr))
          .join(" ");
        return `{ ${pre} ${body} }`;
      }
      case "cvta": {
        known(["to"]);
        return this.write(o(0), "u64", this.read(o(1), "u64"));
      }
      case "add":
      case "sub": {
        known(["rn", "ftz", "sat", "cc"]);
        if (mods.includes("cc")) this.fail("carry chains are not simulated");
        const c = clsOf(type);
        const a = this.read(o(1), c);
        const b = this.read(o(2), c);
        const sign = op === "add" ? "+" : "-";
        if (c === "f32")
          return this.write(o(0), c, this.fsat(`Math.fround(${this.ftz(a)} ${sign} ${this.ftz(b)})`));
        if (c === "f64") return this.write(o(0), c, `${a} ${sign} ${b}`);
        if (c === "u64" || c === "s64" || c === "b64") return this.write(o(0), c, `(${a} ${sign} ${b})`);
        if (mods.includes("sat")) return this.write(o(0), c, `M.sat32(${a} ${sign} ${b})`);
        return this.write(o(0), c, `(${a} ${sign} ${b})`);
      }
      case "mul": {
        known(["lo", "hi", "wide", "rn", "ftz", "sat"]);
        const c = clsOf(type);
        if (c === "f32")
          return this.write(
            o(0),
            c,
            this.fsat(`Math.fround(${this.ftz(this.read(o(1), c))} * ${this.ftz(this.read(o(2), c))})`),
          );
        if (c === "f64") return this.write(o(0), c, `${this.read(o(1), c)} * ${this.read(o(2), c)}`);
        if (mods.includes("wide")) {
          const wc = c === "s32" ? "s64" : "u64";
          return this.write(o(0), wc, `M.wide(${this.read(o(1), c)} * ${this.read(o(2), c)})`);
        }
        if (mods.includes("hi")) {
          if (c === "u32")
            return this.write(o(0), c, `M.mulhiU(${this.read(o(1), c)}, ${this.read(o(2), c)})`);
          if (c === "s32")
            return this.write(o(0), c, `M.mulhiS(${this.read(o(1), c)}, ${this.read(o(2), c)})`);
          this.fail("mul.hi of this type");
        }
        if (c === "u32" || c === "s32")
          return this.write(o(0), c, `Math.imul(${this.read(o(1), c)}, ${this.read(o(2), c)})`);
        if (c === "u64" || c === "s64")
          return this.write(o(0), c, `M.wide(${this.read(o(1), c)} * ${this.read(o(2), c)})`);
        this.fail("mul of this type");
        break;
      }
      case "mad": {
        known(["lo", "wide", "rn", "ftz", "sat"]);
        const c = clsOf(type);
        const [a, b, d] = [this.read(o(1), c), this.read(o(2), c), this.read(o(3), c)];
        if (c === "f32") return this.write(o(0), c, this.fsat(`Math.fround(${a} * ${b} + ${d})`));
        if (mods.includes("wide")) {
          const wc = c === "s32" ? "s64" : "u64";
          return this.write(o(0), wc, `M.wide(${a} * ${b} + ${this.read(o(3), wc)})`);
        }
        if (c === "u32" || c === "s32") return this.write(o(0), c, `(Math.imul(${a}, ${b}) + ${d})`);
        if (c === "u64" || c === "s64") return this.write(o(0), c, `M.wide(${a} * ${b} + ${d})`);
        this.fail("mad of this type");
        break;
      }
      case "fma": {
        known(["rn", "ftz", "sat"]);
        const c = clsOf(type);
        const [a, b, d] = [this.read(o(1), c), this.read(o(2), c), this.read(o(3), c)];
        if (c === "f32")
          return this.write(
            o(0),
            c,
            this.fsat(`Math.fround(${this.ftz(a)} * ${this.ftz(b)} + ${this.ftz(d)})`),
          );
        if (c === "f64") return this.write(o(0), c, `M.fma64(${a}, ${b}, ${d})`);
        this.fail("fma of this type");
        break;
      }
      case "div": {
        known(["rn", "approx", "full", "ftz"]);
        const c = clsOf(type);
        const [a, b] = [this.read(o(1), c), this.read(o(2), c)];
        if (c === "f32") return this.write(o(0), c, `Math.fround(${this.ftz(a)} / ${this.ftz(b)})`);
        if (c === "f64") return this.write(o(0), c, `${a} / ${b}`);
        if (c === "u32") return this.write(o(0), c, `M.divU(${a}, ${b})`);
        if (c === "s32") return this.write(o(0), c, `M.divS(${a}, ${b})`);
        if (c === "u64") return this.write(o(0), c, `M.divU64(${a}, ${b})`);
        this.fail("div of this type");
        break;
      }
      case "rem": {
        known([]);
        const c = clsOf(type);
        const [a, b] = [this.read(o(1), c), this.read(o(2), c)];
        if (c === "u32") return this.write(o(0), c, `M.remU(${a}, ${b})`);
        if (c === "s32") return this.write(o(0), c, `M.remS(${a}, ${b})`);
        if (c === "u64") return this.write(o(0), c, `M.remU64(${a}, ${b})`);
        this.fail("rem of this type");
        break;
      }
      case "min":
      case "max": {
        known(["NaN", "ftz"]);
        const c = clsOf(type);
        const [a, b] = [this.read(o(1), c), this.read(o(2), c)];
        if (c === "f32" || c === "f64") {
          const f = op === "min" ? "fmin" : "fmax";
          if (mods.includes("NaN"))
            return this.write(
              o(0),
              c,
              `(Number.isNaN(${a}) || Number.isNaN(${b}) ? NaN : M.${f}(${a}, ${b}))`,
            );
          return this.write(o(0), c, `M.${f}(${this.ftz(a)}, ${this.ftz(b)})`);
        }
        return this.write(o(0), c, `Math.${op}(${a}, ${b})`);
      }
      case "abs":
      case "neg": {
        known(["ftz"]);
        const c = clsOf(type);
        const a = this.read(o(1), c);
        if (c === "f32" || c === "f64")
          return this.write(o(0), c, op === "abs" ? `Math.abs(${this.ftz(a)})` : `-(${this.ftz(a)})`);
        if (c === "s32") return this.write(o(0), c, op === "abs" ? `Math.abs(${a}) | 0` : `-(${a}) | 0`);
        if (c === "s64" || c === "u64")
          return this.write(o(0), c, op === "abs" ? `Math.abs(${a})` : `-(${a})`);
        this.fail(`${op} of this type`);
        break;
      }
      case "copysign": {
        known([]);
        const c = clsOf(type);
        // copysign d, a, b: b's magnitude with a's sign.
        return this.write(o(0), c, `M.copysign(${this.read(o(2), c)}, ${this.read(o(1), c)})`);
      }
      case "rcp":
      case "sqrt":
      case "rsqrt":
      case "ex2":
      case "lg2":
      case "sin":
      case "cos":
      case "tanh": {
        known(["rn", "approx", "ftz", "full"]);
        const c = clsOf(type);
        const a = this.ftz(this.read(o(1), c));
        const f: Record<string, string> = {
          rcp: `1 / ${a}`,
          sqrt: `Math.sqrt(${a})`,
          rsqrt: `1 / Math.sqrt(${a})`,
          ex2: `Math.pow(2, ${a})`,
          lg2: `Math.log2(${a})`,
          sin: `Math.sin(${a})`,
          cos: `Math.cos(${a})`,
          tanh: `Math.tanh(${a})`,
        };
        const e = f[op] as string;
        return this.write(o(0), c, c === "f32" ? this.ftz(`Math.fround(${e})`) : e);
      }
      case "and":
      case "or":
      case "xor": {
        known([]);
        const sym = op === "and" ? "&" : op === "or" ? "|" : "^";
        if (type === "pred") {
          const js = op === "and" ? "&&" : op === "or" ? "||" : "!==";
          return this.write(o(0), "pred", `(${this.read(o(1), "pred")} ${js} ${this.read(o(2), "pred")})`);
        }
        if (type === "b64")
          return this.write(
            o(0),
            "b64",
            `M.bit64("${sym}", ${this.read(o(1), "b64")}, ${this.read(o(2), "b64")})`,
          );
        if (type === "b16")
          return this.write(o(0), "u16", `(${this.read(o(1), "u16")} ${sym} ${this.read(o(2), "u16")})`);
        return this.write(o(0), "u32", `(${this.read(o(1), "u32")} ${sym} ${this.read(o(2), "u32")})`);
      }
      case "not": {
        known([]);
        if (type === "pred") return this.write(o(0), "pred", `!${this.read(o(1), "pred")}`);
        return this.write(o(0), "u32", `~${this.read(o(1), "u32")}`);
      }
      case "shl":
      case "shr": {
        known([]);
        const c = clsOf(type);
        const a = this.read(o(1), c);
        const b = this.read(o(2), "u32");
        if (c === "u64" || c === "s64" || c === "b64")
          return this.write(o(0), c, `M.shift64("${op}", "${type}", ${a}, ${b})`);
        if (op === "shl") return this.write(o(0), c, `(${b} > 31 ? 0 : ${a} << ${b})`);
        if (type === "s32") return this.write(o(0), c, `(${a} >> Math.min(${b}, 31))`);
        return this.write(o(0), c, `(${b} > 31 ? 0 : ${a} >>> ${b})`);
      }
      case "popc":
        known([]);
        return this.write(o(0), "u32", `M.popc(${this.read(o(1), "u32")})`);
      case "clz":
        known([]);
        return this.write(o(0), "u32", `Math.clz32(${this.read(o(1), "u32")})`);
      case "brev":
        known([]);
        return this.write(o(0), "u32", `M.brev(${this.read(o(1), "u32")})`);
      case "bfe": {
        known([]);
        const c = clsOf(type);
        return this.write(
          o(0),
          c,
          `M.bfe(${this.read(o(1), "u32")}, ${this.read(o(2), "u32")}, ${this.read(o(3), "u32")}, ${c === "s32"})`,
        );
      }
      case "bfi":
        known([]);
        return this.write(
          o(0),
          "u32",
          `M.bfi(${this.read(o(1), "u32")}, ${this.read(o(2), "u32")}, ${this.read(o(3), "u32")}, ${this.read(o(4), "u32")})`,
        );
      case "prmt": {
        known([]);
        if (mods.length > 0) this.fail("prmt modes are not simulated");
        return this.write(
          o(0),
          "u32",
          `M.prmt(${this.read(o(1), "u32")}, ${this.read(o(2), "u32")}, ${this.read(o(3), "u32")})`,
        );
      }
      case "selp": {
        known([]);
        const c = clsOf(type);
        return this.write(
          o(0),
          c,
          `(${this.read(o(3), "pred")} ? ${this.read(o(1), c)} : ${this.read(o(2), c)})`,
        );
      }
      case "setp":
        return this.setp(parts, ops);
      case "cvt":
        return this.cvt(parts, ops);
      case "bra":
        known([]);
        return this.branch(o(0));
      case "ret":
      case "exit":
        known([]);
        return "return;";
      case "bar":
      case "barrier": {
        known(["sync", "cta", "aligned"]);
        if (ops.length > 1) this.fail("barriers with a thread count are not simulated");
        if (ops.length === 1 && this.read(o(0), "u32") !== "0")
          this.fail("barriers other than 0 are not simulated");
        return `T.site = ${this.site("bar")}; yield 1;`;
      }
      case "shfl": {
        known(["sync", "up", "down", "bfly", "idx"]);
        const mode = mods.find((m) => ["up", "down", "bfly", "idx"].includes(m));
        if (mode === undefined) this.fail("shfl without a mode");
        const dsts = o(0).split("|");
        const s = this.site("shfl");
        let out = `T.site = ${s}; T.a = ${this.read(o(1), "u32")}; T.b = ${this.read(o(2), "u32")}; T.c = ${this.read(o(3), "u32")}; T.mask = ${this.read(o(4), "u32")}; yield 1; `;
        out += this.write(dsts[0] as string, "u32", "T.r");
        if (dsts[1] !== undefined) out += ` ${this.write(dsts[1], "pred", "T.p")}`;
        return `{ ${out} }`;
      }
      case "vote": {
        known(["sync", "ballot", "any", "all", "uni"]);
        const mode = mods.find((m) => ["ballot", "any", "all"].includes(m));
        if (mode === undefined) this.fail("vote without a mode");
        const s = this.site("vote");
        const cls: Cls = mode === "ballot" ? "u32" : "pred";
        return `{ T.site = ${s}; T.a = ${this.read(o(1), "pred")}; T.mask = ${this.read(o(2), "u32")}; yield 1; ${this.write(o(0), cls, mode === "ballot" ? "T.r" : "T.p")} }`;
      }
      case "mma": {
        const s = this.site("mma");
        const d = this.vector(o(0));
        const a = this.vector(o(1));
        const b = this.vector(o(2));
        const c = this.vector(o(3));
        const acc: Cls = parts.includes("s32") ? "s32" : "f32";
        const ins2 = [
          ...a.map((r) => this.read(r, "u32")),
          ...b.map((r) => this.read(r, "u32")),
          ...c.map((r) => this.read(r, acc)),
        ];
        return `{ T.site = ${s}; T.v = [${ins2.join(", ")}]; T.na = ${a.length}; T.nb = ${b.length}; yield 1; ${d.map((r, k) => this.write(r, acc, `T.out[${k}]`)).join(" ")} }`;
      }
      case "ldmatrix": {
        known(["sync", "aligned", "m8n8", "x1", "x2", "x4", "trans", "shared"]);
        const s = this.site("ldmatrix");
        const d = this.vector(o(0));
        const a = this.address(o(1), "shared");
        return `{ T.site = ${s}; T.a = ${a.base} + ${a.offset}; yield 1; ${d.map((r, k) => this.write(r, "u32", `T.out[${k}]`)).join(" ")} }`;
      }
      case "red":
      case "atom": {
        const space = parts.includes("shared") ? "shared" : "global";
        const rop = parts.find((p) =>
          ["add", "min", "max", "and", "or", "xor", "exch", "inc", "dec"].includes(p),
        );
        if (rop === undefined) this.fail(`${op} without an operation`);
        const size = BYTES[type];
        if (size === undefined || size < 4) this.fail(`${op} of .${type}`);
        const at = op === "red" ? 0 : 1;
        const { pre, idx } = this.checked(space, o(at), size, "atomic");
        const arr = space === "global" ? "M" : "T.S";
        const c = clsOf(type);
        const t = `o${this.tmp++}`;
        const load = this.loadGlobal(type, idx, arr);
        const v = this.read(o(at + 1), c);
        const combine: Record<string, string> = {
          add: c === "f32" ? `Math.fround(${t} + ${v})` : `(${t} + ${v})`,
          min: `Math.min(${t}, ${v})`,
          max: `Math.max(${t}, ${v})`,
          and: `(${t} & ${v})`,
          or: `(${t} | ${v})`,
          xor: `(${t} ^ ${v})`,
          exch: v,
          inc: `(${t} >= ${v} ? 0 : ${t} + 1)`,
          dec: `(${t} === 0 || ${t} > ${v} ? ${v} : ${t} - 1)`,
        };
        const norm = c === "f32" || c === "f64" ? "" : c === "s32" ? " | 0" : " >>> 0";
        const store = this.storeGlobal(type, idx, `(${combine[rop]})${norm}`, arr);
        const back = op === "atom" ? this.write(o(0), c, t) : "";
        return `{ ${pre} const ${t} = ${load}; ${store} ${back} }`;
      }
      case "cp": {
        // cp.async.{ca,cg}.shared.global [dst], [src], bytes{, src-size}: done at once (a valid order).
        if (parts[1] !== "async") this.fail("cp other than cp.async");
        if (parts[2] === "commit_group" || parts[2] === "wait_group" || parts[2] === "wait_all") return "";
        const bytes = Number(o(2));
        if (![4, 8, 16].includes(bytes)) this.fail("cp.async of a size other than 4, 8, 16");
        const dst = this.checked("shared", o(0), bytes, "write");
        const srcSize = ops[3] === undefined ? String(bytes) : this.read(ops[3], "u32");
        const t = `n${this.tmp++}`;
        const src = this.address(o(1), "global");
        const site = this.memSite();
        return `{ ${dst.pre} const ${t} = ${srcSize}; if (${t} > 0) { const s = M.index(${src.base} + ${src.offset}, ${t}, ${site}); for (let k = 0; k < ${t}; k++) T.S.u8[${dst.idx} + k] = M.u8[s + k]; } for (let k = ${t}; k < ${bytes}; k++) T.S.u8[${dst.idx} + k] = 0; }`;
      }
      default:
        this.fail(`instruction ${op} is not simulated`);
    }
  }

  ftz(e: string): string {
    return this.instr.opcode.includes("ftz") ? `M.flushSubnormal(${e})` : e;
  }

  fsat(e: string): string {
    return this.instr.opcode.includes("sat") ? `M.sat01(${e})` : e;
  }

  branch(label: string): string {
    const n = this.labels.get(label.trim());
    if (n === undefined) this.fail(`label ${label} is not defined`);
    return `{ pc = ${n}; continue; }`;
  }

  setp(parts: readonly string[], ops: readonly string[]): string {
    const type = parts[parts.length - 1] as string;
    const cmp = parts[1] as string;
    const bool = parts.length === 4 ? parts[2] : undefined;
    const c = clsOf(type);
    const a = this.read(ops[1] as string, c);
    const b = this.read(ops[2] as string, c);
    const isF = c === "f32" || c === "f64";
    const nan = `(Number.isNaN(${a}) || Number.isNaN(${b}))`;
    const table: Record<string, string> = {
      eq: `${a} === ${b}`,
      ne: isF ? `(${a} !== ${b} && !${nan})` : `${a} !== ${b}`,
      lt: `${a} < ${b}`,
      le: `${a} <= ${b}`,
      gt: `${a} > ${b}`,
      ge: `${a} >= ${b}`,
      lo: `${a} < ${b}`,
      ls: `${a} <= ${b}`,
      hi: `${a} > ${b}`,
      hs: `${a} >= ${b}`,
      equ: `(${a} === ${b} || ${nan})`,
      neu: `${a} !== ${b}`,
      ltu: `!(${a} >= ${b})`,
      leu: `!(${a} > ${b})`,
      gtu: `!(${a} <= ${b})`,
      geu: `!(${a} < ${b})`,
      num: `!${nan}`,
      nan,
    };
    const e = table[cmp];
    if (e === undefined) this.fail(`comparison .${cmp}`);
    const dsts = (ops[0] as string).split("|");
    let v = `(${e})`;
    if (bool !== undefined) {
      const q = this.read(ops[3] as string, "pred");
      const js = bool === "and" ? "&&" : bool === "or" ? "||" : bool === "xor" ? "!==" : null;
      if (js === null) this.fail(`setp combiner .${bool}`);
      v = `(${v} ${js} ${q})`;
    }
    const out = this.write(dsts[0] as string, "pred", v);
    if (dsts[1] === undefined) return out;
    let nv = `!(${e})`;
    if (bool !== undefined) {
      const q = this.read(ops[3] as string, "pred");
      nv = `(${nv} ${bool === "and" ? "&&" : bool === "or" ? "||" : "!=="} ${q})`;
    }
    return `{ const t = ${v}; const u = ${nv}; ${this.write(dsts[0] as string, "pred", "t")} ${this.write(dsts[1], "pred", "u")} }`;
  }

  cvt(parts: readonly string[], ops: readonly string[]): string {
    const types = parts.filter((p) => TYPES.has(p));
    const mods = parts.slice(1).filter((p) => !TYPES.has(p));
    const [dt, st] = types as [string, string];
    if (dt === undefined || st === undefined) this.fail("cvt without two types");
    const rnd = mods.find((m) => ["rn", "rz", "rm", "rp", "rni", "rzi", "rmi", "rpi"].includes(m));
    for (const m of mods)
      if (
        !["rn", "rz", "rm", "rp", "rni", "rzi", "rmi", "rpi", "sat", "satfinite", "ftz", "relu"].includes(m)
      )
        this.fail(`cvt modifier .${m}`);
    const sat = mods.includes("sat");
    const relu = mods.includes("relu");
    const d = ops[0] as string;
    const floatType = (t: string) => ["f16", "bf16", "f32", "f64", "e4m3", "e5m2"].includes(t);
    // Packed pairs: d = {cvt(a) in the upper half, cvt(b) in the lower}.
    if (dt === "f16x2" || dt === "bf16x2" || dt === "e4m3x2" || dt === "e5m2x2") {
      if (st !== "f32") this.fail("a packed cvt from other than f32");
      const enc =
        dt === "f16x2" ? "toHalf" : dt === "bf16x2" ? "toBfloat" : dt === "e4m3x2" ? "toE4m3" : "toE5m2";
      const shift = dt.startsWith("e") ? 8 : 16;
      const pre = relu ? (x: string) => `Math.max(0, ${x})` : (x: string) => x;
      const a = pre(this.read(ops[1] as string, "f32"));
      const b = pre(this.read(ops[2] as string, "f32"));
      const e = `((M.${enc}(${a}) << ${shift}) | M.${enc}(${b})) >>> 0`;
      return dt.startsWith("e") ? this.write(d, "u16", e) : this.write(d, "u32", e);
    }
    if (st === "e4m3x2" || st === "e5m2x2") {
      // fp8x2 → f16x2: each byte to a half, the upper byte to the upper half.
      if (dt !== "f16x2") this.fail("a packed fp8 cvt to other than f16x2");
      const dec = st === "e4m3x2" ? "fromE4m3" : "fromE5m2";
      const a = this.read(ops[1] as string, "u16");
      return this.write(
        d,
        "u32",
        `((M.toHalf(M.${dec}(${a} >>> 8)) << 16) | M.toHalf(M.${dec}(${a} & 0xff))) >>> 0`,
      );
    }
    const readSrc = (): string => {
      if (st === "f16") return `M.fromHalf(${this.read(ops[1] as string, "u16")})`;
      if (st === "bf16") return `M.fromBfloat(${this.read(ops[1] as string, "u16")})`;
      return this.read(ops[1] as string, clsOf(st));
    };
    let x = readSrc();
    if (floatType(dt)) {
      if (floatType(st)) {
        if (mods.includes("ftz") && st === "f32") x = `M.flushSubnormal(${x})`;
        if (rnd?.endsWith("i")) x = `M.roundIntegral(${x}, "${rnd}")`;
        else if (rnd !== undefined && rnd !== "rn") this.fail(`cvt rounding .${rnd} between floats`);
      } else if (rnd !== undefined && rnd !== "rn") this.fail(`cvt rounding .${rnd} from an integer`);
      if (sat) x = `M.sat01(${x})`;
      if (relu) x = `Math.max(0, ${x})`;
      switch (dt) {
        case "f32":
          return this.write(d, "f32", `Math.fround(${x})`);
        case "f64":
          return this.write(d, "f64", x);
        case "f16":
          return this.write(d, "u16", `M.toHalf(${x})`);
        case "bf16":
          return this.write(d, "u16", `M.toBfloat(${x})`);
      }
      this.fail(`cvt to .${dt}`);
    }
    // to an integer
    const ranges: Record<string, [number, number]> = {
      u8: [0, 255],
      s8: [-128, 127],
      u16: [0, 65535],
      s16: [-32768, 32767],
      u32: [0, 4294967295],
      s32: [-2147483648, 2147483647],
      u64: [0, 2 ** 64 - 1],
      s64: [-(2 ** 63), 2 ** 63 - 1],
    };
    const r = ranges[dt];
    if (r === undefined) this.fail(`cvt to .${dt}`);
    const dc = clsOf(dt);
    if (floatType(st)) {
      const mode = rnd ?? "rzi";
      if (!mode.endsWith("i")) this.fail(`cvt float → integer rounding .${mode}`);
      return this.write(d, dc, `M.floatToInt(${x}, "${mode}", ${r[0]}, ${r[1]})`);
    }
    // integer → integer: wrap (or saturate with .sat)
    if (sat) return this.write(d, dc, `Math.max(${r[0]}, Math.min(${r[1]}, ${x}))`);
    const bytes = BYTES[dt] as number;
    if (bytes === 1) return this.write(d, dc, dt === "s8" ? `((${x}) << 24) >> 24` : `(${x}) & 0xff`);
    if (bytes === 2) return this.write(d, dc, dt === "s16" ? `((${x}) << 16) >> 16` : `(${x}) & 0xffff`);
    if (bytes === 4) return this.write(d, dc, dt === "s32" ? `M.lo32(${x}) | 0` : `M.lo32(${x})`);
    return this.write(d, dc, x);
  }

  compile(): CompiledKernel {
    const e = this.entry;
    for (const r of e.regs) {
      const s = storageOf(r.type);
      if (r.count === 0) this.storage.set(r.prefix, s);
      for (let i = 0; i < r.count; i++) this.storage.set(`${r.prefix}${i}`, s);
    }
    let off = 0;
    for (const sh of e.shared.filter((s) => !s.extern)) {
      off = Math.ceil(off / sh.align) * sh.align;
      this.sharedOffset.set(sh.name, off);
      off += sh.bytes;
    }
    this.staticShared = off;
    for (const sh of e.shared.filter((s) => s.extern)) {
      const at = Math.ceil(off / Math.max(16, sh.align)) * Math.max(16, sh.align);
      this.sharedOffset.set(sh.name, at);
    }
    // Basic blocks: a case per label.
    let n = 1;
    for (const s of e.body) if (s.kind === "label") this.labels.set(s.name, n++);
    const lines: string[] = [];
    lines.push("case 0:");
    for (const s of e.body) {
      if (s.kind === "label") {
        lines.push(`case ${this.labels.get(s.name)}:`);
        continue;
      }
      let code = this.compileInstr(s);
      if (s.guard !== null) {
        this.instr = s;
        const p = this.read(s.guard.reg, "pred");
        code = `if (${s.guard.negate ? "!" : ""}${p}) { ${code} }`;
      }
      lines.push(`  ${code}`);
    }
    lines.push("  return;");
    const decls: string[] = [];
    for (const [reg, s] of this.storage) decls.push(`${this.v(reg)} = ${s === "pred" ? "false" : "0"}`);
    const src = [
      "return function* kernel(T) {",
      decls.length > 0 ? `  let ${decls.join(", ")};` : "",
      "  let pc = 0;",
      "  for (;;) switch (pc) {",
      ...lines,
      "  }",
      "};",
    ].join("\n");
    let factory: CompiledKernel["factory"];
    try {
      factory = new Function("M", src) as CompiledKernel["factory"];
    } catch (err) {
      throw new TpError(
        "E_INTERNAL",
        `PTX simulator: kernel ${e.name} compiled to invalid JavaScript: ${err instanceof Error ? err.message : err}`,
      );
    }
    return {
      name: e.name,
      params: e.params,
      maxntid: e.maxntid,
      staticShared: this.staticShared,
      sites: this.sites,
      memSites: this.memSites,
      source: src,
      factory,
    };
  }
}

function convertRead(x: string, s: Storage, c: Cls, bad: () => never): string {
  switch (s) {
    case "i32":
      switch (c) {
        case "u32":
        case "u64":
        case "b64":
          return x;
        case "s32":
        case "s64":
          return `(${x} | 0)`;
        case "f32":
          return `M.bitsFloat(${x})`;
        case "u16":
          return `(${x} & 0xffff)`;
        case "s16":
          return `((${x} << 16) >> 16)`;
        case "u8":
          return `(${x} & 0xff)`;
        case "s8":
          return `((${x} << 24) >> 24)`;
        default:
          return bad();
      }
    case "f32":
      if (c === "f32") return x;
      if (c === "u32") return `M.floatBits(${x})`;
      if (c === "s32") return `(M.floatBits(${x}) | 0)`;
      return bad();
    case "i64":
      switch (c) {
        case "u64":
        case "s64":
          return `M.num64(${x})`;
        case "b64":
          return x;
        case "u32":
          return `M.lo32(${x})`;
        case "s32":
          return `(M.lo32(${x}) | 0)`;
        case "f64":
          return `M.bitsDouble(${x})`;
        default:
          return bad();
      }
    case "f64":
      if (c === "f64") return x;
      if (c === "b64" || c === "u64") return `M.doubleBits(${x})`;
      return bad();
    case "i16":
      switch (c) {
        case "u16":
        case "u32":
        case "u64":
          return x;
        case "s16":
        case "s32":
          return `((${x} << 16) >> 16)`;
        case "u8":
          return `(${x} & 0xff)`;
        case "s8":
          return `((${x} << 24) >> 24)`;
        default:
          return bad();
      }
    case "pred":
      return c === "pred" ? x : bad();
  }
}

/**
 * Compile `entry` to a generator factory.
 * @throws TpError E_UNSUPPORTED naming the kernel, line and instruction for anything not simulated
 */
export function compileEntry(entry: PtxEntry): CompiledKernel {
  return new KernelCompiler(entry).compile();
}
