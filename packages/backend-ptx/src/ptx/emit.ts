/**
 * A small PTX emitter: a module header chosen by the device's compute capability, and a kernel
 * builder that hands out virtual registers, labels and parameters and collects instruction lines.
 * Kernels (./kernels/*.ts) are templates over it: TypeScript functions of the op's dtypes and fixed
 * parameters that return PTX text; `ptxas` (tests) or the driver's JIT (run time) compiles them.
 *
 * Source: NVIDIA "Parallel Thread Execution ISA" (version 7.8 / 8.0): module directives (§11.1),
 * state spaces and types (§5), instruction set (§9). The shape — render a kernel from a description,
 * load PTX text through the driver — follows tinygrad's renderer/ptx.py and runtime/ops_cuda.py.
 */
import { TpError } from "@tp/tensor";

/** A compute capability as sm number: 80, 86, 89, 90. */
export type SmVersion = number;

/** The oldest compute capability the kernels target (bf16 conversions, mma.sync, NaN-aware min/max). */
export const MIN_SM = 80;

/**
 * The `.version` for a target: the oldest PTX ISA that has every instruction the kernels use there
 * (8.1 from sm_89: `cvt….e4m3x2.f32` on sm_89 needs it, used by @tp/backend-cudalibs's fp8 quantizer).
 */
export function ptxVersion(sm: SmVersion): string {
  return sm >= 89 ? "8.1" : "7.8";
}

/**
 * `.version`, `.target sm_XX` and `.address_size 64`; `version` raises the `.version` past
 * {@link ptxVersion}'s (a module with a kernel that needs a newer ISA, e.g. fp8 `mma`: 8.4).
 * @throws TpError E_UNSUPPORTED below {@link MIN_SM}
 */
export function ptxHeader(sm: SmVersion, version?: string): string {
  if (!Number.isInteger(sm) || sm < MIN_SM) {
    throw new TpError(
      "E_UNSUPPORTED",
      `backend ptx: compute capability sm_${sm} is older than sm_${MIN_SM}, the oldest its kernels target`,
    );
  }
  const v = version !== undefined && newerIsa(version, ptxVersion(sm)) ? version : ptxVersion(sm);
  return `.version ${v}\n.target sm_${sm}\n.address_size 64\n`;
}

/** Whether PTX ISA version `a` ("8.4") is newer than `b`. */
function newerIsa(a: string, b: string): boolean {
  const [am, an] = a.split(".").map(Number) as [number, number];
  const [bm, bn] = b.split(".").map(Number) as [number, number];
  return am > bm || (am === bm && an > bn);
}

/** A generated kernel: its entry name and PTX body (the `.entry` without the module header). */
export interface KernelSource {
  readonly name: string;
  readonly body: string;
  /** Threads per block the kernel was written for (x, y). */
  readonly block: readonly [number, number];
  /** The oldest sm the kernel runs on (mma.sync: 80; fp8: 89). */
  readonly minSm: SmVersion;
  /** The oldest PTX ISA `.version` the kernel needs when newer than the target's default (fp8 `mma`: "8.4"). */
  readonly ptxIsa?: string;
  /** The `.param` list in order: short names and types (launches pass arguments by these names). */
  readonly params: readonly KernelParam[];
}

/** One kernel parameter: its short name and PTX type. */
export interface KernelParam {
  readonly name: string;
  readonly type: "u64" | "u32" | "s32" | "f32";
}

/** A whole module: the header for `sm` and the kernels' bodies. */
export function ptxModule(sm: SmVersion, kernels: readonly KernelSource[]): string {
  for (const k of kernels) {
    if (sm < k.minSm) {
      throw new TpError(
        "E_UNSUPPORTED",
        `backend ptx: kernel ${k.name} needs sm_${k.minSm} or newer; this device is sm_${sm}`,
      );
    }
  }
  let version: string | undefined;
  for (const k of kernels)
    if (k.ptxIsa !== undefined && (version === undefined || newerIsa(k.ptxIsa, version))) version = k.ptxIsa;
  return `${ptxHeader(sm, version)}\n${kernels.map((k) => k.body).join("\n")}`;
}

