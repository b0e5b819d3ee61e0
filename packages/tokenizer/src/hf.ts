/**
 * Build a {@link Tokenizer} from a Hugging Face `tokenizer.json` (with `tokenizer_config.json` and
 * `generation_config.json` when they lie beside it), as a safetensors checkpoint ships it. Supported:
 * the byte-level BPE that Qwen2/Qwen3/Qwen3-VL (and Qwen 3.5) ship — model `BPE`, a `Split`
 * pre-tokenizer with the Qwen regex followed by `ByteLevel` (`use_regex: false`), an `NFC` or no
 * normalizer.
 *
 * Source: ../shared/spec/llm.md §4.1 ("For safetensors models read tokenizer.json instead");
 * huggingface/tokenizers `tokenizers/src/models/bpe/serialization.rs` (merges as `"A B"` strings or
 * `[A, B]` pairs), `tokenizers/src/tokenizer/added_vocabulary.rs` (added tokens); llama.cpp
 * `convert_hf_to_gguf.py` (added tokens with `special: true` → CONTROL, others → USER_DEFINED).
 */
import { existsSync, readFileSync, statSync } from "node:fs";
import { dirname, join } from "node:path";
import { TpError } from "@tp/tensor";
import { BytePairEncoder, byteTokenIds, mergesFromPairs } from "./bpe.ts";
import { HF_SPLIT_PATTERNS, preTokenizerRegex } from "./pretokenize.ts";
import { type SpecialTokenIds, Tokenizer } from "./tokenizer.ts";
import { ByteVocab, TOKEN_TYPE } from "./vocab.ts";

/** Options of {@link tokenizerFromHfJson}. */
export interface HfTokenizerOptions {
  /** Path of the tokenizer.json (for messages). Default `"tokenizer.json"`. */
  source?: string;
  /** The parsed tokenizer_config.json: `add_bos_token`, `add_eos_token`, `bos_token`, `eos_token`, `pad_token`, `unk_token`, `chat_template`. */
  config?: unknown;
  /** The parsed generation_config.json: its `eos_token_id` (one id or a list) joins the end-of-generation set. */
  generationConfig?: unknown;
}

type Json = Record<string, unknown>;

const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);

function unsupported(what: string, file: string): TpError {
  return new TpError(
    "E_UNSUPPORTED",
    `${what}; supported: byte-level BPE (model BPE, Split pre-tokenizer with the ${Object.values(HF_SPLIT_PATTERNS).join(" or ")} regex, ByteLevel, NFC or no normalizer) as Qwen ships it — for SentencePiece models use the GGUF`,
    { file },
  );
}

/** The token text a tokenizer_config.json field names: a string, or an AddedToken object's `content`. */
function tokenContent(v: unknown): string | undefined {
  if (typeof v === "string") return v;
  if (isObject(v) && typeof v.content === "string") return v.content;
  return undefined;
}

/** The `Split` regex of a pre-tokenizer (a single one or inside a `Sequence`), and whether ByteLevel is present. */
function readPreTokenizer(pt: unknown): { pattern: string | undefined; byteLevel: boolean; other: string[] } {
  const list =
    isObject(pt) && pt.type === "Sequence" && Array.isArray(pt.pretokenizers) ? pt.pretokenizers : [pt];
  let pattern: string | undefined;
  let byteLevel = false;
  const other: string[] = [];
  for (const p of list) {
    if (!isObject(p)) continue;
    if (p.type === "Split" && isObject(p.pattern) && typeof p.pattern.Regex === "string")
      pattern = p.pattern.Regex;
    else if (p.type === "ByteLevel") {
      byteLevel = true;
      if (p.use_regex === true) other.push("ByteLevel with use_regex (the GPT-2 regex)");
    } else other.push(String(p.type));
  }
  return { pattern, byteLevel, other };
}

/**
 * Added tokens that llama.cpp's converter makes CONTROL although tokenizer.json says `special: false`
 * (`convert_hf_to_gguf.py` `does_token_look_special`: `<|…|>`, `<｜…｜>`, `<unused…>`, `<pad>`,
 * `<mask>`), so that the tokenizer.json and GGUF of one model agree on every token type.
 */
