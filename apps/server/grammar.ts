/**
 * Context-free grammars in llama.cpp's GBNF notation, and a recognizer that follows them one
 * character at a time: the state is a set of pushdown stacks of positions in the grammar (as
 * llama.cpp's `llama_grammar_advance_stack`), each stack's top a character class still to match; a
 * character moves every stack whose top accepts it; an empty stack means the text so far is a complete
 * sentence. Repetition (`*`, `+`, `?`, `{m,n}`) and groups are rewritten into plain rules when parsed.
 *
 * GBNF: `name ::= alternatives` (one or more lines; `#` comments), alternatives separated by `|`,
 * each a sequence of `"literal"` (escapes `\n \t \r \\ \" \xHH \uHHHH`), `[classes]` (ranges, `^` to
 * negate), `.` (any character), rule names and `( groups )`, with postfix `* + ? {m} {m,} {m,n}`.
 * The start rule is `root`.
 * Source: llama.cpp `grammars/README.md` (the notation) and `src/llama-grammar.cpp` (the stack
 * recognizer; left recursion is refused there as here).
 */
import { TpError } from "@tp/tensor";

/** One element of a sequence: a character class, a reference to a rule, or the end of an alternative. */
const CHAR = 0;
const RULE = 1;
const END = 2;

/** Most stacks a state may hold before the grammar is called ambiguous beyond use. */
const MAX_STACKS = 4096;
/** Most nested rule expansions without consuming a character (catches left recursion). */
const MAX_DEPTH = 512;

/** A compiled grammar: elements laid out flat, each alternative a run ending in END. */
export class Grammar {
  /** Element kind per position. */
  readonly kind: Uint8Array;
  /** RULE: the rule id; CHAR: index into `classes`. */
  readonly arg: Int32Array;
  /** Character classes: sorted inclusive ranges [lo, hi, lo, hi, …] and whether negated. */
  readonly classes: { ranges: Int32Array; negate: boolean }[];
  /** Start position of every alternative of each rule. */
  readonly alternatives: Int32Array[];
  readonly root: number;
  /** Equal states are one object (by their stacks), so that {@link advance} can remember its answers. */
  interned = new Map<string, GrammarState>();
  memo = new WeakMap<GrammarState, Map<number, GrammarState>>();

  constructor(
    kind: Uint8Array,
    arg: Int32Array,
    classes: { ranges: Int32Array; negate: boolean }[],
    alternatives: Int32Array[],
    root: number,
  ) {
    this.kind = kind;
    this.arg = arg;
    this.classes = classes;
    this.alternatives = alternatives;
    this.root = root;
  }

  /** Whether the class at `pos` accepts code point `cp`. */
  matches(pos: number, cp: number): boolean {
    const c = this.classes[this.arg[pos] as number] as { ranges: Int32Array; negate: boolean };
    const r = c.ranges;
    let inside = false;
    for (let i = 0; i < r.length; i += 2)
      if (cp >= (r[i] as number) && cp <= (r[i + 1] as number)) {
        inside = true;
        break;
      }
    return inside !== c.negate;
  }
}

/** A recognizer state: stacks (top last), each ready (top is a CHAR) or empty (= accepted). */
export type GrammarState = readonly (readonly number[])[];

/** Expand `stack` until its top is a character class (or it is empty); adds the results to `out`. */
function expand(g: Grammar, stack: number[], out: Map<string, number[]>, depth: number): void {
  if (depth > MAX_DEPTH)
    throw new TpError(
      "E_ARG",
      "the grammar recurses without consuming input (left recursion is not supported)",
    );
  if (stack.length === 0) {
    out.set("", stack);
    return;
  }
  const top = stack[stack.length - 1] as number;
  const k = g.kind[top];
  if (k === CHAR) {
    out.set(stack.join(","), stack);
    return;
  }
  if (k === END) {
    expand(g, stack.slice(0, -1), out, depth + 1);
    return;
  }
  // RULE: continue after it once the rule is done; try each of its alternatives
  const rest = stack.slice(0, -1);
  rest.push(top + 1);
  for (const start of g.alternatives[g.arg[top] as number] as Int32Array)
    expand(g, [...rest, start], out, depth + 1);
  if (out.size > MAX_STACKS)
    throw new TpError("E_ARG", `the grammar is too ambiguous (over ${MAX_STACKS} parses at once)`);
}

