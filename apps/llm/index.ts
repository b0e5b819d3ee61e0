#!/usr/bin/env bun
/**
 * `bun apps/llm` — the chat program (REPL, single prompt, server). It arrives with the LLM runner
 * issue; until then it says so as a one-line E_UNSUPPORTED error and exits 1.
 */
import { runCli, TpError } from "@tp/tensor";

await runCli(() => {
  throw new TpError("E_UNSUPPORTED", "bun apps/llm is not implemented in this build yet");
});
