/**
 * Build the Vulkan backend's native parts (run by `bun run build` in this package, through turbo):
 *
 * - native/vulkan/*.c → packages/backend-vulkan/build/libtp_vulkan.so (the shim; it opens the Vulkan
 *   loader with dlopen at run time, so it needs the Vulkan headers to build but no loader);
 * - native/vulkan/shaders/*.comp → build/shaders/<name>.spv with glslangValidator (Debian
 *   `glslang-tools`), each checked with spirv-val (Debian `spirv-tools`) when it is installed.
 *
 * A machine without the tools (no C compiler, no glslangValidator, no Vulkan headers) must still build
 * and test the rest of the repository: then nothing is built, build/unavailable.txt says why, the
 * script prints that one line and exits 0, and `createBackend` throws E_UNSUPPORTED with the reason
 * (so the conformance suite skips vulkan saying why). With `--strict` (or TP_VULKAN_REQUIRED=1) a
 * missing tool is an error: one line `error E_IO: …` naming the Debian package, exit status 1.
 * Errors in the C code or in a shader always fail the build (their diagnostics are printed).
 *
 * Outputs are written to temporary names and renamed, so a failed or interrupted build never leaves a
 * half-written file; each output is rebuilt only when older than its inputs (or with `--force`).
 * Turbo does not cache this task (packages/backend-vulkan/turbo.json): whether it builds depends on
 * the tools installed, which turbo cannot see.
 *
 * Usage: bun scripts/build-native.ts [--force] [--strict]
 */

