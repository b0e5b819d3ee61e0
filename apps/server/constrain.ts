/**
 * Constrained decoding: `response_format` (`json_object`, `json_schema`) or `grammar` (GBNF) becomes a
 * grammar (./grammar.ts, ./json-schema.ts) that masks each logits row: a token stays only if its whole
 * text can continue the answer within the grammar, and an end-of-generation token only once the answer
 * is a complete sentence — so a finished answer always parses (and, for a schema, validates).
 *
 * The vocabulary is a trie of the tokens' texts (built once per tokenizer); one walk of it with the
 * recognizer state per step finds every allowed token, pruning a branch at its first refused character.
 * Tokens that are not whole UTF-8 text (byte-fallback pieces, partial characters of byte-level BPE)
 * and special tokens are never allowed under a grammar: the model spells non-ASCII text with whole
 * characters (or JSON's \u escapes).
 * Source: llama.cpp `src/llama-grammar.cpp` (`llama_grammar_apply_impl`: reject candidates whose text
 * the stacks cannot take, allow EOG only when a stack is empty; `llama_grammar_accept_impl`).
 */
import { TpError } from "@tp/tensor";
import type { Tokenizer } from "@tp/tokenizer";
import { apiError, badRequest } from "./errors.ts";
import { accepts, advance, type Grammar, type GrammarState, initialState, parseGbnf } from "./grammar.ts";
import { JSON_OBJECT_GBNF, schemaToGbnf } from "./json-schema.ts";
import type { GenerationRequest } from "./requests.ts";

/** A constraint on one answer. */
export interface Constraint {
  /** Set the logits of every token the grammar refuses here to −∞ (in place). */
  processor(row: Float32Array, context: readonly number[]): void;
  /** Move the grammar past a sampled token. */
  accept(id: number): void;
  /** Whether the answer so far is a complete sentence. */
  complete(): boolean;
}

interface TrieNode {
  children: Map<number, TrieNode>;
  /** Tokens whose text ends here. */
  tokens: number[];
}

const tries = new WeakMap<Tokenizer, { root: TrieNode; texts: (number[] | null)[] }>();

/** The trie of a tokenizer's whole-text tokens (code points), and each token's code points (null: never allowed). */
function vocabularyTrie(tok: Tokenizer): { root: TrieNode; texts: (number[] | null)[] } {
  const known = tries.get(tok);
  if (known !== undefined) return known;
  const strict = new TextDecoder("utf-8", { fatal: true });
  const root: TrieNode = { children: new Map(), tokens: [] };
  const texts: (number[] | null)[] = [];
  for (let id = 0; id < tok.vocabSize; id++) {
    const type = tok.tokenType(id);
    let cps: number[] | null = null;
    if (type === "normal" || type === "user_defined" || type === "byte") {
      try {
        const text = strict.decode(tok.tokenBytes(id));
        if (text.length > 0) cps = Array.from(text, (c) => c.codePointAt(0) as number);
      } catch {
        cps = null; // not whole UTF-8
      }
    }
    texts.push(cps);
    if (cps === null) continue;
    let node = root;
    for (const cp of cps) {
      let next = node.children.get(cp);
      if (next === undefined) {
        next = { children: new Map(), tokens: [] };
        node.children.set(cp, next);
      }
      node = next;
    }
    node.tokens.push(id);
  }
  const built = { root, texts };
  tries.set(tok, built);
  return built;
}

/** Mark in `allowed` every token under `node` whose text the state takes. */
function walk(g: Grammar, node: TrieNode, state: GrammarState, allowed: Uint8Array): void {
  for (const [cp, child] of node.children) {
    const next = advance(g, state, cp);
    if (next.length === 0) continue;
    for (const id of child.tokens) allowed[id] = 1;
    if (child.children.size > 0) walk(g, child, next, allowed);
  }
}

/** Masks remembered per grammar (a state's mask depends on the state only). */
const MAX_MASKS = 64;
const masks = new WeakMap<Grammar, Map<GrammarState, Uint8Array>>();

/** The allowed-token mask of `state` (1 = allowed), from the cache or one trie walk. */
function maskOf(g: Grammar, root: TrieNode, vocab: number, state: GrammarState): Uint8Array {
  let cache = masks.get(g);
  if (cache === undefined) {
    cache = new Map();
    masks.set(g, cache);
  }
  const known = cache.get(state);
  if (known !== undefined) return known;
  const allowed = new Uint8Array(vocab);
  walk(g, root, state, allowed);
  if (cache.size >= MAX_MASKS) cache.delete(cache.keys().next().value as GrammarState);
  cache.set(state, allowed);
  return allowed;
}

/** Compiled grammars by source, so that a schema sent again reuses its states and masks. */
const compiled = new Map<string, Grammar>();
const MAX_GRAMMARS = 16;

