/**
 * Byte-level BPE (GPT-2 style, as Qwen uses it): each pre-tokenized piece is turned into its UTF-8
 * bytes, each byte into the token of its byte-to-unicode character, and then adjacent pairs are
 * merged by rank, lowest first, until no adjacent pair is in the merge table.
 *
 * Merges are held by token id: rank `r` joins ids (a, b) into id `result[r]`, so encoding compares
 * integers and makes no strings. A binary heap keyed by (rank, position) picks the next merge; a
 * popped pair is used only if the two symbols are still adjacent and still the same ids. Ties go to
 * the leftmost pair, as in llama.cpp `llm_tokenizer_bpe_session` and Hugging Face `tokenizers`
 * (`models/bpe/word.rs` `merge_all`).
 *
 * Source: ../shared/spec/llm.md §4.2 steps 3–4; Sennrich et al., "Neural Machine Translation of Rare
 * Words with Subword Units" (arXiv:1508.07909) §3.2.
 */
import { TpError } from "@tp/tensor";
import { BYTE_TO_UNICODE, utf8 } from "./unicode.ts";
import type { ByteVocab } from "./vocab.ts";

/** An open-addressing hash map from an (a, b) pair of non-negative int32 to an int32 value. */
export class PairTable {
  #a: Int32Array;
  #b: Int32Array;
  #v: Int32Array;
  #mask: number;
  #count = 0;

  /** @param expected number of pairs expected (the table grows past it if needed) */
  constructor(expected: number) {
    let cap = 16;
    while (cap < expected * 2) cap *= 2;
    this.#a = new Int32Array(cap).fill(-1);
    this.#b = new Int32Array(cap);
    this.#v = new Int32Array(cap);
    this.#mask = cap - 1;
  }

  /** Number of pairs held. */
  get size(): number {
    return this.#count;
  }

