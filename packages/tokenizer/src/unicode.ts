/**
 * Unicode and UTF-8 helpers shared by the tokenizers: GPT-2's byte-to-unicode map, the Unicode
 * White_Space class, and UTF-8 sequence lengths.
 *
 * Source: ../shared/spec/llm.md §4.2; openai/gpt-2 `src/encoder.py` `bytes_to_unicode`;
 * Unicode `PropList.txt` (White_Space).
 */

/**
 * GPT-2's byte-to-unicode map (llm.md §4.2 step 3): bytes 0x21–0x7E, 0xA1–0xAC and 0xAE–0xFF map to
 * the code point of the same value; the other 68 bytes, in increasing order, map to U+0100 … U+0143.
 * `BYTE_TO_UNICODE[b]` is the code point for byte `b` (so space → U+0120 `Ġ`, `\n` → U+010A `Ċ`).
 */
export const BYTE_TO_UNICODE: Uint16Array = (() => {
  const out = new Uint16Array(256);
  let next = 256;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    out[b] = printable ? b : next++;
  }
  return out;
})();

/** Inverse of {@link BYTE_TO_UNICODE}: code point (0 … 0x143) → byte, or -1 for code points outside the map. */
export const UNICODE_TO_BYTE: Int16Array = (() => {
  const out = new Int16Array(0x144).fill(-1);
  for (let b = 0; b < 256; b++) out[BYTE_TO_UNICODE[b] as number] = b;
  return out;
})();

/**
 * The Unicode White_Space property as the body of a regex character class: U+0009–000D, 0020, 0085,
 * 00A0, 1680, 2000–200A, 2028, 2029, 202F, 205F, 3000. JavaScript's `\s` differs (it adds U+FEFF and
 * misses U+0085), so the pre-tokenizers use this class (llm.md §4.2 step 2).
 */
export const WHITE_SPACE_CLASS =
  "\\t-\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";

/**
 * Length in bytes of the UTF-8 sequence that starts with `lead`, from its top four bits, as
 * llama.cpp `unicode_len_utf8` reads it (a continuation byte counts as 1).
 */
export function utf8SequenceLength(lead: number): number {
  const hi = lead >> 4;
  return hi < 12 ? 1 : hi < 14 ? 2 : hi === 14 ? 3 : 4;
}

const encoder = new TextEncoder();

/** UTF-8 bytes of `s` (lone surrogates become U+FFFD, as `TextEncoder` does). */
export function utf8(s: string): Uint8Array {
  return encoder.encode(s);
}

const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });

/** Decode UTF-8 bytes; invalid sequences become U+FFFD. A leading BOM is kept. */
export function fromUtf8(bytes: Uint8Array): string {
  return decoder.decode(bytes);
}

/**
 * How many bytes at the end of `bytes[0, end)` form an incomplete but so far valid UTF-8 sequence
 * (0 … 3): the bytes a streaming decoder must hold back until the next token completes them. A lead
 * byte that cannot start a sequence (0x80–0xC1, 0xF5–0xFF) or a wrong second byte makes the tail
 * invalid, and then nothing is held (the decoder emits U+FFFD instead of waiting forever).
 * Source: the Unicode Standard, Table 3-7 (well-formed UTF-8 byte sequences).
 */
export function incompleteUtf8Tail(bytes: Uint8Array, end: number = bytes.length): number {
  for (let k = 1; k <= 3 && k <= end; k++) {
    const b = bytes[end - k] as number;
    if ((b & 0xc0) === 0x80) continue; // continuation byte: look further back
    if (b < 0xc2 || b > 0xf4) return 0; // ASCII or an impossible lead: nothing incomplete
    const need = b < 0xe0 ? 2 : b < 0xf0 ? 3 : 4;
    if (k >= need) return 0; // complete (or over-long run of continuations)
    if (k >= 2) {
      const second = bytes[end - k + 1] as number;
      const lo = b === 0xe0 ? 0xa0 : b === 0xf0 ? 0x90 : 0x80;
      const hi = b === 0xed ? 0x9f : b === 0xf4 ? 0x8f : 0xbf;
      if (second < lo || second > hi) return 0;
    }
    return k;
  }
  return 0;
}
