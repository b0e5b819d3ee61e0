/**
 * The HTTP server: Bun.serve with the OpenAI routes as llama-server serves them —
 * `POST /v1/chat/completions`, `POST /v1/completions` (JSON or SSE `data:` chunks ending in
 * `data: [DONE]`), `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text) — plus the image
 * routes of ./images.ts when an image model is loaded, and the page at `/` (./web/index.html).
 * Every route but `/health` and the page checks the Bearer
 * key when one is set; bodies past `maxBodyBytes` are 413; every failure is the OpenAI error shape.
 *
 * Sources: the OpenAI API reference (Chat Completions, Completions, Models, streaming events);
 * llama.cpp `tools/server/README.md` (`/health`, `/metrics`, `timings`, `--api-key`).
 */
import { timingSafeEqual } from "node:crypto";
import { TpError } from "@tp/tensor";
import { jsonBody } from "./body.ts";
import { constraintFor } from "./constrain.ts";
import { ApiError, apiError, errorResponse } from "./errors.ts";
import type { ImageService } from "./images.ts";
import type { Answer, AnswerDelta, LlmEngine, TokenLogprob } from "./llm.ts";
import {
  type ChatRequest,
  type CompletionRequest,
  parseChatRequest,
  parseCompletionRequest,
} from "./requests.ts";
import { type ToolParse, toolCallsFrom } from "./tools.ts";

/** Options of {@link startServer}. */
export interface ServerOptions {
  llm?: LlmEngine | undefined;
  /** The image routes: an {@link ImageService}, or a queue front (./queue.ts). */
  images?: Pick<ImageService, "name" | "created" | "route" | "metrics"> | undefined;
  /** Without `llm`: answers the completion routes elsewhere (a queue front, ./queue.ts). */
  llmProxy?: ((req: Request, route: string) => Promise<Response>) | undefined;
  /** Default 127.0.0.1. */
  host?: string;
  /** 0 picks a free port. */
  port?: number;
  /** Bearer key required on every route but /health. */
  apiKey?: string | undefined;
  /** Largest request body. Default 1 MiB. */
  maxBodyBytes?: number;
}

/** A running server. */
export interface RunningServer {
  readonly url: string;
  readonly port: number;
  stop(): Promise<void>;
}

const enc = new TextEncoder();
/** The web page (chat and image jobs), served as it is. */
const PAGE = new URL("./web/index.html", import.meta.url).pathname;
const CORS = { "access-control-allow-origin": "*" };

function keyMatches(given: string, key: string): boolean {
  const a = enc.encode(given);
  const b = enc.encode(key);
  return a.length === b.length && timingSafeEqual(a, b);
}

/** A random id with OpenAI's prefixes (chatcmpl-, cmpl-). */
function newId(prefix: string): string {
  return `${prefix}-${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`;
}

/** OpenAI's chat logprobs entry without our id. */
function chatLogprob(t: TokenLogprob) {
  return {
    token: t.token,
    logprob: t.logprob,
    bytes: t.bytes,
    top_logprobs: t.top_logprobs.map((a) => ({ token: a.token, logprob: a.logprob, bytes: a.bytes })),
  };
}

/** The legacy completions logprobs object. */
function completionLogprobs(list: TokenLogprob[], offset0: number) {
  let offset = offset0;
  const text_offset: number[] = [];
  for (const t of list) {
    text_offset.push(offset);
    offset += t.token.length;
  }
  return {
    tokens: list.map((t) => t.token),
    token_logprobs: list.map((t) => t.logprob),
    top_logprobs: list.map((t) => Object.fromEntries(t.top_logprobs.map((a) => [a.token, a.logprob]))),
    text_offset,
  };
}

function usage(a: Answer) {
  return {
    prompt_tokens: a.promptTokens,
    completion_tokens: a.completionTokens,
    total_tokens: a.promptTokens + a.completionTokens,
    prompt_tokens_details: { cached_tokens: a.cachedTokens },
  };
}

function timings(a: Answer) {
  return {
    cache_n: a.cachedTokens,
    prompt_n: a.promptTokens - a.cachedTokens,
    prompt_ms: a.promptMs,
    predicted_n: a.completionTokens,
    predicted_ms: a.predictedMs,
    predicted_per_second: a.predictedMs > 0 ? (a.completionTokens * 1000) / a.predictedMs : 0,
  };
}

