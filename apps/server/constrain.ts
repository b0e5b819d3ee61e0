/**
 * Constrained decoding: `response_format` (json_object / json_schema) and `grammar` (GBNF) turned into
 * a logits mask over the tokenizer's vocabulary.
 */
import type { Tokenizer } from "@tp/tokenizer";
import { badRequest } from "./errors.ts";
import type { GenerationRequest } from "./requests.ts";

/** A constraint on one answer: masks each logits row, and says whether the text so far is complete. */
export interface Constraint {
  processor: (row: Float32Array, context: readonly number[]) => void;
  complete(): boolean;
}

/**
 * The constraint a request asks for, or null.
 * @throws ApiError 400 for a response_format or grammar that cannot be compiled
 */
export function constraintFor(tokenizer: Tokenizer, req: GenerationRequest): Constraint | null {
  void tokenizer;
  const f = req.responseFormat as { type?: unknown } | undefined;
  if (req.grammar === undefined && (f === undefined || f === null || f.type === "text")) return null;
  throw badRequest(
    "constrained decoding (response_format json_object / json_schema, grammar) is not available yet",
    req.grammar === undefined ? "response_format" : "grammar",
  );
}
