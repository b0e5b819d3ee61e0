// Layout detection on small synthetic checkpoints shaped like the real ones (names, dtypes and marker
// tensors from krea2.md §1 and qwen-image.md §2), directory layouts, the name tables, and loading a
// tensor as a Weight with its scales.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdirSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { isTpError, type TpError } from "@tp/tensor";
import { ggufKv, writeGguf } from "../gguf/write.ts";
import { writeShardedSafetensors } from "../safetensors/sharded.ts";
import { type SafetensorsTensorInput, writeSafetensors } from "../safetensors/write.ts";
import { HAVE_MODELS, MODELS, NO_MODELS, tempDir, thrown } from "../testing/util.ts";
import { detectLayout, openCheckpoint } from "./detect.ts";
import { QWEN_IMAGE_21_TRANSFORMER_NAMES } from "./diffusion.ts";
import { GGUF_HF_NAMES } from "./gguf-llm.ts";
import { mapName, unmapName } from "./names.ts";
import { loadWeight } from "./tensor-format.ts";
import { QWEN_IMAGE_21_VAE_NAMES } from "./vae.ts";

const tmp = tempDir("layouts");
afterAll(tmp.cleanup);
const T = (name: string, dtype: string, shape: number[]): SafetensorsTensorInput => {
  const bits = dtype === "F32" ? 4 : dtype === "BF16" || dtype === "F16" ? 2 : 1;
  return { name, dtype, shape, data: new Uint8Array(shape.reduce((a, b) => a * b, 1) * bits).fill(1) };
};
const json = (name: string, v: unknown): SafetensorsTensorInput => {
  const data = new TextEncoder().encode(JSON.stringify(v));
  return { name, dtype: "U8", shape: [data.length], data };
};
function save(path: string, tensors: SafetensorsTensorInput[]): string {
  writeSafetensors(path, tensors);
  return path;
}

/** A 2-block Krea 2 DiT, dim 256 (the real one: 28 blocks × 6144). */
function krea2(
  variant: "fp8" | "fp8_scaled" | "int8_convrot" | "int4_convrot",
  prefix: string,
): SafetensorsTensorInput[] {
  const d = 256;
  const out = [
    T(`${prefix}first.weight`, "BF16", [d, 64]),
    T(`${prefix}txtfusion.projector.weight`, "BF16", [1, 12]),
  ];
  for (const b of [0, 1]) {
    out.push(T(`${prefix}blocks.${b}.mod.lin`, "BF16", [6 * d]));
    for (const [l, n, k] of [
      ["attn.wq", d, d],
      ["attn.wk", d, d],
      ["attn.wv", d, d],
      ["attn.gate", d, d],
      ["attn.wo", d, d],
      ["mlp.gate", d, d],
      ["mlp.up", d, d],
      ["mlp.down", d, d],
    ] as const) {
      const w = `${prefix}blocks.${b}.${l}`;
      if (variant === "fp8") out.push(T(`${w}.weight`, "F8_E4M3", [n, k]));
      if (variant === "fp8_scaled")
        out.push(T(`${w}.weight`, "F8_E4M3", [n, k]), T(`${w}.weight_scale`, "F32", []));
      if (variant === "int8_convrot") {
        out.push(T(`${w}.weight`, "I8", [n, k]), T(`${w}.weight_scale`, "F32", [n, 1]));
        out.push(
          json(`${w}.comfy_quant`, { format: "int8_tensorwise", convrot: true, convrot_groupsize: 256 }),
        );
      }
      if (variant === "int4_convrot")
        out.push(T(`${w}.weight`, "I8", [n, k / 2]), T(`${w}.weight_scale`, "F32", [n]));
    }
  }
  return out;
}

