/**
 * Flow-matching Euler sampling with classifier-free guidance, in ComfyUI's form (so that the f32
 * arithmetic of the loop follows ComfyUI's op for op), written on the Backend interface: the loop
 * never reads tensor data on the host. The model is a callback, so the loop is independent of the DiT.
 *
 * Per step i (σ = sigmas[i], σ' = sigmas[i+1]):
 *   den_c = D(x, σ, positive);  den = den_c                                  (cfg = 1: one model call)
 *   den_u = D(x, σ, negative);  den = den_u + (den_c − den_u)·cfg            (cfg ≠ 1)
 *   d = (x − den) / σ;  x = x + d·(σ' − σ)
 * with D the denoiser; for a velocity (flow) model D(x, σ) = x − v·σ ({@link flowDenoiser}).
 *
 * Sources: ComfyUI comfy/k_diffusion/sampling.py `sample_euler` (s_churn = 0), `to_d`;
 * comfy/samplers.py `sampling_function`, `cfg_function` (cfg 1 skips the uncond pass);
 * comfy/model_sampling.py `CONST.calculate_denoised`, `noise_scaling`, `inverse_noise_scaling`;
 * ../shared/spec/krea2.md §4.2–4.3.
 */
import { type Backend, type Tensor, TpError } from "@tp/tensor";

/** Which conditioning a model call is for. */
export type CondKind = "positive" | "negative";

/**
 * A denoiser: the x0 estimate ("denoised") of the sampler state `x` at noise level `sigma`.
 * x: [batch, channels, ...] f32 on the sampler's backend; sigma in sigma units (Krea 2: also the DiT
 * timestep); → a new tensor of x's shape, f32, which the sampler frees.
 */
export type Denoiser = (x: Tensor, sigma: number, cond: CondKind) => Tensor | Promise<Tensor>;

/**
 * A velocity (flow-prediction) model: the raw output v of a DiT such as Krea 2 for state x at sigma.
 * Same shapes and ownership as {@link Denoiser}.
 */
export type VelocityModel = (x: Tensor, sigma: number, cond: CondKind) => Tensor | Promise<Tensor>;

/**
 * Wrap a velocity model as a denoiser: den = x − v·σ in f32 (ComfyUI `CONST.calculate_denoised`;
 * the model output is f32 before this, krea2.md §4.2 step 1).
 * @param backend the backend x and v live on
 */
export function flowDenoiser(backend: Backend, model: VelocityModel): Denoiser {
  return async (x, sigma, cond) => {
    using v = await model(x, sigma, cond);
    return backend.scope(() => backend.sub(x, backend.scale(v, sigma)));
  };
}

/** What the progress callback gets after each step. */
export interface StepInfo {
  /** Step index, 0-based. */
  readonly step: number;
  /** Number of steps (sigmas.length − 1). */
  readonly steps: number;
  /** σ of this step and the next one. */
  readonly sigma: number;
  readonly sigmaNext: number;
  /** The new state x (after the step); valid only during the callback. */
  readonly x: Tensor;
  /** The x0 estimate of this step (what ComfyUI previews); valid only during the callback. */
  readonly denoised: Tensor;
}

/** Options of {@link sampleEuler}. */
export interface EulerOptions {
  /** Sigmas, decreasing, steps + 1 entries ending in 0 (see schedule.ts). */
  readonly sigmas: Float32Array | readonly number[];
  /** Guidance scale; 1 (default) skips the negative pass. */
  readonly cfg?: number;
  /** Called after every step, awaited; may read tensors (a preview) — the loop itself never does. */
  readonly onStep?: (info: StepInfo) => void | Promise<void>;
}

