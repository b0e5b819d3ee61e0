/**
 * The data behind `bun apps/cli inspect PATH`: the detected layout, the metadata (GGUF keys with long
 * arrays abridged, or a safetensors file's `__metadata__` in full: JSON values indented below their
 * key), and a table of tensors (name, dtype, shape, bytes, offset), like llama.cpp's `gguf-dump` and
 * the Hugging Face safetensors viewer.
 */
import { statSync } from "node:fs";
import { isTpError } from "@tp/tensor";
import { formatBytes, ioError } from "./errors.ts";
import { checkRegularFile } from "./file.ts";
import { GgufArray, jsonValue } from "./gguf/array.ts";
import type { GgufFile } from "./gguf/file.ts";
import { GGUF_TYPE_NAMES } from "./gguf/types.ts";
import { detectLayout, identifyCheckpoint, openCheckpoint } from "./layouts/detect.ts";
import type { SafetensorsFile } from "./safetensors/file.ts";
import type { ShardedSafetensors } from "./safetensors/sharded.ts";
import type { TensorSource } from "./tensors.ts";

/** One metadata entry as reported: its type and value (arrays abridged to their first elements). */
export interface InspectValue {
  /** GGUF type name (`"u32"`, `"str"`, `"arr"`) or `"str"` for safetensors metadata. */
  readonly type: string;
  /** Element type of an array. */
  readonly elementType?: string;
  /** Element count of an array. */
  readonly length?: number;
  /** The value; for arrays the first `arrayLimit` elements. */
  readonly value: unknown;
  /** True when an array was cut short. */
  readonly abridged?: boolean;
}

/** The layout part of a report. */
export interface InspectLayout {
  readonly kind: string;
  readonly description: string;
  readonly variant?: string;
  readonly prefix?: string;
  readonly details?: Readonly<Record<string, unknown>>;
  /** Where the layout's tensor names come from (upstream code), for people. */
  readonly names?: string;
}

/**
 * A name table's source as users see it: the upstream file it follows, without references into the
 * project's development notes (`../shared/spec/krea2.md §1.3 (ComfyUI … names)` → `ComfyUI … names`),
 * which exist only beside a development checkout.
 */
export function namesSource(source: string): string {
  const upstream = source
    .split("; ")
    .map((part) => part.replace(/^\.\.\/shared\/\S+(?: §[\d.–]+(?:, §[\d.–]+)*)?\s*/, ""))
    .filter((part) => part !== "")
    .join("; ");
  const inner = /^\((.*)\)$/.exec(upstream);
  return inner ? (inner[1] as string) : upstream;
}

/** One row of the tensor table. */
export interface InspectTensor {
  readonly name: string;
  readonly dtype: string;
  readonly shape: readonly number[];
  /** Bytes of tensor data. */
  readonly bytes: number;
  /** Absolute byte offset in `file`. */
  readonly offset: number;
  readonly file: string;
}

/** What `inspect` prints (and `--json` emits). */
export interface InspectReport {
  readonly path: string;
  /** `"safetensors"`, `"gguf"` or `"directory"`. */
  readonly container: string;
  readonly files: readonly { path: string; bytes: number }[];
  readonly layout: InspectLayout;
  /** GGUF only: version, alignment, data offset of the first shard. */
  readonly gguf?: { version: number; alignment: number; dataStart: number };
  readonly metadata: Readonly<Record<string, InspectValue>>;
  readonly tensors: readonly InspectTensor[];
  /** Directories: one report per component file. */
  readonly components?: Readonly<Record<string, InspectReport>>;
}

/** Options of {@link inspectCheckpoint}. */
export interface InspectOptions {
  /** Array elements to show (default 8). */
  arrayLimit?: number;
}

function value(v: unknown, type: number, limit: number): InspectValue {
  if (v instanceof GgufArray) {
    const head = v.slice(0, limit).map((x) => (x instanceof GgufArray ? value(x, 9, limit) : jsonValue(x)));
    return {
      type: "arr",
      elementType: v.typeName,
      length: v.length,
      value: head,
      ...(v.length > limit ? { abridged: true } : {}),
    };
  }
  return { type: GGUF_TYPE_NAMES[type] ?? "?", value: typeof v === "bigint" ? v.toString() : v };
}

function layoutOf(src: TensorSource): InspectLayout {
  try {
    const l = identifyCheckpoint(src);
    return {
      kind: l.kind,
      description: l.description,
      ...(l.variant ? { variant: l.variant } : {}),
      prefix: l.prefix ?? "",
      details: l.details,
      ...(l.names ? { names: namesSource(l.names.source) } : {}),
    };
  } catch (e) {
    if (isTpError(e, "E_FORMAT") || isTpError(e, "E_UNSUPPORTED"))
      return { kind: "unknown", description: e.message };
    throw e;
  }
}

function fileSize(p: string): number {
  try {
    return statSync(p).size;
  } catch (e) {
    throw ioError("stat", p, e);
  }
}

