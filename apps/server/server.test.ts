// The server on loopback, driven by the `openai` npm client as users drive llama-server, on the
// shared tiny Qwen3 file (../shared/models; skipped with a reason when absent). Every expected answer
// comes from elsewhere: `bun apps/llm --json` spawned as a user runs it, or @tp/llm's
// GenerationSession on a model of its own; log-probs from a float64 log-softmax of the model's logits.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { createBackend } from "@tp/backend-cpu";
import { GenerationSession, loadModel } from "@tp/llm";
import { TpError } from "@tp/tensor";
import OpenAI from "openai";
import { LlmEngine } from "./llm.ts";
import { type RunningServer, startServer } from "./server.ts";

const MODELS = resolve(import.meta.dir, "../../../shared/models");
const QWEN = join(MODELS, "synthetic/qwen3-tiny-Q8_0.gguf");
const HAVE = existsSync(QWEN);
if (!HAVE) console.warn(`skipped: ${QWEN} is absent (the shared models folder is not beside this checkout)`);
const KEY = "sk-test-0123";
const NAME = "qwen3-tiny";
const CTX = 256;
const T = 120_000;

const backend = createBackend({ threads: 1 });
let engine: LlmEngine;
let server: RunningServer;
let client: OpenAI;
/** A second copy of the model with a session of its own: the reference for greedy answers. */
let ref: ReturnType<typeof loadModel>;
let refSession: GenerationSession;

function newEngine(parallel: number, queueLimit: number): LlmEngine {
  return new LlmEngine(loadModel(QWEN, { backend }), {
    name: NAME,
    parallel,
    queueLimit,
    ctx: CTX,
    defaultMaxTokens: 16,
    reasoningFormat: "deepseek",
  });
}

/** The reference greedy answer to `ids` (fresh cache each time). */
async function greedy(
  ids: number[],
  maxNewTokens: number,
): Promise<{ text: string; ids: number[]; stop: string }> {
  refSession.reset();
  const r = await refSession.generate(ids, { sampling: { temperature: 0 }, maxNewTokens });
  return { text: r.text, ids: r.ids, stop: r.stopReason };
}

beforeAll(() => {
  if (!HAVE) return;
  engine = newEngine(4, 64);
  server = startServer({ llm: engine, port: 0, apiKey: KEY, maxBodyBytes: 64 * 1024 });
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0 });
  ref = loadModel(QWEN, { backend, maxContext: CTX });
  refSession = new GenerationSession(ref.model, ref.tokenizer);
});

afterAll(async () => {
  if (!HAVE) return;
  await server.stop();
  engine.dispose();
  ref.model.dispose();
  backend.dispose();
});

const user = (content: string) => [{ role: "user" as const, content }];

/** What a client call threw (its APIPromise is a thenable that bun's `rejects` does not follow). */
async function thrown(p: PromiseLike<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (e) {
    return e;
  }
  throw new Error("expected the call to fail");
}