describe("single files", () => {
  test("Krea 2 DiT: fp8 raw, fp8 scaled, INT8 ConvRot (ComfyUI prefix, comfy_quant), INT4 ConvRot (dtype + shape)", () => {
    const cases = [
      ["fp8", "", "fp8"],
      ["fp8_scaled", "", "fp8_scaled"],
      ["int8_convrot", "model.diffusion_model.", "int8_convrot"],
      ["int4_convrot", "", "int4_convrot"],
    ] as const;
    for (const [variant, prefix, want] of cases) {
      const p = save(join(tmp.dir, `krea2-${variant}.safetensors`), krea2(variant, prefix));
      const l = detectLayout(p);
      expect([l.kind, l.variant, l.prefix, l.details.num_blocks, l.details.hidden_size]).toEqual([
        "krea2-dit",
        want,
        prefix,
        2,
        256,
      ]);
      expect(mapName(l.names as never, `${prefix}blocks.1.attn.wq.weight`)).toEqual([
        { name: "blocks.1.attn.wq.weight" },
      ]);
    }
  });

  test("loadWeight: views with the scales each format needs", () => {
    const src8 = openCheckpoint(join(tmp.dir, "krea2-int8_convrot.safetensors"));
    const w8 = loadWeight(src8, "model.diffusion_model.blocks.0.attn.wq.weight");
    expect([w8.format, w8.shape, w8.scale?.kind]).toEqual(["int8_convrot", [256, 256], "row"]);
    expect(w8.source?.byteLength).toBe(256 * 256);
    const src4 = openCheckpoint(join(tmp.dir, "krea2-int4_convrot.safetensors"));
    const w4 = loadWeight(src4, "blocks.0.mlp.down.weight", 256);
    expect([w4.format, w4.shape]).toEqual(["int4_convrot", [256, 256]]);
    const fp8 = loadWeight(
      openCheckpoint(join(tmp.dir, "krea2-fp8_scaled.safetensors")),
      "blocks.0.attn.wo.weight",
    );
    expect([fp8.format, fp8.scale?.kind]).toEqual(["f8_e4m3fn", "tensor"]);
    expect(
      loadWeight(openCheckpoint(join(tmp.dir, "krea2-fp8.safetensors")), "blocks.0.attn.wo.weight").scale,
    ).toBeUndefined();
  });

  test("Qwen3-VL text encoders: 4B with HF names (fp8 scaled), 8B with ComfyUI names (vision tower present)", () => {
    const te4 = save(join(tmp.dir, "qwen3vl4b.safetensors"), [
      T("model.language_model.embed_tokens.weight", "BF16", [8, 2560]),
      ...[0, 1].flatMap((l) => [
        T(`model.language_model.layers.${l}.input_layernorm.weight`, "BF16", [2560]),
        T(`model.language_model.layers.${l}.self_attn.q_proj.weight`, "F8_E4M3", [16, 2560]),
        T(`model.language_model.layers.${l}.self_attn.q_proj.weight_scale`, "F32", []),
      ]),
    ]);
    const l4 = detectLayout(te4);
    expect([l4.kind, l4.variant, l4.details.model, l4.details.num_hidden_layers]).toEqual([
      "qwen3vl-text-encoder",
      "fp8_scaled",
      "Qwen3-VL-4B",
      2,
    ]);
    expect(mapName(l4.names as never, "model.language_model.layers.1.self_attn.q_proj.weight")).toEqual([
      { name: "layers.1.self_attn.q_proj.weight" },
    ]);
    const te8 = save(join(tmp.dir, "qwen3vl_8b_bf16.safetensors"), [
      T("model.embed_tokens.weight", "BF16", [8, 4096]),
      T("model.layers.0.input_layernorm.weight", "BF16", [4096]),
      T("model.layers.0.self_attn.q_proj.weight", "BF16", [4, 4096]),
      T("model.visual.patch_embed.weight", "BF16", [4]),
      T("lm_head.weight", "BF16", [8, 4]),
    ]);
    const l8 = detectLayout(te8);
    expect([l8.kind, l8.prefix, l8.details.model]).toEqual(["qwen3vl-text-encoder", "model.", "Qwen3-VL-8B"]);
    expect(mapName(l8.names as never, "model.visual.patch_embed.weight")).toEqual([]);
    expect(mapName(l8.names as never, "lm_head.weight")).toEqual([]);
    expect(mapName(l8.names as never, "model.norm.weight")).toEqual([{ name: "norm.weight" }]);
  });

  test("VAEs: Wan 2.1 (Krea 2) accepted, Qwen-Image-2.1 mapped to diffusers names, Wan 2.2 refused by name", () => {
    const common = (z: number, nested: boolean) => [
      T("conv2.weight", "F32", [z, z, 1, 1, 1]),
      T("decoder.conv1.weight", "F32", [4, z, 3, 3, 3]),
      T("decoder.middle.0.residual.0.gamma", "F32", [96, 1, 1, 1]),
      T("decoder.head.0.gamma", "F32", [96, 1, 1, 1]),
      T("encoder.conv1.weight", "F32", [4]),
      ...(nested ? [T("decoder.upsamples.0.upsamples.0.residual.2.weight", "F32", [4])] : []),
    ];
    expect(detectLayout(save(join(tmp.dir, "wan21.safetensors"), common(16, false))).kind).toBe("wan21-vae");
    const qi = detectLayout(save(join(tmp.dir, "qwen_image_2.1_vae_bf16.safetensors"), common(64, true)));
    expect(qi.kind).toBe("qwen-image-2.1-vae");
    const t = QWEN_IMAGE_21_VAE_NAMES;
    expect(mapName(t, "conv2.weight")).toEqual([{ name: "post_quant_conv.weight" }]);
    expect(mapName(t, "decoder.middle.1.to_qkv.weight")).toEqual([
      { name: "decoder.mid_block.attentions.0.to_qkv.weight" },
    ]);
    expect(mapName(t, "decoder.middle.2.residual.3.gamma")).toEqual([
      { name: "decoder.mid_block.resnets.1.norm2.gamma" },
    ]);
    expect(mapName(t, "decoder.upsamples.2.upsamples.1.residual.6.bias")).toEqual([
      { name: "decoder.up_blocks.2.resnets.1.conv2.bias" },
    ]);
    expect(mapName(t, "decoder.upsamples.3.upsamples.0.shortcut.weight")).toEqual([
      { name: "decoder.up_blocks.3.resnets.0.conv_shortcut.weight" },
    ]);
    expect(mapName(t, "decoder.upsamples.1.upsamples.3.resample.1.weight")).toEqual([
      { name: "decoder.up_blocks.1.upsampler.resample.1.weight" },
    ]);
    expect(mapName(t, "decoder.head.2.bias")).toEqual([{ name: "decoder.conv_out.bias" }]);
    expect(mapName(t, "encoder.conv1.weight")).toEqual([]);
    const e = thrown(() =>
      detectLayout(save(join(tmp.dir, "wan22.safetensors"), common(48, true))),
    ) as TpError;
    expect([e.code, e.message.includes("Wan 2.2")]).toEqual(["E_UNSUPPORTED", true]);
  });

  test("Qwen-Image-2.1 transformer, ComfyUI names: gate_up splits into gate_layer (first half) and proj", () => {
    const p = save(join(tmp.dir, "qwen_image_2.1_bf16.safetensors"), [
      T("img_in.weight", "BF16", [32, 64]),
      T("modulation.1.weight", "BF16", [128, 32]),
      T("txt_in.text_norm.weight", "BF16", [32]),
      T("transformer_blocks.0.attn.to_q.weight", "BF16", [32, 32]),
      T("transformer_blocks.0.img_mlp.gate_up.weight", "BF16", [192, 32]),
    ]);
    const l = detectLayout(p);
    expect([l.kind, l.variant, l.details.names]).toEqual(["qwen-image-2.1-transformer", "bf16", "comfyui"]);
    expect(mapName(QWEN_IMAGE_21_TRANSFORMER_NAMES, "transformer_blocks.7.img_mlp.gate_up.weight")).toEqual([
      { name: "transformer_blocks.7.img_mlp.gate_layer.weight", rows: [0, 0.5] },
      { name: "transformer_blocks.7.img_mlp.proj.weight", rows: [0.5, 1] },
    ]);
  });

  test("an unknown file names what it found and lists the known layouts", () => {
    const e = thrown(() =>
      detectLayout(save(join(tmp.dir, "other.safetensors"), [T("foo.weight", "F32", [2])])),
    ) as TpError;
    expect(e.code).toBe("E_FORMAT");
    expect(e.message).toContain("foo.weight");
    for (const k of ["krea2-dit", "qwen3vl-text-encoder", "wan21-vae", "gguf-llm", "comfyui"])
      expect(e.message).toContain(k);
  });
});

