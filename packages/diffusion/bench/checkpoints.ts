/**
 * The real-size random Krea 2 DiT checkpoints of `bun run bench krea2`: written once (≈ 12 GiB each)
 * into `$TMPDIR/tensorpencil-bench/krea2/` (else the OS temp dir) under a name that carries
 * {@link CHECKPOINT_VERSION}, and reused by later runs. Each file is written to a temporary name and
 * renamed by @tp/formats' `SafetensorsWriter`, so an interrupted run leaves no file under the final
 * name (and its leftover `*.tmp-PID-N` is removed by the next run once that process is gone).
 *
 * `bun packages/diffusion/bench/checkpoints.ts` writes both files without running the bench.
 */
import { existsSync, mkdirSync, readdirSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createNativeQuantizer } from "@tp/backend-cpu";
import type { ProgressReporter } from "@tp/quant";
import {
  KREA2_CONFIG,
  type RandomKrea2QuantFormat,
  writeRandomKrea2DitQuantized,
} from "../src/testing/random-checkpoints.ts";

/**
 * Bump when the bytes the writer produces change (values, layout, quantizer semantics): old files are
 * then ignored (and can be deleted by hand).
 */
export const CHECKPOINT_VERSION = "v1";

/** The cache directory. */
export function checkpointDir(): string {
  return join(process.env.TMPDIR || tmpdir(), "tensorpencil-bench", "krea2");
}

/** The cache path of a format's file. */
export function checkpointPath(format: RandomKrea2QuantFormat): string {
  return join(checkpointDir(), `krea2-real-random-${CHECKPOINT_VERSION}-seed0-${format}.safetensors`);
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** A progress line on stdout every 10 % (the bench log is not a TTY). */
function lineProgress(label: string): ProgressReporter {
  let total = 1;
  let done = 0;
  let next = 0.1;
  const t0 = performance.now();
  return {
    start(t) {
      total = t;
    },
    advance(bytes) {
      done += bytes;
      if (done / total >= next) {
        console.log(
          `  ${label}: ${((100 * done) / total).toFixed(0)} % (${((performance.now() - t0) / 1000).toFixed(0)} s)`,
        );
        next += 0.1;
      }
    },
    stop() {},
  };
}

/**
 * The path of the format's checkpoint, writing it first when missing (native quantizer, every thread).
 * @returns path, file size in bytes, and the seconds spent writing (0 when reused)
 */
export function ensureCheckpoint(format: RandomKrea2QuantFormat): {
  path: string;
  bytes: number;
  writeSeconds: number;
} {
  const path = checkpointPath(format);
  const dir = checkpointDir();
  mkdirSync(dir, { recursive: true });
  // leftovers of interrupted writes whose process is gone
  for (const f of readdirSync(dir)) {
    const m = /\.tmp-(\d+)-\d+$/.exec(f);
    if (m && !alive(Number(m[1]))) rmSync(join(dir, f), { force: true });
  }
  if (existsSync(path)) return { path, bytes: statSync(path).size, writeSeconds: 0 };
  console.log(`writing ${path} (random weights, real Krea 2 sizes, ${format}; once, reused later) ...`);
  const quantizer = createNativeQuantizer();
  try {
    const r = writeRandomKrea2DitQuantized(path, KREA2_CONFIG, {
      format,
      quantizer,
      seed: 0,
      progress: lineProgress(format),
    });
    console.log(
      `  wrote ${(r.bytesOut / 2 ** 30).toFixed(2)} GiB in ${r.seconds.toFixed(0)} s (${r.quantized} layers ${format}, ${r.copied} tensors BF16; ${quantizer.name})`,
    );
    return { path, bytes: r.bytesOut, writeSeconds: r.seconds };
  } finally {
    quantizer.dispose();
  }
}

if (import.meta.main) {
  for (const f of ["int8_convrot", "fp8_scaled"] as const) ensureCheckpoint(f);
}
