// Constrained decoding. The recognizer and the schema compiler against hand-written lists of texts
// that must and must not be sentences; the vocabulary mask against a brute-force check of every token
// (its text fed character by character); and, on the shared tiny Qwen3 file (skipped with a reason when
// absent), sampled answers under json_schema / json_object / GBNF / tool_choice through the server,
// each one parsed and validated by a checker written here from the schema.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { resolve } from "node:path";
import { createBackend } from "@tp/backend-cpu";
import { loadModel } from "@tp/llm";
import { TpError } from "@tp/tensor";
import OpenAI from "openai";
import { grammarConstraint } from "./constrain.ts";
import { accepts, advance, type Grammar, initialState, parseGbnf } from "./grammar.ts";
import { JSON_OBJECT_GBNF, schemaToGbnf } from "./json-schema.ts";
import { LlmEngine } from "./llm.ts";
import { type RunningServer, startServer } from "./server.ts";

/** Whether `text` is a sentence of `g`. */
function sentence(g: Grammar, text: string): boolean {
  let s = initialState(g);
  for (const ch of text) {
    s = advance(g, s, ch.codePointAt(0) as number);
    if (s.length === 0) return false;
  }
  return accepts(s);
}

function expectLanguage(g: Grammar, yes: string[], no: string[]): void {
  for (const t of yes) expect(`${JSON.stringify(t)}: ${sentence(g, t)}`).toBe(`${JSON.stringify(t)}: true`);
  for (const t of no) expect(`${JSON.stringify(t)}: ${sentence(g, t)}`).toBe(`${JSON.stringify(t)}: false`);
}

describe("GBNF", () => {
  test("literals, classes, groups, repetition, escapes, alternatives over lines, comments", () => {
    const g = parseGbnf(`# a comment
root ::= greeting ("," [ ]? name){1,2} "!"?
greeting ::= "hi" | "h\\x65llo"
  | "yo"
name ::= [A-Z] [a-z]* | "\\u00e9t\\u00e9"`);
    expectLanguage(
      g,
      ["hi,Ann", "hello, Bo!", "yo,A,Bc", "hi,été"],
      ["hi", "hi,ann", "hi,A,B,C", "hey,A", "hello,A!!", "hi , A"],
    );
  });

  test("negated classes and '.'; + and ?; {m,} and {m}", () => {
    const g = parseGbnf(`root ::= [^0-9]+ "-" .? [0-9]{2,} x{3}
x ::= "a"`);
    expectLanguage(g, ["ab-12aaa", "z-#999aaa", "q-00aaa"], ["9-12aaa", "a-1aaa", "ab-12aa", "-12aaa"]);
  });

  test("errors name the problem and the line", () => {
    const err = (src: string) => {
      try {
        const g = parseGbnf(src);
        initialState(g);
      } catch (e) {
        expect(e).toBeInstanceOf(TpError);
        return (e as Error).message;
      }
      return "no error";
    };
    expect(err('start ::= "a"')).toBe("GBNF grammar: there is no 'root' rule");
    expect(err("root ::= foo")).toBe("GBNF grammar: the rule 'foo' is used but not defined");
    expect(err('root ::= "a\nb ::= "b"')).toContain("GBNF grammar, line");
    expect(err('root ::= "a"{3,1}')).toContain("bad repetition");
    expect(err('root ::= root "a" | "b"')).toContain("left recursion");
    // deep nesting is refused, not a stack overflow (the parser recurses per parenthesis)
    expect(err(`root ::= ${"(".repeat(20_000)}"a"${")".repeat(20_000)}`)).toBe(
      "GBNF grammar, line 1: parentheses nested more than 100 deep",
    );
    expect(() => parseGbnf(`root ::= ${"(".repeat(100)}"a"${")".repeat(100)}`)).not.toThrow();
  });
});