function inspectFile(path: string, limit: number): InspectReport {
  const src = openCheckpoint(path);
  try {
    const metadata: Record<string, InspectValue> = {};
    let gguf: InspectReport["gguf"];
    if (src.kind === "gguf") {
      const g = src as GgufFile;
      for (const kv of g.metadata.entries.values()) metadata[kv.key] = value(kv.value, kv.type, limit);
      const h = g.shards[0]?.header;
      if (h) gguf = { version: h.version, alignment: h.alignment, dataStart: h.dataStart };
    } else {
      const meta = (
        src as SafetensorsFile | ShardedSafetensors as { metadata?: ReadonlyMap<string, string> | null }
      ).metadata;
      const m = meta ?? (src as ShardedSafetensors).shards?.[0]?.metadata ?? null;
      for (const [k, v] of m ?? []) metadata[k] = { type: "str", value: v };
    }
    return {
      path,
      container: src.kind,
      files: src.files.map((f) => ({ path: f, bytes: fileSize(f) })),
      layout: layoutOf(src),
      ...(gguf ? { gguf } : {}),
      metadata,
      tensors: src.tensors.map((t) => ({
        name: t.name,
        dtype: t.dtype,
        shape: t.shape,
        bytes: t.byteLength,
        offset: t.byteOffset,
        file: t.file,
      })),
    };
  } finally {
    src.close();
  }
}

/**
 * Inspect a checkpoint file or directory. A file whose layout is not recognised is still inspected
 * (layout kind `"unknown"` with the reason); a file that is not valid safetensors/GGUF throws.
 * @throws TpError E_IO for a missing path; E_FORMAT for invalid files or an unknown directory layout
 */
export function inspectCheckpoint(path: string, options: InspectOptions = {}): InspectReport {
  const limit = options.arrayLimit ?? 8;
  // a FIFO, socket or device is refused before it is opened (a FIFO would block)
  const isDir = checkRegularFile(path, { directory: true }).isDirectory();
  if (!isDir) return inspectFile(path, limit);
  const l = detectLayout(path);
  const components: Record<string, InspectReport> = {};
  for (const [k, c] of Object.entries(l.components ?? {})) components[k] = inspectFile(c.path, limit);
  return {
    path,
    container: "directory",
    files: l.files.map((f) => ({ path: f, bytes: fileSize(f) })),
    layout: {
      kind: l.kind,
      description: l.description,
      ...(l.variant ? { variant: l.variant } : {}),
      details: l.details,
    },
    metadata: {},
    tensors: [],
    components,
  };
}

function short(s: string, max: number): string {
  const one = s.replace(/\n/g, "\\n");
  return one.length > max ? `${one.slice(0, max)}… (${s.length} chars)` : one;
}

/** Characters of one `__metadata__` value that the text report shows (`--json` has them all). */
const METADATA_TEXT_LIMIT = 4000;

/**
 * A safetensors `__metadata__` value: a JSON object or array (ComfyUI's and diffusers' configs)
 * indented on the lines below its key, any other text on one line with newlines as `\n`; past
 * {@link METADATA_TEXT_LIMIT} characters one line, cut, with the full length.
 */
function showMetadataString(text: string, indent: string): string {
  const t = text.trim();
  if (text.length <= METADATA_TEXT_LIMIT && (t.startsWith("{") || t.startsWith("["))) {
    try {
      const json = JSON.stringify(JSON.parse(t), null, 2);
      if (json.includes("\n")) return `\n${json.replace(/^/gm, indent)}`;
    } catch {
      // not JSON after all: shown as text
    }
  }
  const one = text.replace(/\n/g, "\\n");
  return text.length <= METADATA_TEXT_LIMIT
    ? one
    : `${one.slice(0, METADATA_TEXT_LIMIT)}… (${text.length} chars; --json shows it whole)`;
}

function showValue(v: InspectValue): string {
  if (v.type === "arr") {
    const items = (v.value as unknown[]).map((x) =>
      typeof x === "object" && x !== null && "type" in x
        ? showValue(x as InspectValue)
        : short(JSON.stringify(x), 40),
    );
    return `[${items.join(", ")}${v.abridged ? `, … ${(v.length ?? 0) - items.length} more` : ""}]`;
  }
  return typeof v.value === "string" ? short(JSON.stringify(v.value), 100) : String(v.value);
}

function table(rows: string[][], right: number[]): string[] {
  // a loop, not Math.max(...column): a million rows would overflow the call stack as arguments
  const widths = (rows[0] ?? []).map(() => 0);
  for (const r of rows)
    for (let i = 0; i < widths.length; i++) widths[i] = Math.max(widths[i] as number, (r[i] ?? "").length);
  return rows.map((r) =>
    r
      .map((c, i) => (right.includes(i) ? c.padStart(widths[i] as number) : c.padEnd(widths[i] as number)))
      .join("  ")
      .trimEnd(),
  );
}

