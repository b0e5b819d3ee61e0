/**
 * Which weights of a float checkpoint a converter quantizes, per layout: the tables that make
 * `bun apps/cli quantize` (and quantize-on-load caches) leave the same tensors unquantized as the
 * quantized files ComfyUI ships.
 *
 * Sources:
 * - Krea 2 DiT: the 8 linears (`attn.{wq,wk,wv,gate,wo}`, `mlp.{gate,up,down}`) of every `blocks.N`,
 *   `txtfusion.layerwise_blocks.N` and `txtfusion.refiner_blocks.N` — the `quantized_layers` of
 *   ../shared/testdata/krea2-tiny/config/krea2_tiny.json, which ComfyUI / comfy-kitchen quantized in the
 *   int8, int4 and fp8-scaled tiny files; `first`, `last.*`, `tmlp`, `tproj`, `txtfusion.projector`,
 *   `txtmlp.*`, norms and `mod.lin` stay float (krea2.md §1.4). krea2.md §1.4 says the real int4 file
 *   also keeps `txtfusion.*` in BF16: pass `keep: ["txtfusion.*"]` for that.
 * - Qwen-Image-2.1 transformer: the attention and MLP linears of every `transformer_blocks.N`; `img_in`,
 *   `txt_in.*`, `time_text_embed.*`, `modulation`, `norm_out.linear`, `proj_out` and norms stay float
 *   (qwen-image.md §10.3).
 * - Qwen3-VL text encoder: `self_attn.{q,k,v,o}_proj` and `mlp.{gate,up,down}_proj` of every layer;
 *   embeddings and norms stay float (the krea2-tiny `qwen3vl_tiny_te_fp8_scaled` file, krea2.md §1.9).
 */
import { TpError } from "@tp/tensor";
import type { TensorSource } from "../tensors.ts";
import { identifyCheckpoint } from "./detect.ts";

/** The weights a converter quantizes by default, and why. */
export interface QuantizableWeights {
  /** The detected layout kind (`krea2-dit`, …). */
  readonly layout: string;
  /** The rule, in words, with its source. */
  readonly rule: string;
  /** Full tensor names (`…weight`), in file order. */
  readonly names: readonly string[];
}

const RULES: Readonly<Record<string, { rule: string; re: RegExp }>> = {
  "krea2-dit": {
    rule: "the 8 linears of blocks.N, txtfusion.layerwise_blocks.N and txtfusion.refiner_blocks.N (krea2-tiny quantized_layers; krea2.md §1.4)",
    re: /^(?:model\.diffusion_model\.)?(?:blocks|txtfusion\.layerwise_blocks|txtfusion\.refiner_blocks)\.\d+\.(?:attn\.(?:wq|wk|wv|gate|wo)|mlp\.(?:gate|up|down))\.weight$/,
  },
  "qwen-image-2.1-transformer": {
    rule: "the attention and MLP linears of transformer_blocks.N (qwen-image.md §10.3)",
    re: /^(?:model\.diffusion_model\.)?transformer_blocks\.\d+\.(?:attn\.(?:to_q|to_k|to_v|to_out\.0)|img_mlp\.(?:gate_layer|proj|out|gate_up))\.weight$/,
  },
  "qwen3vl-text-encoder": {
    rule: "self_attn.{q,k,v,o}_proj and mlp.{gate,up,down}_proj of every layer (krea2.md §1.9)",
    re: /^(?:model\.language_model\.|model\.)layers\.\d+\.(?:self_attn\.(?:q|k|v|o)_proj|mlp\.(?:gate|up|down)_proj)\.weight$/,
  },
};

/** The layout kinds that have a default selection. */
export const QUANTIZABLE_LAYOUTS: readonly string[] = Object.keys(RULES);

/**
 * The weights a converter quantizes by default in this checkpoint (see the module comment).
 * @throws TpError E_UNSUPPORTED for a layout without a table (naming it and the known ones: pass an
 *   explicit layer list instead); E_FORMAT for an unknown layout (from layout detection)
 */
export function quantizableWeights(src: TensorSource): QuantizableWeights {
  const layout = identifyCheckpoint(src);
  const r = RULES[layout.kind];
  if (r === undefined) {
    throw new TpError(
      "E_UNSUPPORTED",
      `no default list of layers to quantize for a ${layout.kind} checkpoint; known: ${QUANTIZABLE_LAYOUTS.join(", ")} — name the layers explicitly`,
      { file: src.path },
    );
  }
  return {
    layout: layout.kind,
    rule: r.rule,
    names: src.tensors.map((t) => t.name).filter((n) => r.re.test(n)),
  };
}
