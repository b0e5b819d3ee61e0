/**
 * Progress of a sampling loop on stderr: a `cli-progress` (3.12.0) bar with s/step and ETA when stderr
 * is a terminal, one plain line per step otherwise (logs keep the timing without control codes).
 */
import { Presets, SingleBar } from "cli-progress";

/** Receives one report per finished step. */
export interface StepProgress {
  /** `step` steps of `steps` are done; the last took `stepMs`, all so far `elapsedMs`. */
  step(step: number, steps: number, stepMs: number, elapsedMs: number): void;
  /** Close the bar (also after a failure). */
  stop(): void;
}

/** Seconds as text: `0.42 s`, `12.3 s`, `4 min 05 s`. */
export function formatSeconds(s: number): string {
  if (s < 10) return `${s.toFixed(2)} s`;
  if (s < 120) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  return `${m} min ${String(Math.round(s - 60 * m)).padStart(2, "0")} s`;
}

/**
 * A step reporter on `stream` (default stderr): ETA = mean s/step so far × steps left.
 * @param label what is being stepped (e.g. "sampling")
 */
export function stepProgress(label: string, stream: NodeJS.WriteStream = process.stderr): StepProgress {
  let bar: SingleBar | null = null;
  return {
    step(step, steps, stepMs, elapsedMs) {
      const perStep = elapsedMs / 1000 / step;
      const eta = perStep * (steps - step);
      if (!stream.isTTY) {
        stream.write(
          `${label} step ${step}/${steps}  ${formatSeconds(stepMs / 1000)}  (${perStep.toFixed(2)} s/step, ETA ${formatSeconds(eta)})\n`,
        );
        return;
      }
      if (bar === null) {
        bar = new SingleBar(
          {
            stream,
            format: `${label} {bar} {value}/{total} steps | {perStep} s/step | ETA {etaText}`,
            hideCursor: true,
            clearOnComplete: false,
            synchronousUpdate: true,
          },
          Presets.shades_classic,
        );
        bar.start(steps, 0, { perStep: "-", etaText: "-" });
      }
      bar.update(step, { perStep: perStep.toFixed(2), etaText: formatSeconds(eta) });
    },
    stop() {
      bar?.stop();
      bar = null;
    },
  };
}