/** Register classes: 16-, 32-, 64-bit, f32, f64 and predicates. */
export type RegClass = "b16" | "b32" | "b64" | "f32" | "f64" | "pred";

const PREFIX: Record<RegClass, string> = {
  b16: "%h",
  b32: "%r",
  b64: "%rd",
  f32: "%f",
  f64: "%fd",
  pred: "%p",
};

/**
 * The lines that split %tid.x for the mma.sync kernels: lane = tid % 32, warp = tid / 32, and the
 * fragment coordinates g = lane / 4 (groupID), t = lane % 4 (threadID_in_group) of PTX ISA §9.7.13.4.
 */
export function mmaLaneOps(r: { tid: string; lane: string; warp: string; g: string; t: string }): string[] {
  const { tid, lane, warp, g, t } = r;
  return [
    `mov.u32 ${tid}, %tid.x;`,
    `and.b32 ${lane}, ${tid}, 31;`,
    `shr.u32 ${warp}, ${tid}, 5;`,
    `shr.u32 ${g}, ${lane}, 2;`,
    `and.b32 ${t}, ${lane}, 3;`,
  ];
}

/** An f32 immediate in PTX's exact hexadecimal form (0fXXXXXXXX). */
export function f32Imm(v: number): string {
  const b = new DataView(new ArrayBuffer(4));
  b.setFloat32(0, v);
  return `0f${b.getUint32(0).toString(16).padStart(8, "0").toUpperCase()}`;
}

/** An f64 immediate in PTX's exact hexadecimal form (0dXXXXXXXXXXXXXXXX). */
export function f64Imm(v: number): string {
  const b = new DataView(new ArrayBuffer(8));
  b.setFloat64(0, v);
  return `0d${b.getBigUint64(0).toString(16).padStart(16, "0").toUpperCase()}`;
}

/** Builds one `.entry`: parameters, registers, shared arrays, instructions. */
/** `N` register names: a fixed-length tuple for a literal `N`, else an array. */
export type Registers<N extends number> = number extends N ? string[] : RegisterTuple<N, []>;
type RegisterTuple<N extends number, R extends string[]> = R["length"] extends N
  ? R
  : RegisterTuple<N, [...R, string]>;

export class KernelBuilder {
  readonly name: string;
  readonly #params: string[] = [];
  readonly #paramList: KernelParam[] = [];
  readonly #counts: Record<RegClass, number> = { b16: 0, b32: 0, b64: 0, f32: 0, f64: 0, pred: 0 };
  readonly #shared: string[] = [];
  readonly #lines: string[] = [];
  #labels = 0;

