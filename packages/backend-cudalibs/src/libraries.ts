/**
 * Finding and opening NVIDIA's libraries (libcublasLt, libcudnn) through bun:ffi: each folder of
 * TP_CUDA_LIB_DIR (a `:`-separated list, e.g. the nvidia wheels' `cublas/lib:cudnn/lib`) for each
 * soname, then each soname on the loader path (LD_LIBRARY_PATH, ld.so.cache). A library that is
 * absent is one E_UNSUPPORTED line naming it, the places tried and how to install it; a damaged file in
 * TP_CUDA_LIB_DIR is E_IO naming it; a library that lacks an entry point is E_UNSUPPORTED naming it.
 */
import { dlopen, type FFIFunction } from "bun:ffi";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { checkLibDirFile, libraryDirs } from "@tp/backend-ptx/driver";
import { TpError } from "@tp/tensor";

/** The folders of TP_CUDA_LIB_DIR (the driver layer's, re-exported: one parser for both backends). */
export { libraryDirs };

/** What to load: a label for messages, sonames in order of preference, the symbols, how to get it. */
export interface LibrarySpec<S extends Record<string, FFIFunction>> {
  /** e.g. "cuBLASLt". */
  readonly label: string;
  /** e.g. ["libcublasLt.so.13", "libcublasLt.so.12"]. */
  readonly sonames: readonly string[];
  readonly symbols: S;
  /** One sentence: the package or wheel that holds it. */
  readonly howToGet: string;
}

/** A loaded library: where it came from and its functions by name. */
export interface LoadedLibrary<S extends Record<string, FFIFunction>> {
  readonly path: string;
  // biome-ignore lint/suspicious/noExplicitAny: bun:ffi functions are typed by their declarations at run time
  readonly symbols: { [K in keyof S]: (...args: any[]) => any };
}

/** The paths {@link loadLibrary} tries: every TP_CUDA_LIB_DIR folder × soname, then every soname. */
export function libraryCandidates(
  sonames: readonly string[],
  env: Record<string, string | undefined> = process.env,
): string[] {
  const dirs = libraryDirs(env);
  return [...dirs.flatMap((d) => sonames.map((s) => join(d, s))), ...sonames];
}

const cache = new Map<string, LoadedLibrary<Record<string, FFIFunction>>>();

/**
 * Open the first library of `spec` found (see the module comment), memoised by path.
 * @throws TpError E_UNSUPPORTED `<soname> (<label>) was not found: tried …; <how to get it>` when none
 *   exists, or `<path> cannot serve as <label>: Symbol "…" not found …` when one lacks an entry point;
 *   E_IO naming a TP_CUDA_LIB_DIR file that is not a usable shared library (truncated, not ELF)
 */
export function loadLibrary<S extends Record<string, FFIFunction>>(
  spec: LibrarySpec<S>,
  env: Record<string, string | undefined> = process.env,
): LoadedLibrary<S> {
  const how = `${spec.howToGet}, or set TP_CUDA_LIB_DIR to the folder that holds it (folders separated by ':')`;
  const tried: string[] = [];
  for (const path of libraryCandidates(spec.sonames, env)) {
    const key = `${spec.label}\0${path}`;
    const hit = cache.get(key);
    if (hit !== undefined) return hit as unknown as LoadedLibrary<S>;
    const explicit = path.includes("/");
    if (explicit) {
      tried.push(path);
      if (!existsSync(path)) continue;
      checkLibDirFile(path, `${spec.label} library`);
    } else tried.push(`${path} on the loader path`);
    let lib: ReturnType<typeof dlopen<S>>;
    try {
      lib = dlopen(path, spec.symbols);
    } catch (e) {
      const why = e instanceof Error ? e.message : String(e);
      if (/^Failed to open library/.test(why) && !explicit) continue;
      throw new TpError(
        "E_UNSUPPORTED",
        `${path} cannot serve as ${spec.label}: ${why.replace(/\s*\n\s*/g, " ")}; ${how}`,
        { file: path, cause: e },
      );
    }
    const loaded = { path, symbols: lib.symbols } as unknown as LoadedLibrary<S>;
    cache.set(key, loaded as unknown as LoadedLibrary<Record<string, FFIFunction>>);
    return loaded;
  }
  throw new TpError(
    "E_UNSUPPORTED",
    `${spec.sonames[0]} (${spec.label}) was not found: tried ${tried.join(", ")}; ${how}`,
  );
}
