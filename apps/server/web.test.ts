// The page at / in a real browser: Debian's headless Chromium driven by playwright-core (skipped,
// saying why, when /usr/bin/chromium or the shared tiny Qwen3 file is absent). With an API key set in
// the page, a typed message streams in piece by piece and ends as the server's greedy answer to the
// same conversation; an image job shows its progress and latent preview, then the final PNG and its
// parameters (random-weight Krea 2 checkpoints from @tp/diffusion/testing).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createBackend } from "@tp/backend-cpu";
import {
  TINY_KREA2_CONFIG,
  TINY_KREA2_TEXT_CONFIG,
  writeRandomKrea2Dit,
  writeRandomQwen3VlText,
  writeRandomWanVae,
} from "@tp/diffusion/testing";
import { loadModel } from "@tp/llm";
import OpenAI from "openai";
import { type Browser, chromium } from "playwright-core";
import { type ImageService, loadImageService } from "./images.ts";
import { LlmEngine } from "./llm.ts";
import { type RunningServer, startServer } from "./server.ts";

const CHROMIUM = "/usr/bin/chromium";
const QWEN = resolve(import.meta.dir, "../../../shared/models/synthetic/qwen3-tiny-Q8_0.gguf");
const why = !existsSync(CHROMIUM)
  ? `${CHROMIUM} is absent (apt-get install chromium)`
  : !existsSync(QWEN)
    ? `${QWEN} is absent (the shared models folder is not beside this checkout)`
    : null;
if (why !== null) console.warn(`skipped: ${why}`);
const KEY = "sk-page-test";
const T = 180_000;

describe.skipIf(why !== null)("the web page in Chromium", () => {
  const tmp = mkdtempSync(join(tmpdir(), "tp-server-web-"));
  const backend = createBackend({ threads: 1 });
  let engine: LlmEngine;
  let images: ImageService;
  let server: RunningServer;
  let browser: Browser;

  beforeAll(async () => {
    const dit = join(tmp, "dit.safetensors");
    const vae = join(tmp, "vae.safetensors");
    const te = join(tmp, "te.safetensors");
    writeRandomKrea2Dit(dit, TINY_KREA2_CONFIG, { seed: 1 });
    writeRandomWanVae(vae, undefined, { seed: 2 });
    writeRandomQwen3VlText(te, TINY_KREA2_TEXT_CONFIG, { seed: 3 });
    images = loadImageService(dit, backend, { vae, textEncoder: te, outputDir: join(tmp, "out") });
    // Each forward waits 20 ms first, so the answer's pieces reach the page in separate network reads
    // (on a quiet machine the tiny model is fast enough for the whole stream to arrive in one read,
    // and the page would render it in one mutation).
    const loaded = loadModel(QWEN, { backend });
    const step = loaded.model.step.bind(loaded.model);
    const pause = new Int32Array(new SharedArrayBuffer(4));
    loaded.model.step = (ids, options) => {
      Atomics.wait(pause, 0, 0, 20);
      return step(ids, options);
    };
    engine = new LlmEngine(loaded, {
      name: "qwen3-tiny",
      parallel: 1,
      queueLimit: 8,
      ctx: 512,
      defaultMaxTokens: 64,
      reasoningFormat: "deepseek",
    });
    server = startServer({ llm: engine, images, port: 0, apiKey: KEY });
    browser = await chromium.launch({ executablePath: CHROMIUM, args: ["--no-sandbox", "--disable-gpu"] });
  }, T);

  afterAll(async () => {
    await browser?.close();
    await server?.stop();
    engine?.dispose();
    images?.dispose();
    backend.dispose();
    rmSync(tmp, { recursive: true, force: true });
  });

  test(
    "chat: the answer streams in and equals the API's greedy answer; an image job shows progress, preview and result",
    async () => {
      const page = await browser.newPage();
      await page.addInitScript(`localStorage.setItem("tp-api-key", ${JSON.stringify(KEY)})`);
      await page.goto(server.url);
      // page code is passed as text: this project's TypeScript has no DOM library
      await page.waitForFunction('document.getElementById("models").textContent.includes("qwen3-tiny")');
      // count the assistant text's changes while it streams
      await page.evaluate(`window.changes = 0;
        new MutationObserver(() => window.changes++).observe(document.getElementById("log"),
          { subtree: true, characterData: true, childList: true });`);
      await page.fill("#temp", "0");
      await page.fill("#maxTokens", "24");
      await page.fill("#prompt", "Tell me about rivers.");
      await page.press("#prompt", "Enter");
      await page.waitForSelector(".assistant[data-done]", { timeout: 60_000 });
      const shown = await page.textContent(".assistant[data-done]");
      const changes = (await page.evaluate("window.changes")) as number;
      const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0 });
      const want = await client.chat.completions.create({
        model: "qwen3-tiny",
        messages: [{ role: "user", content: "Tell me about rivers." }],
        temperature: 0,
        max_tokens: 24,
      });
      expect(shown).toBe(want.choices[0]?.message.content as string);
      expect(changes).toBeGreaterThan(5); // many pieces, not one final write
      expect(await page.textContent("#chatStats")).toContain("generated");

      await page.fill("#imgPrompt", "a red kite");
      await page.fill("#width", "64");
      await page.fill("#height", "48");
      await page.fill("#steps", "3");
      await page.fill("#seed", "5");
      // remember every preview the page shows
      await page.evaluate(`window.previews = [];
        new MutationObserver(() => window.previews.push(document.getElementById("preview").src))
          .observe(document.getElementById("preview"), { attributes: true, attributeFilter: ["src"] });`);
      await page.click("#generate");
      await page.waitForSelector('#jobStatus[data-state="succeeded"]', { timeout: 120_000 });
      await page.waitForFunction('document.getElementById("result").naturalWidth > 0');
      const size = await page.evaluate(
        '[document.getElementById("result").naturalWidth, document.getElementById("result").naturalHeight]',
      );
      expect(size).toEqual([64, 48]);
      const previews = (await page.evaluate("window.previews")) as string[];
      expect(previews.length).toBeGreaterThan(0);
      expect(previews.every((p) => p.startsWith("data:image/png;base64,"))).toBe(true);
      expect(await page.textContent("#params")).toContain("Seed: 5");
      expect(await page.textContent("#jobStatus")).toContain("step 3/3");
      await page.close();
    },
    T,
  );
});
