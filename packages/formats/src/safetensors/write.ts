/**
 * safetensors writer, following the reference serializer byte for byte
 * (huggingface/safetensors `safetensors/src/tensor.rs`, `prepare` / `serialize_to_file`):
 * - tensors sorted by descending dtype (enum order, i.e. alignment) and then by name, so each tensor
 *   starts at a multiple of its element size;
 * - `data_offsets` contiguous from 0, no gaps or overlaps;
 * - the JSON is compact (`serde_json::to_string`): `__metadata__` first, then the tensors in order,
 *   each `{"dtype":…,"shape":[…],"data_offsets":[b,e]}`;
 * - the JSON is padded with spaces to a multiple of 8 bytes, so the data section is 8-aligned.
 * The file is written under a temporary name and renamed into place.
 */
import { TpError } from "@tp/tensor";
import { safeNumel } from "../tensors.ts";
import { AtomicFile, writeAtomically } from "../write-file.ts";
import {
  SAFETENSORS_DTYPE_NAMES,
  SAFETENSORS_DTYPES,
  safetensorsByteLength,
  safetensorsDtypeName,
} from "./dtypes.ts";

/** A tensor to write. */
export interface SafetensorsTensorInput {
  /** Tensor name (non-empty; `__metadata__` is reserved). */
  readonly name: string;
  /** A safetensors dtype string (`"BF16"`) or a `@tp/tensor` dtype (`"bf16"`). */
  readonly dtype: string;
  /** Shape, torch order. */
  readonly shape: readonly number[];
  /** The raw little-endian bytes, exactly `numel · bits / 8` long (may be a mapped view). */
  readonly data: Uint8Array;
}

/** Where each tensor lands and the header bytes, before any data is written. */
export interface SafetensorsLayout {
  /** The first `8 + N` bytes of the file: the u64 length and the padded JSON. */
  readonly header: Uint8Array;
  /** Absolute offset of the data section (`8 + N`, a multiple of 8). */
  readonly dataStart: number;
  /** The tensors in file order, each with its `data_offsets`. */
  readonly order: readonly {
    name: string;
    dtype: string;
    shape: readonly number[];
    begin: number;
    end: number;
  }[];
  /** Total file size in bytes. */
  readonly fileSize: number;
}

/** Compare strings by Unicode code point, which is UTF-8 byte order (Rust's `str` ordering). */
export function compareCodePoints(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const x = a.codePointAt(i) as number;
    const y = b.codePointAt(i) as number;
    if (x !== y) return x - y;
    if (x > 0xffff) i++;
  }
  return a.length - b.length;
}

/**
 * Compute the header and the placement of every tensor, as the reference writer would.
 * @param tensors names, dtypes, shapes (data is not read; `byteLength` may be given instead)
 * @param metadata `__metadata__` entries, written in insertion order
 * @throws TpError E_ARG for a bad name, an unknown dtype, a bad shape, a duplicate name, or a byte
 *   length that does not match dtype × shape
 */
export function safetensorsLayout(
  tensors: readonly { name: string; dtype: string; shape: readonly number[]; byteLength?: number }[],
  metadata?: Readonly<Record<string, string>> | ReadonlyMap<string, string>,
): SafetensorsLayout {
  const seen = new Set<string>();
  const items = tensors.map((t) => {
    if (t.name === "" || t.name === "__metadata__") throw new TpError("E_ARG", `bad tensor name '${t.name}'`);
    if (seen.has(t.name)) throw new TpError("E_ARG", `duplicate tensor name '${t.name}'`, { tensor: t.name });
    seen.add(t.name);
    const dtype = safetensorsDtypeName(t.dtype);
    const info = dtype === null ? undefined : SAFETENSORS_DTYPES.get(dtype);
    if (!info) {
      throw new TpError(
        "E_ARG",
        `unknown dtype '${t.dtype}'; expected one of: ${SAFETENSORS_DTYPE_NAMES.join(", ")}`,
        {
          tensor: t.name,
        },
      );
    }
    if (!t.shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
      throw new TpError("E_ARG", `bad shape [${t.shape.join(", ")}]`, { tensor: t.name });
    }
    const numel = safeNumel(t.shape);
    const bytes = numel === null ? null : safetensorsByteLength(info, numel);
    if (bytes === null) {
      throw new TpError("E_ARG", `${info.name} [${t.shape.join(", ")}] is not a whole number of bytes`, {
        tensor: t.name,
      });
    }
    if (t.byteLength !== undefined && t.byteLength !== bytes) {
      throw new TpError(
        "E_ARG",
        `${info.name} [${t.shape.join(", ")}] needs ${bytes} bytes, got ${t.byteLength}`,
        {
          tensor: t.name,
        },
      );
    }
    return { name: t.name, dtype: info.name, rank: info.rank, shape: [...t.shape], bytes };
  });
  items.sort((a, b) => b.rank - a.rank || compareCodePoints(a.name, b.name));

  const entries: string[] = [];
  const meta = metadata instanceof Map ? [...metadata] : Object.entries(metadata ?? {});
  if (metadata !== undefined) {
    for (const [k, v] of meta) {
      if (typeof v !== "string") throw new TpError("E_ARG", `__metadata__ value of '${k}' must be a string`);
    }
    entries.push(
      `"__metadata__":{${meta.map(([k, v]) => `${JSON.stringify(k)}:${JSON.stringify(v)}`).join(",")}}`,
    );
  }
  let offset = 0;
  const order = items.map((t) => {
    const begin = offset;
    offset += t.bytes;
    entries.push(
      `${JSON.stringify(t.name)}:{"dtype":"${t.dtype}","shape":[${t.shape.join(",")}],"data_offsets":[${begin},${offset}]}`,
    );
    return { name: t.name, dtype: t.dtype, shape: t.shape, begin, end: offset };
  });
  const json = new TextEncoder().encode(`{${entries.join(",")}}`);
  const n = json.length + ((8 - (json.length % 8)) % 8);
  const header = new Uint8Array(8 + n).fill(0x20, 8 + json.length);
  new DataView(header.buffer).setBigUint64(0, BigInt(n), true);
  header.set(json, 8);
  return { header, dataStart: 8 + n, order, fileSize: 8 + n + offset };
}