describe.skipIf(!HAVE)("chat completions", () => {
  test(
    "greedy: the answer equals `bun apps/llm -p … --temp 0 --json` for the same prompt (text, token count, stop)",
    async () => {
      const prompt = "Name three rivers.";
      const p = Bun.spawnSync(
        [
          "bun",
          resolve(import.meta.dir, "../llm/index.ts"),
          "-m",
          QWEN,
          "-p",
          prompt,
          "--temp",
          "0",
          "-n",
          "24",
          "--json",
          "--threads",
          "1",
        ],
        { stdout: "pipe", stderr: "pipe" },
      );
      expect(p.exitCode).toBe(0);
      const cli = JSON.parse(p.stdout.toString()) as {
        text: string;
        ids: number[];
        prompt_ids: number[];
        stop_reason: string;
      };
      const r = await client.chat.completions.create({
        model: NAME,
        messages: user(prompt),
        temperature: 0,
        max_tokens: 24,
      });
      const m = r.choices[0]?.message as { content: string | null; reasoning_content?: string };
      // the tiny model's random text has no <think> block, so the split leaves all of it in content
      expect(cli.text).not.toContain("<think>");
      expect(m.content).toBe(cli.text);
      expect(m.reasoning_content).toBeUndefined();
      expect(r.usage?.prompt_tokens).toBe(cli.prompt_ids.length);
      expect(r.usage?.completion_tokens).toBe(cli.ids.length);
      expect(r.choices[0]?.finish_reason).toBe(cli.stop_reason === "eos" ? "stop" : "length");
      expect(r.object).toBe("chat.completion");
      expect(r.model).toBe(NAME);
    },
    T,
  );

  test("streaming: the deltas add up to the non-streamed answer; usage comes last with include_usage", async () => {
    const messages = user("Tell me a story.");
    const whole = await client.chat.completions.create({
      model: NAME,
      messages,
      temperature: 0,
      max_tokens: 20,
    });
    const stream = await client.chat.completions.create({
      model: NAME,
      messages,
      temperature: 0,
      max_tokens: 20,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = "";
    let chunks = 0;
    let finish: string | null = null;
    let usage: OpenAI.CompletionUsage | undefined;
    let role: string | undefined;
    for await (const c of stream) {
      chunks++;
      if (c.usage) usage = c.usage;
      const ch = c.choices[0];
      if (ch === undefined) continue;
      role ??= ch.delta.role;
      text += ch.delta.content ?? "";
      if (ch.finish_reason) finish = ch.finish_reason;
    }
    expect(role).toBe("assistant");
    expect(text).toBe(whole.choices[0]?.message.content as string);
    expect(chunks).toBeGreaterThan(3);
    expect(finish).toBe(whole.choices[0]?.finish_reason as string);
    expect(usage?.completion_tokens).toBe(whole.usage?.completion_tokens as number);
  });

  test("a stop string cuts the answer before its first occurrence (finish_reason stop)", async () => {
    const messages = user("Hello");
    const whole = (
      await client.chat.completions.create({ model: NAME, messages, temperature: 0, max_tokens: 24 })
    ).choices[0]?.message.content as string;
    const stop = whole.slice(8, 11); // three characters from inside the answer
    expect(stop.length).toBe(3);
    for (const stream of [false, true]) {
      let text = "";
      let finish: string | null | undefined;
      if (stream) {
        for await (const c of await client.chat.completions.create({
          model: NAME,
          messages,
          temperature: 0,
          max_tokens: 24,
          stop: [stop],
          stream: true,
        })) {
          text += c.choices[0]?.delta.content ?? "";
          finish = c.choices[0]?.finish_reason ?? finish;
        }
      } else {
        const r = await client.chat.completions.create({
          model: NAME,
          messages,
          temperature: 0,
          max_tokens: 24,
          stop,
        });
        text = r.choices[0]?.message.content as string;
        finish = r.choices[0]?.finish_reason;
      }
      expect(text).toBe(whole.slice(0, whole.indexOf(stop)));
      expect(finish).toBe("stop");
    }
  });

  test("logprobs: the chosen token's and the top alternatives' equal a float64 log-softmax of the model's logits", async () => {
    const messages = user("Why is the sky blue?");
    const r = await client.chat.completions.create({
      model: NAME,
      messages,
      temperature: 0,
      max_tokens: 3,
      logprobs: true,
      top_logprobs: 3,
    });
    const content = r.choices[0]?.logprobs?.content ?? [];
    expect(content.length).toBe(r.usage?.completion_tokens as number);
    // the first answer token's distribution, from the reference model's own forward of the same prompt
    const ids = engine.chatPrompt({ messages, enableThinking: undefined, tools: undefined } as never);
    ref.model.truncate(0);
    refSession.reset();
    using logits = ref.model.step(ids);
    const row = (await backend.read(logits)) as Float32Array;
    ref.model.truncate(0);
    let max = Number.NEGATIVE_INFINITY;
    for (const v of row) max = Math.max(max, v);
    let sum = 0;
    for (const v of row) sum += Math.exp(v - max);
    const lse = max + Math.log(sum);
    const order = Array.from(row.keys()).sort((a, b) => (row[b] as number) - (row[a] as number) || a - b);
    const first = content[0] as OpenAI.ChatCompletionTokenLogprob;
    const tok = ref.tokenizer;
    const text = (id: number) => new TextDecoder().decode(tok.tokenBytes(id));
    // f32 logits, log-sum-exp in f64 on both sides: only summation order differs (≤ 1e-9 here)
    expect(first.token).toBe(text(order[0] as number));
    expect(first.logprob).toBeCloseTo((row[order[0] as number] as number) - lse, 9);
    expect(first.top_logprobs.map((t) => t.token)).toEqual(order.slice(0, 3).map(text));
    for (const [i, t] of first.top_logprobs.entries())
      expect(t.logprob).toBeCloseTo((row[order[i] as number] as number) - lse, 9);
    expect(first.bytes).toEqual(Array.from(tok.tokenBytes(order[0] as number)));
    for (const c of content) {
      expect(c.logprob).toBeLessThanOrEqual(0);
      expect(c.top_logprobs[0]?.logprob).toBe(c.logprob); // greedy takes the most likely token
    }
  });

  test("seed: the same seed at temperature 1 gives the same answer; the answer is a sample, not the greedy one", async () => {
    const ask = (seed: number) =>
      client.chat.completions.create({
        model: NAME,
        messages: user("Hi"),
        temperature: 1.2,
        top_k: 0,
        seed,
        max_tokens: 16,
      } as never);
    const [a, b, c] = await Promise.all([ask(7), ask(7), ask(8)]);
    const text = (r: OpenAI.ChatCompletion) => r.choices[0]?.message.content;
    expect(text(a)).toBe(text(b) as string);
    const greedyText = (
      await client.chat.completions.create({
        model: NAME,
        messages: user("Hi"),
        temperature: 0,
        max_tokens: 16,
      })
    ).choices[0]?.message.content;
    // with 4122 tokens at T = 1.2 two seeds agreeing on 16 tokens, or a sample equal to greedy, is vanishingly unlikely
    expect(text(c)).not.toBe(text(a) as string);
    expect(text(a)).not.toBe(greedyText as string);
  });

  test("prompt-prefix reuse: a follow-up sharing a slot's cached prefix prefills only the rest, with the same answer as a fresh cache", async () => {
    const system = {
      role: "system" as const,
      content: "You are a careful assistant who answers in one short sentence. ".repeat(3),
    };
    const first = await client.chat.completions.create({
      model: NAME,
      messages: [system, ...user("What is rain?")],
      temperature: 0,
      max_tokens: 8,
    });
    const messages = [system, ...user("What is snow?")];
    const second = await client.chat.completions.create({
      model: NAME,
      messages,
      temperature: 0,
      max_tokens: 8,
    });
    const systemTokens = engine.chatPrompt({
      messages: [system],
      enableThinking: undefined,
      tools: undefined,
    } as never).length;
    expect(first.usage?.prompt_tokens_details?.cached_tokens ?? 0).toBeLessThan(systemTokens);
    expect(second.usage?.prompt_tokens_details?.cached_tokens as number).toBeGreaterThanOrEqual(
      systemTokens - 8,
    );
    const ids = engine.chatPrompt({ messages, enableThinking: undefined, tools: undefined } as never);
    expect((await greedy(ids, 8)).text).toBe(second.choices[0]?.message.content as string);
  });
});

describe.skipIf(!HAVE)("completions, models, health, metrics", () => {
  test("/v1/completions greedy equals GenerationSession.generate on the tokenized prompt", async () => {
    const prompt = "Once upon a time";
    const r = await client.completions.create({ model: NAME, prompt, temperature: 0, max_tokens: 12 });
    const want = await greedy(ref.tokenizer.encode(prompt, { addSpecial: true, parseSpecial: true }), 12);
    expect(r.choices[0]?.text).toBe(want.text);
    expect(r.usage?.completion_tokens).toBe(want.ids.length);
    let streamed = "";
    for await (const c of await client.completions.create({
      model: NAME,
      prompt,
      temperature: 0,
      max_tokens: 12,
      stream: true,
    }))
      streamed += c.choices[0]?.text ?? "";
    expect(streamed).toBe(want.text);
  });

  test("/v1/models lists the model; /health needs no key; /metrics counts what was served", async () => {
    const list = await client.models.list();
    expect(list.data.map((m) => m.id)).toEqual([NAME]);
    expect((await fetch(`${server.url}/health`)).status).toBe(200);
    const res = await fetch(`${server.url}/metrics`, { headers: { authorization: `Bearer ${KEY}` } });
    const text = await res.text();
    expect(res.headers.get("content-type")).toContain("text/plain");
    const value = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, "m").exec(text)?.[1]);
    expect(value("tp_llm_generated_tokens_total")).toBe(engine.counters.generatedTokens);
    expect(value("tp_llm_generated_tokens_total")).toBeGreaterThan(0);
    expect(value("tp_llm_slots")).toBe(4);
    expect(value("tp_llm_queue_depth")).toBe(0);
    expect(text).toMatch(/^tp_http_requests_total\{route="\/v1\/chat\/completions",status="200"\} \d+$/m);
  });
});

