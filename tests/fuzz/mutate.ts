/**
 * Seeded mutations of safetensors and GGUF files, for the fuzzer (tests/fuzz/harness.ts): raw byte
 * edits (flips, interesting u32 / u64 values, truncation, insertion) and structural ones made on the
 * parsed file and written back — dtypes, dims, ranks, offsets (shifted, huge, aliasing another
 * tensor's bytes), names (deleted, renamed, a stray layer beyond the others), metadata values and
 * types, and data that still parses (NaN / ±∞ in weights, in fp8 codes, in GGUF block scales).
 */
import { ggufKv, openGguf, serializeGguf } from "@tp/formats";
import { GgufArray } from "../../packages/formats/src/gguf/array.ts";

/** mulberry32: a small seeded generator in [0, 1). */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const pick = <T>(r: () => number, xs: readonly T[]): T => xs[Math.floor(r() * xs.length)] as T;

const INTERESTING = [
  0n,
  1n,
  7n,
  8n,
  31n,
  32n,
  255n,
  2n ** 31n,
  2n ** 32n - 1n,
  2n ** 32n,
  2n ** 53n,
  2n ** 63n,
  2n ** 64n - 1n,
];

/** 1–3 raw byte edits of `seed` (the reader fuzz of before, kept as one family). */
export function mutateRaw(seed: Uint8Array, r: () => number, headerBytes = seed.length): Uint8Array {
  let b = seed.slice();
  const steps = 1 + Math.floor(r() * 3);
  for (let s = 0; s < steps; s++) {
    // Mostly inside the header, where a flip changes the meaning; sometimes anywhere.
    const span = r() < 0.8 ? Math.min(headerBytes, b.length) : b.length;
    const at = Math.floor(r() * span);
    const kind = Math.floor(r() * 6);
    const dv = new DataView(b.buffer, b.byteOffset);
    if (kind === 0) b[at] = Math.floor(r() * 256);
    else if (kind === 1) b[at] = (b[at] as number) ^ (1 << Math.floor(r() * 8));
    else if (kind === 2 && at + 8 <= b.length) dv.setBigUint64(at, pick(r, INTERESTING), true);
    else if (kind === 3 && at + 4 <= b.length)
      dv.setUint32(at, Number(pick(r, INTERESTING) & 0xffffffffn), true);
    else if (kind === 4) b = b.subarray(0, at);
    else {
      const n = 1 + Math.floor(r() * 16);
      const out = new Uint8Array(b.length + n);
      out.set(b.subarray(0, at));
      for (let i = 0; i < n; i++) out[at + i] = Math.floor(r() * 256);
      out.set(b.subarray(at), at + n);
      b = out;
    }
  }
  return b;
}

/** A non-finite value encoded in a float dtype (f32, f16, bf16, fp8), or null for other dtypes. */
function nonFiniteBytes(dtype: string, r: () => number): Uint8Array | null {
  const which = Math.floor(r() * 3); // NaN, +∞, −∞
  switch (dtype.toUpperCase()) {
    case "F32":
      return new Uint8Array(Float32Array.of([Number.NaN, Infinity, -Infinity][which] as number).buffer);
    case "F16":
      return new Uint8Array(Uint16Array.of([0x7e00, 0x7c00, 0xfc00][which] as number).buffer);
    case "BF16":
      return new Uint8Array(Uint16Array.of([0x7fc0, 0x7f80, 0xff80][which] as number).buffer);
    case "F8_E4M3":
      return Uint8Array.of(which === 2 ? 0xff : 0x7f); // its only NaN codes
    case "F8_E5M2":
      return Uint8Array.of([0x7e, 0x7c, 0xfc][which] as number);
    default:
      return null;
  }
}

const ELEM_BYTES: Record<string, number> = { F32: 4, F16: 2, BF16: 2, F8_E4M3: 1, F8_E5M2: 1 };