function emitInspect(r: InspectReport, emit: (text: string) => void): void {
  const out: string[] = [];
  const total = r.files.reduce((a, f) => a + f.bytes, 0);
  out.push(`path: ${r.path}`);
  out.push(
    `container: ${r.container}${r.gguf ? ` v${r.gguf.version}, alignment ${r.gguf.alignment}, data at ${r.gguf.dataStart}` : ""}; ${r.files.length} file(s), ${formatBytes(total)}`,
  );
  out.push(`layout: ${r.layout.kind} — ${r.layout.description}`);
  for (const [k, v] of Object.entries(r.layout.details ?? {})) out.push(`  ${k}: ${v}`);
  if (r.layout.names) out.push(`  names: ${r.layout.names}`);
  if (r.components) {
    for (const [k, c] of Object.entries(r.components)) {
      out.push("", `== component ${k}`);
      out.push(renderInspect(c));
    }
    emit(out.join("\n"));
    return;
  }
  const meta = Object.entries(r.metadata);
  if (r.container === "safetensors") {
    // a safetensors file's __metadata__: every value is text, shown whole
    out.push("", `__metadata__ (${meta.length}):`);
    const width = meta.reduce((w, [k]) => Math.max(w, k.length), 0);
    for (const [k, v] of meta)
      out.push(`  ${k.padEnd(width)}  ${showMetadataString(String(v.value), "    ")}`.replace(/ +$/gm, ""));
  } else {
    out.push("", `metadata (${meta.length}):`);
    const rows = meta.map(([k, v]) => [
      `  ${k}`,
      v.type === "arr" ? `arr[${v.elementType},${v.length}]` : v.type,
      showValue(v),
    ]);
    for (const l of table(rows, [])) out.push(l);
  }
  const bytes = r.tensors.reduce((a, t) => a + t.bytes, 0);
  out.push("", `tensors (${r.tensors.length}, ${formatBytes(bytes)}):`);
  emit(out.join("\n"));
  emitTensorTable(r, emit);
}

/**
 * The tensor table, in chunks of {@link CHUNK_ROWS} lines: one pass for the column widths, one to
 * write, no per-row arrays kept (a header may hold a million tensors).
 */
function emitTensorTable(r: InspectReport, emit: (text: string) => void): void {
  const multi = r.files.length > 1;
  const cells = (t: InspectTensor, i: number): string[] => [
    String(i),
    t.name,
    t.dtype,
    `[${t.shape.join(", ")}]`,
    String(t.bytes),
    String(t.offset),
    ...(multi ? [t.file.split("/").pop() ?? ""] : []),
  ];
  const headerRow = ["#", "name", "dtype", "shape", "bytes", "offset", ...(multi ? ["file"] : [])];
  const widths = headerRow.map((h) => h.length);
  r.tensors.forEach((t, i) => {
    const c = cells(t, i);
    for (let k = 0; k < widths.length; k++)
      widths[k] = Math.max(widths[k] as number, (c[k] as string).length);
  });
  const right = [0, 4, 5];
  const line = (c: string[]): string =>
    `  ${c
      .map((x, k) => (right.includes(k) ? x.padStart(widths[k] as number) : x.padEnd(widths[k] as number)))
      .join("  ")
      .trimEnd()}`;
  let chunk: string[] = [line(headerRow)];
  r.tensors.forEach((t, i) => {
    chunk.push(line(cells(t, i)));
    if (chunk.length >= CHUNK_ROWS) {
      emit(`\n${chunk.join("\n")}`);
      chunk = [];
    }
  });
  if (chunk.length > 0) emit(`\n${chunk.join("\n")}`);
}

/** Lines per chunk handed to the writer of {@link writeInspect}. */
const CHUNK_ROWS = 4096;

/** A report as text for people (what `inspect` prints without `--json`). */
export function renderInspect(r: InspectReport): string {
  const parts: string[] = [];
  emitInspect(r, (t) => parts.push(t));
  return parts.join("");
}

/**
 * Write a report in chunks — text for people, or with `json` the text of
 * `JSON.stringify(report, null, 2)` — so that a header of a million tensors never becomes one string.
 * @param write called with each chunk, in order (e.g. a write to stdout); a newline ends the output
 */
export function writeInspect(r: InspectReport, json: boolean, write: (text: string) => void): void {
  if (!json) {
    emitInspect(r, write);
    write("\n");
    return;
  }
  const marker = "\u0000tensors\u0000";
  const outer = JSON.stringify({ ...r, tensors: marker }, null, 2);
  const at = outer.indexOf(JSON.stringify(marker));
  write(outer.slice(0, at));
  if (r.tensors.length === 0) write("[]");
  else {
    let chunk: string[] = [];
    r.tensors.forEach((t, i) => {
      chunk.push(`${i === 0 ? "[\n" : ",\n"}${JSON.stringify(t, null, 2).replace(/^/gm, "    ")}`);
      if (chunk.length >= CHUNK_ROWS) {
        write(chunk.join(""));
        chunk = [];
      }
    });
    write(`${chunk.join("")}\n  ]`);
  }
  write(`${outer.slice(at + JSON.stringify(marker).length)}\n`);
}
