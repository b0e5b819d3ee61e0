/**
 * Chat templates: render a conversation with the model's own Jinja template
 * (`tokenizer.chat_template` in GGUF, `chat_template` in tokenizer_config.json) through
 * `@huggingface/jinja`, or a built-in ChatML / plain template where the file has none, and turn the
 * result into prompt ids the way llama.cpp does.
 *
 * Sources: ../shared/spec/llm.md §5 (Qwen ChatML and thinking, Gemma 3, what to keep from the Zig
 * renderer) and §11.2 decision 2 (user text must not inject control tokens); llama.cpp
 * `common/chat.cpp` (`common_chat_templates_init`: `bos_token`/`eos_token` are the BOS/EOS pieces of
 * the vocabulary, ChatML when a model has no template; `apply`: a leading BOS text is removed when
 * the vocabulary adds BOS itself, a trailing EOS text when it adds EOS) and `src/llama-chat.cpp`
 * (`LLM_CHAT_TEMPLATE_CHATML`).
 */
import { Template } from "@huggingface/jinja";
import { TpError } from "@tp/tensor";
import type { Tokenizer } from "@tp/tokenizer";

/** One part of a multi-part message (`{type: "text", text}`, `{type: "image"}`, …). */
export type ChatContentPart = { type: "text"; text: string } | { type: string; [key: string]: unknown };

/** A chat message as Hugging Face chat templates expect it. */
export interface ChatMessage {
  /** `system`, `user`, `assistant` or `tool`. */
  role: string;
  /** Text, or a list of parts. */
  content: string | ChatContentPart[];
  /** Qwen3: the thoughts of an assistant turn, when kept apart from `content`. */
  reasoning_content?: string;
  /** Tool calls of an assistant turn (rendered by templates that support tools). */
  tool_calls?: unknown[];
  [key: string]: unknown;
}

/** Options of {@link ChatTemplate.render} and {@link chatPromptIds}. */
export interface ChatRenderOptions {
  /** Open the assistant turn at the end (`add_generation_prompt`). Default true. */
  addGenerationPrompt?: boolean;
  /**
   * Qwen3 hybrid thinking (`enable_thinking`): false makes the Qwen3 template (and the ChatML
   * fallback) append an empty `<think>\n\n</think>\n\n`; undefined leaves the template's default
   * (thinking on).
   */
  enableThinking?: boolean;
  /** Tool definitions (`tools`), for templates that render them. */
  tools?: unknown[];
  /** More template variables. */
  variables?: Record<string, unknown>;
}

/**
 * llama.cpp's built-in ChatML (`LLM_CHAT_TEMPLATE_CHATML`), the fallback for files without a template
 * whose vocabulary has `<|im_start|>`/`<|im_end|>`; plus Qwen3's empty thought when `enable_thinking`
 * is false (llm.md §5.1).
 */
export const CHATML_TEMPLATE = `{%- for message in messages -%}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}
{%- endif -%}`;

/**
 * The plain fallback, for base models without chat tokens (stories260K, Llama 2 base): the message
 * texts joined by blank lines, no roles, nothing for the generation prompt. One user message renders
 * as itself, i.e. a plain-text continuation.
 */
export const PLAIN_TEMPLATE = `{%- for message in messages -%}
{%- if not loop.first -%}{{- '\\n\\n' -}}{%- endif -%}
{{- message.content -}}
{%- endfor -%}`;

/** Where a template came from. */
export type ChatTemplateKind = "model" | "chatml" | "plain";

/** Options of {@link ChatTemplate}. */
export interface ChatTemplateOptions {
  /** Where the template came from (default `"model"`). Built-ins get message content flattened to text. */
  kind?: ChatTemplateKind;
  /** The `bos_token` variable (llama.cpp: the BOS piece of the vocabulary, "" when there is none). */
  bosToken?: string;
  /** The `eos_token` variable. */
  eosToken?: string;
  /** File the template came from, for messages. */
  source?: string;
}

