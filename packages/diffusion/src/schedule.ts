/**
 * Sigma schedules of flow-matching models, as ComfyUI computes them in float32: the model-sampling
 * tables (`ModelSamplingFlux` — Krea 2's default, shift μ = 1.15 — and `ModelSamplingDiscreteFlow` as
 * the `ModelSamplingAuraFlow` node sets it up) and the "simple" scheduler that picks `steps` entries
 * from a table. Small pure functions returning sigmas (stable-diffusion.cpp `denoiser.hpp` style).
 *
 * Sources: ComfyUI comfy/model_sampling.py (`flux_time_shift`, `ModelSamplingFlux`, `time_snr_shift`,
 * `ModelSamplingDiscreteFlow`), comfy/samplers.py (`simple_scheduler`), comfy_extras/nodes_model_advanced.py
 * (`ModelSamplingAuraFlow`: multiplier 1.0); ../shared/spec/krea2.md §4.1.
 */
import { TpError } from "@tp/tensor";

const fr = Math.fround;

/** Krea 2's model-sampling shift (a flux-style μ, used as e^μ; not ln 1.15). krea2.md §4.1, §6.3. */
export const KREA2_SHIFT = 1.15;

/** The largest f32 (torch's float32 max); a shift whose f32 image exceeds it overflows to infinity. */
const F32_MAX = 3.4028234663852886e38;

/**
 * The largest μ {@link fluxSigmaTable} takes: ln(f32 max) ≈ 88.7228. Above it e^μ rounds to infinity
 * in float32 and the table turns into NaN (∞/∞), as it does in ComfyUI.
 */
export const FLUX_MAX_SHIFT = Math.log(F32_MAX);

/**
 * The largest shift {@link auraFlowSigmaTable} takes: the f32 maximum (≈ 3.4e38); a larger one rounds
 * to infinity in float32 and the table is NaN. (Long before that every sigma is 1.)
 */
export const AURAFLOW_MAX_SHIFT = F32_MAX;

function checkShift(shift: number, what: string, max = Number.POSITIVE_INFINITY): void {
  if (!Number.isFinite(shift))
    throw new TpError("E_ARG", `${what}: shift must be a finite number, got ${shift}`);
  if (shift > max) {
    throw new TpError(
      "E_ARG",
      `${what}: shift ${shift} is above ${max} (the schedule overflows float32 and its sigmas become NaN)`,
    );
  }
}

function checkTimesteps(n: number, what: string): void {
  if (!Number.isSafeInteger(n) || n < 1 || n > 1e7) {
    throw new TpError("E_ARG", `${what}: timesteps must be an integer in [1, 1e7], got ${n}`);
  }
}

/**
 * `ModelSamplingFlux(shift).sigmas`: σ(t) = e^μ / (e^μ + 1/t − 1) for t = i / timesteps, i = 1..timesteps,
 * evaluated in float32 exactly as torch does: t = f32(i) / f32(timesteps); 1/t a rounded reciprocal;
 * `e^μ / tensor` as reciprocal-then-multiply (two roundings); e^μ rounded to f32.
 * @param shift     μ (Krea 2: 1.15)
 * @param timesteps table length (ComfyUI: 10000)
 * @returns Float32Array [timesteps], increasing, last entry 1 (sigma units, = timestep for the DiT)
 * @throws TpError E_ARG for a non-finite shift, one above {@link FLUX_MAX_SHIFT}, or a bad length
 * Source: comfy/model_sampling.py `flux_time_shift(mu, 1.0, t)`; krea2.md §4.1.
 */
export function fluxSigmaTable(shift: number = KREA2_SHIFT, timesteps = 10000): Float32Array {
  checkShift(shift, "fluxSigmaTable", FLUX_MAX_SHIFT);
  checkTimesteps(timesteps, "fluxSigmaTable");
  const e = fr(Math.exp(shift));
  const n = fr(timesteps);
  const out = new Float32Array(timesteps);
  for (let i = 1; i <= timesteps; i++) {
    const t = fr(i / n);
    const inner = fr(e + fr(fr(1 / t) - 1)); // (1/t − 1) ** 1.0 is exact
    out[i - 1] = fr(fr(1 / inner) * e);
  }
  return out;
}

