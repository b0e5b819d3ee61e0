/**
 * Denoiser checkpoints: the Krea 2 DiT ("SingleStreamDiT") and the Qwen-Image-2.1 transformer.
 *
 * Sources: ../shared/spec/krea2.md §1.1 (files), §1.3 (tensor map; prefix `model.diffusion_model.`
 * in ComfyUI-native files, detected by probing `blocks.0.mod.lin`), §1.4 (per-tensor formats);
 * ../shared/spec/qwen-image.md §2.1 (diffusers transformer tensors), §2.2 (ComfyUI file: the same
 * names except `img_mlp.gate_up.weight` = gate rows first, then up (`proj`) rows; all-in-one files
 * prefix `model.diffusion_model.`).
 */
import type { TensorSource } from "../tensors.ts";
import type { NameTable } from "./names.ts";
import { detectTensorFormat } from "./tensor-format.ts";
import { declaredDepth } from "./tensor-set.ts";
import type { DetectedLayout } from "./types.ts";

const COMFY_PREFIX = "model.diffusion_model.";

/** The 8 quantized linears of each Krea 2 block (krea2.md §1.4). */
const KREA2_BLOCK_LINEARS = [
  "attn.wq",
  "attn.wk",
  "attn.wv",
  "attn.gate",
  "attn.wo",
  "mlp.gate",
  "mlp.up",
  "mlp.down",
];

/** Krea 2 DiT names: strip the ComfyUI prefix; the schedule buffer is ignored (krea2.md §1.3). */
export const KREA2_DIT_NAMES: NameTable = {
  source: "../shared/spec/krea2.md §1.3 (ComfyUI comfy/ldm/krea2/model.py names)",
  rows: [
    { from: "model.diffusion_model.model_sampling.sigmas", to: null },
    { from: "model_sampling.sigmas", to: null },
    { from: "model.diffusion_model.{*}", to: "{*}" },
  ],
};

/** Qwen-Image-2.1 transformer names (ComfyUI → diffusers): split `gate_up`, strip the prefix (qwen-image.md §2.2). */
export const QWEN_IMAGE_21_TRANSFORMER_NAMES: NameTable = {
  source:
    "../shared/spec/qwen-image.md §2.1–2.2 (diffusers transformer_qwenimage21.py; ComfyUI comfy/ldm/qwen_image21/model.py)",
  rows: [
    {
      from: "model.diffusion_model.transformer_blocks.{N}.img_mlp.gate_up.weight",
      to: "transformer_blocks.{N}.img_mlp.gate_layer.weight",
      rows: [0, 0.5],
    },
    {
      from: "model.diffusion_model.transformer_blocks.{N}.img_mlp.gate_up.weight",
      to: "transformer_blocks.{N}.img_mlp.proj.weight",
      rows: [0.5, 1],
    },
    {
      from: "transformer_blocks.{N}.img_mlp.gate_up.weight",
      to: "transformer_blocks.{N}.img_mlp.gate_layer.weight",
      rows: [0, 0.5],
    },
    {
      from: "transformer_blocks.{N}.img_mlp.gate_up.weight",
      to: "transformer_blocks.{N}.img_mlp.proj.weight",
      rows: [0.5, 1],
    },
    { from: "model.diffusion_model.{*}", to: "{*}" },
  ],
};

function prefixOf(src: TensorSource, probe: string): string | null {
  if (src.has(probe)) return "";
  if (src.has(COMFY_PREFIX + probe)) return COMFY_PREFIX;
  return null;
}

function countBlocks(src: TensorSource, re: RegExp): number {
  let max = -1;
  for (const t of src.tensors) {
    const m = re.exec(t.name);
    if (m) max = Math.max(max, Number(m[1]));
  }
  return max + 1;
}

/**
 * A Krea 2 DiT file, or null. The variant comes from the formats of the 8 block linears of every
 * block: `fp8` (raw, no scales), `fp8_scaled`, `int8_convrot`, `int4_convrot` (may mix INT8 layers),
 * `bf16`/`f16`/`f32`.
 * @throws TpError from per-tensor format detection (E_FORMAT bad markers, E_UNSUPPORTED formats)
 */
