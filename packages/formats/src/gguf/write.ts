/**
 * GGUF writer: metadata + tensors, laid out exactly as llama.cpp's own writer does
 * (`ggml/src/gguf.cpp`, `gguf_write_out`): header, KV pairs in the given order, tensor infos in the
 * given order, zero padding to the alignment, then each tensor's data followed by zero padding to the
 * alignment. Offsets are the running padded sum, which is what llama.cpp's reader requires
 * ("tensor '…' has offset X, expected Y"). Tensor names are limited to 63 bytes (`GGML_MAX_NAME`).
 * Nested arrays can be written (the spec allows them) but llama.cpp refuses to read them.
 *
 * Split output follows `tools/gguf-split`: the first shard carries all metadata; every shard adds
 * `split.no` (u16, from 0), `split.count` (u16) and `split.tensors.count` (i32).
 */
import { TpError } from "@tp/tensor";
import { writeAtomically } from "../write-file.ts";
import { checkValue, type GgufArray, type GgufValue } from "./array.ts";
import { ggufSplitPath } from "./file.ts";
import {
  GGML_MAX_DIMS,
  GGML_MAX_NAME,
  GGUF_DEFAULT_ALIGNMENT,
  GGUF_MAGIC,
  GGUF_TYPE,
  GGUF_TYPE_SIZE,
  type GgufType,
  type GgufTypeName,
  ggmlTypeInfo,
  ggmlTypeOf,
  ggufTypeId,
} from "./types.ts";

/** One metadata pair to write. A `GgufKv` read from a file is accepted as is. */
export interface GgufKvInput {
  readonly key: string;
  /** Value type: id or short name; `"arr"` for arrays (the element type is the array's). */
  readonly type: GgufType | GgufTypeName;
  readonly value: GgufValue;
}

/** One tensor to write. */
export interface GgufTensorInput {
  readonly name: string;
  /** ggml type id (`12`), or a weight format / GGUF type name (`"q4_k"`, `"Q4_K"`, `"f32"`). */
  readonly type: number | string;
  /** Shape in torch order (last dimension contiguous); `ne` is its reverse. Give this or `ne`. */
  readonly shape?: readonly number[];
  /** ggml `ne` (`ne[0]` contiguous), 0 to 4 dimensions. */
  readonly ne?: readonly number[];
  /** The tensor's bytes, exactly the ggml size of the shape. */
  readonly data: Uint8Array;
}

/** Options of the GGUF writer. */
export interface GgufWriteOptions {
  /** GGUF version to write, 2 or 3 (same layout; default 3). */
  version?: 2 | 3;
  /**
   * Data alignment (a power of two). Default: the `general.alignment` in the metadata, else 32. When it
   * is not 32 and the metadata has no `general.alignment`, that key is appended (as gguf-py does).
   */
  alignment?: number;
}

/**
 * A metadata pair, checking that the value fits the type.
 * @example ggufKv("llama.context_length", "u32", 4096)
 * @throws TpError E_ARG when it does not
 */
export function ggufKv(key: string, type: GgufType | GgufTypeName, value: GgufValue): GgufKvInput {
  const t = ggufTypeId(type);
  checkValue(t, value, `metadata '${key}'`);
  return { key, type: t, value };
}

/** A little-endian byte sink that grows by chunks. */
class ByteWriter {
  chunks: Uint8Array[] = [];
  #cur = new Uint8Array(1 << 16);
  #dv = new DataView(this.#cur.buffer);
  #pos = 0;
  length = 0;

