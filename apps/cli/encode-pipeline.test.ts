// `bun apps/cli encode` choosing the pipeline when Krea 2 and Qwen-Image-2.1 share the text-encoder
// layout (child processes on ../shared/testdata/qwen-image-tiny, skipped naming what is missing):
// --pipeline, --dit, --model and a diffusers folder's text_encoder/ give Qwen-Image's encoder, whose
// conditioning is checked against ComfyUI's (`te/prompt1_cond.bin`, f32 mode, 1e-4 relative); with no
// hint the documented default (Krea 2) with a notice naming the flags; bad or conflicting flags are
// one E_ARG line.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { readConditioning } from "@tp/diffusion";

const cli = resolve(import.meta.dir, "index.ts");
const run = (...args: string[]) => {
  const r = Bun.spawnSync([process.execPath, cli, ...args], { stdout: "pipe", stderr: "pipe" });
  return { code: r.exitCode, out: r.stdout.toString(), err: r.stderr.toString() };
};

const DIR = resolve(import.meta.dir, "../..", "../shared/testdata/qwen-image-tiny");
const DIFF_TE = join(DIR, "diffusers/text_encoder/model.safetensors");
const COMFY_TE = join(DIR, "comfyui/text_encoders/qwen3vl_8b_tiny_bf16.safetensors");
const COMFY_DIT = join(DIR, "comfyui/diffusion_models/qwen_image_2.1_tiny_bf16.safetensors");
const COND = join(DIR, "te/prompt1_cond.bin");
const missing = [DIFF_TE, COMFY_TE, COMFY_DIT, COND].filter((p) => !existsSync(p));
const PROMPT = "a red cube on a white table";
const tmp = mkdtempSync(join(tmpdir(), "tp-cli-encode-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));
let n = 0;

/** `encode` with `args`; the saved positive conditioning, checked against ComfyUI's [1, 15, 8]. */
function expectComfyCond(args: string[]): string {
  const out = join(tmp, `c${n++}.safetensors`);
  const r = run("encode", "--prompt", PROMPT, "--te-mode", "f32", "--out", out, ...args);
  expect(r.err).not.toContain("error");
  expect(r.code).toBe(0);
  const got = readConditioning(out).positive;
  const want = new Float32Array(new Uint8Array(readFileSync(COND)).buffer);
  expect(got.shape).toEqual([1, 15, 8]);
  let maxRef = 0;
  let maxErr = 0;
  for (let i = 0; i < want.length; i++) {
    maxRef = Math.max(maxRef, Math.abs(want[i] as number));
    maxErr = Math.max(maxErr, Math.abs((got.data[i] as number) - (want[i] as number)));
  }
  expect(maxErr / maxRef).toBeLessThan(1e-4);
  return r.err;
}

describe.skipIf(missing.length > 0)("encode: which pipeline's text encoder", () => {
  if (missing.length > 0) test.skip(`skipped: shared fixture missing: ${missing.join(", ")}`, () => {});

  test("--pipeline qwen-image, --dit and --model pick Qwen-Image-2.1's encoder (ComfyUI's conditioning)", () => {
    expectComfyCond(["--text-encoder", COMFY_TE, "--pipeline", "qwen-image"]);
    expectComfyCond(["--text-encoder", COMFY_TE, "--dit", COMFY_DIT]);
    // the folder supplies the text encoder too
    expectComfyCond(["--model", join(DIR, "diffusers")]);
    // a diffusers folder's text_encoder/ needs no flag, and gives no notice
    expect(expectComfyCond(["--text-encoder", DIFF_TE])).not.toContain("notice");
  }, 120_000);

  test("no hint: Krea 2 (the documented default) with a notice naming the flags", () => {
    const r = run(
      "encode",
      "--text-encoder",
      COMFY_TE,
      "--prompt",
      PROMPT,
      "--out",
      join(tmp, "k.safetensors"),
    );
    expect(r.err).toContain(
      "has the text-encoder layout of Krea 2 and Qwen-Image-2.1; encoding for krea2 (the default); --pipeline qwen-image, --dit F or --model DIR picks another",
    );
    // Krea 2's encoder refuses this 4-layer file (it taps layer 35)
    expect(r.err).toContain("error E_FORMAT");
    expect(r.code).toBe(1);
    expect(existsSync(join(tmp, "k.safetensors"))).toBe(false);
  }, 60_000);

  test("an unknown --pipeline or one that disagrees with --dit is one E_ARG line", () => {
    const out = join(tmp, "x.safetensors");
    const bad = run("encode", "--pipeline", "sd3", "--text-encoder", COMFY_TE, "--prompt", "p", "--out", out);
    expect(bad.code).toBe(2);
    expect(bad.err.trim()).toBe("error E_ARG: --pipeline must be one of krea2, qwen-image, got 'sd3'");
    const clash = run(
      ...["encode", "--pipeline", "krea2", "--dit", COMFY_DIT, "--text-encoder", COMFY_TE],
      ...["--prompt", "p", "--out", out],
    );
    expect(clash.code).toBe(2);
    expect(clash.err).toContain("error E_ARG: --pipeline krea2 disagrees with the DiT ");
    expect(clash.err).toContain("a Qwen-Image-2.1 transformer (qwen-image)");
    expect(clash.err.trim().split("\n").length).toBe(1);
    // Krea 2's modes for Krea 2, Qwen-Image's for Qwen-Image
    const mode = run(
      "encode",
      "--pipeline",
      "qwen-image",
      "--te-mode",
      "upcast",
      "--text-encoder",
      COMFY_TE,
      "--prompt",
      "p",
      "--out",
      out,
    );
    expect(mode.code).toBe(2);
    expect(mode.err).toContain("--te-mode");
    expect(existsSync(out)).toBe(false);
  }, 60_000);
});
