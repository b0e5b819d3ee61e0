/**
 * Checks on native libraries before they are loaded with bun:ffi (shared by every backend's ffi.ts
 * and build script). Host-side file validation only; nothing here loads or runs native code.
 */
import { closeSync, openSync, readSync, statSync } from "node:fs";
import { TpError } from "./errors.ts";

/**
 * Check, before dlopen, that `path` is a regular file holding a complete 64-bit little-endian ELF
 * shared object: dlopen of a truncated library maps pages past the end of the file and the process
 * dies of SIGBUS on first touch, and dlopen of a FIFO blocks forever, so both must be refused here.
 * Checks the ELF header, the program and section header tables, and that every loadable segment lies
 * inside the file. Source: the System V ABI, ELF-64 Object File Format (header and program header
 * layouts).
 * @throws TpError E_IO naming the file and what is wrong with it
 */
export function checkLibraryFile(path: string): void {
  const bad = (why: string): never => {
    throw new TpError(
      "E_IO",
      `${path} is not a usable shared library: ${why}; rebuild it with 'bun run build'`,
      {
        file: path,
      },
    );
  };
  let size = 0;
  try {
    const st = statSync(path);
    if (!st.isFile()) bad("not a regular file");
    size = st.size;
  } catch (e) {
    if (e instanceof TpError) throw e;
    bad(e instanceof Error ? e.message : String(e));
  }
  const fd = openSync(path, "r");
  try {
    const read = (offset: number, length: number): DataView => {
      if (offset + length > size) bad(`truncated: ${size} bytes, the ELF tables need ${offset + length}`);
      const buf = new Uint8Array(length);
      if (readSync(fd, buf, 0, length, offset) !== length) bad("short read");
      return new DataView(buf.buffer);
    };
    const h = read(0, 64);
    if (h.getUint32(0, false) !== 0x7f454c46) bad("no ELF magic");
    if (h.getUint8(4) !== 2 || h.getUint8(5) !== 1) bad("not a 64-bit little-endian ELF file");
    if (h.getUint16(16, true) !== 3) bad("not a shared object (ELF type ET_DYN)");
    const phoff = Number(h.getBigUint64(32, true));
    const shoff = Number(h.getBigUint64(40, true));
    const phentsize = h.getUint16(54, true);
    const phnum = h.getUint16(56, true);
    const shentsize = h.getUint16(58, true);
    const shnum = h.getUint16(60, true);
    if (phentsize < 56 || phnum === 0) bad("no program headers");
    if (shoff !== 0 && shoff + shentsize * shnum > size)
      bad(`truncated: section headers end past ${size} bytes`);
    const ph = read(phoff, phentsize * phnum);
    for (let i = 0; i < phnum; i++) {
      const at = i * phentsize;
      const type = ph.getUint32(at, true);
      if (type !== 1 && type !== 2) continue; // PT_LOAD, PT_DYNAMIC
      const end = Number(ph.getBigUint64(at + 8, true)) + Number(ph.getBigUint64(at + 32, true));
      if (end > size) bad(`truncated: segment ${i} ends at byte ${end} of ${size}`);
    }
  } finally {
    closeSync(fd);
  }
}
