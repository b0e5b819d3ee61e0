// Qwen3 hidden states without a KV cache (models/qwen3-vl-text.ts, `forward(ids, { collect })`): a tiny random Qwen3-VL-style
// text encoder (prefix model.language_model., no config.json) written with our safetensors writer,
// against the float64 reference forward of testing/tiny-models.ts (each tap through the final norm and
// the tied head on the host = the reference logits of the first k layers); the same rows through the
// cached `step`; the cache left alone; errors. With ../shared: the krea2-tiny Qwen3-VL text encoder's
// embeddings and every tapped layer against ComfyUI's fp32 values, in both weight modes.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createBackend } from "@tp/backend-cpu";
import { writeSafetensors } from "@tp/formats";
import { type Tensor, TpError } from "@tp/tensor";
import {
  maxAbsDiff,
  referenceHead,
  referenceLogits,
  type TinyConfig,
  tinyWeights,
} from "../testing/tiny-models.ts";
import { loadQwen3VlText, QWEN3_VL_TEXT_DEFAULTS } from "./qwen3-vl-text.ts";

/** f32 forward vs the f64 reference on logits ≤ ~15 over 3 layers (as models.test.ts; measured ≤ 4e-6). */
const F32_LOGIT_TOL = 2e-5;
/** Cached `step` vs the cache-free forward: the same f32 ops, only the attention's key source differs. */
const SAME_OPS_TOL = 1e-5;
/**
 * ComfyUI's fp32 taps vs ours with weights "f32", relative to max |ref|: f32 summation order over 36
 * layers (measured ≤ 8.2e-7).
 */
const F32_TAP_REL_TOL = 1e-5;
/**
 * Weights "native" (bf16 stored, the CPU matmul rounds activations to bf16: 2^-9 per input, over 35
 * layers), relative to max |ref| (measured ≤ 6.8e-3).
 */
const NATIVE_TAP_REL_TOL = 2e-2;

const backend = createBackend({ threads: 2 });
const tmp = mkdtempSync(join(tmpdir(), "tp-llm-hidden-"));
afterAll(() => {
  rmSync(tmp, { recursive: true, force: true });
  backend.dispose();
});

const CFG: TinyConfig = {
  model_type: "qwen3",
  vocab_size: 64,
  hidden_size: 32,
  num_hidden_layers: 3,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  head_dim: 16,
  intermediate_size: 48,
  rms_norm_eps: QWEN3_VL_TEXT_DEFAULTS.rms_norm_eps,
  rope_theta: QWEN3_VL_TEXT_DEFAULTS.rope_theta,
  max_position_embeddings: 4096,
  tie_word_embeddings: true,
};
const IDS = [3, 17, 5, 60, 0, 41, 9];

/** Write the weights under ComfyUI's Qwen3-VL text-encoder names (prefix model.language_model.). */
function writeVlText(path: string, w: ReturnType<typeof tinyWeights>): void {
  const tensors = [...w].map(([name, { shape, values }]) => ({
    name: name.replace(/^model\./, "model.language_model."),
    dtype: "F32",
    shape,
    data: new Uint8Array(values.buffer, values.byteOffset, values.byteLength),
  }));
  writeSafetensors(path, tensors);
}

/** Host f64: the final norm and the tied head on every row of an [n, H] hidden state. */
function headOf(h: Float32Array, w: ReturnType<typeof tinyWeights>): Float64Array {
  return referenceHead(CFG, w, h);
}

async function read(t: Tensor): Promise<Float32Array> {
  const v = (await backend.read(t)) as Float32Array;
  backend.free(t);
  return v;
}