describe.skipIf(!HAVE)("errors and security", () => {
  const post = (path: string, body: string, key: string | null = KEY) =>
    fetch(`${server.url}${path}`, {
      method: "POST",
      body,
      headers: {
        "content-type": "application/json",
        ...(key === null ? {} : { authorization: `Bearer ${key}` }),
      },
    });

  test("no key or a wrong key: 401 on every route but /health (the client raises AuthenticationError)", async () => {
    const bad = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "sk-wrong", maxRetries: 0 });
    expect(await thrown(bad.models.list())).toBeInstanceOf(OpenAI.AuthenticationError);
    for (const path of ["/v1/models", "/metrics"])
      expect((await fetch(`${server.url}${path}`)).status).toBe(401);
    const r = await post("/v1/chat/completions", "{}", null);
    expect(r.status).toBe(401);
    expect(((await r.json()) as { error: { type: string } }).error.type).toBe("authentication_error");
  });

  test("bad JSON, a missing field, a bad value, an unknown model, an oversize prompt or body: 4xx with the OpenAI error shape", async () => {
    const cases: [string, number, string | null][] = [
      ["{not json", 400, null],
      ["[1, 2]", 400, null],
      [JSON.stringify({ model: NAME }), 400, "messages"],
      [JSON.stringify({ model: NAME, messages: user("x"), temperature: "hot" }), 400, "temperature"],
      [
        JSON.stringify({ model: NAME, messages: [{ role: "wizard", content: "x" }] }),
        400,
        "messages[0].role",
      ],
      [JSON.stringify({ model: NAME, messages: user("x"), n: 2 }), 400, "n"],
      [JSON.stringify({ model: "gpt-9", messages: user("x") }), 404, "model"],
      [JSON.stringify({ model: NAME, messages: user("word ".repeat(400)) }), 400, "messages"],
      [JSON.stringify({ model: NAME, messages: user("x".repeat(70_000)) }), 413, null],
      // hostile shapes of the optional fields
      [JSON.stringify({ model: NAME, messages: user("x"), tools: [null] }), 400, "tools"],
      [JSON.stringify({ model: NAME, messages: user("x"), tools: [5] }), 400, "tools"],
      [JSON.stringify({ model: NAME, messages: user("x"), tool_choice: "required" }), 400, "tool_choice"],
      [JSON.stringify({ model: NAME, messages: user("x"), tool_choice: 7 }), 400, "tool_choice"],
      [JSON.stringify({ model: NAME, messages: user("x"), stream_options: 5 }), 400, "stream_options"],
      [
        JSON.stringify({ model: NAME, messages: user("x"), chat_template_kwargs: "on" }),
        400,
        "chat_template_kwargs",
      ],
      [
        JSON.stringify({
          model: NAME,
          messages: user("x"),
          grammar: `root ::= ${"(".repeat(20_000)}"x"${")".repeat(20_000)}`,
        }),
        400,
        "grammar",
      ],
      [
        JSON.stringify({
          model: NAME,
          messages: user("x"),
          response_format: { type: "json_schema", json_schema: { schema: { type: [] } } },
        }),
        400,
        "response_format",
      ],
    ];
    for (const [body, status, param] of cases) {
      const r = await post("/v1/chat/completions", body);
      expect(r.status).toBe(status);
      const e = ((await r.json()) as { error: { message: string; type: string; param: string | null } })
        .error;
      expect(typeof e.message).toBe("string");
      expect(e.param).toBe(param);
    }
    expect(
      (await post("/v1/completions", JSON.stringify({ model: NAME, prompt: [1, 999_999] }))).status,
    ).toBe(400);
    // a completion prompt past the context names 'prompt', not 'messages'
    const long = await post("/v1/completions", JSON.stringify({ model: NAME, prompt: "word ".repeat(400) }));
    expect(long.status).toBe(400);
    expect(((await long.json()) as { error: { param: string } }).error.param).toBe("prompt");
    // a body far past the limit (Bun's own cutoff used to answer a bare 413), declared or chunked
    const huge = await post("/v1/chat/completions", "x".repeat(1 << 20));
    expect(huge.status).toBe(413);
    expect(((await huge.json()) as { error: { code: string } }).error.code).toBe("request_too_large");
    const chunked = await fetch(`${server.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${KEY}` },
      body: new ReadableStream({
        start(c) {
          for (let i = 0; i < 24; i++) c.enqueue(new Uint8Array(1 << 14).fill(32));
          c.close();
        },
      }),
      duplex: "half",
    } as RequestInit);
    expect(chunked.status).toBe(413);
    expect(((await chunked.json()) as { error: { code: string } }).error.code).toBe("request_too_large");
    expect(
      await thrown(client.chat.completions.create({ model: "gpt-9", messages: user("x") })),
    ).toBeInstanceOf(OpenAI.NotFoundError);
    // still serving after all of that
    expect(
      (await client.chat.completions.create({ model: NAME, messages: user("x"), max_tokens: 2 })).choices
        .length,
    ).toBe(1);
  });

  test("a client that disconnects mid-stream stops its generation and frees the slot", async () => {
    const before = engine.counters.generatedTokens;
    const controller = new AbortController();
    const stream = await client.chat.completions.create(
      // ignore_eos: only the disconnect can end it before 200 tokens
      {
        model: NAME,
        messages: user("Go on forever."),
        max_tokens: 200,
        stream: true,
        ignore_eos: true,
      } as never,
      { signal: controller.signal },
    );
    let n = 0;
    try {
      for await (const _ of stream as unknown as AsyncIterable<unknown>) if (++n === 3) controller.abort();
    } catch {
      // the client's abort surfaces as an error of the iteration
    }
    for (let i = 0; i < 100 && engine.busySlots > 0; i++) await Bun.sleep(10);
    expect(engine.busySlots).toBe(0);
    expect(engine.counters.generatedTokens - before).toBeLessThan(50);
  });

  test("a model error fails that request only (500, or an error event mid-stream); the server goes on", async () => {
    const small = newEngine(1, 4);
    const s = startServer({ llm: small, port: 0 });
    try {
      const c = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: "none", maxRetries: 0 });
      const model = (small.slots[0] as { model: { step: (...a: unknown[]) => unknown } }).model;
      const real = model.step.bind(model);
      let calls = 0;
      // the third forward of the next answer fails as a broken weight would
      model.step = (...a: unknown[]) => {
        if (++calls === 3)
          throw new TpError("E_FORMAT", "the model produced non-finite logits at position 14");
        return real(...a);
      };
      const e = (await thrown(
        c.chat.completions.create({ model: NAME, messages: user("Hi"), max_tokens: 8, temperature: 0 }),
      )) as InstanceType<typeof OpenAI.APIError>;
      expect(e.status).toBe(500);
      expect(e.message).toContain("non-finite logits");
      calls = 0;
      let streamed = "";
      const err = await thrown(
        (async () => {
          for await (const ch of await c.chat.completions.create({
            model: NAME,
            messages: user("Hi"),
            max_tokens: 8,
            temperature: 0,
            stream: true,
          }))
            streamed += ch.choices[0]?.delta.content ?? "";
        })(),
      );
      expect((err as Error).message).toContain("non-finite logits");
      expect(streamed.length).toBeGreaterThan(0); // the tokens before the failure came through
      model.step = real;
      const ok = await c.chat.completions.create({
        model: NAME,
        messages: user("Hi"),
        max_tokens: 8,
        temperature: 0,
      });
      const ids = small.chatPrompt({ messages: user("Hi") } as never);
      expect(ok.choices[0]?.message.content).toBe((await greedy(ids, 8)).text);
      expect(small.counters.errors).toBe(2);
    } finally {
      await s.stop();
      small.dispose();
    }
  });

  test("a full queue answers 503; the requests that got in all finish", async () => {
    const small = newEngine(1, 1);
    const s = startServer({ llm: small, port: 0 });
    try {
      const c = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: "none", maxRetries: 0 });
      const ask = () =>
        c.chat.completions.create({ model: NAME, messages: user("Hi"), max_tokens: 40, temperature: 0 });
      const first = ask();
      await Bun.sleep(5);
      const second = ask();
      await Bun.sleep(5);
      const third = ask();
      const results = await Promise.allSettled([first, second, third]);
      expect(results.map((r) => r.status)).toEqual(["fulfilled", "fulfilled", "rejected"]);
      const err = (results[2] as PromiseRejectedResult).reason as InstanceType<typeof OpenAI.APIError>;
      expect(err.status).toBe(503);
      expect(small.counters.rejected).toBe(1);
    } finally {
      await s.stop();
      small.dispose();
    }
  });
});