function looksSpecial(t: string): boolean {
  return (
    ["<pad>", "<mask>", "<2mass>", "[@BOS@]"].includes(t) ||
    (t.startsWith("<|") && t.endsWith("|>")) ||
    (t.startsWith("<｜") && t.endsWith("｜>")) ||
    (t.startsWith("<unused") && t.endsWith(">"))
  );
}

/**
 * Build a byte-level BPE tokenizer from a parsed tokenizer.json.
 * @param json    the parsed tokenizer.json
 * @param options the file name for messages, tokenizer_config.json and generation_config.json contents
 * @throws TpError E_FORMAT (naming the file) for a malformed vocabulary, merge list or added token;
 *   E_UNSUPPORTED for another model type, pre-tokenizer or normalizer, listing what is supported
 */
export function tokenizerFromHfJson(json: unknown, options: HfTokenizerOptions = {}): Tokenizer {
  const file = options.source ?? "tokenizer.json";
  const bad = (m: string) => new TpError("E_FORMAT", m, { file });
  if (!isObject(json) || !isObject(json.model)) throw bad("tokenizer.json has no 'model' object");
  const m = json.model;
  if (m.type !== "BPE") throw unsupported(`tokenizer model type '${String(m.type)}'`, file);
  const pt = readPreTokenizer(json.pre_tokenizer);
  if (!pt.byteLevel) throw unsupported("a BPE tokenizer without a ByteLevel pre-tokenizer", file);
  if (pt.other.length > 0) throw unsupported(`pre-tokenizer ${pt.other.join(", ")}`, file);
  if (pt.pattern === undefined) throw unsupported("a ByteLevel pre-tokenizer without a Split regex", file);
  const pre = HF_SPLIT_PATTERNS[pt.pattern];
  if (pre === undefined) throw unsupported(`pre-tokenizer regex ${JSON.stringify(pt.pattern)}`, file);
  const norm = json.normalizer;
  if (norm !== null && norm !== undefined && !(isObject(norm) && norm.type === "NFC"))
    throw unsupported(`normalizer ${JSON.stringify(isObject(norm) ? norm.type : norm)}`, file);

  // id → text, from model.vocab and added_tokens
  if (!isObject(m.vocab)) throw bad("tokenizer.json 'model.vocab' is not an object");
  const texts: string[] = [];
  const types: number[] = [];
  const place = (id: unknown, text: string, type: number, what: string) => {
    if (typeof id !== "number" || !Number.isInteger(id) || id < 0 || id > 16_777_216)
      throw bad(`${what} '${text}' has id ${JSON.stringify(id)}, not an integer in 0 … 2^24`);
    texts[id] = text;
    types[id] = type;
  };
  const vocabObj = m.vocab;
  for (const text in vocabObj) place(vocabObj[text], text, TOKEN_TYPE.NORMAL, "vocabulary entry");
  const added = Array.isArray(json.added_tokens) ? json.added_tokens : [];
  const addedIds = new Map<string, number>();
  for (const a of added) {
    if (!isObject(a) || typeof a.content !== "string")
      throw bad("an entry of 'added_tokens' has no 'content' string");
    const control = a.special === true || looksSpecial(a.content);
    place(a.id, a.content, control ? TOKEN_TYPE.CONTROL : TOKEN_TYPE.USER_DEFINED, "added token");
    addedIds.set(a.content, a.id as number);
  }
  const n = texts.length;
  for (let i = 0; i < n; i++) {
    if (texts[i] === undefined) {
      texts[i] = "";
      types[i] = TOKEN_TYPE.UNUSED;
    }
  }
  const vocab = ByteVocab.fromStrings(texts);

  if (!Array.isArray(m.merges)) throw bad("tokenizer.json 'model.merges' is not a list");
  const pairs: [string, string][] = m.merges.map((x: unknown, i: number) => {
    if (typeof x === "string") {
      const sp = x.indexOf(" ");
      if (sp < 0 || x.indexOf(" ", sp + 1) >= 0)
        throw bad(`merge ${i} ${JSON.stringify(x)} is not two tokens separated by one space`);
      return [x.slice(0, sp), x.slice(sp + 1)];
    }
    if (Array.isArray(x) && x.length === 2 && typeof x[0] === "string" && typeof x[1] === "string")
      return [x[0], x[1]];
    throw bad(`merge ${i} is neither "A B" nor ["A", "B"]`);
  });
  const merges = mergesFromPairs((t) => {
    const id = Object.hasOwn(vocabObj, t) ? vocabObj[t] : addedIds.get(t);
    return typeof id === "number" ? id : -1;
  }, pairs);

  const cfg = isObject(options.config) ? options.config : {};
  const idOf = (v: unknown): number | undefined => {
    const t = tokenContent(v);
    if (t === undefined) return undefined;
    const id = vocab.lookupString(t);
    return id < 0 ? undefined : id;
  };
  const special: SpecialTokenIds = {
    bos: idOf(cfg.bos_token),
    eos: idOf(cfg.eos_token),
    pad: idOf(cfg.pad_token),
    unk: idOf(cfg.unk_token),
  };
  const gen = isObject(options.generationConfig) ? options.generationConfig.eos_token_id : undefined;
  const extraEog = (Array.isArray(gen) ? gen : [gen]).filter(
    (x): x is number => typeof x === "number" && Number.isInteger(x) && x >= 0 && x < n,
  );
  let chatTemplate: string | undefined;
  if (typeof cfg.chat_template === "string") chatTemplate = cfg.chat_template;
  else if (Array.isArray(cfg.chat_template)) {
    const named = cfg.chat_template.filter(isObject);
    const pick = named.find((t) => t.name === "default") ?? named[0];
    if (pick && typeof pick.template === "string") chatTemplate = pick.template;
  }

  return new Tokenizer({
    source: file,
    model: "gpt2",
    pre,
    vocab,
    types: Uint8Array.from(types),
    bpe: new BytePairEncoder(byteTokenIds(vocab, file), merges),
    preRegex: preTokenizerRegex(pre),
    special,
    addBos: cfg.add_bos_token === true,
    addEos: cfg.add_eos_token === true,
    addSpacePrefix: false,
    normalization: isObject(norm) ? "NFC" : null,
    chatTemplate,
    extraEog,
  });
}

