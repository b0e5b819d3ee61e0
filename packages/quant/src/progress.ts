/**
 * Progress reporting while quantizing (quantize-on-load caches, `bun apps/cli quantize`). The work
 * reports bytes of the source consumed; a {@link ProgressReporter} decides what to show.
 * {@link stderrProgress} draws a bar on stderr with `cli-progress` (3.12.0) when stderr is a terminal
 * and shows nothing otherwise (logs and CI stay clean; callers print their own one-line summary).
 */
import { Presets, SingleBar } from "cli-progress";

/** Receives the progress of one quantization run. All sizes are bytes of the source checkpoint. */
export interface ProgressReporter {
  /** Called once before any work: the bytes that will be read (quantized and copied tensors). */
  start(totalBytes: number, label: string): void;
  /** `bytes` more of the source are done; `tensor` is the tensor being processed. */
  advance(bytes: number, tensor: string): void;
  /** Called once at the end, also after a failure. */
  stop(): void;
}

/** A reporter that shows nothing. */
export const silentProgress: ProgressReporter = {
  start() {},
  advance() {},
  stop() {},
};

/**
 * A progress bar on stderr (`cli-progress` SingleBar: bar, percent, MiB done / total, ETA, current
 * tensor), redrawn at most every 100 ms from inside the synchronous quantization loop. When stderr is
 * not a TTY it prints nothing at all.
 * @param stream where to draw (default `process.stderr`); a TTY check is made on it
 */
export function stderrProgress(stream: NodeJS.WriteStream = process.stderr): ProgressReporter {
  if (!stream.isTTY) return silentProgress;
  const mib = (b: number) => (b / 2 ** 20).toFixed(1);
  let bar: SingleBar | null = null;
  let done = 0;
  return {
    start(total, label) {
      done = 0;
      bar = new SingleBar(
        {
          stream,
          format: `${label} {bar} {percentage}% | {doneMiB}/{totalMiB} MiB | ETA {eta_formatted} | {tensor}`,
          hideCursor: true,
          clearOnComplete: false,
          synchronousUpdate: true,
          fps: 10,
          etaBuffer: 50,
        },
        Presets.shades_classic,
      );
      bar.start(Math.max(total, 1), 0, { doneMiB: mib(0), totalMiB: mib(total), tensor: "" });
    },
    advance(bytes, tensor) {
      done += bytes;
      bar?.update(done, { doneMiB: mib(done), tensor });
    },
    stop() {
      bar?.stop();
      bar = null;
    },
  };
}