function checkedInputs(tensors: readonly SafetensorsTensorInput[]) {
  return tensors.map((t) => ({
    name: t.name,
    dtype: t.dtype,
    shape: t.shape,
    byteLength: t.data.byteLength,
  }));
}

/**
 * The whole file in memory (for tests and small files).
 * @throws TpError E_ARG as {@link safetensorsLayout}
 */
export function serializeSafetensors(
  tensors: readonly SafetensorsTensorInput[],
  options: { metadata?: Readonly<Record<string, string>> | ReadonlyMap<string, string> } = {},
): Uint8Array {
  const layout = safetensorsLayout(checkedInputs(tensors), options.metadata);
  const byName = new Map(tensors.map((t) => [t.name, t]));
  const out = new Uint8Array(layout.fileSize);
  out.set(layout.header, 0);
  for (const t of layout.order)
    out.set((byName.get(t.name) as SafetensorsTensorInput).data, layout.dataStart + t.begin);
  return out;
}

/**
 * Write a safetensors file: to `path.tmp-PID-RANDOM` first, then fsync and rename, so a crash never leaves
 * a half-written file under `path`. Tensor bytes are written straight from the given views (which may
 * be memory mappings of another checkpoint).
 * @throws TpError E_ARG as {@link safetensorsLayout}; E_IO when writing or renaming fails
 */
export function writeSafetensors(
  path: string,
  tensors: readonly SafetensorsTensorInput[],
  options: { metadata?: Readonly<Record<string, string>> | ReadonlyMap<string, string> } = {},
): SafetensorsLayout {
  const layout = safetensorsLayout(checkedInputs(tensors), options.metadata);
  const byName = new Map(tensors.map((t) => [t.name, t]));
  writeAtomically(path, (write) => {
    write(layout.header);
    for (const t of layout.order) write((byName.get(t.name) as SafetensorsTensorInput).data);
  });
  return layout;
}

/** A tensor slot of a {@link SafetensorsWriter}: name, dtype and shape; the bytes come later. */
export interface SafetensorsTensorSpec {
  /** Tensor name (non-empty; `__metadata__` is reserved). */
  readonly name: string;
  /** A safetensors dtype string (`"BF16"`) or a `@tp/tensor` dtype (`"bf16"`). */
  readonly dtype: string;
  /** Shape, torch order. */
  readonly shape: readonly number[];
}

/**
 * A safetensors file written tensor by tensor, in any order of tensors, for outputs too large to hold
 * in memory (a quantized checkpoint, a quantization cache). Every tensor's place is fixed up front by
 * {@link safetensorsLayout} (the reference writer's order); each tensor's bytes are appended in order
 * with {@link write}; {@link commit} writes the header (whose metadata may change then, as long as
 * its length does not), fsyncs and renames the temporary file into place. Until then the output lives
 * under {@link tmpPath} (`path.tmp-PID-RANDOM`); {@link abort} removes it. Nothing is ever half-written
 * under `path`.
 *
 * @example
 * const w = new SafetensorsWriter(out, [{ name: "a", dtype: "F32", shape: [2] }], { metadata: { k: "v" } });
 * try { w.write("a", bytes); w.commit(); } catch (e) { w.abort(); throw e; }
 */
