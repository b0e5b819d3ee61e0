/**
 * Open a GGUF model: one file, or all the shards of a split model (`NAME-00001-of-00003.gguf`).
 *
 * Split files (llama.cpp `tools/gguf-split/gguf-split.cpp`, `src/llama.cpp` `llama_split_path`,
 * `src/llama-model-loader.cpp`): each shard is a complete GGUF; shard names are
 * `PREFIX-%05d-of-%05d.gguf` counted from 1; every shard has `split.no` (u16, counted from 0),
 * `split.count` (u16) and `split.tensors.count` (i32, the total over all shards); the model metadata is
 * in the first shard only. The tensor tables are merged; a name in two shards is an error.
 */
import { existsSync } from "node:fs";
import { TpError } from "@tp/tensor";
import { formatError } from "../errors.ts";
import { HeaderCursor, ReadableFile } from "../file.ts";
import { type MapOptions, MappedFile } from "../mmap.ts";
import { lookupTensor, type TensorEntry, type TensorSource } from "../tensors.ts";
import { GgufArray, type GgufValue } from "./array.ts";
import { type GgufHeader, type GgufKv, parseGgufHeader } from "./header.ts";
import { GGUF_TYPE, GGUF_TYPE_NAMES, isGgufIntType } from "./types.ts";

/** `PREFIX-00001-of-00003.gguf`: groups prefix, number (1-based), count. */
export const GGUF_SPLIT_RE = /^(.*)-(\d{5})-of-(\d{5})\.gguf$/;

/** The path of shard `no` (0-based) of `count` (llama.cpp `llama_split_path`). */
export function ggufSplitPath(prefix: string, no: number, count: number): string {
  return `${prefix}-${String(no + 1).padStart(5, "0")}-of-${String(count).padStart(5, "0")}.gguf`;
}

/**
 * Read and validate the header of one GGUF file without mapping anything.
 * @throws TpError E_IO (cannot read) or E_FORMAT (invalid header)
 */
export function readGgufHeader(path: string): GgufHeader {
  const f = new ReadableFile(path);
  try {
    return parseGgufHeader(new HeaderCursor(f));
  } finally {
    f.close();
  }
}

/** One shard: its path, header and mapping. */
export interface GgufShard {
  readonly path: string;
  readonly header: GgufHeader;
  readonly mapping: MappedFile;
}

/** Typed reads of one metadata map; shared by {@link GgufFile} and tools. */
export class GgufMetadata {
  constructor(
    /** Key → pair, in file order. */
    readonly entries: ReadonlyMap<string, GgufKv>,
    readonly file: string,
  ) {}

  /** The raw value, or undefined. */
  get(key: string): GgufValue | undefined {
    return this.entries.get(key)?.value;
  }

  has(key: string): boolean {
    return this.entries.has(key);
  }

  #wrong(kv: GgufKv, want: string): TpError {
    return formatError(`metadata '${kv.key}' should be ${want}, but it is a ${GGUF_TYPE_NAMES[kv.type]}`, {
      file: this.file,
      offset: kv.offset,
    });
  }

  /** A string value. @throws TpError E_FORMAT when the key holds another type */
  getString(key: string): string | undefined {
    const kv = this.entries.get(key);
    if (kv === undefined) return undefined;
    if (kv.type !== GGUF_TYPE.STRING) throw this.#wrong(kv, "a string");
    return kv.value as string;
  }

  /**
   * An integer value of any width (u8 … i64; llm.md §1.1: "readers must accept any integer width").
   * @throws TpError E_FORMAT for a non-integer type or a 64-bit value beyond 2^53
   */
  getInt(key: string): number | undefined {
    const kv = this.entries.get(key);
    if (kv === undefined) return undefined;
    if (!isGgufIntType(kv.type)) throw this.#wrong(kv, "an integer");
    const v = kv.value as number | bigint;
    if (typeof v === "bigint") {
      if (v > BigInt(Number.MAX_SAFE_INTEGER) || v < BigInt(Number.MIN_SAFE_INTEGER))
        throw this.#wrong(kv, "an integer below 2^53");
      return Number(v);
    }
    return v;
  }

  /** A float (f32 or f64; integers are accepted too). @throws TpError E_FORMAT for other types */
  getFloat(key: string): number | undefined {
    const kv = this.entries.get(key);
    if (kv === undefined) return undefined;
    if (kv.type === GGUF_TYPE.FLOAT32 || kv.type === GGUF_TYPE.FLOAT64) return kv.value as number;
    if (isGgufIntType(kv.type)) return this.getInt(key);
    throw this.#wrong(kv, "a number");
  }

  /** A boolean. @throws TpError E_FORMAT for other types */
  getBool(key: string): boolean | undefined {
    const kv = this.entries.get(key);
    if (kv === undefined) return undefined;
    if (kv.type !== GGUF_TYPE.BOOL) throw this.#wrong(kv, "a bool");
    return kv.value as boolean;
  }

  /** An array (lazy). @throws TpError E_FORMAT for other types */
  getArray(key: string): GgufArray | undefined {
    const kv = this.entries.get(key);
    if (kv === undefined) return undefined;
    if (!(kv.value instanceof GgufArray)) throw this.#wrong(kv, "an array");
    return kv.value;
  }
}

/**
 * A GGUF model opened for reading: metadata (of the first shard), every tensor of every shard, and
 * mapped views on their data. Create with {@link openGguf}.
 */