/**
 * Euler sampling (ComfyUI `sample_euler`, no churn, no injected noise) with CFG.
 * @param backend  backend of x and of the denoiser's outputs
 * @param x        initial state [batch, channels, ...] f32 (for text-to-image: the noise scaled by
 *                 sigmas[0], see {@link noiseScaling}); not freed
 * @param denoiser x0 estimate per call (see {@link Denoiser}, {@link flowDenoiser})
 * @returns a new tensor: the final state, already "inverse noise scaled" (÷ (1 − sigmas[last]) = ÷ 1)
 * @throws TpError E_ARG for fewer than 2 sigmas, a sigma of 0 before the last one, a non-finite cfg;
 *   E_SHAPE when the denoiser returns another shape
 * Arithmetic: as ComfyUI's f32 ops except d = (x − den)/σ, computed as (x − den)·f32(1/σ) (the Backend
 *   has no division): at most 1 ulp per element per step, exact when 1/σ is a power of two.
 */
export async function sampleEuler(
  backend: Backend,
  x: Tensor,
  denoiser: Denoiser,
  options: EulerOptions,
): Promise<Tensor> {
  const sigmas = Float32Array.from(options.sigmas);
  const cfg = Math.fround(options.cfg ?? 1);
  if (sigmas.length < 2) {
    throw new TpError("E_ARG", `sampleEuler needs at least 2 sigmas (steps + 1), got ${sigmas.length}`);
  }
  for (let i = 0; i + 1 < sigmas.length; i++) {
    if (!((sigmas[i] as number) > 0)) {
      throw new TpError("E_ARG", `sigma ${i} is ${sigmas[i]}; only the last sigma may be 0`);
    }
  }
  if (!Number.isFinite(cfg)) throw new TpError("E_ARG", `cfg must be a finite number, got ${options.cfg}`);
  const steps = sigmas.length - 1;
  const useCfg = cfg !== 1;
  const checkShape = (t: Tensor, what: string): void => {
    if (t.shape.length !== x.shape.length || t.shape.some((d, i) => d !== x.shape[i])) {
      throw new TpError(
        "E_SHAPE",
        `the denoiser returned ${what} [${t.shape.join(", ")}] for a state [${x.shape.join(", ")}]`,
      );
    }
  };

  let cur = backend.copy(x);
  try {
    for (let i = 0; i < steps; i++) {
      const sigma = sigmas[i] as number;
      const sigmaNext = sigmas[i + 1] as number;
      // 1–2. model call(s) and CFG: den = den_u + (den_c − den_u)·cfg (comfy/samplers.py cfg_function)
      using denC = await denoiser(cur, sigma, "positive");
      checkShape(denC, "positive");
      using denU = useCfg ? await denoiser(cur, sigma, "negative") : null;
      if (denU) checkShape(denU, "negative");
      using den = denU
        ? backend.scope(() => backend.add(denU, backend.scale(backend.sub(denC, denU), cfg)))
        : null;
      const denoised = den ?? denC;
      // 3. d = (x − den)/σ (k_diffusion to_d); x = x + d·(σ' − σ), dt = f32(σ' − σ)
      const next = backend.scope(() => {
        const d = backend.scale(backend.sub(cur, denoised), Math.fround(1 / sigma));
        return backend.add(cur, backend.scale(d, Math.fround(sigmaNext - sigma)));
      });
      cur[Symbol.dispose]();
      cur = next;
      if (options.onStep) await options.onStep({ step: i, steps, sigma, sigmaNext, x: cur, denoised });
    }
    const last = sigmas[steps] as number;
    if (last !== 0) {
      // CONST.inverse_noise_scaling: x / (1 − σ_last); a no-op for schedules ending in 0.
      const out = backend.scale(cur, Math.fround(1 / Math.fround(1 - last)));
      cur[Symbol.dispose]();
      cur = out;
    }
    return cur;
  } catch (e) {
    cur[Symbol.dispose]();
    throw e;
  }
}

/**
 * ComfyUI `CONST.noise_scaling` for an empty (zero) latent: x = σ0·noise + (1 − σ0)·0 = σ0·noise;
 * a copy when σ0 = 1 (always the case for the schedules of schedule.ts). noise: any shape, f32; → new tensor.
 * Source: comfy/model_sampling.py; krea2.md §4.3.
 */
export function noiseScaling(backend: Backend, noise: Tensor, sigma0: number): Tensor {
  return Math.fround(sigma0) === 1 ? backend.copy(noise) : backend.scale(noise, Math.fround(sigma0));
}
