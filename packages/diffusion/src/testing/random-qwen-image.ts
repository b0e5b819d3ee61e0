/**
 * A random-weight Qwen-Image-2.1 transformer in the diffusers layout (bare names, `gate_layer` /
 * `proj` halves, BF16, no biases; qwen-image.md §2.1) at any size, written tensor by tensor (real size:
 * 7.1 B parameters, 14 GB) for `bun run bench qwen-image`. Values: uniform with σ = 1/√K per linear
 * (random.ts's fast generator), norm scales near 1 (RMS) / 0 (the zero-centred text norm).
 */
import { SafetensorsWriter } from "@tp/formats";
import { encodeFromF32 } from "@tp/tensor";
import { uniform } from "./uniform.ts";

/** The sizes a random transformer is written with (diffusers' config.json names). */
export interface RandomQwenImageConfig {
  readonly hidden_size: number;
  readonly attention_head_dim: number;
  readonly num_layers: number;
  readonly mlp_hidden: number;
  readonly context_in_dim: number;
}

/** The real model's sizes (qwen-image.md §2.1). */
export const QWEN_IMAGE_CONFIG: RandomQwenImageConfig = {
  hidden_size: 4096,
  attention_head_dim: 128,
  num_layers: 32,
  mlp_hidden: 12288,
  context_in_dim: 4096,
};

/** Every tensor name and shape of a transformer of `c`'s sizes, in diffusers order. */
export function qwenImageTensorShapes(c: RandomQwenImageConfig): [string, number[]][] {
  const D = c.hidden_size;
  const out: [string, number[]][] = [
    ["img_in.weight", [D, 64]],
    ["txt_in.text_norm.weight", [c.context_in_dim]],
    ["txt_in.in_layer.weight", [D, c.context_in_dim]],
    ["txt_in.out_layer.weight", [D, D]],
    ["time_text_embed.timestep_embedder.linear_1.weight", [D, 256]],
    ["time_text_embed.timestep_embedder.linear_2.weight", [D, D]],
    ["modulation.1.weight", [4 * D, D]],
  ];
  for (let i = 0; i < c.num_layers; i++) {
    const p = `transformer_blocks.${i}`;
    for (const n of ["to_q", "to_k", "to_v", "to_out.0"]) out.push([`${p}.attn.${n}.weight`, [D, D]]);
    out.push(
      [`${p}.attn.norm_q.weight`, [c.attention_head_dim]],
      [`${p}.attn.norm_k.weight`, [c.attention_head_dim]],
    );
    out.push(
      [`${p}.img_mlp.gate_layer.weight`, [c.mlp_hidden, D]],
      [`${p}.img_mlp.proj.weight`, [c.mlp_hidden, D]],
    );
    out.push([`${p}.img_mlp.out.weight`, [D, c.mlp_hidden]]);
  }
  out.push(["norm_out.linear.weight", [D, D]], ["proj_out.weight", [64, D]]);
  return out;
}

/**
 * Write a random transformer as one BF16 safetensors file (temporary name, then rename).
 * @returns bytes written
 * @throws TpError E_IO when the file cannot be written (nothing is left under `path`)
 */
export function writeRandomQwenImageDit(path: string, c: RandomQwenImageConfig, seed = 0): number {
  const shapes = qwenImageTensorShapes(c);
  const w = new SafetensorsWriter(
    path,
    shapes.map(([name, shape]) => ({ name, dtype: "BF16", shape })),
    {
      metadata: {
        description: "random weights in the Qwen-Image-2.1 layout (TensorPencil bench); not a trained model",
      },
    },
  );
  let bytes = 0;
  try {
    shapes.forEach(([name, shape], i) => {
      const n = shape.reduce((a, b) => a * b, 1);
      const norm = shape.length === 1;
      const v = uniform(n, norm ? 0.1 : 1 / Math.sqrt(shape[1] as number), seed, i);
      if (norm && !name.startsWith("txt_in.text_norm"))
        for (let j = 0; j < n; j++) v[j] = (v[j] as number) + 1;
      const data = encodeFromF32(v, "bf16");
      w.write(name, data);
      bytes += data.byteLength;
    });
    w.commit();
  } catch (e) {
    w.abort();
    throw e;
  }
  return bytes;
}
