/**
 * Build a {@link Tokenizer} from a GGUF file's `tokenizer.ggml.*` metadata.
 *
 * The token strings stay as the bytes of the `tokenizer.ggml.tokens` array (no string per token is
 * made at load; the 151,936-entry Qwen vocabulary with its 151,387 merges loads in tens of
 * milliseconds), and `tokenizer.ggml.merges` is resolved to id pairs directly from its bytes.
 *
 * Source: ../shared/spec/llm.md §4.1 (keys and defaults); ggml-org/llama.cpp `src/llama-vocab.cpp`
 * `llama_vocab::impl::load` (defaults: `llama` → bos 1, eos 2, unk 0, add_bos true,
 * add_space_prefix true; missing `token_type` → NORMAL; missing `scores` → 0).
 */
import { GGUF_TYPE, type GgufArray, type GgufFile, GgufMetadata, openGguf } from "@tp/formats";
import { TpError } from "@tp/tensor";
import { BytePairEncoder, byteTokenIds, mergesFromSpans } from "./bpe.ts";
import { preTokenizerRegex } from "./pretokenize.ts";
import { SentencePieceEncoder, spmByteTokenIds } from "./spm.ts";
import { type SpecialTokenIds, TOKENIZER_MODELS, Tokenizer, type TokenizerModel } from "./tokenizer.ts";
import { ByteVocab, TOKEN_TYPE } from "./vocab.ts";

function formatErr(message: string, file: string): TpError {
  return new TpError("E_FORMAT", message, { file });
}

function requireArray(meta: GgufMetadata, key: string, type: number, file: string): GgufArray {
  const arr = meta.getArray(key);
  if (arr === undefined) throw formatErr(`GGUF metadata '${key}' is missing`, file);
  if (arr.type !== type)
    throw formatErr(
      `GGUF metadata '${key}' should be an array of ${typeName(type)}, but its elements are ${arr.typeName}`,
      file,
    );
  return arr;
}

function typeName(t: number): string {
  return t === GGUF_TYPE.STRING
    ? "str"
    : t === GGUF_TYPE.INT32
      ? "i32"
      : t === GGUF_TYPE.FLOAT32
        ? "f32"
        : String(t);
}

const SPECIAL_KEYS: readonly [keyof SpecialTokenIds, string][] = [
  ["bos", "tokenizer.ggml.bos_token_id"],
  ["eos", "tokenizer.ggml.eos_token_id"],
  ["eot", "tokenizer.ggml.eot_token_id"],
  ["eom", "tokenizer.ggml.eom_token_id"],
  ["unk", "tokenizer.ggml.unknown_token_id"],
  ["pad", "tokenizer.ggml.padding_token_id"],
];

/**
 * Build the tokenizer of a GGUF model from its metadata.
 * @param source an opened {@link GgufFile}, its {@link GgufMetadata}, or a path (opened and closed here)
 * @returns a {@link Tokenizer} whose `chatTemplate` is `tokenizer.chat_template`, if present
 * @throws TpError E_FORMAT (naming the file) when the tokenizer metadata is missing or inconsistent
 *   (no `tokenizer.ggml.model`, no tokens, array lengths that differ, a special id outside the
 *   vocabulary, a byte-level vocabulary without its 256 byte tokens); E_UNSUPPORTED for a tokenizer
 *   model other than `gpt2`/`llama` or an unknown `tokenizer.ggml.pre`, listing the known ones;
 *   E_IO when a path cannot be read
 */
