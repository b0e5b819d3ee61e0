/**
 * GGUF v2/v3 header parsing: magic, version, counts, metadata key/value pairs (every value type,
 * nested arrays included), tensor infos, alignment and the data offset.
 *
 * Layout (ggml-org/ggml `docs/gguf.md`; ../shared/spec/llm.md §1.1): "GGUF", u32 version, u64
 * tensor_count, u64 metadata_kv_count, the KV pairs, the tensor infos, zero padding to
 * `general.alignment` (default 32), then the data; a tensor lives at `data_start + offset`.
 *
 * The checks follow llama.cpp's reader (`ggml/src/gguf.cpp`, `gguf_init_from_reader`): versions 2
 * and 3 only (1 is obsolete; a version whose low 16 bits are zero is a byte-swapped file); no empty
 * or duplicate keys; known value types; `general.alignment` a u32 power of two; at most 4 dimensions,
 * none negative; a known ggml type; `ne[0]` a whole number of blocks; no duplicate tensor names. On
 * top of that, so that hostile files fail cleanly: every count and length is checked against the
 * bytes left in the file before anything is allocated; BOOL values must be 0 or 1; strings must be
 * UTF-8 (array elements when read); nesting is limited to {@link GGUF_MAX_NESTING}; each tensor
 * offset must be a multiple of the alignment, inside the file, and not overlap another tensor. Every
 * failure is a TpError E_FORMAT naming the file, the key or tensor, and the byte offset.
 *
 * Deliberate differences from llama.cpp: nested arrays are read (the spec allows them; llama.cpp
 * refuses them), and tensor data need not be packed in info order (llama.cpp's reader requires it;
 * our writer produces it).
 */

import type { WeightFormat } from "@tp/tensor";
import { formatError } from "../errors.ts";
import { decodeUtf8, type HeaderCursor } from "../file.ts";
import { GgufArray, type GgufValue } from "./array.ts";
import {
  GGML_MAX_DIMS,
  GGUF_DEFAULT_ALIGNMENT,
  GGUF_MAGIC,
  GGUF_TYPE,
  GGUF_TYPE_NAMES,
  GGUF_TYPE_SIZE,
  type GgufType,
  ggmlTypeInfo,
  isGgufType,
} from "./types.ts";

/** How deep arrays of arrays may nest before the file is rejected. */
export const GGUF_MAX_NESTING = 8;

/** One metadata key/value pair. */
export interface GgufKv {
  /** The key (`general.architecture`). */
  readonly key: string;
  /** Value type id; `GGUF_TYPE.ARRAY` for arrays (see `value.type` for the element type). */
  readonly type: GgufType;
  /** The value: number (≤ 32-bit ints, floats), bigint (u64/i64), boolean, string, or a lazy array. */
  readonly value: GgufValue;
  /** Absolute byte offset of the pair in the file. */
  readonly offset: number;
}

/** One tensor info. */
export interface GgufTensorInfo {
  /** Tensor name (`blk.0.attn_q.weight`). */
  readonly name: string;
  /** `ne[0..n_dims)`: ggml order, `ne[0]` contiguous. */
  readonly ne: readonly number[];
  /** ggml type id. */
  readonly ggmlType: number;
  /** ggml type name (`"Q4_K"`). */
  readonly typeName: string;
  /** `@tp/tensor` weight format. */
  readonly format: WeightFormat;
  /** Offset relative to the data section, bytes. */
  readonly offset: number;
  /** Bytes of tensor data: `(ne[0] / block) · block_bytes · ne[1] · ne[2] · ne[3]`. */
  readonly byteLength: number;
  /** Absolute byte offset of this tensor info in the file. */
  readonly infoOffset: number;
}

/** A parsed GGUF header. */
export interface GgufHeader {
  /** 2 or 3. */
  readonly version: number;
  /** Metadata, in file order, by key. */
  readonly metadata: ReadonlyMap<string, GgufKv>;
  /** Tensor infos, in file order. */
  readonly tensors: readonly GgufTensorInfo[];
  /** `general.alignment` or 32. */
  readonly alignment: number;
  /** Absolute offset of the data section (end of the infos, aligned up). */
  readonly dataStart: number;
  /** File size in bytes. */
  readonly fileSize: number;
}

interface Ctx {
  c: HeaderCursor;
  file: string;
}

function readString(ctx: Ctx, what: string, tensor?: string): string {
  const at = ctx.c.pos;
  const n = ctx.c.count(`length of ${what}`, Math.max(0, ctx.c.remaining - 8), tensor);
  const bytes = ctx.c.bytes(n, what, tensor);
  return decodeUtf8(bytes, what, {
    file: ctx.file,
    offset: at + 8,
    ...(tensor === undefined ? {} : { tensor }),
  });
}

