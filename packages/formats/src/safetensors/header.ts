/**
 * safetensors header parsing and validation.
 *
 * Layout: bytes 0..7 a little-endian u64 `N`; bytes 8..8+N a UTF-8 JSON object (may end in spaces);
 * the data section from `8 + N` to the end of the file. Each entry is
 * `"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}` with offsets relative to
 * the data section; `"__metadata__"` is an optional string → string map.
 *
 * The checks are those of the reference reader (huggingface/safetensors `safetensors/src/tensor.rs`,
 * `SafeTensors::read_metadata` and `Metadata::validate`): N at most 100,000,000; the header inside the
 * file; valid UTF-8 and JSON; sorted by offset, the tensors tile the data section from 0 with no gap or
 * overlap; `end − begin = numel · bits / 8`; and the data section ends exactly at the end of the file.
 * Each failure is a TpError E_FORMAT naming the file, the tensor and the absolute byte offset.
 */
import { formatError } from "../errors.ts";
import { decodeUtf8 } from "../file.ts";
import { safeNumel } from "../tensors.ts";
import { SAFETENSORS_DTYPE_NAMES, SAFETENSORS_DTYPES, safetensorsByteLength } from "./dtypes.ts";

/** Largest header the reference reader accepts, in bytes (`MAX_HEADER_SIZE`). */
export const SAFETENSORS_MAX_HEADER = 100_000_000;

/** One tensor as the header describes it. */
export interface SafetensorsTensorInfo {
  /** Tensor name. */
  readonly name: string;
  /** Header dtype string (`"BF16"`). */
  readonly dtype: string;
  /** Shape, torch order. */
  readonly shape: readonly number[];
  /** `data_offsets`, relative to the data section, bytes. */
  readonly dataOffsets: readonly [number, number];
}

