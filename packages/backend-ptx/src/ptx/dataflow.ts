/**
 * A check on generated PTX: registers read before any instruction writes them. ptxas accepts such
 * code (an unwritten register just holds garbage), so without this a misordered kernel assembles and
 * reads garbage only on a GPU.
 *
 * The rule, for the code this emitter produces: walk the `.entry` body in text order; an
 * instruction's operands are read before its destination is written; a register read that no earlier
 * line (in text order) writes is reported. `ld.param` is an ordinary write of its destination; `.reg`
 * / `.shared` declarations and labels write nothing. Loops are a label and a later backward branch to
 * it, so a register read in the body before the body's first write of it (a value carried from the
 * previous iteration) is accepted only when some line before the loop also writes it — which the
 * text-order walk gives for free, the read coming before the body's write in the text. A predicated
 * write (`@%p mov …`) counts as a write, and a write inside a block a forward branch may skip counts
 * for everything after it: the check finds reads that precede every write in the text (the
 * misordered-operand and uninitialised-accumulator mistakes), it does not prove a write on every path.
 *
 * Operand roles (PTX ISA §9): `st`, `red`, `bar`, `bra`, `ret` only read; every other instruction writes
 * its first operand (each register of a `{…}` vector or a `%a|%b` pair) and reads the rest, the guard
 * predicate and the registers inside `[…]` addresses included. `mma`'s accumulator input is its last
 * operand, so it is read like any other source.
 */

/** One register read before it is written. */
export interface UninitialisedRead {
  /** The `.entry` name. */
  readonly kernel: string;
  /** The register, e.g. `%r6`. */
  readonly register: string;
  /** 1-based line of the instruction inside the kernel's body text. */
  readonly line: number;
  /** The instruction, trimmed. */
  readonly instruction: string;
}

const REGISTER = /%(?:rd|fd|r|f|p|h)\d+/g;
const READ_ONLY = /^(?:st|red|bar|bra|ret)(?:\.|;|$)/;

/** Split operands at top-level commas (not inside `{…}` or `[…]`). */
function operands(text: string): string[] {
  const out: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === "{" || c === "[") depth++;
    else if (c === "}" || c === "]") depth--;
    else if (c === "," && depth === 0) {
      out.push(text.slice(start, i));
      start = i + 1;
    }
  }
  out.push(text.slice(start));
  return out.map((o) => o.trim()).filter((o) => o.length > 0);
}

/**
 * Every register read before a write of it in text order (see the module comment for the rule), in
 * the order they occur, for each `.entry` in `ptx` (a kernel body or a whole module).
 */
export function uninitialisedReads(ptx: string): UninitialisedRead[] {
  const found: UninitialisedRead[] = [];
  let kernel: string | null = null;
  let written = new Set<string>();
  let line = 0;
  for (const raw of ptx.split("\n")) {
    line++;
    const entry = /^\.visible \.entry (\w+)/.exec(raw);
    if (entry !== null) {
      kernel = entry[1] as string;
      written = new Set();
      line = 1;
      continue;
    }
    let text = raw.trim();
    if (kernel === null || !text.endsWith(";") || text.startsWith(".") || text.startsWith("//")) continue;
    const reads: string[] = [];
    const guard = /^@!?(%p\d+)\s+/.exec(text);
    if (guard !== null) {
      reads.push(guard[1] as string);
      text = text.slice(guard[0].length);
    }
    text = text.slice(0, -1);
    const space = text.search(/\s/);
    const opcode = space < 0 ? text : text.slice(0, space);
    const ops = space < 0 ? [] : operands(text.slice(space));
    const writes: string[] = [];
    ops.forEach((o, i) => {
      const regs = o.match(REGISTER) ?? [];
      if (i === 0 && !READ_ONLY.test(opcode) && !o.startsWith("[")) writes.push(...regs);
      else reads.push(...regs);
    });
    for (const r of reads)
      if (!written.has(r)) found.push({ kernel, register: r, line, instruction: raw.trim() });
    for (const r of writes) written.add(r);
  }
  return found;
}