/**
 * `ModelSamplingDiscreteFlow(shift, multiplier = 1.0).sigmas` — what the `ModelSamplingAuraFlow(shift)`
 * node installs (it replaces the model's own schedule): σ(t) = shift·t / (1 + (shift − 1)·t),
 * t = i / timesteps, in float32 (shift and shift − 1 rounded to f32 as torch's scalar operands).
 * @param shift     AuraFlow shift (e.g. 1.15; 1 gives σ = t)
 * @param timesteps table length (ComfyUI: 1000)
 * @returns Float32Array [timesteps], increasing, last entry 1
 * @throws TpError E_ARG for a non-finite shift, one above {@link AURAFLOW_MAX_SHIFT}, or a bad length
 * Source: comfy/model_sampling.py `time_snr_shift`, `ModelSamplingDiscreteFlow.set_parameters`.
 */
export function auraFlowSigmaTable(shift: number, timesteps = 1000): Float32Array {
  checkShift(shift, "auraFlowSigmaTable", AURAFLOW_MAX_SHIFT);
  checkTimesteps(timesteps, "auraFlowSigmaTable");
  const a = fr(shift);
  const a1 = fr(shift - 1); // Python computes alpha − 1 in double, torch rounds it to f32
  const n = fr(timesteps);
  const out = new Float32Array(timesteps);
  for (let i = 1; i <= timesteps; i++) {
    const t = fr(i / n);
    out[i - 1] = shift === 1 ? t : fr(fr(a * t) / fr(1 + fr(a1 * t)));
  }
  return out;
}

/**
 * ComfyUI's "simple" scheduler: `steps` entries taken from the end of a model-sampling table at even
 * strides, then a trailing 0: sigmas[x] = table[len − 1 − ⌊x · len / steps⌋] (stride in double).
 * @param table model-sampling sigmas (increasing), e.g. {@link fluxSigmaTable}
 * @param steps number of sampling steps ≥ 1
 * @returns Float32Array [steps + 1], decreasing, sigmas[0] = table[len − 1] (= 1), sigmas[steps] = 0
 * @throws TpError E_ARG for a bad step count or an empty table
 * Source: comfy/samplers.py `simple_scheduler`.
 */
export function simpleSchedule(table: Float32Array, steps: number): Float32Array {
  if (!Number.isSafeInteger(steps) || steps < 1 || steps > 10000) {
    throw new TpError("E_ARG", `steps must be an integer in [1, 10000], got ${steps}`);
  }
  if (table.length === 0) throw new TpError("E_ARG", "simpleSchedule: the sigma table is empty");
  const ss = table.length / steps;
  const out = new Float32Array(steps + 1);
  for (let x = 0; x < steps; x++) out[x] = table[table.length - 1 - Math.trunc(x * ss)] as number;
  out[steps] = 0;
  return out;
}

/** Which model-sampling table a schedule is drawn from. */
export type ModelSamplingKind = "flux" | "auraflow";

/** Options of {@link krea2Sigmas}. */
export interface SigmaOptions {
  /** "flux" (Krea 2's own `ModelSamplingFlux`, default) or "auraflow" (the `ModelSamplingAuraFlow` node). */
  sampling?: ModelSamplingKind;
  /** Shift: μ for "flux", the AuraFlow shift for "auraflow"; default 1.15 (krea2.md §6.3). */
  shift?: number;
}

/**
 * The sigmas of a Krea 2 run with the "simple" scheduler: {@link simpleSchedule} over
 * {@link fluxSigmaTable}(shift, 10000) or {@link auraFlowSigmaTable}(shift, 1000).
 * @param steps sampling steps ≥ 1
 * @returns Float32Array [steps + 1] (sigma units), last entry 0
 * @throws TpError E_ARG for a bad step count, shift or sampling kind
 * Source: krea2.md §4.1; ComfyUI KSampler(scheduler "simple").
 */
export function krea2Sigmas(steps: number, options: SigmaOptions = {}): Float32Array {
  const shift = options.shift ?? KREA2_SHIFT;
  const kind = options.sampling ?? "flux";
  if (kind === "flux") return simpleSchedule(fluxSigmaTable(shift, 10000), steps);
  if (kind === "auraflow") return simpleSchedule(auraFlowSigmaTable(shift, 1000), steps);
  throw new TpError("E_ARG", `sampling must be "flux" or "auraflow", got ${String(kind)}`);
}