/** States remembered per grammar before the caches start over. */
const MAX_INTERNED = 50_000;

/** The one object for the state of these stacks. */
function intern(g: Grammar, out: Map<string, number[]>): GrammarState {
  const key = [...out.keys()]
    .sort()
    .map((k) => `[${k}]`) // the accepted stack's key is "": keep it apart from no stacks at all
    .join("");
  const known = g.interned.get(key);
  if (known !== undefined) return known;
  if (g.interned.size >= MAX_INTERNED) {
    g.interned = new Map();
    g.memo = new WeakMap();
  }
  const state: GrammarState = [...out.values()];
  g.interned.set(key, state);
  return state;
}

/** The state before any character. */
export function initialState(g: Grammar): GrammarState {
  const out = new Map<string, number[]>();
  for (const start of g.alternatives[g.root] as Int32Array) expand(g, [start], out, 0);
  return intern(g, out);
}

/** The state after code point `cp` (empty: `cp` is not allowed here). Remembered per (state, cp). */
export function advance(g: Grammar, state: GrammarState, cp: number): GrammarState {
  let seen = g.memo.get(state);
  const known = seen?.get(cp);
  if (known !== undefined) return known;
  const out = new Map<string, number[]>();
  for (const stack of state) {
    if (stack.length === 0) continue;
    const top = stack[stack.length - 1] as number;
    if (!g.matches(top, cp)) continue;
    const next = stack.slice(0, -1);
    next.push(top + 1);
    expand(g, next, out, 0);
  }
  const result = intern(g, out);
  if (seen === undefined) {
    seen = new Map();
    g.memo.set(state, seen);
  }
  seen.set(cp, result);
  return result;
}

/** True when the text so far is a complete sentence of the grammar. */
export function accepts(state: GrammarState): boolean {
  return state.some((s) => s.length === 0);
}

// ------------------------------------------------------------------------------------------ parser

type Node =
  | { t: "chars"; ranges: number[]; negate: boolean }
  | { t: "ref"; name: string }
  | { t: "seq"; items: Node[] }
  | { t: "alt"; options: Node[] }
  | { t: "repeat"; item: Node; min: number; max: number };

/** Most repetitions a `{m,n}` may spell out. */
const MAX_REPEAT = 1000;
/** Deepest nesting of parentheses (a deeper grammar is refused rather than overflowing the stack). */
const MAX_NESTING = 100;

class Parser {
  at = 0;
  nesting = 0;
  constructor(readonly src: string) {}

  fail(msg: string): never {
    const line = this.src.slice(0, this.at).split("\n").length;
    throw new TpError("E_ARG", `GBNF grammar, line ${line}: ${msg}`);
  }

  /** Skip spaces and comments; newlines too when `newlines`. */
  ws(newlines: boolean): void {
    for (;;) {
      const c = this.src[this.at];
      if (c === " " || c === "\t" || (newlines && (c === "\n" || c === "\r"))) this.at++;
      else if (c === "#") while (this.at < this.src.length && this.src[this.at] !== "\n") this.at++;
      else if (c === "\\" && (this.src[this.at + 1] === "\n" || this.src[this.at + 1] === "\r")) this.at += 2;
      else return;
    }
  }

  name(): string {
    const m = /^[A-Za-z0-9_-]+/.exec(this.src.slice(this.at));
    if (m === null) this.fail(`a rule name expected at '${this.src.slice(this.at, this.at + 12)}'`);
    this.at += m[0].length;
    return m[0];
  }

  /** One character of a literal or class, escapes decoded. */
  char(): number {
    const c = this.src.codePointAt(this.at);
    if (c === undefined) this.fail("unexpected end of the grammar");
    if (c !== 0x5c) {
      this.at += c > 0xffff ? 2 : 1;
      return c;
    }
    const e = this.src[this.at + 1];
    const simple: Record<string, number> = {
      n: 10,
      t: 9,
      r: 13,
      "\\": 92,
      '"': 34,
      "[": 91,
      "]": 93,
      "-": 45,
      "^": 94,
    };
    if (e !== undefined && e in simple) {
      this.at += 2;
      return simple[e] as number;
    }
    const hex = e === "x" ? 2 : e === "u" ? 4 : e === "U" ? 8 : 0;
    if (hex > 0) {
      const h = this.src.slice(this.at + 2, this.at + 2 + hex);
      if (!/^[0-9a-fA-F]+$/.test(h) || h.length !== hex) this.fail(`bad escape \\${e}${h}`);
      this.at += 2 + hex;
      return Number.parseInt(h, 16);
    }
    this.fail(`unknown escape \\${e}`);
  }