describe("Qwen3 hidden states without a KV cache, tiny random Qwen3-VL text encoder", () => {
  const w = tinyWeights(CFG, 21);
  const file = join(tmp, "qwen3vl-tiny.safetensors");
  writeVlText(file, w);

  test("config from shapes; every tap = the f64 reference of the first k layers", async () => {
    const { model, config, layout } = loadQwen3VlText(file, { backend });
    try {
      expect(layout.kind).toBe("qwen3vl-text-encoder");
      expect(config).toMatchObject({
        architecture: "qwen3",
        vocab_size: 64,
        hidden_size: 32,
        num_hidden_layers: 3,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 16,
        intermediate_size: 48,
        rope_theta: 5e6,
        rms_norm_eps: 1e-6,
        rope_mode: "neox",
        tie_word_embeddings: true,
      });
      const layers = [3, 0, 2, 1]; // any order
      const before = backend.memory.current;
      const taps = model.forward(IDS, { collect: layers });
      expect(taps.map((t) => t.shape)).toEqual(layers.map(() => [IDS.length, 32]));
      const emb = w.get("model.embed_tokens.weight")?.values as Float32Array;
      for (let i = 0; i < layers.length; i++) {
        const k = layers[i] as number;
        const h = await read(taps[i] as Tensor);
        if (k === 0) {
          const rows = IDS.flatMap((id) => [...emb.subarray(id * 32, (id + 1) * 32)]);
          expect([...h]).toEqual(rows); // the embedding lookup is exact
        }
        const want = referenceLogits({ ...CFG, num_hidden_layers: k }, w, IDS).flatMap((r) => [...r]);
        expect(maxAbsDiff(headOf(h, w), want)).toBeLessThan(F32_LOGIT_TOL);
      }
      expect([model.cached, model.kvBytes]).toEqual([0, 0]); // the cache was not touched
      expect(backend.memory.current).toBe(before); // every intermediate freed (the taps by read())
    } finally {
      model.dispose();
    }
  });

  test("equals the cached step's forward, and step still works afterwards", async () => {
    const { model } = loadQwen3VlText(file, { backend, weights: "f32" });
    try {
      const [h] = model.forward(IDS, { collect: [3] });
      const fromTaps = headOf(await read(h as Tensor), w);
      const logits = await read(model.step(IDS, { allLogits: true }));
      expect(maxAbsDiff(fromTaps, logits)).toBeLessThan(SAME_OPS_TOL);
      expect(model.cached).toBe(IDS.length);
      const [again] = model.forward(IDS.slice(0, 3), { collect: [3] }); // ignores the cache that now exists
      expect(maxAbsDiff(headOf(await read(again as Tensor), w), fromTaps.subarray(0, 3 * 64))).toBeLessThan(
        SAME_OPS_TOL,
      );
      expect(model.cached).toBe(IDS.length);
    } finally {
      model.dispose();
    }
  });

  test("errors", async () => {
    const { model } = loadQwen3VlText(file, { backend });
    const before = backend.memory.current;
    const code = (f: () => unknown) => {
      try {
        f();
        return "no error";
      } catch (e) {
        return e instanceof TpError ? `${e.code}: ${e.message}` : String(e);
      }
    };
    try {
      expect(code(() => model.forward([], { collect: [1] }))).toBe("E_ARG: forward: no token ids");
      expect(code(() => model.forward([64], { collect: [1] }))).toStartWith("E_ARG: forward: token id 64");
      expect(code(() => model.forward([1], { collect: [4] }))).toStartWith("E_ARG: forward: layer 4 must be");
      expect(code(() => model.forward([1], { collect: [1, 1] }))).toStartWith(
        "E_ARG: forward: layer 1 must be",
      );
      expect(code(() => model.forward([1], { collect: [] }))).toBe("E_ARG: forward: no layers asked for");
      expect(backend.memory.current).toBe(before); // nothing left behind
    } finally {
      model.dispose();
    }
    expect(code(() => loadQwen3VlText(join(tmp, "none.safetensors"), { backend }))).toStartWith("E_IO");
    const other = join(tmp, "other.safetensors");
    writeSafetensors(other, [{ name: "x.weight", dtype: "F32", shape: [1], data: new Uint8Array(4) }]);
    expect(code(() => loadQwen3VlText(other, { backend }))).toStartWith(
      `E_FORMAT: ${other} is not a Qwen3-VL text encoder`,
    );
    expect(code(() => loadQwen3VlText(file, { backend, weights: "int8" as "f32" }))).toBe(
      "E_ARG: unknown weights 'int8'; expected one of: native, f32",
    );
  });
});

// <repo root>/../shared; this file is packages/llm/src/models/, four levels below the root.
const TE = resolve(import.meta.dir, "../../../../../shared/testdata/krea2-tiny");
const TE_FILE = join(TE, "checkpoints/qwen3vl_tiny_te_bf16.safetensors");
const HAVE_TE = existsSync(TE_FILE) && existsSync(join(TE, "te/prompt1_tap35.bin"));

function f32File(path: string): Float32Array {
  const b = readFileSync(path);
  return new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));
}

describe.skipIf(!HAVE_TE)(
  `krea2-tiny Qwen3-VL text encoder vs ComfyUI${HAVE_TE ? "" : ` — skipped: ${TE_FILE} is absent (../shared not beside this checkout)`}`,
  () => {
    const TAPS = [0, 2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35];
    for (const [weights, tol] of [
      ["f32", F32_TAP_REL_TOL],
      ["native", NATIVE_TAP_REL_TOL],
    ] as const) {
      test(`prompt1 embeddings and the 12 taps, weights ${weights} (relative ${tol})`, async () => {
        const idsBytes = readFileSync(join(TE, "te/prompt1_ids.bin"));
        const ids = [
          ...new Int32Array(idsBytes.buffer.slice(idsBytes.byteOffset, idsBytes.byteOffset + 192)),
        ];
        const { model, config } = loadQwen3VlText(TE_FILE, { backend, weights });
        try {
          expect([
            config.hidden_size,
            config.num_hidden_layers,
            config.head_dim,
            config.intermediate_size,
          ]).toEqual([16, 36, 128, 48]);
          const taps = model.forward(ids, { collect: TAPS });
          for (let i = 0; i < TAPS.length; i++) {
            const k = TAPS[i] as number;
            const ref = f32File(
              join(TE, k === 0 ? "te/prompt1_embeds.bin" : `te/prompt1_tap${String(k).padStart(2, "0")}.bin`),
            );
            const got = await read(taps[i] as Tensor);
            const scale = ref.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
            expect({ k, rel: maxAbsDiff(got, ref) / scale < tol }).toEqual({ k, rel: true });
          }
        } finally {
          model.dispose();
        }
      });
    }
  },
);
