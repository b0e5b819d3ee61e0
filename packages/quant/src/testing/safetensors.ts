/**
 * TEST-ONLY safetensors reader for the shared fixtures. It reads a whole (small) file into memory and
 * parses the header; it does no validation beyond what the tests need. To be replaced by
 * `@tp/formats`' reader once that package lands — do not use it outside tests.
 *
 * Layout (../shared/spec/krea2.md §1.2): u64 LE header length N, N bytes of JSON, then the data section;
 * `data_offsets` are relative to the data section.
 */

import { readFileSync } from "node:fs";

/** One tensor of a safetensors file, as the header describes it plus its bytes. */
export interface StTensor {
  /** safetensors dtype string: `BF16`, `F32`, `I8`, `U8`, `F8_E4M3`, ... */
  readonly dtype: string;
  readonly shape: readonly number[];
  /** A copy of the tensor's bytes (aligned, so typed-array views are safe). */
  readonly bytes: Uint8Array;
}

/** A parsed safetensors file (test-only). */
export interface StFile {
  readonly metadata: Readonly<Record<string, string>>;
  readonly tensors: ReadonlyMap<string, StTensor>;
}

/** Read a whole safetensors file (test-only; small fixtures only). */
export function readSafetensorsForTest(path: string): StFile {
  const file = new Uint8Array(readFileSync(path));
  const n = Number(new DataView(file.buffer, file.byteOffset, 8).getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(file.subarray(8, 8 + n))) as Record<string, unknown>;
  const dataStart = 8 + n;
  const tensors = new Map<string, StTensor>();
  let metadata: Record<string, string> = {};
  for (const [name, v] of Object.entries(header)) {
    if (name === "__metadata__") {
      metadata = v as Record<string, string>;
      continue;
    }
    const e = v as { dtype: string; shape: number[]; data_offsets: [number, number] };
    const bytes = file.slice(dataStart + e.data_offsets[0], dataStart + e.data_offsets[1]);
    tensors.set(name, { dtype: e.dtype, shape: e.shape, bytes });
  }
  return { metadata, tensors };
}