  #slot(a: number, b: number): number {
    return (Math.imul(a, 0x9e3779b1) ^ Math.imul(b + 0x7f4a7c15, 0x85ebca6b)) & this.#mask;
  }

  /** Value of (a, b), or -1. */
  get(a: number, b: number): number {
    let s = this.#slot(a, b);
    for (;;) {
      const ka = this.#a[s] as number;
      if (ka === -1) return -1;
      if (ka === a && this.#b[s] === b) return this.#v[s] as number;
      s = (s + 1) & this.#mask;
    }
  }

  /** Set (a, b) → v unless the pair is already present. @returns false when it was present */
  setIfAbsent(a: number, b: number, v: number): boolean {
    if ((this.#count + 1) * 2 > this.#a.length) this.#grow();
    let s = this.#slot(a, b);
    for (;;) {
      const ka = this.#a[s] as number;
      if (ka === -1) {
        this.#a[s] = a;
        this.#b[s] = b;
        this.#v[s] = v;
        this.#count++;
        return true;
      }
      if (ka === a && this.#b[s] === b) return false;
      s = (s + 1) & this.#mask;
    }
  }

  #grow(): void {
    const [oa, ob, ov] = [this.#a, this.#b, this.#v];
    const cap = oa.length * 2;
    this.#a = new Int32Array(cap).fill(-1);
    this.#b = new Int32Array(cap);
    this.#v = new Int32Array(cap);
    this.#mask = cap - 1;
    this.#count = 0;
    for (let i = 0; i < oa.length; i++) {
      if (oa[i] !== -1) this.setIfAbsent(oa[i] as number, ob[i] as number, ov[i] as number);
    }
  }
}

/** The merge list of a byte-level BPE vocabulary, resolved to token ids. */
export interface BpeMerges {
  /** (left id, right id) → rank (index in the merge list). */
  pairs: PairTable;
  /** [rank] the id of the merged token. */
  result: Int32Array;
  /** Merges left out because one of their three tokens is not in the vocabulary, or repeated. */
  skipped: number;
}

/**
 * Resolve merges given as byte spans `"A B"` (GGUF `tokenizer.ggml.merges`: two mapped strings joined
 * by one ASCII space, which never occurs inside a mapped string).
 * @param spans  one `[start, end)` byte range of `blob` per merge, in rank order
 * @throws TpError E_FORMAT (naming `file`) when a merge has no space
 */
export function mergesFromSpans(
  vocab: ByteVocab,
  blob: Uint8Array,
  start: Uint32Array,
  end: Uint32Array,
  file: string,
): BpeMerges {
  const n = start.length;
  const pairs = new PairTable(n);
  const result = new Int32Array(n).fill(-1);
  let skipped = 0;
  for (let r = 0; r < n; r++) {
    const s = start[r] as number;
    const e = end[r] as number;
    let sp = s;
    while (sp < e && blob[sp] !== 0x20) sp++;
    if (sp === e) {
      throw new TpError("E_FORMAT", `tokenizer.ggml.merges[${r}] has no space between its two tokens`, {
        file,
      });
    }
    const a = vocab.lookup(blob, s, sp);
    const b = vocab.lookup(blob, sp + 1, e);
    const ab = vocab.lookup2(blob, s, sp, sp + 1, e);
    if (a < 0 || b < 0 || ab < 0 || !pairs.setIfAbsent(a, b, r)) {
      skipped++;
      continue;
    }
    result[r] = ab;
  }
  return { pairs, result, skipped };
}

/**
 * Resolve merges given as pairs of token texts (tokenizer.json `model.merges`, either `"A B"` strings
 * or `[A, B]` arrays). A repeated pair keeps its first (lowest) rank, as llama.cpp does.
 * @param idOf token text → id, or -1 (e.g. a lookup in the parsed `model.vocab` object)
 */
export function mergesFromPairs(
  idOf: (text: string) => number,
  merges: readonly (readonly [string, string])[],
): BpeMerges {
  const pairs = new PairTable(merges.length);
  const result = new Int32Array(merges.length).fill(-1);
  let skipped = 0;
  for (let r = 0; r < merges.length; r++) {
    const [left, right] = merges[r] as readonly [string, string];
    const a = idOf(left);
    const b = idOf(right);
    const ab = idOf(left + right);
    if (a < 0 || b < 0 || ab < 0 || !pairs.setIfAbsent(a, b, r)) {
      skipped++;
      continue;
    }
    result[r] = ab;
  }
  return { pairs, result, skipped };
}

/**
 * For each byte, the id of the token whose text is that byte's byte-to-unicode character.
 * @throws TpError E_FORMAT (naming `file`) when one of the 256 is missing (llm.md §4.2 step 4:
 *   "all 256 single bytes are tokens — check at load")
 */
export function byteTokenIds(vocab: ByteVocab, file: string): Int32Array {
  const ids = new Int32Array(256);
  const missing: string[] = [];
  for (let b = 0; b < 256; b++) {
    const id = vocab.lookupString(String.fromCodePoint(BYTE_TO_UNICODE[b] as number));
    if (id < 0) missing.push(`0x${b.toString(16).padStart(2, "0")}`);
    ids[b] = id;
  }
  if (missing.length > 0) {
    throw new TpError(
      "E_FORMAT",
      `byte-level BPE vocabulary lacks the single-byte tokens of ${missing.length} bytes (${missing.slice(0, 8).join(", ")}${missing.length > 8 ? ", …" : ""})`,
      { file },
    );
  }
  return ids;
}

/** rank · 2^32 + position: one f64 heap key that orders by rank, then by position. */
const POS = 4294967296;
const CACHE_LIMIT = 65536;

/** Byte-level BPE over pre-tokenized pieces, with a per-piece cache. */
export class BytePairEncoder {
  readonly #byteIds: Int32Array;
  readonly #pairs: PairTable;
  readonly #result: Int32Array;
  readonly #cache = new Map<string, readonly number[]>();
  #heap = new Float64Array(64);

  /**
   * @param byteIds from {@link byteTokenIds}
   * @param merges  from {@link mergesFromSpans} or {@link mergesFromPairs}
   */
  constructor(byteIds: Int32Array, merges: BpeMerges) {
    this.#byteIds = byteIds;
    this.#pairs = merges.pairs;
    this.#result = merges.result;
  }

  /** Append the ids of one pre-tokenized piece to `out`. */
  encodePiece(piece: string, out: number[]): void {
    const hit = this.#cache.get(piece);
    if (hit !== undefined) {
      for (const id of hit) out.push(id);
      return;
    }
    const ids = this.mergeBytes(utf8(piece));
    if (this.#cache.size >= CACHE_LIMIT) this.#cache.clear();
    this.#cache.set(piece, ids);
    for (const id of ids) out.push(id);
  }

  /** The BPE of one piece given as UTF-8 bytes. */
  mergeBytes(bytes: Uint8Array): number[] {
    const n = bytes.length;
    const ids = new Int32Array(n);
    for (let i = 0; i < n; i++) ids[i] = this.#byteIds[bytes[i] as number] as number;
    if (n < 2) return Array.from(ids);
    const next = new Int32Array(n);
    const prev = new Int32Array(n);
    for (let i = 0; i < n; i++) {
      next[i] = i + 1 < n ? i + 1 : -1;
      prev[i] = i - 1;
    }
    const pairs = this.#pairs;
    if (this.#heap.length < 3 * n) this.#heap = new Float64Array(3 * n);
    const heap = this.#heap;
    let size = 0;
    const push = (key: number) => {
      let i = size++;
      while (i > 0) {
        const parent = (i - 1) >> 1;
        const pk = heap[parent] as number;
        if (pk <= key) break;
        heap[i] = pk;
        i = parent;
      }
      heap[i] = key;
    };
    const pop = (): number => {
      const top = heap[0] as number;
      const last = heap[--size] as number;
      let i = 0;
      for (;;) {
        let c = 2 * i + 1;
        if (c >= size) break;
        if (c + 1 < size && (heap[c + 1] as number) < (heap[c] as number)) c++;
        if ((heap[c] as number) >= last) break;
        heap[i] = heap[c] as number;
        i = c;
      }
      heap[i] = last;
      return top;
    };
    for (let i = 0; i + 1 < n; i++) {
      const r = pairs.get(ids[i] as number, ids[i + 1] as number);
      if (r >= 0) push(r * POS + i);
    }
    while (size > 0) {
      const key = pop();
      const rank = Math.floor(key / POS);
      const left = key - rank * POS;
      const right = next[left] as number;
      // Stale entry: the left symbol was absorbed, or either side changed since the push.
      if (ids[left] === -1 || right < 0 || pairs.get(ids[left] as number, ids[right] as number) !== rank)
        continue;
      ids[left] = this.#result[rank] as number;
      ids[right] = -1;
      const after = next[right] as number;
      next[left] = after;
      if (after >= 0) prev[after] = left;
      const before = prev[left] as number;
      if (before >= 0) {
        const r = pairs.get(ids[before] as number, ids[left] as number);
        if (r >= 0) push(r * POS + before);
      }
      if (after >= 0) {
        const r = pairs.get(ids[left] as number, ids[after] as number);
        if (r >= 0) push(r * POS + left);
      }
    }
    const out: number[] = [];
    for (let i = 0; i >= 0; i = next[i] as number) out.push(ids[i] as number);
    return out;
  }
}