/** The text of a message's content: a string, or its text parts concatenated. */
function contentText(content: ChatMessage["content"]): string {
  if (typeof content === "string") return content;
  return content.map((p) => (p.type === "text" && typeof p.text === "string" ? p.text : "")).join("");
}

/** A compiled chat template. */
export class ChatTemplate {
  /** The Jinja source. */
  readonly source: string;
  readonly kind: ChatTemplateKind;
  /** Value of `bos_token` in renders. */
  readonly bosToken: string;
  /** Value of `eos_token` in renders. */
  readonly eosToken: string;
  readonly #template: Template;
  readonly #where: string;

  /**
   * Compile `source`.
   * @throws TpError E_FORMAT (naming `options.source`) when the template does not parse
   */
  constructor(source: string, options: ChatTemplateOptions = {}) {
    this.source = source;
    this.kind = options.kind ?? "model";
    this.bosToken = options.bosToken ?? "";
    this.eosToken = options.eosToken ?? "";
    this.#where = options.source ?? "";
    try {
      this.#template = new Template(source);
    } catch (e) {
      throw new TpError("E_FORMAT", `the chat template does not parse: ${(e as Error).message}`, {
        ...(options.source ? { file: options.source } : {}),
        cause: e,
      });
    }
  }

  /**
   * Render a conversation to the prompt text, with the variables Hugging Face and llama.cpp pass:
   * `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, `enable_thinking` (when given),
   * `tools` (when given), and the `raise_exception` / `strftime_now` helpers.
   * @throws TpError E_ARG when the template rejects the conversation (e.g. Gemma's "roles must
   *   alternate") or fails while rendering; the message quotes the template's own
   */
  render(messages: readonly ChatMessage[], options: ChatRenderOptions = {}): string {
    const msgs =
      this.kind === "model" ? messages : messages.map((m) => ({ ...m, content: contentText(m.content) }));
    const vars: Record<string, unknown> = {
      ...options.variables,
      messages: msgs,
      add_generation_prompt: options.addGenerationPrompt ?? true,
      bos_token: this.bosToken,
      eos_token: this.eosToken,
    };
    if (options.enableThinking !== undefined) vars.enable_thinking = options.enableThinking;
    if (options.tools !== undefined) vars.tools = options.tools;
    try {
      return this.#template.render(vars);
    } catch (e) {
      throw new TpError("E_ARG", `the chat template refused the conversation: ${(e as Error).message}`, {
        ...(this.#where ? { file: this.#where } : {}),
        cause: e,
      });
    }
  }
}

/** Options of {@link chatTemplateFor}. */
export interface ChatTemplateForOptions {
  /** Use this Jinja source instead of the file's (e.g. a `--chat-template` flag). */
  template?: string;
  /**
   * What to use when the file has no template: `"auto"` (default) picks ChatML when the vocabulary has
   * `<|im_start|>` and `<|im_end|>` tokens, else plain; `"chatml"` and `"plain"` force one.
   */
  fallback?: "auto" | "chatml" | "plain";
}

/**
 * The chat template of a model: its own (`tokenizer.chatTemplate`), else a built-in fallback, with
 * `bos_token`/`eos_token` set to the texts of the vocabulary's BOS/EOS tokens, as llama.cpp passes
 * them.
 * @throws TpError E_FORMAT when the template does not parse
 */
export function chatTemplateFor(tokenizer: Tokenizer, options: ChatTemplateForOptions = {}): ChatTemplate {
  const { bos, eos } = tokenizer.special;
  const tokenOptions = {
    bosToken: bos === undefined ? "" : tokenizer.tokenText(bos),
    eosToken: eos === undefined ? "" : tokenizer.tokenText(eos),
    source: tokenizer.source,
  };
  const own = options.template ?? tokenizer.chatTemplate;
  if (own !== undefined && own.trim() !== "")
    return new ChatTemplate(own, { ...tokenOptions, kind: "model" });
  let kind = options.fallback ?? "auto";
  if (kind === "auto") {
    const chatml =
      tokenizer.tokenId("<|im_start|>") !== undefined && tokenizer.tokenId("<|im_end|>") !== undefined;
    kind = chatml ? "chatml" : "plain";
  }
  return new ChatTemplate(kind === "chatml" ? CHATML_TEMPLATE : PLAIN_TEMPLATE, { ...tokenOptions, kind });
}

/** Options of {@link chatPromptIds}. */
export interface ChatPromptOptions extends ChatRenderOptions {
  /**
   * Let control-token texts typed inside message content (`<|im_end|>`, `<start_of_turn>`) become
   * control tokens. Default false: they are tokenized as plain text (llm.md §11.2 decision 2), while
   * the template's own control tokens are parsed.
   */
  parseSpecialInContent?: boolean;
}

/** A private-use character found in none of `texts`, to mark user text while rendering. */
function markChar(texts: readonly string[]): string {
  for (let cp = 0xe000; cp <= 0xf8ff; cp++) {
    const c = String.fromCharCode(cp);
    if (!texts.some((t) => t.includes(c))) return c;
  }
  throw new TpError("E_ARG", "the conversation uses every private-use character; cannot mark user text");
}

/**
 * Render a conversation and tokenize it as llama.cpp does (`common_chat_templates_apply`, then
 * `common_tokenize(..., add_special = true, parse_special = true)`): when the vocabulary adds BOS
 * itself and the rendered text starts with the BOS text, that text is dropped so BOS appears once
 * (likewise a trailing EOS when it adds EOS). Control tokens typed inside the messages stay plain text
 * unless `parseSpecialInContent`: each is marked with a private-use character before rendering, and
 * the marked spans are passed to the tokenizer as literal.
 * @returns prompt ids, BOS included where the model needs it
 * @throws TpError see {@link ChatTemplate.render}
 */
export function chatPromptIds(
  tokenizer: Tokenizer,
  template: ChatTemplate,
  messages: readonly ChatMessage[],
  options: ChatPromptOptions = {},
): number[] {
  let msgs: readonly ChatMessage[] = messages;
  let mark = "";
  if (!options.parseSpecialInContent) {
    const texts = messages.flatMap((m) => [contentText(m.content), m.reasoning_content ?? ""]);
    mark = markChar([...texts, template.source]);
    const neutralize = (s: string): string => {
      const found = tokenizer.findControlTokens(s);
      if (found.length === 0) return s;
      let out = "";
      let at = 0;
      for (const m of found) {
        out += `${s.slice(at, m.start + 1)}${mark}`;
        at = m.start + 1;
      }
      return out + s.slice(at);
    };
    msgs = messages.map((m) => {
      const copy: ChatMessage = {
        ...m,
        content:
          typeof m.content === "string"
            ? neutralize(m.content)
            : m.content.map((p) =>
                p.type === "text" && typeof p.text === "string" ? { ...p, text: neutralize(p.text) } : p,
              ),
      };
      if (typeof m.reasoning_content === "string") copy.reasoning_content = neutralize(m.reasoning_content);
      return copy;
    });
  }
  let text = template.render(msgs, options);
  if (tokenizer.addBos && template.bosToken !== "" && text.startsWith(template.bosToken))
    text = text.slice(template.bosToken.length);
  if (tokenizer.addEos && template.eosToken !== "" && text.endsWith(template.eosToken))
    text = text.slice(0, text.length - template.eosToken.length);
  // Remove the marks; each one sat right after the first character of a control-token text in user
  // content, so that token may not start one character before where the mark was.
  const literal: [number, number][] = [];
  if (mark !== "" && text.includes(mark)) {
    let out = "";
    let at = 0;
    for (let p = text.indexOf(mark); p >= 0; p = text.indexOf(mark, at)) {
      out += text.slice(at, p);
      literal.push([out.length - 1, out.length]);
      at = p + 1;
    }
    text = out + text.slice(at);
  }
  return tokenizer.encode(text, { addSpecial: true, parseSpecial: true, literal });
}