describe.skipIf(!HAVE)("load", () => {
  test(
    "32 concurrent requests over 4 slots: every one answered once, each with its own prompt's greedy answer",
    async () => {
      const prompts = Array.from({ length: 32 }, (_, i) => `Request number ${i}: say something.`);
      const batcher = engine.batcher;
      expect(batcher).not.toBeNull(); // 4 slots of a qwen3 model: decode steps are batched
      const [forwards0, rows0] = [batcher?.forwards ?? 0, batcher?.rows ?? 0];
      const want = new Map<string, string>();
      for (const p of prompts)
        want.set(p, (await greedy(engine.chatPrompt({ messages: user(p) } as never), 10)).text);
      let peakBusy = 0;
      const watch = setInterval(() => {
        peakBusy = Math.max(peakBusy, engine.busySlots);
      }, 1);
      const answers = await Promise.all(
        prompts.map((p, i) =>
          i % 2 === 0
            ? client.chat.completions
                .create({ model: NAME, messages: user(p), temperature: 0, max_tokens: 10 })
                .then((r) => ({
                  id: r.id,
                  text: r.choices[0]?.message.content ?? "",
                }))
            : (async () => {
                let id = "";
                let text = "";
                for await (const c of await client.chat.completions.create({
                  model: NAME,
                  messages: user(p),
                  temperature: 0,
                  max_tokens: 10,
                  stream: true,
                })) {
                  id = c.id;
                  text += c.choices[0]?.delta.content ?? "";
                }
                return { id, text };
              })(),
        ),
      );
      clearInterval(watch);
      expect(answers.length).toBe(32);
      expect(new Set(answers.map((a) => a.id)).size).toBe(32);
      expect(answers.map((a) => a.text)).toEqual(prompts.map((p) => want.get(p) as string));
      expect(peakBusy).toBe(4);
      // continuous batching: the decode steps ran several sequences per forward (and the answers above
      // are each sequence's own greedy answer all the same)
      const perForward = ((batcher?.rows ?? 0) - rows0) / ((batcher?.forwards ?? 0) - forwards0);
      console.log(`load test: ${perForward.toFixed(2)} sequences per batched decode forward`);
      expect(perForward).toBeGreaterThan(2);
      expect(engine.queueDepth).toBe(0);
    },
    T,
  );
});

describe("listening", () => {
  test("a bad --host or a port in use is one E_IO naming --host / --port, not Bun's bare EINVAL / EADDRINUSE", async () => {
    const err = (f: () => unknown) => {
      try {
        f();
      } catch (e) {
        return e instanceof TpError ? `${e.code}: ${e.message}` : `not a TpError: ${String(e)}`;
      }
      return "no error";
    };
    expect(err(() => startServer({ host: "999.1.1.1", port: 0 }))).toStartWith(
      "E_IO: cannot listen on 999.1.1.1 port 0 (--host / --port): ",
    );
    const first = startServer({ port: 0 });
    try {
      expect(err(() => startServer({ port: first.port }))).toStartWith(
        `E_IO: cannot listen on 127.0.0.1 port ${first.port} (--host / --port): `,
      );
      expect((await fetch(`${first.url}/health`)).status).toBe(200);
    } finally {
      await first.stop();
    }
  });
});