  primary(): Node {
    const c = this.src[this.at];
    if (c === '"') {
      this.at++;
      const items: Node[] = [];
      while (this.src[this.at] !== '"') {
        if (this.at >= this.src.length) this.fail("unterminated string literal");
        const cp = this.char();
        items.push({ t: "chars", ranges: [cp, cp], negate: false });
      }
      this.at++;
      return { t: "seq", items };
    }
    if (c === "[") {
      this.at++;
      const negate = this.src[this.at] === "^";
      if (negate) this.at++;
      const ranges: number[] = [];
      while (this.src[this.at] !== "]") {
        if (this.at >= this.src.length) this.fail("unterminated character class");
        const lo = this.char();
        let hi = lo;
        if (this.src[this.at] === "-" && this.src[this.at + 1] !== "]") {
          this.at++;
          hi = this.char();
        }
        if (hi < lo) this.fail(`empty range in a character class`);
        ranges.push(lo, hi);
      }
      this.at++;
      return { t: "chars", ranges, negate };
    }
    if (c === ".") {
      this.at++;
      return { t: "chars", ranges: [], negate: true };
    }
    if (c === "(") {
      if (++this.nesting > MAX_NESTING) this.fail(`parentheses nested more than ${MAX_NESTING} deep`);
      this.at++;
      this.ws(true);
      const inner = this.alternatives(true);
      this.ws(true);
      if (this.src[this.at] !== ")") this.fail("')' expected");
      this.at++;
      this.nesting--;
      return inner;
    }
    return { t: "ref", name: this.name() };
  }

  postfix(node: Node): Node {
    for (;;) {
      const c = this.src[this.at];
      if (c === "*") node = { t: "repeat", item: node, min: 0, max: Infinity };
      else if (c === "+") node = { t: "repeat", item: node, min: 1, max: Infinity };
      else if (c === "?") node = { t: "repeat", item: node, min: 0, max: 1 };
      else if (c === "{") {
        const m = /^\{\s*(\d+)\s*(,\s*(\d*)\s*)?\}/.exec(this.src.slice(this.at));
        if (m === null) this.fail("'{m}', '{m,}' or '{m,n}' expected");
        const min = Number(m[1]);
        const max = m[2] === undefined ? min : m[3] === "" ? Infinity : Number(m[3]);
        if (max < min || min > MAX_REPEAT || (max !== Infinity && max > MAX_REPEAT))
          this.fail(`bad repetition {${m[1]},${m[3] ?? ""}} (at most ${MAX_REPEAT})`);
        this.at += m[0].length - 1;
        node = { t: "repeat", item: node, min, max };
      } else return node;
      this.at++;
    }
  }

  sequence(inGroup: boolean): Node {
    const items: Node[] = [];
    for (;;) {
      this.ws(inGroup);
      const c = this.src[this.at];
      if (c === undefined || c === "|" || c === ")" || c === "\n" || c === "\r") break;
      // a new rule starts: `name ::=`
      if (!inGroup && /^[A-Za-z0-9_-]+\s*::=/.test(this.src.slice(this.at))) break;
      items.push(this.postfix(this.primary()));
    }
    return { t: "seq", items };
  }

  alternatives(inGroup: boolean): Node {
    const options = [this.sequence(inGroup)];
    for (;;) {
      const back = this.at;
      this.ws(true); // an alternative may continue on the next line: `| …`
      if (this.src[this.at] !== "|") {
        this.at = back;
        break;
      }
      this.at++;
      this.ws(true);
      options.push(this.sequence(inGroup));
    }
    return options.length === 1 ? (options[0] as Node) : { t: "alt", options };
  }

