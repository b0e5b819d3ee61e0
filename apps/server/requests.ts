/**
 * The request bodies of `/v1/chat/completions` and `/v1/completions`, checked: every field the server
 * reads has its type and range checked, and a bad one is a 400 naming it (OpenAI's `param`). Field
 * names are OpenAI's, plus llama-server's extensions (`top_k`, `min_p`, `repeat_penalty`,
 * `repeat_last_n`, `n_probs`, `ignore_eos`, `chat_template_kwargs`).
 * Sources: the OpenAI API reference (Chat Completions, Completions); llama.cpp
 * `tools/server/README.md` (the extra sampling fields and their defaults).
 */
import { type ChatMessage, DEFAULT_SAMPLING, type SamplingParams } from "@tp/llm";
import { badRequest } from "./errors.ts";

/** Most stop strings per request. */
export const MAX_STOP_STRINGS = 16;
/** Most `top_logprobs` / `n_probs`. */
export const MAX_TOP_LOGPROBS = 20;

/** What a completion request asks for, checked. */
export interface GenerationRequest {
  model: string | undefined;
  stream: boolean;
  includeUsage: boolean;
  maxTokens: number | undefined;
  sampling: SamplingParams;
  seed: bigint | undefined;
  stop: string[];
  /** Log-probs of the chosen tokens: undefined = none; else how many alternatives per token. */
  logprobs: number | undefined;
  /** response_format / grammar, raw (checked where it is compiled). */
  responseFormat: unknown;
  grammar: string | undefined;
  /** llama-server's `ignore_eos`: end-of-generation tokens do not end the answer. */
  ignoreEos: boolean;
}

/** A chat request. */
export interface ChatRequest extends GenerationRequest {
  messages: ChatMessage[];
  tools: unknown[] | undefined;
  toolChoice: unknown;
  enableThinking: boolean | undefined;
}

/** A text completion request. */
export interface CompletionRequest extends GenerationRequest {
  /** A string, or token ids. */
  prompt: string | number[];
  echo: boolean;
}

type Body = Record<string, unknown>;