  /** @param name the entry name: letters, digits and underscores */
  constructor(name: string) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name))
      throw new TpError("E_INTERNAL", `bad PTX kernel name '${name}'`);
    this.name = name;
  }

  /** A kernel parameter (`.param .u64 name`); returns its name. */
  param(name: string, type: "u64" | "u32" | "s32" | "f32"): string {
    const p = `${this.name}_${name}`;
    if (this.#paramList.some((q) => q.name === name))
      throw new TpError("E_INTERNAL", `kernel ${this.name}: parameter ${name} twice`);
    this.#params.push(`.param .${type} ${p}`);
    this.#paramList.push({ name, type });
    return p;
  }

  /** Load a parameter into a fresh register (u64 pointers are converted to the global space). */
  ld(name: string, type: "u64" | "u32" | "s32" | "f32"): string {
    const p = this.param(name, type);
    const r = this.reg(type === "u64" ? "b64" : type === "f32" ? "f32" : "b32");
    this.op(`ld.param.${type} ${r}, [${p}];`);
    if (type === "u64") this.op(`cvta.to.global.u64 ${r}, ${r};`);
    return r;
  }

  /** {@link ld} of each name in order, all of one type; the registers as a tuple matching `names`. */
  lds<const N extends readonly string[]>(
    type: "u64" | "u32" | "s32" | "f32",
    ...names: N
  ): { -readonly [K in keyof N]: string } {
    return names.map((n) => this.ld(n, type)) as { -readonly [K in keyof N]: string };
  }

  /** A fresh register of class `c`. */
  reg(c: RegClass): string {
    return `${PREFIX[c]}${this.#counts[c]++}`;
  }

  /** `n` fresh registers (a tuple of `n` names when `n` is a literal, so they destructure as strings). */
  regs<N extends number>(c: RegClass, n: N): Registers<N> {
    return Array.from({ length: n }, () => this.reg(c)) as Registers<N>;
  }

  /** A fresh label. */
  label(what: string): string {
    return `$L_${what}_${this.#labels++}`;
  }

  /** A shared array (`.shared .align A .b8 name[bytes]`); returns its name. */
  shared(name: string, bytes: number, align = 16): string {
    const s = `${this.name}_sh_${name}`;
    this.#shared.push(`.shared .align ${align} .b8 ${s}[${bytes}];`);
    return s;
  }

  /**
   * Instruction lines (each ends with ';'), appended in order. A helper that emits instructions
   * ({@link addr}, {@link exp}, `loadElement`, …) must be called as a statement before the `op` that
   * uses its register, never inside `op`'s arguments: JavaScript evaluates the arguments first, so the
   * helper's lines would come out ahead of this call's lines, including those computing the helper's
   * inputs (a read of an unwritten register, which ptxas accepts). So `op` is a getter: it notes the
   * line count when `kb.op` is read, before the arguments are evaluated, and the function it returns
   * refuses (E_INTERNAL) when lines were emitted in between.
   */
  get op(): (...lines: string[]) => void {
    const mark = this.#lines.length;
    return (...lines: string[]): void => {
      if (this.#lines.length !== mark)
        throw new TpError(
          "E_INTERNAL",
          `kernel ${this.name}: instructions were emitted while evaluating the arguments of op('${lines[0]}', …); call the emitting helper as a statement first`,
        );
      for (const l of lines) this.#lines.push(`\t${l}`);
    };
  }

  /** Place a label. */
  place(label: string): void {
    this.#lines.push(`${label}:`);
  }

  // ---- common sequences ----------------------------------------------------------------------------

  /** %ctaid.x · %ntid.x + %tid.x as a fresh 32-bit register. */
  globalIndex(): string {
    const r = this.reg("b32");
    const n = this.reg("b32");
    const t = this.reg("b32");
    this.op(
      `mov.u32 ${r}, %ctaid.x;`,
      `mov.u32 ${n}, %ntid.x;`,
      `mov.u32 ${t}, %tid.x;`,
      `mad.lo.u32 ${r}, ${r}, ${n}, ${t};`,
    );
    return r;
  }

  /** base + index · bytes (64-bit) for a 32-bit unsigned index. */
  addr(base: string, index: string, bytes: number): string {
    const r = this.reg("b64");
    if (bytes === 1) {
      this.op(`cvt.u64.u32 ${r}, ${index};`, `add.u64 ${r}, ${base}, ${r};`);
    } else this.op(`mad.wide.u32 ${r}, ${index}, ${bytes}, ${base};`);
    return r;
  }

  /**
   * e^x (f32) to a few ulp over the whole range: n = round(x·log2 e), r = x − n·ln 2 (Cody–Waite,
   * two-part ln 2), e^r = ex2.approx(r·log2 e) with |r·log2 e| ≤ ½, times 2^n built from exponent bits
   * in two factors (n clamped to [−252, 254], so both stay normal). ±∞ and NaN come out as e^x does.
   * A plain ex2.approx(x·log2 e) loses |x|·2^−24 of relative accuracy to the rounded product.
   * Source: Cody & Waite, Software Manual for the Elementary Functions (1980), argument reduction.
   */
  exp(x: string): string {
    const t = this.reg("f32");
    const n = this.reg("f32");
    const r = this.reg("f32");
    const a = this.reg("b32");
    const b = this.reg("b32");
    const sa = this.reg("f32");
    const sb = this.reg("f32");
    this.op(
      `mul.f32 ${t}, ${x}, ${f32Imm(Math.LOG2E)};`,
      `cvt.rni.f32.f32 ${n}, ${t};`,
      `min.f32 ${n}, ${n}, ${f32Imm(254)};`,
      `max.f32 ${n}, ${n}, ${f32Imm(-252)};`,
      `neg.f32 ${t}, ${n};`,
      `fma.rn.f32 ${r}, ${t}, ${f32Imm(0.693145751953125)}, ${x};`,
      `fma.rn.f32 ${r}, ${t}, ${f32Imm(1.4286068203094173e-6)}, ${r};`,
      `mul.f32 ${r}, ${r}, ${f32Imm(Math.LOG2E)};`,
      `ex2.approx.f32 ${r}, ${r};`,
      `cvt.rzi.s32.f32 ${a}, ${n};`,
      `shr.s32 ${b}, ${a}, 1;`,
      `sub.s32 ${a}, ${a}, ${b};`,
      `add.s32 ${a}, ${a}, 127;`,
      `add.s32 ${b}, ${b}, 127;`,
      `shl.b32 ${a}, ${a}, 23;`,
      `shl.b32 ${b}, ${b}, 23;`,
      `mov.b32 ${sa}, ${a};`,
      `mov.b32 ${sb}, ${b};`,
      `mul.f32 ${r}, ${r}, ${sa};`,
      `mul.f32 ${r}, ${r}, ${sb};`,
    );
    return r;
  }

  /** 1 / (1 + e^(−x)) (f32, correctly rounded divide). */
  sigmoid(x: string): string {
    const n = this.reg("f32");
    this.op(`neg.f32 ${n}, ${x};`);
    const e = this.exp(n);
    const r = this.reg("f32");
    this.op(`add.f32 ${e}, ${e}, 0f3F800000;`, `rcp.rn.f32 ${r}, ${e};`);
    return r;
  }

  /** tanh(x) = 1 − 2 / (e^(2x) + 1) (f32; saturates to ±1, exact at 0 up to rounding). */
  tanh(x: string): string {
    const t = this.reg("f32");
    this.op(`add.f32 ${t}, ${x}, ${x};`);
    const e = this.exp(t);
    const r = this.reg("f32");
    this.op(
      `add.f32 ${e}, ${e}, 0f3F800000;`,
      `rcp.rn.f32 ${e}, ${e};`,
      `fma.rn.f32 ${r}, ${e}, 0fC0000000, 0f3F800000;`,
    );
    return r;
  }

  /** ln(1 + y) for y ≥ 0 with full relative precision for small y (Goldberg: log(u)·y/(u − 1), u = 1 + y). */
  log1p(y: string): string {
    const u = this.reg("f32");
    const d = this.reg("f32");
    const l = this.reg("f32");
    const p = this.reg("pred");
    this.op(
      `add.f32 ${u}, ${y}, 0f3F800000;`,
      `sub.f32 ${d}, ${u}, 0f3F800000;`,
      `lg2.approx.f32 ${l}, ${u};`,
      `mul.f32 ${l}, ${l}, ${f32Imm(Math.LN2)};`,
      `setp.eq.f32 ${p}, ${d}, 0f00000000;`,
      `div.rn.f32 ${d}, ${y}, ${d};`,
      `mul.f32 ${l}, ${l}, ${d};`,
      `selp.f32 ${l}, ${y}, ${l}, ${p};`,
    );
    return l;
  }

  /**
   * erf(x) (f32): Abramowitz & Stegun 7.1.26 (|error| ≤ 1.5e-7), odd extension. Source: Abramowitz &
   * Stegun, Handbook of Mathematical Functions, eq. 7.1.26.
   */
  erf(x: string): string {
    const a = this.reg("f32");
    const t = this.reg("f32");
    const poly = this.reg("f32");
    const r = this.reg("f32");
    this.op(
      `abs.f32 ${a}, ${x};`,
      `fma.rn.f32 ${t}, ${a}, ${f32Imm(0.3275911)}, 0f3F800000;`,
      `rcp.rn.f32 ${t}, ${t};`,
    );
    const c = [1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592];
    this.op(`mov.f32 ${poly}, ${f32Imm(c[0] as number)};`);
    for (const k of c.slice(1)) this.op(`fma.rn.f32 ${poly}, ${poly}, ${t}, ${f32Imm(k)};`);
    this.op(`mul.f32 ${poly}, ${poly}, ${t};`);
    const sq = this.reg("f32");
    this.op(`mul.f32 ${sq}, ${a}, ${a};`, `neg.f32 ${sq}, ${sq};`);
    const e = this.exp(sq);
    this.op(`mul.f32 ${poly}, ${poly}, ${e};`, `sub.f32 ${r}, 0f3F800000, ${poly};`);
    this.op(`copysign.f32 ${r}, ${x}, ${r};`);
    return r;
  }

  /**
   * Block-wide reduction (add or max) of one f32 per thread for a 1-D block of `threads` (a multiple
   * of 32, ≤ 1024): butterfly shuffles inside each warp, then across warps through shared memory.
   * Every thread gets the result.
   */
  blockReduce(v: string, kind: "add" | "max" | "max_nan", threads: number): string {
    const warps = threads / 32;
    if (!Number.isInteger(warps) || warps < 1 || warps > 32)
      throw new TpError("E_INTERNAL", `bad block size ${threads}`);
    const opc = kind === "add" ? "add.f32" : kind === "max" ? "max.f32" : "max.NaN.f32";
    const r = this.reg("f32");
    const t = this.reg("f32");
    this.op(`mov.f32 ${r}, ${v};`);
    for (let o = 16; o >= 1; o >>= 1)
      this.op(`shfl.sync.bfly.b32 ${t}, ${r}, ${o}, 31, -1;`, `${opc} ${r}, ${r}, ${t};`);
    if (warps === 1) return r;
    const s = this.shared(`red${this.#labels++}`, warps * 4, 4);
    const lane = this.reg("b32");
    const warp = this.reg("b32");
    const p = this.reg("pred");
    const a = this.reg("b32");
    this.op(
      `mov.u32 ${lane}, %tid.x;`,
      `shr.u32 ${warp}, ${lane}, 5;`,
      `and.b32 ${lane}, ${lane}, 31;`,
      `setp.eq.u32 ${p}, ${lane}, 0;`,
      `mov.u32 ${a}, ${s};`,
      `mad.lo.u32 ${a}, ${warp}, 4, ${a};`,
      `@${p} st.shared.f32 [${a}], ${r};`,
      "bar.sync 0;",
    );
    const q = this.reg("pred");
    this.op(
      `setp.lt.u32 ${q}, ${lane}, ${warps};`,
      `mov.u32 ${a}, ${s};`,
      `mad.lo.u32 ${a}, ${lane}, 4, ${a};`,
      `mov.f32 ${r}, ${kind === "add" ? "0f00000000" : "0fFF800000"};`,
      `@${q} ld.shared.f32 ${r}, [${a}];`,
    );
    for (let o = 16; o >= 1; o >>= 1)
      this.op(`shfl.sync.bfly.b32 ${t}, ${r}, ${o}, 31, -1;`, `${opc} ${r}, ${r}, ${t};`);
    this.op("bar.sync 0;");
    return r;
  }

  /** The `.entry` text; `ptxIsa`: see {@link KernelSource.ptxIsa}. */
  build(block: readonly [number, number], minSm: SmVersion = MIN_SM, ptxIsa?: string): KernelSource {
    const decl = (Object.keys(this.#counts) as RegClass[])
      .filter((c) => this.#counts[c] > 0)
      .map((c) => `\t.reg .${c === "pred" ? "pred" : c} ${PREFIX[c]}<${this.#counts[c]}>;`);
    const body =
      `.visible .entry ${this.name}(\n\t${this.#params.join(",\n\t")}\n)\n.maxntid ${block[0] * block[1]}, 1, 1\n{\n` +
      `${[...decl, ...this.#shared.map((s) => `\t${s}`), ...this.#lines].join("\n")}\n\tret;\n}\n`;
    return {
      name: this.name,
      body,
      block,
      minSm,
      ...(ptxIsa === undefined ? {} : { ptxIsa }),
      params: [...this.#paramList],
    };
  }
}