describe("JSON schema → grammar", () => {
  const schema = {
    type: "object",
    properties: {
      name: { type: "string", maxLength: 4 },
      age: { type: "integer" },
      ok: { type: "boolean" },
      tags: { type: "array", items: { enum: ["a", "b"] }, minItems: 1, maxItems: 2 },
      pet: { anyOf: [{ type: "null" }, { $ref: "#/$defs/pet" }] },
    },
    required: ["name", "ok"],
    $defs: { pet: { type: "object", properties: { kind: { const: "cat" } }, required: ["kind"] } },
  };
  test("a schema's grammar takes exactly the JSON texts that validate (subset of JSON Schema)", () => {
    const g = parseGbnf(schemaToGbnf(schema));
    expectLanguage(
      g,
      [
        '{"name":"bo","ok":true}',
        '{ "name": "", "age": -12, "ok": false }',
        '{"name":"a\\"b","ok":true,"tags":["a","b"]}',
        '{"name":"x","ok":true,"pet":null}',
        '{"name":"x","ok":false,"pet":{"kind":"cat"}}',
      ],
      [
        '{"ok":true}', // name is required
        '{"name":"abcde","ok":true}', // maxLength 4
        '{"ok":true,"name":"x"}', // properties in schema order
        '{"name":"x","ok":true,"tags":[]}', // minItems 1
        '{"name":"x","ok":true,"tags":["a","b","a"]}', // maxItems 2
        '{"name":"x","ok":true,"tags":["c"]}',
        '{"name":"x","ok":true,"pet":{"kind":"dog"}}',
        '{"name":"x","age":1.5,"ok":true}',
        '{"name":"x","ok":true,"extra":1}',
        '{"name":"x","ok":true,}',
        '{"name":"x"  ,"ok":true}', // at most one space between tokens
      ],
    );
  });

  test("json_object: any object, nested values", () => {
    const g = parseGbnf(JSON_OBJECT_GBNF);
    expectLanguage(g, ["{}", '{"a": [1, -2.5e3, "x", null, {"b": true}]}'], ["[]", "{a:1}", '{"a":01}', ""]);
  });

  test("unsupported keywords are refused, not loosened", () => {
    expect(() => schemaToGbnf({ type: "string", pattern: "^a" })).toThrow("'pattern' is not supported");
    expect(() => schemaToGbnf({ $ref: "#/$defs/none" })).toThrow("is not a #/$defs/… entry");
    expect(() => schemaToGbnf({ type: "date" })).toThrow("type 'date' is not a JSON Schema type");
    // hostile schemas: no value at all, a $ref to an Object.prototype name, bounds past the limit
    expect(() => schemaToGbnf({ type: [] })).toThrow("an empty type list admits no value");
    expect(() => schemaToGbnf({ $ref: "#/$defs/constructor" })).toThrow("is not a #/$defs/… entry");
    expect(() => schemaToGbnf({ type: "string", minLength: 1e9 })).toThrow(
      "0 ≤ minLength ≤ maxLength ≤ 1000",
    );
    expect(() => schemaToGbnf({ type: "array", minItems: 1e9 })).toThrow("0 ≤ minItems ≤ maxItems ≤ 1000");
    expect(() => schemaToGbnf({ type: "string", minLength: 1000 })).not.toThrow();
  });
});

const QWEN = resolve(import.meta.dir, "../../../shared/models/synthetic/qwen3-tiny-Q8_0.gguf");
const HAVE = existsSync(QWEN);
if (!HAVE) console.warn(`skipped: ${QWEN} is absent (the shared models folder is not beside this checkout)`);

