/**
 * A parser for the PTX the kernels are written in: a module's `.entry` functions with their `.param`
 * lists, `.reg` declarations, `.shared` arrays, labels and instructions (guard predicate, opcode with
 * its dot-separated modifiers, operands). It takes the subset this project emits and refuses anything
 * else with a TpError naming the line, so the simulator never guesses at text it does not understand.
 *
 * Source: NVIDIA "Parallel Thread Execution ISA" 8.x: syntax (§4), state spaces and variables (§5),
 * directives (§11).
 */
import { TpError } from "@tp/tensor";

/** One `.param` of an entry: its full name and type (u64, u32, s32, f32, …). */
export interface PtxParam {
  readonly name: string;
  readonly type: string;
}

/** A `.reg .type %prefix<count>` declaration (or a single `%name`, count 0). */
export interface PtxRegDecl {
  readonly prefix: string;
  readonly type: string;
  readonly count: number;
}

/** A `.shared .align A .b8 name[bytes]` array; `bytes` is 0 for `.extern` (dynamic) shared memory. */
export interface PtxShared {
  readonly name: string;
  readonly align: number;
  readonly bytes: number;
  readonly extern: boolean;
}

/** One instruction: optional guard, opcode split at the dots, operand texts. */
export interface PtxInstr {
  readonly kind: "instr";
  /** Source line (1-based) in the module text. */
  readonly line: number;
  readonly text: string;
  readonly guard: { readonly reg: string; readonly negate: boolean } | null;
  /** The opcode's parts, e.g. ["ld", "global", "v4", "f32"]. */
  readonly opcode: readonly string[];
  readonly operands: readonly string[];
}

/** A label (`$L_loop_0:`). */
export interface PtxLabel {
  readonly kind: "label";
  readonly line: number;
  readonly name: string;
}

/** One parsed `.entry`. */
export interface PtxEntry {
  readonly name: string;
  readonly params: readonly PtxParam[];
  readonly regs: readonly PtxRegDecl[];
  readonly shared: readonly PtxShared[];
  /** `.maxntid` / `.reqntid` as x, y, z (null when absent). */
  readonly maxntid: readonly [number, number, number] | null;
  readonly body: readonly (PtxInstr | PtxLabel)[];
}

/** A parsed module: its target and entries. */
export interface PtxModuleText {
  readonly version: string;
  /** The sm number of `.target sm_XX` (a suffix such as `a` is kept in `targetName`). */
  readonly target: number;
  readonly targetName: string;
  readonly entries: ReadonlyMap<string, PtxEntry>;
}

function fail(line: number, what: string, text: string): never {
  throw new TpError("E_UNSUPPORTED", `PTX simulator: line ${line}: ${what}: ${text.trim()}`);
}

/** Split operands at top-level commas (not inside `{…}` or `[…]`). */
export function splitOperands(s: string): string[] {
  const out: string[] = [];
  let depth = 0;
  let cur = "";
  for (const ch of s) {
    if (ch === "{" || ch === "[") depth++;
    else if (ch === "}" || ch === "]") depth--;
    if (ch === "," && depth === 0) {
      out.push(cur.trim());
      cur = "";
    } else cur += ch;
  }
  if (cur.trim() !== "") out.push(cur.trim());
  return out;
}

