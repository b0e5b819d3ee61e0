/**
 * The stage checks of the pipelines: a result that holds NaN or ±∞ is an error (ARCHITECTURE.md
 * §Errors), found by the `count_nonfinite` reduction on the device — 4 bytes cross to the host, not the
 * tensor — and reported as E_NUMERIC naming the stage and step, with the reason when the caller can
 * give one (the first weight holding NaN / ∞, from a scan done only after the failure).
 */
import type { Backend } from "./backend.ts";
import { TpError, type TpErrorContext } from "./errors.ts";
import type { Tensor } from "./tensor.ts";

/** Where a checked tensor comes from, for the message. */
export interface NumericStage {
  /** The stage, in the user's words: "conditioning (positive)", "sampling", "VAE decode", "logits". */
  readonly stage: string;
  /** 1-based step (or token position) inside the stage, when it has steps. */
  readonly step?: number;
  /** Steps of the stage, when known ("step 3 of 8"). */
  readonly steps?: number;
  /** The input file the values came from (a saved latent, a conditioning file). */
  readonly file?: string;
  /** The tensor of that file. */
  readonly tensor?: string;
  /**
   * Called once, only when the check fails: why the values are broken, in a sentence (e.g. "the DiT
   * file F holds NaN in tensor T"), or undefined when it cannot tell. May scan weights; never throws.
   */
  readonly explain?: () => string | undefined;
}

/** "sampling step 3 of 8" and the like. */
function stageName(s: NumericStage): string {
  if (s.step === undefined) return s.stage;
  return `${s.stage} step ${s.step}${s.steps === undefined ? "" : ` of ${s.steps}`}`;
}

/**
 * The E_NUMERIC error for `count` non-finite values among `numel` at stage `s` (the explanation, when
 * `s.explain` gives one, appended).
 */
export function nonFiniteError(s: NumericStage, count: number, numel: number): TpError {
  let why: string | undefined;
  try {
    why = s.explain?.();
  } catch {
    why = undefined;
  }
  const context: TpErrorContext = {
    ...(s.file === undefined ? {} : { file: s.file }),
    ...(s.tensor === undefined ? {} : { tensor: s.tensor }),
  };
  return new TpError(
    "E_NUMERIC",
    `${stageName(s)}: ${count === numel && numel > 1 ? `all ${numel}` : `${count} of ${numel}`} values ${count === 1 ? "is" : "are"} NaN or infinite${why === undefined ? "" : `; ${why}`}`,
    context,
  );
}

/**
 * Check that `x` holds no NaN or ±∞: one `count_nonfinite` on the backend and a read of its 4-byte
 * result. A backend without the op (`supports("count_nonfinite")` false) is checked by reading `x`.
 * @param x any shape and view, f32
 * @throws TpError E_NUMERIC naming the stage and step ({@link nonFiniteError}); E_STATE
 */
export async function checkFinite(backend: Backend, x: Tensor, stage: NumericStage): Promise<void> {
  let count: number;
  if (backend.supports("count_nonfinite", [x.dtype])) {
    using c = backend.countNonFinite(x);
    count = (await backend.read(c))[0] as number;
  } else {
    count = 0;
    for (const v of (await backend.read(x)) as Float32Array) if (!Number.isFinite(v)) count++;
  }
  if (count !== 0) throw nonFiniteError(stage, count, x.numel);
}

/**
 * As {@link checkFinite} for host values (a file's data read for upload).
 * @throws TpError E_NUMERIC
 */
export function checkFiniteHost(data: ArrayLike<number>, stage: NumericStage): void {
  let count = 0;
  for (let i = 0; i < data.length; i++) if (!Number.isFinite(data[i] as number)) count++;
  if (count !== 0) throw nonFiniteError(stage, count, data.length);
}
