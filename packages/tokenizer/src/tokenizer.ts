/**
 * The tokenizer of a model: encode text to token ids and decode ids to text, built from the model's
 * own file by {@link tokenizerFromGguf} or {@link tokenizerFromHfJson}. Two models are supported:
 * `gpt2` (byte-level BPE, Qwen) and `llama` (SentencePiece-style BPE with byte fallback, Llama 2 and
 * Gemma 3).
 *
 * Source: ../shared/spec/llm.md §4; ggml-org/llama.cpp `src/llama-vocab.cpp` (`tokenize_impl`,
 * `token_to_piece`, the end-of-generation set in `load`).
 */
import { TpError } from "@tp/tensor";
import type { BytePairEncoder } from "./bpe.ts";
import { preTokenize } from "./pretokenize.ts";
import { type Fragment, type SpecialMatch, SpecialTokenMatcher } from "./special.ts";
import type { SentencePieceEncoder } from "./spm.ts";
import { fromUtf8, incompleteUtf8Tail, UNICODE_TO_BYTE } from "./unicode.ts";
import { type ByteVocab, TOKEN_TYPE, TOKEN_TYPE_NAMES, type TokenTypeName } from "./vocab.ts";

/** Tokenizer models by their GGUF `tokenizer.ggml.model` name. */
export const TOKENIZER_MODELS = {
  /** Byte-level BPE with a pre-tokenizer regex (Qwen 2 / 2.5 / 3 / 3.5). */
  gpt2: "byte-level BPE",
  /** SentencePiece-style BPE over `▁`-escaped text, scores pick merges, `<0xNN>` byte fallback (Llama 2, Gemma 3). */
  llama: "SentencePiece-style BPE with byte fallback",
} as const;

/** A supported tokenizer model. */
export type TokenizerModel = keyof typeof TOKENIZER_MODELS;

/**
 * Token texts that end generation when the vocabulary has them, besides the eos/eot/eom ids
 * (llama.cpp `llama_vocab::impl::load`, the `special_eog_ids` loop; llm.md §4.4).
 */
export const EOG_TOKEN_TEXTS: readonly string[] = [
  "<|eot_id|>",
  "<|eom_id|>",
  "<|im_end|>",
  "<|end|>",
  "<end_of_turn>",
  "<|endoftext|>",
  "<|end_of_text|>",
  "<EOT>",
  "_<EOT>",
  "<｜end▁of▁sentence｜>",
  "<end_of_utterance>",
  "<|return|>",
  "<|call|>",
];

/** Special token ids of a vocabulary; each is undefined when the file names none. */
export interface SpecialTokenIds {
  bos?: number | undefined;
  eos?: number | undefined;
  /** End of turn (`tokenizer.ggml.eot_token_id`), when the file states it. */
  eot?: number | undefined;
  /** End of message (`tokenizer.ggml.eom_token_id`). */
  eom?: number | undefined;
  unk?: number | undefined;
  pad?: number | undefined;
}

/** What a tokenizer is built from; made by the GGUF and tokenizer.json loaders. */
export interface TokenizerInit {
  /** File the vocabulary came from (for messages). */
  source: string;
  model: TokenizerModel;
  /** Pre-tokenizer name (`gpt2` only): `qwen2` or `qwen35`. */
  pre?: string | undefined;
  vocab: ByteVocab;
  /** [vocab.size] {@link TOKEN_TYPE} per id. */
  types: Uint8Array;
  /** `gpt2`: the BPE encoder. */
  bpe?: BytePairEncoder | undefined;
  /** `gpt2`: the pre-tokenizer regex (global, Unicode). */
  preRegex?: RegExp | undefined;
  /** `llama`: the SentencePiece encoder. */
  spm?: SentencePieceEncoder | undefined;
  special: SpecialTokenIds;
  addBos: boolean;
  addEos: boolean;
  /** `llama`: prepend a space to a raw fragment at the start or after a special token. */
  addSpacePrefix: boolean;
  /** Unicode normalization applied to raw text before pre-tokenizing (tokenizer.json `NFC`), or null. */
  normalization: "NFC" | null;
  /** The model's Jinja chat template, when the file has one. */
  chatTemplate?: string | undefined;
  /** More end-of-generation ids (e.g. generation_config.json `eos_token_id`). */
  extraEog?: readonly number[] | undefined;
}

