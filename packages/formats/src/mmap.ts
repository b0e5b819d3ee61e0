/**
 * Memory-mapped tensor data, per region, so that files larger than one JavaScript view work.
 *
 * What `Bun.mmap(path, { offset, size })` does on Bun 1.4.5 (measured here, see mmap.test.ts):
 * - one view may be at most 2^32 bytes (4 GiB); a larger `size`, or mapping a whole 5 GiB file,
 *   throws `RangeError: Out of memory`;
 * - `offset` may be unaligned and past 4 GiB: Bun aligns the mapping down to a page itself, and the
 *   view's address is congruent to `offset` modulo the page size;
 * - a range past the end of the file is silently clamped, an offset past the end throws EINVAL, and a
 *   size of 0 throws EINVAL;
 * - by default the mapping is `MAP_SHARED` and writable: a write into the view changes the file on
 *   disk, even for a file with mode 0444 when running as root. We always pass `shared: false`
 *   (`MAP_PRIVATE`, copy-on-write), so a stray write can never damage a checkpoint.
 * - it opens the file read-write even with `shared: false`: a process that may only read the file
 *   (not root; or any process on a read-only mount) gets EACCES / EROFS. Then the same private mapping
 *   is made from a read-only descriptor through libc (`mmap-readonly.ts`, Linux).
 * - there is no unmap call: a mapping is released when its view is garbage-collected.
 *
 * So a file is cut into regions of at most `regionBytes` (1 GiB by default) that each hold whole
 * tensors; a region is mapped the first time one of its tensors is asked for, and a tensor is a
 * `subarray` of its region. Regions start on 4096-byte boundaries, so a tensor's offset inside its
 * region's `ArrayBuffer` has the same alignment as its offset in the file (a `Float32Array` on an
 * F32 tensor at a 4-aligned file offset works). A single tensor larger than 4 GiB cannot be one view:
 * asking for it throws E_UNSUPPORTED, and a caller maps it in parts with {@link MappedFile.view}.
 *
 * Source: ../shared/ARCHITECTURE.md "Weights and memory"; Bun's `Bun.mmap` documentation.
 */
import { TpError } from "@tp/tensor";
import { formatBytes, formatError, ioError } from "./errors.ts";
import { checkInputsUnchanged } from "./file.ts";
import { mapReadOnly } from "./mmap-readonly.ts";

/** The largest view one `Bun.mmap` call returns on Bun 1.4.5, in bytes (2^32). */
export const MAX_VIEW_BYTES = 2 ** 32;
/** Default upper size of one mapped region, in bytes (1 GiB). */
export const DEFAULT_REGION_BYTES = 2 ** 30;
/** Regions start on multiples of this many bytes, so views keep the file's alignment. */
export const REGION_ALIGN = 4096;

/** A byte range [start, end) in a file, absolute offsets. */
export interface ByteSpan {
  readonly start: number;
  readonly end: number;
}

interface Region {
  start: number;
  end: number;
  view: Uint8Array | null;
}

/** Options of {@link MappedFile}. */
export interface MapOptions {
  /** Upper size of one region in bytes, 4096 ≤ regionBytes ≤ 2^32 (default 1 GiB). */
  regionBytes?: number;
}

let mappedTotal = 0;

/**
 * Bytes of file data this process has mapped with {@link mapRange} (each mapping counted once, when
 * made): the checkpoints' weights. They are page cache, not heap — the kernel may drop and re-read
 * them — though the pages a process touches also show in its resident set.
 */
export function mappedBytes(): number {
  return mappedTotal;
}

/**
 * Map `[offset, offset + length)` of `path` privately (copy-on-write) and return the view.
 * @throws TpError E_IO when the mapping fails; E_FORMAT when the file is shorter than the range.
 */
export function mapRange(path: string, offset: number, length: number): Uint8Array {
  if (length === 0) return new Uint8Array(0);
  let view: Uint8Array;
  try {
    view = Bun.mmap(path, { offset, size: length, shared: false });
  } catch (e) {
    // Bun.mmap opens the file read-write even for a private mapping: a file we may only read fails
    // with EACCES (EROFS on a read-only mount). Map it from a read-only descriptor instead.
    const code = (e as { code?: string } | null)?.code;
    let fallback: Uint8Array | null = null;
    if (code === "EACCES" || code === "EPERM" || code === "EROFS") {
      try {
        fallback = mapReadOnly(path, offset, length);
      } catch (e2) {
        throw ioError(`map ${formatBytes(length)} at offset ${offset}`, path, e2);
      }
    }
    if (fallback === null) throw ioError(`map ${formatBytes(length)} at offset ${offset}`, path, e);
    view = fallback;
  }
  if (view.byteLength !== length) {
    const short = formatError(`the file ends before byte ${offset + length} (it changed or is truncated)`, {
      file: path,
      offset: offset + view.byteLength,
    });
    checkInputsUnchanged(`mapping ${formatBytes(length)} at offset ${offset}`, short, [path]);
    throw short;
  }
  mappedTotal += length;
  return view;
}

/**
 * Cut spans into regions of at most `regionBytes` bytes, each holding whole spans, each starting on a
 * {@link REGION_ALIGN} boundary. A span longer than a region gets a region of its own.
 * @param spans byte ranges, in any order (they are sorted here)
 */
