/**
 * GGUF array values, decoded lazily. A tokenizer array of 150k–260k strings stays a span of bytes
 * plus an element count; an element is decoded when it is asked for (../shared/spec/llm.md §1.1).
 */
import { TpError } from "@tp/tensor";
import { decodeUtf8 } from "../file.ts";
import {
  GGUF_TYPE,
  GGUF_TYPE_NAMES,
  GGUF_TYPE_SIZE,
  type GgufType,
  type GgufTypeName,
  ggufTypeId,
} from "./types.ts";

/** A scalar GGUF value: numbers for ≤ 32-bit ints and floats, bigint for u64/i64. */
export type GgufScalar = number | bigint | boolean | string;
/** Any GGUF value. */
export type GgufValue = GgufScalar | GgufArray;

/** Where a raw array's bytes came from, for error messages. */
interface RawSource {
  bytes: Uint8Array;
  file: string;
  /** Absolute file offset of `bytes[0]`. */
  offset: number;
  /** Metadata key the array belongs to. */
  key: string;
}

/** Byte spans of a GGUF string array ({@link GgufArray.utf8Spans}). */
export interface GgufStringSpans {
  /** The bytes holding the strings. */
  readonly bytes: Uint8Array;
  /** Offset in `bytes` of each element's first byte. */
  readonly start: Uint32Array;
  /** Byte length of each element. */
  readonly length: Uint32Array;
}

/**
 * A GGUF array: element type, length, and either the raw little-endian bytes from a file (decoded
 * on access) or JavaScript values (built with {@link GgufArray.of}, for writing).
 */
export class GgufArray {
  readonly #raw: RawSource | null;
  readonly #values: readonly GgufValue[] | null;
  readonly #nested: readonly GgufArray[] | null;
  #stringOffsets: Float64Array | null = null;

  private constructor(
    /** Element type id. */
    readonly type: GgufType,
    /** Number of elements. */
    readonly length: number,
    raw: RawSource | null,
    values: readonly GgufValue[] | null,
    nested: readonly GgufArray[] | null,
  ) {
    this.#raw = raw;
    this.#values = values;
    this.#nested = nested;
  }

  /** @internal an array whose elements are raw bytes (fixed-size types or strings); the reader has checked the span. */
  static fromRaw(type: GgufType, length: number, source: RawSource): GgufArray {
    return new GgufArray(type, length, source, null, null);
  }

  /** @internal an array of arrays. */
  static fromNested(elements: readonly GgufArray[], source: RawSource): GgufArray {
    return new GgufArray(GGUF_TYPE.ARRAY, elements.length, source, null, elements);
  }

  /**
   * An array of JavaScript values, for writing.
   * @param type element type (`"str"`, `"f32"`, `"i32"`, `"arr"` for nested arrays, …)
   * @param values numbers (bigint or safe integers for u64/i64), booleans, strings, or GgufArrays
   * @throws TpError E_ARG when a value does not fit the type
   */
  static of(type: GgufType | GgufTypeName, values: ArrayLike<GgufValue> | Iterable<GgufValue>): GgufArray {
    const t = ggufTypeId(type);
    const list = Array.from(values as Iterable<GgufValue>);
    for (let i = 0; i < list.length; i++) checkValue(t, list[i] as GgufValue, `element ${i}`);
    return new GgufArray(t, list.length, null, list, null);
  }

  /** Short name of the element type (`"str"`, `"f32"`). */
  get typeName(): GgufTypeName {
    return GGUF_TYPE_NAMES[this.type];
  }

  /** @internal the raw bytes (for the writer, which copies them unchanged), or null. */
  get rawBytes(): Uint8Array | null {
    return this.#raw?.bytes ?? null;
  }