/** Options of {@link Tokenizer.encode}. */
export interface EncodeOptions {
  /**
   * Add the BOS / EOS the vocabulary asks for (`add_bos` / `add_eos`), as llama.cpp's
   * `add_special`. Default false. A rendered chat template usually writes BOS itself.
   */
  addSpecial?: boolean;
  /**
   * Match CONTROL tokens (`<|im_start|>`, `<bos>`, …) written in the text. Default false: only
   * USER_DEFINED tokens (`<think>`, Gemma's whitespace runs) are matched, so user text cannot inject
   * control tokens. Pass true for rendered chat templates only.
   */
  parseSpecial?: boolean;
  /**
   * UTF-16 spans `[start, end)` of `text` that hold user text spliced into a rendered template: no
   * CONTROL or UNKNOWN token is matched starting inside them, even with `parseSpecial`. Used by
   * `@tp/llm`'s chat prompts so a user cannot type `<|im_end|>` into the conversation structure.
   */
  literal?: readonly (readonly [number, number])[];
}

/** Options of {@link Tokenizer.decode} and {@link Tokenizer.streamDecoder}. */
export interface DecodeOptions {
  /** Leave out CONTROL and UNKNOWN tokens (`<|im_end|>`, `<s>`). Default false: they appear as their text. */
  skipSpecial?: boolean;
}

/**
 * Turns token ids into text bytes one at a time, with the rules shared by `decode` and the streaming
 * decoder: byte-level BPE maps each character back to its byte, SentencePiece turns `▁` into a space
 * and `<0xNN>` into its byte, and where the encoder added a space prefix (SentencePiece with
 * `add_space_prefix`, at the start and after a special token) one leading space is removed again.
 */
class PieceWriter {
  #atBoundary = true;
  constructor(
    private readonly tok: Tokenizer,
    private readonly skipSpecial: boolean,
  ) {}

  /** The bytes token `id` adds to the text. */
  piece(id: number): Uint8Array {
    const tok = this.tok;
    const type = tok.tokenTypeId(id);
    if (type === TOKEN_TYPE.CONTROL || type === TOKEN_TYPE.UNKNOWN || type === TOKEN_TYPE.USER_DEFINED) {
      // the encoder's special partition: a space prefix may follow, so a boundary starts here
      this.#atBoundary = true;
      return type !== TOKEN_TYPE.USER_DEFINED && this.skipSpecial ? EMPTY : tok.tokenBytes(id);
    }
    let bytes = tok.tokenBytes(id);
    if (bytes.length > 0 && this.#atBoundary) {
      this.#atBoundary = false;
      if (tok.addSpacePrefix && tok.model === "llama" && bytes[0] === 0x20) bytes = bytes.subarray(1);
    }
    return bytes;
  }
}

const EMPTY = new Uint8Array(0);

/**
 * Incremental detokenizer: `push` one id at a time and get back only complete UTF-8 text; a trailing
 * incomplete sequence (up to 3 bytes, e.g. half of an emoji split across byte tokens) is held until
 * the next token completes it. Invalid bytes are emitted as U+FFFD rather than held. The
 * concatenation of every `push` and the final `flush` equals `decode` of all the ids.
 */
export class StreamDecoder {
  readonly #writer: PieceWriter;
  #held: Uint8Array = EMPTY;

  /** @internal use {@link Tokenizer.streamDecoder} */
  constructor(tok: Tokenizer, options: DecodeOptions) {
    this.#writer = new PieceWriter(tok, options.skipSpecial ?? false);
  }

