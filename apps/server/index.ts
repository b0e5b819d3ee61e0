#!/usr/bin/env bun
/**
 * `bun apps/server --model F [flags]` (or `bun apps/llm serve …`) — an OpenAI-compatible server for a
 * language model and an image model: a thin driver that loads the models and runs Bun.serve
 * (./serve.ts, ./server.ts) until SIGINT / SIGTERM. Flags: ./args.ts. Errors before it listens are one
 * `error E_CODE: …` line on stderr and a non-zero exit (runCli).
 */
import { runCli } from "@tp/tensor";
import { parseServerArgs, USAGE } from "./args.ts";
import { serve } from "./serve.ts";

export { startServer } from "./server.ts";

/** Parse `argv` (without the command) and serve; resolves with the exit status after SIGINT / SIGTERM. */
export async function serverMain(argv: string[]): Promise<number> {
  const args = parseServerArgs(argv);
  if (args.help) {
    console.log(USAGE);
    return 0;
  }
  return await serve(args);
}

if (import.meta.main) await runCli(() => serverMain(Bun.argv.slice(2)));
