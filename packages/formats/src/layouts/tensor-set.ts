/**
 * The complete tensor set of each layout, counted from the layers the file declares: a missing tensor
 * is E_FORMAT naming it (before any weight is read or any compute runs), a tensor the model does not
 * use is returned for a warning — or is E_FORMAT where it changes the meaning (a layer beyond the
 * declared depth, an fp8 weight without the `weight_scale` its neighbours have).
 *
 * The depth of a safetensors DiT or VAE is 1 + the largest block index among all its tensor names
 * (not only the first tensor of a block: a deleted `blocks.1.mod.lin` must be missed, not shorten the
 * model); a gap is then a missing tensor. A GGUF LLM declares its depth in `{arch}.block_count`.
 *
 * Sources: the loaders' reads (packages/diffusion/src/models/krea2.ts ParamLoader, wan-vae.ts
 * WanVaeDecoder); krea2.md §1.3–1.4 (tensor map, companions of quantized linears).
 */
import { TpError } from "@tp/tensor";
import type { TensorSource } from "../tensors.ts";

/** What {@link checkTensorSet} found besides what the model needs: names it will not read. */
export interface TensorSetCheck {
  /** Tensors the model does not use (for a warning), in file order. */
  readonly unexpected: readonly string[];
}

/** A layout's complete set: the names the model reads, and what may sit beside them unread. */
export interface TensorSetSpec {
  /** The component, for messages ("Krea 2 DiT", "Wan 2.1 VAE"). */
  readonly what: string;
  /** Every tensor the model reads (full names, prefix included). */
  readonly required: readonly string[];
  /** Optional tensors the model reads when present (e.g. a resnet's shortcut). */
  readonly optional?: readonly string[];
  /** Names that are ignored without a warning (another half of the model, schedule buffers). */
  readonly ignored?: readonly RegExp[];
  /** How the depth was counted, for the message of a missing tensor ("2 blocks: blocks.0 … blocks.1"). */
  readonly depth?: string;
}

/** Companions of a quantized linear `X.weight` (krea2.md §1.4; ComfyUI's mixed-precision files). */
const COMPANIONS = [".weight_scale", ".weight_scale_2", ".input_scale", ".comfy_quant"];

/**
 * Check a source against a layout's complete set.
 * @returns the unexpected tensors (for a warning)
 * @throws TpError E_FORMAT naming the first missing tensor (and how many are missing), or an fp8
 *   weight without `weight_scale` in a file whose other fp8 weights have one
 */
export function checkTensorSet(src: TensorSource, spec: TensorSetSpec): TensorSetCheck {
  const missing = spec.required.filter((n) => !src.has(n));
  if (missing.length > 0) {
    const first = missing[0] as string;
    throw new TpError(
      "E_FORMAT",
      `the ${spec.what} is incomplete: ${first} is missing${missing.length > 1 ? ` (and ${missing.length - 1} more, e.g. ${missing.slice(1, 3).join(", ")})` : ""}${spec.depth ? `; the file declares ${spec.depth}` : ""}`,
      { file: src.path, tensor: first },
    );
  }
  const known = new Set([...spec.required, ...(spec.optional ?? [])]);
  // fp8 weights: all scaled or none (a lone unscaled one would be read as raw fp8, 1/scale too large).
  const fp8 = spec.required.filter((n) => n.endsWith(".weight") && src.tensor(n).dtype.startsWith("F8_"));
  const scaled = fp8.filter((n) => src.has(`${n}_scale`));
  if (scaled.length > 0 && scaled.length < fp8.length) {
    const lone = fp8.find((n) => !src.has(`${n}_scale`)) as string;
    throw new TpError(
      "E_FORMAT",
      `the ${spec.what} is incomplete: ${lone}_scale is missing (${scaled.length} of its ${fp8.length} fp8 weights have a weight_scale)`,
      { file: src.path, tensor: `${lone}_scale` },
    );
  }
  for (const n of spec.required) {
    if (!n.endsWith(".weight")) continue;
    const base = n.slice(0, -".weight".length);
    for (const c of COMPANIONS) known.add(base + c);
  }
  const unexpected: string[] = [];
  for (const t of src.tensors) {
    if (known.has(t.name)) continue;
    if (spec.ignored?.some((re) => re.test(t.name))) continue;
    unexpected.push(t.name);
  }
  return { unexpected };
}

