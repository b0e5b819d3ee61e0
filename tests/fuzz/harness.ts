/**
 * The seeded mutation fuzzer of issue 21: mutated safetensors and GGUF files (tests/fuzz/mutate.ts)
 * driven through the readers, `inspect`, each pipeline's loaders with a short run on top (Krea 2's DiT
 * and VAE on the tiny fixtures of ../shared/testdata/krea2-tiny, `loadModel` + two greedy tokens on
 * the tiny GGUFs of ../shared/models), and — for a subset — the CLIs in child processes. Every case
 * must end in a valid result or one TpError (one line, no stack trace, not E_INTERNAL; the readers'
 * E_FORMAT names the file and offset), no signal, within a time bound, with the backend's memory back
 * where it was and no file left beside the input. `bun run fuzz N` runs N cases; the suite runs a
 * CI-sized number (tests/fuzz.test.ts).
 */
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { CpuBackend } from "@tp/backend-cpu";
import { decodeKrea2Latent, generateKrea2, loadKrea2, loadWanVae, writeConditioning } from "@tp/diffusion";
import {
  ggufKv,
  inspectCheckpoint,
  openGguf,
  openSafetensors,
  serializeGguf,
  serializeSafetensors,
} from "@tp/formats";
import { GenerationSession, loadModel } from "@tp/llm";
import { TpError } from "@tp/tensor";
import { GgufArray } from "../../packages/formats/src/gguf/array.ts";
import { type GgufSeed, type Mutated, mutateGguf, mutateSafetensors, parseGgufSeed, rng } from "./mutate.ts";

const ROOT = resolve(import.meta.dir, "../..");
const SHARED = resolve(ROOT, "../shared");
const KREA2 = join(SHARED, "testdata/krea2-tiny");
const DIT = join(KREA2, "checkpoints/krea2_tiny_bf16.safetensors");
const VAE = join(KREA2, "checkpoints/wan21_vae_tiny_f32.safetensors");
const CONTEXT = join(KREA2, "sampling/turbo_cfg1/context_pos.bin");
const GGUFS = ["qwen3-tiny-Q8_0.gguf", "llama-tiny-Q4_0.gguf"].map((f) =>
  join(SHARED, "models/synthetic", f),
);

/** Longest a single case may take (a hang shows as this, not as a stuck suite); generous for a loaded machine. */
export const CASE_LIMIT_MS = 20_000;
/** Most the process may grow over the run (a leak per case would pass it within a few hundred cases). */
export const RSS_LIMIT_BYTES = 1.5 * 2 ** 30;

/** A small seed with every dtype family the readers know (the reader fuzz of before). */
function safetensorsSeed(): Uint8Array {
  const bytes = (n: number, s: number) => Uint8Array.from({ length: n }, (_, i) => (i * 73 + s * 41) & 0xff);
  return serializeSafetensors(
    [
      { name: "model.embed_tokens.weight", dtype: "BF16", shape: [4, 8], data: bytes(64, 1) },
      { name: "blocks.0.attn.wq.weight", dtype: "I8", shape: [4, 4], data: bytes(16, 2) },
      {
        name: "blocks.0.attn.wq.weight_scale",
        dtype: "F32",
        shape: [4],
        data: new Uint8Array(Float32Array.of(1, 2, 3, 4).buffer),
      },
      { name: "blocks.0.mod.lin", dtype: "F8_E4M3", shape: [8], data: bytes(8, 4) },
      { name: "flag", dtype: "BOOL", shape: [3], data: new Uint8Array([0, 1, 1]) },
    ],
    { metadata: { format: "pt", note: "fuzz seed" } },
  );
}