describe("directories", () => {
  test("ComfyUI layout: prefers *_int8_convrot, then *_bf16", () => {
    const root = join(tmp.dir, "comfy");
    for (const d of ["diffusion_models", "text_encoders", "vae"])
      mkdirSync(join(root, d), { recursive: true });
    save(join(root, "diffusion_models", "krea2_bf16.safetensors"), krea2("fp8", ""));
    save(
      join(root, "diffusion_models", "krea2_int8_convrot.safetensors"),
      krea2("int8_convrot", "model.diffusion_model."),
    );
    save(join(root, "text_encoders", "qwen3vl_4b_bf16.safetensors"), [
      T("model.language_model.embed_tokens.weight", "BF16", [8, 2560]),
    ]);
    save(join(root, "vae", "wan.safetensors"), [
      T("conv2.weight", "F32", [16, 16, 1, 1, 1]),
      T("decoder.conv1.weight", "F32", [1]),
      T("decoder.middle.0.residual.0.gamma", "F32", [96]),
    ]);
    const l = detectLayout(root);
    expect([l.kind, l.details.model, l.variant]).toEqual(["comfyui", "Krea 2", "int8_convrot"]);
    expect(l.components?.diffusion_model?.path.endsWith("krea2_int8_convrot.safetensors")).toBe(true);
  });

  test("diffusers layout: model_index.json + sharded transformer + text_encoder + vae + processor", () => {
    const root = join(tmp.dir, "diffusers");
    for (const d of ["transformer", "text_encoder", "vae", "processor"])
      mkdirSync(join(root, d), { recursive: true });
    writeFileSync(join(root, "model_index.json"), JSON.stringify({ _class_name: "QwenImage21Pipeline" }));
    writeShardedSafetensors(
      join(root, "transformer"),
      "diffusion_pytorch_model",
      [
        T("img_in.weight", "BF16", [32, 64]),
        T("modulation.1.weight", "BF16", [128, 32]),
        T("transformer_blocks.0.attn.to_q.weight", "BF16", [32, 32]),
        T("transformer_blocks.0.img_mlp.gate_layer.weight", "BF16", [96, 32]),
      ],
      { maxShardBytes: 4096 },
    );
    save(join(root, "text_encoder", "model.safetensors"), [
      T("model.language_model.embed_tokens.weight", "BF16", [2, 4096]),
    ]);
    save(join(root, "vae", "diffusion_pytorch_model.safetensors"), [
      T("post_quant_conv.weight", "F32", [64, 64, 1, 1]),
      T("decoder.conv_in.weight", "F32", [4]),
      T("decoder.norm_out.gamma", "F32", [144]),
    ]);
    const missing = thrown(() => detectLayout(root)) as TpError;
    expect(missing.message).toContain("processor/tokenizer.json");
    writeFileSync(join(root, "processor", "tokenizer.json"), "{}");
    const l = detectLayout(root);
    expect(l.kind).toBe("qwen-image-2.1-diffusers");
    expect(l.components?.transformer?.details.names).toBe("diffusers");
    expect(l.components?.transformer?.files.length).toBe(
      readdirSync(join(root, "transformer")).filter((f) => f.endsWith(".safetensors")).length,
    );
    expect(l.components?.text_encoder?.details.model).toBe("Qwen3-VL-8B");
  });

  test("an unknown directory lists what it holds and the known layouts", () => {
    const root = join(tmp.dir, "junk");
    mkdirSync(root);
    writeFileSync(join(root, "readme.txt"), "hi");
    const e = thrown(() => detectLayout(root)) as TpError;
    expect([
      e.code,
      e.message.includes("readme.txt"),
      e.message.includes("qwen-image-2.1-diffusers"),
    ]).toEqual(["E_FORMAT", true, true]);
  });
});

