/**
 * Tell what a checkpoint path is: a file (safetensors, GGUF, a sharded index), or a directory in
 * diffusers layout (`model_index.json` + component folders + index files) or ComfyUI layout
 * (`text_encoders/`, `diffusion_models/`, `vae/`, preferring `*_int8_convrot` then `*_bf16` files).
 * An unknown layout is a TpError E_FORMAT that lists what was found and what is known.
 *
 * Sources: ../shared/spec/qwen-image.md §2.1–2.3 (directory layouts and their detection),
 * ../shared/spec/krea2.md §1.1 (Krea 2 files), ../shared/spec/llm.md §1.1 (GGUF architectures).
 */
import { existsSync, readdirSync, statSync } from "node:fs";
import { basename, join } from "node:path";
import { TpError } from "@tp/tensor";
import { formatError, ioError } from "../errors.ts";
import { ReadableFile, readTextFile } from "../file.ts";
import { type GgufFile, openGguf } from "../gguf/file.ts";
import { openSafetensors } from "../safetensors/file.ts";
import { openSafetensorsIndex } from "../safetensors/sharded.ts";
import type { TensorSource } from "../tensors.ts";
import { detectKrea2Dit, detectQwenImage21Transformer } from "./diffusion.ts";
import { GGUF_HF_NAMES, GGUF_LLM_ARCHITECTURES } from "./gguf-llm.ts";
import { detectQwen3VlTextEncoder } from "./text-encoder.ts";
import type { DetectedLayout } from "./types.ts";
import { detectVae } from "./vae.ts";

/** What each known layout is recognised by, for the "unknown layout" message. */
export const KNOWN_LAYOUTS: Readonly<Record<string, string>> = {
  "krea2-dit":
    "Krea 2 DiT: blocks.0.mod.lin + txtfusion.projector.weight (optionally prefixed model.diffusion_model.)",
  "qwen-image-2.1-transformer":
    "Qwen-Image-2.1 transformer: img_in.weight + modulation.1.weight + transformer_blocks.N.attn.to_q.weight",
  "qwen3vl-text-encoder":
    "Qwen3-VL text encoder: model.language_model.embed_tokens.weight, or model.embed_tokens.weight + model.visual.*",
  "wan21-vae": "Wan 2.1 / Qwen-Image VAE: decoder.middle.0.residual.0.gamma + conv2.weight [16,16,1,1,1]",
  "qwen-image-2.1-vae":
    "Qwen-Image-2.1 VAE: post_quant_conv.weight [64,64,1,1] (diffusers) or decoder.conv1.weight + 64-channel conv2 (ComfyUI)",
  "gguf-llm": `GGUF language model with general.architecture one of: ${Object.keys(GGUF_LLM_ARCHITECTURES).join(", ")}`,
  "qwen-image-2.1-diffusers":
    "directory: model_index.json + text_encoder/ + transformer/ + vae/ (+ processor/)",
  comfyui: "directory: text_encoders/ + diffusion_models/ + vae/",
};

function knownList(): string {
  return Object.entries(KNOWN_LAYOUTS)
    .map(([k, v]) => `${k} (${v})`)
    .join("; ");
}

/**
 * Open a checkpoint file of any supported container: `*.index.json` (sharded safetensors), GGUF (by
 * its magic or a `.gguf` name; all shards of a split model), or safetensors.
 * @throws TpError E_IO when unreadable; E_FORMAT when the bytes are neither format or are invalid
 */
export function openCheckpoint(path: string): TensorSource {
  if (path.endsWith(".index.json")) return openSafetensorsIndex(path);
  const f = new ReadableFile(path);
  let magic: Uint8Array;
  try {
    magic = f.read(0, Math.min(4, f.size), "the first bytes");
  } finally {
    f.close();
  }
  // a .gguf name is read as GGUF even when the magic is missing: its message then speaks of GGUF
  if (path.toLowerCase().endsWith(".gguf")) return openGguf(path);
  if (magic.length === 4 && new TextDecoder().decode(magic) === "GGUF") return openGguf(path);
  return openSafetensors(path);
}