function ggufSeed(): Uint8Array {
  const bytes = (n: number, s: number) => Uint8Array.from({ length: n }, (_, i) => (i * 73 + s * 41) & 0xff);
  const q8 = bytes(68, 5);
  q8.set([0, 0x3c], 0);
  q8.set([0, 0x3c], 34);
  return serializeGguf(
    [
      ggufKv("general.architecture", "str", "llama"),
      ggufKv("general.alignment", "u32", 32),
      ggufKv("llama.block_count", "u32", 1),
      ggufKv("llama.rope.freq_base", "f32", 10000),
      ggufKv("x.u64", "u64", 12345678901234n),
      ggufKv("x.bool", "bool", true),
      ggufKv("tokenizer.ggml.tokens", "arr", GgufArray.of("str", ["<unk>", "<s>", "</s>", "▁the", "ü"])),
      ggufKv("tokenizer.ggml.scores", "arr", GgufArray.of("f32", [0, -1, -2, -3, -4])),
      ggufKv(
        "x.nested",
        "arr",
        GgufArray.of("arr", [GgufArray.of("i32", [1, 2]), GgufArray.of("str", ["a"])]),
      ),
    ],
    [
      { name: "token_embd.weight", type: "q8_0", shape: [2, 32], data: q8 },
      {
        name: "blk.0.attn_norm.weight",
        type: "f32",
        shape: [32],
        data: new Uint8Array(new Float32Array(32).fill(1).buffer),
      },
      {
        name: "output.weight",
        type: "f16",
        shape: [2, 8],
        data: new Uint8Array(new Uint16Array(16).fill(0x3c00).buffer),
      },
    ],
  );
}

/** Read everything a loader would: headers, every tensor's bytes, every metadata value. */
function consume(path: string, kind: "safetensors" | "gguf"): void {
  if (kind === "safetensors") {
    const st = openSafetensors(path);
    try {
      for (const t of st.tensors) st.data(t.name);
    } finally {
      st.close();
    }
    return;
  }
  const g = openGguf(path);
  try {
    for (const t of g.tensors) g.data(t.name);
    const walk = (a: GgufArray): void => {
      for (const x of a) if (x instanceof GgufArray) walk(x);
    };
    for (const kv of g.metadata.entries.values()) if (kv.value instanceof GgufArray) walk(kv.value);
  } finally {
    g.close();
  }
}

/** What one surface of the fuzzer does with a mutated file. */
interface Surface {
  readonly name: string;
  /** Share of the cases (of N). */
  readonly weight: number;
  /** Why it cannot run here (a fixture missing), or undefined. */
  readonly missing?: string;
  readonly ext: string;
  /** A mutated copy of the seed. */
  mutate(r: () => number): Mutated;
  /** Run the surface on `path` (in `dir`); throws what the code under test throws. */
  exercise(path: string, dir: string): Promise<void> | void;
  /** A problem with a TpError that is otherwise clean (the readers must name file and offset). */
  checkError?(e: TpError, path: string): string | undefined;
  /** Files in `dir` besides the input that a successful run leaves on purpose. */
  readonly outputs?: readonly string[];
}

/** The figures of one surface. */
export interface SurfaceReport {
  readonly surface: string;
  cases: number;
  valid: number;
  cleanErrors: number;
  byCode: Record<string, number>;
  byMutation: Record<string, number>;
  crashes: number;
  filesLeft: number;
  leaks: number;
  slow: number;
  maxCaseMs: number;
  /** Seconds the surface took. */
  seconds: number;
  skipped?: string;
  /** The first few problems, for the failure message. */
  problems: string[];
}

function fileOf(path: string): Uint8Array {
  return new Uint8Array(readFileSync(path));
}

