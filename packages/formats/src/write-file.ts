/**
 * Atomic file output: outputs and caches are written to a temporary name and renamed, so nothing is
 * left half-written (../shared/ARCHITECTURE.md, "Errors").
 */
import {
  closeSync,
  fsyncSync,
  openSync,
  realpathSync,
  renameSync,
  rmSync,
  statSync,
  writeSync,
} from "node:fs";
import { basename, dirname, join, resolve } from "node:path";
import { TpError } from "@tp/tensor";
import { ioError } from "./errors.ts";

let tmpCounter = 0;

/**
 * A fresh temporary name beside `path` (`path.tmp-PID-N`): same directory, so a rename into place is
 * atomic on one file system.
 */
export function temporaryPath(path: string): string {
  return `${path}.tmp-${process.pid}-${tmpCounter++}`;
}

/**
 * Write a file through a temporary name in the same directory and rename it into place.
 * @param fill called with a `write(bytes)` that appends to the file
 * @throws TpError E_IO on any failure (the temporary file is removed)
 */
export function writeAtomically(path: string, fill: (write: (bytes: Uint8Array) => void) => void): void {
  const tmp = temporaryPath(path);
  let fd: number | null = null;
  try {
    fd = openSync(tmp, "w");
    const f = fd;
    fill((bytes) => {
      let done = 0;
      while (done < bytes.byteLength) done += writeSync(f, bytes, done, bytes.byteLength - done);
    });
    fsyncSync(fd);
    closeSync(fd);
    fd = null;
    renameSync(tmp, path);
  } catch (e) {
    if (fd !== null) closeSync(fd);
    rmSync(tmp, { force: true });
    if (e instanceof TpError) throw e;
    throw ioError("write the file", path, e);
  }
}

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
