/**
 * Multi-turn chat over a {@link GenerationSession}: keep the transcript, render the whole conversation
 * with the chat template every turn, and let the session reuse the KV cache up to the longest common
 * prefix with what it holds (so a turn prefills only its new tokens; where the template rewrites
 * history — Qwen3 drops earlier thoughts — the cache rewinds to the first differing token).
 *
 * Source: ../shared/spec/llm.md §5.3 "Render-driven" steps 1–4 (transcript, render with
 * `add_generation_prompt`, longest common prefix, store the raw reply).
 */
import { type ChatMessage, type ChatTemplate, chatPromptIds } from "./chat.ts";
import type { GenerateOptions, GenerateResult, GenerationSession } from "./generate.ts";

/** Options of {@link ChatSession}. */
export interface ChatSessionOptions {
  /** A system message put first in every rendering (kept across `reset`). */
  system?: string;
  /** Qwen3 `enable_thinking` (undefined: the template's default). */
  enableThinking?: boolean;
}

/**
 * A conversation with a model through its chat template.
 *
 * @example
 * const chat = new ChatSession(new GenerationSession(model, tok), chatTemplateFor(tok), { system: "Be brief." });
 * const r = await chat.send("Hi!", { sampling: { temperature: 0.7 }, onText: (t) => process.stdout.write(t) });
 */
export class ChatSession {
  readonly session: GenerationSession;
  readonly template: ChatTemplate;
  readonly options: Readonly<ChatSessionOptions>;
  #messages: ChatMessage[] = [];

  constructor(session: GenerationSession, template: ChatTemplate, options: ChatSessionOptions = {}) {
    this.session = session;
    this.template = template;
    this.options = Object.freeze({ ...options });
    this.#clear();
  }

  /** The transcript (system message first when there is one); a copy. */
  get messages(): ChatMessage[] {
    return this.#messages.map((m) => ({ ...m }));
  }

  /** The prompt ids the next `send(text)` would run (the whole conversation plus the generation prompt). */
  promptIds(text: string): number[] {
    return chatPromptIds(
      this.session.tokenizer,
      this.template,
      [...this.#messages, { role: "user", content: text }],
      this.options.enableThinking === undefined ? {} : { enableThinking: this.options.enableThinking },
    );
  }

  /**
   * Add a user message, generate the assistant's answer and add it to the transcript (also when the
   * answer was cut short by the abort signal, the budget or the context window).
   * @throws TpError from the template (E_ARG when it refuses the conversation) or from
   *   {@link GenerationSession.generate} (E_ARG "context window full"); the transcript is unchanged then
   */
  async send(text: string, options: GenerateOptions = {}): Promise<GenerateResult> {
    const ids = this.promptIds(text);
    const result = await this.session.generate(ids, options);
    this.#messages.push({ role: "user", content: text }, { role: "assistant", content: result.text });
    return result;
  }

  /** Forget the conversation (keeping the system message) and the KV cache (`/reset`). */
  reset(): void {
    this.#clear();
    this.session.reset();
  }

  #clear(): void {
    this.#messages =
      this.options.system === undefined ? [] : [{ role: "system", content: this.options.system }];
  }
}