export function planRegions(spans: readonly ByteSpan[], regionBytes = DEFAULT_REGION_BYTES): ByteSpan[] {
  const sorted = spans.filter((s) => s.end > s.start).sort((a, b) => a.start - b.start);
  const out: { start: number; end: number }[] = [];
  let cur: { start: number; end: number } | null = null;
  for (const s of sorted) {
    if (cur && Math.max(cur.end, s.end) - cur.start <= regionBytes) {
      cur.end = Math.max(cur.end, s.end);
      continue;
    }
    if (cur) out.push(cur);
    cur = { start: s.start - (s.start % REGION_ALIGN), end: s.end };
  }
  if (cur) out.push(cur);
  return out;
}

/**
 * The tensor data of one file, mapped lazily region by region.
 *
 * @example
 * const m = new MappedFile("model.gguf", size, tensors.map((t) => ({ start: t.byteOffset, end: t.byteOffset + t.byteLength })));
 * const bytes = m.view(t.byteOffset, t.byteLength, t.name); // Uint8Array on the mapping
 */
export class MappedFile {
  readonly #regions: Region[];
  #closed = false;

  /**
   * @param path  the file
   * @param size  its size in bytes (from stat)
   * @param spans the byte ranges that will be asked for (tensors); regions are planned from them
   * @throws TpError E_ARG for a bad `regionBytes`
   */
  constructor(
    readonly path: string,
    readonly size: number,
    spans: readonly ByteSpan[] = [],
    options: MapOptions = {},
  ) {
    const regionBytes = options.regionBytes ?? DEFAULT_REGION_BYTES;
    if (!Number.isSafeInteger(regionBytes) || regionBytes < REGION_ALIGN || regionBytes > MAX_VIEW_BYTES) {
      throw new TpError(
        "E_ARG",
        `regionBytes must be an integer in [${REGION_ALIGN}, 2^32], got ${regionBytes}`,
      );
    }
    this.#regions = planRegions(spans, regionBytes)
      .filter((r) => r.end - r.start <= MAX_VIEW_BYTES)
      .map((r) => ({ ...r, view: null }));
  }

  /** Number of planned regions. */
  get regionCount(): number {
    return this.#regions.length;
  }

  /** Number of regions mapped so far. */
  get mappedCount(): number {
    return this.#regions.filter((r) => r.view !== null).length;
  }

  /** Map every planned region now (parse-and-map benchmarks; warming). Returns the region count. */
  mapAll(): number {
    for (const r of this.#regions) this.#map(r);
    return this.#regions.length;
  }

  #map(r: Region): Uint8Array {
    if (this.#closed) throw new TpError("E_STATE", "the checkpoint was closed", { file: this.path });
    if (r.view === null) r.view = mapRange(this.path, r.start, r.end - r.start);
    return r.view;
  }

  #find(offset: number, end: number): Region | undefined {
    const rs = this.#regions;
    let lo = 0;
    let hi = rs.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if ((rs[mid] as Region).start <= offset) lo = mid + 1;
      else hi = mid - 1;
    }
    for (let i = hi; i >= 0 && i >= hi - 1; i--) {
      const r = rs[i] as Region;
      if (r.start <= offset && end <= r.end) return r;
    }
    return undefined;
  }

  /**
   * A view on bytes [offset, offset + length) of the file (mapped, not copied; copy-on-write).
   * @param tensor the tensor these bytes belong to, for error messages
   * @throws TpError E_FORMAT when the range is outside the file; E_UNSUPPORTED when it is longer
   *   than one view can be (4 GiB): map it in parts; E_IO when mapping fails
   */
  view(offset: number, length: number, tensor?: string): Uint8Array {
    const where = { file: this.path, offset, ...(tensor === undefined ? {} : { tensor }) };
    if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(length) || offset < 0 || length < 0) {
      throw formatError(`bad byte range ${offset} + ${length}`, where);
    }
    if (offset + length > this.size) {
      throw formatError(
        `bytes ${offset}..${offset + length} are past the end of the file (${this.size} bytes)`,
        where,
      );
    }
    if (length === 0) return new Uint8Array(0);
    const r = this.#find(offset, offset + length);
    if (r) {
      const v = this.#map(r);
      return v.subarray(offset - r.start, offset - r.start + length);
    }
    const start = offset - (offset % REGION_ALIGN);
    if (offset + length - start > MAX_VIEW_BYTES) {
      throw new TpError(
        "E_UNSUPPORTED",
        `${formatBytes(length)} cannot be one view (at most 4 GiB per Bun.mmap view); map it in parts with view(offset, length)`,
        where,
      );
    }
    if (this.#closed) throw new TpError("E_STATE", "the checkpoint was closed", { file: this.path });
    return mapRange(this.path, start, offset + length - start).subarray(offset - start);
  }

  /**
   * Forget every mapping. Views handed out stay valid until they are garbage-collected (Bun has no
   * explicit unmap); later `view` calls throw E_STATE.
   */
  close(): void {
    this.#closed = true;
    for (const r of this.#regions) r.view = null;
  }
}