export class SafetensorsWriter {
  /** Where each tensor lands, and the header as first computed. */
  layout: SafetensorsLayout;
  readonly #specs: readonly SafetensorsTensorSpec[];
  readonly #place: Map<string, { begin: number; end: number; done: number }>;
  readonly #file: AtomicFile;
  #state: "open" | "committed" | "aborted" = "open";

  /**
   * Plan the file and create the temporary file (sparse, at its final size).
   * @param path     final path
   * @param tensors  every tensor the file will hold
   * @param options  `metadata`: `__metadata__` entries (insertion order)
   * @throws TpError E_ARG as {@link safetensorsLayout}; E_IO when the temporary file cannot be created
   *   (its `cause` keeps the system error code, e.g. EACCES or EROFS for a read-only directory)
   */
  constructor(
    readonly path: string,
    tensors: readonly SafetensorsTensorSpec[],
    options: { metadata?: Readonly<Record<string, string>> | ReadonlyMap<string, string> } = {},
  ) {
    this.#specs = tensors;
    this.layout = safetensorsLayout(tensors, options.metadata);
    this.#place = new Map(this.layout.order.map((t) => [t.name, { begin: t.begin, end: t.end, done: 0 }]));
    // Named by the final path on failure: the temporary name means nothing to the user.
    this.#file = new AtomicFile(path);
    try {
      this.#file.truncate(this.layout.fileSize);
    } catch (e) {
      this.abort();
      throw e;
    }
  }

  /** The temporary file the data goes to before {@link commit} (`path.tmp-PID-RANDOM`). */
  get tmpPath(): string {
    return this.#file.tmpPath;
  }

  /**
   * Append bytes to a tensor (its first call writes the tensor's first bytes).
   * @throws TpError E_ARG for an unknown tensor or more bytes than the tensor holds; E_STATE after
   *   commit/abort; E_IO when the write fails
   */
  write(name: string, bytes: Uint8Array): void {
    this.#open();
    const p = this.#place.get(name);
    if (p === undefined) throw new TpError("E_ARG", `the output has no tensor '${name}'`, { tensor: name });
    if (p.done + bytes.byteLength > p.end - p.begin) {
      throw new TpError(
        "E_ARG",
        `${p.done + bytes.byteLength} bytes written to a tensor of ${p.end - p.begin} bytes`,
        { tensor: name, file: this.path },
      );
    }
    this.#file.write(bytes, this.layout.dataStart + p.begin + p.done);
    p.done += bytes.byteLength;
  }

  /** Names of the tensors not yet completely written. */
  missing(): string[] {
    return [...this.#place].filter(([, p]) => p.done !== p.end - p.begin).map(([n]) => n);
  }

  /**
   * Write the header, fsync, close, and rename the temporary file to `path`.
   * @param options `metadata`: replaces the metadata given to the constructor; the header must keep
   *   its length (e.g. a checksum of fixed width filled in now)
   * @returns the final layout
   * @throws TpError E_STATE when a tensor is incomplete (the temporary file is removed) or after
   *   commit/abort; E_ARG when new metadata changes the header length; E_IO on a failed write, fsync or
   *   rename (the temporary file is removed)
   */
  commit(
    options: { metadata?: Readonly<Record<string, string>> | ReadonlyMap<string, string> } = {},
  ): SafetensorsLayout {
    this.#open();
    const missing = this.missing();
    if (missing.length > 0) {
      this.abort();
      throw new TpError(
        "E_STATE",
        `${missing.length} tensor(s) not completely written (${missing.slice(0, 3).join(", ")}); nothing was written to the output`,
        { file: this.path },
      );
    }
    if (options.metadata !== undefined) {
      const next = safetensorsLayout(this.#specs, options.metadata);
      if (next.header.length !== this.layout.header.length) {
        throw new TpError(
          "E_ARG",
          `new metadata changes the header from ${this.layout.header.length} to ${next.header.length} bytes`,
          { file: this.path },
        );
      }
      this.layout = next;
    }
    try {
      this.#file.write(this.layout.header, 0);
      this.#file.commit();
    } catch (e) {
      this.abort();
      throw e;
    }
    this.#state = "committed";
    return this.layout;
  }

  /** Close and remove the temporary file (idempotent; a no-op after commit). */
  abort(): void {
    if (this.#state === "committed") return;
    this.#file.abort();
    this.#state = "aborted";
  }

  #open(): void {
    if (this.#state !== "open") {
      throw new TpError("E_STATE", `the writer was already ${this.#state}`, { file: this.path });
    }
  }
}
