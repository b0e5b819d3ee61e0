// The streaming filters against whole-string references: for every way of cutting a text into two or
// three pieces, the stop matcher and the <think> splitter give what the reference computes on the
// whole text (first stop occurrence by indexOf; the block by a regular expression).
import { describe, expect, test } from "bun:test";
import { partialSuffix, StopMatcher, ThinkSplitter } from "./text.ts";
import { toolCallsFrom } from "./tools.ts";

/** Every split of `text` into up to three pieces. */
function* cuts(text: string): Generator<string[]> {
  for (let i = 0; i <= text.length; i++)
    for (let j = i; j <= text.length; j++) yield [text.slice(0, i), text.slice(i, j), text.slice(j)];
}

function runStops(pieces: string[], stops: string[]): { text: string; stopped: boolean } {
  const m = new StopMatcher(stops);
  let out = "";
  for (const p of pieces) {
    const o = m.push(p);
    out += o.text;
    if (o.stopped) return { text: out, stopped: true };
  }
  return { text: out + m.flush(), stopped: false };
}

/** The reference: the text before the earliest occurrence of any stop string. */
function refStops(text: string, stops: string[]): { text: string; stopped: boolean } {
  let first = -1;
  for (const s of stops) {
    const at = text.indexOf(s);
    if (at >= 0 && (first < 0 || at < first)) first = at;
  }
  return first < 0 ? { text, stopped: false } : { text: text.slice(0, first), stopped: true };
}

describe("StopMatcher", () => {
  const cases: [string, string[]][] = [
    ["Hello world. END here", ["END"]],
    ["abcabd", ["abd"]],
    ["no stop in here", ["STOP", "halt"]],
    ["x\n\nUser: hi", ["\n\nUser:", "\n\n"]],
    ["aaa", ["aa"]],
    ["tail <|", ["<|end|>"]],
  ];
  for (const [text, stops] of cases)
    test(`${JSON.stringify(text)} / ${JSON.stringify(stops)}: every cut gives the whole-text answer`, () => {
      const want = refStops(text, stops);
      for (const pieces of cuts(text)) {
        expect(runStops(pieces, stops)).toEqual(want);
      }
    });

  test("nothing that could still become a stop string is let out", () => {
    const m = new StopMatcher(["</answer>"]);
    expect(m.push("done </ans").text).toBe("done ");
    expect(m.push("wer> more").text).toBe("");
    expect(m.stopped).toBe(true);
  });

  test("partialSuffix: the longest proper prefix of the marker at the end", () => {
    expect(partialSuffix("abc</th", "</think>")).toBe(4);
    expect(partialSuffix("abc", "</think>")).toBe(0);
    expect(partialSuffix("</think>", "</think>")).toBe(0); // proper prefixes only
  });
});

/** The reference split (llama.cpp's "deepseek" format): a leading block, whitespace after it dropped. */
function refSplit(text: string, startInside = false): { reasoning: string; content: string } {
  const src = startInside ? `<think>${text}` : text;
  const m = /^\s*<think>([\s\S]*?)(<\/think>\s*|$)([\s\S]*)$/.exec(src);
  if (m === null) return { reasoning: "", content: text };
  return { reasoning: m[1] as string, content: m[3] as string };
}

describe("ThinkSplitter", () => {
  const cases: [string, boolean][] = [
    ["<think>\nweighing it up\n</think>\n\nThe answer is 4.", false],
    ["  <think>a</think>b", false],
    ["plain answer <think>not a block</think>", false],
    ["<think>unfinished thought", false],
    ["<thin", false],
    ["inside already</think>\n\ncontent", true],
    ["", false],
  ];
  for (const [text, inside] of cases)
    test(`${JSON.stringify(text)}${inside ? " (opened by the prompt)" : ""}: every cut gives the whole-text split`, () => {
      const want = refSplit(text, inside);
      for (const pieces of cuts(text)) {
        const s = new ThinkSplitter(inside);
        const got = { reasoning: "", content: "" };
        for (const p of [...pieces.map((x) => s.push(x)), s.flush()]) {
          got.reasoning += p.reasoning;
          got.content += p.content;
        }
        expect(got).toEqual(want);
      }
    });
});

describe("toolCallsFrom", () => {
  test("Hermes / Qwen <tool_call> blocks become OpenAI tool calls; the rest stays content", () => {
    const text =
      'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>\n' +
      '<tool_call>{"name": "now", "arguments": {}}</tool_call>';
    const r = toolCallsFrom(text);
    expect(r.content).toBe("Let me check.");
    expect(r.calls.map((c) => [c.type, c.function.name, JSON.parse(c.function.arguments)])).toEqual([
      ["function", "get_weather", { city: "Oslo", days: 2 }],
      ["function", "now", {}],
    ]);
    expect(new Set(r.calls.map((c) => c.id)).size).toBe(2);
  });

  test("a block that is not a call (bad JSON, no name) stays text", () => {
    const text = '<tool_call>{not json}</tool_call> and <tool_call>{"x": 1}</tool_call>';
    expect(toolCallsFrom(text)).toEqual({ content: text, calls: [] });
  });
});
