/**
 * Bounded reads from a file by position (`pread`), for headers. Nothing here reads tensor data; that
 * is memory-mapped (see `mmap.ts`). Every read is checked against the file size first, so a hostile
 * length can never make us allocate more than the file holds.
 */
import { closeSync, constants, fstatSync, openSync, readSync, type Stats, statSync } from "node:fs";
import { resolve } from "node:path";
import { TpError } from "@tp/tensor";
import { formatError, ioError } from "./errors.ts";
import { MAX_VIEW_BYTES, mapRange } from "./mmap.ts";

/** What a non-regular file is, in words: `a FIFO (named pipe)`, `a socket`, `a character device`, …. */
function fileTypeName(st: Stats): string {
  if (st.isDirectory()) return "a directory";
  if (st.isFIFO()) return "a FIFO (named pipe)";
  if (st.isSocket()) return "a socket";
  if (st.isCharacterDevice()) return "a character device";
  if (st.isBlockDevice()) return "a block device";
  return "not a regular file";
}

/**
 * Check that `path` is a regular file (symbolic links followed) — or, with `directory`, a folder —
 * before anything opens it: opening a FIFO for reading blocks until a writer comes, and a device or
 * socket holds no checkpoint.
 * @param what words for the message (`--dit`, "the index"); default none
 * @returns its stat
 * @throws TpError E_IO naming the path and what it is instead (a FIFO, a socket, a device, a folder
 *   where none is accepted), or that it does not exist
 */
export function checkRegularFile(path: string, options: { directory?: boolean; what?: string } = {}): Stats {
  let st: Stats;
  try {
    st = statSync(path);
  } catch (e) {
    throw ioError(`open ${options.what ?? "the file"}`, path, e);
  }
  if (st.isFile() || (options.directory === true && st.isDirectory())) return st;
  const expected = options.directory === true ? "a regular file or a folder" : "a regular file";
  throw new TpError(
    "E_IO",
    `${options.what === undefined ? "" : `${options.what} `}${path} is ${fileTypeName(st)}, not ${expected}; pass a checkpoint file`,
    { cause: Object.assign(new Error(fileTypeName(st)), { code: st.isDirectory() ? "EISDIR" : "ENOTREG" }) },
  );
}

/**
 * The text of a small regular file (a JSON index or config), refusing FIFOs and devices first.
 * @throws TpError E_IO as {@link checkRegularFile}, or when reading fails; E_FORMAT for invalid UTF-8
 */
export function readTextFile(path: string, what = "the file"): string {
  const f = new ReadableFile(path, what);
  try {
    return decodeUtf8(f.read(0, f.size, what), what, { file: path, offset: 0 });
  } finally {
    f.close();
  }
}

// ---------------------------------------------------------------------------------------------------
// Inputs that change while in use

/** What an input was when it was opened: size in bytes, modification time (ms) and inode. */
interface InputStamp {
  size: number;
  mtimeMs: number;
  ino: number;
}

const inputs = new Map<string, InputStamp>();

/**
 * Remember `path`'s size, mtime and inode as the program opens it (every reader does, through
 * {@link ReadableFile}); {@link checkInputsUnchanged} compares them later.
 */
export function recordInput(path: string, st: Stats): void {
  inputs.set(resolve(path), { size: st.size, mtimeMs: st.mtimeMs, ino: st.ino });
}

/** Forget an input (the program itself replaced the file, e.g. a rebuilt cache renamed over it). */
export function forgetInput(path: string): void {
  inputs.delete(resolve(path));
}

/**
 * The first opened input (of `paths`, default all) whose size, mtime or inode differs from when it
 * was opened (or that is gone), with words for what changed; null when none did.
 */
export function changedInput(paths?: readonly string[]): { path: string; what: string } | null {
  const only = paths?.map((p) => resolve(p));
  for (const [path, was] of inputs) {
    if (only !== undefined && !only.includes(path)) continue;
    let now: Stats;
    try {
      now = statSync(path);
    } catch {
      return { path, what: "it was removed" };
    }
    if (now.size !== was.size) return { path, what: `its size went from ${was.size} to ${now.size} bytes` };
    if (now.ino !== was.ino) return { path, what: "it was replaced by another file" };
    if (now.mtimeMs !== was.mtimeMs) return { path, what: "it was modified" };
  }
  return null;
}

/**
 * Check that no input changed since it was opened — before each stage of a run, and after a failed
 * read (its cause may be a file cut short under the mapping). A mapped file that shrinks makes a read
 * of the vanished pages a SIGBUS, which no check can catch; this check finds the change at the next
 * stage boundary instead and names the file (formats README, "Files that change while in use").
 * @param stage what was about to run, for the message ("sampling", "writing the outputs")
 * @param cause the failed read's error, kept as the cause
 * @param paths check only these inputs (default: every input opened so far)
 * @throws TpError E_IO naming the file and what changed
 */
