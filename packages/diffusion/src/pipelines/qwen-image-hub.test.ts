// Qwen-Image-2.1 from the Hub against a mock hub on loopback serving the tiny checkpoints of
// ../shared/testdata/qwen-image-tiny as Qwen/Qwen-Image-2.1 (diffusers) and Comfy-Org/Qwen-Image-2.1
// (ComfyUI): small files before weights, the shards named by the index, the ComfyUI repo completed with
// the Qwen repo's tokenizer and VAE config, nothing fetched once complete, a deleted file fetched alone.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startMockHub } from "@tp/formats/testing/mock-hub";
import { SHARED } from "../testing/fixtures.ts";
import { QWEN_IMAGE_REPOS, qwenImageFromHub, qwenImageModelFiles } from "./qwen-image-pipeline.ts";

const DIR = join(SHARED, "testdata/qwen-image-tiny");
const missing = [join(DIR, "diffusers/model_index.json"), join(DIR, "comfyui/vae")].filter(
  (p) => !existsSync(p),
);
const note = missing.length === 0 ? "" : ` [skipped: shared fixture missing: ${missing.join(", ")}]`;
const run = missing.length === 0 ? describe : describe.skip;
const tmp = mkdtempSync(join(tmpdir(), "tp-qimage-hub-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

function tree(root: string): Record<string, Uint8Array> {
  const out: Record<string, Uint8Array> = {};
  for (const f of readdirSync(root, { recursive: true }) as string[]) {
    const p = join(root, f);
    if (statSync(p).isFile()) out[f] = new Uint8Array(readFileSync(p));
  }
  return out;
}

run(`Qwen-Image-2.1 from a mock hub${note}`, () => {
  test("both repositories: folders qwenImageModelFiles takes; then no request; a deleted shard alone", async () => {
    using hub = startMockHub(QWEN_IMAGE_REPOS.diffusers, tree(join(DIR, "diffusers")), {
      otherRepos: { [QWEN_IMAGE_REPOS.comfy]: tree(join(DIR, "comfyui")) },
    });
    const opts = { endpoint: hub.endpoint, cacheDir: join(tmp, "hub"), token: null, backoffMs: 1 };
    const dir = await qwenImageFromHub(QWEN_IMAGE_REPOS.diffusers, opts);
    const files = qwenImageModelFiles(dir);
    expect(files.dit.endsWith("transformer/diffusion_pytorch_model.safetensors.index.json")).toBe(true);
    const got = hub.requests
      .filter((r) => r.method === "HEAD")
      .map((r) => r.path.split(`${hub.sha}/`)[1] as string);
    const firstWeight = got.findIndex((p) => p.endsWith(".safetensors"));
    expect(got.slice(firstWeight).every((p) => p.endsWith(".safetensors"))).toBe(true); // small files first
    expect(got.filter((p) => p.startsWith("transformer/") && p.endsWith(".safetensors")).sort()).toEqual([
      "transformer/diffusion_pytorch_model-00001-of-00002.safetensors",
      "transformer/diffusion_pytorch_model-00002-of-00002.safetensors",
    ]);

    const before = hub.requests.length;
    expect(await qwenImageFromHub(QWEN_IMAGE_REPOS.diffusers, opts)).toBe(dir);
    expect(hub.requests.length).toBe(before);

    rmSync(join(dir, "transformer/diffusion_pytorch_model-00002-of-00002.safetensors"));
    hub.requests.length = 0;
    await qwenImageFromHub(QWEN_IMAGE_REPOS.diffusers, opts);
    expect(
      hub.requests.filter((r) => r.method === "HEAD").map((r) => r.path.split(`${hub.sha}/`)[1]),
    ).toEqual(["transformer/diffusion_pytorch_model-00002-of-00002.safetensors"]);

    const comfy = await qwenImageFromHub(QWEN_IMAGE_REPOS.comfy, opts);
    const c = qwenImageModelFiles(comfy);
    expect(c.dit.endsWith("qwen_image_2.1_tiny_int8_convrot.safetensors")).toBe(true);
    expect(existsSync(join(comfy, "diffusion_models/qwen_image_2.1_tiny_bf16.safetensors"))).toBe(false);
    expect(readFileSync(c.tokenizer, "utf8")).toBe(
      readFileSync(join(DIR, "diffusers/processor/tokenizer.json"), "utf8"),
    );
  }, 60000);
});