/** The surfaces, with their seeds read (those whose fixtures are absent say so and are skipped). */
function surfaces(backend: CpuBackend, work: string): Surface[] {
  const stSeed = safetensorsSeed();
  const ggSeed = ggufSeed();
  const ggSeedPath = join(work, "seed.gguf");
  writeFileSync(ggSeedPath, ggSeed);
  const ggParsed = parseGgufSeed(ggSeed, ggSeedPath);
  const readerError = (e: TpError, path: string): string | undefined =>
    (e.code === "E_FORMAT" && e.file === path && typeof e.offset === "number") ||
    (e.code === "E_FORMAT" && e.message.startsWith("unknown checkpoint layout"))
      ? undefined
      : `a reader error must be E_FORMAT naming the file and an offset: ${e.code} ${e.message}`;
  const list: Surface[] = [
    {
      name: "safetensors reader + inspect",
      weight: 0.46,
      ext: ".safetensors",
      mutate: (r) => mutateSafetensors(stSeed, r),
      exercise: (p) => {
        consume(p, "safetensors");
        inspectCheckpoint(p);
      },
      checkError: readerError,
    },
    {
      name: "gguf reader + inspect",
      weight: 0.46,
      ext: ".gguf",
      mutate: (r) => mutateGguf(ggParsed, r),
      exercise: (p) => {
        consume(p, "gguf");
        inspectCheckpoint(p);
      },
      checkError: readerError,
    },
  ];
  const haveKrea2 = [DIT, VAE, CONTEXT].every(existsSync);
  const krea2Missing = haveKrea2 ? undefined : `${KREA2} is absent`;
  const context = haveKrea2 ? new Float32Array(readFileSync(CONTEXT).buffer.slice(0)) : new Float32Array(0);
  const ditSeed = haveKrea2 ? fileOf(DIT) : new Uint8Array(0);
  const vaeSeed = haveKrea2 ? fileOf(VAE) : new Uint8Array(0);
  list.push(
    {
      name: "krea2 DiT loader + 1 step at 16×16",
      weight: 0.0125,
      ext: ".safetensors",
      ...(krea2Missing ? { missing: krea2Missing } : {}),
      mutate: (r) => mutateSafetensors(ditSeed, r),
      exercise: async (p) => {
        using dit = loadKrea2(p, { backend });
        using vae = loadWanVae(backend, VAE);
        const out = await generateKrea2({
          dit,
          vae,
          conditioning: { positive: { data: context, shape: [1, 7, 960] } },
          width: 16,
          height: 16,
          steps: 1,
          noiseKernel: "default",
        });
        if (out.rgb.length !== 16 * 16 * 3) throw new Error(`an image of ${out.rgb.length} bytes`);
      },
    },
    {
      name: "Wan VAE loader + decode",
      weight: 0.0125,
      ext: ".safetensors",
      ...(krea2Missing ? { missing: krea2Missing } : {}),
      mutate: (r) => mutateSafetensors(vaeSeed, r),
      exercise: async (p) => {
        using vae = loadWanVae(backend, p);
        const latent = {
          data: Float32Array.from({ length: 64 }, (_, i) => Math.sin(i)),
          shape: [1, 16, 1, 2, 2],
        };
        const out = await decodeKrea2Latent(vae, latent);
        if (out.rgb.length !== out.width * out.height * 3) throw new Error("a short image");
      },
    },
  );
  const haveGguf = GGUFS.every(existsSync);
  for (const g of GGUFS) {
    const seed = haveGguf ? parseGgufSeed(fileOf(g), g) : null;
    const base = g.split("/").pop() as string;
    list.push({
      name: `llm loadModel + 2 tokens (${base})`,
      weight: 0.0125,
      ext: ".gguf",
      ...(haveGguf ? {} : { missing: `${g} is absent` }),
      mutate: (r) => mutateGguf(seed as GgufSeed, r),
      exercise: async (p) => {
        const { model, tokenizer } = loadModel(p, { backend, maxContext: 32 });
        try {
          const session = new GenerationSession(model, tokenizer, { seed: 1 });
          await session.generate([1, 2, 3], { sampling: { temperature: 0 }, maxNewTokens: 2 });
        } finally {
          model.dispose();
        }
      },
    });
  }
  // The CLIs as a user runs them: exit 0, or one `error E_…` line on stderr and exit 1 / 2; no signal.
  const cli = (args: (p: string, dir: string) => string[], entry: string) => (p: string, dir: string) => {
    const r = Bun.spawnSync([process.execPath, join(ROOT, entry), ...args(p, dir)], {
      stdout: "pipe",
      stderr: "pipe",
      env: { ...process.env, TP_DEBUG: "" },
    });
    const err = r.stderr.toString().trim();
    if (r.signalCode) throw new Error(`killed by ${r.signalCode}: ${err.slice(0, 400)}`);
    if (r.exitCode === 0) return;
    const lines = err
      .split("\n")
      .filter((l) => l.trim() !== "" && !l.startsWith("notice") && !l.includes("%"));
    const last = lines[lines.length - 1] ?? "";
    const m = /^error (E_[A-Z]+): /.exec(last);
    if (!m || lines.some((l) => /^\s+at /.test(l)) || (r.exitCode !== 1 && r.exitCode !== 2)) {
      throw new Error(`exit ${r.exitCode}, stderr not one error line: ${err.slice(0, 400)}`);
    }
    throw new TpError(m[1] as never, last.slice(m[0].length));
  };
  const llmSeed = haveGguf ? parseGgufSeed(fileOf(GGUFS[0] as string), GGUFS[0] as string) : null;
  const condPath = join(work, "cond.safetensors");
  if (haveKrea2) writeConditioning(condPath, { positive: { data: context, shape: [1, 7, 960] } });
  list.push(
    {
      name: "cli inspect (child process)",
      weight: 0.0005,
      ext: ".safetensors",
      ...(krea2Missing ? { missing: krea2Missing } : {}),
      mutate: (r) => mutateSafetensors(ditSeed, r),
      exercise: cli((p) => ["inspect", p], "apps/cli/index.ts"),
    },
    {
      name: "cli generate (child process)",
      weight: 0.0005,
      ext: ".safetensors",
      ...(krea2Missing ? { missing: krea2Missing } : {}),
      mutate: (r) => mutateSafetensors(ditSeed, r),
      exercise: cli(
        (p, dir) => [
          "generate",
          ...["--dit", p, "--vae", VAE, "--cond-in", condPath, "--width", "16", "--height", "16"],
          ...["--steps", "1", "--threads", "2", "--out", join(dir, "out.png")],
        ],
        "apps/cli/index.ts",
      ),
      outputs: ["out.png"],
    },
    {
      name: "cli quantize (child process)",
      weight: 0.0005,
      ext: ".safetensors",
      ...(krea2Missing ? { missing: krea2Missing } : {}),
      mutate: (r) => mutateSafetensors(ditSeed, r),
      exercise: cli(
        (p, dir) => ["quantize", "--format", "int8-convrot", p, join(dir, "q.safetensors")],
        "apps/cli/index.ts",
      ),
      outputs: ["q.safetensors"],
    },
    {
      name: "apps/llm (child process)",
      weight: 0.0005,
      ext: ".gguf",
      ...(haveGguf ? {} : { missing: `${GGUFS[0]} is absent` }),
      mutate: (r) => mutateGguf(llmSeed as GgufSeed, r),
      exercise: cli(
        (p) => ["-m", p, "-p", "Once", "-n", "2", "--temp", "0", "--threads", "2"],
        "apps/llm/index.ts",
      ),
    },
  );
  return list;
}

