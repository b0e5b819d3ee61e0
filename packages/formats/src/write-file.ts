/**
 * Atomic file output — the one helper every writer of the project goes through (PNG, conditioning and
 * latent files, GGUF and safetensors writers, quantization caches, `quantize`), so that nothing is
 * left half-written (../shared/ARCHITECTURE.md, "Errors"):
 *
 * - the bytes go to a temporary file in the output's own folder, `NAME.tmp-PID-RANDOM` (16 hex digits
 *   from `crypto.getRandomValues`), created with `O_CREAT | O_EXCL | O_NOFOLLOW` and mode 0644 (minus
 *   the umask): a file or symbolic link planted at that name is never opened, let alone followed;
 * - {@link AtomicFile.commit} fsyncs it, renames it over the output (a rename replaces a symbolic link
 *   at the output, it does not follow it) and fsyncs the folder, so after a crash the output is the
 *   old file or the new one, never a mix;
 * - every temporary file that exists is in one registry ({@link liveTemporaryFiles}); the apps'
 *   SIGINT / SIGTERM handler ({@link installInterruptCleanup}) removes them and exits 130 / 143;
 * - a temporary file beside the output left by a process that is gone (the PID in its name is not
 *   running) is removed when the next temporary file for that output is created, with a notice;
 * - {@link writeAllOrNothing} groups several outputs: each is written and fsynced under its temporary
 *   name, and all are renamed only once all are complete.
 *
 * What a file system can still do (an NFS server that loses an acknowledged rename, a disk that lies
 * about fsync) is outside a program's reach.
 */
import {
  closeSync,
  constants,
  fsyncSync,
  ftruncateSync,
  lstatSync,
  openSync,
  readdirSync,
  realpathSync,
  renameSync,
  rmSync,
  statSync,
  unlinkSync,
  writeSync,
} from "node:fs";
import { basename, dirname, join, resolve } from "node:path";
import { TpError } from "@tp/tensor";
import { ioError } from "./errors.ts";
import { forgetInput } from "./file.ts";

/** `NAME.tmp-PID-…`: the temporary names of this helper (and of its earlier `NAME.tmp-PID-N` form). */
const TEMP_INFIX = ".tmp-";

/** Open flags of a temporary file: create it, fail if the name exists, never follow a link there. */
const TEMP_FLAGS = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | (constants.O_NOFOLLOW ?? 0);

/** A fresh unpredictable suffix: 16 hex digits (64 bits) from the system's CSPRNG. */
function randomSuffix(): string {
  const b = crypto.getRandomValues(new Uint8Array(8));
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

/**
 * A fresh temporary name beside `path`: `path.tmp-PID-RANDOM` in the same folder (a rename into place
 * is atomic only within one file system), RANDOM 16 hex digits from the CSPRNG.
 */
export function temporaryPath(path: string): string {
  return `${path}${TEMP_INFIX}${process.pid}-${randomSuffix()}`;
}

// ---------------------------------------------------------------------------------------------------
// The registry of live temporary files

/** Mirrors the registry into a native signal handler (see {@link installInterruptCleanup}). */
export interface TemporaryFileHooks {
  /** A temporary file (absolute path) is about to be created. */
  added(path: string): void;
  /** It was renamed into place or removed. */
  removed(path: string): void;
}

const live = new Set<string>();
let hooks: TemporaryFileHooks | null = null;
let notice: (text: string) => void = () => {};

function register(tmp: string): void {
  live.add(tmp);
  hooks?.added(tmp);
}

function unregister(tmp: string): void {
  if (!live.delete(tmp)) return;
  hooks?.removed(tmp);
}

/** The temporary files of this process that exist now (absolute paths). */
export function liveTemporaryFiles(): string[] {
  return [...live];
}

/**
 * Remove every live temporary file (a signal handler's job); the registry is emptied.
 * @returns how many files were removed
 */
export function removeLiveTemporaryFiles(): number {
  let n = 0;
  for (const tmp of [...live]) {
    try {
      unlinkSync(tmp);
      n++;
    } catch {
      // already gone
    }
    unregister(tmp);
  }
  return n;
}

/**
 * Where notices of this module go (a stale temporary file removed): the apps pass a writer to stderr;
 * the default drops them.
 */
export function setWriteNotice(fn: (text: string) => void): void {
  notice = fn;
}

/** Set (or with null, clear) the hooks that mirror the registry. */
export function setTemporaryFileHooks(h: TemporaryFileHooks | null): void {
  if (hooks) for (const t of live) hooks.removed(t);
  hooks = h;
  if (hooks) for (const t of live) hooks.added(t);
}

function processAlive(pid: number): boolean {
  if (pid === process.pid) return false; // ours are in `live`; this one is from an earlier process
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as { code?: string }).code === "EPERM"; // running, as another user
  }
}