  #room(n: number): void {
    if (this.#pos + n <= this.#cur.length) return;
    this.chunks.push(this.#cur.subarray(0, this.#pos));
    this.#cur = new Uint8Array(Math.max(n, 1 << 16));
    this.#dv = new DataView(this.#cur.buffer);
    this.#pos = 0;
  }
  bytes(b: Uint8Array): void {
    if (b.length > 4096) {
      this.chunks.push(this.#cur.subarray(0, this.#pos));
      this.chunks.push(b);
      this.#cur = new Uint8Array(1 << 16);
      this.#dv = new DataView(this.#cur.buffer);
      this.#pos = 0;
    } else {
      this.#room(b.length);
      this.#cur.set(b, this.#pos);
      this.#pos += b.length;
    }
    this.length += b.length;
  }
  num(type: GgufType, v: GgufValue): void {
    const size = GGUF_TYPE_SIZE[type] as number;
    this.#room(size);
    const dv = this.#dv;
    const p = this.#pos;
    switch (type) {
      case GGUF_TYPE.UINT8:
        dv.setUint8(p, v as number);
        break;
      case GGUF_TYPE.INT8:
        dv.setInt8(p, v as number);
        break;
      case GGUF_TYPE.UINT16:
        dv.setUint16(p, v as number, true);
        break;
      case GGUF_TYPE.INT16:
        dv.setInt16(p, v as number, true);
        break;
      case GGUF_TYPE.UINT32:
        dv.setUint32(p, v as number, true);
        break;
      case GGUF_TYPE.INT32:
        dv.setInt32(p, v as number, true);
        break;
      case GGUF_TYPE.FLOAT32:
        dv.setFloat32(p, v as number, true);
        break;
      case GGUF_TYPE.BOOL:
        dv.setUint8(p, v ? 1 : 0);
        break;
      case GGUF_TYPE.UINT64:
        dv.setBigUint64(p, BigInt(v as number | bigint), true);
        break;
      case GGUF_TYPE.INT64:
        dv.setBigInt64(p, BigInt(v as number | bigint), true);
        break;
      case GGUF_TYPE.FLOAT64:
        dv.setFloat64(p, v as number, true);
        break;
    }
    this.#pos += size;
    this.length += size;
  }
  u32(v: number): void {
    this.num(GGUF_TYPE.UINT32, v);
  }
  u64(v: number | bigint): void {
    this.num(GGUF_TYPE.UINT64, BigInt(v));
  }
  str(s: string): void {
    const b = new TextEncoder().encode(s);
    this.u64(b.length);
    this.bytes(b);
  }
  pad(alignment: number): void {
    const n = (alignment - (this.length % alignment)) % alignment;
    if (n > 0) this.bytes(new Uint8Array(n));
  }
  finish(): Uint8Array {
    const parts = [...this.chunks, this.#cur.subarray(0, this.#pos)];
    const out = new Uint8Array(this.length);
    let o = 0;
    for (const p of parts) {
      out.set(p, o);
      o += p.length;
    }
    return out;
  }
}

function writeArrayBody(w: ByteWriter, a: GgufArray): void {
  w.u32(a.type);
  w.u64(a.length);
  const raw = a.rawBytes;
  if (raw !== null && a.type !== GGUF_TYPE.ARRAY) {
    w.bytes(raw); // bytes read from a file: copied unchanged
    return;
  }
  for (let i = 0; i < a.length; i++) writeValue(w, a.type, a.get(i));
}

function writeValue(w: ByteWriter, type: GgufType, v: GgufValue): void {
  if (type === GGUF_TYPE.STRING) w.str(v as string);
  else if (type === GGUF_TYPE.ARRAY) writeArrayBody(w, v as GgufArray);
  else w.num(type, v);
}

/** The planned placement of a GGUF file. */
export interface GgufLayout {
  /** Header bytes: magic … tensor infos and the padding up to `dataStart`. */
  readonly header: Uint8Array;
  /** Absolute offset of the data section. */
  readonly dataStart: number;
  /** The alignment used. */
  readonly alignment: number;
  /** Per tensor, in order: offset relative to the data section and byte length. */
  readonly tensors: readonly { name: string; offset: number; byteLength: number }[];
  /** Total file size (every tensor padded to the alignment). */
  readonly fileSize: number;
}

/**
 * Plan a GGUF file: serialize the header and place the tensors.
 * @param tensors as {@link GgufTensorInput}, with `byteLength` instead of data allowed
 * @throws TpError E_ARG for bad keys, values, names, shapes, types, lengths or alignment
 */
export function ggufLayout(
  metadata: Iterable<GgufKvInput>,
  tensors: readonly (Omit<GgufTensorInput, "data"> & { byteLength: number })[],
  options: GgufWriteOptions = {},
): GgufLayout {
  const version = options.version ?? 3;
  if (version !== 2 && version !== 3)
    throw new TpError("E_ARG", `GGUF version must be 2 or 3, got ${version}`);
  const kvs = [...metadata].map((kv) => {
    const type = ggufTypeId(kv.type);
    if (typeof kv.key !== "string" || kv.key === "")
      throw new TpError("E_ARG", "a GGUF metadata key must be a non-empty string");
    checkValue(type, kv.value, `metadata '${kv.key}'`);
    return { key: kv.key, type, value: kv.value };
  });
  const keys = new Set<string>();
  for (const kv of kvs) {
    if (keys.has(kv.key)) throw new TpError("E_ARG", `duplicate GGUF metadata key '${kv.key}'`);
    keys.add(kv.key);
  }
  const alignKv = kvs.find((kv) => kv.key === "general.alignment");
  if (alignKv && alignKv.type !== GGUF_TYPE.UINT32)
    throw new TpError("E_ARG", "general.alignment must be a u32");
  const alignment = options.alignment ?? (alignKv ? (alignKv.value as number) : GGUF_DEFAULT_ALIGNMENT);
  if (
    !Number.isInteger(alignment) ||
    alignment <= 0 ||
    (alignment & (alignment - 1)) !== 0 ||
    alignment > 2 ** 30
  ) {
    throw new TpError("E_ARG", `GGUF alignment must be a power of two, got ${alignment}`);
  }
  if (alignKv && alignKv.value !== alignment) {
    throw new TpError("E_ARG", `alignment ${alignment} disagrees with general.alignment ${alignKv.value}`);
  }
  if (!alignKv && alignment !== GGUF_DEFAULT_ALIGNMENT)
    kvs.push({ key: "general.alignment", type: GGUF_TYPE.UINT32, value: alignment });

  const names = new Set<string>();
  const infos = tensors.map((t) => {
    const where = { tensor: t.name };
    const nameBytes = new TextEncoder().encode(t.name).length;
    if (t.name === "" || nameBytes >= GGML_MAX_NAME) {
      throw new TpError(
        "E_ARG",
        `tensor names must be 1..${GGML_MAX_NAME - 1} bytes (ggml GGML_MAX_NAME)`,
        where,
      );
    }
    if (names.has(t.name)) throw new TpError("E_ARG", "duplicate tensor name", where);
    names.add(t.name);
    const typeId = typeof t.type === "number" ? t.type : ggmlTypeOf(t.type);
    const info = ggmlTypeInfo(typeId);
    if (!info) throw new TpError("E_ARG", `unknown ggml type ${t.type}`, where);
    const ne = t.ne ? [...t.ne] : t.shape ? [...t.shape].reverse() : null;
    if (!ne || ne.length > GGML_MAX_DIMS || !ne.every((d) => Number.isSafeInteger(d) && d >= 0)) {
      throw new TpError("E_ARG", `give ne or shape with 0..${GGML_MAX_DIMS} non-negative dimensions`, where);
    }
    if ((ne[0] ?? 1) % info.blockElems !== 0) {
      throw new TpError(
        "E_ARG",
        `ne[0] = ${ne[0]} is not a multiple of the ${info.name} block size ${info.blockElems}`,
        where,
      );
    }
    const numel = ne.reduce((a, b) => a * b, 1);
    const bytes = (numel / info.blockElems) * info.blockBytes;
    if (!Number.isSafeInteger(bytes) || bytes !== t.byteLength) {
      throw new TpError(
        "E_ARG",
        `${info.name} ne [${ne.join(", ")}] needs ${bytes} bytes, got ${t.byteLength}`,
        where,
      );
    }
    return { name: t.name, ne, typeId, bytes };
  });

  const w = new ByteWriter();
  w.u32(GGUF_MAGIC);
  w.u32(version);
  w.u64(infos.length);
  w.u64(kvs.length);
  for (const kv of kvs) {
    w.str(kv.key);
    if (kv.type === GGUF_TYPE.ARRAY) {
      w.u32(GGUF_TYPE.ARRAY);
      writeArrayBody(w, kv.value as GgufArray);
    } else {
      w.u32(kv.type);
      writeValue(w, kv.type, kv.value);
    }
  }
  let offset = 0;
  const placed = infos.map((t) => {
    w.str(t.name);
    w.u32(t.ne.length);
    for (const d of t.ne) w.u64(d);
    w.u32(t.typeId);
    w.u64(offset);
    const p = { name: t.name, offset, byteLength: t.bytes };
    offset += t.bytes + ((alignment - (t.bytes % alignment)) % alignment);
    return p;
  });
  w.pad(alignment);
  const header = w.finish();
  return { header, dataStart: header.length, alignment, tensors: placed, fileSize: header.length + offset };
}

function inputs(tensors: readonly GgufTensorInput[]) {
  return tensors.map(({ data, ...t }) => ({ ...t, byteLength: data.byteLength }));
}

/**
 * The whole GGUF file in memory (tests, small files).
 * @throws TpError E_ARG as {@link ggufLayout}
 */
export function serializeGguf(
  metadata: Iterable<GgufKvInput>,
  tensors: readonly GgufTensorInput[],
  options: GgufWriteOptions = {},
): Uint8Array {
  const layout = ggufLayout(metadata, inputs(tensors), options);
  const out = new Uint8Array(layout.fileSize);
  out.set(layout.header, 0);
  layout.tensors.forEach((p, i) => {
    out.set((tensors[i] as GgufTensorInput).data, layout.dataStart + p.offset);
  });
  return out;
}

/**
 * Write a GGUF file atomically (temporary name, fsync, rename). Tensor bytes are written straight from
 * the given views.
 * @returns the layout that was written
 * @throws TpError E_ARG as {@link ggufLayout}; E_IO when writing fails
 */
export function writeGguf(
  path: string,
  metadata: Iterable<GgufKvInput>,
  tensors: readonly GgufTensorInput[],
  options: GgufWriteOptions = {},
): GgufLayout {
  const layout = ggufLayout(metadata, inputs(tensors), options);
  writeAtomically(path, (write) => {
    write(layout.header);
    layout.tensors.forEach((p, i) => {
      write((tensors[i] as GgufTensorInput).data);
      const pad = (layout.alignment - (p.byteLength % layout.alignment)) % layout.alignment;
      if (pad > 0) write(new Uint8Array(pad));
    });
  });
  return layout;
}

/**
 * Write a split model `PREFIX-00001-of-0000N.gguf` …, as llama.cpp's gguf-split does: tensors in
 * order, a new shard when the next tensor would exceed `maxTensors` tensors or `maxBytes` data bytes.
 * @returns the shard paths
 * @throws TpError E_ARG for bad limits (or as {@link ggufLayout}); E_IO when writing fails
 */
export function writeGgufSplit(
  prefix: string,
  metadata: Iterable<GgufKvInput>,
  tensors: readonly GgufTensorInput[],
  limits: { maxTensors?: number; maxBytes?: number },
  options: GgufWriteOptions = {},
): string[] {
  const maxT = limits.maxTensors ?? Number.POSITIVE_INFINITY;
  const maxB = limits.maxBytes ?? Number.POSITIVE_INFINITY;
  if (!(maxT >= 1) || !(maxB > 0)) throw new TpError("E_ARG", "maxTensors must be ≥ 1 and maxBytes > 0");
  const meta = [...metadata].filter((kv) => !kv.key.startsWith("split."));
  const groups: GgufTensorInput[][] = [[]];
  let bytes = 0;
  for (const t of tensors) {
    const g = groups[groups.length - 1] as GgufTensorInput[];
    if (g.length > 0 && (g.length + 1 > maxT || bytes + t.data.byteLength > maxB)) {
      groups.push([t]);
      bytes = t.data.byteLength;
    } else {
      g.push(t);
      bytes += t.data.byteLength;
    }
  }
  const n = groups.length;
  const layouts = groups.map((g, i) => {
    const kvs: GgufKvInput[] = [
      ...(i === 0 ? meta : []),
      ggufKv("split.no", "u16", i),
      ggufKv("split.count", "u16", n),
      ggufKv("split.tensors.count", "i32", tensors.length),
    ];
    return { kvs, g };
  });
  if (n > 0xffff) throw new TpError("E_ARG", `${n} shards; split.count is a u16`);
  return layouts.map(({ kvs, g }, i) => {
    const path = ggufSplitPath(prefix, i, n);
    writeGguf(path, kvs, g, options);
    return path;
  });
}
