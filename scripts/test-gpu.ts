/**
 * `bun run test:gpu`: the one script the offline NVIDIA host runs (../shared/GPU.md). In one call it
 * 0. finds PyTorch's NVIDIA wheels (python3: nvidia/cublas, nvidia/cudnn) and points TP_CUDA_LIB_DIR,
 *    LD_LIBRARY_PATH and TP_CUDA_INCLUDE_DIR at their lib / include folders (kept when already set);
 * 1. starts the ptx and cuda backends and records each device (or why it cannot start);
 * 2. runs the shared conformance suite on ptx and on cuda (each case against the suite's independent
 *    references, the same cases the cpu backend passes) and both packages' own tests (ptxas, driver
 *    layer; cuBLASLt plans, the C probe of cublasLt.h / cudnn.h against the TS constants); then, on
 *    ptx and on cuda, the Krea 2 tiny goldens (../shared/testdata/krea2-tiny: every DiT mode, ConvRot
 *    linears bit for bit as the cpu backend, the Wan VAE decode, the turbo_cfg1 run) and the LLM
 *    parity files (../shared/models: greedy tokens and probabilities vs the cpu backend) — the
 *    definitions vulkan.test.ts and ptx-sim.test.ts run, through each package's gpu.test.ts with
 *    TP_GPU_GOLDENS set to the backend;
 * 3. times matmul GEMV for decode-shaped weights (Qwen3-8B's [12288, 4096] in Q8_0, Q4_0, f16) and
 *    reports the fraction of the HBM bandwidth reached; and prefill-shaped GEMMs (4096 tokens ×
 *    [4096, 4096] in bf16, INT8 ConvRot and fp8 e4m3 — on cuda as W8A8, its opt-in) on ptx and cuda side
 *    by side (TFLOP/s, and the NMSE of cuda's output against ptx's);
 * 4. runs f16 / bf16 attention and f32 / f16 conv2d on cuda (cuDNN) and ptx side by side (ms, NMSE of
 *    cuda's output against ptx's, and which shapes cuDNN took or refused);
 * 5. runs `bun run bench gpu` (packages/diffusion/bench/gpu.bench.ts: Krea 2 1024² s/step per format
 *    and Qwen3-shaped LLM decode tok/s / HBM fraction on ptx and cuda against PyTorch bf16 on CUDA),
 *    bounded by TP_GPU_BENCH_TIMEOUT_S (default the step timeout), its rows (bench-results/gpu.json)
 *    copied into the summary as `benchGpu.rows` and beside it as bench-gpu.json, its log as bench-gpu.log
 *    (each measurement is logged as it is taken, so a run cut short still says what it had);
 * and writes summary.json (plus the JUnit files and logs) into $TP_GPU_OUT, else ./gpu-out.
 * Not yet here: the whole LLM decode loop through @tp/llm on the GPU (bench gpu times the matmul work
 * of a token); the summary lists it under `notRun`.
 *
 * Usage: TP_GPU_OUT=$OUT bun run test:gpu   (TP_GPU_STEP_TIMEOUT_S bounds each test step; default 240;
 * TP_GPU_SKIP_TESTS=1 leaves out step 2, for a run of the timings alone)
 */
import { copyFileSync, existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { type BackendOptions, loadBackend, type Tensor, Weight, weightBytes } from "@tp/tensor";

const out = resolve(process.env.TP_GPU_OUT ?? "gpu-out");
mkdirSync(out, { recursive: true });
const stepTimeout = Number(process.env.TP_GPU_STEP_TIMEOUT_S ?? 240);
const summary: Record<string, unknown> = {
  started: new Date().toISOString(),
};

/** Counts and failures of a JUnit file written by bun test. */
function junit(
  file: string,
  only: (suite: string, name: string) => boolean = () => true,
): { tests: number; passed: number; failures: number; skipped: number; failed: string[] } {
  let xml = "";
  try {
    xml = readFileSync(file, "utf8");
  } catch {
    return { tests: 0, passed: 0, failures: 0, skipped: 0, failed: [`no report at ${file}`] };
  }
  const attr = (a: string, key: string) => new RegExp(`${key}="([^"]*)"`).exec(a)?.[1] ?? "";
  const cases = [...xml.matchAll(/<testcase\b([^>]*?)(\/>|>([\s\S]*?)<\/testcase>)/g)].filter((c) =>
    only(attr(c[1] ?? "", "classname"), attr(c[1] ?? "", "name")),
  );
  const failed: string[] = [];
  let skipped = 0;
  for (const c of cases) {
    const body = c[3] ?? "";
    const name = /name="([^"]*)"/.exec(c[1] ?? "")?.[1] ?? "?";
    if (/<skipped/.test(body)) skipped++;
    const f = /<failure\b[^>]*?(?:message="([^"]*)")?/.exec(body);
    if (f) failed.push(`${name}: ${(f[1] ?? "").slice(0, 400)}`);
  }
  return {
    tests: cases.length,
    passed: cases.length - skipped - failed.length,
    failures: failed.length,
    skipped,
    failed: failed.slice(0, 200),
  };
}

