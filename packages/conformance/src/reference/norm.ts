/**
 * References of the normalisations, in f64.
 * Sources: RMSNorm — Zhang & Sennrich 2019 (HF LlamaRMSNorm; Gemma's 1 + weight); LayerNorm — Ba et
 * al. 2016 (biased variance, torch.nn.functional.layer_norm); GroupNorm — Wu & He 2018
 * (torch.nn.functional.group_norm).
 */
import { type HostTensor, numelOf } from "../host.ts";

/** RMSNorm over the last dimension: x / sqrt(mean(x²) + eps) · g, g = weight, 1 + weight, or 1. */
export function rmsNormRef(
  x: HostTensor,
  weight: ArrayLike<number> | null,
  eps: number,
  unitOffset = false,
): Float64Array {
  const d = x.shape[x.shape.length - 1] as number;
  const out = new Float64Array(numelOf(x.shape));
  for (let r = 0; r < out.length / d; r++) {
    let ss = 0;
    for (let i = 0; i < d; i++) ss += (x.data[r * d + i] as number) ** 2;
    const inv = 1 / Math.sqrt(ss / d + eps);
    for (let i = 0; i < d; i++) {
      const g = weight === null ? 1 : (unitOffset ? 1 : 0) + (weight[i] as number);
      out[r * d + i] = (x.data[r * d + i] as number) * inv * g;
    }
  }
  return out;
}

/** LayerNorm over the last dimension: (x − mean) / sqrt(var + eps) · weight + bias. */
export function layerNormRef(
  x: HostTensor,
  weight: ArrayLike<number> | null,
  bias: ArrayLike<number> | null,
  eps: number,
): Float64Array {
  const d = x.shape[x.shape.length - 1] as number;
  const out = new Float64Array(numelOf(x.shape));
  for (let r = 0; r < out.length / d; r++) {
    let mean = 0;
    for (let i = 0; i < d; i++) mean += x.data[r * d + i] as number;
    mean /= d;
    let v = 0;
    for (let i = 0; i < d; i++) v += ((x.data[r * d + i] as number) - mean) ** 2;
    const inv = 1 / Math.sqrt(v / d + eps);
    for (let i = 0; i < d; i++) {
      const y = ((x.data[r * d + i] as number) - mean) * inv;
      out[r * d + i] =
        y * (weight === null ? 1 : (weight[i] as number)) + (bias === null ? 0 : (bias[i] as number));
    }
  }
  return out;
}

/** GroupNorm of x [batch, channels, ...spatial] with `groups` groups; weight, bias [channels] or null. */
export function groupNormRef(
  x: HostTensor,
  groups: number,
  weight: ArrayLike<number> | null,
  bias: ArrayLike<number> | null,
  eps: number,
): Float64Array {
  const [batch, channels] = x.shape as [number, number];
  const spatial = numelOf(x.shape.slice(2));
  const cpg = channels / groups;
  const out = new Float64Array(numelOf(x.shape));
  for (let n = 0; n < batch; n++)
    for (let g = 0; g < groups; g++) {
      const base = (n * channels + g * cpg) * spatial;
      const count = cpg * spatial;
      let mean = 0;
      for (let i = 0; i < count; i++) mean += x.data[base + i] as number;
      mean /= count;
      let v = 0;
      for (let i = 0; i < count; i++) v += ((x.data[base + i] as number) - mean) ** 2;
      const inv = 1 / Math.sqrt(v / count + eps);
      for (let i = 0; i < count; i++) {
        const c = g * cpg + Math.floor(i / spatial);
        const y = ((x.data[base + i] as number) - mean) * inv;
        out[base + i] =
          y * (weight === null ? 1 : (weight[c] as number)) + (bias === null ? 0 : (bias[c] as number));
      }
    }
  return out;
}