function isObject(v: unknown): v is Body {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** The parsed JSON body, which must be an object. */
export function asObject(v: unknown): Body {
  if (typeof v !== "object" || v === null || Array.isArray(v))
    throw badRequest("the request body must be a JSON object");
  return v as Body;
}

function num(b: Body, key: string, ok: (x: number) => boolean, range: string): number | undefined {
  const v = b[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "number" || !Number.isFinite(v) || !ok(v))
    throw badRequest(`'${key}' must be ${range}, got ${JSON.stringify(v)}`, key);
  return v;
}

function int(b: Body, key: string, ok: (x: number) => boolean, range: string): number | undefined {
  return num(b, key, (x) => Number.isSafeInteger(x) && ok(x), range);
}

function bool(b: Body, key: string): boolean | undefined {
  const v = b[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "boolean")
    throw badRequest(`'${key}' must be true or false, got ${JSON.stringify(v)}`, key);
  return v;
}

function str(b: Body, key: string): string | undefined {
  const v = b[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "string") throw badRequest(`'${key}' must be a string`, key);
  return v;
}

/** The fields both endpoints share. */
function generation(b: Body, logprobs: number | undefined): GenerationRequest {
  const n = int(b, "n", (x) => x === 1, "1 (one choice per request)");
  void n;
  const sampling: SamplingParams = { ...DEFAULT_SAMPLING };
  sampling.temperature =
    num(b, "temperature", (x) => x >= 0 && x <= 100, "a number from 0 to 100") ?? sampling.temperature;
  sampling.topP = num(b, "top_p", (x) => x >= 0 && x <= 1, "a number from 0 to 1") ?? sampling.topP;
  sampling.topK = int(b, "top_k", (x) => x >= 0, "an integer ≥ 0") ?? sampling.topK;
  sampling.minP = num(b, "min_p", (x) => x >= 0 && x <= 1, "a number from 0 to 1") ?? sampling.minP;
  sampling.repeatPenalty = num(b, "repeat_penalty", (x) => x > 0, "a number > 0") ?? sampling.repeatPenalty;
  sampling.repeatLastN = int(b, "repeat_last_n", (x) => x >= -1, "an integer ≥ -1") ?? sampling.repeatLastN;
  sampling.presencePenalty =
    num(b, "presence_penalty", (x) => x >= -2 && x <= 2, "a number from -2 to 2") ?? sampling.presencePenalty;
  sampling.frequencyPenalty =
    num(b, "frequency_penalty", (x) => x >= -2 && x <= 2, "a number from -2 to 2") ??
    sampling.frequencyPenalty;
  const seedValue = b.seed;
  let seed: bigint | undefined;
  if (seedValue !== undefined && seedValue !== null) {
    if (typeof seedValue !== "number" || !Number.isSafeInteger(seedValue))
      throw badRequest(`'seed' must be an integer, got ${JSON.stringify(seedValue)}`, "seed");
    seed = BigInt.asUintN(64, BigInt(seedValue));
  }
  const stopValue = b.stop;
  let stop: string[] = [];
  if (typeof stopValue === "string") stop = [stopValue];
  else if (Array.isArray(stopValue)) {
    if (stopValue.length > MAX_STOP_STRINGS || !stopValue.every((s) => typeof s === "string"))
      throw badRequest(`'stop' must be a string or at most ${MAX_STOP_STRINGS} strings`, "stop");
    stop = stopValue as string[];
  } else if (stopValue !== undefined && stopValue !== null)
    throw badRequest("'stop' must be a string or a list of strings", "stop");
  const maxTokens =
    int(b, "max_completion_tokens", (x) => x >= 1, "an integer ≥ 1") ??
    int(b, "max_tokens", (x) => x >= 1, "an integer ≥ 1") ??
    int(b, "n_predict", (x) => x >= 1, "an integer ≥ 1");
  const streamOptions = b.stream_options;
  if (streamOptions !== undefined && streamOptions !== null && !isObject(streamOptions))
    throw badRequest("'stream_options' must be an object", "stream_options");
  const includeUsage =
    typeof streamOptions === "object" &&
    streamOptions !== null &&
    (streamOptions as Body).include_usage === true;
  return {
    model: str(b, "model"),
    stream: bool(b, "stream") ?? false,
    includeUsage,
    maxTokens,
    sampling,
    seed,
    stop,
    logprobs,
    responseFormat: b.response_format ?? undefined,
    grammar: str(b, "grammar"),
    ignoreEos: bool(b, "ignore_eos") ?? false,
  };
}

const ROLES = new Set(["system", "developer", "user", "assistant", "tool"]);

/** Check one message: a known role, content a string or text parts (or null beside tool calls). */
function message(m: unknown, i: number): ChatMessage {
  const param = `messages[${i}]`;
  if (typeof m !== "object" || m === null || Array.isArray(m))
    throw badRequest(`${param} must be an object`, param);
  const o = m as Body;
  if (typeof o.role !== "string" || !ROLES.has(o.role))
    throw badRequest(`${param}.role must be one of ${[...ROLES].join(", ")}`, `${param}.role`);
  let content: ChatMessage["content"];
  if (typeof o.content === "string") content = o.content;
  else if (Array.isArray(o.content)) {
    const parts = o.content.map((p, j) => {
      if (
        typeof p !== "object" ||
        p === null ||
        (p as Body).type !== "text" ||
        typeof (p as Body).text !== "string"
      )
        throw badRequest(
          `${param}.content[${j}] must be a text part {type: "text", text}`,
          `${param}.content`,
        );
      return { type: "text" as const, text: (p as Body).text as string };
    });
    content = parts;
  } else if ((o.content === null || o.content === undefined) && o.role === "assistant") content = "";
  else throw badRequest(`${param}.content must be a string or a list of text parts`, `${param}.content`);
  const out: ChatMessage = { ...o, role: o.role === "developer" ? "system" : o.role, content };
  if (o.tool_calls !== undefined) {
    if (!Array.isArray(o.tool_calls))
      throw badRequest(`${param}.tool_calls must be a list`, `${param}.tool_calls`);
    // templates read arguments as an object (Qwen3 `tool_call.arguments | tojson`)
    out.tool_calls = o.tool_calls.map((c) => {
      const f = (c as Body)?.function as Body | undefined;
      if (f !== undefined && typeof f.arguments === "string") {
        try {
          return { ...(c as Body), function: { ...f, arguments: JSON.parse(f.arguments) } };
        } catch {
          return c;
        }
      }
      return c;
    });
  }
  return out;
}

/** Check a `/v1/chat/completions` body. @throws ApiError 400 naming the field */
export function parseChatRequest(v: unknown): ChatRequest {
  const b = asObject(v);
  if (!Array.isArray(b.messages) || b.messages.length === 0)
    throw badRequest("'messages' must be a non-empty list", "messages");
  const messages = b.messages.map(message);
  const wantLogprobs = bool(b, "logprobs") ?? false;
  const top = int(
    b,
    "top_logprobs",
    (x) => x >= 0 && x <= MAX_TOP_LOGPROBS,
    `an integer from 0 to ${MAX_TOP_LOGPROBS}`,
  );
  const nProbs = int(
    b,
    "n_probs",
    (x) => x >= 0 && x <= MAX_TOP_LOGPROBS,
    `an integer from 0 to ${MAX_TOP_LOGPROBS}`,
  );
  const logprobs = wantLogprobs ? (top ?? 0) : nProbs !== undefined && nProbs > 0 ? nProbs : undefined;
  const tools = b.tools;
  if (tools !== undefined && tools !== null && !Array.isArray(tools))
    throw badRequest("'tools' must be a list", "tools");
  if (Array.isArray(tools))
    tools.forEach((t, i) => {
      const f = isObject(t) && t.type === "function" ? t.function : undefined;
      if (!isObject(f) || typeof f.name !== "string" || f.name === "")
        throw badRequest(`tools[${i}] must be {type: "function", function: {name, parameters}}`, "tools");
    });
  const choice = b.tool_choice;
  if (choice !== undefined && choice !== null) {
    const named =
      isObject(choice) && choice.type === "function" && isObject(choice.function)
        ? choice.function.name
        : undefined;
    if (!(choice === "none" || choice === "auto" || choice === "required" || typeof named === "string"))
      throw badRequest(
        `'tool_choice' must be "none", "auto", "required" or {type: "function", function: {name}}`,
        "tool_choice",
      );
    if (choice !== "none" && choice !== "auto" && !(Array.isArray(tools) && tools.length > 0))
      throw badRequest("tool_choice 'required' or a named function needs a non-empty 'tools'", "tool_choice");
  }
  const kwargs = b.chat_template_kwargs;
  if (kwargs !== undefined && kwargs !== null && !isObject(kwargs))
    throw badRequest("'chat_template_kwargs' must be an object", "chat_template_kwargs");
  let enableThinking: boolean | undefined;
  if (isObject(kwargs)) {
    const e = (kwargs as Body).enable_thinking;
    if (e !== undefined && typeof e !== "boolean")
      throw badRequest("chat_template_kwargs.enable_thinking must be true or false", "chat_template_kwargs");
    enableThinking = e as boolean | undefined;
  }
  return {
    ...generation(b, logprobs),
    messages,
    tools: Array.isArray(tools) && tools.length > 0 ? tools : undefined,
    toolChoice: b.tool_choice,
    enableThinking,
  };
}

/** Check a `/v1/completions` body. @throws ApiError 400 naming the field */
export function parseCompletionRequest(v: unknown): CompletionRequest {
  const b = asObject(v);
  let prompt: string | number[];
  const p = b.prompt;
  if (typeof p === "string") prompt = p;
  else if (Array.isArray(p) && p.length === 1 && typeof p[0] === "string") prompt = p[0];
  else if (Array.isArray(p) && p.length > 0 && p.every((x) => Number.isSafeInteger(x)))
    prompt = p as number[];
  else
    throw badRequest(
      "'prompt' must be a string, or a non-empty list of token ids (one prompt per request)",
      "prompt",
    );
  const lp = int(
    b,
    "logprobs",
    (x) => x >= 0 && x <= MAX_TOP_LOGPROBS,
    `an integer from 0 to ${MAX_TOP_LOGPROBS}`,
  );
  const nProbs = int(
    b,
    "n_probs",
    (x) => x >= 0 && x <= MAX_TOP_LOGPROBS,
    `an integer from 0 to ${MAX_TOP_LOGPROBS}`,
  );
  return {
    ...generation(b, lp ?? (nProbs !== undefined && nProbs > 0 ? nProbs : undefined)),
    prompt,
    echo: bool(b, "echo") ?? false,
  };
}
