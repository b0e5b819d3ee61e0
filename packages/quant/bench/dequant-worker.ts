/**
 * Worker of `bun run bench quant`: dequantizes a block of rows of a weight held in shared memory into a
 * shared f32 output, with the same TypeScript reference functions the single-threaded cases call.
 * Messages in: `{ id, job }` (see {@link Job}); out: `{ id }` when done.
 */
import { dequantizeConvRot, dequantizeFp8, dequantizeGgml } from "@tp/quant";
import { type WeightFormat, weightFormatInfo } from "@tp/tensor";

/** One block of rows [r0, r1) of an [N, K] weight. */
export interface Job {
  readonly format: WeightFormat | "f8_e4m3fn";
  readonly k: number;
  readonly r0: number;
  readonly r1: number;
  /** Stored bytes of the whole weight. */
  readonly data: SharedArrayBuffer;
  /** Row scales (ConvRot), or the one fp8 scale in element 0. */
  readonly scale: SharedArrayBuffer;
  /** ConvRot rotation group. */
  readonly groupSize: number;
  /** f32 output [N, K]. */
  readonly out: SharedArrayBuffer;
}

/** Dequantize rows [r0, r1) of a weight into `out` (shared by the bench's main thread). */
export function dequantizeRows(job: Job): void {
  const { format, k, r0, r1 } = job;
  const rows = r1 - r0;
  const bytes = new Uint8Array(job.data);
  const out = new Float32Array(job.out, r0 * k * 4, rows * k);
  if (format === "int8_convrot" || format === "int4_convrot") {
    const rb = format === "int8_convrot" ? k : k / 2;
    const w = dequantizeConvRot({
      format,
      shape: [rows, k],
      groupSize: job.groupSize,
      data: bytes.subarray(r0 * rb, r1 * rb),
      scale: new Float32Array(job.scale, r0 * 4, rows),
    });
    out.set(w);
  } else if (format === "f8_e4m3fn") {
    out.set(dequantizeFp8(bytes.subarray(r0 * k, r1 * k), "f8_e4m3fn", new Float32Array(job.scale)[0]));
  } else {
    const info = weightFormatInfo(format);
    const rb = (k / info.blockElems) * info.blockBytes;
    out.set(dequantizeGgml(format, bytes.subarray(r0 * rb, r1 * rb), rows * k));
  }
}

declare const self: Worker;
if (!Bun.isMainThread) {
  self.onmessage = (e: MessageEvent<{ id: number; job: Job }>) => {
    dequantizeRows(e.data.job);
    self.postMessage({ id: e.data.id });
  };
}
