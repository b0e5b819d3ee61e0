/**
 * VAE checkpoints: the Wan 2.1-family VAE that Krea 2 uses (ComfyUI ships it as the Qwen-Image VAE),
 * and the Qwen-Image-2.1 autoencoder (diffusers or ComfyUI/Wan names). A Wan 2.2 VAE is recognised
 * only to be refused by name.
 *
 * Sources: ../shared/spec/krea2.md §5.1 (Wan 2.1: `decoder.middle.0.residual.0.gamma`, `conv2.weight`
 * [16, 16, 1, 1, 1], no `decoder.upsamples.0.upsamples.0.residual.2.weight`; that nested key means the
 * newer layouts — ComfyUI `comfy/sd.py` tells them apart by exactly that key); ../shared/spec/qwen-image.md
 * §2.1 (diffusers decoder names) and §2.2 (the ComfyUI → diffusers table, detected by `decoder.conv1.weight`).
 */
import { TpError } from "@tp/tensor";
import type { TensorSource } from "../tensors.ts";
import type { NameRow, NameTable } from "./names.ts";
import type { DetectedLayout } from "./types.ts";

/** Wan 2.1 VAE: the model code uses the Wan names; the encoder half is not used for text-to-image. */
export const WAN21_VAE_NAMES: NameTable = {
  source: "../shared/spec/krea2.md §1.10, §5.3 (ComfyUI comfy/ldm/wan/vae.py names)",
  rows: [
    { from: "encoder.{*}", to: null },
    { from: "conv1.{*}", to: null },
  ],
};

const RESNET_PARTS: readonly [string, string][] = [
  ["residual.0.gamma", "norm1.gamma"],
  ["residual.2.{*}", "conv1.{*}"],
  ["residual.3.gamma", "norm2.gamma"],
  ["residual.6.{*}", "conv2.{*}"],
  ["shortcut.{*}", "conv_shortcut.{*}"],
];

function resnetRows(from: string, to: string): NameRow[] {
  return RESNET_PARTS.map(([a, b]) => ({ from: `${from}.${a}`, to: `${to}.${b}` }));
}

/** Qwen-Image-2.1 VAE, ComfyUI/Wan names → diffusers names (qwen-image.md §2.2 table, decoder only). */
export const QWEN_IMAGE_21_VAE_NAMES: NameTable = {
  source:
    "../shared/spec/qwen-image.md §2.2 (diffusers autoencoder_kl_qwenimage21.py ↔ ComfyUI comfy/ldm/wan/vae.py)",
  rows: [
    { from: "encoder.{*}", to: null },
    { from: "conv1.{*}", to: null },
    { from: "conv2.{*}", to: "post_quant_conv.{*}" },
    { from: "decoder.conv1.{*}", to: "decoder.conv_in.{*}" },
    ...resnetRows("decoder.middle.0", "decoder.mid_block.resnets.0"),
    { from: "decoder.middle.1.{*}", to: "decoder.mid_block.attentions.0.{*}" },
    ...resnetRows("decoder.middle.2", "decoder.mid_block.resnets.1"),
    {
      from: "decoder.upsamples.{N}.upsamples.3.resample.1.{*}",
      to: "decoder.up_blocks.{N}.upsampler.resample.1.{*}",
    },
    {
      from: "decoder.upsamples.{N}.upsamples.3.time_conv.{*}",
      to: "decoder.up_blocks.{N}.upsampler.time_conv.{*}",
    },
    ...resnetRows("decoder.upsamples.{N}.upsamples.{N}", "decoder.up_blocks.{N}.resnets.{N}"),
    { from: "decoder.head.0.gamma", to: "decoder.norm_out.gamma" },
    { from: "decoder.head.2.{*}", to: "decoder.conv_out.{*}" },
  ],
};

const NESTED = "decoder.upsamples.0.upsamples.0.residual.2.weight";

/**
 * A VAE file, or null when the tensors are not a VAE.
 * @throws TpError E_UNSUPPORTED for a Wan 2.2 VAE (48 latent channels), naming what it is
 */
export function detectVae(src: TensorSource): DetectedLayout | null {
  const base = { path: src.path, files: src.files, prefix: "" };
  if (src.has("post_quant_conv.weight") && src.has("decoder.conv_in.weight")) {
    const z = src.tensor("post_quant_conv.weight").shape[0] ?? 0;
    if (z !== 64) return null;
    return {
      ...base,
      kind: "qwen-image-2.1-vae",
      description: "Qwen-Image-2.1 VAE (diffusers names), 64 latent channels",
      details: {
        z_dim: z,
        names: "diffusers",
        decoder_base_dim: src.tensor("decoder.norm_out.gamma").shape[0] ?? 0,
      },
    };
  }
  if (!src.has("decoder.conv1.weight") || !src.has("conv2.weight")) return null;
  const z = src.tensor("conv2.weight").shape[0] ?? 0;
  const nested = src.has(NESTED);
  const dim = src.has("decoder.head.0.gamma") ? (src.tensor("decoder.head.0.gamma").shape[0] ?? 0) : 0;
  if (!nested && z === 16 && src.has("decoder.middle.0.residual.0.gamma")) {
    return {
      ...base,
      kind: "wan21-vae",
      description: `Wan 2.1-family VAE (the Qwen-Image VAE Krea 2 uses), 16 latent channels, base width ${dim}`,
      details: { z_dim: z, base_dim: dim },
      names: WAN21_VAE_NAMES,
    };
  }
  if (nested && z === 64) {
    return {
      ...base,
      kind: "qwen-image-2.1-vae",
      description: `Qwen-Image-2.1 VAE (ComfyUI/Wan names), 64 latent channels, decoder width ${dim}`,
      details: { z_dim: z, names: "comfyui", decoder_base_dim: dim },
      names: QWEN_IMAGE_21_VAE_NAMES,
    };
  }
  if (nested && z === 48) {
    throw new TpError(
      "E_UNSUPPORTED",
      "this is a Wan 2.2 VAE (48 latent channels); Krea 2 needs the Wan 2.1 / Qwen-Image VAE (16 channels)",
      {
        file: src.path,
      },
    );
  }
  return null;
}