/** A parsed, validated safetensors header. */
export interface SafetensorsHeader {
  /** `N`, the JSON length in bytes (padding included). */
  readonly headerLength: number;
  /** Absolute offset of the data section, `8 + N`. */
  readonly dataStart: number;
  /** `__metadata__`, or null when absent. */
  readonly metadata: ReadonlyMap<string, string> | null;
  /** Tensors sorted by `data_offsets` (file order). */
  readonly tensors: readonly SafetensorsTensorInfo[];
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/**
 * Read `N` from the first 8 bytes and check it against the limits and the file size.
 * @param prefix   the first 8 bytes of the file (or fewer, if the file is shorter)
 * @param fileSize size of the file in bytes
 * @throws TpError E_FORMAT for a file under 8 bytes, N over 100 MB, or N past the end of the file
 */
export function safetensorsHeaderLength(prefix: Uint8Array, fileSize: number, file: string): number {
  if (fileSize < 8 || prefix.length < 8) {
    throw formatError(
      `a safetensors file starts with an 8-byte header length; this one has ${fileSize} bytes`,
      {
        file,
        offset: 0,
      },
    );
  }
  const n = new DataView(prefix.buffer, prefix.byteOffset, 8).getBigUint64(0, true);
  if (n > BigInt(SAFETENSORS_MAX_HEADER)) {
    throw formatError(`header length ${n} is over the ${SAFETENSORS_MAX_HEADER}-byte limit of safetensors`, {
      file,
      offset: 0,
    });
  }
  const len = Number(n);
  if (8 + len > fileSize) {
    throw formatError(
      `header length ${len} reaches past the end of the file (${fileSize} bytes; truncated?)`,
      {
        file,
        offset: 0,
      },
    );
  }
  return len;
}

function checkDims(v: unknown, what: string, tensor: string, file: string): number[] {
  const where = { file, tensor, offset: 8 };
  if (!Array.isArray(v))
    throw formatError(`${what} must be an array of integers, got ${JSON.stringify(v)}`, where);
  for (const d of v) {
    if (typeof d !== "number" || !Number.isSafeInteger(d) || d < 0) {
      throw formatError(`${what} must hold non-negative integers, got ${JSON.stringify(d)}`, where);
    }
  }
  return v as number[];
}

/**
 * Parse and validate the JSON header.
 * @param json     the N header bytes (bytes 8..8+N of the file)
 * @param fileSize size of the whole file, bytes (the data section must end exactly there)
 * @param file     path for messages
 * @throws TpError E_FORMAT (see the module comment for each check)
 */
export function parseSafetensorsHeader(json: Uint8Array, fileSize: number, file: string): SafetensorsHeader {
  const headerLength = json.length;
  const dataStart = 8 + headerLength;
  const text = decodeUtf8(json, "the safetensors header", { file, offset: 8 });
  let root: unknown;
  try {
    root = JSON.parse(text);
  } catch (e) {
    throw formatError(`the safetensors header is not valid JSON: ${(e as Error).message}`, {
      file,
      offset: 8,
    });
  }
  if (!isPlainObject(root))
    throw formatError("the safetensors header must be a JSON object", { file, offset: 8 });

  let metadata: Map<string, string> | null = null;
  const tensors: SafetensorsTensorInfo[] = [];
  // for…in, not Object.entries: no array of a million [name, entry] pairs
  for (const name in root) {
    const entry = root[name];
    if (name === "__metadata__") {
      if (!isPlainObject(entry))
        throw formatError("__metadata__ must be an object of strings", { file, offset: 8 });
      metadata = new Map();
      for (const [k, v] of Object.entries(entry)) {
        if (typeof v !== "string") {
          throw formatError(`__metadata__ value of '${k}' must be a string, got ${JSON.stringify(v)}`, {
            file,
            offset: 8,
          });
        }
        metadata.set(k, v);
      }
      continue;
    }
    const where = { file, tensor: name, offset: 8 };
    if (!isPlainObject(entry))
      throw formatError("tensor entry must be an object with dtype, shape, data_offsets", where);
    const dtype = entry.dtype;
    if (typeof dtype !== "string" || !SAFETENSORS_DTYPES.has(dtype)) {
      throw formatError(
        `unknown dtype ${JSON.stringify(dtype)}; expected one of: ${SAFETENSORS_DTYPE_NAMES.join(", ")}`,
        where,
      );
    }
    const shape = checkDims(entry.shape, "shape", name, file);
    const offs = checkDims(entry.data_offsets, "data_offsets", name, file);
    if (offs.length !== 2)
      throw formatError(`data_offsets must be [begin, end], got ${JSON.stringify(offs)}`, where);
    tensors.push({ name, dtype, shape, dataOffsets: [offs[0] as number, offs[1] as number] });
  }

  tensors.sort((a, b) => a.dataOffsets[0] - b.dataOffsets[0] || a.dataOffsets[1] - b.dataOffsets[1]);
  let expected = 0;
  for (const t of tensors) {
    const [begin, end] = t.dataOffsets;
    const where = { file, tensor: t.name, offset: dataStart + begin };
    if (end < begin) throw formatError(`data_offsets [${begin}, ${end}] end before they begin`, where);
    if (begin !== expected) {
      throw formatError(
        begin > expected
          ? `tensor data begins at ${begin} but the previous tensor ends at ${expected}: a gap`
          : `tensor data begins at ${begin}, inside the previous tensor (which ends at ${expected}): an overlap`,
        where,
      );
    }
    const info = SAFETENSORS_DTYPES.get(t.dtype);
    const numel = safeNumel(t.shape);
    const bytes = info && numel !== null ? safetensorsByteLength(info, numel) : null;
    if (bytes === null) {
      throw formatError(
        `shape [${t.shape.join(", ")}] of ${t.dtype} is too large or not a whole number of bytes`,
        where,
      );
    }
    if (end - begin !== bytes) {
      throw formatError(
        `${t.dtype} [${t.shape.join(", ")}] needs ${bytes} bytes but data_offsets [${begin}, ${end}] hold ${end - begin}`,
        where,
      );
    }
    expected = end;
  }
  if (dataStart + expected !== fileSize) {
    throw formatError(
      dataStart + expected > fileSize
        ? `the tensors need ${expected} data bytes but the file holds ${fileSize - dataStart} after the header (truncated?)`
        : `the file has ${fileSize - dataStart - expected} bytes after the last tensor; the data section must end the file`,
      { file, offset: Math.min(dataStart + expected, fileSize) },
    );
  }
  return { headerLength, dataStart, metadata, tensors };
}
