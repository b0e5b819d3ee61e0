/**
 * Latent previews: a linear projection of each latent pixel's channels to RGB, per latent format, as
 * ComfyUI's `Latent2RGBPreviewer` does (`rgb = x0 · factors + bias`, then `(rgb + 1) / 2` clamped to
 * [0, 1] and scaled to 8 bits). The preview has the latent's resolution (1/8 of the image's).
 * Source: ComfyUI `latent_preview.py` (`Latent2RGBPreviewer`) and `comfy/latent_formats.py`
 * (`Wan21.latent_rgb_factors`, `latent_rgb_factors_bias`: Krea 2 samples in the Wan 2.1 / Qwen-Image
 * VAE's normalized latent space).
 */
import { TpError } from "@tp/tensor";

/** A latent → RGB projection: `factors[c]` is channel c's contribution to (R, G, B). */
export interface LatentRgb {
  readonly factors: readonly (readonly [number, number, number])[];
  readonly bias: readonly [number, number, number];
}

/** The Wan 2.1 latent format's projection (16 channels), ComfyUI `comfy/latent_formats.py` `Wan21`. */
export const WAN21_LATENT_RGB: LatentRgb = {
  factors: [
    [-0.1299, -0.1692, 0.2932],
    [0.0671, 0.0406, 0.0442],
    [0.3568, 0.2548, 0.1747],
    [0.0372, 0.2344, 0.142],
    [0.0313, 0.0189, -0.0328],
    [0.0296, -0.0956, -0.0665],
    [-0.3477, -0.4059, -0.2925],
    [0.0166, 0.1902, 0.1975],
    [-0.0412, 0.0267, -0.1364],
    [-0.1293, 0.074, 0.1636],
    [0.068, 0.3019, 0.1128],
    [0.0032, 0.0581, 0.0639],
    [-0.1251, 0.0927, 0.1699],
    [0.006, -0.0633, 0.0005],
    [0.3477, 0.2275, 0.295],
    [0.1984, 0.0913, 0.1861],
  ],
  bias: [-0.1835, -0.0868, -0.336],
};

/** The projection of each pipeline (by `DiffusionPipeline.id`). */
export const LATENT_RGB: Readonly<Record<string, LatentRgb>> = { krea2: WAN21_LATENT_RGB };

/**
 * The preview image of a latent.
 * @param latent f32 [1, channels, h, w] or [1, channels, frames, h, w] (frame 0 is shown)
 * @returns interleaved 8-bit RGB [h, w, 3]
 * @throws TpError E_SHAPE when the channel count is not the projection's
 */
export function latentToRgb(
  latent: { readonly data: Float32Array; readonly shape: readonly number[] },
  proj: LatentRgb,
): { width: number; height: number; rgb: Uint8Array } {
  const s = latent.shape;
  const channels = s[1] as number;
  const height = s[s.length - 2] as number;
  const width = s[s.length - 1] as number;
  if ((s.length !== 4 && s.length !== 5) || channels !== proj.factors.length)
    throw new TpError(
      "E_SHAPE",
      `a latent preview needs [1, ${proj.factors.length}, (frames,) h, w], got [${s.join(", ")}]`,
    );
  const plane = height * width;
  const frameStride = s.length === 5 ? (s[2] as number) * plane : plane; // channel stride
  const rgb = new Uint8Array(plane * 3);
  for (let p = 0; p < plane; p++) {
    for (let k = 0; k < 3; k++) {
      let v = proj.bias[k] as number;
      for (let c = 0; c < channels; c++)
        v +=
          (latent.data[c * frameStride + p] as number) *
          ((proj.factors[c] as readonly number[])[k] as number);
      const u = Math.min(1, Math.max(0, (v + 1) / 2));
      rgb[p * 3 + k] = Math.floor(u * 255); // torch .mul(0xFF).byte() truncates
    }
  }
  return { width, height, rgb };
}