export function checkInputsUnchanged(stage?: string, cause?: unknown, paths?: readonly string[]): void {
  const c = changedInput(paths);
  if (c === null) return;
  throw new TpError(
    "E_IO",
    `${c.path} changed while in use (${c.what})${stage === undefined ? "" : ` before ${stage}`}; its data cannot be trusted — run again once the file is complete`,
    cause === undefined ? {} : { cause },
  );
}

/** An open file for header reads: descriptor, path and size in bytes. Close it with `close()`. */
export class ReadableFile {
  /** Size of the file in bytes, taken when it was opened. */
  readonly size: number;
  #fd: number | null;

  /**
   * Open `path` read-only: checked to be a regular file first ({@link checkRegularFile}), then opened
   * non-blocking (a FIFO swapped in meanwhile cannot block the open) and checked again on the
   * descriptor.
   * @param what words for messages (default "the file")
   * @throws TpError E_IO when the file cannot be opened or is not a regular file.
   */
  constructor(
    readonly path: string,
    what = "the file",
  ) {
    checkRegularFile(path, what === "the file" ? {} : { what });
    let fd: number;
    try {
      fd = openSync(path, constants.O_RDONLY | (constants.O_NONBLOCK ?? 0));
    } catch (e) {
      throw ioError(`open ${what}`, path, e);
    }
    try {
      const st = fstatSync(fd);
      if (!st.isFile())
        throw Object.assign(new Error(`${fileTypeName(st)}, not a regular file`), { code: "" });
      this.size = st.size;
      recordInput(path, st);
    } catch (e) {
      closeSync(fd);
      throw ioError(`open ${what}`, path, e);
    }
    this.#fd = fd;
  }