function readJson(path: string): unknown {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    throw new TpError("E_IO", `cannot read: ${(e as Error).message}`, { file: path, cause: e });
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new TpError("E_FORMAT", `not valid JSON: ${(e as Error).message}`, { file: path, cause: e });
  }
}

/**
 * Load `tokenizer.json` from a checkpoint directory (or the file itself), with `tokenizer_config.json`
 * and `generation_config.json` from the same directory when present.
 * @param path a directory, a tokenizer.json file, or a file inside the checkpoint directory (e.g.
 *   `model.safetensors`: the tokenizer.json beside it is used)
 * @throws TpError E_IO when there is no tokenizer.json (the message names where it was looked for);
 *   E_FORMAT for invalid JSON; see {@link tokenizerFromHfJson}
 */
export function loadHfTokenizer(path: string): Tokenizer {
  const isDir = existsSync(path) && statSync(path).isDirectory();
  const dir = isDir ? path : dirname(path);
  const jsonPath = !isDir && path.endsWith(".json") ? path : join(dir, "tokenizer.json");
  if (!existsSync(jsonPath)) {
    throw new TpError(
      "E_IO",
      "no tokenizer.json beside the checkpoint; put the model's tokenizer.json (and tokenizer_config.json) in its directory",
      { file: jsonPath },
    );
  }
  const cfgPath = join(dir, "tokenizer_config.json");
  const genPath = join(dir, "generation_config.json");
  return tokenizerFromHfJson(readJson(jsonPath), {
    source: jsonPath,
    config: existsSync(cfgPath) ? readJson(cfgPath) : undefined,
    generationConfig: existsSync(genPath) ? readJson(genPath) : undefined,
  });
}