/**
 * Remove the temporary files beside `path` whose process is gone: regular files named
 * `NAME.tmp-PID-…` where PID is not running (and is not one of this process's live files).
 * @returns the removed paths (each also reported through {@link setWriteNotice})
 */
export function removeStaleTemporaryFiles(path: string): string[] {
  const dir = dirname(resolve(path));
  const prefix = `${basename(path)}${TEMP_INFIX}`;
  const removed: string[] = [];
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return removed;
  }
  for (const name of names) {
    if (!name.startsWith(prefix)) continue;
    const m = /^(\d{1,10})-/.exec(name.slice(prefix.length));
    if (!m) continue;
    const p = join(dir, name);
    if (live.has(p) || processAlive(Number(m[1]))) continue;
    try {
      if (!lstatSync(p).isFile()) continue; // a link or a folder is not ours
      unlinkSync(p);
      removed.push(p);
      notice(`removed ${p}, a temporary file left by process ${m[1]}, which is no longer running`);
    } catch {
      // raced with another cleaner
    }
  }
  return removed;
}

/** Test-only: `TP_TEST_PAUSE_AFTER_TEMP_MS=N` blocks N ms after each temporary file is created. */
function testPause(): void {
  const ms = Number(process.env.TP_TEST_PAUSE_AFTER_TEMP_MS ?? 0);
  if (ms > 0) Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

// ---------------------------------------------------------------------------------------------------
// Groups of outputs renamed together

interface Pending {
  file: AtomicFile;
}

interface Group {
  labels: Map<string, string>;
  pending: Pending[];
}

let group: Group | null = null;

/** The flag or positional a user named `path` with, inside {@link writeAllOrNothing}. */
function labelOf(path: string): string | undefined {
  return group?.labels.get(resolve(path));
}

function systemCode(e: unknown): string | undefined {
  return (e as { code?: string } | null)?.code;
}

/**
 * The error for a failed write of an output: named by the user's path and, inside a group, by its flag
 * (`cannot write --out: no space left on device (file x.png)`) — never by the temporary name.
 */
function writeError(action: string, path: string, cause: unknown): TpError {
  if (cause instanceof TpError) return cause;
  const label = labelOf(path);
  return ioError(
    label === undefined ? action : `${action.replace(/ the output file$/, "")} ${label}`,
    path,
    cause,
  );
}

function fsyncFolder(dir: string): void {
  let fd: number | null = null;
  try {
    fd = openSync(dir, constants.O_RDONLY | (constants.O_DIRECTORY ?? 0));
    fsyncSync(fd);
  } catch {
    // some file systems cannot fsync a folder (EINVAL); the rename itself is done
  } finally {
    if (fd !== null) closeSync(fd);
  }
}

/**
 * One output file being written: a temporary file beside `path`, renamed over it by {@link commit}.
 *
 * @example
 * const f = new AtomicFile("out.png");
 * try { f.write(bytes); f.commit(); } catch (e) { f.abort(); throw e; }
 */
export class AtomicFile {
  /** The temporary file (absolute path) the bytes go to until {@link commit}. */
  readonly tmpPath: string;
  #fd: number | null = null;
  #state: "open" | "closed" | "committed" | "aborted" = "open";

  /**
   * Create the temporary file (exclusively; see the module comment). Stale temporary files of `path`
   * are removed first.
   * @param path the output
   * @throws TpError E_IO naming `path` (and its flag inside {@link writeAllOrNothing}) when the file
   *   cannot be created; the `cause` keeps the system code (EACCES, EROFS, ENOSPC, …)
   */
  constructor(readonly path: string) {
    removeStaleTemporaryFiles(path);
    let tmp = "";
    for (let attempt = 0; ; attempt++) {
      tmp = resolve(temporaryPath(path));
      register(tmp); // before it exists: a signal in between removes nothing, or the new file
      try {
        this.#fd = openSync(tmp, TEMP_FLAGS, 0o644);
        break;
      } catch (e) {
        unregister(tmp);
        // EEXIST: someone holds this random name (never by chance); take another
        if (systemCode(e) === "EEXIST" && attempt < 8) continue;
        throw writeError("create the output file", path, e);
      }
    }
    this.tmpPath = tmp;
    testPause();
  }

  /**
   * Write all of `bytes` at `position` (default: after the previous write).
   * @throws TpError E_STATE after commit/abort; E_IO naming the output (ENOSPC: "no space left on
   *   device")
   */
  write(bytes: Uint8Array, position?: number): void {
    const fd = this.#open();
    try {
      let done = 0;
      while (done < bytes.byteLength) {
        done += writeSync(
          fd,
          bytes,
          done,
          bytes.byteLength - done,
          position === undefined ? null : position + done,
        );
      }
    } catch (e) {
      throw writeError("write the output file", this.path, e);
    }
  }

  /**
   * Set the file's size (sparse): for writers that fill it at fixed positions.
   * @throws TpError E_IO naming the output
   */
  truncate(size: number): void {
    try {
      ftruncateSync(this.#open(), size);
    } catch (e) {
      throw writeError("size the output file", this.path, e);
    }
  }

  /**
   * fsync and close the temporary file, then rename it over the output and fsync the folder; inside
   * {@link writeAllOrNothing} the rename waits for the group's end.
   * @throws TpError E_IO naming the output (the temporary file is removed); E_STATE after commit/abort
   */
  commit(): void {
    const fd = this.#open();
    try {
      fsyncSync(fd);
      this.#fd = null;
      closeSync(fd);
    } catch (e) {
      this.abort();
      throw writeError("write the output file", this.path, e);
    }
    this.#state = "closed";
    if (group !== null) {
      group.pending.push({ file: this });
      return;
    }
    this.publish();
  }

  /** @internal rename a closed temporary file into place (a group's end). */
  publish(): void {
    try {
      renameSync(this.tmpPath, this.path);
    } catch (e) {
      this.abort();
      throw writeError("write the output file", this.path, e);
    }
    unregister(this.tmpPath);
    forgetInput(this.path); // this program replaced it: not an input that changed under it
    this.#state = "committed";
    fsyncFolder(dirname(resolve(this.path)));
  }

  /** Close and remove the temporary file (idempotent; a no-op once committed). */
  abort(): void {
    if (this.#state === "committed" || this.#state === "aborted") return;
    if (this.#fd !== null) {
      try {
        closeSync(this.#fd);
      } catch {}
      this.#fd = null;
    }
    rmSync(this.tmpPath, { force: true });
    unregister(this.tmpPath);
    this.#state = "aborted";
  }

  #open(): number {
    if (this.#state !== "open" || this.#fd === null) {
      throw new TpError("E_STATE", `the output was already ${this.#state}`, { file: this.path });
    }
    return this.#fd;
  }
}

/**
 * Write a file through an {@link AtomicFile}: `fill` appends the bytes, then it is committed.
 * @param fill called with a `write(bytes)` that appends to the file
 * @throws TpError E_IO naming `path` on any failure (the temporary file is removed); what `fill`
 *   throws, after removing it
 */
export function writeAtomically(path: string, fill: (write: (bytes: Uint8Array) => void) => void): void {
  const f = new AtomicFile(path);
  try {
    fill((bytes) => f.write(bytes));
    f.commit();
  } catch (e) {
    f.abort();
    throw e instanceof TpError ? e : writeError("write the output file", path, e);
  }
}

/**
 * Write several outputs all-or-nothing: `fill` writes each output by its own path, after naming it
 * with `stage(label, path)` (the flag the user gave it, for messages); every writer inside (anything
 * built on {@link AtomicFile}) writes and fsyncs its temporary file, and only when `fill` returns are
 * all renamed into place. On any error every temporary file, and any output already renamed, is
 * removed, and the error is rethrown.
 * @returns what `fill` returns
 * @throws TpError E_STATE when groups nest or a staged output was never written; E_IO naming the flag
 *   of an output that could not be written or renamed; what `fill` throws
 */
export function writeAllOrNothing<T>(fill: (stage: (label: string, path: string) => string) => T): T {
  if (group !== null) throw new TpError("E_STATE", "writeAllOrNothing groups do not nest");
  const g: Group = { labels: new Map(), pending: [] };
  group = g;
  const renamed: string[] = [];
  try {
    const result = fill((label, path) => {
      g.labels.set(resolve(path), label);
      return path;
    });
    for (const [path, label] of g.labels) {
      if (!g.pending.some((p) => resolve(p.file.path) === path)) {
        throw new TpError("E_STATE", `${label} ${path} was staged but never written; nothing was written`);
      }
    }
    for (const p of g.pending) {
      p.file.publish(); // its error names the output's flag: the group is still current
      renamed.push(p.file.path);
    }
    return result;
  } catch (e) {
    for (const p of g.pending) p.file.abort();
    for (const path of renamed) rmSync(path, { force: true });
    throw e;
  } finally {
    group = null;
  }
}

// ---------------------------------------------------------------------------------------------------
// Signals

/** What a native signal handler offers (@tp/backend-cpu's `nativeInterruptHandler`). */
export interface NativeInterruptHandler {
  /**
   * Handle `signal` in native code: remove the armed files, print {@link interruptLine}, exit 128 +
   * the signal number.
   */
  install(signal: "SIGINT" | "SIGTERM"): void;
  /** Arm a slot with a path to remove; returns false when every slot is taken. */
  arm(path: string): number | null;
  /** Disarm a slot. */
  disarm(slot: number): void;
}

const SIGNAL_NUMBERS = { SIGINT: 2, SIGTERM: 15 } as const;

/** The one line printed on an interrupt: `interrupted by SIGINT: 1 unfinished output file removed`. */
export function interruptLine(signal: "SIGINT" | "SIGTERM", removed: number): string {
  return `interrupted by ${signal}: ${removed === 0 ? "no" : removed} unfinished output file${removed === 1 ? "" : "s"} removed`;
}

let installed = false;

/**
 * The apps' SIGINT / SIGTERM handling, installed once at start: on either signal while an output is
 * being written, every live temporary file is removed, one line ({@link interruptLine}) goes to
 * stderr and the process exits 130 / 143 (128 + the signal number). Stale temporary files removed
 * later are noted on stderr.
 *
 * JavaScript signal handlers run only when the event loop is free, so a long synchronous stage
 * (quantizing, writing a large file) would delay them until it ends; with `native` the handler is C
 * code that runs at once, and the registry is mirrored into it through {@link setTemporaryFileHooks}.
 * `native` may be a function: it is called, and the handlers installed, when the first temporary
 * file is created — a command that writes nothing pays nothing and keeps the default signal
 * behaviour. Where it gives null (the CPU library not built), JavaScript handlers do the same work as
 * soon as the event loop turns.
 * @param options `native`: the C handler, or a function giving it (null: JavaScript handlers);
 *   `signals`: which to take over (default both)
 */
export function installInterruptCleanup(
  options: {
    native?: NativeInterruptHandler | (() => NativeInterruptHandler | null) | null;
    signals?: readonly ("SIGINT" | "SIGTERM")[];
  } = {},
): void {
  if (installed) return;
  installed = true;
  setWriteNotice((text) => process.stderr.write(`note: ${text}\n`));
  const signals = options.signals ?? ["SIGINT", "SIGTERM"];
  const given = options.native ?? null;
  let native: NativeInterruptHandler | null = null;
  const slots = new Map<string, number>();
  const mirror: TemporaryFileHooks = {
    added(path) {
      const s = native?.arm(path) ?? null;
      if (s !== null) slots.set(path, s);
    },
    removed(path) {
      const s = slots.get(path);
      if (s !== undefined) native?.disarm(s);
      slots.delete(path);
    },
  };
  const start = (): void => {
    native = typeof given === "function" ? given() : given;
    if (native === null) {
      for (const s of signals) process.on(s, () => exitOnInterrupt(s));
      setTemporaryFileHooks(null);
      return;
    }
    for (const s of signals) native.install(s);
    setTemporaryFileHooks(mirror);
  };
  if (typeof given !== "function") {
    start();
    return;
  }
  // lazily: the first temporary file starts the handler, then is mirrored like every later one
  setTemporaryFileHooks({
    added() {
      start(); // replaces these hooks; the new ones are given every live file, this one included
    },
    removed() {},
  });
}

/**
 * Remove the live temporary files, print {@link interruptLine} and exit 128 + the signal number
 * (a program's own SIGINT handler calls this to quit).
 */
export function exitOnInterrupt(signal: "SIGINT" | "SIGTERM"): never {
  const n = removeLiveTemporaryFiles();
  process.stderr.write(`${interruptLine(signal, n)}\n`);
  process.exit(128 + SIGNAL_NUMBERS[signal]);
}

// ---------------------------------------------------------------------------------------------------
// Paths

/**
 * Where a path leads: the realpath of an existing file, else the realpath of its folder joined with
 * its name (a file about to be created), else the absolute path.
 */
export function resolvedPath(path: string): string {
  try {
    return realpathSync(path);
  } catch {
    // not there (yet)
  }
  const abs = resolve(path);
  try {
    return join(realpathSync(dirname(abs)), basename(abs));
  } catch {
    return abs;
  }
}

/**
 * Whether two paths are one file — so that writing one would overwrite the other: the same
 * {@link resolvedPath} (symbolic links, `./`, `..` resolved), or, both existing, the same device and
 * inode (a hard link).
 */
export function sameFile(a: string, b: string): boolean {
  if (resolvedPath(a) === resolvedPath(b)) return true;
  try {
    const sa = statSync(a);
    const sb = statSync(b);
    return sa.dev === sb.dev && sa.ino === sb.ino;
  } catch {
    return false;
  }
}
