/**
 * The special-token partition that runs before BPE or SentencePiece: the verbatim texts of CONTROL,
 * USER_DEFINED and UNKNOWN tokens are cut out of the text and emitted as their ids; the text between
 * them goes on to the model. USER_DEFINED tokens (Qwen's `<think>`, Gemma's whitespace runs and HTML
 * tags) are always matched; CONTROL and UNKNOWN tokens only with `parseSpecial` — user text never
 * turns into `<|im_end|>` unless the caller asks for it (llm.md §11.2 decision 2).
 *
 * Matching is leftmost-longest: at the earliest position where some allowed token matches, the
 * longest one wins (llm.md §4.2 step 1; Hugging Face `tokenizers` `AddedVocabulary`, which produced
 * the test vectors). llama.cpp (`tokenizer_st_partition`) instead cuts the longest token everywhere
 * first; the two differ only when two special texts overlap, e.g. `ab` and `bcd` in `abcd`.
 */
import { TOKEN_TYPE } from "./vocab.ts";

interface TrieNode {
  next: Map<number, TrieNode> | null;
  /** Token id ending here, or -1. */
  id: number;
  /** True when that token is matched only with parseSpecial (CONTROL, UNKNOWN). */
  needsParse: boolean;
}

const node = (): TrieNode => ({ next: null, id: -1, needsParse: false });

/** A fragment of partitioned text: a raw string, or a token id. */
export type Fragment = string | number;

/** One special token found in a text: UTF-16 offsets `[start, end)` and its id. */
export interface SpecialMatch {
  start: number;
  end: number;
  id: number;
}

/** Finds special-token texts in a string (a trie over UTF-16 code units). */
export class SpecialTokenMatcher {
  readonly #root = node();
  /** Number of tokens in the trie. */
  readonly count: number;

  /**
   * @param size  number of token ids
   * @param text  token text by id
   * @param type  token type by id ({@link TOKEN_TYPE}); CONTROL, USER_DEFINED and UNKNOWN tokens are indexed
   */
  constructor(size: number, text: (id: number) => string, type: (id: number) => number) {
    let count = 0;
    for (let id = 0; id < size; id++) {
      const t = type(id);
      if (t !== TOKEN_TYPE.CONTROL && t !== TOKEN_TYPE.USER_DEFINED && t !== TOKEN_TYPE.UNKNOWN) continue;
      const s = text(id);
      if (s.length === 0) continue;
      let at = this.#root;
      for (let i = 0; i < s.length; i++) {
        const c = s.charCodeAt(i);
        at.next ??= new Map();
        let child = at.next.get(c);
        if (child === undefined) {
          child = node();
          at.next.set(c, child);
        }
        at = child;
      }
      // Two ids with one text: the later id wins, as in the vocabulary lookup.
      at.id = id;
      at.needsParse = t !== TOKEN_TYPE.USER_DEFINED;
      count++;
    }
    this.count = count;
  }

  /**
   * Every special-token match in `text`, leftmost-longest, left to right.
   * @param parseSpecial also match CONTROL and UNKNOWN tokens
   * @param literal sorted or unsorted UTF-16 spans `[start, end)` of `text` where no CONTROL/UNKNOWN
   *   token may start even with `parseSpecial` (user text spliced into a rendered template)
   */
  matches(
    text: string,
    parseSpecial: boolean,
    literal: readonly (readonly [number, number])[] = [],
  ): SpecialMatch[] {
    const out: SpecialMatch[] = [];
    const root = this.#root.next;
    if (root === null) return out;
    const spans = literal.length > 1 ? [...literal].sort((a, b) => a[0] - b[0]) : literal;
    let span = 0;
    let i = 0;
    while (i < text.length) {
      while (span < spans.length && (spans[span] as readonly [number, number])[1] <= i) span++;
      const inLiteral = span < spans.length && (spans[span] as readonly [number, number])[0] <= i;
      const allowControl = parseSpecial && !inLiteral;
      let at = root.get(text.charCodeAt(i));
      let bestId = -1;
      let bestEnd = -1;
      for (let j = i + 1; at !== undefined; j++) {
        if (at.id >= 0 && (allowControl || !at.needsParse)) {
          bestId = at.id;
          bestEnd = j;
        }
        if (at.next === null || j >= text.length) break;
        at = at.next.get(text.charCodeAt(j));
      }
      if (bestId < 0) {
        i++;
        continue;
      }
      out.push({ start: i, end: bestEnd, id: bestId });
      i = bestEnd;
    }
    return out;
  }

  /**
   * Split `text` into raw strings and token ids (see {@link matches} for the arguments).
   * @returns fragments in order; raw strings are never empty
   */
  split(
    text: string,
    parseSpecial: boolean,
    literal: readonly (readonly [number, number])[] = [],
  ): Fragment[] {
    const out: Fragment[] = [];
    let rawStart = 0;
    for (const m of this.matches(text, parseSpecial, literal)) {
      if (m.start > rawStart) out.push(text.slice(rawStart, m.start));
      out.push(m.id);
      rawStart = m.end;
    }
    if (rawStart < text.length) out.push(text.slice(rawStart));
    return out;
  }
}