  /**
   * Element `i`.
   * @throws TpError E_ARG for an index out of range; E_FORMAT when a string element is not UTF-8
   */
  get(i: number): GgufValue {
    if (!Number.isInteger(i) || i < 0 || i >= this.length) {
      throw new TpError("E_ARG", `index ${i} is out of range for a GGUF array of ${this.length}`);
    }
    if (this.#values) return this.#values[i] as GgufValue;
    if (this.#nested) return this.#nested[i] as GgufArray;
    const raw = this.#raw as RawSource;
    if (this.type === GGUF_TYPE.STRING) {
      const offs = this.#offsets();
      const start = (offs[i] as number) + 8;
      const end = i + 1 < this.length ? (offs[i + 1] as number) : raw.bytes.length;
      return decodeUtf8(raw.bytes.subarray(start, end), `element ${i} of '${raw.key}'`, {
        file: raw.file,
        offset: raw.offset + start,
      });
    }
    return readScalar(
      new DataView(raw.bytes.buffer, raw.bytes.byteOffset, raw.bytes.byteLength),
      this.type,
      i * (GGUF_TYPE_SIZE[this.type] as number),
    );
  }

  #offsets(): Float64Array {
    if (this.#stringOffsets) return this.#stringOffsets;
    const raw = this.#raw as RawSource;
    const dv = new DataView(raw.bytes.buffer, raw.bytes.byteOffset, raw.bytes.byteLength);
    const offs = new Float64Array(this.length);
    let p = 0;
    for (let i = 0; i < this.length; i++) {
      offs[i] = p;
      p += 8 + Number(dv.getBigUint64(p, true)); // lengths were checked when the file was read
    }
    this.#stringOffsets = offs;
    return offs;
  }

  /**
   * The elements of a `str` array as UTF-8 byte spans, without decoding them: element i is
   * `bytes.subarray(start[i], start[i] + length[i])`. Read from the file's bytes when the reader kept
   * them (no string per element is made: a 151,936-token vocabulary takes milliseconds), else encoded
   * from the values of an array built with {@link GgufArray.of}. Lengths are < 2³² (checked when read).
   * @throws TpError E_ARG when the elements are not strings
   */
  utf8Spans(): GgufStringSpans {
    if (this.type !== GGUF_TYPE.STRING) {
      throw new TpError("E_ARG", `utf8Spans needs an array of str, this one holds ${this.typeName}`);
    }
    const n = this.length;
    const start = new Uint32Array(n);
    const length = new Uint32Array(n);
    if (this.#raw === null) {
      const enc = new TextEncoder();
      const parts = (this.#values as string[]).map((t) => enc.encode(t));
      const bytes = new Uint8Array(parts.reduce((sum, part) => sum + part.length, 0));
      let at = 0;
      parts.forEach((part, i) => {
        bytes.set(part, at);
        start[i] = at;
        length[i] = part.length;
        at += part.length;
      });
      return { bytes, start, length };
    }
    const offs = this.#offsets();
    const bytes = this.#raw.bytes;
    for (let i = 0; i < n; i++) {
      start[i] = (offs[i] as number) + 8;
      length[i] = (i + 1 < n ? (offs[i + 1] as number) : bytes.length) - (start[i] as number);
    }
    return { bytes, start, length };
  }

  /**
   * The elements of an `i32` or `f32` array as an Int32Array / Float32Array (a copy, little-endian
   * values decoded; bulk read for long arrays such as token types and scores).
   * @throws TpError E_ARG when the array holds another type
   */
  toTypedArray(): Int32Array | Float32Array {
    const f32 = this.type === GGUF_TYPE.FLOAT32;
    if (!f32 && this.type !== GGUF_TYPE.INT32) {
      throw new TpError(
        "E_ARG",
        `toTypedArray needs an array of i32 or f32, this one holds ${this.typeName}`,
      );
    }
    const out = f32 ? new Float32Array(this.length) : new Int32Array(this.length);
    if (this.#raw === null) {
      for (let i = 0; i < this.length; i++) out[i] = Number(this.get(i));
      return out;
    }
    const b = this.#raw.bytes;
    const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
    for (let i = 0; i < out.length; i++) out[i] = f32 ? dv.getFloat32(4 * i, true) : dv.getInt32(4 * i, true);
    return out;
  }

  /** Elements [start, end) as JavaScript values. */
  slice(start = 0, end = this.length): GgufValue[] {
    const out: GgufValue[] = [];
    for (let i = Math.max(0, start); i < Math.min(end, this.length); i++) out.push(this.get(i));
    return out;
  }

  /** All elements as JavaScript values (decodes everything). */
  toArray(): GgufValue[] {
    return this.slice(0, this.length);
  }

  *[Symbol.iterator](): IterableIterator<GgufValue> {
    for (let i = 0; i < this.length; i++) yield this.get(i);
  }

  /** A JSON-friendly form: bigint as decimal strings, nested arrays as arrays. */
  toJSON(): unknown[] {
    return this.toArray().map(jsonValue);
  }
}

/** A value in a JSON-friendly form (bigint → string, arrays → arrays). */
export function jsonValue(v: GgufValue): unknown {
  if (typeof v === "bigint") return v.toString();
  if (v instanceof GgufArray) return v.toJSON();
  return v;
}

/** @internal read one fixed-size value at `at` of a little-endian DataView. */
export function readScalar(dv: DataView, type: GgufType, at: number): GgufScalar {
  switch (type) {
    case GGUF_TYPE.UINT8:
      return dv.getUint8(at);
    case GGUF_TYPE.INT8:
      return dv.getInt8(at);
    case GGUF_TYPE.UINT16:
      return dv.getUint16(at, true);
    case GGUF_TYPE.INT16:
      return dv.getInt16(at, true);
    case GGUF_TYPE.UINT32:
      return dv.getUint32(at, true);
    case GGUF_TYPE.INT32:
      return dv.getInt32(at, true);
    case GGUF_TYPE.FLOAT32:
      return dv.getFloat32(at, true);
    case GGUF_TYPE.BOOL:
      return dv.getUint8(at) !== 0;
    case GGUF_TYPE.UINT64:
      return dv.getBigUint64(at, true);
    case GGUF_TYPE.INT64:
      return dv.getBigInt64(at, true);
    case GGUF_TYPE.FLOAT64:
      return dv.getFloat64(at, true);
    default:
      throw new TpError("E_INTERNAL", `readScalar of variable-size type ${type}`);
  }
}

const INT_RANGE: Record<number, [number, number]> = {
  [GGUF_TYPE.UINT8]: [0, 0xff],
  [GGUF_TYPE.INT8]: [-0x80, 0x7f],
  [GGUF_TYPE.UINT16]: [0, 0xffff],
  [GGUF_TYPE.INT16]: [-0x8000, 0x7fff],
  [GGUF_TYPE.UINT32]: [0, 0xffffffff],
  [GGUF_TYPE.INT32]: [-0x80000000, 0x7fffffff],
};

/**
 * Check that `v` can be written as a value of `type`.
 * @throws TpError E_ARG naming `what`, the type and the value
 */
export function checkValue(type: GgufType, v: GgufValue, what: string): void {
  const bad = () =>
    new TpError(
      "E_ARG",
      `${what}: ${typeof v === "bigint" ? `${v}n` : JSON.stringify(v)} is not a GGUF ${GGUF_TYPE_NAMES[type]}`,
    );
  const range = INT_RANGE[type];
  if (range) {
    if (typeof v !== "number" || !Number.isInteger(v) || v < range[0] || v > range[1]) throw bad();
  } else if (type === GGUF_TYPE.UINT64 || type === GGUF_TYPE.INT64) {
    const b = typeof v === "bigint" ? v : typeof v === "number" && Number.isSafeInteger(v) ? BigInt(v) : null;
    if (b === null) throw bad();
    if (type === GGUF_TYPE.UINT64 ? b < 0n || b >= 2n ** 64n : b < -(2n ** 63n) || b >= 2n ** 63n)
      throw bad();
  } else if (type === GGUF_TYPE.FLOAT32 || type === GGUF_TYPE.FLOAT64) {
    if (typeof v !== "number") throw bad();
  } else if (type === GGUF_TYPE.BOOL) {
    if (typeof v !== "boolean") throw bad();
  } else if (type === GGUF_TYPE.STRING) {
    if (typeof v !== "string") throw bad();
  } else if (type === GGUF_TYPE.ARRAY) {
    if (!(v instanceof GgufArray)) throw bad();
  }
}