/**
 * Run `bun test` on files with a name pattern, a JUnit report and a time limit; `env` adds variables
 * to this process's environment for the child.
 */
function bunTest(
  label: string,
  args: string[],
  only?: (suite: string, name: string) => boolean,
  env: Record<string, string> = {},
): unknown {
  const report = join(out, `${label}.junit.xml`);
  const t0 = performance.now();
  const r = Bun.spawnSync(
    [
      "timeout",
      String(stepTimeout),
      process.execPath,
      "test",
      "--timeout",
      "120000",
      "--reporter=junit",
      `--reporter-outfile=${report}`,
      ...args,
    ],
    { stdout: "pipe", stderr: "pipe", env: { ...process.env, ...env } },
  );
  writeFileSync(join(out, `${label}.log`), `${r.stdout.toString()}\n${r.stderr.toString()}`);
  return { exitCode: r.exitCode, seconds: (performance.now() - t0) / 1000, ...junit(report, only) };
}

// 0. the NVIDIA wheels' libraries and headers (cuBLASLt, cuDNN) for the cuda backend and its C probe
{
  const py = Bun.spawnSync(["python3", "-c", "import nvidia, os; print(list(nvidia.__path__)[0])"], {
    stderr: "pipe",
  });
  const root = py.exitCode === 0 ? py.stdout.toString().trim() : "";
  const found = (sub: string[]) => (root === "" ? [] : sub.map((s) => join(root, s)).filter(existsSync));
  const libs = found(["cublas/lib", "cudnn/lib", "cuda_runtime/lib", "cuda_nvrtc/lib"]);
  const includes = found(["cublas/include", "cudnn/include", "cuda_runtime/include"]);
  const join2 = (a: string | undefined, b: string[]) => [...(a ? [a] : []), ...b].join(":");
  if (process.env.TP_CUDA_LIB_DIR === undefined && libs.length > 0)
    process.env.TP_CUDA_LIB_DIR = libs.join(":");
  if (libs.length > 0) process.env.LD_LIBRARY_PATH = join2(process.env.LD_LIBRARY_PATH, libs);
  if (process.env.TP_CUDA_INCLUDE_DIR === undefined)
    process.env.TP_CUDA_INCLUDE_DIR = [...includes, "/usr/local/cuda/include"].join(":");
  summary.nvidiaWheels = {
    root: root || null,
    why: root === "" ? py.stderr.toString().trim().split("\n").at(-1) : undefined,
    TP_CUDA_LIB_DIR: process.env.TP_CUDA_LIB_DIR,
    TP_CUDA_INCLUDE_DIR: process.env.TP_CUDA_INCLUDE_DIR,
  };
}

// 1. the backends
const devices: Record<string, string | null> = {};
const backends: Record<string, unknown> = {};
for (const name of ["ptx", "cuda"] as const) {
  try {
    const b = await loadBackend(name);
    devices[name] = b.device;
    backends[name] = { ok: true, device: b.device, capabilities: b.capabilities() };
    b.dispose();
  } catch (e) {
    devices[name] = null;
    backends[name] = { ok: false, reason: e instanceof Error ? e.message : String(e) };
  }
  process.stdout.write(`${name}: ${devices[name] ?? (backends[name] as { reason: string }).reason}\n`);
}
summary.backend = backends.ptx;
summary.cudaBackend = backends.cuda;
const device = devices.ptx ?? null;