function readType(ctx: Ctx, key: string): GgufType {
  const at = ctx.c.pos;
  const t = ctx.c.u32(`value type of '${key}'`);
  if (!isGgufType(t)) {
    throw formatError(
      `key '${key}' has unknown GGUF value type ${t} (known: 0..12, ${GGUF_TYPE_NAMES.join(", ")})`,
      {
        file: ctx.file,
        offset: at,
      },
    );
  }
  return t;
}

function readScalarValue(ctx: Ctx, type: GgufType, key: string): GgufValue {
  const c = ctx.c;
  const what = `value of '${key}'`;
  switch (type) {
    case GGUF_TYPE.UINT8:
      return c.u8(what);
    case GGUF_TYPE.INT8:
      return c.i8(what);
    case GGUF_TYPE.UINT16:
      return c.u16(what);
    case GGUF_TYPE.INT16:
      return c.i16(what);
    case GGUF_TYPE.UINT32:
      return c.u32(what);
    case GGUF_TYPE.INT32:
      return c.i32(what);
    case GGUF_TYPE.FLOAT32:
      return c.f32(what);
    case GGUF_TYPE.UINT64:
      return c.u64(what);
    case GGUF_TYPE.INT64:
      return c.i64(what);
    case GGUF_TYPE.FLOAT64:
      return c.f64(what);
    case GGUF_TYPE.BOOL: {
      const at = c.pos;
      const b = c.u8(what);
      if (b > 1)
        throw formatError(`BOOL ${what} is ${b}; only 0 and 1 are valid`, { file: ctx.file, offset: at });
      return b === 1;
    }
    case GGUF_TYPE.STRING:
      return readString(ctx, what);
    default:
      return readArray(ctx, key, 1);
  }
}

function readArray(ctx: Ctx, key: string, depth: number): GgufArray {
  const c = ctx.c;
  const start = c.pos;
  if (depth > GGUF_MAX_NESTING) {
    throw formatError(`arrays in '${key}' nest deeper than ${GGUF_MAX_NESTING} levels`, {
      file: ctx.file,
      offset: start,
    });
  }
  const type = readType(ctx, key);
  const size = GGUF_TYPE_SIZE[type] as number;
  // Each element takes at least 1 byte (fixed types), 8 (strings: the length) or 12 (arrays).
  const minElem = type === GGUF_TYPE.STRING ? 8 : type === GGUF_TYPE.ARRAY ? 12 : size;
  const n = c.count(`element count of array '${key}'`, Math.max(0, Math.floor((c.remaining - 8) / minElem)));
  const spanStart = c.pos;
  if (type === GGUF_TYPE.ARRAY) {
    const elems: GgufArray[] = [];
    for (let i = 0; i < n; i++) elems.push(readArray(ctx, `${key}[${i}]`, depth + 1));
    return GgufArray.fromNested(elems, { bytes: new Uint8Array(0), file: ctx.file, offset: spanStart, key });
  }
  if (type === GGUF_TYPE.STRING) {
    c.skipStrings(n, `'${key}'`);
  } else {
    c.skip(n * size, `array '${key}'`);
  }
  const end = c.pos;
  c.pos = spanStart;
  const bytes = c.bytes(end - spanStart, `array '${key}'`);
  if (type === GGUF_TYPE.BOOL) {
    const bad = bytes.findIndex((b) => b > 1);
    if (bad >= 0) {
      throw formatError(`BOOL element ${bad} of '${key}' is ${bytes[bad]}; only 0 and 1 are valid`, {
        file: ctx.file,
        offset: spanStart + bad,
      });
    }
  }
  return GgufArray.fromRaw(type, n, { bytes, file: ctx.file, offset: spanStart, key });
}

function alignUp(p: number, a: number): number {
  return p + ((a - (p % a)) % a);
}

/**
 * Parse a GGUF header from a cursor at offset 0.
 * @throws TpError E_FORMAT (see the module comment)
 */