export function detectKrea2Dit(src: TensorSource): DetectedLayout | null {
  const prefix = prefixOf(src, "blocks.0.mod.lin");
  if (prefix === null || !src.has(`${prefix}txtfusion.projector.weight`)) return null;
  const dim = src.tensor(`${prefix}first.weight`).shape[0] ?? 0;
  const blocks = declaredDepth(src, `${prefix}blocks.`); // every blocks.N.* name counts (tensor-set.ts)
  const formats = new Map<string, number>();
  let scaled = false;
  for (let b = 0; b < blocks; b++) {
    const inner = src.has(`${prefix}blocks.${b}.mlp.up.weight`)
      ? (src.tensor(`${prefix}blocks.${b}.mlp.up.weight`).shape[0] ?? 0)
      : 0;
    for (const l of KREA2_BLOCK_LINEARS) {
      const name = `${prefix}blocks.${b}.${l}.weight`;
      if (!src.has(name)) continue;
      const f = detectTensorFormat(src, name, l === "mlp.down" ? inner : dim);
      formats.set(f.format, (formats.get(f.format) ?? 0) + 1);
      if (f.scale !== undefined) scaled = true;
    }
  }
  const has = (f: string) => formats.has(f);
  const variant = has("int4_convrot")
    ? "int4_convrot"
    : has("int8_convrot")
      ? "int8_convrot"
      : has("f8_e4m3fn")
        ? scaled
          ? "fp8_scaled"
          : "fp8"
        : ([...formats.keys()][0] ?? "unknown");
  const words: Record<string, string> = {
    int4_convrot: has("int8_convrot") ? "INT4 ConvRot (some layers INT8)" : "INT4 ConvRot",
    int8_convrot: "INT8 ConvRot",
    fp8_scaled: "fp8 e4m3 with scales",
    fp8: "fp8 e4m3 raw (no scales)",
  };
  return {
    kind: "krea2-dit",
    description: `Krea 2 DiT, ${words[variant] ?? variant.toUpperCase()}, ${blocks} blocks × ${dim}${prefix ? `, prefix ${prefix}` : ""}`,
    variant,
    prefix,
    details: {
      hidden_size: dim,
      num_blocks: blocks,
      ...Object.fromEntries([...formats].map(([f, n]) => [`block_linears_${f}`, n])),
    },
    path: src.path,
    files: src.files,
    names: KREA2_DIT_NAMES,
  };
}

/**
 * A Qwen-Image-2.1 transformer (diffusers or ComfyUI names), or null. The older dual-stream
 * Qwen-Image (2025) has `txt_mlp` and no shared `modulation.1.weight`; it is not this.
 */
export function detectQwenImage21Transformer(src: TensorSource): DetectedLayout | null {
  const prefix = prefixOf(src, "img_in.weight");
  if (
    prefix === null ||
    !src.has(`${prefix}modulation.1.weight`) ||
    !src.has(`${prefix}transformer_blocks.0.attn.to_q.weight`)
  ) {
    return null;
  }
  const comfy = src.has(`${prefix}transformer_blocks.0.img_mlp.gate_up.weight`);
  const blocks = countBlocks(
    src,
    /^(?:model\.diffusion_model\.)?transformer_blocks\.(\d+)\.attn\.to_q\.weight$/,
  );
  const q = `${prefix}transformer_blocks.0.attn.to_q.weight`;
  const f = detectTensorFormat(src, q);
  const dim = src.tensor(`${prefix}img_in.weight`).shape[0] ?? 0;
  return {
    kind: "qwen-image-2.1-transformer",
    description: `Qwen-Image-2.1 transformer (${comfy ? "ComfyUI" : "diffusers"} names), ${f.format}, ${blocks} blocks × ${dim}`,
    variant: f.format,
    prefix,
    details: { hidden_size: dim, num_layers: blocks, names: comfy ? "comfyui" : "diffusers" },
    path: src.path,
    files: src.files,
    names: QWEN_IMAGE_21_TRANSFORMER_NAMES,
  };
}