/** 1 + the largest index N in names `${prefix}N.…` (0 when there is none). */
export function declaredDepth(src: TensorSource, prefix: string): number {
  let max = -1;
  for (const t of src.tensors) {
    if (!t.name.startsWith(prefix)) continue;
    const rest = t.name.slice(prefix.length);
    const dot = rest.indexOf(".");
    const digits = dot < 0 ? rest : rest.slice(0, dot);
    if (/^\d{1,9}$/.test(digits)) max = Math.max(max, Number(digits));
  }
  return max + 1;
}

/** The tensors of a Krea 2 text / single-stream block `p` (ParamLoader.textBlock). */
function krea2Block(p: string): string[] {
  return [
    `${p}.prenorm.scale`,
    `${p}.postnorm.scale`,
    ...["wq", "wk", "wv", "gate", "wo"].map((l) => `${p}.attn.${l}.weight`),
    `${p}.attn.qknorm.qnorm.scale`,
    `${p}.attn.qknorm.knorm.scale`,
    ...["gate", "up", "down"].map((l) => `${p}.mlp.${l}.weight`),
  ];
}

/** Krea 2's text fusion has exactly two layerwise and two refiner blocks (ComfyUI `SingleStreamDiT`). */
const KREA2_TEXT_BLOCKS = 2;

/**
 * The complete tensor set of a Krea 2 DiT with prefix `prefix` (`""` or `model.diffusion_model.`):
 * its `blocks.N` counted from the file, two layerwise and two refiner text-fusion blocks, and the
 * embedders and final layer.
 * @throws TpError E_FORMAT when the file declares another number of text-fusion blocks (it would
 *   change the model) or no single-stream block
 */
export function krea2DitTensorSet(src: TensorSource, prefix: string): TensorSetSpec {
  const what = "Krea 2 DiT";
  const blocks = declaredDepth(src, `${prefix}blocks.`);
  if (blocks === 0) {
    throw new TpError("E_FORMAT", `the ${what} has no single-stream blocks (no ${prefix}blocks.0.*)`, {
      file: src.path,
      tensor: `${prefix}blocks.0.mod.lin`,
    });
  }
  for (const kind of ["layerwise_blocks", "refiner_blocks"]) {
    const n = declaredDepth(src, `${prefix}txtfusion.${kind}.`);
    if (n > KREA2_TEXT_BLOCKS) {
      const stray = `${prefix}txtfusion.${kind}.${n - 1}`;
      throw new TpError(
        "E_FORMAT",
        `the ${what} declares ${n} txtfusion.${kind}; Krea 2 has ${KREA2_TEXT_BLOCKS} (${stray}.* would be ignored and change the model)`,
        { file: src.path, tensor: stray },
      );
    }
  }
  const linear = (n: string) => [`${n}.weight`, `${n}.bias`];
  const required = [
    ...linear("first"),
    ...linear("tmlp.0"),
    ...linear("tmlp.2"),
    ...linear("tproj.1"),
    "txtfusion.projector.weight",
    ...[0, 1].flatMap((i) => [
      ...krea2Block(`txtfusion.layerwise_blocks.${i}`),
      ...krea2Block(`txtfusion.refiner_blocks.${i}`),
    ]),
    "txtmlp.0.scale",
    ...linear("txtmlp.1"),
    ...linear("txtmlp.3"),
    ...Array.from({ length: blocks }, (_, i) => [...krea2Block(`blocks.${i}`), `blocks.${i}.mod.lin`]).flat(),
    "last.norm.scale",
    "last.modulation.lin",
    ...linear("last.linear"),
  ].map((n) => prefix + n);
  return {
    what,
    required,
    ignored: [/^(model\.diffusion_model\.)?model_sampling\./, /^scaled_fp8$/],
    depth: `${blocks} single-stream block${blocks === 1 ? "" : "s"} (${prefix}blocks.0 … ${prefix}blocks.${blocks - 1})`,
  };
}

