// `bun apps/llm --backend vulkan` end to end (issue 6), spawned as a user would run it: the same greedy
// ids as `--backend cpu` on stories260K and a quantized qwen3 (../shared/models). Skipped with the
// reason when the shared models are absent or no Vulkan device starts (no loader, no driver, the shim
// not built). `--backend vulkan` starts the Vulkan backend or fails (no CPU fallback in the registry).
import { describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { createBackend } from "@tp/backend-vulkan";

const MODELS = resolve(import.meta.dir, "../../../shared/models");
const HAVE_MODELS = existsSync(join(MODELS, "PROVENANCE.md"));
const APP = resolve(import.meta.dir, "index.ts");
const T = 60_000; // two spawns of bun, each loading a model, on a loaded CI machine

function vulkanReason(): string | null {
  try {
    createBackend().dispose();
    return null;
  } catch (e) {
    const why = e instanceof Error ? e.message : String(e);
    return why.split("\n")[0] ?? why;
  }
}
const why = HAVE_MODELS ? vulkanReason() : null;
const SKIP = !HAVE_MODELS
  ? `skipped: ${MODELS} is absent (the shared models folder is not beside this checkout)`
  : why !== null
    ? `skipped: no Vulkan device starts (${why})`
    : "";

async function json(args: string[]): Promise<Record<string, unknown>> {
  const p = Bun.spawn(["bun", APP, ...args, "--json"], { stdin: "ignore", stdout: "pipe", stderr: "pipe" });
  const [stdout, stderr, code] = await Promise.all([
    new Response(p.stdout).text(),
    new Response(p.stderr).text(),
    p.exited,
  ]);
  expect(stderr).toBe("");
  expect(code).toBe(0);
  return JSON.parse(stdout);
}

describe.skipIf(SKIP !== "")("bun apps/llm --backend vulkan", () => {
  for (const file of ["real/stories260K-f32-v3.gguf", "synthetic/qwen3-tiny-Q4_0.gguf"]) {
    test(
      `${file}: --temp 0 gives the ids of --backend cpu`,
      async () => {
        const args = ["-m", join(MODELS, file), "-p", "Once upon a time", "--temp", "0", "-n", "24"];
        const gpu = await json(["--backend", "vulkan", ...args]);
        const cpu = await json(["--backend", "cpu", "--threads", "2", ...args]);
        expect(gpu.prompt_ids).toEqual(cpu.prompt_ids);
        expect((gpu.ids as number[]).length).toBeGreaterThan(0);
        expect(gpu.ids).toEqual(cpu.ids);
        expect(gpu.text).toBe(cpu.text);
      },
      T,
    );
  }
});

if (SKIP !== "") test.skip(SKIP, () => {});
