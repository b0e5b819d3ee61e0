// Qwen-Image-2.1 VAE decoder against ../shared/testdata/qwen-image-tiny/vae (ComfyUI's
// comfy/ldm/wan/vae2_2.py on the tiny checkpoint, PyTorch CPU fp32): the VAE-space latent, the raw
// RGBA decode (alpha included) and the 8-bit image, in both layouts' files.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { createBackend } from "@tp/backend-cpu";
import { isTpError } from "@tp/tensor";
import { readF32, relErr, SHARED } from "../testing/fixtures.ts";
import {
  loadQwenImageVae,
  QWEN_IMAGE_LATENT_MEAN,
  QWEN_IMAGE_LATENT_STD,
  toRgba8,
} from "./qwen-image-vae.ts";

const DIR = join(SHARED, "testdata/qwen-image-tiny");
const COMFY = join(DIR, "comfyui/vae/qwen_image_2.1_vae_tiny_bf16.safetensors");
const DIFFUSERS = join(DIR, "diffusers/vae/diffusion_pytorch_model.safetensors");
const CONFIG = join(DIR, "diffusers/vae/config.json");
const missing = [COMFY, DIFFUSERS, CONFIG, join(DIR, "vae/decoded_raw.bin")].filter((p) => !existsSync(p));
const note = missing.length === 0 ? "" : ` [skipped: shared fixture missing: ${missing.join(", ")}]`;
const run = missing.length === 0 ? describe : describe.skip;

/** f32 weights (bf16-representable in both files), f32 convolutions in another order: README bound. */
const TOL = 1e-4;

const backend = missing.length === 0 ? createBackend({ threads: 2 }) : null;
afterAll(() => backend?.dispose());
const fixture = (rel: string) => readF32(join(DIR, rel));

run(`Qwen-Image-2.1 VAE against ComfyUI${note}`, () => {
  test("the published statistics are the config's", () => {
    const j = JSON.parse(readFileSync(CONFIG, "utf8"));
    expect(QWEN_IMAGE_LATENT_MEAN.map(Math.fround)).toEqual(j.latents_mean.map(Math.fround));
    expect(QWEN_IMAGE_LATENT_STD.map(Math.fround)).toEqual(j.latents_std.map(Math.fround));
    expect(Array.from(fixture("vae/latents_mean.bin"))).toEqual(j.latents_mean.map(Math.fround));
  });

  for (const [what, path] of [
    ["ComfyUI file", COMFY],
    ["diffusers file", DIFFUSERS],
  ] as const) {
    test(`${what}: VAE space, raw RGBA within ${TOL}, 8-bit image`, async () => {
      const b = backend as NonNullable<typeof backend>;
      using vae = loadQwenImageVae(b, path, CONFIG);
      expect(vae.config).toEqual({
        z_dim: 64,
        top_dim: 32,
        stage_dims: [32, 32, 16, 8, 4],
        out_channels: 4,
        scale: 16,
      });
      using x = b.upload(fixture("vae/z_model_space.bin"), [1, 64, 8, 12], "f32");
      using z = vae.processOut(x);
      expect(relErr((await b.read(z)) as Float32Array, fixture("vae/z_vae_space.bin"))).toBeLessThanOrEqual(
        1e-7,
      );
      using raw = vae.decode(z);
      expect([...raw.shape]).toEqual([1, 4, 128, 192]);
      const px = (await b.read(raw)) as Float32Array;
      const e = relErr(px, fixture("vae/decoded_raw.bin"));
      const alpha = relErr(
        px.subarray(3 * 128 * 192),
        fixture("vae/decoded_raw.bin").subarray(3 * 128 * 192),
      );
      console.log(what, "raw relErr", e, "alpha", alpha);
      expect(e).toBeLessThanOrEqual(TOL);
      expect(alpha).toBeLessThanOrEqual(TOL);
      const u8 = toRgba8(px, 128, 192);
      const ref = new Uint8Array(readFileSync(join(DIR, "vae/decoded_u8.bin")));
      const img01 = fixture("vae/decoded_image01.bin"); // [H, W, 4]
      let off = 0;
      for (let i = 0; i < ref.length; i++) {
        const d = Math.abs((u8[i] as number) - (ref[i] as number));
        expect(d).toBeLessThanOrEqual(1);
        if (d) {
          off++;
          // a 1-off byte only where 255·p sits within float noise of an integer
          const v = 255 * (img01[i] as number);
          expect(Math.abs(v - Math.round(v))).toBeLessThan(255 * TOL);
        }
      }
      console.log(what, "bytes off by one", off, "of", ref.length);
    });
  }

  test("a DiT file passed as the VAE is E_FORMAT naming it", () => {
    const dit = join(DIR, "comfyui/diffusion_models/qwen_image_2.1_tiny_bf16.safetensors");
    let err: unknown;
    try {
      loadQwenImageVae(backend as NonNullable<typeof backend>, dit);
    } catch (e) {
      err = e;
    }
    expect(isTpError(err) && err.code === "E_FORMAT" && err.message.includes(dit)).toBe(true);
  });
});