// 2. conformance on ptx (its describe block is labelled "ptx"), then the package's tests
if (process.env.TP_GPU_SKIP_TESTS === "1") {
  summary.testsSkipped = "TP_GPU_SKIP_TESTS=1";
} else {
  summary.conformance = bunTest(
    "conformance-ptx",
    ["packages/conformance/src/conformance.test.ts", "-t", "ptx"],
    (suite, name) => suite === "ptx" || name.startsWith("ptx:"),
  );
  summary.ptxPackage = bunTest("backend-ptx", ["packages/backend-ptx/src"]);
  summary.conformanceCuda = bunTest(
    "conformance-cuda",
    ["packages/conformance/src/conformance.test.ts", "-t", "cuda"],
    (suite, name) => suite === "cuda" || name.startsWith("cuda:"),
  );
  summary.cudaPackage = bunTest("backend-cudalibs", ["packages/backend-cudalibs/src"]);
}

// 2b. whole models on each backend: the Krea 2 tiny goldens and the LLM parity files (gpu.test.ts runs
// the shared definitions for the backends TP_GPU_GOLDENS names; without a device they are skipped
// with its reason, which the JUnit file records)
summary.krea2Goldens = {};
summary.llmParity = {};
for (const name of ["ptx", "cuda"] as const) {
  (summary.krea2Goldens as Record<string, unknown>)[name] = bunTest(
    `krea2-goldens-${name}`,
    ["packages/diffusion/src/gpu.test.ts"],
    undefined,
    { TP_GPU_GOLDENS: name },
  );
  (summary.llmParity as Record<string, unknown>)[name] = bunTest(
    `llm-parity-${name}`,
    ["packages/llm/src/gpu.test.ts"],
    undefined,
    { TP_GPU_GOLDENS: name },
  );
}

// 3. decode GEMV bandwidth (random bytes with finite f16 block scales; timing only)
const HBM_BYTES_PER_S: Record<string, number> = {
  H200: 4.8e12,
  H100: 3.35e12,
  A100: 2.0e12,
  "RTX 3090": 0.936e12,
};
if (device !== null) {
  const bench: unknown[] = [];
  const b = await loadBackend("ptx");
  const peak = Object.entries(HBM_BYTES_PER_S).find(([k]) => device?.includes(k))?.[1] ?? null;
  for (const format of ["q8_0", "q4_0", "f16"] as const) {
    const [n, k] = [12288, 4096];
    const data = new Uint8Array(weightBytes(format, [n, k]));
    for (let i = 0; i < data.length; i++) data[i] = (i * 2654435761) >>> 24;
    if (format !== "f16") {
      const block = format === "q8_0" ? 34 : 18;
      for (let at = 0; at < data.length; at += block) {
        data[at] = 0x00;
        data[at + 1] = 0x20; // f16 0x2000 = 2^-7
      }
    } else for (let i = 1; i < data.length; i += 2) data[i] = (data[i] as number) & 0x3b; // finite, |w| < 1
    const w = new Weight({ name: `bench.${format}`, format, shape: [n, k], data });
    const x = b.upload(new Float32Array(k).fill(0.01), [1, k], "f32");
    (b as { makeResident?: (w: Weight) => void }).makeResident?.(w);
    const run = () => b.scope(() => void b.matmul(x, w));
    run();
    await b.synchronize();
    const iters = 50;
    const t0 = performance.now();
    for (let i = 0; i < iters; i++) run();
    await b.synchronize();
    const s = (performance.now() - t0) / 1000 / iters;
    const bytesPerS = data.byteLength / s;
    bench.push({
      op: "matmul gemv",
      format,
      shape: [n, k],
      ms: s * 1000,
      gbPerS: bytesPerS / 1e9,
      hbmFraction: peak === null ? null : bytesPerS / peak,
    });
  }
  b.dispose();
  summary.bench = bench;
}

