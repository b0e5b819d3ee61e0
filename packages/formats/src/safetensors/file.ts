/**
 * Open one `.safetensors` file: parse and validate its header, and map its tensors lazily per region
 * (see `mmap.ts`), so that files larger than 4 GiB work and no tensor is read into the JS heap.
 */

import { ReadableFile } from "../file.ts";
import { type MapOptions, MappedFile, mapRange } from "../mmap.ts";
import { lookupTensor, type TensorEntry, type TensorSource } from "../tensors.ts";
import { SAFETENSORS_DTYPES } from "./dtypes.ts";
import { parseSafetensorsHeader, type SafetensorsHeader, safetensorsHeaderLength } from "./header.ts";

/**
 * Read and validate the header of a safetensors file (the 8-byte length and the JSON), without
 * mapping anything.
 * @throws TpError E_IO when the file cannot be read; E_FORMAT when the header is invalid
 */
export function readSafetensorsHeader(path: string): SafetensorsHeader & { fileSize: number } {
  const f = new ReadableFile(path);
  try {
    const n = safetensorsHeaderLength(f.read(0, Math.min(8, f.size), "the header length"), f.size, path);
    // The JSON is decoded straight from a private mapping (no heap copy of up to 100 MB).
    const header = parseSafetensorsHeader(mapRange(path, 8, n), f.size, path);
    return { ...header, fileSize: f.size };
  } finally {
    f.close();
  }
}

/** A memory-mapped safetensors file. Create with {@link openSafetensors}. */
export class SafetensorsFile implements TensorSource {
  readonly kind = "safetensors" as const;
  readonly files: readonly string[];
  readonly tensors: readonly TensorEntry[];
  readonly #byName: Map<string, TensorEntry>;
  readonly #map: MappedFile;

  /** @internal use {@link openSafetensors} */
  constructor(
    readonly path: string,
    /** The validated header. */
    readonly header: SafetensorsHeader,
    /** File size in bytes. */
    readonly fileSize: number,
    options: MapOptions = {},
  ) {
    this.files = [path];
    this.tensors = header.tensors.map((t) => ({
      name: t.name,
      dtype: t.dtype,
      format: SAFETENSORS_DTYPES.get(t.dtype)?.dtype ?? null,
      shape: t.shape,
      file: path,
      byteOffset: header.dataStart + t.dataOffsets[0],
      byteLength: t.dataOffsets[1] - t.dataOffsets[0],
    }));
    this.#byName = new Map(this.tensors.map((t) => [t.name, t]));
    this.#map = new MappedFile(
      path,
      fileSize,
      // zero-size tensors need no mapping (nor a span object each)
      this.tensors.flatMap((t) =>
        t.byteLength > 0 ? [{ start: t.byteOffset, end: t.byteOffset + t.byteLength }] : [],
      ),
      options,
    );
  }

  /** `__metadata__`, or null. */
  get metadata(): ReadonlyMap<string, string> | null {
    return this.header.metadata;
  }

  /** The region mappings (for `mapAll()` and statistics). */
  get mapping(): MappedFile {
    return this.#map;
  }

  has(name: string): boolean {
    return this.#byName.has(name);
  }

  tensor(name: string): TensorEntry {
    return lookupTensor(this.#byName, name, this.path);
  }

  data(name: string): Uint8Array {
    const t = this.tensor(name);
    return this.#map.view(t.byteOffset, t.byteLength, t.name);
  }

  close(): void {
    this.#map.close();
  }
}

/**
 * Open a `.safetensors` file: validate the header, plan the region mappings (nothing is mapped until
 * a tensor's data is asked for).
 * @param options `regionBytes`: upper size of one mapped region (default 1 GiB)
 * @throws TpError E_IO (cannot open/read), E_FORMAT (invalid header; names file, tensor and offset)
 */
export function openSafetensors(path: string, options: MapOptions = {}): SafetensorsFile {
  const { fileSize, ...header } = readSafetensorsHeader(path);
  return new SafetensorsFile(path, header, fileSize, options);
}
