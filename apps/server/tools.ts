/**
 * Tool calls out of an answer, in the format the chat templates teach the model: Hermes / Qwen
 * `<tool_call>{"name": …, "arguments": {…}}</tool_call>` blocks (Qwen2.5, Qwen3, Hermes 2/3 templates).
 * A block whose JSON does not parse, or has no string `name`, stays in the content as text.
 * Source: the Qwen3 chat template (its `tools` section); llama.cpp `common/chat.cpp`
 * (`common_chat_parse_hermes_2_pro`).
 */

/** One call in OpenAI's shape (`arguments` is a JSON string). */
export interface ToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

/** The answer split into its text and its calls. */
export interface ToolParse {
  content: string;
  calls: ToolCall[];
}

const BLOCK = /<tool_call>\s*([\s\S]*?)\s*<\/tool_call>/g;

/** Parse the `<tool_call>` blocks of `text`; the rest (trimmed) is the content. */
export function toolCallsFrom(text: string): ToolParse {
  const calls: ToolCall[] = [];
  const content = text.replace(BLOCK, (whole, json: string) => {
    let v: unknown;
    try {
      v = JSON.parse(json);
    } catch {
      return whole;
    }
    if (typeof v !== "object" || v === null || typeof (v as { name?: unknown }).name !== "string")
      return whole;
    const o = v as { name: string; arguments?: unknown; parameters?: unknown };
    const args = o.arguments ?? o.parameters ?? {};
    calls.push({
      id: `call_${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`,
      type: "function",
      function: { name: o.name, arguments: typeof args === "string" ? args : JSON.stringify(args) },
    });
    return "";
  });
  return { content: calls.length > 0 ? content.trim() : content, calls };
}