function ggufLayout(g: GgufFile): DetectedLayout {
  const arch = g.architecture;
  if (arch === undefined) throw formatError("GGUF file has no general.architecture key", { file: g.path });
  if (!Object.hasOwn(GGUF_LLM_ARCHITECTURES, arch)) {
    throw formatError(
      `unknown GGUF architecture '${arch}'; known: ${Object.keys(GGUF_LLM_ARCHITECTURES).join(", ")}`,
      { file: g.path },
    );
  }
  const m = g.metadata;
  const types = new Map<string, number>();
  for (const t of g.tensors) types.set(t.dtype, (types.get(t.dtype) ?? 0) + 1);
  const details: Record<string, string | number | boolean> = {
    architecture: arch,
    gguf_version: g.version,
    tensors: g.tensors.length,
  };
  for (const k of [
    "block_count",
    "embedding_length",
    "context_length",
    "attention.head_count",
    "attention.head_count_kv",
    "expert_count",
  ]) {
    const v = m.has(`${arch}.${k}`) ? m.getInt(`${arch}.${k}`) : undefined;
    if (v !== undefined) details[k] = v;
  }
  const tok = m.has("tokenizer.ggml.model") ? m.getString("tokenizer.ggml.model") : undefined;
  if (tok !== undefined) details["tokenizer.ggml.model"] = tok;
  const vocab = m.has("tokenizer.ggml.tokens") ? m.getArray("tokenizer.ggml.tokens")?.length : undefined;
  if (vocab !== undefined) details.vocab_size = vocab;
  details.tied_embeddings = !g.has("output.weight");
  if (g.shards.length > 1) details.split_count = g.shards.length;
  const typeList = [...types].map(([t, n]) => `${n}×${t}`).join(" ");
  return {
    kind: "gguf-llm",
    description: `GGUF ${GGUF_LLM_ARCHITECTURES[arch]} (${arch}), ${details.block_count ?? "?"} layers × ${details.embedding_length ?? "?"}, tensors ${typeList}`,
    variant: typeList,
    prefix: "",
    details,
    path: g.path,
    files: g.files,
    ...(GGUF_HF_NAMES[arch] ? { names: GGUF_HF_NAMES[arch] } : {}),
  };
}

/**
 * The layout of an opened checkpoint.
 * @throws TpError E_FORMAT for an unknown layout (what was found, what is known); E_UNSUPPORTED for
 *   recognised but unsupported checkpoints (a Wan 2.2 VAE, an unsupported quantization format)
 */
export function identifyCheckpoint(src: TensorSource): DetectedLayout {
  if (src.kind === "gguf") return ggufLayout(src as GgufFile);
  for (const detect of [detectKrea2Dit, detectQwenImage21Transformer, detectVae, detectQwen3VlTextEncoder]) {
    const found = detect(src);
    if (found) return found;
  }
  const some = src.tensors.slice(0, 6).map((t) => t.name);
  throw formatError(
    `unknown checkpoint layout: ${src.tensors.length} tensors (${some.join(", ")}${src.tensors.length > some.length ? ", …" : ""}); known layouts: ${knownList()}`,
    { file: src.path },
  );
}

function withOpen<T>(path: string, f: (src: TensorSource) => T): T {
  const src = openCheckpoint(path);
  try {
    return f(src);
  } finally {
    src.close();
  }
}

function listDir(dir: string): string[] {
  try {
    return readdirSync(dir).sort();
  } catch (e) {
    throw ioError("list the directory", dir, e);
  }
}

/** The checkpoint file of a component folder: an index file, else the one `.safetensors`, else the preferred one. */
function componentFile(dir: string): string | null {
  if (!existsSync(dir)) return null;
  const files = listDir(dir);
  const index = files.find((f) => f.endsWith(".safetensors.index.json"));
  if (index) return join(dir, index);
  const st = files.filter((f) => f.endsWith(".safetensors") || f.endsWith(".gguf"));
  const pick =
    st.find((f) => f.includes("_int8_convrot")) ??
    st.find((f) => f.includes("_bf16")) ??
    st.find((f) => /-00001-of-\d{5}\.gguf$/.test(f)) ??
    st[0];
  return pick === undefined ? null : join(dir, pick);
}

