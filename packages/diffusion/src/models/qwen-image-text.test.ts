// Qwen-Image-2.1 prompt encoder against ../shared/testdata/qwen-image-tiny/te (ComfyUI's
// comfy/text_encoders/qwen_image21.py on the tiny Qwen3-VL, PyTorch CPU fp32): token ids exact, each
// layer's output and the conditioning after the 14-token drop, in both layouts' files.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { createBackend } from "@tp/backend-cpu";
import { isTpError } from "@tp/tensor";
import { readF32, relErr, SHARED } from "../testing/fixtures.ts";
import {
  loadQwenImageTextEncoder,
  QWEN_IMAGE_DROP,
  qwenImagePromptText,
  qwenImageTokenizer,
} from "./qwen-image-text.ts";

const DIR = join(SHARED, "testdata/qwen-image-tiny");
const COMFY = join(DIR, "comfyui/text_encoders/qwen3vl_8b_tiny_bf16.safetensors");
const DIFFUSERS = join(DIR, "diffusers/text_encoder/model.safetensors");
const TOKENIZER = join(DIR, "diffusers/processor/tokenizer.json");
const missing = [COMFY, DIFFUSERS, TOKENIZER, join(DIR, "te/prompt1_cond.bin")].filter((p) => !existsSync(p));
const note = missing.length === 0 ? "" : ` [skipped: shared fixture missing: ${missing.join(", ")}]`;
const run = missing.length === 0 ? describe : describe.skip;

/** f32 weights; sums in another order than torch. The README's bound for fp32 hidden states. */
const TOL = 1e-4;

const backend = missing.length === 0 ? createBackend({ threads: 2 }) : null;
afterAll(() => backend?.dispose());

const te = JSON.parse(
  existsSync(join(DIR, "config/te.json")) ? readFileSync(join(DIR, "config/te.json"), "utf8") : "{}",
);

run(`Qwen-Image-2.1 prompt encoder against ComfyUI${note}`, () => {
  test("template and token ids: 29 ids, the system turn's 14 dropped", () => {
    const prompt = new TextDecoder().decode(readFileSync(join(DIR, "te/prompt1_prompt_utf8.bin")));
    expect(qwenImagePromptText(prompt)).toBe(te.prompts.prompt1.templated);
    const tok = qwenImageTokenizer(DIFFUSERS);
    const ids = tok.encode(qwenImagePromptText(prompt), { parseSpecial: true });
    const ref = new Int32Array(readFileSync(join(DIR, "te/prompt1_ids.bin")).buffer.slice(0));
    expect(ids).toEqual(Array.from(ref));
    expect(ids.slice(0, QWEN_IMAGE_DROP)).toEqual(te.system_turn_ids);
  });

  for (const [what, path] of [
    ["ComfyUI file", COMFY],
    ["diffusers file", DIFFUSERS],
  ] as const) {
    test(`${what}: every layer's output and the conditioning within ${TOL} (f32)`, async () => {
      const b = backend as NonNullable<typeof backend>;
      using enc = loadQwenImageTextEncoder(path, {
        backend: b,
        mode: "f32",
        tokenizer: qwenImageTokenizer(DIFFUSERS),
      });
      const prompt = te.prompts.prompt1.text as string;
      const ids = enc.ids(prompt);
      const layers = enc.model.forward(ids, { collect: [1, 2, 3, 4] });
      for (const [i, t] of layers.entries()) {
        const e = relErr(
          (await b.read(t)) as Float32Array,
          readF32(join(DIR, `te/prompt1_layer${i}_out.bin`)),
        );
        expect(e).toBeLessThanOrEqual(TOL);
        t[Symbol.dispose]();
      }
      using cond = await enc.encode(prompt);
      expect([...cond.shape]).toEqual([1, 15, 8]);
      const host = await cond.read();
      const e = relErr(host.data, readF32(join(DIR, "te/prompt1_cond.bin")));
      console.log(what, "cond relErr", e);
      expect(e).toBeLessThanOrEqual(TOL);
    });
  }

  test("a DiT file passed as the text encoder is E_FORMAT naming it", () => {
    const dit = join(DIR, "comfyui/diffusion_models/qwen_image_2.1_tiny_bf16.safetensors");
    let err: unknown;
    try {
      loadQwenImageTextEncoder(dit, { backend: backend as NonNullable<typeof backend> });
    } catch (e) {
      err = e;
    }
    expect(isTpError(err) && err.code === "E_FORMAT" && err.message.includes(dit)).toBe(true);
  });
});