// 4. prefill GEMM: 4096 tokens × [4096, 4096], bf16, INT8 ConvRot and fp8, ptx and cuda side by side
{
  const gemm: unknown[] = [];
  const [m, n, k] = [4096, 4096, 4096];
  const x = new Float32Array(m * k);
  for (let i = 0; i < x.length; i++) x[i] = (((i * 2654435761) >>> 20) % 255) / 255 - 0.5;
  const weights = [
    (() => {
      const data = new Uint8Array(weightBytes("bf16", [n, k]));
      for (let i = 0; i < data.length; i += 2) {
        data[i] = (i * 7) & 0xff;
        data[i + 1] = 0x3c | ((i >> 1) & 0x80); // bf16 ±[2^-7, 2^-6): finite, small
      }
      return new Weight({ name: "bench.bf16", format: "bf16", shape: [n, k], data });
    })(),
    (() => {
      const data = new Uint8Array(n * k);
      for (let i = 0; i < data.length; i++) data[i] = (i * 2654435761) >>> 24;
      return new Weight({
        name: "bench.int8_convrot",
        format: "int8_convrot",
        shape: [n, k],
        data,
        scale: { kind: "row", values: new Float32Array(n).fill(1 / 127) },
        rotationGroup: 256,
      });
    })(),
    (() => {
      // fp8 e4m3 with a tensor scale; on cuda as W8A8 through cuBLASLt (the opt-in), on ptx weight-only
      const data = new Uint8Array(n * k);
      for (let i = 0; i < data.length; i++) data[i] = ((i * 2654435761) >>> 24) & 0xb7; // exponent < 15: finite
      return new Weight({
        name: "bench.f8_e4m3fn",
        format: "f8_e4m3fn",
        shape: [n, k],
        data,
        scale: { kind: "tensor", value: 0.01 },
      });
    })(),
  ];
  const outputs = new Map<string, Float32Array>();
  for (const name of ["ptx", "cuda"] as const) {
    if (devices[name] === null) continue;
    const b = await loadBackend(name, name === "cuda" ? ({ fp8Activations: true } as BackendOptions) : {});
    try {
      const xt = b.upload(x, [m, k], "f32");
      for (const w of weights) {
        (b as { makeResident?: (w: Weight) => void }).makeResident?.(w);
        const run = () => b.scope(() => void b.matmul(xt, w));
        run();
        await b.synchronize();
        const iters = 10;
        const t0 = performance.now();
        for (let i = 0; i < iters; i++) run();
        await b.synchronize();
        const s = (performance.now() - t0) / 1000 / iters;
        const tflops = (2 * m * n * k) / s / 1e12;
        // the same product on both backends: cuda's output against ptx's (NMSE)
        const t = b.matmul(xt, w);
        const y = (await b.read(t)) as Float32Array;
        b.free(t);
        const ref = outputs.get(w.format);
        if (ref === undefined) outputs.set(w.format, y);
        let num = 0;
        let den = 0;
        if (ref !== undefined)
          for (let i = 0; i < y.length; i++) {
            num += ((y[i] as number) - (ref[i] as number)) ** 2;
            den += (ref[i] as number) ** 2;
          }
        const nmseVsPtx = ref === undefined ? null : num / Math.max(den, 1e-30);
        gemm.push({
          backend: name,
          op: "matmul gemm",
          format: w.format,
          shape: [m, n, k],
          ms: s * 1000,
          tflops,
          nmseVsPtx,
        });
      }
    } catch (e) {
      gemm.push({ backend: name, op: "matmul gemm", error: e instanceof Error ? e.message : String(e) });
    } finally {
      b.dispose();
    }
  }
  summary.gemm = gemm;
}

