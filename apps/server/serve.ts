/**
 * Load what the flags name and serve it until SIGINT / SIGTERM: the language model into an
 * {@link LlmEngine} (`--parallel` slots of `--ctx` tokens each), the image model into an
 * {@link ImageService}, then {@link startServer}. Shared by `bun apps/server` and `bun apps/llm serve`.
 */
import { basename } from "node:path";
import { loadModel } from "@tp/llm";
import { loadBackend, TpError } from "@tp/tensor";
import type { ServerArgs } from "./args.ts";
import type { ImageService } from "./images.ts";
import { LlmEngine } from "./llm.ts";
import { startServer } from "./server.ts";

/** Default context per slot: the model's, at most this. */
export const DEFAULT_SLOT_CTX = 4096;

/** Load an {@link LlmEngine} for `args` on `backend`. @throws TpError from loading, E_ARG for --ctx */
export function loadEngine(
  args: Pick<
    ServerArgs,
    "model" | "alias" | "ctx" | "parallel" | "queueLimit" | "nPredict" | "reasoningFormat" | "batch"
  >,
  backend: Parameters<typeof loadModel>[1]["backend"],
): LlmEngine {
  const file = args.model as string;
  const loaded = loadModel(file, { backend });
  const trained = loaded.config.max_position_embeddings;
  if (args.ctx !== undefined && args.ctx > trained) {
    loaded.model.dispose();
    throw new TpError(
      "E_ARG",
      `--ctx must be an integer from 2 to ${trained} (the model's trained context), got '${args.ctx}'`,
      { file },
    );
  }
  const ctx = args.ctx ?? Math.min(trained, DEFAULT_SLOT_CTX);
  return new LlmEngine(loaded, {
    name: args.alias ?? basename(file).replace(/\.(gguf|safetensors)$/i, ""),
    parallel: args.parallel,
    queueLimit: args.queueLimit,
    ctx,
    defaultMaxTokens: args.nPredict,
    reasoningFormat: args.reasoningFormat,
    batch: args.batch,
  });
}

/** Serve until a signal; returns the exit status. */
export async function serve(args: ServerArgs): Promise<number> {
  if (args.queue !== undefined) {
    const q = await import("./queue.ts");
    return args.worker ? await q.serveWorker(args) : await q.serveFront(args);
  }
  const backend = await loadBackend(
    args.backend,
    args.threads === undefined ? {} : { threads: args.threads },
  );
  const llm = args.model === undefined ? undefined : loadEngine(args, backend);
  let images: ImageService | undefined;
  if (args.imageModel !== undefined) {
    const { loadImageService } = await import("./images.ts");
    images = loadImageService(args.imageModel, backend, {
      vae: args.vae as string,
      textEncoder: args.textEncoder,
      outputDir: args.outputDir,
      queueLimit: args.queueLimit,
    });
  }
  const server = startServer({
    llm,
    images,
    host: args.host,
    port: args.port,
    apiKey: args.apiKey,
    maxBodyBytes: args.maxBody,
  });
  const what = [
    llm === undefined
      ? ""
      : `${llm.options.name} (${llm.options.parallel} slot${llm.options.parallel > 1 ? "s" : ""} × ${llm.options.ctx} tokens)`,
    images === undefined ? "" : images.name,
  ].filter((s) => s !== "");
  process.stderr.write(
    `[listening on ${server.url}: ${what.join(", ")}; ${backend.name} backend: ${backend.device}${args.apiKey === undefined ? "" : "; API key required"}]\n`,
  );
  await new Promise<void>((resolve) => {
    process.once("SIGINT", () => resolve());
    process.once("SIGTERM", () => resolve());
  });
  await server.stop();
  llm?.dispose();
  images?.dispose();
  backend.dispose();
  return 0;
}
