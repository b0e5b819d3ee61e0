/**
 * The architectures @tp/llm runs: one table from GGUF `general.architecture` / HF `model_type` to the
 * architecture file, plus an alias table for HF `architectures` class names — as ml-explore/mlx-lm
 * `mlx_lm/utils.py` (`_get_classes`, `MODEL_REMAPPING`). Adding a model touches one file, one row here
 * and one test.
 */
import { TpError } from "@tp/tensor";
import type { Architecture } from "./language-model.ts";
import { llama } from "./llama.ts";
import { qwen3 } from "./qwen3.ts";

/** Architectures by GGUF `general.architecture` and HF `model_type`. */
export const ARCHITECTURES: Readonly<Record<string, Architecture>> = { llama, qwen3 };

/** Other names of the same architectures: HF `architectures[0]` class names. */
export const ARCHITECTURE_ALIASES: Readonly<Record<string, string>> = {
  LlamaForCausalLM: "llama",
  Qwen3ForCausalLM: "qwen3",
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
