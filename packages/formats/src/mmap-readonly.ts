/**
 * Private mappings of files the process may only read. `Bun.mmap` (1.4.5) opens the file read-write
 * even for `shared: false`, so a non-root process gets EACCES (or EROFS on a read-only mount) for a
 * checkpoint it may read but not write. This maps such a file itself through libc: `open(O_RDONLY)`,
 * then `mmap(PROT_READ | PROT_WRITE, MAP_PRIVATE)` — the same private copy-on-write mapping Bun makes
 * (a write into the view never reaches the file; POSIX allows PROT_WRITE with MAP_PRIVATE on a
 * read-only descriptor). The mapping is released (`munmap`) when its ArrayBuffer is garbage-collected,
 * like Bun's own mappings. Linux only (glibc `libc.so.6`); elsewhere {@link mapReadOnly} returns null
 * and the caller reports the original error.
 *
 * Source: mmap(2), open(2), sysconf(3) (Linux man-pages); bun:ffi `dlopen`, `toArrayBuffer`.
 */

import { dlopen, FFIType, ptr, toArrayBuffer } from "bun:ffi";
import { statSync } from "node:fs";

// Linux constants (asm-generic: the same on x86-64 and arm64).
const O_RDONLY = 0;
const O_CLOEXEC = 0o2000000;
const PROT_READ = 1;
const PROT_WRITE = 2;
const MAP_PRIVATE = 2;
const SC_PAGESIZE = 30;

type Libc = {
  open(path: ReturnType<typeof ptr>, flags: number): number;
  close(fd: number): number;
  mmap(addr: null, length: number, prot: number, flags: number, fd: number, offset: number): bigint;
  munmap(addr: number, length: number): number;
  sysconf(name: number): number | bigint;
};

let libc: Libc | null | undefined;

function load(): Libc | null {
  if (libc !== undefined) return libc;
  libc = null;
  if (process.platform !== "linux") return libc;
  try {
    const lib = dlopen("libc.so.6", {
      open: { args: [FFIType.ptr, FFIType.i32], returns: FFIType.i32 },
      close: { args: [FFIType.i32], returns: FFIType.i32 },
      mmap: {
        args: [FFIType.ptr, FFIType.u64, FFIType.i32, FFIType.i32, FFIType.i32, FFIType.i64],
        returns: FFIType.i64,
      },
      munmap: { args: [FFIType.ptr, FFIType.u64], returns: FFIType.i32 },
      sysconf: { args: [FFIType.i32], returns: FFIType.i64_fast },
    });
    libc = lib.symbols as unknown as Libc;
  } catch {
    libc = null;
  }
  return libc;
}

const unmapper = new FinalizationRegistry<{ addr: number; length: number }>(({ addr, length }) => {
  load()?.munmap(addr, length);
});

/**
 * Map bytes [offset, offset + length) of `path` privately from a read-only descriptor. Like
 * `Bun.mmap`, a range past the end of the file is clamped (the caller checks the length).
 * @returns the view, or null where this fallback is not available (not Linux, no glibc)
 * @throws Error with `code` EACCES / ENOENT / EINVAL (as `Bun.mmap` would) when the file cannot be
 *   opened or mapped
 */
export function mapReadOnly(path: string, offset: number, length: number): Uint8Array | null {
  const c = load();
  if (c === null) return null;
  const size = statSync(path).size;
  if (offset >= size) throw Object.assign(new Error("offset past the end of the file"), { code: "EINVAL" });
  const end = Math.min(size, offset + length);
  const page = Number(c.sysconf(SC_PAGESIZE)) || 4096;
  const start = offset - (offset % page);
  const span = end - start;
  const cPath = Buffer.from(`${path}\0`); // kept referenced until open returns
  const fd = c.open(ptr(cPath), O_RDONLY | O_CLOEXEC);
  cPath.fill(0, 0, 0);
  if (fd < 0) throw Object.assign(new Error(`open failed: ${path}`), { code: "EACCES" });
  let addr: bigint;
  try {
    addr = c.mmap(null, span, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, start);
  } finally {
    c.close(fd);
  }
  if (addr === -1n || addr === 0n) throw Object.assign(new Error(`mmap failed: ${path}`), { code: "ENOMEM" });
  const buffer = toArrayBuffer(Number(addr), 0, span);
  unmapper.register(buffer, { addr: Number(addr), length: span });
  return new Uint8Array(buffer, offset - start, end - offset);
}