/** What a structural mutation did, for the fuzzer's tallies ("dtype", "data-nan", ...). */
export interface Mutated {
  readonly bytes: Uint8Array;
  readonly kind: string;
}

type StEntry = { dtype: unknown; shape: unknown; data_offsets: unknown };

/** Parse a safetensors file into its header object and data bytes (the seed is valid). */
function parseSafetensors(b: Uint8Array): { header: Record<string, unknown>; data: Uint8Array } {
  const n = Number(new DataView(b.buffer, b.byteOffset).getBigUint64(0, true));
  return { header: JSON.parse(new TextDecoder().decode(b.subarray(8, 8 + n))), data: b.subarray(8 + n) };
}

function buildSafetensors(header: Record<string, unknown>, data: Uint8Array): Uint8Array {
  let json = JSON.stringify(header);
  while ((8 + json.length) % 8 !== 0) json += " ";
  const h = new TextEncoder().encode(json);
  const out = new Uint8Array(8 + h.length + data.length);
  new DataView(out.buffer).setBigUint64(0, BigInt(h.length), true);
  out.set(h, 8);
  out.set(data, 8 + h.length);
  return out;
}

/** A stray-layer name: the first `.<digits>.` index of `name` replaced by `to` (or null). */
function reindex(name: string, to: number): string | null {
  const m = /\.(\d+)\./.exec(name);
  return m ? `${name.slice(0, m.index)}.${to}.${name.slice(m.index + m[0].length)}` : null;
}

/** One structural (or raw) mutation of a safetensors seed. */
export function mutateSafetensors(seed: Uint8Array, r: () => number): Mutated {
  const { header, data } = parseSafetensors(seed);
  const names = Object.keys(header).filter((k) => k !== "__metadata__");
  const name = pick(r, names);
  const e = header[name] as StEntry;
  const shape = e.shape as number[];
  const offs = e.data_offsets as [number, number];
  const kinds = [
    "raw",
    "dtype",
    "dim",
    "rank",
    "offsets-shift",
    "offsets-huge",
    "offsets-alias",
    "delete",
    "rename",
    "stray",
    "metadata",
    "data-nan",
    "data-nan",
    "data-random",
    "truncate",
  ];
  const kind = pick(r, kinds);
  let bytes = data;
  switch (kind) {
    case "raw":
      return {
        bytes: mutateRaw(
          seed,
          r,
          8 + Number(new DataView(seed.buffer, seed.byteOffset).getBigUint64(0, true)),
        ),
        kind,
      };
    case "dtype":
      e.dtype = pick(r, [
        "F32",
        "F16",
        "BF16",
        "F8_E4M3",
        "F8_E5M2",
        "I8",
        "U8",
        "I32",
        "I64",
        "F64",
        "BOOL",
        "C64",
        "F4",
        "",
        7,
      ]);
      break;
    case "dim": {
      const i = Math.floor(r() * Math.max(1, shape.length));
      const d = shape[i] ?? 1;
      const v = pick(r, [0, 1, 2, d + 1, d - 1, d * 2, 2 ** 31, 2 ** 53, -1, 1.5, "3", null]);
      if (shape.length === 0) shape.push(v as number);
      else shape[i] = v as number;
      break;
    }
    case "rank":
      if (r() < 0.5 && shape.length > 0) shape.pop();
      else shape.push(pick(r, [1, 2, 0]));
      break;
    case "offsets-shift": {
      const k = pick(r, [-8, -2, -1, 1, 2, 4, 8]);
      e.data_offsets = r() < 0.5 ? [offs[0] + k, offs[1]] : [offs[0], offs[1] + k];
      break;
    }
    case "offsets-huge":
      e.data_offsets = [offs[0], pick(r, [2 ** 53, 2 ** 40, 2 ** 32, -1])];
      break;
    case "offsets-alias": {
      // Another tensor's bytes (same length when one exists: a file that still parses).
      const other =
        names.find(
          (n) =>
            n !== name &&
            (() => {
              const o = (header[n] as StEntry).data_offsets as [number, number];
              return o[1] - o[0] === offs[1] - offs[0];
            })(),
        ) ?? pick(r, names);
      e.data_offsets = [...((header[other] as StEntry).data_offsets as [number, number])];
      break;
    }
    case "delete":
      delete header[name];
      break;
    case "rename": {
      const to = pick(r, [
        reindex(name, 1),
        reindex(name, 0),
        `${name}.x`,
        name.toUpperCase(),
        "",
        "a".repeat(300),
      ]);
      header[to ?? `${name}_`] = e;
      delete header[name];
      break;
    }
    case "stray": {
      const to = reindex(name, pick(r, [2, 3, 7, 15, 99]));
      if (to !== null) header[to] = { ...e, shape: [...shape] };
      else header[`${name}.stray`] = { ...e, shape: [...shape] };
      break;
    }
    case "metadata":
      header.__metadata__ = pick(r, [{ format: 1 }, "x", null, { a: "b".repeat(1000) }, [1, 2]]);
      break;
    case "data-nan":
    case "data-random": {
      bytes = data.slice();
      const size = ELEM_BYTES[String(e.dtype)] ?? 1;
      const count = Math.floor((offs[1] - offs[0]) / size);
      const hits = 1 + Math.floor(r() * 3);
      for (let h = 0; h < hits && count > 0; h++) {
        const at = offs[0] + Math.floor(r() * count) * size;
        const v = kind === "data-nan" ? nonFiniteBytes(String(e.dtype), r) : null;
        if (v !== null) bytes.set(v, at);
        else for (let j = 0; j < size; j++) bytes[at + j] = Math.floor(r() * 256);
      }
      break;
    }
    case "truncate":
      return { bytes: seed.subarray(0, Math.floor(r() * seed.length)), kind };
  }
  return { bytes: buildSafetensors(header, bytes), kind };
}