function compile(source: string): Grammar {
  let g = compiled.get(source);
  if (g === undefined) {
    g = parseGbnf(source);
    if (compiled.size >= MAX_GRAMMARS) compiled.delete(compiled.keys().next().value as string);
    compiled.set(source, g);
  }
  return g;
}

/** A constraint from a compiled grammar, over `tok`'s vocabulary. */
export function grammarConstraint(g: Grammar, tok: Tokenizer): Constraint {
  const { root, texts } = vocabularyTrie(tok);
  let state = initialState(g);
  return {
    processor(row) {
      const allowed = maskOf(g, root, tok.vocabSize, state);
      const done = accepts(state);
      let kept = 0;
      for (let i = 0; i < row.length; i++) {
        if (allowed[i] === 1 || (done && tok.eog.has(i))) {
          kept++;
          continue;
        }
        row[i] = Number.NEGATIVE_INFINITY;
      }
      // (the sampler would say "no finite logit", which names neither the grammar nor the cause)
      if (kept === 0)
        throw new TpError(
          "E_ARG",
          "the grammar allows no token of this model's vocabulary here (its language is empty, or it needs a character no token spells)",
        );
    },
    accept(id) {
      const cps = texts[id];
      if (cps === null || cps === undefined) return; // an end-of-generation token: the answer ends
      for (const cp of cps) state = advance(g, state, cp);
    },
    complete: () => accepts(state),
  };
}

/**
 * With `tools` and `tool_choice` "required" (or one named function): a grammar for one Hermes / Qwen
 * `<tool_call>` block whose `name` is one of the tools (or the named one) and whose `arguments` follow
 * that tool's `parameters` schema (llama.cpp does the same for tool_choice required).
 */
function toolChoiceGbnf(req: GenerationRequest): string | undefined {
  const r = req as GenerationRequest & { tools?: unknown[]; toolChoice?: unknown };
  if (r.tools === undefined) return undefined;
  const choice = r.toolChoice as { type?: string; function?: { name?: string } } | string | undefined;
  const named = typeof choice === "object" && choice !== null ? choice.function?.name : undefined;
  if (choice !== "required" && named === undefined) return undefined;
  const fns = r.tools
    .map((t) => (t as { function?: { name?: unknown; parameters?: unknown } }).function)
    .filter(
      (f) => f !== undefined && typeof f.name === "string" && (named === undefined || f.name === named),
    );
  if (fns.length === 0)
    throw badRequest(
      named === undefined
        ? "tool_choice 'required' needs function tools"
        : `tool_choice names '${named}', which is not in tools`,
      "tool_choice",
    );
  const call = schemaToGbnf({
    anyOf: fns.map((f) => ({
      type: "object",
      properties: { name: { const: f?.name }, arguments: f?.parameters ?? { type: "object" } },
      required: ["name", "arguments"],
    })),
  });
  // root ::= ws X ws  →  the call inside its tags
  return call.replace(/^root ::= ws (\S+) ws$/m, 'root ::= "<tool_call>\\n" $1 "\\n</tool_call>"');
}

/**
 * The constraint a request asks for, or null.
 * @throws ApiError 400 naming `response_format` or `grammar` when it cannot be compiled
 */
export function constraintFor(tokenizer: Tokenizer, req: GenerationRequest): Constraint | null {
  const f = req.responseFormat as Record<string, unknown> | undefined | null;
  let source: string | undefined;
  let param = "response_format";
  try {
    if (req.grammar !== undefined) {
      if (f !== undefined && f !== null && f.type !== "text")
        throw badRequest("give either 'grammar' or 'response_format', not both", "grammar");
      param = "grammar";
      source = req.grammar;
    } else if (f !== undefined && f !== null) {
      if (typeof f !== "object" || Array.isArray(f))
        throw badRequest("'response_format' must be an object", param);
      if (f.type === "text") return null;
      if (f.type === "json_object")
        source = f.schema === undefined ? JSON_OBJECT_GBNF : schemaToGbnf(f.schema);
      else if (f.type === "json_schema") {
        const js = f.json_schema as Record<string, unknown> | undefined;
        const schema = js?.schema ?? f.schema;
        if (schema === undefined)
          throw badRequest("response_format json_schema needs json_schema.schema", param);
        source = schemaToGbnf(schema);
      } else throw badRequest("response_format.type must be text, json_object or json_schema", param);
    }
    if (source === undefined) source = toolChoiceGbnf(req);
    if (source === undefined) return null;
    return grammarConstraint(compile(source), tokenizer);
  } catch (e) {
    const err = apiError(e);
    if (err.status === 400 && err.param === null) throw badRequest(err.message, param, "invalid_grammar");
    throw err;
  }
}
