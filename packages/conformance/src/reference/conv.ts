/**
 * Reference 2-D convolution (cross-correlation with zero padding, torch.nn.functional.conv2d) and
 * nearest upsampling, in f64.
 */
import type { HostTensor } from "../host.ts";

/** x [n, cin, h, w] ⋆ weight [cout, cin, kh, kw] + bias → { shape, data } in f64. */
export function conv2dRef(
  x: HostTensor,
  weight: HostTensor,
  bias: ArrayLike<number> | null,
  stride: readonly [number, number],
  padding: readonly [number, number],
): HostTensor<Float64Array> {
  const [n, cin, h, w] = x.shape as [number, number, number, number];
  const [cout, , kh, kw] = weight.shape as [number, number, number, number];
  const oh = Math.floor((h + 2 * padding[0] - kh) / stride[0]) + 1;
  const ow = Math.floor((w + 2 * padding[1] - kw) / stride[1]) + 1;
  const out = new Float64Array(n * cout * oh * ow);
  for (let b = 0; b < n; b++)
    for (let co = 0; co < cout; co++)
      for (let y = 0; y < oh; y++)
        for (let xx = 0; xx < ow; xx++) {
          let s = bias === null ? 0 : (bias[co] as number);
          for (let ci = 0; ci < cin; ci++)
            for (let dy = 0; dy < kh; dy++) {
              const iy = y * stride[0] - padding[0] + dy;
              if (iy < 0 || iy >= h) continue;
              for (let dx = 0; dx < kw; dx++) {
                const ix = xx * stride[1] - padding[1] + dx;
                if (ix < 0 || ix >= w) continue;
                s +=
                  (weight.data[((co * cin + ci) * kh + dy) * kw + dx] as number) *
                  (x.data[((b * cin + ci) * h + iy) * w + ix] as number);
              }
            }
          out[((b * cout + co) * oh + y) * ow + xx] = s;
        }
  return { shape: [n, cout, oh, ow], data: out };
}

/** Nearest upsampling by `factor` on the last two dimensions: y[..., i, j] = x[..., ⌊i/f⌋, ⌊j/f⌋]. */
export function upsampleNearest2dRef(x: HostTensor, factor: number): Float32Array {
  const h = x.shape[x.shape.length - 2] as number;
  const w = x.shape[x.shape.length - 1] as number;
  const planes = x.data.length / (h * w);
  const out = new Float32Array(planes * h * w * factor * factor);
  for (let p = 0; p < planes; p++)
    for (let i = 0; i < h * factor; i++)
      for (let j = 0; j < w * factor; j++)
        out[(p * h * factor + i) * w * factor + j] = x.data[
          (p * h + Math.floor(i / factor)) * w + Math.floor(j / factor)
        ] as number;
  return out;
}
