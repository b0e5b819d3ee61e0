/**
 * Qwen3-VL text encoders (the language half; the vision tower and `lm_head` are not used).
 *
 * Sources: ../shared/spec/krea2.md §1.9 (Qwen3-VL-4B, prefix `model.language_model.`, F8_E4M3 +
 * `weight_scale` linears, BF16 norms/embeddings); ../shared/spec/qwen-image.md §2.1 (diffusers
 * `text_encoder/`, Qwen3-VL-8B, prefix `model.language_model.`) and §2.2 (ComfyUI file drops the
 * `language_model.` level: `model.embed_tokens.weight`, `model.layers.{i}.…`, plus `model.visual.*`
 * and `lm_head.weight`).
 */
import type { TensorSource } from "../tensors.ts";
import type { NameTable } from "./names.ts";
import { detectTensorFormat } from "./tensor-format.ts";
import { declaredDepth } from "./tensor-set.ts";
import type { DetectedLayout } from "./types.ts";

/** Text-encoder names → the language model's own names (`embed_tokens.weight`, `layers.L.self_attn.q_proj.weight`, `norm.weight`). */
export const QWEN3VL_TEXT_NAMES: NameTable = {
  source:
    "../shared/spec/krea2.md §1.9; ../shared/spec/qwen-image.md §2.1–2.2 (transformers modeling_qwen3_vl.py; ComfyUI comfy/text_encoders/qwen3vl.py)",
  rows: [
    { from: "model.language_model.{*}", to: "{*}" },
    { from: "model.visual.{*}", to: null },
    { from: "lm_head.{*}", to: null },
    { from: "model.{*}", to: "{*}" },
  ],
};

/** Known sizes: hidden size → model (krea2.md §1.9; qwen-image.md §2.1 text_config). */
const QWEN3VL_SIZES: Readonly<Record<number, string>> = { 2560: "Qwen3-VL-4B", 4096: "Qwen3-VL-8B" };

/** A Qwen3-VL text encoder file (HF or ComfyUI names), or null. */
export function detectQwen3VlTextEncoder(src: TensorSource): DetectedLayout | null {
  let prefix: string;
  if (src.has("model.language_model.embed_tokens.weight")) prefix = "model.language_model.";
  else if (
    src.has("model.embed_tokens.weight") &&
    // ComfyUI's files carry the vision tower; a text-only export (the tiny Qwen-Image-2.1 one) has
    // Qwen3's per-head q_norm, which no other model family under `model.` has.
    (src.tensors.some((t) => t.name.startsWith("model.visual.")) ||
      src.has("model.layers.0.self_attn.q_norm.weight"))
  )
    prefix = "model.";
  else return null;
  const [vocab, hidden] = src.tensor(`${prefix}embed_tokens.weight`).shape as [number, number];
  // Every layers.N.* name counts (tensor-set.ts): a layer missing its input_layernorm is then a
  // missing tensor for the loader, not a shorter model.
  const layers = declaredDepth(src, `${prefix}layers.`);
  const q = `${prefix}layers.0.self_attn.q_proj.weight`;
  const f = src.has(q) ? detectTensorFormat(src, q) : null;
  const variant =
    f === null ? "unknown" : f.format === "f8_e4m3fn" && f.scale !== undefined ? "fp8_scaled" : f.format;
  const model = QWEN3VL_SIZES[hidden] ?? `Qwen3-VL (hidden size ${hidden})`;
  return {
    kind: "qwen3vl-text-encoder",
    description: `${model} text encoder, ${variant}, ${layers} layers, vocab ${vocab} (${prefix === "model." ? "ComfyUI" : "Hugging Face"} names)`,
    variant,
    prefix,
    details: {
      model,
      hidden_size: hidden,
      num_hidden_layers: layers,
      vocab_size: vocab,
      vision_tower: src.tensors.some((t) => t.name.startsWith("model.visual.")),
    },
    path: src.path,
    files: src.files,
    names: QWEN3VL_TEXT_NAMES,
  };
}