  /**
   * Add token `id`.
   * @returns the text that became complete (may be "")
   * @throws TpError E_ARG for an id outside the vocabulary
   */
  push(id: number): string {
    const piece = this.#writer.piece(id);
    if (piece.length === 0) return "";
    let buf: Uint8Array;
    if (this.#held.length === 0) buf = piece;
    else {
      buf = new Uint8Array(this.#held.length + piece.length);
      buf.set(this.#held);
      buf.set(piece, this.#held.length);
    }
    const tail = incompleteUtf8Tail(buf);
    this.#held = tail > 0 ? buf.slice(buf.length - tail) : EMPTY;
    return tail === buf.length ? "" : fromUtf8(buf.subarray(0, buf.length - tail));
  }

  /** Emit whatever is held (an unfinished sequence becomes U+FFFD) and reset the hold. */
  flush(): string {
    const s = this.#held.length > 0 ? fromUtf8(this.#held) : "";
    this.#held = EMPTY;
    return s;
  }
}

/**
 * A tokenizer built from a model file. Create with `tokenizerFromGguf`, `tokenizerFromHfJson` or
 * `loadTokenizer`.
 */
export class Tokenizer {
  /** File the vocabulary came from. */
  readonly source: string;
  /** `gpt2` (byte-level BPE) or `llama` (SentencePiece-style). */
  readonly model: TokenizerModel;
  /** Pre-tokenizer (`gpt2`): `qwen2` or `qwen35`; undefined for `llama`. */
  readonly pre: string | undefined;
  /** Number of token ids (0 … vocabSize-1), including CONTROL and UNUSED entries. */
  readonly vocabSize: number;
  /** Special ids from the file (llama.cpp defaults for `llama` when keys are absent: bos 1, eos 2, unk 0). */
  readonly special: Readonly<SpecialTokenIds>;
  /** Prepend BOS when `encode` is asked for `addSpecial` (`tokenizer.ggml.add_bos_token`). */
  readonly addBos: boolean;
  /** Append EOS when `encode` is asked for `addSpecial` (`tokenizer.ggml.add_eos_token`). */
  readonly addEos: boolean;
  /** SentencePiece: a raw fragment at the start or after a special token gets a leading space (Llama 2: true; Gemma 3: false). */
  readonly addSpacePrefix: boolean;
  /** Unicode normalization of raw text before pre-tokenizing: "NFC" for Qwen's tokenizer.json, null for GGUF (as llama.cpp). */
  readonly normalization: "NFC" | null;
  /** The model's own Jinja chat template, if the file has one. */
  readonly chatTemplate: string | undefined;
  /**
   * End-of-generation ids: eos, eot, eom, and every token whose text is one of
   * {@link EOG_TOKEN_TEXTS} (llm.md §4.4). PAD is not included (stories260K's pad is `<unk>`).
   */
  readonly eog: ReadonlySet<number>;

  readonly #vocab: ByteVocab;
  readonly #types: Uint8Array;
  readonly #bpe: BytePairEncoder | undefined;
  readonly #preRegex: RegExp | undefined;
  readonly #spm: SentencePieceEncoder | undefined;
  #matcher: SpecialTokenMatcher | undefined;
  readonly #pieces: (Uint8Array | undefined)[];

  /** @internal use the loaders */
  constructor(init: TokenizerInit) {
    this.source = init.source;
    this.model = init.model;
    this.pre = init.pre;
    this.#vocab = init.vocab;
    this.vocabSize = init.vocab.size;
    this.#types = init.types;
    this.#bpe = init.bpe;
    this.#preRegex = init.preRegex;
    this.#spm = init.spm;
    this.special = Object.freeze({ ...init.special });
    this.addBos = init.addBos;
    this.addEos = init.addEos;
    this.addSpacePrefix = init.addSpacePrefix;
    this.normalization = init.normalization;
    this.chatTemplate = init.chatTemplate;
    this.#pieces = new Array(this.vocabSize);
    const eog = new Set<number>();
    for (const id of [init.special.eos, init.special.eot, init.special.eom, ...(init.extraEog ?? [])]) {
      if (id !== undefined) eog.add(id);
    }
    for (const text of EOG_TOKEN_TEXTS) {
      const id = init.vocab.lookupString(text);
      if (id >= 0) eog.add(id);
    }
    this.eog = eog;
    if (init.model === "gpt2" && (init.bpe === undefined || init.preRegex === undefined))
      throw new TpError("E_INTERNAL", "a gpt2 tokenizer needs a BPE encoder and a pre-tokenizer");
    if (init.model === "llama" && init.spm === undefined)
      throw new TpError("E_INTERNAL", "a llama tokenizer needs a SentencePiece encoder");
  }

  #check(id: number): void {
    if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize) {
      throw new TpError(
        "E_ARG",
        `token id ${id} is outside the vocabulary (0 … ${this.vocabSize - 1}) of ${this.source}`,
      );
    }
  }

  /**
   * Token ids of `text`.
   * @param text   any string (lone surrogates are encoded as U+FFFD)
   * @param options `addSpecial` (BOS/EOS per `addBos`/`addEos`, default false), `parseSpecial`
   *   (match CONTROL token texts, default false)
   * @returns ids in order
   */
  encode(text: string, options: EncodeOptions = {}): number[] {
    const out: number[] = [];
    const { bos, eos } = this.special;
    if (options.addSpecial && this.addBos && bos !== undefined) out.push(bos);
    const fragments: Fragment[] =
      text.length === 0
        ? []
        : this.#specialMatcher().split(text, options.parseSpecial ?? false, options.literal);
    let prevSpecial = true;
    for (const f of fragments) {
      if (typeof f === "number") {
        out.push(f);
        prevSpecial = true;
        continue;
      }
      const raw = this.normalization === "NFC" ? f.normalize("NFC") : f;
      if (this.model === "gpt2") {
        const bpe = this.#bpe as BytePairEncoder;
        for (const piece of preTokenize(raw, this.#preRegex as RegExp)) bpe.encodePiece(piece, out);
      } else {
        (this.#spm as SentencePieceEncoder).encodeFragment(
          this.addSpacePrefix && prevSpecial ? ` ${raw}` : raw,
          out,
        );
      }
      prevSpecial = false;
    }
    if (options.addSpecial && this.addEos && eos !== undefined) out.push(eos);
    return out;
  }

  /**
   * Where CONTROL and UNKNOWN token texts (the ones only `parseSpecial` matches) occur in `text`,
   * leftmost-longest, as UTF-16 offsets.
   */
  findControlTokens(text: string): SpecialMatch[] {
    const control = this.#specialMatcher().matches(text, true);
    return control.filter((m) => this.#types[m.id] !== TOKEN_TYPE.USER_DEFINED);
  }

  #specialMatcher(): SpecialTokenMatcher {
    this.#matcher ??= new SpecialTokenMatcher(
      this.vocabSize,
      (id) => this.#vocab.text(id),
      (id) => this.#types[id] as number,
    );
    return this.#matcher;
  }

  /**
   * The text of `ids`. Byte-level BPE: each character maps back to its byte; SentencePiece: `▁` →
   * space, `<0xNN>` → that byte, and the space the encoder prefixed (add_space_prefix) is removed.
   * CONTROL/UNKNOWN tokens appear as their text unless `skipSpecial`; UNUSED tokens add nothing.
   * Invalid UTF-8 (e.g. a sequence cut at the end) becomes U+FFFD.
   * @throws TpError E_ARG for an id outside the vocabulary
   */
  decode(ids: ArrayLike<number>, options: DecodeOptions = {}): string {
    return fromUtf8(this.decodeBytes(ids, options));
  }

  /** The UTF-8 bytes {@link decode} would decode. @throws TpError E_ARG for an id outside the vocabulary */
  decodeBytes(ids: ArrayLike<number>, options: DecodeOptions = {}): Uint8Array {
    const w = new PieceWriter(this, options.skipSpecial ?? false);
    const parts: Uint8Array[] = [];
    let total = 0;
    for (let i = 0; i < ids.length; i++) {
      const p = w.piece(ids[i] as number);
      parts.push(p);
      total += p.length;
    }
    const out = new Uint8Array(total);
    let at = 0;
    for (const p of parts) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  }

  /** A {@link StreamDecoder} that emits only complete UTF-8 text. */
  streamDecoder(options: DecodeOptions = {}): StreamDecoder {
    return new StreamDecoder(this, options);
  }

  /**
   * The bytes token `id` stands for in text, before any space-prefix removal: byte-level BPE
   * characters mapped back to bytes, SentencePiece `▁` as space and `<0xNN>` as its byte, special
   * tokens as their text, UNUSED as nothing. A view of a cached array: do not write to it.
   * @throws TpError E_ARG for an id outside the vocabulary
   */
  tokenBytes(id: number): Uint8Array {
    this.#check(id);
    let p = this.#pieces[id];
    if (p === undefined) {
      p = this.#computePiece(id);
      this.#pieces[id] = p;
    }
    return p;
  }

  #computePiece(id: number): Uint8Array {
    const type = this.#types[id] as number;
    const raw = this.#vocab.bytes(id);
    if (type === TOKEN_TYPE.UNUSED) return EMPTY;
    if (type === TOKEN_TYPE.CONTROL || type === TOKEN_TYPE.UNKNOWN) return raw;
    if (this.model === "gpt2") {
      if (type === TOKEN_TYPE.USER_DEFINED) return raw;
      return unmapByteLevel(raw);
    }
    if (type === TOKEN_TYPE.BYTE) {
      const m = /^<0x([0-9A-Fa-f]{2})>$/.exec(this.#vocab.text(id));
      return m ? Uint8Array.of(Number.parseInt(m[1] as string, 16)) : raw;
    }
    return unescapeSpaces(raw);
  }

  /** The vocabulary text of token `id` as stored (byte-level BPE: the mapped form, e.g. `Ġthe`). @throws TpError E_ARG */
  tokenText(id: number): string {
    this.#check(id);
    return this.#vocab.text(id);
  }

  /** The {@link TOKEN_TYPE} of token `id`. @throws TpError E_ARG */
  tokenTypeId(id: number): number {
    this.#check(id);
    return this.#types[id] as number;
  }

  /** The type name of token `id` (`"normal"`, `"control"`, …). @throws TpError E_ARG */
  tokenType(id: number): TokenTypeName {
    return TOKEN_TYPE_NAMES[this.tokenTypeId(id)] ?? "undefined";
  }

  /** The id whose stored text is exactly `text` (e.g. `"<|im_end|>"`), or undefined. */
  tokenId(text: string): number | undefined {
    const id = this.#vocab.lookupString(text);
    return id < 0 ? undefined : id;
  }

  /** True when sampling `id` ends generation (see {@link eog}). */
  isEog(id: number): boolean {
    return this.eog.has(id);
  }
}

/** Byte-level BPE: map each code point of the token's UTF-8 text back to its byte (llm.md §4.2, decode). */
function unmapByteLevel(raw: Uint8Array): Uint8Array {
  const out = new Uint8Array(raw.length);
  let n = 0;
  for (let i = 0; i < raw.length; ) {
    const b0 = raw[i] as number;
    let cp: number;
    let len: number;
    if (b0 < 0x80) {
      cp = b0;
      len = 1;
    } else if (b0 >= 0xc0 && b0 < 0xe0 && i + 1 < raw.length) {
      cp = ((b0 & 0x1f) << 6) | ((raw[i + 1] as number) & 0x3f);
      len = 2;
    } else {
      cp = -1;
      len = b0 >= 0xf0 ? 4 : b0 >= 0xe0 ? 3 : 1;
    }
    const byte = cp >= 0 && cp < UNICODE_TO_BYTE.length ? (UNICODE_TO_BYTE[cp] as number) : -1;
    if (byte >= 0) {
      out[n++] = byte;
    } else {
      // not a mapped character: keep its UTF-8 bytes as they are
      for (let k = 0; k < len && i + k < raw.length; k++) out[n++] = raw[i + k] as number;
    }
    i += len;
  }
  return out.subarray(0, n);
}

/** SentencePiece: `▁` (E2 96 81) → space (llama.cpp `llama_unescape_whitespace`). */
function unescapeSpaces(raw: Uint8Array): Uint8Array {
  let has = false;
  for (let i = 0; i + 2 < raw.length; i++) {
    if (raw[i] === 0xe2 && raw[i + 1] === 0x96 && raw[i + 2] === 0x81) {
      has = true;
      break;
    }
  }
  if (!has) return raw;
  const out = new Uint8Array(raw.length);
  let n = 0;
  for (let i = 0; i < raw.length; ) {
    if (raw[i] === 0xe2 && raw[i + 1] === 0x96 && raw[i + 2] === 0x81) {
      out[n++] = 0x20;
      i += 3;
    } else out[n++] = raw[i++] as number;
  }
  return out.subarray(0, n);
}
