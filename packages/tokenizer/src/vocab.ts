/**
 * A vocabulary held as bytes: every token's text is a span of one UTF-8 buffer (for a GGUF file, the
 * `tokenizer.ggml.tokens` array exactly as it lies in the file), looked up through an open-addressing
 * hash table over those bytes. No JavaScript string is made per token at load: strings are decoded
 * lazily when asked for (llm.md §11.4, "decode tokenizer strings lazily").
 */
import { fromUtf8, utf8 } from "./unicode.ts";

/**
 * Token types as GGUF stores them in `tokenizer.ggml.token_type` (llama.cpp `llama_token_type`;
 * llm.md §4.1).
 */
export const TOKEN_TYPE = {
  UNDEFINED: 0,
  NORMAL: 1,
  UNKNOWN: 2,
  CONTROL: 3,
  USER_DEFINED: 4,
  UNUSED: 5,
  BYTE: 6,
} as const;

/** One of the values of {@link TOKEN_TYPE}. */
export type TokenTypeId = (typeof TOKEN_TYPE)[keyof typeof TOKEN_TYPE];

/** Names of the token types, by id. */
export const TOKEN_TYPE_NAMES = [
  "undefined",
  "normal",
  "unknown",
  "control",
  "user_defined",
  "unused",
  "byte",
] as const;

/** A token type by name. */
export type TokenTypeName = (typeof TOKEN_TYPE_NAMES)[number];

/** FNV-1a over `buf[start, end)`, continuing from `h`. */
function fnv(buf: Uint8Array, start: number, end: number, h: number): number {
  for (let i = start; i < end; i++) h = Math.imul(h ^ (buf[i] as number), 16777619);
  return h;
}
const FNV_SEED = 0x811c9dc5 | 0;

/**
 * The token texts of a vocabulary as spans of one byte buffer, with a hash table from bytes to id.
 * When two ids have the same text, lookups return the larger id (llama.cpp fills `token_to_id` in id
 * order, so the last one wins).
 */
export class ByteVocab {
  /** Number of tokens (ids 0 … size-1). */
  readonly size: number;
  readonly #blob: Uint8Array;
  readonly #start: Uint32Array;
  readonly #length: Uint32Array;
  readonly #table: Int32Array;
  readonly #mask: number;
  readonly #strings: (string | undefined)[];

  /**
   * @param blob   bytes holding every token's UTF-8 text
   * @param start  [size] byte offset of each token's text in `blob`
   * @param length [size] byte length of each token's text
   */
  constructor(blob: Uint8Array, start: Uint32Array, length: Uint32Array) {
    this.size = start.length;
    this.#blob = blob;
    this.#start = start;
    this.#length = length;
    let cap = 16;
    while (cap < this.size * 2) cap *= 2;
    this.#table = new Int32Array(cap);
    this.#mask = cap - 1;
    this.#strings = new Array(this.size);
    for (let id = 0; id < this.size; id++) {
      const s = start[id] as number;
      const e = s + (length[id] as number);
      let slot = fnv(blob, s, e, FNV_SEED) & this.#mask;
      for (;;) {
        const at = this.#table[slot] as number;
        if (at === 0) {
          this.#table[slot] = id + 1;
          break;
        }
        if (this.#equals(at - 1, blob, s, e, e, e)) {
          this.#table[slot] = id + 1; // duplicate text: the later id wins
          break;
        }
        slot = (slot + 1) & this.#mask;
      }
    }
  }

  /** Build from JavaScript strings (tokenizer.json vocabularies, tests). */
  static fromStrings(texts: readonly string[]): ByteVocab {
    const enc = new TextEncoder();
    let blob = new Uint8Array(Math.max(64, texts.length * 8));
    const start = new Uint32Array(texts.length);
    const length = new Uint32Array(texts.length);
    let p = 0;
    for (let i = 0; i < texts.length; i++) {
      const t = texts[i] as string;
      if (blob.length - p < 3 * t.length) {
        const grown = new Uint8Array(Math.max(blob.length * 2, p + 3 * t.length));
        grown.set(blob.subarray(0, p));
        blob = grown;
      }
      const { written } = enc.encodeInto(t, blob.subarray(p));
      start[i] = p;
      length[i] = written;
      p += written;
    }
    return new ByteVocab(blob.subarray(0, p), start, length);
  }

  #equals(id: number, buf: Uint8Array, s1: number, e1: number, s2: number, e2: number): boolean {
    const len = this.#length[id] as number;
    if (len !== e1 - s1 + (e2 - s2)) return false;
    const blob = this.#blob;
    let p = this.#start[id] as number;
    for (let i = s1; i < e1; i++) if (blob[p++] !== buf[i]) return false;
    for (let i = s2; i < e2; i++) if (blob[p++] !== buf[i]) return false;
    return true;
  }

  /** The id whose text is the bytes `buf[start, end)`, or -1. */
  lookup(buf: Uint8Array, start: number, end: number): number {
    return this.lookup2(buf, start, end, end, end);
  }

  /** The id whose text is `buf[s1, e1)` followed by `buf[s2, e2)`, or -1. */
  lookup2(buf: Uint8Array, s1: number, e1: number, s2: number, e2: number): number {
    let slot = fnv(buf, s2, e2, fnv(buf, s1, e1, FNV_SEED)) & this.#mask;
    for (;;) {
      const at = this.#table[slot] as number;
      if (at === 0) return -1;
      if (this.#equals(at - 1, buf, s1, e1, s2, e2)) return at - 1;
      slot = (slot + 1) & this.#mask;
    }
  }

  /** The id whose text is `text`, or -1. */
  lookupString(text: string): number {
    const b = utf8(text);
    return this.lookup(b, 0, b.length);
  }

  /** The UTF-8 bytes of token `id` (a view, not a copy: do not write to it). */
  bytes(id: number): Uint8Array {
    const s = this.#start[id] as number;
    return this.#blob.subarray(s, s + (this.#length[id] as number));
  }

  /** Byte length of token `id`'s text. */
  byteLength(id: number): number {
    return this.#length[id] as number;
  }

  /** The text of token `id`, decoded on first use and cached. */
  text(id: number): string {
    let s = this.#strings[id];
    if (s === undefined) {
      s = fromUtf8(this.bytes(id));
      this.#strings[id] = s;
    }
    return s;
  }
}
