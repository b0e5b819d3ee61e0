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
import { Environment, Interpreter, Template } from "@huggingface/jinja";
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
  /**
   * Where in that file the template sits, for messages (GGUF `tokenizer.chat_template`,
   * `tokenizer_config.json` `chat_template`). Default: `tokenizer.chat_template` for a template of
   * kind `"model"`, else the built-in template's name.
   */
  key?: string;
  /** Most evaluation steps of one render (default {@link TEMPLATE_STEP_BUDGET}). */
  stepBudget?: number;
}

/**
 * Evaluation steps (Jinja expressions and statements, plus one per `range()` element) a render may take
 * on top of 2,000 per message (Qwen3's and Gemma 3's take about 60 per message, 300 for a one-message render; a step costs about 1 µs). Past it a render stops
 * with E_FORMAT instead of running (`{% for i in range(100000000) %}`) until the process dies.
 */
export const TEMPLATE_STEP_BUDGET = 1_000_000;

/**
 * Characters that the strings a render computes may add up to, on top of 64 per character of the
 * messages (each string value an expression produces is counted, so output built by doubling or by
 * loops is bounded before it is assembled). Past it a render stops with E_FORMAT.
 */
export const TEMPLATE_CHAR_BUDGET = 1 << 26;

/** A render went past its step or character budget. */
class TemplateBudgetError extends Error {}

type EvalArgs = Parameters<Interpreter["evaluate"]>;
type EvalResult = ReturnType<Interpreter["evaluate"]>;

/** The interpreter of @huggingface/jinja with a step and a character budget (see TEMPLATE_STEP_BUDGET). */
class BoundedInterpreter extends Interpreter {
  steps = 0;
  chars = 0;
  readonly maxSteps: number;
  readonly maxChars: number;
  constructor(env: Environment, maxSteps: number, maxChars: number) {
    super(env);
    this.maxSteps = maxSteps;
    this.maxChars = maxChars;
  }
  /** Count `n` steps. @throws TemplateBudgetError past the budget */
  charge(n: number): void {
    this.steps += n;
    if (this.steps > this.maxSteps)
      throw new TemplateBudgetError(`it takes more than ${this.maxSteps} evaluation steps`);
  }
  override evaluate(statement: EvalArgs[0], environment: EvalArgs[1]): EvalResult {
    this.charge(1);
    const v = super.evaluate(statement, environment);
    if (typeof v.value === "string") {
      this.chars += v.value.length;
      if (this.chars > this.maxChars)
        throw new TemplateBudgetError(`its strings add up to more than ${this.maxChars} characters`);
    }
    return v;
  }
}

/** strftime for `strftime_now` (the directives chat templates use: %Y %y %m %d %e %b %B %a %A %H %I %M %S %p %j %%). */
function strftime(date: Date, format: string): string {
  const pad = (n: number, w = 2) => String(n).padStart(w, "0");
  const name = (o: Intl.DateTimeFormatOptions) => new Intl.DateTimeFormat("en-US", o).format(date);
  const start = new Date(date.getFullYear(), 0, 1);
  const day = Math.floor((date.getTime() - start.getTime()) / 86_400_000) + 1;
  return format.replace(/%[YymdebBaAHIMSpj%]/g, (t) => {
    switch (t) {
      case "%Y":
        return String(date.getFullYear());
      case "%y":
        return pad(date.getFullYear() % 100);
      case "%m":
        return pad(date.getMonth() + 1);
      case "%d":
        return pad(date.getDate());
      case "%e":
        return String(date.getDate()).padStart(2, " ");
      case "%b":
        return name({ month: "short" });
      case "%B":
        return name({ month: "long" });
      case "%a":
        return name({ weekday: "short" });
      case "%A":
        return name({ weekday: "long" });
      case "%H":
        return pad(date.getHours());
      case "%I":
        return pad(((date.getHours() + 11) % 12) + 1);
      case "%M":
        return pad(date.getMinutes());
      case "%S":
        return pad(date.getSeconds());
      case "%p":
        return date.getHours() < 12 ? "AM" : "PM";
      case "%j":
        return pad(day, 3);
      default:
        return "%";
    }
  });
}