export class GgufFile implements TensorSource {
  readonly kind = "gguf" as const;
  readonly files: readonly string[];
  readonly tensors: readonly TensorEntry[];
  /** Typed access to the first shard's metadata. */
  readonly metadata: GgufMetadata;
  readonly #byName: Map<string, TensorEntry>;
  readonly #shardOf: Map<string, GgufShard>;

  /** @internal use {@link openGguf} */
  constructor(
    readonly path: string,
    /** The shards, in order (one for an unsplit file). */
    readonly shards: readonly GgufShard[],
  ) {
    this.files = shards.map((s) => s.path);
    this.metadata = new GgufMetadata((shards[0] as GgufShard).header.metadata, (shards[0] as GgufShard).path);
    this.#byName = new Map();
    this.#shardOf = new Map();
    const all: TensorEntry[] = [];
    for (const s of shards) {
      for (const t of s.header.tensors) {
        const e: TensorEntry = {
          name: t.name,
          dtype: t.typeName,
          format: t.format,
          shape: [...t.ne].reverse(),
          file: s.path,
          byteOffset: s.header.dataStart + t.offset,
          byteLength: t.byteLength,
        };
        if (this.#byName.has(t.name)) {
          throw formatError("tensor is in two shards of a split model", {
            file: s.path,
            tensor: t.name,
            offset: t.infoOffset,
          });
        }
        this.#byName.set(t.name, e);
        this.#shardOf.set(t.name, s);
        all.push(e);
      }
    }
    this.tensors = all;
  }

  /** GGUF version of the first shard (2 or 3). */
  get version(): number {
    return (this.shards[0] as GgufShard).header.version;
  }

  /** `general.alignment` of the first shard. */
  get alignment(): number {
    return (this.shards[0] as GgufShard).header.alignment;
  }

  /** `general.architecture`, or undefined. */
  get architecture(): string | undefined {
    return this.metadata.getString("general.architecture");
  }

  has(name: string): boolean {
    return this.#byName.has(name);
  }

  tensor(name: string): TensorEntry {
    return lookupTensor(this.#byName, name, this.path);
  }

  /** The tensor info as the file states it (`ne` in ggml order, ggml type id, relative offset). */
  info(name: string) {
    const shard = this.#shardOf.get(name);
    const t = shard?.header.tensors.find((x) => x.name === name);
    if (!t) return lookupTensor(this.#byName, name, this.path) as never;
    return t;
  }

  data(name: string): Uint8Array {
    const t = this.tensor(name);
    return (this.#shardOf.get(name) as GgufShard).mapping.view(t.byteOffset, t.byteLength, name);
  }

  /** Map every region of every shard now; returns the number of regions. */
  mapAll(): number {
    return this.shards.reduce((n, s) => n + s.mapping.mapAll(), 0);
  }

  close(): void {
    for (const s of this.shards) s.mapping.close();
  }
}

function openShard(path: string, options: MapOptions): GgufShard {
  const header = readGgufHeader(path);
  const mapping = new MappedFile(
    path,
    header.fileSize,
    header.tensors.map((t) => ({
      start: header.dataStart + t.offset,
      end: header.dataStart + t.offset + t.byteLength,
    })),
    options,
  );
  return { path, header, mapping };
}

/**
 * Open a GGUF model. When `path` is one shard of a split model (`split.count` > 1), every shard is
 * found by name next to it, validated, and merged.
 * @param options `regionBytes`: upper size of one mapped region (default 1 GiB)
 * @throws TpError E_IO when a file cannot be read (a missing shard names its path); E_FORMAT for an
 *   invalid header, inconsistent split keys, a tensor in two shards, or a tensor count that differs
 *   from `split.tensors.count`
 */
export function openGguf(path: string, options: MapOptions = {}): GgufFile {
  const first = openShard(path, options);
  const meta = new GgufMetadata(first.header.metadata, path);
  const count = meta.has("split.count") ? (meta.getInt("split.count") ?? 1) : 1;
  if (count <= 1) return new GgufFile(path, [first]);
  const m = GGUF_SPLIT_RE.exec(path);
  if (!m) {
    throw formatError(
      `split.count is ${count} but the name does not end in -NNNNN-of-${String(count).padStart(5, "0")}.gguf`,
      {
        file: path,
      },
    );
  }
  const prefix = m[1] as string;
  if (Number(m[3]) !== count) {
    throw formatError(`the name says ${Number(m[3])} shards but split.count is ${count}`, { file: path });
  }
  const shards: GgufShard[] = [];
  for (let i = 0; i < count; i++) {
    const p = ggufSplitPath(prefix, i, count);
    if (p !== path && !existsSync(p)) {
      throw new TpError("E_IO", `shard ${i + 1} of ${count} is missing`, { file: p });
    }
    const s = p === path ? first : openShard(p, options);
    const sm = new GgufMetadata(s.header.metadata, p);
    const no = sm.getInt("split.no");
    if (no !== i) throw formatError(`split.no is ${no}, expected ${i}`, { file: p });
    const c = sm.getInt("split.count");
    if (c !== count) throw formatError(`split.count is ${c}, expected ${count}`, { file: p });
    shards.push(s);
  }
  const model = new GgufFile(ggufSplitPath(prefix, 0, count), shards);
  const expected = model.metadata.getInt("split.tensors.count");
  if (expected !== undefined && expected !== model.tensors.length) {
    throw formatError(
      `split.tensors.count is ${expected} but the shards hold ${model.tensors.length} tensors`,
      {
        file: model.path,
      },
    );
  }
  return model;
}