// 5. cuDNN through cuda (attention f16 / bf16 with grouped heads and a causal mask; conv2d f32 / f16)
//    against ptx on the same rounded inputs (ptx runs them in f32), timed; cuda's plan cache says
//    whether cuDNN took each shape (and why not when it did not)
{
  const rows: unknown[] = [];
  const values = (n: number, seed: number) => {
    const a = new Float32Array(n);
    for (let i = 0; i < n; i++) a[i] = ((((i + seed * 7919) * 2654435761) >>> 20) % 255) / 255 - 0.5;
    return a;
  };
  type Case = { op: "attention" | "conv2d"; dtype: "f32" | "f16" | "bf16"; shapes: number[][] };
  const cases: Case[] = [
    {
      op: "attention",
      dtype: "f16",
      shapes: [
        [1, 16, 1024, 128],
        [1, 4, 1024, 128],
      ],
    },
    {
      op: "attention",
      dtype: "bf16",
      shapes: [
        [1, 16, 1024, 128],
        [1, 4, 1024, 128],
      ],
    },
    {
      op: "conv2d",
      dtype: "f32",
      shapes: [
        [1, 128, 128, 128],
        [128, 128, 3, 3],
      ],
    },
    {
      op: "conv2d",
      dtype: "f16",
      shapes: [
        [1, 128, 128, 128],
        [128, 128, 3, 3],
      ],
    },
  ];
  const refs = new Map<string, Float32Array>();
  for (const name of ["ptx", "cuda"] as const) {
    if (devices[name] === null) continue;
    const b = await loadBackend(name);
    try {
      for (const c of cases) {
        const label = `${c.op}:${c.dtype}`;
        try {
          const inputs = c.shapes.map((shape, i) => {
            const f = b.upload(
              values(
                shape.reduce((x, y) => x * y, 1),
                i + 1,
              ),
              shape,
              "f32",
            );
            // ptx takes these ops in f32: give it the values rounded to the case's dtype
            const r = b.cast(f, c.dtype);
            return name === "ptx" && c.dtype !== "f32" ? b.cast(r, "f32") : r;
          });
          const run = () => {
            const [x, y] = inputs as [Tensor, Tensor];
            return c.op === "attention"
              ? b.attention(x, y, y, { causal: true })
              : b.conv2d(x, y, null, { padding: 1 });
          };
          b.free(run());
          await b.synchronize();
          const iters = 10;
          const t0 = performance.now();
          for (let i = 0; i < iters; i++) b.free(run());
          await b.synchronize();
          const ms = (performance.now() - t0) / iters;
          const t = run();
          const tf = t.dtype === "f32" ? t : b.cast(t, "f32");
          const out = (await b.read(tf)) as Float32Array;
          const ref = refs.get(label);
          if (ref === undefined) refs.set(label, out);
          let num = 0;
          let den = 0;
          if (ref !== undefined)
            for (let i = 0; i < out.length; i++) {
              num += ((out[i] as number) - (ref[i] as number)) ** 2;
              den += (ref[i] as number) ** 2;
            }
          const dnn = (b as { cudnn?: { planCount(): number; whyNoPlan: Map<string, string> } | null }).cudnn;
          rows.push({
            backend: name,
            op: c.op,
            dtype: c.dtype,
            shapes: c.shapes,
            ms,
            nmseVsPtx: ref === undefined ? null : num / Math.max(den, 1e-30),
            ...(dnn ? { cudnnPlans: dnn.planCount(), cudnnRefused: Object.fromEntries(dnn.whyNoPlan) } : {}),
          });
        } catch (e) {
          rows.push({
            backend: name,
            op: c.op,
            dtype: c.dtype,
            error: e instanceof Error ? e.message : String(e),
          });
        }
      }
    } finally {
      b.dispose();
    }
  }
  summary.cudnn = rows;
}

// last, bun run bench gpu (writes bench-results/gpu.json when it completes; its log shows each measurement)
{
  const limit = Number(process.env.TP_GPU_BENCH_TIMEOUT_S ?? stepTimeout);
  const results = resolve(import.meta.dir, "..", "bench-results", "gpu.json");
  const before = existsSync(results) ? statSync(results).mtimeMs : 0;
  const t0 = performance.now();
  const r = Bun.spawnSync(
    [
      "timeout",
      String(limit),
      process.execPath,
      resolve(import.meta.dir, "bench.ts"),
      "gpu",
      "--reruns",
      "1",
    ],
    { stdout: "pipe", stderr: "pipe", env: process.env },
  );
  const log = `${r.stdout.toString()}\n${r.stderr.toString()}`;
  writeFileSync(join(out, "bench-gpu.log"), log);
  let rows: unknown = null;
  if (existsSync(results) && statSync(results).mtimeMs > before) {
    rows = JSON.parse(readFileSync(results, "utf8"));
    copyFileSync(results, join(out, "bench-gpu.json"));
  }
  summary.benchGpu = {
    exitCode: r.exitCode,
    timedOut: r.exitCode === 124,
    limitSeconds: limit,
    seconds: (performance.now() - t0) / 1000,
    rows,
    ...(rows === null ? { logTail: log.trim().split("\n").slice(-40) } : {}),
  };
}

summary.notRun = [
  "the whole LLM decode loop through @tp/llm on ptx / cuda (bench gpu times the matmul work of a token, not norms, RoPE or sampling)",
];
summary.finished = new Date().toISOString();
writeFileSync(join(out, "summary.json"), `${JSON.stringify(summary, null, 2)}\n`);
process.stdout.write(`${JSON.stringify(summary, null, 2)}\n`);