/**
 * The global variables of a render, as @huggingface/jinja's `Template.render` sets them, with `range`
 * charging one step per element before building the list (so `range(10**8)` fails at once).
 */
function renderEnvironment(interp: () => BoundedInterpreter): Environment {
  const env = new Environment();
  for (const [k, v] of [
    ["false", false],
    ["true", true],
    ["none", null],
    ["False", false],
    ["True", true],
    ["None", null],
  ] as const)
    env.set(k, v);
  env.set("raise_exception", (message: unknown) => {
    throw new Error(String(message));
  });
  env.set("strftime_now", (format: unknown) => strftime(new Date(), String(format)));
  env.set("range", (start: unknown, stop?: unknown, step: unknown = 1) => {
    const [a, b] = stop === undefined ? [0, start] : [start, stop];
    if (typeof a !== "number" || typeof b !== "number" || typeof step !== "number")
      throw new Error("range() arguments must be numbers");
    if (step === 0) throw new Error("range() step must not be zero");
    const n = Math.max(0, Math.ceil((b - a) / step));
    interp().charge(n);
    return Array.from({ length: n }, (_, i) => a + i * step);
  });
  return env;
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
  readonly #key: string;
  readonly #stepBudget: number;

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
    this.#key =
      options.key ??
      (this.kind === "model" ? "tokenizer.chat_template" : `the built-in ${this.kind} template`);
    this.#stepBudget = options.stepBudget ?? TEMPLATE_STEP_BUDGET;
    try {
      this.#template = new Template(source);
    } catch (e) {
      throw new TpError("E_FORMAT", `${this.#key} does not parse: ${(e as Error).message}`, {
        ...(options.source ? { file: options.source } : {}),
        cause: e,
      });
    }
  }

  /**
   * Render a conversation to the prompt text, with the variables Hugging Face and llama.cpp pass:
   * `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, `enable_thinking` (when given),
   * `tools` (when given), and the `raise_exception` / `strftime_now` helpers.
   * Rendering is bounded: more than {@link TEMPLATE_STEP_BUDGET} (+ 2,000 per message) evaluation
   * steps, strings adding up to more than {@link TEMPLATE_CHAR_BUDGET} (+ 64 per message character),
   * runaway recursion or running out of memory stop it.
   * @throws TpError E_ARG when the template rejects the conversation (e.g. Gemma's "roles must
   *   alternate") or fails while rendering; the message quotes the template's own. E_FORMAT naming the
   *   file and the template's key (`tokenizer.chat_template`) when it goes past the bounds
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
    let inputChars = 0;
    for (const m of msgs) inputChars += contentText(m.content).length + (m.reasoning_content?.length ?? 0);
    let interpreter: BoundedInterpreter | undefined;
    const env = renderEnvironment(() => interpreter as BoundedInterpreter);
    for (const [k, v] of Object.entries(vars)) env.set(k, v);
    interpreter = new BoundedInterpreter(
      env,
      this.#stepBudget + 2000 * msgs.length,
      TEMPLATE_CHAR_BUDGET + 64 * inputChars,
    );
    const where = this.#where ? { file: this.#where } : {};
    try {
      const out = interpreter.run(this.#template.parsed).value;
      return typeof out === "string" ? out : String(out);
    } catch (e) {
      // Out of the budget, of memory (RangeError: string too long, out of memory) or of stack (runaway
      // macro recursion): the template is at fault, whatever the conversation.
      if (e instanceof TemplateBudgetError || e instanceof RangeError)
        throw new TpError(
          "E_FORMAT",
          `${this.#key} cannot be rendered: ${e instanceof TemplateBudgetError ? e.message : `it ran out of resources (${e.message})`}; the template is broken`,
          { ...where, cause: e },
        );
      throw new TpError("E_ARG", `the chat template refused the conversation: ${(e as Error).message}`, {
        ...where,
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
    return new ChatTemplate(own, {
      ...tokenOptions,
      kind: "model",
      key:
        options.template !== undefined
          ? "the chat template given"
          : tokenizer.source.endsWith(".json")
            ? "tokenizer_config.json chat_template"
            : "tokenizer.chat_template",
    });
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
