/**
 * The architectures @tp/llm runs: one table from GGUF `general.architecture` / HF `model_type` to the
 * architecture file, plus an alias table for HF `architectures` class names — as ml-explore/mlx-lm
 * `mlx_lm/utils.py` (`_get_classes`, `MODEL_REMAPPING`).
 *
 * Adding an architecture is three things:
 * 1. One file, `models/<model_type>.ts`, exporting an {@link Architecture}: `configFromGguf` /
 *    `configFromHf` (its arguments: models/args.ts reads the llama-family keys, the file reads any of
 *    its own), its weights by checkpoint (HF) names read with a `WeightReader` inside
 *    `backend.scope`, with quirks fixed there (a tied head, a permuted layout), and a `DecoderModel`
 *    (models/language-model.ts) whose `forward` is embedding → blocks (each in `backend.scope`,
 *    calling `pass.next`) → final norm → head, with `attend` / `swiglu` from models/layers.ts.
 *    A model that only changes the attention subclasses `LlamaModel` (as qwen3.ts does).
 * 2. One row in {@link ARCHITECTURES} (and its HF class name in {@link ARCHITECTURE_ALIASES}); a GGUF
 *    file also needs its tensor-name table in @tp/formats `GGUF_HF_NAMES`.
 * 3. One parity test: a tiny checkpoint beside the others in models.test.ts against the float64
 *    reference (testing/tiny-models.ts), and its tiny GGUFs (../shared/models/synthetic, one per
 *    weight type) as rows of parity.test.ts's `CASES`, checked token for token against llama.cpp.
 */
import { TpError } from "@tp/tensor";
import { gemma3 } from "./gemma3.ts";
import type { Architecture } from "./language-model.ts";
import { llama } from "./llama.ts";
import { qwen3 } from "./qwen3.ts";
import { qwen3vl } from "./qwen3-vl-text.ts";
import { qwen3moe } from "./qwen3moe.ts";
import { qwen35 } from "./qwen35.ts";
import { qwen35moe } from "./qwen35moe.ts";

/** Architectures by GGUF `general.architecture` and HF `model_type`. */
export const ARCHITECTURES: Readonly<Record<string, Architecture>> = {
  llama,
  qwen3,
  qwen3moe,
  qwen3vl,
  gemma3,
  qwen35,
  qwen35moe,
};

/** Other names of the same architectures: HF `architectures[0]` class names (and HF model_types spelled otherwise). */
export const ARCHITECTURE_ALIASES: Readonly<Record<string, string>> = {
  LlamaForCausalLM: "llama",
  Qwen3ForCausalLM: "qwen3",
  Qwen3MoeForCausalLM: "qwen3moe",
  qwen3_moe: "qwen3moe", // HF model_type
  qwen3_vl: "qwen3vl",
  Qwen3VLForConditionalGeneration: "qwen3vl",
  gemma3_text: "gemma3",
  Gemma3ForCausalLM: "gemma3",
  Gemma3ForConditionalGeneration: "gemma3",
  Qwen3_5ForConditionalGeneration: "qwen35",
  Qwen3_5ForCausalLM: "qwen35",
  Qwen3_5MoeForConditionalGeneration: "qwen35moe",
};

/**
 * The architecture of a name (a GGUF architecture, an HF model_type or class name).
 * @param where the file, for the message
 * @throws TpError E_UNSUPPORTED naming the architecture and listing the known ones
 */
export function architectureFor(name: string, where?: string): Architecture {
  const key = Object.hasOwn(ARCHITECTURES, name) ? name : ARCHITECTURE_ALIASES[name];
  const arch = key === undefined ? undefined : ARCHITECTURES[key];
  if (arch === undefined) {
    throw new TpError(
      "E_UNSUPPORTED",
      `unknown architecture '${name}'; known: ${Object.values(ARCHITECTURES)
        .map((a) => `${a.name} (${a.description})`)
        .join("; ")}`,
      where === undefined ? {} : { file: where },
    );
  }
  return arch;
}
