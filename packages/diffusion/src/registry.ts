/**
 * The pipeline registry: one row per model family, found by the layout @tp/formats detects in the DiT
 * file (`identifyCheckpoint`: tensor names and shapes, never the file name), as ComfyUI's
 * `supported_models.py` picks a model from a state dict. Adding a model is one file implementing
 * {@link DiffusionPipeline} and one row in {@link PIPELINES}.
 */
import { type DetectedLayout, identifyCheckpoint, openCheckpoint } from "@tp/formats";
import { isTpError, TpError } from "@tp/tensor";
import type { DiffusionPipeline, PipelineComponent } from "./pipeline.ts";
import { KREA2_PIPELINE } from "./pipelines/krea2-pipeline.ts";
import { QWEN_IMAGE_PIPELINE } from "./pipelines/qwen-image-pipeline.ts";

/** Every pipeline, by the checkpoint layout of its DiT; the first is the default for `decode` / `encode`. */
export const PIPELINES: readonly DiffusionPipeline[] = [KREA2_PIPELINE, QWEN_IMAGE_PIPELINE];

/**
 * The detected layout of a checkpoint file; `wrap` turns an identification failure (not an open one)
 * into the caller's error.
 */
function layoutOf(path: string, wrap: (e: TpError) => Error): DetectedLayout {
  const src = openCheckpoint(path);
  try {
    return identifyCheckpoint(src);
  } catch (e) {
    throw isTpError(e) ? wrap(e) : e;
  } finally {
    src.close();
  }
}

/** "Krea 2 DiT (no blocks.0.mod.lin + …)" for every row, joined with " or ". */
function expected(part: (p: DiffusionPipeline) => PipelineComponent, signatures: boolean): string {
  return PIPELINES.map((p) => {
    const c = part(p);
    return signatures ? `${c.what} (no ${c.signature})` : c.what;
  }).join(" or ");
}

/**
 * The pipeline for a diffusion-model (DiT) checkpoint, from its tensors (headers only).
 * @param path a `.safetensors` file or sharded index
 * @throws TpError E_IO for a missing or unreadable file; E_FORMAT when no pipeline takes it, saying
 *   what the file looks like (e.g. a VAE passed as the DiT)
 */
export function pipelineForCheckpoint(path: string): DiffusionPipeline {
  const layout = layoutOf(
    path,
    (e) =>
      new TpError("E_FORMAT", `${path} is not a ${expected((p) => p.dit, false)}: ${e.message}`, {
        file: path,
        cause: e,
      }),
  );
  const found = PIPELINES.find((p) => p.dit.layout === layout.kind);
  if (found) return found;
  throw new TpError(
    "E_FORMAT",
    `${path} is not a ${expected((p) => p.dit, true)}: it looks like a ${layout.description} (${layout.kind}); pass it where that component goes`,
    { file: path },
  );
}

/**
 * The pipeline a VAE or text-encoder file belongs to (for `decode` and `encode`, which have no DiT),
 * or the default row ({@link PIPELINES}[0]) when none claims it or the file cannot be read: that
 * row's loader then says what is wrong, naming the file.
 */
export function pipelineForComponent(path: string, part: "vae" | "textEncoder"): DiffusionPipeline {
  let kind: string | undefined;
  try {
    kind = layoutOf(path, (e) => e).kind;
  } catch (e) {
    if (!isTpError(e)) throw e; // the loader reports an unreadable or unknown file with its own words
  }
  return PIPELINES.find((p) => p[part].layout === kind) ?? (PIPELINES[0] as DiffusionPipeline);
}