/** Options of {@link runFuzz}. */
export interface FuzzOptions {
  /** Cases over all surfaces, split by their weights (each runnable surface gets at least one). */
  readonly cases: number;
  /** Base seed: the same seed gives the same files. */
  readonly seed?: number;
  /** Only the surfaces whose name contains this (the same seeds and cases as a full run). */
  readonly only?: string;
  /** Called after each surface. */
  readonly onSurface?: (r: SurfaceReport) => void;
}

/**
 * Run the fuzzer (see the module comment).
 * @returns one report per surface, and the largest RSS growth seen
 */
export async function runFuzz(
  options: FuzzOptions,
): Promise<{ reports: SurfaceReport[]; rssGrowth: number }> {
  const base = existsSync("/dev/shm") ? "/dev/shm" : tmpdir(); // many small files: tmpfs when there is one
  const work = mkdtempSync(join(base, "tp-fuzz-"));
  const backend = new CpuBackend({ threads: 2 });
  const reports: SurfaceReport[] = [];
  const rss0 = process.memoryUsage().rss;
  let rssGrowth = 0;
  try {
    const list = surfaces(backend, work);
    for (const [s, surface] of list.entries()) {
      const report: SurfaceReport = {
        surface: surface.name,
        cases: 0,
        valid: 0,
        cleanErrors: 0,
        byCode: {},
        byMutation: {},
        crashes: 0,
        filesLeft: 0,
        leaks: 0,
        slow: 0,
        maxCaseMs: 0,
        seconds: 0,
        problems: [],
      };
      const tSurface = performance.now();
      reports.push(report);
      if (options.only !== undefined && !surface.name.includes(options.only)) continue;
      if (surface.missing) {
        report.skipped = surface.missing;
        options.onSurface?.(report);
        continue;
      }
      const n = Math.max(1, Math.round(options.cases * surface.weight));
      const r = rng((options.seed ?? 21) * 1000 + s);
      const dir = join(work, `s${s}`);
      mkdirSync(dir);
      for (let i = 0; i < n; i++) {
        const m = surface.mutate(r);
        const path = join(dir, `case${surface.ext}`);
        writeFileSync(path, m.bytes);
        report.cases++;
        report.byMutation[m.kind] = (report.byMutation[m.kind] ?? 0) + 1;
        const mem0 = backend.memory.current;
        const t0 = performance.now();
        const problem = (what: string) => {
          if (report.problems.length < 5) report.problems.push(`case ${i} (${m.kind}): ${what}`);
        };
        try {
          await surface.exercise(path, dir);
          report.valid++;
        } catch (e) {
          if (e instanceof TpError && e.code !== "E_INTERNAL" && !e.message.includes("\n")) {
            const bad = surface.checkError?.(e, path);
            if (bad) {
              report.crashes++;
              problem(bad);
            } else {
              report.cleanErrors++;
              report.byCode[e.code] = (report.byCode[e.code] ?? 0) + 1;
            }
          } else {
            report.crashes++;
            problem(e instanceof Error ? `${e.name}: ${e.message.slice(0, 300)}` : String(e));
          }
        }
        const ms = performance.now() - t0;
        report.maxCaseMs = Math.max(report.maxCaseMs, ms);
        if (ms > CASE_LIMIT_MS) {
          report.slow++;
          problem(`took ${ms.toFixed(0)} ms`);
        }
        if (backend.memory.current !== mem0) {
          report.leaks++;
          problem(`${backend.memory.current - mem0} bytes of backend memory left allocated`);
        }
        const left = readdirSync(dir).filter(
          (f) => f !== `case${surface.ext}` && !surface.outputs?.includes(f),
        );
        if (left.length > 0) {
          report.filesLeft += left.length;
          problem(`left ${left.join(", ")}`);
        }
        for (const f of readdirSync(dir)) rmSync(join(dir, f), { force: true });
        rssGrowth = Math.max(rssGrowth, process.memoryUsage().rss - rss0);
      }
      report.seconds = (performance.now() - tSurface) / 1000;
      options.onSurface?.(report);
    }
  } finally {
    backend.dispose();
    rmSync(work, { recursive: true, force: true });
  }
  return { reports, rssGrowth };
}