/** The value of a GGUF array as a writable GgufArray (nested arrays copied too). */
function copyArray(a: GgufArray): GgufArray {
  return GgufArray.of(
    a.typeName,
    a.slice().map((v) => (v instanceof GgufArray ? copyArray(v) : v)),
  );
}

/** A GGUF seed parsed once: its metadata (arrays copied out of the mapping) and tensors. */
export interface GgufSeed {
  readonly bytes: Uint8Array;
  readonly kvs: readonly { key: string; type: unknown; value: unknown }[];
  readonly tensors: readonly { name: string; type: string; shape: number[]; data: Uint8Array }[];
}

/** Parse a GGUF seed file for {@link mutateGguf}. */
export function parseGgufSeed(bytes: Uint8Array, path: string): GgufSeed {
  const g = openGguf(path);
  try {
    return {
      bytes,
      kvs: [...g.metadata.entries.values()].map((kv) => ({
        key: kv.key,
        type: kv.value instanceof GgufArray ? "arr" : kv.type,
        value: kv.value instanceof GgufArray ? copyArray(kv.value) : kv.value,
      })),
      tensors: g.tensors.map((t) => ({
        name: t.name,
        type: t.dtype,
        shape: [...t.shape],
        data: g.data(t.name).slice(),
      })),
    };
  } finally {
    g.close();
  }
}

