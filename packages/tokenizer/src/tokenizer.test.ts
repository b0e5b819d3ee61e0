// Hand-derived cases for both encoders on tiny vocabularies built here, then the behaviour of the
// real vocabularies in ../shared/models: special tokens, BOS/EOS, end-of-generation sets, decoding
// rules, streaming, errors, and speed.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  GgufArray,
  type GgufKv,
  type GgufKvInput,
  GgufMetadata,
  ggufKv,
  ggufTypeId,
  openGguf,
  writeGguf,
} from "@tp/formats";
import { TpError } from "@tp/tensor";
import { tokenizerFromGguf } from "./gguf.ts";
import { PRE_TOKENIZERS, preTokenize } from "./pretokenize.ts";
import { HAVE_MODELS, MODELS, NO_MODELS, randomText, rng } from "./testing/models.ts";
import type { Tokenizer } from "./tokenizer.ts";
import { BYTE_TO_UNICODE, incompleteUtf8Tail, utf8 } from "./unicode.ts";
import { TOKEN_TYPE } from "./vocab.ts";

const tmp = mkdtempSync(join(tmpdir(), "tp-tokenizer-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

/** Metadata held in memory (arrays built with GgufArray.of, so the no-raw-bytes path is used). */
function metadata(kvs: GgufKvInput[], file = "mem.gguf"): GgufMetadata {
  const entries = new Map<string, GgufKv>(
    kvs.map((kv) => [kv.key, { key: kv.key, type: ggufTypeId(kv.type), value: kv.value, offset: 0 }]),
  );
  return new GgufMetadata(entries, file);
}

const byteChars = Array.from(BYTE_TO_UNICODE, (cp) => String.fromCodePoint(cp));

/** A gpt2/qwen2 vocabulary: the 256 byte characters, then `extra` tokens, then merges. */
function bpeMeta(extra: string[], merges: string[], more: GgufKvInput[] = []): GgufKvInput[] {
  const tokens = [...byteChars, ...extra];
  return [
    ggufKv("tokenizer.ggml.model", "str", "gpt2"),
    ggufKv("tokenizer.ggml.pre", "str", "qwen2"),
    ggufKv("tokenizer.ggml.tokens", "arr", GgufArray.of("str", tokens)),
    ggufKv("tokenizer.ggml.merges", "arr", GgufArray.of("str", merges)),
    ...more,
  ];
}

/** A llama (SentencePiece) vocabulary from [piece, score, type] rows. */
function spmMeta(rows: [string, number, number][], more: GgufKvInput[] = []): GgufKvInput[] {
  return [
    ggufKv("tokenizer.ggml.model", "str", "llama"),
    ggufKv(
      "tokenizer.ggml.tokens",
      "arr",
      GgufArray.of(
        "str",
        rows.map((r) => r[0]),
      ),
    ),
    ggufKv(
      "tokenizer.ggml.scores",
      "arr",
      GgufArray.of(
        "f32",
        rows.map((r) => r[1]),
      ),
    ),
    ggufKv(
      "tokenizer.ggml.token_type",
      "arr",
      GgufArray.of(
        "i32",
        rows.map((r) => r[2]),
      ),
    ),
    ...more,
  ];
}

function thrown(f: () => unknown): TpError {
  try {
    f();
  } catch (e) {
    if (e instanceof TpError) return e;
    throw e;
  }
  throw new Error("expected a TpError, none was thrown");
}

describe("byte-level BPE on a hand-made vocabulary", () => {
  // ids: bytes 0..255 in byte-to-unicode order of BYTE_TO_UNICODE index, then 256 "ab", 257 "bc",
  // 258 "abc", 259 "aa", 260 "aaaa", 261 "Ġa"
  const tok = tokenizerFromGguf(
    metadata(bpeMeta(["ab", "bc", "abc", "aa", "aaaa", "Ġa"], ["a b", "b c", "ab c", "a a", "aa aa", "Ġ a"])),
  );
  const b = (c: string) => c.charCodeAt(0); // byte id == byte value (tokens 0..255 are the byte chars in byte order)

  test("the lowest-ranked pair merges first", () => {
    // "abc": (a,b) rank 0 and (b,c) rank 1 → "ab" + "c" → (ab,c) rank 2 → "abc"
    expect(tok.encode("abc")).toEqual([258]);
    // "bca": (b,c) rank 1 → "bc", "a"; no merge "bc a"
    expect(tok.encode("bca")).toEqual([257, b("a")]);
  });

  test("equal ranks merge leftmost first", () => {
    // "aaa": (a,a) at 0 and at 1 both rank 3; the left one wins → "aa" "a"
    expect(tok.encode("aaa")).toEqual([259, b("a")]);
    // "aaaa": → "aa" "aa" → rank 4 → "aaaa"; "aaaaa" → "aaaa" "a"
    expect(tok.encode("aaaa")).toEqual([260]);
    expect(tok.encode("aaaaa")).toEqual([260, b("a")]);
  });

  test("the pre-tokenizer splits before BPE: ' a' is one piece, 'a a' is two", () => {
    expect(tok.encode(" a")).toEqual([261]);
    expect(tok.encode("a a")).toEqual([b("a"), 261]);
    expect(tok.encode("\n")).toEqual([BYTE_TO_UNICODE.indexOf(0x10a)]);
  });

  test("every byte has a token: text of any script encodes and decodes back", () => {
    const s = "Grüße 🦙 \u0000\u00ff";
    expect(tok.decode(tok.encode(s))).toBe(s);
    expect(tok.encode("é")).toEqual([0xc3, 0xa9]);
  });

  test("a vocabulary without its 256 byte tokens is E_FORMAT", () => {
    const kvs = bpeMeta([], []);
    kvs[2] = ggufKv("tokenizer.ggml.tokens", "arr", GgufArray.of("str", byteChars.slice(1)));
    const e = thrown(() => tokenizerFromGguf(metadata(kvs, "nobytes.gguf")));
    expect(e.code).toBe("E_FORMAT");
    expect(e.message).toContain("nobytes.gguf");
  });
});

describe("SentencePiece BPE on a hand-made vocabulary", () => {
  const N = TOKEN_TYPE.NORMAL;
  const rows: [string, number, number][] = [
    ["<unk>", 0, TOKEN_TYPE.UNKNOWN], // 0
    ["<s>", 0, TOKEN_TYPE.CONTROL], // 1
    ["</s>", 0, TOKEN_TYPE.CONTROL], // 2
    ["<0x63>", 0, TOKEN_TYPE.BYTE], // 3: 'c'
    ["▁", -1, N], // 4
    ["a", -2, N], // 5
    ["b", -3, N], // 6
    ["ab", -5, N], // 7
    ["ba", -4, N], // 8
    ["▁a", -6, N], // 9
    ["▁ab", -7, N], // 10
    ["<0xC3>", 0, TOKEN_TYPE.BYTE], // 11
    ["<0xA9>", 0, TOKEN_TYPE.BYTE], // 12
    ["<sep>", 0, TOKEN_TYPE.USER_DEFINED], // 13
  ];
  const tok = tokenizerFromGguf(metadata(spmMeta(rows)));

  test("the highest-scoring pair merges first", () => {
    // "aba" with the space prefix: ▁ a b a. Pairs: ▁a −6, ab −5, ba −4 → "ba" first;
    // then ▁a −6 (a,ba: no piece) → "▁a" "ba"
    expect(tok.encode("aba")).toEqual([9, 8]);
    // "ab": ▁ a b → ab −5 beats ▁a −6 → ▁ ab → "▁ab" −7 → one piece
    expect(tok.encode("ab")).toEqual([10]);
  });

  test("equal scores merge leftmost first", () => {
    const t = tokenizerFromGguf(
      metadata(
        spmMeta(
          [
            ["<unk>", 0, TOKEN_TYPE.UNKNOWN],
            ["<s>", 0, TOKEN_TYPE.CONTROL],
            ["</s>", 0, TOKEN_TYPE.CONTROL],
            ["x", -1, N],
            ["xx", -2, N],
          ],
          [ggufKv("tokenizer.ggml.add_space_prefix", "bool", false)],
        ),
      ),
    );
    expect(t.encode("xxx")).toEqual([4, 3]);
  });

  test("characters without a piece fall back to <0xNN> bytes, or to UNK when a byte piece is missing", () => {
    // "c" → <0x63>; "é" = C3 A9 → <0xC3> <0xA9>; "d" has no byte piece → <unk>
    expect(tok.encode("c")).toEqual([4, 3]);
    expect(tok.encode("é")).toEqual([4, 11, 12]);
    expect(tok.encode("d")).toEqual([4, 0]);
    expect(tok.decode([4, 11, 12])).toBe("é");
  });

  test("add_space_prefix: a space before the first fragment and after each special token, removed again by decode", () => {
    expect(tok.encode("a<sep>a")).toEqual([9, 13, 9]);
    expect(tok.decode([9, 13, 9])).toBe("a<sep>a");
    expect(tok.encode("<s>a", { parseSpecial: true })).toEqual([1, 9]);
    expect(tok.decode([1, 9])).toBe("<s>a");
    expect(tok.decode([1, 9], { skipSpecial: true })).toBe("a");
    expect(tok.encode("a", { addSpecial: true })).toEqual([1, 9]); // llama default: add_bos
  });

  test("defaults of a llama vocabulary without special-id keys: bos 1, eos 2, unk 0 (as llama.cpp)", () => {
    expect(tok.special).toEqual({ bos: 1, eos: 2, unk: 0 });
    expect([...tok.eog]).toEqual([2]);
    expect(tok.addBos).toBe(true);
    expect(tok.addEos).toBe(false);
  });
});

describe("pre-tokenizer regexes", () => {
  test("qwen2 splits off combining marks; qwen35 keeps them in the letter run", () => {
    expect(preTokenize("cafe\u0301 ok", PRE_TOKENIZERS.qwen2 as RegExp)).toEqual(["cafe", "\u0301", " ok"]);
    expect(preTokenize("cafe\u0301 ok", PRE_TOKENIZERS.qwen35 as RegExp)).toEqual(["cafe\u0301", " ok"]);
  });

  test("digits one by one, contractions, whitespace before a word keeps one space for the word", () => {
    const re = PRE_TOKENIZERS.qwen2 as RegExp;
    expect(preTokenize("x 123", re)).toEqual(["x", " ", "1", "2", "3"]);
    expect(preTokenize("I'LL don't", re)).toEqual(["I", "'LL", " don", "'t"]);
    expect(preTokenize("a   b", re)).toEqual(["a", "  ", " b"]);
    expect(preTokenize("a \n\n b", re)).toEqual(["a", " \n\n", " b"]);
    expect(preTokenize("end   ", re)).toEqual(["end", "   "]);
  });

  test("\\s is Unicode White_Space: U+0085 is a space, U+FEFF is not", () => {
    const re = PRE_TOKENIZERS.qwen2 as RegExp;
    expect(preTokenize("a\u0085\u0085b", re)).toEqual(["a", "\u0085", "\u0085b"]);
    expect(preTokenize("a\ufeffb", re)).toEqual(["a", "\ufeffb"]);
  });
});

describe("streaming decode", () => {
  test("incompleteUtf8Tail holds back only valid unfinished sequences", () => {
    const tail = (...b: number[]) => incompleteUtf8Tail(Uint8Array.from(b));
    expect(tail(0x41)).toBe(0);
    expect(tail(0x41, 0xf0, 0x9f)).toBe(2);
    expect(tail(0xf0, 0x9f, 0xa6)).toBe(3);
    expect(tail(0xf0, 0x9f, 0xa6, 0x99)).toBe(0);
    expect(tail(0xe2, 0x96)).toBe(2);
    expect(tail(0xc3)).toBe(1);
    expect(tail(0xff)).toBe(0); // impossible lead: emitted as U+FFFD, not held
    expect(tail(0xe0, 0x80)).toBe(0); // over-long form: invalid second byte
    expect(tail(0x80)).toBe(0);
  });
});

describe.skipIf(!HAVE_MODELS)(`the shared vocabularies${HAVE_MODELS ? "" : ` — ${NO_MODELS}`}`, () => {
  const load = (f: string) => tokenizerFromGguf(join(MODELS, f));
  let qwen: Tokenizer;
  let gemma: Tokenizer;
  let llama2: Tokenizer;
  test("load", () => {
    qwen = load("synthetic/qwen3-fullvocab-Q4_0.gguf");
    gemma = load("synthetic/gemma3-fullvocab-Q4_0.gguf");
    llama2 = load("real/llama-2-tiny-random.gguf");
    expect([qwen.model, qwen.pre, qwen.vocabSize]).toEqual(["gpt2", "qwen2", 151936]);
    expect([gemma.model, gemma.vocabSize, gemma.addSpacePrefix]).toEqual(["llama", 262144, false]);
    expect([llama2.model, llama2.vocabSize, llama2.addSpacePrefix]).toEqual(["llama", 32000, true]);
  });

  test("Qwen3 special ids resolve by text to the ids llm.md §4.1 lists", () => {
    const ids = Object.fromEntries(
      [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|vision_start|>",
        "<|image_pad|>",
        "<tool_call>",
        "<think>",
        "</think>",
      ].map((t) => [t, qwen.tokenId(t)]),
    );
    expect(ids).toEqual({
      "<|endoftext|>": 151643,
      "<|im_start|>": 151644,
      "<|im_end|>": 151645,
      "<|vision_start|>": 151652,
      "<|image_pad|>": 151655,
      "<tool_call>": 151657,
      "<think>": 151667,
      "</think>": 151668,
    });
    expect(qwen.tokenType(151644)).toBe("control");
    expect(qwen.tokenType(151667)).toBe("user_defined");
    expect(qwen.tokenType(151700)).toBe("unused");
  });

  test("user text never becomes a CONTROL token unless parseSpecial; USER_DEFINED tokens always match", () => {
    const text = "<|im_start|>user\nhi<|im_end|><think>";
    const plain = qwen.encode(text);
    expect(plain).not.toContain(151644);
    expect(plain).not.toContain(151645);
    expect(plain.at(-1)).toBe(151667); // <think> is USER_DEFINED
    expect(qwen.decode(plain)).toBe(text);
    const parsed = qwen.encode(text, { parseSpecial: true });
    expect(parsed).toEqual([151644, ...qwen.encode("user\nhi"), 151645, 151667]);
    expect(qwen.decode(parsed)).toBe(text);
    expect(qwen.decode(parsed, { skipSpecial: true })).toBe("user\nhi<think>");
  });

  test("Gemma: '<start_of_turn>' is CONTROL, '\\n' runs and '<b>' are USER_DEFINED", () => {
    expect(gemma.encode("<start_of_turn>user\n", { parseSpecial: true })).toEqual([
      105,
      gemma.tokenId("user") as number,
      107,
    ]);
    expect(gemma.encode("<start_of_turn>")).not.toContain(105);
    expect(gemma.encode("<b>x\n\n")).toEqual([
      gemma.tokenId("<b>") as number,
      gemma.tokenId("x") as number,
      108,
    ]);
  });

  test("addSpecial follows add_bos/add_eos: Qwen adds nothing, Gemma and Llama 2 add BOS", () => {
    expect(qwen.encode("Hi", { addSpecial: true })).toEqual(qwen.encode("Hi"));
    expect(gemma.encode("Hi", { addSpecial: true })).toEqual([2, ...gemma.encode("Hi")]);
    expect(llama2.encode("Hello", { addSpecial: true })).toEqual([1, 15043]);
    expect(llama2.encode("")).toEqual([]);
    expect(llama2.encode("", { addSpecial: true })).toEqual([1]);
  });

  test("end-of-generation sets (llm.md §4.4)", () => {
    expect([...qwen.eog].sort((a, b) => a - b)).toEqual([151643, 151645]);
    expect([...gemma.eog].sort((a, b) => a - b)).toEqual([1, 106]);
    expect([...llama2.eog]).toEqual([2]);
    expect(qwen.isEog(151645)).toBe(true);
    expect(qwen.isEog(151644)).toBe(false);
  });

  test("decoding: Llama 2 drops the space it prefixed, Gemma turns '▁' runs into spaces, UNUSED is empty", () => {
    expect(llama2.decode([1, 15043, 3186])).toBe("<s>Hello world");
    expect(llama2.decode([1, 15043, 3186], { skipSpecial: true })).toBe("Hello world");
    expect(llama2.decode([15043, 1, 15043])).toBe("Hello<s>Hello");
    expect(gemma.decode([139, 9259])).toBe("   Hello");
    expect(qwen.decode([151700])).toBe("");
    expect(qwen.tokenText(220)).toBe("Ġ");
    expect(qwen.decode([220])).toBe(" ");
  });

  test("round trips that cannot hold: a literal U+2581 in SentencePiece text comes back as a space", () => {
    expect(gemma.decode(gemma.encode("a\u2581b"))).toBe("a b");
    expect(llama2.decode(llama2.encode("a\u2581b"))).toBe("a b");
    // lone surrogates are not UTF-8: TextEncoder writes U+FFFD
    expect(qwen.decode(qwen.encode("x\ud800y"))).toBe("x\ufffdy");
  });

  test("the stream decoder emits only complete characters, and its output equals decode", () => {
    // 🦙 falls back to 4 byte tokens in Llama 2 (vector "this is 🦙.cpp")
    const ids = llama2.encode("🦙!");
    expect(ids).toEqual([29871, 243, 162, 169, 156, 29991]);
    const s = llama2.streamDecoder();
    expect(ids.map((id) => s.push(id))).toEqual(["", "", "", "", "🦙", "!"]);
    expect(s.flush()).toBe("");
    const cut = llama2.streamDecoder();
    expect(cut.push(243) + cut.push(162)).toBe("");
    expect(cut.flush()).toBe("\ufffd");
    const r = rng(3);
    for (const tok of [qwen, gemma, llama2]) {
      for (let i = 0; i < 50; i++) {
        // random ids (many are partial byte tokens) and real text
        const ids2 =
          i % 2 === 0
            ? Array.from({ length: 20 }, () => Math.floor(r() * tok.vocabSize))
            : tok.encode(randomText(r, 8));
        const sd = tok.streamDecoder();
        const streamed = ids2.map((id) => sd.push(id)).join("") + sd.flush();
        expect(streamed).toBe(tok.decode(ids2));
      }
    }
  });

  test("ids outside the vocabulary are E_ARG", () => {
    expect(thrown(() => qwen.decode([151936])).code).toBe("E_ARG");
    expect(thrown(() => qwen.tokenText(-1)).code).toBe("E_ARG");
  });

  test("the 151,936-token Qwen vocabulary loads; encoding is linear", () => {
    const g = openGguf(join(MODELS, "synthetic/qwen3-fullvocab-Q4_0.gguf"));
    const tok = tokenizerFromGguf(g);
    g.close();
    // 100× the text takes under 1000× the time: linear is 100×, quadratic would be 10,000×, so the
    // bound holds on a busy machine and still catches a quadratic step. Best of 5 after a warm-up.
    // Mixed text, one 100k-letter piece (one BPE word), and a 100k-space run (regex backtracking).
    const time = (s: string) => {
      let best = Number.POSITIVE_INFINITY;
      for (let i = 0; i < 5; i++) {
        const t = performance.now();
        tok.encode(s);
        best = Math.min(best, performance.now() - t);
      }
      return best;
    };
    const unit = randomText(rng(11), 400);
    for (const [small, large] of [
      [unit.repeat(3), unit.repeat(300)],
      ["a".repeat(1000), "a".repeat(100_000)],
      [`${" ".repeat(1000)}x`, `${" ".repeat(100_000)}x`],
    ] as const) {
      time(large);
      const ratio = time(large) / Math.max(time(small), 0.05);
      expect(ratio).toBeLessThan(1000);
    }
  });
});

describe("errors", () => {
  test("a GGUF without tokenizer metadata is E_FORMAT naming the file", () => {
    const path = join(tmp, "no-tokenizer.gguf");
    writeGguf(path, [ggufKv("general.architecture", "str", "llama")], []);
    const e = thrown(() => tokenizerFromGguf(path));
    expect(e.code).toBe("E_FORMAT");
    expect(e.message).toContain(path);
    expect(e.message).toContain("tokenizer.ggml.model");
  });

  test("an unknown tokenizer model is E_UNSUPPORTED listing the known ones", () => {
    const e = thrown(() =>
      tokenizerFromGguf(metadata([ggufKv("tokenizer.ggml.model", "str", "bert")], "b.gguf")),
    );
    expect(e.code).toBe("E_UNSUPPORTED");
    expect(e.message).toContain("'bert'");
    expect(e.message).toContain("gpt2");
    expect(e.message).toContain("llama");
  });

  test("an unknown or missing pre-tokenizer is E_UNSUPPORTED listing qwen2 and qwen35", () => {
    const kvs = bpeMeta([], []);
    kvs[1] = ggufKv("tokenizer.ggml.pre", "str", "deepseek-llm");
    const e = thrown(() => tokenizerFromGguf(metadata(kvs)));
    expect(e.code).toBe("E_UNSUPPORTED");
    expect(e.message).toContain("qwen2, qwen35");
    const e2 = thrown(() =>
      tokenizerFromGguf(metadata(bpeMeta([], []).filter((kv) => kv.key !== "tokenizer.ggml.pre"))),
    );
    expect(e2.code).toBe("E_UNSUPPORTED");
  });

  test("arrays of the wrong length and special ids outside the vocabulary are E_FORMAT", () => {
    const rows: [string, number, number][] = [
      ["<unk>", 0, 2],
      ["<s>", 0, 3],
      ["</s>", 0, 3],
    ];
    const short = spmMeta(rows);
    short[2] = ggufKv("tokenizer.ggml.scores", "arr", GgufArray.of("f32", [0, 0]));
    expect(thrown(() => tokenizerFromGguf(metadata(short))).code).toBe("E_FORMAT");
    const badEos = spmMeta(rows, [ggufKv("tokenizer.ggml.eos_token_id", "u32", 99)]);
    const e = thrown(() => tokenizerFromGguf(metadata(badEos, "eos.gguf")));
    expect(e.code).toBe("E_FORMAT");
    expect(e.message).toContain("eos_token_id");
  });

  test("a file written to disk reads through the raw-bytes path with the same result", () => {
    const kvs = bpeMeta(["ab"], ["a b"], [ggufKv("tokenizer.ggml.eos_token_id", "u32", 256)]);
    const path = join(tmp, "bpe.gguf");
    writeGguf(path, kvs, []);
    const fromFile = tokenizerFromGguf(path);
    const fromMem = tokenizerFromGguf(metadata(kvs));
    expect(fromFile.encode("abcab")).toEqual(fromMem.encode("abcab"));
    expect(fromFile.encode("abcab")).toEqual([256, "c".charCodeAt(0), 256]);
    expect(utf8(fromFile.tokenText(256))).toEqual(utf8("ab"));
  });
});
