// The workspace's promises, checked from the outside: every package is importable on its own (a
// throwaway project outside the repository adds @tp/tensor by path, imports it and type-checks against
// it), exports point at files with types, dependencies only point down, and no package reaches into a
// sibling's internals.
import { describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

const root = resolve(import.meta.dir, "..");
const packageDirs = readdirSync(join(root, "packages")).map((d) => join(root, "packages", d));
const appDirs = readdirSync(join(root, "apps")).map((d) => join(root, "apps", d));
const manifest = (dir: string) => JSON.parse(readFileSync(join(dir, "package.json"), "utf8"));

/**
 * Layer of each package: a package may depend only on lower layers (ARCHITECTURE.md, "Layout"). @tp/quant
 * reads checkpoints and writes caches through @tp/formats, so it sits above it; backends may use
 * @tp/quant's reference codecs.
 */
function layer(name: string): number {
  if (name === "@tp/tensor") return 0;
  if (name === "@tp/formats") return 1;
  if (["@tp/quant", "@tp/tokenizer"].includes(name)) return 2; // both read model files through formats
  // the cuda backend is the PTX backend with cuBLASLt / cuDNN products: it builds on its driver and kernels
  if (name === "@tp/backend-cudalibs") return 3.5;
  if (name.startsWith("@tp/backend-")) return 3;
  if (["@tp/llm", "@tp/conformance"].includes(name)) return 4; // conformance runs the backends
  if (name === "@tp/diffusion") return 5; // its text encoders are @tp/llm's decoders (krea2.md §2.3)
  if (name.startsWith("@tp/app-")) return 6;
  throw new Error(`no layer for ${name}`);
}

/** `@tp/pkg/sub` that `pkg`'s package.json `exports` declares as `./sub` (a public entry, not internals). */
function declaredSubpath(spec: string): boolean {
  const m = /^(@tp\/[^/]+)\/(.+)$/.exec(spec);
  const dir = m && packageDirs.find((d) => manifest(d).name === m[1]);
  return dir !== undefined && dir !== null && Object.hasOwn(manifest(dir).exports ?? {}, `./${m?.[2]}`);
}

function sourceFiles(dir: string): string[] {
  const out: string[] = [];
  for (const e of readdirSync(dir, { withFileTypes: true, recursive: true })) {
    if (e.isFile() && e.name.endsWith(".ts") && !/\/(node_modules|build)(\/|$)/.test(e.parentPath))
      out.push(join(e.parentPath, e.name));
  }
  return out;
}

function install(dir: string): void {
  const r = Bun.spawnSync(["bun", "install", "--no-progress"], { cwd: dir, stderr: "pipe", stdout: "pipe" });
  expect(r.stderr.toString()).not.toContain("error");
  expect(r.exitCode).toBe(0);
}

function runIn(dir: string, file: string): string {
  const r = Bun.spawnSync(["bun", file], { cwd: dir, stderr: "pipe", stdout: "pipe" });
  expect(r.stderr.toString()).toBe("");
  expect(r.exitCode).toBe(0);
  return r.stdout.toString();
}

describe("packages", () => {
  test("every package named in ARCHITECTURE.md exists with a README and typed exports", () => {
    const names = packageDirs.map((d) => manifest(d).name).sort();
    expect(names).toEqual(
      [
        "@tp/backend-cpu",
        "@tp/backend-cudalibs",
        "@tp/backend-ptx",
        "@tp/backend-vulkan",
        "@tp/conformance",
        "@tp/diffusion",
        "@tp/formats",
        "@tp/llm",
        "@tp/quant",
        "@tp/tensor",
        "@tp/tokenizer",
      ].sort(),
    );
    for (const dir of packageDirs) {
      const m = manifest(dir);
      expect(existsSync(join(dir, "README.md")) ? "ok" : `${dir} has no README.md`).toBe("ok");
      expect(m.type).toBe("module");
      const exp = m.exports["."];
      expect(existsSync(join(dir, exp.types))).toBe(true);
      expect(existsSync(join(dir, exp.default))).toBe(true);
    }
    for (const dir of appDirs) expect(manifest(dir).private).toBe(true);
  });

  test("dependencies point down and imports use package names, never a sibling's files", () => {
    for (const dir of [...packageDirs, ...appDirs]) {
      const m = manifest(dir);
      const deps = Object.keys(m.dependencies ?? {});
      const devDeps = Object.keys(m.devDependencies ?? {});
      for (const d of deps.filter((x) => x.startsWith("@tp/"))) {
        if (!m.name.startsWith("@tp/app-"))
          expect(`${m.name} → ${d}: ${layer(d) < layer(m.name)}`).toBe(`${m.name} → ${d}: true`);
      }
      if (m.name === "@tp/llm" || m.name === "@tp/diffusion") {
        expect(deps.filter((d) => d.startsWith("@tp/backend-"))).toEqual([]);
      }
      for (const file of sourceFiles(dir)) {
        const text = readFileSync(file, "utf8");
        for (const [, spec] of text.matchAll(/(?:from|import\()\s*["']([^"']+)["']/g)) {
          const s = spec as string;
          const where = `${file}: ${s}`;
          expect(
            s.startsWith("../../") || (/^@tp\/[^/]+\/.+/.test(s) && !declaredSubpath(s))
              ? `sibling internals: ${where}`
              : "ok",
          ).toBe("ok");
          const pkg = s.match(/^@tp\/[^/]+/)?.[0];
          // Tests, benches, test helpers and dev scripts (bench/, scripts/: not published) may also use devDependencies.
          const testOnly = /\.(test|bench)\.ts$|\/(testing|bench|scripts)\//.test(file);
          const allowed = testOnly ? [...deps, ...devDeps] : deps;
          if (pkg && pkg !== m.name)
            expect(allowed.includes(pkg) ? "declared" : `undeclared: ${where}`).toBe("declared");
        }
      }
    }
  });

  test("a throwaway project outside the repo adds @tp/tensor by path, imports it and type-checks", () => {
    const dir = mkdtempSync(join(tmpdir(), "tp-consumer-"));
    try {
      writeFileSync(
        join(dir, "package.json"),
        JSON.stringify({
          name: "consumer",
          private: true,
          type: "module",
          dependencies: { "@tp/tensor": `file:${join(root, "packages/tensor")}` },
        }),
      );
      writeFileSync(
        join(dir, "main.ts"),
        `import { numel, f32ToF16, TpError, weightBytes } from "@tp/tensor";
const n: number = numel([2, 3, 4]);
let code = "";
try { numel([-1]); } catch (e) { if (e instanceof TpError) code = e.code; }
console.log(JSON.stringify({ n, half: f32ToF16(1.5).toString(16), code, q4k: weightBytes("q4_k", [2, 256]) }));
`,
      );
      writeFileSync(
        join(dir, "tsconfig.json"),
        JSON.stringify({
          compilerOptions: {
            strict: true,
            module: "Preserve",
            moduleResolution: "bundler",
            target: "ESNext",
            noEmit: true,
            allowImportingTsExtensions: true,
            typeRoots: [join(root, "node_modules/@types")],
            types: ["bun"],
          },
          files: ["main.ts"],
        }),
      );
      install(dir);
      expect(JSON.parse(runIn(dir, "main.ts"))).toEqual({ n: 24, half: "3e00", code: "E_SHAPE", q4k: 288 });
      const tsc = Bun.spawnSync([join(root, "node_modules/.bin/tsc"), "-p", "tsconfig.json"], {
        cwd: dir,
        stderr: "pipe",
        stdout: "pipe",
      });
      expect(tsc.stdout.toString() + tsc.stderr.toString()).toBe("");
      expect(tsc.exitCode).toBe(0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000); // bun install + tsc in a child: seconds on a loaded 2-core machine

  test("a throwaway project adds @tp/tensor and @tp/backend-cpu by path and runs the README example", () => {
    // The recipe of packages/tensor/README.md: both packages by path, and an override so that
    // backend-cpu's "workspace:*" dependency on @tp/tensor resolves to the same copy.
    const dir = mkdtempSync(join(tmpdir(), "tp-consumer-"));
    const tensor = `file:${join(root, "packages/tensor")}`;
    try {
      writeFileSync(
        join(dir, "package.json"),
        JSON.stringify({
          name: "consumer",
          private: true,
          type: "module",
          dependencies: {
            "@tp/tensor": tensor,
            "@tp/backend-cpu": `file:${join(root, "packages/backend-cpu")}`,
          },
          overrides: { "@tp/tensor": tensor },
        }),
      );
      writeFileSync(
        join(dir, "main.ts"),
        `import { loadBackend } from "@tp/tensor";
const cpu = await loadBackend("cpu", { threads: 2, memoryBudget: 2 ** 20 });
const x = cpu.upload(new Float32Array([1, 2, 3, 4, 5, 6]), [2, 3], "f32", "x");
const t = await cpu.read(x.transpose(0, 1));
console.log(JSON.stringify({ t: Array.from(t as Float32Array), stats: cpu.memory.stats() }));
`,
      );
      install(dir);
      const out = JSON.parse(runIn(dir, "main.ts"));
      expect(out.t).toEqual([1, 4, 2, 5, 3, 6]);
      expect(out.stats).toEqual({ owner: "cpu", current: 24, peak: 24, budget: 2 ** 20, allocations: 1 });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000); // bun install + tsc in a child: seconds on a loaded 2-core machine
});
