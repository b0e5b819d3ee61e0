/**
 * Test helpers (not exported from the package): where ../shared/models is, the tokenizer vector
 * files, and a seeded random generator.
 */
import { existsSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";

/** `../shared` beside the repository root (CI clones the repo elsewhere, with shared/ beside it). */
export const SHARED = resolve(import.meta.dir, "../../../../../shared");
/** The small GGUF models of ../shared/models (see its PROVENANCE.md). */
export const MODELS = join(SHARED, "models");
/** True when ../shared/models is present. */
export const HAVE_MODELS = existsSync(join(MODELS, "PROVENANCE.md"));
/** Why model tests skip. */
export const NO_MODELS = `skipped: ${MODELS} is absent (the shared models folder is not beside this checkout)`;

/** One test text and the ids it must encode to. */
export interface Vector {
  text: string;
  ids: number[];
}

/**
 * Read a llama.cpp test-tokenizer-0 vector set: texts separated by `\n__ggml_vocab_test__\n` (each
 * text is followed by one separator), and one line of space-separated ids per text.
 * Source: ggml-org/llama.cpp `tests/test-tokenizer-0.cpp`.
 */
export function readVectors(inp: string, out: string): Vector[] {
  const texts = readFileSync(join(MODELS, "tokenizer-tests", inp), "utf8").split("\n__ggml_vocab_test__\n");
  texts.pop(); // after the last separator
  const lines = readFileSync(join(MODELS, "tokenizer-tests", out), "utf8").split("\n");
  if (lines.length < texts.length) throw new Error(`${out}: ${lines.length} lines for ${texts.length} texts`);
  return texts.map((text, i) => {
    const line = (lines[i] as string).trim();
    return { text, ids: line === "" ? [] : line.split(/\s+/).map(Number) };
  });
}

/** mulberry32: a small seeded PRNG returning floats in [0, 1). */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Pieces that random test texts are made of: ASCII words, contractions, digits, whitespace runs, CJK, emoji, combining marks, symbols. */
const PARTS = [
  "Hello",
  " world",
  "the",
  " The",
  "'s",
  "'LL",
  " don't",
  "I'm",
  "3",
  "42",
  "1234567",
  " ",
  "  ",
  "   ",
  "\t",
  "\n",
  "\n\n",
  "\r\n",
  " \n ",
  "\u00a0",
  "\u3000",
  "\u0085",
  "你好",
  "世界",
  "こんにちは",
  "한국어",
  "🦙",
  "😀",
  "👍🏽",
  "🇫🇷",
  "e\u0301",
  "Äpfel",
  "naïve",
  "ß",
  "Ωμέγα",
  "привет",
  "!!",
  "...",
  "?!",
  "---",
  "()",
  "{}",
  "<a>",
  "</b>",
  "&amp;",
  "#",
  "$",
  "€",
  "\u2581",
  "x",
  "y_z",
  "CamelCase",
  "snake_case",
  "\u200b",
  "\u0000",
  "\u007f",
  "عربى",
  "हिन्दी",
  "ไทย",
];

/** A random text of `n` parts from {@link PARTS}. */
export function randomText(r: () => number, n: number): string {
  let s = "";
  for (let i = 0; i < n; i++) s += PARTS[Math.floor(r() * PARTS.length)];
  return s;
}
