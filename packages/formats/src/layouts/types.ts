/** What layout detection returns. */
import type { NameTable } from "./names.ts";

/** The kinds of checkpoint TensorPencil recognises. */
export type LayoutKind =
  | "krea2-dit"
  | "qwen-image-2.1-transformer"
  | "qwen3vl-text-encoder"
  | "wan21-vae"
  | "qwen-image-2.1-vae"
  | "gguf-llm"
  | "qwen-image-2.1-diffusers"
  | "comfyui";

/** A detected checkpoint (a file, a sharded set, or a directory of components). */
export interface DetectedLayout {
  /** What it is. */
  readonly kind: LayoutKind;
  /** One line for people: "Krea 2 DiT, INT8 ConvRot, prefix model.diffusion_model.". */
  readonly description: string;
  /** Storage variant when it matters (`fp8`, `fp8_scaled`, `int8_convrot`, `int4_convrot`, `bf16`, …). */
  readonly variant?: string;
  /** Name prefix found on every tensor (`model.diffusion_model.`), or "". */
  readonly prefix?: string;
  /** Facts read off the tensors or metadata (hidden size, layer count, architecture, …). */
  readonly details: Readonly<Record<string, string | number | boolean>>;
  /** The path that was inspected. */
  readonly path: string;
  /** The files holding the tensors. */
  readonly files: readonly string[];
  /** For directories: each component's layout. */
  readonly components?: Readonly<Record<string, DetectedLayout>>;
  /** The table that maps this checkpoint's names to the names the model code uses, when one applies. */
  readonly names?: NameTable;
}