/** One line per surface: cases, valid, clean errors (by code), crashes, files left. */
export function formatReport(r: SurfaceReport): string {
  if (r.skipped) return `${r.surface}: skipped (${r.skipped})`;
  const codes = Object.entries(r.byCode)
    .sort((a, b) => b[1] - a[1])
    .map(([c, k]) => `${c} ${k}`)
    .join(", ");
  return `${r.surface}: ${r.cases} cases, ${r.valid} valid, ${r.cleanErrors} clean errors (${codes}), ${r.crashes} crashes, ${r.filesLeft} files left, ${r.leaks} leaks, ${r.slow} slow (max ${r.maxCaseMs.toFixed(0)} ms); ${r.seconds.toFixed(1)} s`;
}

// `bun tests/fuzz/harness.ts N [SEED [SURFACE]]` (the root `bun run fuzz N`): N cases, figures per
// surface; SURFACE (a part of a surface's name) runs that surface's cases of the full run only.
if (import.meta.main) {
  const n = Number(process.argv[2] ?? 20000);
  const seed = Number(process.argv[3] ?? 21);
  if (!Number.isSafeInteger(n) || n < 1) {
    console.error(`error E_ARG: N must be a positive whole number of cases, got ${process.argv[2]}`);
    process.exit(2);
  }
  const t0 = performance.now();
  const only = process.argv[4];
  const { reports, rssGrowth } = await runFuzz({
    cases: n,
    seed,
    ...(only !== undefined ? { only } : {}),
    onSurface: (r) => console.log(formatReport(r)),
  });
  const bad = reports.reduce((a, r) => a + r.crashes + r.filesLeft + r.leaks + r.slow, 0);
  console.log(
    `${reports.reduce((a, r) => a + r.cases, 0)} cases in ${((performance.now() - t0) / 1000).toFixed(1)} s (seed ${seed}); RSS grew ${(rssGrowth / 2 ** 20).toFixed(0)} MiB at most`,
  );
  for (const r of reports) for (const p of r.problems) console.log(`  ${r.surface}: ${p}`);
  process.exit(bad === 0 && rssGrowth < RSS_LIMIT_BYTES ? 0 : 1);
}