export function tokenizerFromGguf(source: GgufFile | GgufMetadata | string): Tokenizer {
  if (typeof source === "string") {
    const g = openGguf(source);
    try {
      return tokenizerFromGguf(g.metadata);
    } finally {
      g.close();
    }
  }
  const meta = source instanceof GgufMetadata ? source : source.metadata;
  const file = meta.file;
  const modelName = meta.getString("tokenizer.ggml.model");
  if (modelName === undefined) {
    throw formatErr("the GGUF has no tokenizer metadata ('tokenizer.ggml.model' is missing)", file);
  }
  if (!(modelName in TOKENIZER_MODELS)) {
    throw new TpError(
      "E_UNSUPPORTED",
      `tokenizer model '${modelName}' is not supported; known: ${Object.entries(TOKENIZER_MODELS)
        .map(([k, v]) => `${k} (${v})`)
        .join(", ")}`,
      { file },
    );
  }
  const model = modelName as TokenizerModel;
  const tokens = requireArray(meta, "tokenizer.ggml.tokens", GGUF_TYPE.STRING, file);
  const n = tokens.length;
  if (n === 0) throw formatErr("'tokenizer.ggml.tokens' is empty", file);
  const spans = tokens.utf8Spans();
  const vocab = new ByteVocab(spans.bytes, spans.start, spans.length);

  const types = new Uint8Array(n).fill(TOKEN_TYPE.NORMAL);
  if (meta.has("tokenizer.ggml.token_type")) {
    const arr = requireArray(meta, "tokenizer.ggml.token_type", GGUF_TYPE.INT32, file);
    if (arr.length !== n)
      throw formatErr(
        `'tokenizer.ggml.token_type' has ${arr.length} entries but there are ${n} tokens`,
        file,
      );
    const t = arr.toTypedArray();
    for (let i = 0; i < n; i++) {
      const v = t[i] as number;
      types[i] = v >= 0 && v <= 6 ? v : TOKEN_TYPE.UNDEFINED;
    }
  }

  const special: SpecialTokenIds = model === "llama" ? { bos: 1, eos: 2, unk: 0 } : {};
  for (const [name, key] of SPECIAL_KEYS) {
    const id = meta.getInt(key);
    if (id === undefined) continue;
    if (id < 0 || id >= n) throw formatErr(`'${key}' is ${id}, outside the vocabulary of ${n} tokens`, file);
    special[name] = id;
  }
  // llama.cpp's defaults (bos 1, eos 2, unk 0) do not exist in a vocabulary of fewer than 3 tokens
  for (const [name] of SPECIAL_KEYS) if ((special[name] ?? 0) >= n) delete special[name];

  const common = {
    source: file,
    vocab,
    types,
    special,
    addBos: meta.getBool("tokenizer.ggml.add_bos_token") ?? model === "llama",
    addEos: meta.getBool("tokenizer.ggml.add_eos_token") ?? false,
    normalization: null,
    chatTemplate: meta.getString("tokenizer.chat_template"),
  } as const;

  if (model === "gpt2") {
    const pre = meta.getString("tokenizer.ggml.pre");
    if (pre === undefined) {
      throw new TpError(
        "E_UNSUPPORTED",
        "byte-level BPE vocabulary without 'tokenizer.ggml.pre': the pre-tokenizer is unknown; known: qwen2, qwen35",
        { file },
      );
    }
    const preRegex = preTokenizerRegex(pre, ` ('tokenizer.ggml.pre' of ${file})`);
    const mergesArr = requireArray(meta, "tokenizer.ggml.merges", GGUF_TYPE.STRING, file);
    const ms = mergesArr.utf8Spans();
    const end = new Uint32Array(ms.start.length);
    for (let i = 0; i < end.length; i++) end[i] = (ms.start[i] as number) + (ms.length[i] as number);
    const merges = mergesFromSpans(vocab, ms.bytes, ms.start, end, file);
    const bpe = new BytePairEncoder(byteTokenIds(vocab, file), merges);
    return new Tokenizer({ ...common, model, pre, bpe, preRegex, addSpacePrefix: false });
  }

  let scores: Float32Array = new Float32Array(n);
  if (meta.has("tokenizer.ggml.scores")) {
    const arr = requireArray(meta, "tokenizer.ggml.scores", GGUF_TYPE.FLOAT32, file);
    if (arr.length !== n)
      throw formatErr(`'tokenizer.ggml.scores' has ${arr.length} entries but there are ${n} tokens`, file);
    scores = arr.toTypedArray() as Float32Array;
  }
  const spm = new SentencePieceEncoder(vocab, scores, spmByteTokenIds(vocab), special.unk ?? -1);
  return new Tokenizer({
    ...common,
    model,
    spm,
    addSpacePrefix: meta.getBool("tokenizer.ggml.add_space_prefix") ?? true,
  });
}