export function parseGgufHeader(c: HeaderCursor): GgufHeader {
  const file = c.file.path;
  const ctx: Ctx = { c, file };
  if (c.file.size < 4 || c.u32("the magic") !== GGUF_MAGIC) {
    throw formatError('not a GGUF file: it does not start with the magic "GGUF"', { file, offset: 0 });
  }
  const version = c.u32("the version");
  if (version !== 2 && version !== 3) {
    const why =
      version === 1
        ? "GGUF version 1 is obsolete (llama.cpp refuses it too); convert the model again with a current llama.cpp"
        : version !== 0 && (version & 0xffff) === 0
          ? `GGUF version ${version} looks byte-swapped: big-endian GGUF files are not supported`
          : `GGUF version ${version} is not supported (versions 2 and 3 are)`;
    throw formatError(why, { file, offset: 4 });
  }
  // Each tensor info takes at least 24 bytes (name length, n_dims, type, offset); each KV at least 13.
  // (At least 0: a file cut inside the counts leaves "room" for a negative number of them.)
  const nTensors = c.count("tensor_count", Math.max(0, Math.floor((c.remaining - 16) / 24)));
  const nKv = c.count("metadata_kv_count", Math.max(0, Math.floor(c.remaining / 13)));

  const metadata = new Map<string, GgufKv>();
  for (let i = 0; i < nKv; i++) {
    const offset = c.pos;
    const key = readString(ctx, `key ${i}`);
    if (key === "") throw formatError(`metadata key ${i} is empty`, { file, offset });
    if (metadata.has(key)) throw formatError(`duplicate metadata key '${key}'`, { file, offset });
    const type = readType(ctx, key);
    const value = readScalarValue(ctx, type, key);
    metadata.set(key, { key, type, value, offset });
  }

  let alignment = GGUF_DEFAULT_ALIGNMENT;
  const align = metadata.get("general.alignment");
  if (align) {
    if (align.type !== GGUF_TYPE.UINT32) {
      throw formatError(`general.alignment must be a u32, got ${GGUF_TYPE_NAMES[align.type]}`, {
        file,
        offset: align.offset,
      });
    }
    alignment = align.value as number;
    if (alignment === 0 || (alignment & (alignment - 1)) !== 0) {
      throw formatError(`general.alignment ${alignment} is not a power of two`, {
        file,
        offset: align.offset,
      });
    }
  }

  const tensors: GgufTensorInfo[] = [];
  const names = new Set<string>();
  for (let i = 0; i < nTensors; i++) {
    const infoOffset = c.pos;
    const name = readString(ctx, `name of tensor ${i}`);
    const where = { file, tensor: name, offset: infoOffset };
    if (names.has(name)) throw formatError("duplicate tensor name", where);
    names.add(name);
    const nDims = c.u32("n_dims", name);
    if (nDims > GGML_MAX_DIMS)
      throw formatError(`n_dims is ${nDims}; ggml allows at most ${GGML_MAX_DIMS}`, where);
    const ne: number[] = [];
    let numel = 1;
    for (let d = 0; d < nDims; d++) {
      const at = c.pos;
      const v = c.u64(`ne[${d}]`, name);
      if (v >= 2n ** 63n)
        throw formatError(`ne[${d}] = ${v} is negative as an int64`, { ...where, offset: at });
      if (v > BigInt(Number.MAX_SAFE_INTEGER))
        throw formatError(`ne[${d}] = ${v} is absurdly large`, { ...where, offset: at });
      ne.push(Number(v));
      numel *= Number(v);
    }
    const typeAt = c.pos;
    const ggmlType = c.u32("ggml type", name);
    const info = ggmlTypeInfo(ggmlType);
    if (!info) {
      throw formatError(`unknown or retired ggml type id ${ggmlType}`, { ...where, offset: typeAt });
    }
    const ne0 = ne[0] ?? 1;
    if (ne0 % info.blockElems !== 0) {
      throw formatError(
        `ne[0] = ${ne0} is not a multiple of the ${info.name} block size ${info.blockElems}`,
        where,
      );
    }
    const byteLength = numel === 0 ? 0 : (numel / info.blockElems) * info.blockBytes;
    if (!Number.isSafeInteger(numel) || !Number.isSafeInteger(byteLength) || byteLength > c.file.size) {
      throw formatError(
        `shape [${ne.join(", ")}] of ${info.name} is larger than the file (${c.file.size} bytes)`,
        where,
      );
    }
    const offAt = c.pos;
    const off = c.u64("data offset", name);
    if (off > BigInt(c.file.size)) {
      throw formatError(`data offset ${off} is past the end of the file (${c.file.size} bytes)`, {
        ...where,
        offset: offAt,
      });
    }
    tensors.push({
      name,
      ne,
      ggmlType,
      typeName: info.name,
      format: info.format,
      offset: Number(off),
      byteLength,
      infoOffset,
    });
  }

  const dataStart = alignUp(c.pos, alignment);
  if (nTensors > 0 && dataStart > c.file.size) {
    throw formatError(`the data section would start at ${dataStart}, past the end of the file`, {
      file,
      offset: c.pos,
    });
  }
  const byOffset = [...tensors].sort((a, b) => a.offset - b.offset);
  let prevEnd = 0;
  let prev: GgufTensorInfo | null = null;
  for (const t of byOffset) {
    const where = { file, tensor: t.name, offset: dataStart + t.offset };
    if (t.offset % alignment !== 0)
      throw formatError(`data offset ${t.offset} is not a multiple of the alignment ${alignment}`, where);
    if (dataStart + t.offset + t.byteLength > c.file.size) {
      throw formatError(
        `tensor data (${t.byteLength} bytes at ${dataStart + t.offset}) runs past the end of the file (${c.file.size} bytes; truncated?)`,
        where,
      );
    }
    if (prev && t.offset < prevEnd && t.byteLength > 0) {
      throw formatError(`tensor data overlaps '${prev.name}' (which ends at ${dataStart + prevEnd})`, where);
    }
    if (t.offset + t.byteLength >= prevEnd) {
      prevEnd = t.offset + t.byteLength;
      prev = t;
    }
  }
  return { version, metadata, tensors, alignment, dataStart, fileSize: c.file.size };
}