/** An SSE response fed by `run(send)`; `send(undefined)` is never needed: [DONE] ends it. */
function sse(
  run: (send: (data: unknown) => void, signal: AbortSignal) => Promise<void>,
  requestSignal: AbortSignal,
): Response {
  const client = new AbortController();
  requestSignal.addEventListener("abort", () => client.abort(), { once: true });
  let closed = false;
  const stream = new ReadableStream<Uint8Array>({
    async start(controller) {
      const send = (data: unknown) => {
        if (!closed)
          controller.enqueue(
            enc.encode(`data: ${typeof data === "string" ? data : JSON.stringify(data)}\n\n`),
          );
      };
      try {
        await run(send, client.signal);
        send("[DONE]");
      } catch (e) {
        const err = apiError(e);
        if (err.status !== 499) send(err.body());
      } finally {
        if (!closed) {
          closed = true;
          controller.close();
        }
      }
    },
    cancel() {
      closed = true;
      client.abort();
    },
  });
  return new Response(stream, {
    headers: {
      "content-type": "text/event-stream",
      "cache-control": "no-cache",
      connection: "keep-alive",
      ...CORS,
    },
  });
}

/**
 * Start the server.
 * @throws when the port cannot be bound
 */
export function startServer(options: ServerOptions): RunningServer {
  const llm = options.llm;
  const images = options.images;
  const limit = options.maxBodyBytes ?? 1 << 20;
  const started = Date.now();
  const httpCounts = new Map<string, number>();
  const count = (route: string, status: number) => {
    const k = `${route}|${status}`;
    httpCounts.set(k, (httpCounts.get(k) ?? 0) + 1);
  };

  const checkModel = (model: string | undefined) => {
    if (llm === undefined)
      throw new ApiError(
        404,
        "not_found_error",
        "no language model is loaded (start the server with --model)",
        "model",
        "model_not_found",
      );
    if (model !== undefined && model !== llm.options.name)
      throw new ApiError(
        404,
        "not_found_error",
        `the model '${model}' does not exist; this server has '${llm.options.name}' (GET /v1/models)`,
        "model",
        "model_not_found",
      );
    return llm;
  };

  /** Run one generation on a slot: queue, constraint, answer; the slot is given back in every case. */
  const answer = async (
    engine: LlmEngine,
    prompt: number[],
    req: ChatRequest | CompletionRequest,
    onDelta: (d: AnswerDelta) => void,
    signal: AbortSignal,
  ): Promise<{ answer: Answer }> => {
    const constraint = constraintFor(engine.tokenizer, req);
    const slot = await engine.acquire(prompt, signal);
    try {
      return { answer: await engine.generate(slot, prompt, req, onDelta, signal, constraint) };
    } finally {
      engine.release(slot);
    }
  };

  const chat = async (req: Request): Promise<Response> => {
    if (llm === undefined) checkModel(undefined); // 404 before reading the body
    const r = parseChatRequest(await jsonBody(req, limit));
    const engine = checkModel(r.model);
    const prompt = engine.chatPrompt(r);
    const id = newId("chatcmpl");
    const created = Math.floor(Date.now() / 1000);
    const model = engine.options.name;
    const withTools = r.tools !== undefined && r.toolChoice !== "none";
    if (r.stream) {
      return sse(async (send, signal) => {
        const chunk = (delta: object, finish: string | null, logprobs: TokenLogprob[] | null = null) =>
          send({
            id,
            object: "chat.completion.chunk",
            created,
            model,
            choices: [
              {
                index: 0,
                delta,
                logprobs: logprobs === null ? null : { content: logprobs.map(chatLogprob) },
                finish_reason: finish,
              },
            ],
          });
        chunk({ role: "assistant", content: null }, null);
        // With tools the content is held until the end, where tool calls are parsed out of it.
        const { answer: a } = await answer(
          engine,
          prompt,
          r,
          (d) => {
            if (withTools && d.reasoning === "") return;
            const delta: Record<string, string> = {};
            if (d.reasoning !== "") delta.reasoning_content = d.reasoning;
            if (d.content !== "" && !withTools) delta.content = d.content;
            chunk(delta, null, r.logprobs === undefined ? null : d.logprobs);
          },
          signal,
        );
        if (a.aborted) return;
        let finish: string = a.finishReason;
        if (withTools) {
          const parsed: ToolParse = toolCallsFrom(a.content);
          if (parsed.content !== "") chunk({ content: parsed.content }, null);
          if (parsed.calls.length > 0) {
            chunk({ tool_calls: parsed.calls.map((c, index) => ({ index, ...c })) }, null);
            finish = "tool_calls";
          }
        }
        chunk({}, finish);
        if (r.includeUsage)
          send({
            id,
            object: "chat.completion.chunk",
            created,
            model,
            choices: [],
            usage: usage(a),
            timings: timings(a),
          });
      }, req.signal);
    }
    const { answer: a } = await answer(engine, prompt, r, () => {}, req.signal);
    if (a.aborted) return new Response(null, { status: 499 });
    let content = a.content;
    let finish: string = a.finishReason;
    let toolCalls: unknown[] | undefined;
    if (withTools) {
      const parsed = toolCallsFrom(a.content);
      content = parsed.content;
      if (parsed.calls.length > 0) {
        toolCalls = parsed.calls;
        finish = "tool_calls";
      }
    }
    const message: Record<string, unknown> = {
      role: "assistant",
      content: toolCalls !== undefined && content === "" ? null : content,
    };
    if (a.reasoning !== "") message.reasoning_content = a.reasoning;
    if (toolCalls !== undefined) message.tool_calls = toolCalls;
    return Response.json(
      {
        id,
        object: "chat.completion",
        created,
        model,
        choices: [
          {
            index: 0,
            message,
            logprobs: r.logprobs === undefined ? null : { content: a.logprobs.map(chatLogprob) },
            finish_reason: finish,
          },
        ],
        usage: usage(a),
        timings: timings(a),
      },
      { headers: CORS },
    );
  };

  const completion = async (req: Request): Promise<Response> => {
    if (llm === undefined) checkModel(undefined);
    const r = parseCompletionRequest(await jsonBody(req, limit));
    const engine = checkModel(r.model);
    const prompt = engine.completionPrompt(r);
    const id = newId("cmpl");
    const created = Math.floor(Date.now() / 1000);
    const model = engine.options.name;
    const echo = r.echo ? (typeof r.prompt === "string" ? r.prompt : engine.tokenizer.decode(r.prompt)) : "";
    if (r.stream) {
      return sse(async (send, signal) => {
        let offset = echo.length;
        const chunk = (text: string, finish: string | null, logprobs: TokenLogprob[] | null) => {
          send({
            id,
            object: "text_completion",
            created,
            model,
            choices: [
              {
                index: 0,
                text,
                logprobs: logprobs === null ? null : completionLogprobs(logprobs, offset),
                finish_reason: finish,
              },
            ],
          });
          offset += text.length;
        };
        if (echo !== "") chunk(echo, null, null);
        const { answer: a } = await answer(
          engine,
          prompt,
          r,
          (d) => chunk(d.reasoning + d.content, null, r.logprobs === undefined ? null : d.logprobs),
          signal,
        );
        if (a.aborted) return;
        chunk("", a.finishReason, null);
        if (r.includeUsage)
          send({
            id,
            object: "text_completion",
            created,
            model,
            choices: [],
            usage: usage(a),
            timings: timings(a),
          });
      }, req.signal);
    }
    const { answer: a } = await answer(engine, prompt, r, () => {}, req.signal);
    if (a.aborted) return new Response(null, { status: 499 });
    const text = echo + a.reasoning + a.content;
    return Response.json(
      {
        id,
        object: "text_completion",
        created,
        model,
        choices: [
          {
            index: 0,
            text,
            logprobs: r.logprobs === undefined ? null : completionLogprobs(a.logprobs, echo.length),
            finish_reason: a.finishReason,
          },
        ],
        usage: usage(a),
        timings: timings(a),
      },
      { headers: CORS },
    );
  };

  const models = (): Response => {
    const data: object[] = [];
    if (llm !== undefined)
      data.push({
        id: llm.options.name,
        object: "model",
        created: llm.created,
        owned_by: "tensorpencil",
        meta: { ctx: llm.options.ctx, parallel: llm.options.parallel, vocab_size: llm.tokenizer.vocabSize },
      });
    if (images !== undefined)
      data.push({ id: images.name, object: "model", created: images.created, owned_by: "tensorpencil" });
    return Response.json({ object: "list", data }, { headers: CORS });
  };

  const metrics = (): Response => {
    const lines: string[] = [];
    const metric = (name: string, type: "counter" | "gauge", help: string, values: [string, number][]) => {
      lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
      for (const [labels, v] of values) lines.push(`${name}${labels} ${Number.isFinite(v) ? v : 0}`);
    };
    metric(
      "tp_http_requests_total",
      "counter",
      "HTTP requests answered, by route and status.",
      [...httpCounts].map(([k, v]) => {
        const [route, status] = k.split("|");
        return [`{route="${route}",status="${status}"}`, v];
      }),
    );
    metric("tp_uptime_seconds", "gauge", "Seconds since the server started.", [
      ["", (Date.now() - started) / 1000],
    ]);
    if (llm !== undefined) {
      const c = llm.counters;
      const kv = llm.kvUse();
      metric("tp_llm_requests_total", "counter", "Completions finished.", [["", c.requests]]);
      metric("tp_llm_request_errors_total", "counter", "Completions failed by a model error.", [
        ["", c.errors],
      ]);
      metric("tp_llm_requests_rejected_total", "counter", "Requests answered 503 (queue full).", [
        ["", c.rejected],
      ]);
      metric("tp_llm_prompt_tokens_total", "counter", "Prompt tokens prefilled (cached ones excluded).", [
        ["", c.promptTokens],
      ]);
      metric("tp_llm_prompt_tokens_cached_total", "counter", "Prompt tokens reused from a slot's KV cache.", [
        ["", c.cachedTokens],
      ]);
      metric("tp_llm_generated_tokens_total", "counter", "Tokens generated.", [["", c.generatedTokens]]);
      metric("tp_llm_prompt_seconds_total", "counter", "Seconds spent in prefill.", [["", c.promptSeconds]]);
      metric("tp_llm_generation_seconds_total", "counter", "Seconds spent generating.", [
        ["", c.generationSeconds],
      ]);
      metric("tp_llm_tokens_per_second", "gauge", "Generation speed of the last finished answer.", [
        ["", llm.lastTokensPerSecond],
      ]);
      metric("tp_llm_queue_depth", "gauge", "Requests waiting for a slot.", [["", llm.queueDepth]]);
      metric("tp_llm_slots_busy", "gauge", "Slots generating now.", [["", llm.busySlots]]);
      metric("tp_llm_slots", "gauge", "Slots (--parallel).", [["", llm.slots.length]]);
      metric("tp_llm_kv_cache_tokens", "gauge", "Tokens held in the slots' KV caches.", [["", kv.tokens]]);
      metric("tp_llm_kv_cache_usage_ratio", "gauge", "KV cache tokens / (slots × ctx).", [
        ["", kv.capacity > 0 ? kv.tokens / kv.capacity : 0],
      ]);
      metric("tp_llm_kv_cache_bytes", "gauge", "Backend bytes of the KV caches.", [["", kv.bytes]]);
      if (llm.batcher !== null) {
        metric("tp_llm_batched_forwards_total", "counter", "Decode forwards run by the batcher.", [
          ["", llm.batcher.forwards],
        ]);
        metric("tp_llm_batched_rows_total", "counter", "Sequence steps those forwards carried.", [
          ["", llm.batcher.rows],
        ]);
      }
    }
    if (images !== undefined) images.metrics(metric);
    return new Response(`${lines.join("\n")}\n`, {
      headers: { "content-type": "text/plain; version=0.0.4" },
    });
  };

  const route = async (req: Request, url: URL): Promise<[string, Response]> => {
    const path = url.pathname;
    const method = req.method;
    if (method === "OPTIONS")
      return [
        path,
        new Response(null, {
          status: 204,
          headers: {
            ...CORS,
            "access-control-allow-headers": "authorization, content-type",
            "access-control-allow-methods": "GET, POST, DELETE",
          },
        }),
      ];
    if (path === "/health" && method === "GET") return [path, Response.json({ status: "ok" })];
    // the page holds no data: it asks for the key and sends it with each API call
    if ((path === "/" || path === "/index.html") && method === "GET")
      return ["/", new Response(Bun.file(PAGE), { headers: { "content-type": "text/html; charset=utf-8" } })];
    if (options.apiKey !== undefined) {
      const auth = req.headers.get("authorization") ?? "";
      const m = /^Bearer (.+)$/.exec(auth);
      if (m === null || !keyMatches(m[1] as string, options.apiKey))
        throw new ApiError(
          401,
          "authentication_error",
          "a valid API key is required: send 'Authorization: Bearer KEY' (--api-key)",
          null,
          "invalid_api_key",
        );
    }
    if (path === "/v1/models" || path === "/models") {
      if (method === "GET") return ["/v1/models", models()];
    } else if (path === "/v1/chat/completions" || path === "/chat/completions") {
      if (method === "POST" && llm === undefined && options.llmProxy !== undefined)
        return ["/v1/chat/completions", await options.llmProxy(req, "/v1/chat/completions")];
      if (method === "POST") return ["/v1/chat/completions", await chat(req)];
    } else if (path === "/v1/completions" || path === "/completions") {
      if (method === "POST" && llm === undefined && options.llmProxy !== undefined)
        return ["/v1/completions", await options.llmProxy(req, "/v1/completions")];
      if (method === "POST") return ["/v1/completions", await completion(req)];
    } else if (path === "/metrics") {
      if (method === "GET") return [path, metrics()];
    } else if (images !== undefined) {
      const r = await images.route(req, url, limit);
      if (r !== undefined) return r;
    } else if (path.startsWith("/v1/images") || path.startsWith("/v1/jobs"))
      throw new ApiError(
        404,
        "not_found_error",
        "no image model is loaded (start the server with --image-model)",
        null,
        "model_not_found",
      );
    throw new ApiError(404, "not_found_error", `no route ${method} ${path}`);
  };

  let server: ReturnType<typeof Bun.serve>;
  try {
    server = listen();
  } catch (e) {
    // Bun's own error ("EINVAL: invalid argument, listen", "EADDRINUSE") names neither flag
    throw new TpError(
      "E_IO",
      `cannot listen on ${options.host ?? "127.0.0.1"} port ${options.port ?? 8080} (--host / --port): ${e instanceof Error ? e.message : String(e)}`,
    );
  }
  function listen() {
    return Bun.serve({
      hostname: options.host ?? "127.0.0.1",
      port: options.port ?? 8080,
      // Bun's own cutoff answers a bare 413 before `fetch` runs; jsonBody enforces `limit` itself
      // (Content-Length first, then while reading) so that every 413 has the OpenAI error shape.
      maxRequestBodySize: Number.MAX_SAFE_INTEGER,
      idleTimeout: 0,
      async fetch(req) {
        const url = new URL(req.url);
        let routeName = url.pathname;
        let res: Response;
        try {
          [routeName, res] = await route(req, url);
        } catch (e) {
          const err = apiError(e);
          if (err.status === 499) res = new Response(null, { status: 499 });
          else res = errorResponse(err, CORS);
          if (err.status >= 500 && err.status !== 503)
            console.error(`error ${req.method} ${url.pathname}: ${err.message}`);
        }
        count(
          routeName.startsWith("/v1/jobs/")
            ? "/v1/jobs/{id}"
            : routeName.startsWith("/v1/images/files/")
              ? "/v1/images/files"
              : routeName,
          res.status,
        );
        return res;
      },
      error(e) {
        return errorResponse(apiError(e), CORS);
      },
    });
  }
  const port = server.port as number;
  const host = options.host ?? "127.0.0.1";
  return {
    url: `http://${host.includes(":") ? `[${host}]` : host}:${port}`,
    port,
    stop: async () => {
      await server.stop(true);
    },
  };
}
