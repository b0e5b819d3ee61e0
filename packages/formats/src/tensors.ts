/**
 * What every checkpoint reader gives: a list of tensors with their type, torch-order shape and the
 * exact byte range in a file, plus mapped views on the bytes. Safetensors (single or sharded) and GGUF
 * (single or split) all implement {@link TensorSource}, so layout detection, `inspect` and loaders do
 * not care which container a tensor came from.
 */
import { TpError, type WeightFormat } from "@tp/tensor";

/** One tensor of a checkpoint. */
export interface TensorEntry {
  /** Name as stored in the file (`blk.0.attn_q.weight`, `model.layers.0.mlp.up_proj.weight`). */
  readonly name: string;
  /** The file's own type name: a safetensors dtype (`"BF16"`, `"F8_E4M3"`) or a ggml type (`"Q4_K"`). */
  readonly dtype: string;
  /** The `@tp/tensor` weight format, or null for types TensorPencil has none for (`F4`, `C64`, …). */
  readonly format: WeightFormat | null;
  /** Shape in torch order (row-major, last dimension contiguous); for GGUF, `ne` reversed. */
  readonly shape: readonly number[];
  /** Path of the file holding the bytes. */
  readonly file: string;
  /** Absolute byte offset of the first byte in `file`. */
  readonly byteOffset: number;
  /** Length in bytes. */
  readonly byteLength: number;
}

/** A checkpoint opened for reading: its tensors and mapped views on their bytes. */
export interface TensorSource {
  /** Container format. */
  readonly kind: "safetensors" | "gguf";
  /** The path that was opened (a file, an index file, or the first shard). */
  readonly path: string;
  /** Every file whose bytes the tensors live in. */
  readonly files: readonly string[];
  /** All tensors, in file order (by file, then offset). */
  readonly tensors: readonly TensorEntry[];
  /** True when a tensor of this name exists. */
  has(name: string): boolean;
  /**
   * The entry of a tensor.
   * @throws TpError E_FORMAT when the checkpoint has no tensor of that name
   */
  tensor(name: string): TensorEntry;
  /**
   * The tensor's bytes: a view on the memory mapping (not a copy; copy-on-write).
   * @throws TpError E_FORMAT for a missing tensor; E_UNSUPPORTED for a tensor over 4 GiB (map it in
   *   parts: see `MappedFile.view`); E_IO when mapping fails
   */
  data(name: string): Uint8Array;
  /** Drop the mappings; views already handed out stay valid until garbage-collected. */
  close(): void;
}

/**
 * Look a tensor up by name in a map built by a reader.
 * @throws TpError E_FORMAT naming the tensor and the file, with a few names that do exist
 */
export function lookupTensor(
  byName: ReadonlyMap<string, TensorEntry>,
  name: string,
  file: string,
): TensorEntry {
  const t = byName.get(name);
  if (t) return t;
  const some = [...byName.keys()].slice(0, 5).join(", ");
  throw new TpError(
    "E_FORMAT",
    `no tensor '${name}' in this checkpoint (${byName.size} tensors${some ? `, e.g. ${some}` : ""})`,
    { file, tensor: name },
  );
}

/** Number of elements of a shape (1 for a scalar), or null when it is not a safe integer. */
export function safeNumel(shape: readonly number[]): number | null {
  let n = 1;
  for (const d of shape) {
    n *= d;
    if (!Number.isSafeInteger(n)) return null;
  }
  return n;
}
