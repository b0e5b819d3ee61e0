/**
 * Build packages/backend-cpu/build/libtp_cpu.so from native/cpu/*.c (run by `bun run build` in
 * this package; turbo caches the result, keyed on native/**).
 *
 * - Compiler: $CC when set (an error if it names no program: an explicit choice is never silently
 *   replaced), else the first of cc, gcc, clang on PATH.
 * - Flags: see native/cpu/README.md. Every file gets BASE_FLAGS; `*_avx2.c`, `*_avx512.c` and `*_avx512vnni.c`
 *   also get their ISA flags, and only they do, so the library loads on any x86-64 and picks
 *   its kernels at run time. On other architectures the ISA files are skipped.
 * - Files compile in parallel into a temporary folder; the link writes a temporary name in
 *   build/ that is renamed over libtp_cpu.so, so a failed or interrupted build never leaves a
 *   half-written library (and never touches an existing one).
 * - Skips the build when libtp_cpu.so is newer than every source, header and this script;
 *   `--force` rebuilds anyway.
 *
 * Usage: bun scripts/build-native.ts [--force]
 * Errors: one line on stderr (`error E_IO: ...` for a missing compiler, header or library) and
 * exit status 1. Compiler diagnostics for errors in the C code itself are printed above that line.
 */

import { dlopen } from "bun:ffi";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, renameSync, rmSync, statSync } from "node:fs";
import { basename, join, relative, resolve } from "node:path";
import { runCli, TpError } from "@tp/tensor";
import { checkLibraryFile, TP_ABI_VERSION } from "../src/ffi.ts";

const PACKAGE_DIR = resolve(import.meta.dir, "..");
const ROOT = resolve(PACKAGE_DIR, "../..");
const CPU_DIR = join(ROOT, "native/cpu");
const INCLUDE_DIR = join(ROOT, "native/include");
const BUILD_DIR = join(PACKAGE_DIR, "build");
const LIBRARY = join(BUILD_DIR, "libtp_cpu.so");

/** Flags for every file (native/cpu/README.md, "Flags"). */
const BASE_FLAGS = [
  "-O3",
  "-std=c11",
  "-Wall",
  "-Wextra",
  "-Werror",
  "-fPIC",
  "-pthread",
  "-fvisibility=hidden",
  `-I${INCLUDE_DIR}`,
];

