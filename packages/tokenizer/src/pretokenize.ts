/**
 * Pre-tokenizers of the byte-level BPE vocabularies: the regex that splits text into pieces before
 * BPE runs on each piece (`tokenizer.ggml.pre` in GGUF, the `Split` pre-tokenizer in tokenizer.json).
 *
 * Source: ../shared/spec/llm.md §4.2 step 2; ggml-org/llama.cpp `src/llama-vocab.cpp`
 * (`LLAMA_VOCAB_PRE_TYPE_QWEN2`, `LLAMA_VOCAB_PRE_TYPE_QWEN35`); the Qwen2/Qwen3 tokenizer.json
 * `pre_tokenizer` (HF `Split`, behaviour `Isolated`).
 */
import { TpError } from "@tp/tensor";
import { WHITE_SPACE_CLASS } from "./unicode.ts";

const WS = WHITE_SPACE_CLASS;

/**
 * Build the Qwen family regex. JavaScript has no inline `(?i:…)`, so the contractions are spelled
 * with explicit case classes; `\s`/`\S` are the Unicode White_Space class (not JavaScript's `\s`).
 * @param marks true for qwen35: combining marks (`\p{M}`) join letter runs and leave the symbol class
 */
function qwenRegex(marks: boolean): RegExp {
  const letters = marks ? "[\\p{L}\\p{M}]" : "\\p{L}";
  const notWordOrSpace = marks ? `[^${WS}\\p{L}\\p{M}\\p{N}]` : `[^${WS}\\p{L}\\p{N}]`;
  return new RegExp(
    [
      "'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]", // 1. contractions
      `[^\\r\\n\\p{L}\\p{N}]?${letters}+`, // 2. optional non-letter/digit/newline + letter run
      "\\p{N}", // 3. one number character (digits are never grouped)
      ` ?${notWordOrSpace}+[\\r\\n]*`, // 4. optional space, symbol run, trailing newlines
      `[${WS}]*[\\r\\n]+`, // 5. whitespace run ending in newlines
      `[${WS}]+(?![^${WS}])`, // 6. whitespace not followed by a non-space (\s+(?!\S))
      `[${WS}]+`, // 7. any other whitespace run
    ].join("|"),
    "gu",
  );
}

/**
 * Pre-tokenizer regexes by `tokenizer.ggml.pre` name. `qwen2`: Qwen2, Qwen2.5, Qwen3, Qwen3-VL;
 * `qwen35`: Qwen 3.5 / 3.6 (llm.md §4.2).
 */
export const PRE_TOKENIZERS: Readonly<Record<string, RegExp>> = {
  qwen2: qwenRegex(false),
  qwen35: qwenRegex(true),
};

/**
 * The `Split` patterns of Hugging Face tokenizer.json files, mapped to our pre-tokenizer names.
 * These are the verbatim strings of the Qwen2/Qwen3 and Qwen 3.5 tokenizer.json files.
 */
export const HF_SPLIT_PATTERNS: Readonly<Record<string, string>> = {
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+":
    "qwen2",
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+":
    "qwen35",
};

/**
 * The regex of pre-tokenizer `name`.
 * @throws TpError E_UNSUPPORTED for an unknown name, listing the known ones
 */
export function preTokenizerRegex(name: string, where = ""): RegExp {
  const re = PRE_TOKENIZERS[name];
  if (re === undefined) {
    throw new TpError(
      "E_UNSUPPORTED",
      `unknown BPE pre-tokenizer '${name}'${where}; known: ${Object.keys(PRE_TOKENIZERS).join(", ")}`,
    );
  }
  return re;
}

/**
 * Split `text` into pieces with `re` (a global regex). Text between matches, if any, is kept as its
 * own piece (HF `Split` with behaviour `Isolated`); with the Qwen regexes every character is covered
 * by some alternative, so there is none. Concatenating the pieces gives `text` back.
 * @returns pieces in order, none empty
 */
export function preTokenize(text: string, re: RegExp): string[] {
  const out: string[] = [];
  let last = 0;
  re.lastIndex = 0;
  for (let m = re.exec(text); m !== null; m = re.exec(text)) {
    const s = m[0];
    if (s.length === 0) {
      re.lastIndex++; // no alternative matches the empty string, but never loop forever
      continue;
    }
    if (m.index > last) out.push(text.slice(last, m.index));
    out.push(s);
    last = m.index + s.length;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}