import { dlopen } from "bun:ffi";
import {
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { basename, join, relative, resolve } from "node:path";
import { formatErrorLine, runCli, TpError } from "@tp/tensor";
import { checkLibraryFile, TP_VK_ABI_VERSION } from "../src/ffi.ts";

const PACKAGE_DIR = resolve(import.meta.dir, "..");
const ROOT = resolve(PACKAGE_DIR, "../..");
const NATIVE_DIR = join(ROOT, "native/vulkan");
const SHADER_DIR = join(NATIVE_DIR, "shaders");
const BUILD_DIR = join(PACKAGE_DIR, "build");
const SPV_DIR = join(BUILD_DIR, "shaders");
const LIBRARY = join(BUILD_DIR, "libtp_vulkan.so");
const UNAVAILABLE = join(BUILD_DIR, "unavailable.txt");

const C_FLAGS = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", "-fPIC", "-fvisibility=hidden"];
/** SPIR-V 1.3 for Vulkan 1.1, the oldest device the shim accepts. */
const GLSL_FLAGS = ["-V", "--target-env", "vulkan1.1"];

function shown(path: string): string {
  return relative(ROOT, path) || path;
}

/** A missing tool: E_IO naming the Debian package. */
class MissingTool extends TpError {
  constructor(message: string) {
    super("E_IO", message);
  }
}

function findCompiler(): string[] {
  const cc = process.env.CC?.trim();
  if (cc) {
    const [program = "", ...args] = cc.split(/\s+/);
    const found = program.includes("/") ? (existsSync(program) ? program : null) : Bun.which(program);
    if (found) return [found, ...args];
    throw new MissingTool(`CC=${cc} names no program: install it, or unset CC ('apt-get install gcc')`);
  }
  for (const name of ["cc", "gcc", "clang"]) {
    const found = Bun.which(name);
    if (found) return [found];
  }
  throw new MissingTool("no C compiler found (tried cc, gcc, clang): install one with 'apt-get install gcc'");
}

function findGlslang(): string {
  const fromEnv = process.env.TP_GLSLANG?.trim();
  if (fromEnv) {
    if (existsSync(fromEnv)) return fromEnv;
    throw new MissingTool(`TP_GLSLANG=${fromEnv} does not exist ('apt-get install glslang-tools')`);
  }
  const found = Bun.which("glslangValidator");
  if (found) return found;
  throw new MissingTool(
    "glslangValidator not found: install it with 'apt-get install glslang-tools' (it compiles the GLSL compute shaders to SPIR-V)",
  );
}

/** -I for the Vulkan headers: $TP_VULKAN_INCLUDE, else the compiler's default paths. */
function vulkanInclude(): string[] {
  const dir = process.env.TP_VULKAN_INCLUDE?.trim();
  return dir ? [`-I${dir}`] : [];
}

const children = new Set<ReturnType<typeof Bun.spawn>>();

async function run(argv: string[]): Promise<{ code: number; output: string }> {
  let proc: ReturnType<typeof Bun.spawn>;
  try {
    proc = Bun.spawn(argv, { stdout: "pipe", stderr: "pipe" });
  } catch (e) {
    throw new MissingTool(`cannot run ${argv[0]}: ${(e as Error).message}`);
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

/** A failed compiler run: a missing header is a missing package (E_IO); anything else a bug (printed). */
function compileError(what: string, output: string): TpError {
  if (/vulkan\/vulkan\.h: No such file or directory/.test(output)) {
    return new MissingTool(
      `${what}: the Vulkan headers (vulkan/vulkan.h) are not installed: 'apt-get install libvulkan-dev', or set TP_VULKAN_INCLUDE`,
    );
  }
  const header = /fatal error: ([^:\s]+): No such file or directory/.exec(output);
  if (header) {
    return new MissingTool(
      `${what}: header ${header[1]} not found: install the C library headers ('apt-get install gcc libc6-dev')`,
    );
  }
  process.stderr.write(output.endsWith("\n") ? output : `${output}\n`);
  return new TpError("E_INTERNAL", `${what} failed (output above)`);
}

function mtime(path: string): number {
  return existsSync(path) ? statSync(path).mtimeMs : 0;
}

function listFiles(dir: string, ext: string): string[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir)
    .filter((f) => f.endsWith(ext))
    .sort()
    .map((f) => join(dir, f));
}

/** Build libtp_vulkan.so unless it is newer than every C source, header and this script. */
async function buildLibrary(compiler: string[], force: boolean): Promise<boolean> {
  const sources = listFiles(NATIVE_DIR, ".c");
  if (sources.length === 0) throw new TpError("E_IO", `no C sources in ${shown(NATIVE_DIR)}`);
  const inputs = [...sources, ...listFiles(NATIVE_DIR, ".h"), import.meta.path];
  if (!force && mtime(LIBRARY) > Math.max(...inputs.map(mtime))) return false;
  const tmp = join(BUILD_DIR, `libtp_vulkan.so.${process.pid}.tmp`);
  try {
    const r = await run([
      ...compiler,
      ...C_FLAGS,
      ...vulkanInclude(),
      "-shared",
      "-o",
      tmp,
      ...sources,
      "-ldl",
    ]);
    if (r.code !== 0) throw compileError(`compiling ${shown(NATIVE_DIR)}`, r.output);
    checkLibraryFile(tmp);
    const lib = dlopen(tmp, { tp_vk_abi_version: { args: [], returns: "i32" } });
    const version = lib.symbols.tp_vk_abi_version();
    lib.close();
    if (version !== TP_VK_ABI_VERSION) {
      throw new TpError(
        "E_INTERNAL",
        `built ABI version ${version}, src/ffi.ts expects ${TP_VK_ABI_VERSION}`,
      );
    }
    renameSync(tmp, LIBRARY);
  } finally {
    rmSync(tmp, { force: true });
  }
  return true;
}

/**
 * Kernel variants, in file-name order: a shader whose text (with its includes) tests `define` is also
 * compiled with it (src/kernels.ts KERNELS lists the same variants per kernel; a test checks both agree).
 */
const SHADER_VARIANTS = [
  { name: "subgroup", define: "TP_SUBGROUP" }, // subgroup arithmetic / shuffles in the reductions
  { name: "s16", define: "TP_STORAGE16" }, // 16-bit storage: f16 / bf16 weights read as uint16_t
] as const;

/** The text of a shader and, recursively, of the files it includes (`#include "x.glsl"`). */
function withIncludes(path: string, seen = new Set<string>()): string {
  if (seen.has(path)) return "";
  seen.add(path);
  const text = readFileSync(path, "utf8");
  const included = [...text.matchAll(/^\s*#include\s+"([^"]+)"/gm)].map((m) =>
    withIncludes(join(SHADER_DIR, m[1] as string), seen),
  );
  return [text, ...included].join("\n");
}

/** Compile every shader whose .spv is older than it, its includes or this script. */
async function buildShaders(glslang: string, force: boolean): Promise<number> {
  const shaders = listFiles(SHADER_DIR, ".comp");
  if (shaders.length === 0) throw new TpError("E_IO", `no shaders in ${shown(SHADER_DIR)}`);
  const includes = Math.max(...[import.meta.path, ...listFiles(SHADER_DIR, ".glsl")].map(mtime));
  const spirvVal = Bun.which("spirv-val");
  mkdirSync(SPV_DIR, { recursive: true });
  // A shader that tests a variant's macro (in its own text or an include) is also built with it
  // defined, once per combination: <name>.spv (the fallback, any Vulkan 1.1 device),
  // <name>.subgroup.spv, <name>.s16.spv, <name>.subgroup.s16.spv (src/kernels.ts picks one per device).
  const builds = shaders.flatMap((src) => {
    const name = basename(src, ".comp");
    const text = withIncludes(src);
    let outs = [{ src, out: name, defines: [] as string[] }];
    for (const v of SHADER_VARIANTS) {
      if (!text.includes(v.define)) continue;
      outs = outs.flatMap((b) => [
        b,
        { src, out: `${b.out}.${v.name}`, defines: [...b.defines, `-D${v.define}=1`] },
      ]);
    }
    return outs.map((b) => ({ ...b, out: `${b.out}.spv` }));
  });
  const stale = builds.filter(
    (b) => force || mtime(join(SPV_DIR, b.out)) <= Math.max(mtime(b.src), includes),
  );
  const results = await Promise.all(
    stale.map(async ({ src, out: file, defines }) => {
      const out = join(SPV_DIR, file);
      const tmp = `${out}.${process.pid}.tmp`;
      try {
        const r = await run([glslang, ...GLSL_FLAGS, ...defines, `-I${SHADER_DIR}`, "-o", tmp, src]);
        if (r.code !== 0) {
          process.stderr.write(r.output.endsWith("\n") ? r.output : `${r.output}\n`);
          return `compiling ${shown(src)} failed (glslangValidator output above)`;
        }
        if (spirvVal) {
          const v = await run([spirvVal, "--target-env", "vulkan1.1", tmp]);
          if (v.code !== 0) {
            process.stderr.write(v.output.endsWith("\n") ? v.output : `${v.output}\n`);
            return `spirv-val rejects ${shown(src)} (output above)`;
          }
        }
        renameSync(tmp, out);
        return null;
      } finally {
        rmSync(tmp, { force: true });
      }
    }),
  );
  const failed = results.filter((r) => r !== null);
  if (failed.length > 0) throw new TpError("E_INTERNAL", failed.join("; "));
  // Drop .spv files whose shader is gone, so the backend never loads a stale kernel.
  const names = new Set(builds.map((b) => b.out));
  for (const f of readdirSync(SPV_DIR)) if (f.endsWith(".spv") && !names.has(f)) rmSync(join(SPV_DIR, f));
  return stale.length;
}

async function main(): Promise<number> {
  const force = process.argv.includes("--force");
  const strict = process.argv.includes("--strict") || process.env.TP_VULKAN_REQUIRED === "1";
  mkdirSync(BUILD_DIR, { recursive: true });
  const onSignal = (signal: NodeJS.Signals) => {
    for (const child of children) child.kill();
    process.kill(process.pid, signal);
  };
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  const started = performance.now();
  try {
    const compiler = findCompiler();
    const glslang = findGlslang();
    for (const f of readdirSync(BUILD_DIR))
      if (f.endsWith(".tmp")) rmSync(join(BUILD_DIR, f), { force: true });
    // Both run to the end (each cleans up its temporary files) before a failure is reported.
    const [lib, spv] = await Promise.allSettled([
      buildLibrary(compiler, force),
      buildShaders(glslang, force),
    ]);
    if (lib.status === "rejected") throw lib.reason;
    if (spv.status === "rejected") throw spv.reason;
    const built = lib.value;
    const shaders = spv.value;
    rmSync(UNAVAILABLE, { force: true });
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    if (!built && shaders === 0) console.log(`${shown(LIBRARY)} and ${shown(SPV_DIR)} are up to date`);
    else
      console.log(
        `built ${built ? shown(LIBRARY) : "(library up to date)"} and ${shaders} shader${shaders === 1 ? "" : "s"} in ${seconds} s`,
      );
    return 0;
  } catch (e) {
    if (!(e instanceof MissingTool) || strict) throw e;
    // Nothing half-built stays behind: the backend reports the reason instead of loading old files.
    rmSync(LIBRARY, { force: true });
    rmSync(SPV_DIR, { recursive: true, force: true });
    writeFileSync(UNAVAILABLE, `${e.message}\n`);
    console.log(`vulkan backend not built (${formatErrorLine(e)}); the rest of the build goes on`);
    return 0;
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
  }
}

await runCli(main);