  rules(): Map<string, Node> {
    const out = new Map<string, Node>();
    this.ws(true);
    while (this.at < this.src.length) {
      const name = this.name();
      this.ws(false);
      if (this.src.slice(this.at, this.at + 3) !== "::=") this.fail(`'::=' expected after '${name}'`);
      this.at += 3;
      this.ws(true);
      if (out.has(name)) this.fail(`rule '${name}' is defined twice`);
      out.set(name, this.alternatives(false));
      this.ws(true);
    }
    return out;
  }
}

/**
 * Parse and compile a GBNF grammar.
 * @throws TpError E_ARG naming the line for a syntax error, an undefined rule, or no `root`
 */
export function parseGbnf(src: string): Grammar {
  const defs = new Parser(src).rules();
  if (!defs.has("root")) throw new TpError("E_ARG", "GBNF grammar: there is no 'root' rule");
  // Lower to rules of alternatives of sequences of (chars | ref) items.
  const ids = new Map<string, number>();
  const lowered: { kind: number; arg: number }[][][] = [];
  const classes: { ranges: Int32Array; negate: boolean }[] = [];
  const classOf = (n: Extract<Node, { t: "chars" }>) => {
    const pairs: [number, number][] = [];
    for (let i = 0; i < n.ranges.length; i += 2)
      pairs.push([n.ranges[i] as number, n.ranges[i + 1] as number]);
    pairs.sort((a, b) => a[0] - b[0]);
    classes.push({ ranges: Int32Array.from(pairs.flat()), negate: n.negate });
    return classes.length - 1;
  };
  const ruleId = (name: string) => {
    let id = ids.get(name);
    if (id === undefined) {
      id = lowered.length;
      ids.set(name, id);
      lowered.push([]);
    }
    return id;
  };
  for (const name of defs.keys()) ruleId(name);
  let fresh = 0;
  /** A new rule for a sub-expression. */
  const newRule = (alts: { kind: number; arg: number }[][]) => {
    const id = ruleId(`\u0000${fresh++}`);
    lowered[id] = alts;
    return id;
  };
  const seqOf = (n: Node): { kind: number; arg: number }[] => {
    if (n.t === "chars") return [{ kind: CHAR, arg: classOf(n) }];
    if (n.t === "ref") {
      if (!defs.has(n.name))
        throw new TpError("E_ARG", `GBNF grammar: the rule '${n.name}' is used but not defined`);
      return [{ kind: RULE, arg: ruleId(n.name) }];
    }
    if (n.t === "seq") return n.items.flatMap(seqOf);
    if (n.t === "alt") return [{ kind: RULE, arg: newRule(n.options.map(seqOf)) }];
    // repeat: item{min} then (max − min) optional copies, or a star rule
    const item = seqOf(n.item);
    const out: { kind: number; arg: number }[] = [];
    for (let i = 0; i < n.min; i++) out.push(...item);
    if (n.max === Infinity) {
      const star = ruleId(`\u0000${fresh++}`);
      lowered[star] = [[...item, { kind: RULE, arg: star }], []];
      out.push({ kind: RULE, arg: star });
    } else {
      let tail: number | undefined;
      for (let i = n.max - n.min; i > 0; i--) {
        const alts: { kind: number; arg: number }[][] = [
          [...item, ...(tail === undefined ? [] : [{ kind: RULE, arg: tail }])],
          [],
        ];
        tail = newRule(alts);
      }
      if (tail !== undefined) out.push({ kind: RULE, arg: tail });
    }
    return out;
  };
  for (const [name, node] of defs)
    lowered[ruleId(name)] = node.t === "alt" ? node.options.map(seqOf) : [seqOf(node)];
  // Lay out flat.
  const kind: number[] = [];
  const arg: number[] = [];
  const alternatives = lowered.map((alts) =>
    Int32Array.from(
      alts.map((seq) => {
        const start = kind.length;
        for (const e of seq) {
          kind.push(e.kind);
          arg.push(e.arg);
        }
        kind.push(END);
        arg.push(0);
        return start;
      }),
    ),
  );
  return new Grammar(
    Uint8Array.from(kind),
    Int32Array.from(arg),
    classes,
    alternatives,
    ids.get("root") as number,
  );
}
