/**
 * Test helpers (not exported from the package): where ../shared is, temporary directories that are
 * removed afterwards, sparse files, and a seeded random generator.
 */
import { closeSync, existsSync, ftruncateSync, mkdtempSync, openSync, rmSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

/** `../shared` beside the repository root (CI clones the repo elsewhere, with shared/ beside it). */
export const SHARED = resolve(import.meta.dir, "../../../../../shared");
/** The small GGUF models of ../shared/models (see its PROVENANCE.md). */
export const MODELS = join(SHARED, "models");
/** True when ../shared/models is present. */
export const HAVE_MODELS = existsSync(join(MODELS, "PROVENANCE.md"));
/** Why model tests skip. */
export const NO_MODELS = `skipped: ${MODELS} is absent (the shared models folder is not beside this checkout)`;

/** A fresh temporary directory; call the returned `cleanup` in `afterAll`. */
export function tempDir(tag: string): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), `tp-formats-${tag}-`));
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/** Write `head` at offset 0 and extend the file to `size` bytes with a hole (sparse, no disk used). */
export function writeSparse(
  path: string,
  head: Uint8Array,
  size: number,
  patches: readonly [number, Uint8Array][] = [],
): void {
  const fd = openSync(path, "w");
  try {
    writeSync(fd, head, 0, head.length, 0);
    ftruncateSync(fd, size);
    for (const [at, bytes] of patches) writeSync(fd, bytes, 0, bytes.length, at);
  } finally {
    closeSync(fd);
  }
}

/** mulberry32: a small seeded PRNG returning floats in [0, 1). */
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

/** `n` bytes from a seeded generator. */
export function randomBytes(n: number, seed: number): Uint8Array {
  const r = rng(seed);
  const out = new Uint8Array(n);
  for (let i = 0; i < n; i++) out[i] = Math.floor(r() * 256);
  return out;
}

/** Run `f` and return the error it throws (or fail the test if it does not throw). */
export function thrown(f: () => unknown): unknown {
  try {
    f();
  } catch (e) {
    return e;
  }
  throw new Error("expected an error, none was thrown");
}