/** Remove `//` and `/* … *\/` comments. */
function stripComments(text: string): string {
  return text.replace(/\/\*[\s\S]*?\*\//g, (m) => m.replace(/[^\n]/g, " ")).replace(/\/\/[^\n]*/g, "");
}

/**
 * Parse a PTX module.
 * @throws TpError E_UNSUPPORTED naming the line for a directive or statement outside the subset
 */
export function parsePtx(text: string): PtxModuleText {
  const lines = stripComments(text).split("\n");
  let version = "";
  let targetName = "";
  const entries = new Map<string, PtxEntry>();
  let i = 0;
  const next = (): { n: number; t: string } | null => {
    while (i < lines.length) {
      const t = (lines[i] as string).trim();
      i++;
      if (t !== "") return { n: i, t };
    }
    return null;
  };
  for (let l = next(); l !== null; l = next()) {
    const { n, t } = l;
    if (t.startsWith(".version")) version = t.split(/\s+/)[1] ?? "";
    else if (t.startsWith(".target")) targetName = (t.split(/\s+/)[1] ?? "").replace(/,.*/, "");
    else if (t.startsWith(".address_size")) {
      if (!/\b64\b/.test(t)) fail(n, "only 64-bit addresses are simulated", t);
    } else if (/^(\.visible\s+|\.weak\s+)?\.entry\b/.test(t)) {
      // Header: `.visible .entry name(` then params up to `)`.
      const name = /\.entry\s+([A-Za-z_$][\w$]*)/.exec(t)?.[1];
      if (name === undefined) fail(n, "an .entry without a name", t);
      let header = t.slice(t.indexOf(name) + name.length);
      while (!header.includes(")")) {
        const more = next();
        if (more === null) fail(n, "an unterminated .param list", t);
        header += ` ${more.t}`;
      }
      const inner = header.slice(header.indexOf("(") + 1, header.lastIndexOf(")"));
      const params: PtxParam[] = [];
      for (const p of splitOperands(inner)) {
        const m = /^\.param\s+\.(\w+)\s+([A-Za-z_$][\w$]*)$/.exec(p.trim());
        if (m === null) fail(n, "a .param the simulator does not take", p);
        params.push({ type: m[1] as string, name: m[2] as string });
      }
      let maxntid: [number, number, number] | null = null;
      let open = next();
      while (open !== null && open.t !== "{") {
        const m = /^\.(maxntid|reqntid)\s+([\d\s,]+)$/.exec(open.t);
        if (m === null) fail(open.n, "an entry directive the simulator does not take", open.t);
        const v = (m[2] as string).split(",").map((s) => Number(s.trim()));
        maxntid = [v[0] ?? 1, v[1] ?? 1, v[2] ?? 1];
        open = next();
      }
      if (open === null) fail(n, "an .entry without a body", t);
      entries.set(name, parseBody(name, params, maxntid, next));
    } else fail(n, "a module directive the simulator does not take", t);
  }
  const target = Number(/^sm_(\d+)/.exec(targetName)?.[1] ?? Number.NaN);
  if (!Number.isFinite(target)) fail(1, "no .target sm_XX", targetName);
  return { version, target, targetName, entries };
}

function parseBody(
  name: string,
  params: PtxParam[],
  maxntid: [number, number, number] | null,
  next: () => { n: number; t: string } | null,
): PtxEntry {
  const regs: PtxRegDecl[] = [];
  const shared: PtxShared[] = [];
  const body: (PtxInstr | PtxLabel)[] = [];
  for (let l = next(); l !== null; l = next()) {
    const { n } = l;
    let t = l.t;
    if (t === "}") return { name, params, regs, shared, maxntid, body };
    // A label may share its line with an instruction.
    for (let m = /^([A-Za-z_$][\w$]*):\s*/.exec(t); m !== null; m = /^([A-Za-z_$][\w$]*):\s*/.exec(t)) {
      body.push({ kind: "label", line: n, name: m[1] as string });
      t = t.slice(m[0].length);
    }
    if (t === "") continue;
    // Several statements may share a line.
    for (const stmt of t.split(";")) {
      const s = stmt.trim();
      if (s === "") continue;
      if (s.startsWith(".reg")) {
        const m = /^\.reg\s+\.(\w+)\s+(.+)$/.exec(s);
        if (m === null) fail(n, "a .reg the simulator does not take", s);
        for (const r of splitOperands(m[2] as string)) {
          const rm = /^(%[A-Za-z_$][\w$]*?)(?:<(\d+)>)?$/.exec(r.trim());
          if (rm === null) fail(n, "a register name the simulator does not take", r);
          regs.push({ prefix: rm[1] as string, type: m[1] as string, count: Number(rm[2] ?? 0) });
        }
      } else if (s.startsWith(".shared") || s.startsWith(".extern")) {
        const m =
          /^(\.extern\s+)?\.shared\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s+([A-Za-z_$][\w$]*)\[(\d*)\]$/.exec(s);
        if (m === null) fail(n, "a .shared declaration the simulator does not take", s);
        const elem = Number(/\d+/.exec(m[3] as string)?.[0] ?? 8) / 8;
        shared.push({
          name: m[4] as string,
          align: Number(m[2] ?? elem),
          bytes: m[5] === "" ? 0 : Number(m[5]) * elem,
          extern: m[1] !== undefined || m[5] === "",
        });
      } else if (s.startsWith(".")) fail(n, "a directive the simulator does not take", s);
      else body.push(parseInstr(n, s));
    }
  }
  throw new TpError("E_UNSUPPORTED", `PTX simulator: entry ${name} has no closing brace`);
}

function parseInstr(line: number, s: string): PtxInstr {
  let rest = s;
  let guard: PtxInstr["guard"] = null;
  const g = /^@(!?)(%[\w$]+)\s+/.exec(rest);
  if (g !== null) {
    guard = { negate: g[1] === "!", reg: g[2] as string };
    rest = rest.slice(g[0].length);
  }
  const m = /^([a-z][\w.]*)\s*(.*)$/.exec(rest);
  if (m === null) fail(line, "not an instruction", s);
  return {
    kind: "instr",
    line,
    text: s,
    guard,
    opcode: (m[1] as string).split("."),
    operands: splitOperands(m[2] as string),
  };
}