/** One structural (or raw) mutation of a parsed GGUF seed. */
export function mutateGguf(parsed: GgufSeed, r: () => number): Mutated {
  const seed = parsed.bytes;
  {
    const kvs = parsed.kvs.map((k) => ({ ...k }));
    const tensors = parsed.tensors.map((t) => ({ ...t, shape: [...t.shape] }));
    const kinds = [
      "raw",
      "raw",
      "kv-number",
      "kv-delete",
      "kv-type",
      "kv-array",
      "tensor-delete",
      "tensor-rename",
      "tensor-stray",
      "tensor-dim",
      "tensor-type",
      "data-nan",
      "data-nan",
      "truncate",
    ];
    const kind = pick(r, kinds);
    const headerEnd = Math.min(seed.length, 64 + kvs.length * 48 + tensors.length * 64);
    const t = pick(r, tensors);
    switch (kind) {
      case "raw":
        return { bytes: mutateRaw(seed, r, headerEnd), kind };
      case "truncate":
        return { bytes: seed.subarray(0, Math.floor(r() * seed.length)), kind };
      case "kv-number": {
        const nums = kvs.filter((k) => typeof k.value === "number" || typeof k.value === "bigint");
        const kv = pick(r, nums);
        if (kv)
          kv.value =
            typeof kv.value === "bigint"
              ? pick(r, INTERESTING)
              : pick(r, [0, 1, -1, 2, 3, 7, 2 ** 31 - 1, Number.NaN, 1e30, 0.5]);
        if (
          kv &&
          (kv.type === 4 || kv.type === 5 || kv.type === "u32") &&
          typeof kv.value === "number" &&
          (!Number.isInteger(kv.value) || kv.value < 0 || kv.value > 0xffffffff)
        )
          kv.value = 0;
        break;
      }
      case "kv-delete":
        kvs.splice(Math.floor(r() * kvs.length), 1);
        break;
      case "kv-type": {
        const kv = pick(r, kvs);
        if (kv) {
          kv.type = "str";
          kv.value = String(kv.value instanceof GgufArray ? "array" : kv.value);
        }
        break;
      }
      case "kv-array": {
        const arrays = kvs.filter((k) => k.value instanceof GgufArray);
        const kv = pick(r, arrays);
        if (kv) {
          const a = kv.value as GgufArray;
          kv.value = GgufArray.of(a.typeName, a.slice(0, Math.floor(r() * a.length)));
        }
        break;
      }
      case "tensor-delete":
        tensors.splice(tensors.indexOf(t), 1);
        break;
      case "tensor-rename":
        t.name = pick(r, [
          reindex(t.name, 0) ?? `${t.name}.x`,
          `${t.name}.x`,
          "output.weight",
          "token_embd.weight",
        ]);
        break;
      case "tensor-stray":
        tensors.push({ ...t, name: reindex(t.name, pick(r, [1, 2, 5, 31])) ?? `${t.name}.stray` });
        break;
      case "tensor-dim": {
        // The same bytes under another shape of as many elements (still a valid file), or a new numel.
        if (t.shape.length >= 2 && r() < 0.5) t.shape = [t.shape[1] as number, t.shape[0] as number];
        else if (t.shape.length >= 1) t.shape = [...t.shape, 1];
        break;
      }
      case "tensor-type":
        if (t.type === "F32" && t.data.length % 2 === 0) t.type = pick(r, ["F16", "BF16"]);
        if (t.type === "F16") t.type = "BF16";
        break;
      case "data-nan": {
        const floats = tensors.filter((x) => ["F32", "F16", "BF16", "Q8_0", "Q4_0"].includes(x.type));
        const x = pick(r, floats);
        if (x) {
          x.data = x.data.slice();
          if (x.type.startsWith("Q")) {
            const block = x.type === "Q8_0" ? 34 : 18; // the f16 d of a block
            const at = Math.floor(r() * (x.data.length / block)) * block;
            x.data.set(nonFiniteBytes("F16", r) as Uint8Array, at);
          } else {
            const size = ELEM_BYTES[x.type] as number;
            const at = Math.floor(r() * (x.data.length / size)) * size;
            x.data.set(nonFiniteBytes(x.type, r) as Uint8Array, at);
          }
        }
        break;
      }
    }
    try {
      return {
        bytes: serializeGguf(
          kvs.map((k) => ggufKv(k.key, k.type as never, k.value as never)),
          tensors as never,
        ),
        kind,
      };
    } catch {
      // The writer refused the edit (it checks what it writes): make the file by raw edits instead.
      return { bytes: mutateRaw(seed, r, headerEnd), kind: "raw" };
    }
  }
}