/** A Wan resnet block's tensors (WanVaeDecoder #block "res"). */
function wanResnet(p: string): string[] {
  return [
    `${p}.residual.0.gamma`,
    `${p}.residual.2.weight`,
    `${p}.residual.2.bias`,
    `${p}.residual.3.gamma`,
    `${p}.residual.6.weight`,
    `${p}.residual.6.bias`,
  ];
}

/**
 * The complete decoder tensor set of a Wan 2.1-family VAE (the encoder half and `conv1` are ignored):
 * `conv2`, `decoder.conv1`, the middle (resnet, attention, resnet), `decoder.upsamples.N` counted
 * from the file — each a resnet (its shortcut optional) or an upsampler (`resample.1`, its
 * `time_conv` optional) — and the head.
 * @throws TpError E_FORMAT for an upsample index that holds neither a resnet nor a resampler
 */
export function wan21VaeTensorSet(src: TensorSource): TensorSetSpec {
  const what = "Wan 2.1 VAE decoder";
  const ups = declaredDepth(src, "decoder.upsamples.");
  const required: string[] = [
    "conv2.weight",
    "conv2.bias",
    "decoder.conv1.weight",
    "decoder.conv1.bias",
    ...wanResnet("decoder.middle.0"),
    "decoder.middle.1.norm.gamma",
    "decoder.middle.1.to_qkv.weight",
    "decoder.middle.1.to_qkv.bias",
    "decoder.middle.1.proj.weight",
    "decoder.middle.1.proj.bias",
    ...wanResnet("decoder.middle.2"),
    "decoder.head.0.gamma",
    "decoder.head.2.weight",
    "decoder.head.2.bias",
  ];
  const optional: string[] = [];
  for (let i = 0; i < ups; i++) {
    const p = `decoder.upsamples.${i}`;
    const resample = src.has(`${p}.resample.1.weight`) || src.has(`${p}.resample.1.bias`);
    if (resample) {
      required.push(`${p}.resample.1.weight`, `${p}.resample.1.bias`);
      optional.push(`${p}.time_conv.weight`, `${p}.time_conv.bias`);
    } else {
      required.push(...wanResnet(p));
      optional.push(`${p}.shortcut.weight`, `${p}.shortcut.bias`);
      if (src.has(`${p}.shortcut.weight`) !== src.has(`${p}.shortcut.bias`))
        required.push(`${p}.shortcut.weight`, `${p}.shortcut.bias`);
    }
  }
  return {
    what,
    required,
    optional,
    ignored: [/^encoder\./, /^conv1\./],
    depth: `${ups} decoder.upsamples (decoder.upsamples.0 … decoder.upsamples.${ups - 1})`,
  };
}

/**
 * A GGUF LLM's layers beyond its declared `block_count`: E_FORMAT naming the first (the loader reads
 * `block_count` layers, so the rest would be ignored and the banner would misstate the model).
 * @throws TpError E_FORMAT
 */
export function checkGgufDepth(src: TensorSource, blockCount: number, key: string): void {
  const depth = declaredDepth(src, "blk.");
  if (depth > blockCount) {
    const stray = src.tensors.find((t) => t.name.startsWith(`blk.${depth - 1}.`))?.name as string;
    throw new TpError(
      "E_FORMAT",
      `the file declares ${key} = ${blockCount} but holds layer ${depth - 1} (${stray}); the extra layers would be ignored`,
      { file: src.path, tensor: stray },
    );
  }
}