describe.skipIf(!HAVE)("on the tiny Qwen3 vocabulary and model", () => {
  const backend = createBackend({ threads: 1 });
  let engine: LlmEngine;
  let server: RunningServer;
  let client: OpenAI;
  beforeAll(() => {
    engine = new LlmEngine(loadModel(QWEN, { backend }), {
      name: "q",
      parallel: 2,
      queueLimit: 16,
      ctx: 512,
      defaultMaxTokens: 200,
      reasoningFormat: "deepseek",
    });
    server = startServer({ llm: engine, port: 0 });
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "none", maxRetries: 0 });
  });
  afterAll(async () => {
    await server.stop();
    engine.dispose();
    backend.dispose();
  });

  test("the mask allows exactly the tokens whose whole text the grammar takes (brute force over the vocabulary)", () => {
    const tok = engine.tokenizer;
    const g = parseGbnf(
      schemaToGbnf({ type: "object", properties: { n: { type: "integer" } }, required: ["n"] }),
    );
    const c = grammarConstraint(g, tok);
    const strict = new TextDecoder("utf-8", { fatal: true });
    const allowedBy = (prefix: string): Set<number> => {
      let s = initialState(g);
      for (const ch of prefix) s = advance(g, s, ch.codePointAt(0) as number);
      const out = new Set<number>();
      for (let id = 0; id < tok.vocabSize; id++) {
        const type = tok.tokenType(id);
        if (type !== "normal" && type !== "user_defined" && type !== "byte") continue;
        let text: string;
        try {
          text = strict.decode(tok.tokenBytes(id));
        } catch {
          continue;
        }
        if (text === "") continue;
        let t = s;
        for (const ch of text) {
          t = advance(g, t, ch.codePointAt(0) as number);
          if (t.length === 0) break;
        }
        if (t.length > 0) out.add(id);
      }
      if (accepts(s)) for (const id of tok.eog) out.add(id);
      return out;
    };
    const fed: string[] = [];
    for (const piece of ['{"', 'n":', " 12", "}"]) {
      const row = new Float32Array(tok.vocabSize);
      c.processor(row, []);
      const kept = new Set<number>();
      for (let i = 0; i < row.length; i++) if (row[i] === 0) kept.add(i);
      expect(kept).toEqual(allowedBy(fed.join("")));
      expect(kept.size).toBeGreaterThan(0);
      for (const id of tok.encode(piece)) c.accept(id);
      fed.push(piece);
    }
    expect(c.complete()).toBe(true);
  });

  /** A checker written from the schema below: the keys in order, their types and bounds. */
  function valid(v: unknown): boolean {
    if (typeof v !== "object" || v === null || Array.isArray(v)) return false;
    const o = v as Record<string, unknown>;
    const keys = Object.keys(o);
    const order = ["city", "days", "metric", "unit"];
    if (keys.some((k) => !order.includes(k)) || keys.join() !== order.filter((k) => k in o).join())
      return false;
    if (typeof o.city !== "string" || o.city.length > 6) return false;
    if (!Number.isInteger(o.days)) return false;
    if (typeof o.metric !== "boolean") return false;
    if ("unit" in o && o.unit !== "C" && o.unit !== "F") return false;
    return true;
  }
  const schema = {
    type: "object",
    properties: {
      city: { type: "string", maxLength: 6 },
      days: { type: "integer" },
      metric: { type: "boolean" },
      unit: { enum: ["C", "F"] },
    },
    required: ["city", "days", "metric"],
  };

  test("json_schema: every sampled answer (8 seeds, T = 1, streamed and not) parses and validates", async () => {
    const outs: string[] = [];
    for (let seed = 1; seed <= 8; seed++) {
      const body = {
        model: "q",
        messages: [{ role: "user" as const, content: "The weather, as JSON." }],
        temperature: 1,
        top_k: 0,
        top_p: 1,
        min_p: 0,
        seed,
        max_tokens: 200,
        response_format: {
          type: "json_schema" as const,
          json_schema: { name: "weather", schema, strict: true },
        },
      };
      if (seed % 2 === 0) {
        let text = "";
        let finish: string | null = null;
        for await (const c of await client.chat.completions.create({ ...body, stream: true })) {
          text += c.choices[0]?.delta.content ?? "";
          finish = c.choices[0]?.finish_reason ?? finish;
        }
        expect(finish).toBe("stop");
        outs.push(text);
      } else {
        const r = await client.chat.completions.create(body);
        expect(r.choices[0]?.finish_reason).toBe("stop");
        outs.push(r.choices[0]?.message.content as string);
      }
    }
    for (const t of outs) expect(`${valid(JSON.parse(t))}: ${t}`).toBe(`true: ${t}`);
    expect(new Set(outs).size).toBeGreaterThan(4); // they are samples, not one fixed answer
  }, 120_000);

  test("json_object and a GBNF grammar on /v1/completions; a bad grammar is 400", async () => {
    const r = await client.chat.completions.create({
      model: "q",
      messages: [{ role: "user", content: "Give me JSON" }],
      temperature: 0,
      max_tokens: 100,
      response_format: { type: "json_object" },
    });
    // json_object bounds nothing (a string may run on); this prompt's greedy answer closes
    expect(r.choices[0]?.finish_reason).toBe("stop");
    const v = JSON.parse(r.choices[0]?.message.content as string);
    expect(typeof v === "object" && v !== null && !Array.isArray(v)).toBe(true);
    for (let seed = 0; seed < 4; seed++) {
      const c = await client.completions.create({
        model: "q",
        prompt: "Answer:",
        temperature: 1,
        seed,
        grammar: 'root ::= ("yes" | "no") ", " [0-9]{1,3} "."',
      } as never);
      expect(c.choices[0]?.text).toMatch(/^(yes|no), [0-9]{1,3}\.$/);
    }
    const bad = await fetch(`${server.url}/v1/chat/completions`, {
      method: "POST",
      body: JSON.stringify({ messages: [{ role: "user", content: "x" }], grammar: "root ::= (" }),
    });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as { error: { param: string } }).error.param).toBe("grammar");
    // a grammar whose language is empty (a class of no character): 400 saying so, not the sampler's
    // "no finite logit"; the next request is served
    const empty = await fetch(`${server.url}/v1/completions`, {
      method: "POST",
      body: JSON.stringify({ prompt: "x", max_tokens: 3, grammar: "root ::= [^\\x00-\\U0010FFFF]" }),
    });
    expect(empty.status).toBe(400);
    expect(((await empty.json()) as { error: { message: string } }).error.message).toBe(
      "the grammar allows no token of this model's vocabulary here (its language is empty, or it needs a character no token spells)",
    );
    expect((await client.completions.create({ model: "q", prompt: "x", max_tokens: 2 })).choices.length).toBe(
      1,
    );
  }, 120_000);

  test("tools with tool_choice required: the answer is a call of a listed tool with valid arguments, as tool_calls", async () => {
    const tools = [
      {
        type: "function" as const,
        function: {
          name: "get_weather",
          description: "Weather for a city",
          parameters: {
            type: "object",
            properties: { city: { type: "string", maxLength: 6 } },
            required: ["city"],
          },
        },
      },
      {
        type: "function" as const,
        function: {
          name: "get_time",
          parameters: { type: "object", properties: { zone: { enum: ["utc", "cet"] } }, required: ["zone"] },
        },
      },
    ];
    const messages = [{ role: "user" as const, content: "Weather in Oslo?" }];
    for (const stream of [false, true]) {
      let calls: { name: string; arguments: string }[] = [];
      let finish: string | null | undefined;
      let content = "";
      if (stream) {
        for await (const c of await client.chat.completions.create({
          model: "q",
          messages,
          tools,
          tool_choice: "required",
          temperature: 1,
          seed: 3,
          stream: true,
        })) {
          for (const t of c.choices[0]?.delta.tool_calls ?? [])
            calls.push(t.function as { name: string; arguments: string });
          content += c.choices[0]?.delta.content ?? "";
          finish = c.choices[0]?.finish_reason ?? finish;
        }
      } else {
        const r = await client.chat.completions.create({
          model: "q",
          messages,
          tools,
          tool_choice: "required",
          temperature: 1,
          seed: 3,
        });
        calls = (r.choices[0]?.message.tool_calls ?? []).map(
          (t) => (t as { function: { name: string; arguments: string } }).function,
        );
        content = r.choices[0]?.message.content ?? "";
        finish = r.choices[0]?.finish_reason;
      }
      expect(finish).toBe("tool_calls");
      expect(content).toBe("");
      expect(calls.length).toBe(1);
      const call = calls[0] as { name: string; arguments: string };
      const args = JSON.parse(call.arguments) as Record<string, unknown>;
      if (call.name === "get_weather")
        expect(typeof args.city === "string" && args.city.length <= 6).toBe(true);
      else expect([call.name, ["utc", "cet"].includes(args.zone as string)]).toEqual(["get_time", true]);
    }
    // a named function
    const r = await client.chat.completions.create({
      model: "q",
      messages,
      tools,
      tool_choice: { type: "function", function: { name: "get_time" } },
      temperature: 0,
    });
    const first = r.choices[0]?.message.tool_calls?.[0] as { function: { name: string } } | undefined;
    expect(first?.function.name).toBe("get_time");
  }, 120_000);
});
