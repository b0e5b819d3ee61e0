// Batched decode (LanguageModel.stepBatch) against one-sequence steps on the shared tiny GGUFs
// (../shared/models; skipped with a reason when absent): three sequences with different histories
// over one set of weights, each row of the batched logits against that sequence's own step, for two
// batched steps in a row. Tolerance: the same f32 weights and inputs, only the matrix products'
// summation order differs (a GEMM over 3 rows against a GEMV), 1e-4 of the largest |logit|.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { createBackend } from "@tp/backend-cpu";
import type { TpError } from "@tp/tensor";
import { loadModel } from "../load.ts";
import { LanguageModel } from "./language-model.ts";

const MODELS = resolve(import.meta.dir, "../../../../../shared/models/synthetic");
// gemma3: sliding window 8 with a ring of 8 + 2 rows (kvRingBatch 2), which the longest history wraps
const FILES = [
  "qwen3-tiny-Q8_0.gguf",
  "llama-tiny-F32.gguf",
  "qwen3moe-tiny-Q8_0.gguf",
  "gemma3-tiny-F32.gguf",
];
const backend = createBackend({ threads: 1 });
afterAll(() => backend.dispose());
const TOL = 1e-4;

async function rows(t: ReturnType<LanguageModel["step"]>): Promise<Float32Array> {
  const data = (await backend.read(t)) as Float32Array;
  backend.free(t);
  return data;
}

for (const file of FILES) {
  const path = join(MODELS, file);
  describe.skipIf(!existsSync(path))(`stepBatch on ${file}`, () => {
    test("each row equals its sequence's own step; caches grow by one each time", async () => {
      const { model } = loadModel(path, { backend, maxContext: 64 });
      const vocab = model.config.vocab_size;
      const mk = () => new LanguageModel(model.model, { maxContext: 64, kvRingBatch: 2 });
      const batched = [mk(), mk(), mk()];
      const single = [mk(), mk(), mk()];
      const histories = [[1, 5, 9, 2], [3], [7, 7, 8, 100, 42, 11]];
      for (const [i, h] of histories.entries()) {
        backend.free((batched[i] as LanguageModel).step(h));
        backend.free((single[i] as LanguageModel).step(h));
      }
      for (const next of [
        [10, 20, 30],
        [31, 32, 33],
        [34, 35, 36],
        [37, 38, 39],
        [40, 41, 42],
      ]) {
        const got = await rows(LanguageModel.stepBatch(batched, next));
        expect(got.length).toBe(3 * vocab);
        for (let i = 0; i < 3; i++) {
          const want = await rows((single[i] as LanguageModel).step([next[i] as number]));
          let err = 0;
          let scale = 0;
          for (let j = 0; j < vocab; j++) {
            err = Math.max(err, Math.abs((got[i * vocab + j] as number) - (want[j] as number)));
            scale = Math.max(scale, Math.abs(want[j] as number));
          }
          expect(err).toBeLessThanOrEqual(TOL * scale);
          expect((batched[i] as LanguageModel).cached).toBe((single[i] as LanguageModel).cached);
        }
      }
      const code = (f: () => unknown) => {
        try {
          f();
        } catch (e) {
          return (e as TpError).code;
        }
        return "none";
      };
      expect(code(() => LanguageModel.stepBatch([], []))).toBe("E_ARG");
      expect(code(() => LanguageModel.stepBatch(batched, [1, 2]))).toBe("E_ARG");
      expect(
        code(() =>
          LanguageModel.stepBatch([batched[0] as LanguageModel, batched[0] as LanguageModel], [1, 2]),
        ),
      ).toBe("E_ARG");
      expect(code(() => LanguageModel.stepBatch(batched, [1, 2, vocab]))).toBe("E_ARG");
      const other = loadModel(path, { backend, maxContext: 64 }).model;
      expect(code(() => LanguageModel.stepBatch([batched[0] as LanguageModel, other], [1, 2]))).toBe(
        "E_UNSUPPORTED",
      );
      other.dispose();
      for (const m of [...batched, ...single]) m.kv.dispose();
      model.dispose();
    });
  });
}
