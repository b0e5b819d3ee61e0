/**
 * Continuous batching of decode steps: the slots' one-token forwards that arrive in the same turn of
 * the event loop run as one `LanguageModel.stepBatch` (one forward with a row per sequence: the
 * projections and MLP as matrix products over the rows, attention per sequence over its own KV cache).
 * A slot joins or leaves the batch at any step — its prefill runs alone, its decode steps are batched
 * with whichever slots are decoding then.
 * Source: the "iteration-level scheduling" of Orca (Yu et al., OSDI 2022) as vLLM and llama-server run it.
 */
import { BATCHED_DECODE_ARCHITECTURES, LanguageModel } from "@tp/llm";
import type { Tensor } from "@tp/tensor";

interface Pending {
  model: LanguageModel;
  id: number;
  resolve: (t: Tensor) => void;
  reject: (e: unknown) => void;
}

/** Collects decode steps and runs them together. */
export class DecodeBatcher {
  #pending: Pending[] = [];
  #scheduled = false;
  /** Batched forwards run, and the rows they carried (for /metrics). */
  forwards = 0;
  rows = 0;

  /** Whether models of this architecture can be batched. */
  static supports(architecture: string): boolean {
    return BATCHED_DECODE_ARCHITECTURES.has(architecture);
  }

  /** One decode step of `model` (a GenerationSession `decodeStep`): resolves to its logits [1, vocab]. */
  decode(model: LanguageModel, id: number): Promise<Tensor> {
    return new Promise((resolve, reject) => {
      this.#pending.push({ model, id, resolve, reject });
      if (!this.#scheduled) {
        this.#scheduled = true;
        // after the other slots' turns of this loop iteration, which queue their steps too
        setImmediate(() => this.#flush());
      }
    });
  }

  #flush(): void {
    this.#scheduled = false;
    const batch = this.#pending;
    this.#pending = [];
    if (batch.length === 0) return;
    this.forwards++;
    this.rows += batch.length;
    if (batch.length === 1) {
      const p = batch[0] as Pending;
      try {
        p.resolve(p.model.step([p.id]));
      } catch (e) {
        p.reject(e);
      }
      return;
    }
    const b = (batch[0] as Pending).model.backend;
    let logits: Tensor;
    try {
      logits = LanguageModel.stepBatch(
        batch.map((p) => p.model),
        batch.map((p) => p.id),
      );
    } catch (e) {
      // one bad row (a full context) must not fail the others: run them one by one
      for (const p of batch) {
        try {
          p.resolve(p.model.step([p.id]));
        } catch (err) {
          p.reject(err);
        }
      }
      void e;
      return;
    }
    try {
      for (const [i, p] of batch.entries()) p.resolve(b.copy(logits.slice(0, i, i + 1)));
    } finally {
      b.free(logits);
    }
  }
}
