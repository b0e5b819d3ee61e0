// Every vector of ../shared/models/tokenizer-tests, exactly: llama.cpp's test-tokenizer-0 sets
// (qwen2 and llama-spm, made with Hugging Face tokenizers) and gemma3.hf.out (Hugging Face
// tokenizers.js with the Gemma 3 tokenizer.json), each run on the model file PROVENANCE.md pairs it
// with, with no BOS and no special-token parsing (as test-tokenizer-0 does). A failure lists every
// input that fails, with the ids we made and the ids expected. Then decode(encode(x)) == x on the
// same texts and on seeded random texts.
import { describe, expect, test } from "bun:test";
import { join } from "node:path";
import { tokenizerFromGguf } from "./gguf.ts";
import { HAVE_MODELS, MODELS, NO_MODELS, randomText, readVectors, rng } from "./testing/models.ts";
import type { Tokenizer } from "./tokenizer.ts";

const SETS = [
  {
    name: "qwen2",
    inp: "ggml-vocab-qwen2.gguf.inp",
    out: "ggml-vocab-qwen2.gguf.out",
    model: "synthetic/qwen3-fullvocab-Q4_0.gguf",
  },
  {
    name: "llama-spm",
    inp: "ggml-vocab-llama-spm.gguf.inp",
    out: "ggml-vocab-llama-spm.gguf.out",
    model: "real/llama-2-tiny-random.gguf",
  },
  // gemma3.hf.out holds the ids of the llama-spm .inp texts (PROVENANCE.md, tokenizer-tests/)
  {
    name: "gemma3",
    inp: "ggml-vocab-llama-spm.gguf.inp",
    out: "gemma3.hf.out",
    model: "synthetic/gemma3-fullvocab-Q4_0.gguf",
  },
] as const;

const cache = new Map<string, Tokenizer>();
function tokenizer(model: string): Tokenizer {
  let t = cache.get(model);
  if (t === undefined) {
    t = tokenizerFromGguf(join(MODELS, model));
    cache.set(model, t);
  }
  return t;
}

/** Inputs whose ids differ, as readable lines (empty when all pass). */
function failures(tok: Tokenizer, vectors: readonly { text: string; ids: number[] }[]): string[] {
  const out: string[] = [];
  vectors.forEach(({ text, ids }, i) => {
    const got = tok.encode(text);
    if (got.join(" ") !== ids.join(" "))
      out.push(`#${i} ${JSON.stringify(text)}\n   got  ${got.join(" ")}\n   want ${ids.join(" ")}`);
  });
  return out;
}

describe.skipIf(!HAVE_MODELS)(`tokenizer vectors${HAVE_MODELS ? "" : ` — ${NO_MODELS}`}`, () => {
  for (const set of SETS) {
    test(`${set.name}: every ${set.out} vector on ${set.model}`, () => {
      const vectors = readVectors(set.inp, set.out);
      expect(vectors.length).toBe(46);
      const fails = failures(tokenizer(set.model), vectors);
      expect(`${vectors.length - fails.length}/${vectors.length} pass\n${fails.join("\n")}`).toBe(
        `${vectors.length}/${vectors.length} pass\n`,
      );
    });

    test(`${set.name}: decode(encode(x)) == x for every vector text`, () => {
      const tok = tokenizer(set.model);
      const bad = readVectors(set.inp, set.out)
        .map((v) => v.text)
        .filter((t) => tok.decode(tok.encode(t)) !== t);
      expect(bad).toEqual([]);
    });

    test(`${set.name}: decode(encode(x)) == x on 300 seeded random texts (no '▁' in SentencePiece texts)`, () => {
      const tok = tokenizer(set.model);
      const r = rng(7);
      const bad: string[] = [];
      for (let i = 0; i < 300; i++) {
        let t = randomText(r, 1 + Math.floor(r() * 12));
        // SentencePiece stores spaces as U+2581, so a literal U+2581 in the text decodes to a space:
        // that round trip cannot hold (see README, "Round trips").
        if (tok.model === "llama") t = t.replaceAll("\u2581", "_");
        for (const parseSpecial of [false, true]) {
          if (tok.decode(tok.encode(t, { parseSpecial })) !== t)
            bad.push(`${JSON.stringify(t)} parseSpecial=${parseSpecial}`);
        }
      }
      expect(bad).toEqual([]);
    });
  }
});
