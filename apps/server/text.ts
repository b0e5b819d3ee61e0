/**
 * Streaming text filters of an answer: stop strings (the answer ends before the first occurrence of
 * any, and no text that may still become one is let out early) and the split of `<think>…</think>`
 * blocks into `reasoning_content`. Both work on text pieces as the generator streams them, hold back
 * only what could be the start of a marker, and give the same result however the text is cut.
 *
 * Sources: llama.cpp `tools/server/server.cpp` (`find_stopping_strings`: the full match ends the
 * answer, a partial match at the end is held back), `common/chat.cpp` (reasoning format "deepseek":
 * the text of `<think>…</think>` goes to `reasoning_content`, an unclosed block at the end too).
 */

/** Length of the longest suffix of `text` that is a proper prefix of `marker` (0 when none). */
export function partialSuffix(text: string, marker: string): number {
  const max = Math.min(text.length, marker.length - 1);
  for (let n = max; n > 0; n--) if (text.endsWith(marker.slice(0, n))) return n;
  return 0;
}

/** What {@link StopMatcher.push} lets out. */
export interface StopOutput {
  /** Text that is final (no stop string can start in it any more). */
  text: string;
  /** True once a stop string was found: `text` ends just before it, and nothing more comes. */
  stopped: boolean;
  /** The stop string found. */
  word?: string;
}

/**
 * Cuts an answer at the first occurrence of any stop string. `push` each generated piece; `flush` at
 * the end returns what was held back (a partial stop string that never completed).
 */
export class StopMatcher {
  readonly #stops: readonly string[];
  #held = "";
  #stopped = false;

  /** @param stops the stop strings; empty ones are ignored */
  constructor(stops: readonly string[]) {
    this.#stops = stops.filter((s) => s.length > 0);
  }

  get stopped(): boolean {
    return this.#stopped;
  }

  push(piece: string): StopOutput {
    if (this.#stopped) return { text: "", stopped: true };
    const text = this.#held + piece;
    let first = -1;
    let word: string | undefined;
    for (const s of this.#stops) {
      const at = text.indexOf(s);
      if (at >= 0 && (first < 0 || at < first)) {
        first = at;
        word = s;
      }
    }
    if (first >= 0) {
      this.#stopped = true;
      this.#held = "";
      return { text: text.slice(0, first), stopped: true, ...(word === undefined ? {} : { word }) };
    }
    let hold = 0;
    for (const s of this.#stops) hold = Math.max(hold, partialSuffix(text, s));
    this.#held = text.slice(text.length - hold);
    return { text: text.slice(0, text.length - hold), stopped: false };
  }

  /** The held-back text (the answer ended without completing a stop string). */
  flush(): string {
    const t = this.#held;
    this.#held = "";
    return this.#stopped ? "" : t;
  }
}

/** A piece of the answer, routed: thoughts or visible content. */
export interface SplitPiece {
  reasoning: string;
  content: string;
}

const OPEN = "<think>";
const CLOSE = "</think>";

/**
 * Splits `<think>…</think>` out of an answer (llama.cpp's reasoning format "deepseek"): text inside
 * the block goes to `reasoning`, the rest to `content`; whitespace right after `</think>` is dropped
 * (Qwen3 writes "\n\n" there). Only a block at the start of the answer (after whitespace) counts, as
 * the templates put it; `startInside` is for prompts that already opened the block (templates whose
 * generation prompt ends with `<think>\n`).
 */
export class ThinkSplitter {
  #state: "start" | "inside" | "after" | "content";
  #held = "";

  constructor(startInside = false) {
    this.#state = startInside ? "inside" : "start";
  }

  push(piece: string): SplitPiece {
    const out: SplitPiece = { reasoning: "", content: "" };
    let text = this.#held + piece;
    this.#held = "";
    while (text.length > 0) {
      if (this.#state === "start") {
        const trimmed = text.trimStart();
        if (trimmed.length === 0) {
          this.#held = text;
          return out;
        }
        if (trimmed.startsWith(OPEN)) {
          this.#state = "inside";
          text = trimmed.slice(OPEN.length);
        } else if (OPEN.startsWith(trimmed)) {
          this.#held = text;
          return out;
        } else this.#state = "content";
      } else if (this.#state === "inside") {
        const at = text.indexOf(CLOSE);
        if (at >= 0) {
          out.reasoning += text.slice(0, at);
          text = text.slice(at + CLOSE.length);
          this.#state = "after";
        } else {
          const hold = partialSuffix(text, CLOSE);
          out.reasoning += text.slice(0, text.length - hold);
          this.#held = text.slice(text.length - hold);
          return out;
        }
      } else if (this.#state === "after") {
        const trimmed = text.trimStart();
        if (trimmed.length === 0) return out;
        this.#state = "content";
        text = trimmed;
      } else {
        out.content += text;
        text = "";
      }
    }
    return out;
  }

  /** The held-back text at the end of the answer. */
  flush(): SplitPiece {
    const t = this.#held;
    this.#held = "";
    if (this.#state === "inside") return { reasoning: t, content: "" };
    if (this.#state === "after") return { reasoning: "", content: "" };
    return { reasoning: "", content: t };
  }
}