describe("GGUF language models", () => {
  test.skipIf(!HAVE_MODELS)(
    `${HAVE_MODELS ? "" : `${NO_MODELS}: `}every shared GGUF is detected by general.architecture and every tensor name maps to an HF name`,
    () => {
      for (const f of [
        "real/llama-2-tiny-random.gguf",
        "real/stories260K-f32-v3.gguf",
        ...["qwen3", "qwen3moe", "gemma3", "llama"].map((a) => `synthetic/${a}-tiny-Q4_0.gguf`),
      ]) {
        const l = detectLayout(join(MODELS, f));
        expect(l.kind).toBe("gguf-llm");
        const arch = l.details.architecture as string;
        const src = openCheckpoint(join(MODELS, f));
        for (const t of src.tensors) {
          const mapped = mapName(GGUF_HF_NAMES[arch] as never, t.name);
          expect(`${t.name} → ${mapped?.[0]?.name}`).toMatch(/ → (model\.|lm_head)/);
          expect(unmapName(GGUF_HF_NAMES[arch] as never, mapped?.[0]?.name as string)).toBe(t.name);
        }
        src.close();
      }
      const g = detectLayout(join(MODELS, "synthetic/gemma3-tiny-F16.gguf"));
      expect(mapName(g.names as never, "blk.3.ffn_norm.weight")).toEqual([
        { name: "model.layers.3.pre_feedforward_layernorm.weight" },
      ]);
      const q = detectLayout(join(MODELS, "synthetic/qwen3-tiny-F16.gguf"));
      expect(mapName(q.names as never, "blk.3.ffn_norm.weight")).toEqual([
        { name: "model.layers.3.post_attention_layernorm.weight" },
      ]);
      expect(q.details.tied_embeddings).toBe(true);
    },
  );

  test("an unknown architecture is E_FORMAT listing the known ones", () => {
    const p = join(tmp.dir, "bert.gguf");
    writeGguf(p, [ggufKv("general.architecture", "str", "bert")], []);
    const e = thrown(() => detectLayout(p)) as TpError;
    expect(isTpError(e, "E_FORMAT")).toBe(true);
    expect(e.message).toContain("unknown GGUF architecture 'bert'; known: llama, qwen3, qwen3moe");
  });
});