  /**
   * Read `length` bytes at byte `offset` into a new buffer.
   * @param what words for the error message ("the header", "tensor infos")
   * @throws TpError E_FORMAT when [offset, offset + length) is not inside the file (truncated file);
   *   E_IO when the read fails.
   */
  read(offset: number, length: number, what: string): Uint8Array {
    if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(length) || offset < 0 || length < 0) {
      throw formatError(`${what}: bad byte range ${offset} + ${length}`, { file: this.path, offset });
    }
    if (offset + length > this.size) {
      throw formatError(
        `${what} needs bytes ${offset}..${offset + length} but the file has ${this.size} bytes (truncated?)`,
        { file: this.path, offset },
      );
    }
    const out = new Uint8Array(length);
    let done = 0;
    try {
      while (done < length) {
        const n = readSync(this.fd, out, done, length - done, offset + done);
        if (n === 0) break;
        done += n;
      }
    } catch (e) {
      throw ioError(`read ${what}`, this.path, e);
    }
    if (done !== length) {
      throw formatError(`${what}: the file ended after ${done} of ${length} bytes`, {
        file: this.path,
        offset: offset + done,
      });
    }
    return out;
  }

  private get fd(): number {
    if (this.#fd === null) throw ioError("read", this.path, new Error("file already closed"));
    return this.#fd;
  }

  /** Close the descriptor (idempotent). */
  close(): void {
    if (this.#fd !== null) closeSync(this.#fd);
    this.#fd = null;
  }
}

/**
 * A cursor over the beginning of a file, for formats whose header length is not known up front
 * (GGUF). It reads through a private memory mapping of the file's first bytes (64 MiB, or the whole
 * file if smaller, grown by doubling when a header is longer, never past the end of the file nor past
 * one 4 GiB view), and each field read checks that its bytes exist before reading them. A mapping
 * costs nothing for pages that are not touched, and on this project's machines touching mapped
 * page-cache pages is several times faster than copying into fresh heap memory (measured: 7 ms vs
 * 40 ms for an 11 MB header), so byte spans handed out (`bytes`) are views on the mapping, not copies.
 */
export class HeaderCursor {
  /** Absolute byte position of the next read. */
  pos = 0;
  #buf: Uint8Array = new Uint8Array(0);
  #view: DataView = new DataView(this.#buf.buffer);

  constructor(readonly file: ReadableFile) {}

  /** Bytes left between `pos` and the end of the file. */
  get remaining(): number {
    return this.file.size - this.pos;
  }

  /**
   * Make bytes [pos, pos + n) available.
   * @param what the field being read, for the message
   * @param tensor the tensor concerned, if any
   * @throws TpError E_FORMAT when the file ends first
   */
  need(n: number, what: string, tensor?: string): void {
    if (!Number.isSafeInteger(n) || n < 0 || n > this.remaining) {
      throw formatError(
        `${what} needs ${n} bytes at offset ${this.pos} but only ${Math.max(0, this.remaining)} remain in the file`,
        { file: this.file.path, offset: this.pos, ...(tensor === undefined ? {} : { tensor }) },
      );
    }
    const end = this.pos + n;
    if (end <= this.#buf.length) return;
    const size = Math.min(this.file.size, Math.max(end, this.#buf.length * 2, 64 << 20));
    if (size > MAX_VIEW_BYTES) {
      throw formatError(
        `${what} lies past the first 4 GiB of the file; headers that long are not supported`,
        {
          file: this.file.path,
          offset: this.pos,
        },
      );
    }
    this.#buf = mapRange(this.file.path, 0, size);
    this.#view = new DataView(this.#buf.buffer, this.#buf.byteOffset, this.#buf.byteLength);
  }

  u8(what: string): number {
    this.need(1, what);
    return this.#view.getUint8(this.pos++);
  }
  i8(what: string): number {
    this.need(1, what);
    return this.#view.getInt8(this.pos++);
  }
  u16(what: string): number {
    this.need(2, what);
    const v = this.#view.getUint16(this.pos, true);
    this.pos += 2;
    return v;
  }
  i16(what: string): number {
    this.need(2, what);
    const v = this.#view.getInt16(this.pos, true);
    this.pos += 2;
    return v;
  }
  u32(what: string, tensor?: string): number {
    this.need(4, what, tensor);
    const v = this.#view.getUint32(this.pos, true);
    this.pos += 4;
    return v;
  }
  i32(what: string): number {
    this.need(4, what);
    const v = this.#view.getInt32(this.pos, true);
    this.pos += 4;
    return v;
  }
  f32(what: string): number {
    this.need(4, what);
    const v = this.#view.getFloat32(this.pos, true);
    this.pos += 4;
    return v;
  }
  f64(what: string): number {
    this.need(8, what);
    const v = this.#view.getFloat64(this.pos, true);
    this.pos += 8;
    return v;
  }
  u64(what: string, tensor?: string): bigint {
    this.need(8, what, tensor);
    const v = this.#view.getBigUint64(this.pos, true);
    this.pos += 8;
    return v;
  }
  i64(what: string): bigint {
    this.need(8, what);
    const v = this.#view.getBigInt64(this.pos, true);
    this.pos += 8;
    return v;
  }

  /**
   * A u64 that must be a count or size no larger than `max` (default: the bytes left in the file).
   * @throws TpError E_FORMAT naming `what`, the value and the offset
   */
  count(what: string, max = this.remaining, tensor?: string): number {
    const at = this.pos;
    const v = this.u64(what, tensor);
    if (v > BigInt(max)) {
      throw formatError(`${what} is ${v}, more than the ${max} the rest of the file can hold`, {
        file: this.file.path,
        offset: at,
        ...(tensor === undefined ? {} : { tensor }),
      });
    }
    return Number(v);
  }

  /** `n` raw bytes at `pos` (a view on the cursor's buffer; do not modify). */
  bytes(n: number, what: string, tensor?: string): Uint8Array {
    this.need(n, what, tensor);
    const out = this.#buf.subarray(this.pos, this.pos + n);
    this.pos += n;
    return out;
  }

  /**
   * Skip `n` GGUF strings (u64 length + bytes each), checking every length against the file: the hot
   * loop of tokenizer arrays, written without BigInt.
   */
  skipStrings(n: number, what: string): void {
    for (let i = 0; i < n; i++) {
      if (this.pos + 8 > this.#buf.length) this.need(8, `length of element ${i} of ${what}`);
      const lo = this.#view.getUint32(this.pos, true);
      const hi = this.#view.getUint32(this.pos + 4, true);
      if (hi !== 0 || lo > this.file.size - this.pos - 8) {
        throw formatError(
          `element ${i} of ${what} has length ${hi * 2 ** 32 + lo}, past the end of the file`,
          { file: this.file.path, offset: this.pos },
        );
      }
      this.pos += 8;
      if (this.pos + lo > this.#buf.length) this.need(lo, `element ${i} of ${what}`);
      this.pos += lo;
    }
  }

  /** Skip `n` bytes, checking they exist. */
  skip(n: number, what: string): void {
    this.need(n, what);
    this.pos += n;
  }
}

const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/**
 * Decode strict UTF-8 (no replacement characters; a BOM is kept as U+FEFF).
 * @throws TpError E_FORMAT naming `what` and the offset when the bytes are not UTF-8
 */
export function decodeUtf8(
  bytes: Uint8Array,
  what: string,
  where: { file: string; offset: number; tensor?: string },
): string {
  // Fast path: pure ASCII needs no validation beyond the high bit.
  let ascii = true;
  for (let i = 0; i < bytes.length; i++) {
    if ((bytes[i] as number) & 0x80) {
      ascii = false;
      break;
    }
  }
  if (ascii && bytes.length < 64) return String.fromCharCode(...bytes);
  try {
    return utf8.decode(bytes);
  } catch {
    throw formatError(`${what} is not valid UTF-8`, where);
  }
}