/** Extra flags by file-name suffix; a file gets the flags of the first suffix it ends with. */
const ISA_FLAGS: [suffix: string, flags: string[]][] = [
  ["_avx512.c", ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mf16c"]],
  // AVX-512 VNNI + BF16 (vpdpbusd, vdpbf16ps): only called when the CPU has them (native/cpu/matmul.c)
  [
    "_avx512vnni.c",
    ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mavx512bf16", "-mfma", "-mf16c"],
  ],
  ["_avx2.c", ["-mavx2", "-mfma", "-mf16c"]],
];

const X86 = process.arch === "x64" || process.arch === "ia32";

/** Show a path relative to the repository root in messages. */
function shown(path: string): string {
  return relative(ROOT, path) || path;
}

/** The compiler as argv: $CC (which may carry arguments, e.g. "ccache gcc"), else cc, gcc, clang. */
function findCompiler(): string[] {
  const tried: string[] = [];
  const cc = process.env.CC?.trim();
  if (cc) {
    const [program = "", ...args] = cc.split(/\s+/);
    const found = program.includes("/") ? (existsSync(program) ? program : null) : Bun.which(program);
    if (found) return [found, ...args];
    throw new TpError(
      "E_IO",
      `CC=${cc} names no program: install it, or unset CC to use cc, gcc or clang ('apt-get install gcc')`,
    );
  }
  tried.push("$CC (unset)");
  for (const name of ["cc", "gcc", "clang"]) {
    const found = Bun.which(name);
    if (found) return [found];
    tried.push(name);
  }
  throw new TpError(
    "E_IO",
    `no C compiler found (tried ${tried.join(", ")}): install one with 'apt-get install gcc' or set CC`,
  );
}

/** Newest modification time (ms) of the inputs of the build. */
function newestInput(sources: string[]): number {
  const headers = [
    ...readdirSync(CPU_DIR)
      .filter((f) => f.endsWith(".h"))
      .map((f) => join(CPU_DIR, f)),
    ...readdirSync(INCLUDE_DIR)
      .filter((f) => f.endsWith(".h"))
      .map((f) => join(INCLUDE_DIR, f)),
  ];
  return Math.max(...[...sources, ...headers, import.meta.path].map((p) => statSync(p).mtimeMs));
}

/**
 * Turn a failed compiler or linker run into a TpError. A missing header or library is a setup
 * problem (E_IO, one line); anything else is an error in the C code, whose diagnostics are printed.
 */
function compileError(what: string, output: string): TpError {
  const header = /fatal error: ([^:\s]+): No such file or directory/.exec(output);
  if (header) {
    return new TpError(
      "E_IO",
      `${what}: header ${header[1]} not found: install the compiler and C library headers ('apt-get install gcc libc6-dev') or set CC`,
    );
  }
  const library = /cannot find (-l[^:\s]+)/.exec(output);
  if (library) {
    return new TpError(
      "E_IO",
      `${what}: library ${library[1]} not found: install it ('apt-get install libc6-dev')`,
    );
  }
  if (output.trim() === "")
    return new TpError("E_IO", `${what} failed and the compiler printed nothing; check CC`);
  process.stderr.write(output.endsWith("\n") ? output : `${output}\n`);
  return new TpError("E_INTERNAL", `${what} failed (compiler output above)`);
}

/** Children still running, killed if the build is interrupted. */
const children = new Set<ReturnType<typeof Bun.spawn>>();

/**
 * Run argv; resolve with the exit code and the combined output.
 * @throws TpError E_IO when the program cannot be started (not executable, a directory, ...)
 */
async function run(argv: string[]): Promise<{ code: number; output: string }> {
  let proc: ReturnType<typeof Bun.spawn>;
  try {
    proc = Bun.spawn(argv, { stdout: "pipe", stderr: "pipe" });
  } catch (e) {
    throw new TpError(
      "E_IO",
      `cannot run the compiler ${argv[0]}: ${(e as Error).message}; set CC to a C compiler`,
    );
  }
  children.add(proc);
  proc.exited.then(() => children.delete(proc));
  const [stdout, stderr, code] = await Promise.all([
    new Response(proc.stdout as ReadableStream).text(),
    new Response(proc.stderr as ReadableStream).text(),
    proc.exited,
  ]);
  return { code, output: stdout + stderr };
}

/**
 * Check what the linker wrote before it replaces the library: a complete ELF shared object that
 * dlopen accepts and whose ABI version is this package's (a compiler that "succeeds" without writing
 * a library must never install junk).
 * @throws TpError E_IO naming the compiler
 */
function verifyLibrary(path: string, compiler: string[]): void {
  const why = (e: unknown) => (e instanceof Error ? e.message : String(e));
  if (!existsSync(path))
    throw new TpError("E_IO", `${compiler.join(" ")} reported success but wrote no library`);
  try {
    checkLibraryFile(path);
    const lib = dlopen(path, { tp_abi_version: { args: [], returns: "i32" } });
    const version = lib.symbols.tp_abi_version();
    lib.close();
    if (version !== TP_ABI_VERSION) throw new Error(`ABI version ${version}, expected ${TP_ABI_VERSION}`);
  } catch (e) {
    throw new TpError("E_IO", `${compiler.join(" ")} wrote a library that cannot be used: ${why(e)}`);
  }
}

async function main(): Promise<number> {
  const force = process.argv.includes("--force");
  const sources = readdirSync(CPU_DIR)
    .filter((f) => f.endsWith(".c"))
    .filter((f) => X86 || !ISA_FLAGS.some(([suffix]) => f.endsWith(suffix)))
    .sort()
    .map((f) => join(CPU_DIR, f));
  if (sources.length === 0) throw new TpError("E_IO", `no C sources in ${shown(CPU_DIR)}`);

  if (existsSync(LIBRARY) && !statSync(LIBRARY).isFile()) {
    throw new TpError("E_IO", `${shown(LIBRARY)} exists but is not a file; remove it and build again`);
  }
  if (!force && existsSync(LIBRARY) && statSync(LIBRARY).mtimeMs > newestInput(sources)) {
    console.log(`${shown(LIBRARY)} is up to date`);
    return 0;
  }

  const compiler = findCompiler();
  const started = performance.now();
  mkdirSync(BUILD_DIR, { recursive: true });
  const objDir = mkdtempSync(join(BUILD_DIR, "obj-"));
  const tmpLibrary = join(BUILD_DIR, `libtp_cpu.so.${process.pid}.tmp`);
  const cleanUp = () => {
    for (const child of children) child.kill();
    rmSync(tmpLibrary, { force: true });
    rmSync(objDir, { recursive: true, force: true });
  };
  const onSignal = (signal: NodeJS.Signals) => {
    cleanUp();
    process.kill(process.pid, signal); // die of the same signal, after cleaning up
  };
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  try {
    const defines = X86 ? [] : ["-DTP_NO_X86_KERNELS"];
    const objects = sources.map((src) => join(objDir, `${basename(src, ".c")}.o`));
    const results = await Promise.all(
      sources.map((src, i) => {
        const isa = ISA_FLAGS.find(([suffix]) => src.endsWith(suffix))?.[1] ?? [];
        return run([...compiler, ...BASE_FLAGS, ...isa, ...defines, "-c", src, "-o", objects[i] as string]);
      }),
    );
    for (const [i, r] of results.entries()) {
      if (r.code !== 0) throw compileError(`compiling ${shown(sources[i] as string)}`, r.output);
    }

    const link = await run([...compiler, "-shared", "-pthread", "-o", tmpLibrary, ...objects, "-lm"]);
    if (link.code !== 0) throw compileError(`linking ${shown(LIBRARY)}`, link.output);
    verifyLibrary(tmpLibrary, compiler);
    renameSync(tmpLibrary, LIBRARY);
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
    cleanUp();
  }

  const seconds = ((performance.now() - started) / 1000).toFixed(1);
  console.log(
    `built ${shown(LIBRARY)} from ${sources.length} files with ${compiler.join(" ")} in ${seconds} s`,
  );
  return 0;
}

await runCli(main);
