// Every GGUF block type of issue 22 (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K…Q6_K, IQ4_NL,
// IQ4_XS) for every architecture, against llama.cpp on the same file: each tiny synthetic F32 GGUF of
// ../shared/models is rewritten into each type by our GGUF writer and quantizers (testing/block-types.ts),
// and ours and llama.cpp (node-llama-cpp 3.21.1, the parity oracle) must give the same next-token
// probabilities (tolerance per type: BLOCK_TYPE_PROB_TOL) on every prompt row and 16 greedy steps, and
// the same greedy tokens. The tiny files have rows of 64 / 128 elements, so the 256-element types run on
// a wider random file of the same architecture written here (rows of 256). Rows for more architectures
// are one line each below.
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { createBackend } from "@tp/backend-cpu";
import { openGguf } from "@tp/formats";
import { type BlockTypeRow, describeBlockTypeParity } from "./testing/block-types.ts";
import { type TinyConfig, tinyWeights, writeTinyGguf } from "./testing/tiny-models.ts";

const MODELS = resolve(import.meta.dir, "../../../../shared/models");
const SYNTHETIC = join(MODELS, "synthetic");
if (!existsSync(SYNTHETIC)) console.warn(`block-types.test.ts: ${SYNTHETIC} is absent; its rows skip`);

/**
 * A 1-layer random model whose every matmul row is 256 elements (whole k-quant super-blocks), with the
 * 512-token SentencePiece vocabulary of llama-tiny (llama.cpp needs a real vocabulary to load a file).
 */
function wide(model_type: "llama" | "qwen3"): (path: string) => void {
  const c: TinyConfig = {
    model_type,
    vocab_size: 512,
    hidden_size: 256,
    num_hidden_layers: 1,
    num_attention_heads: 4,
    num_key_value_heads: 2,
    head_dim: 64,
    intermediate_size: 256,
    rms_norm_eps: 1e-6,
    rope_theta: model_type === "llama" ? 10000 : 1e6,
    max_position_embeddings: 256,
    tie_word_embeddings: model_type === "qwen3",
  };
  return (path) => {
    const src = openGguf(join(SYNTHETIC, "llama-tiny-F32.gguf"));
    try {
      const kv = [...src.metadata.entries.values()].filter((e) => e.key.startsWith("tokenizer."));
      // The head's rows scaled (the embedding's scale cancels in the first RMSNorm) so that the first
      // prediction has p ≈ 0.5 (measured 0.53 llama, 0.62 qwen3): with the plain random head it is
      // near uniform (llama, p ≈ 0.02) or saturated (qwen3's tied head, p ≈ 1), and absolute
      // probability differences would say little.
      const w = tinyWeights(c, 22);
      const headScale = model_type === "llama" ? 5 : 0.3;
      for (const name of ["lm_head.weight", "model.embed_tokens.weight"]) {
        const t = w.get(name);
        if (t !== undefined && (name === "lm_head.weight" || c.tie_word_embeddings))
          t.values = t.values.map((v) => v * headScale);
      }
      writeTinyGguf(path, c, w, { kv });
    } finally {
      src.close();
    }
  };
}

/** Prompt ids: BOS (1 in these vocabularies) and a few ordinary tokens below every vocabulary size. */
const IDS = [1, 17, 42, 99, 7, 150, 33];

const ROWS: BlockTypeRow[] = [
  { label: "llama", file: join(SYNTHETIC, "llama-tiny-F32.gguf"), wide: wide("llama"), ids: IDS },
  { label: "qwen3", file: join(SYNTHETIC, "qwen3-tiny-F32.gguf"), wide: wide("qwen3"), ids: IDS },
];

let backend: ReturnType<typeof createBackend> | undefined;
describeBlockTypeParity("every GGUF block type against llama.cpp", ROWS, () => {
  backend ??= createBackend({ threads: 2 });
  return backend;
});
