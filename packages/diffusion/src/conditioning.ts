/**
 * Text conditioning as it passes from a text encoder to a DiT: a device tensor, so the encoder's
 * output is consumed where it was computed, never read to the host and uploaded again. The host form
 * ({@link HostConditioning}) is only for files (`--cond-in` / `--cond-out`, see pipelines/files.ts)
 * and tests.
 *
 * Shapes: `[1, seq, width]` f32, one row per kept prompt token; Krea 2's width is taps × hidden
 * (12 × 2560, tap-major per token: krea2.md §2.5). Source: ComfyUI's `CONDITIONING` (the tensor a
 * text-encode node hands the sampler), nodes.py `CLIPTextEncode`, `ConditioningZeroOut`.
 */
import { type Backend, type Tensor, TpError } from "@tp/tensor";

/** Conditioning on the host: `data` is f32 in C order of `shape` `[1, seq, width]`. */
export interface HostConditioning {
  readonly data: Float32Array;
  readonly shape: readonly [number, number, number];
}

/**
 * Conditioning on a backend: an f32 tensor `[1, seq, width]` the caller owns (`dispose()` or `using`).
 */
export class Conditioning implements Disposable {
  /** f32 `[1, seq, width]`. */
  readonly tensor: Tensor;

  /**
   * @param tensor f32 rank 3, batch 1; the conditioning takes it over (its dispose frees it)
   * @throws TpError E_SHAPE for another rank, batch or dtype
   */
  constructor(tensor: Tensor) {
    if (tensor.rank !== 3 || tensor.shape[0] !== 1 || tensor.dtype !== "f32") {
      throw new TpError(
        "E_SHAPE",
        `conditioning must be f32 [1, seq, width], got ${tensor.dtype} [${tensor.shape.join(", ")}]`,
      );
    }
    this.tensor = tensor;
  }

  /**
   * Upload host conditioning (a saved file's) to `backend`.
   * @throws TpError E_SHAPE when `data` does not fill `shape` or the shape is not `[1, seq, width]`
   */
  static upload(backend: Backend, host: HostConditioning, name = "conditioning"): Conditioning {
    const [b, s, w] = host.shape;
    if (host.shape.length !== 3 || host.data.length !== b * s * w) {
      throw new TpError(
        "E_SHAPE",
        `${name}: ${host.data.length} values for shape [${host.shape.join(", ")}]`,
      );
    }
    return new Conditioning(backend.upload(host.data, [...host.shape], "f32", name));
  }

  /** The backend the tensor lives on. */
  get backend(): Backend {
    return this.tensor.backend;
  }

  /** `[1, seq, width]`. */
  get shape(): readonly [number, number, number] {
    return this.tensor.shape as unknown as readonly [number, number, number];
  }

  /**
   * ComfyUI's `ConditioningZeroOut`: zeros of this shape (the official Krea 2 workflow's negative).
   * @returns a new conditioning on the same backend, owned by the caller
   */
  zeros(): Conditioning {
    const [b, s, w] = this.shape;
    return new Conditioning(
      this.backend.upload(new Float32Array(b * s * w), [b, s, w], "f32", "zero conditioning"),
    );
  }

  /** Copy to the host (for `--cond-out` and tests). */
  async read(): Promise<HostConditioning> {
    return {
      data: (await this.backend.read(this.tensor)) as Float32Array,
      shape: [...this.shape] as [number, number, number],
    };
  }

  /** Free the tensor (a no-op when already freed). */
  dispose(): void {
    this.tensor[Symbol.dispose]();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

/**
 * A text encoder: prompt → {@link Conditioning} on its backend (Krea 2's is `loadKrea2TextEncoder`,
 * models/krea2-text.ts). Pipelines take conditioning, not text, so a saved file can stand in.
 */
export interface PromptEncoder {
  /** The conditioning of one prompt, `[1, seq, width]` f32 on the encoder's backend, owned by the caller. */
  encode(prompt: string): Promise<Conditioning>;
  /** Release the encoder's weights. */
  dispose(): void;
}
