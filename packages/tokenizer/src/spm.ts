/**
 * SentencePiece-style BPE with byte fallback (GGUF `tokenizer.ggml.model = llama`: Llama 2, Gemma 3),
 * as llama.cpp's `llm_tokenizer_spm_session` runs it:
 *
 * 1. the fragment's spaces become `▁` (U+2581) and it is split into UTF-8 characters;
 * 2. every adjacent pair whose concatenation is a vocabulary piece goes into a priority queue keyed by
 *    that piece's score (highest first; ties → the pair further left);
 * 3. pop; skip the entry if either side changed since it was pushed; merge; push the new pairs with
 *    the left and right neighbours;
 * 4. each remaining symbol becomes its piece id, or, when it is not a piece (a single character the
 *    vocabulary lacks), its UTF-8 bytes as `<0xNN>` BYTE tokens (or UNK when those are missing).
 *
 * Works on UTF-8 bytes throughout: a symbol is a byte range of the escaped fragment, and a candidate
 * pair is looked up by its bytes, so no strings are made.
 *
 * Source: ../shared/spec/llm.md §4.3; ggml-org/llama.cpp `src/llama-vocab.cpp`
 * (`llm_tokenizer_spm_session::tokenize`, `try_add_bigram`, `resegment`, `llama_escape_whitespace`).
 */
import { utf8, utf8SequenceLength } from "./unicode.ts";
import type { ByteVocab } from "./vocab.ts";

/** `<0xNN>` piece ids by byte (llama.cpp `byte_to_token`), falling back to the byte as a one-character piece, else -1. */
export function spmByteTokenIds(vocab: ByteVocab): Int32Array {
  const ids = new Int32Array(256).fill(-1);
  for (let b = 0; b < 256; b++) {
    let id = vocab.lookupString(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`);
    if (id < 0) id = vocab.lookup(Uint8Array.of(b), 0, 1);
    ids[b] = id;
  }
  return ids;
}

/** Score-ordered pair merging over a vocabulary with per-piece scores. */
export class SentencePieceEncoder {
  readonly #vocab: ByteVocab;
  readonly #scores: Float32Array;
  readonly #byteIds: Int32Array;
  readonly #unk: number;
  // The work queue: parallel arrays, a binary max-heap on (score, then smaller left).
  #hScore = new Float64Array(64);
  #hLeft = new Int32Array(64);
  #hRight = new Int32Array(64);
  #hSize = new Int32Array(64);

  /**
   * @param scores [vocab.size] piece scores (higher merges first)
   * @param byteIds from {@link spmByteTokenIds}
   * @param unk the UNK id for bytes without a piece, or -1 (then such bytes are dropped)
   */
  constructor(vocab: ByteVocab, scores: Float32Array, byteIds: Int32Array, unk: number) {
    this.#vocab = vocab;
    this.#scores = scores;
    this.#byteIds = byteIds;
    this.#unk = unk;
  }

  /** Append the ids of one raw-text fragment (spaces not yet escaped) to `out`. */
  encodeFragment(text: string, out: number[]): void {
    const bytes = utf8(text.replaceAll(" ", "\u2581"));
    const total = bytes.length;
    if (total === 0) return;
    // Symbols: one per UTF-8 character; a symbol's bytes are bytes[start, start + len).
    const start = new Int32Array(total);
    const len = new Int32Array(total);
    let n = 0;
    for (let off = 0; off < total; n++) {
      const l = Math.min(utf8SequenceLength(bytes[off] as number), total - off);
      start[n] = off;
      len[n] = l;
      off += l;
    }
    const next = new Int32Array(n);
    const prev = new Int32Array(n);
    for (let i = 0; i < n; i++) {
      next[i] = i + 1 < n ? i + 1 : -1;
      prev[i] = i - 1;
    }
    if (this.#hScore.length < 3 * n) {
      const cap = 3 * n;
      this.#hScore = new Float64Array(cap);
      this.#hLeft = new Int32Array(cap);
      this.#hRight = new Int32Array(cap);
      this.#hSize = new Int32Array(cap);
    }
    const hScore = this.#hScore;
    const hLeft = this.#hLeft;
    const hRight = this.#hRight;
    const hSize = this.#hSize;
    let size = 0;
    // a before b: higher score, then smaller left (llama.cpp llm_bigram_spm::comparator).
    const before = (sa: number, la: number, sb: number, lb: number) => sa > sb || (sa === sb && la < lb);
    const vocab = this.#vocab;
    const scores = this.#scores;
    const tryAdd = (left: number, right: number) => {
      if (left < 0 || right < 0) return;
      const s = start[left] as number;
      const bigramSize = (len[left] as number) + (len[right] as number);
      const id = vocab.lookup(bytes, s, s + bigramSize);
      if (id < 0) return;
      const score = scores[id] as number;
      let i = size++;
      while (i > 0) {
        const p = (i - 1) >> 1;
        if (!before(score, left, hScore[p] as number, hLeft[p] as number)) break;
        hScore[i] = hScore[p] as number;
        hLeft[i] = hLeft[p] as number;
        hRight[i] = hRight[p] as number;
        hSize[i] = hSize[p] as number;
        i = p;
      }
      hScore[i] = score;
      hLeft[i] = left;
      hRight[i] = right;
      hSize[i] = bigramSize;
    };
    for (let i = 1; i < n; i++) tryAdd(i - 1, i);
    while (size > 0) {
      const left = hLeft[0] as number;
      const right = hRight[0] as number;
      const bigramSize = hSize[0] as number;
      // pop: move the last entry down from the root
      size--;
      const ls = hScore[size] as number;
      const ll = hLeft[size] as number;
      const lr = hRight[size] as number;
      const lz = hSize[size] as number;
      let i = 0;
      for (;;) {
        let c = 2 * i + 1;
        if (c >= size) break;
        if (
          c + 1 < size &&
          before(hScore[c + 1] as number, hLeft[c + 1] as number, hScore[c] as number, hLeft[c] as number)
        )
          c++;
        if (!before(hScore[c] as number, hLeft[c] as number, ls, ll)) break;
        hScore[i] = hScore[c] as number;
        hLeft[i] = hLeft[c] as number;
        hRight[i] = hRight[c] as number;
        hSize[i] = hSize[c] as number;
        i = c;
      }
      hScore[i] = ls;
      hLeft[i] = ll;
      hRight[i] = lr;
      hSize[i] = lz;
      // If one of the symbols already got merged, skip it.
      const nl = len[left] as number;
      const nr = len[right] as number;
      if (nl === 0 || nr === 0 || nl + nr !== bigramSize) continue;
      len[left] = nl + nr;
      len[right] = 0;
      const after = next[right] as number;
      next[left] = after;
      if (after >= 0) prev[after] = left;
      tryAdd(prev[left] as number, left);
      tryAdd(left, after);
    }
    for (let i = 0; i >= 0; i = next[i] as number) {
      const s = start[i] as number;
      const e = s + (len[i] as number);
      const id = vocab.lookup(bytes, s, e);
      if (id >= 0) {
        out.push(id);
        continue;
      }
      for (let j = s; j < e; j++) {
        const b = this.#byteIds[bytes[j] as number] as number;
        if (b >= 0) out.push(b);
        else if (this.#unk >= 0) out.push(this.#unk);
      }
    }
  }
}