function detectDiffusers(dir: string): DetectedLayout {
  let cls = "?";
  try {
    cls = String(
      (
        JSON.parse(readTextFile(join(dir, "model_index.json"), "model_index.json")) as {
          _class_name?: unknown;
        }
      )._class_name ?? "?",
    );
  } catch (e) {
    throw formatError(`model_index.json is not readable JSON: ${(e as Error).message}`, {
      file: join(dir, "model_index.json"),
    });
  }
  const components: Record<string, DetectedLayout> = {};
  const missing: string[] = [];
  for (const c of ["transformer", "text_encoder", "vae"]) {
    const file = componentFile(join(dir, c));
    if (file === null) missing.push(`${c}/ (with *.safetensors or *.safetensors.index.json)`);
    else components[c] = withOpen(file, identifyCheckpoint);
  }
  const tokenizer = existsSync(join(dir, "processor", "tokenizer.json"));
  if (!tokenizer) missing.push("processor/tokenizer.json");
  if (missing.length > 0) {
    throw formatError(
      `diffusers layout (${cls}) is missing: ${missing.join(", ")}; found: ${listDir(dir).join(", ")}`,
      { file: dir },
    );
  }
  if (components.transformer?.kind !== "qwen-image-2.1-transformer") {
    throw formatError(
      `diffusers pipeline ${cls}: transformer/ is ${components.transformer?.kind}; known: Qwen-Image-2.1 (QwenImage21Pipeline)`,
      {
        file: dir,
      },
    );
  }
  return {
    kind: "qwen-image-2.1-diffusers",
    description: `Qwen-Image-2.1 in diffusers layout (${cls}): ${Object.entries(components)
      .map(([k, v]) => `${k}: ${v.description}`)
      .join("; ")}`,
    details: { pipeline: cls, tokenizer: "processor/tokenizer.json" },
    path: dir,
    files: Object.values(components).flatMap((c) => c.files),
    components,
  };
}

function detectComfy(dir: string): DetectedLayout {
  const components: Record<string, DetectedLayout> = {};
  const missing: string[] = [];
  for (const [key, sub] of [
    ["diffusion_model", "diffusion_models"],
    ["text_encoder", "text_encoders"],
    ["vae", "vae"],
  ] as const) {
    const file = componentFile(join(dir, sub));
    if (file === null) missing.push(`${sub}/*.safetensors`);
    else components[key] = withOpen(file, identifyCheckpoint);
  }
  if (missing.length > 0)
    throw formatError(`ComfyUI layout is missing: ${missing.join(", ")}`, { file: dir });
  const dm = components.diffusion_model?.kind;
  const model = dm === "krea2-dit" ? "Krea 2" : dm === "qwen-image-2.1-transformer" ? "Qwen-Image-2.1" : null;
  if (model === null) {
    throw formatError(
      `diffusion_models/ holds a ${dm}; known diffusion models: krea2-dit, qwen-image-2.1-transformer`,
      { file: dir },
    );
  }
  return {
    kind: "comfyui",
    description: `${model} in ComfyUI layout: ${Object.entries(components)
      .map(([k, v]) => `${k}: ${basename(v.path)}`)
      .join(", ")}`,
    variant: components.diffusion_model?.variant ?? "",
    details: { model },
    path: dir,
    files: Object.values(components).flatMap((c) => c.files),
    components,
  };
}

/**
 * Detect the layout of a file or a directory (see the module comment).
 * @throws TpError E_IO for a missing path; E_FORMAT for an unknown layout, listing what was found
 *   and the known layouts; E_UNSUPPORTED for recognised but unsupported checkpoints
 */
export function detectLayout(path: string): DetectedLayout {
  let isDir: boolean;
  try {
    isDir = statSync(path).isDirectory();
  } catch (e) {
    throw ioError("open", path, e);
  }
  if (!isDir) return withOpen(path, identifyCheckpoint);
  const entries = listDir(path);
  if (entries.includes("model_index.json")) return detectDiffusers(path);
  if (entries.includes("text_encoders") || entries.includes("diffusion_models")) return detectComfy(path);
  const files = entries.filter((f) => /\.safetensors\.index\.json$|\.safetensors$|\.gguf$/.test(f));
  const single =
    files.find((f) => f.endsWith(".safetensors.index.json")) ??
    (files.length === 1 ? files[0] : undefined) ??
    files.find((f) => /-00001-of-\d{5}\.gguf$/.test(f));
  if (single !== undefined) return withOpen(join(path, single), identifyCheckpoint);
  throw new TpError(
    "E_FORMAT",
    `unknown checkpoint directory layout; found: ${entries.slice(0, 20).join(", ") || "nothing"}; known layouts: ${knownList()}`,
    { file: path },
  );
}
