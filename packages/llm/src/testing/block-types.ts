/**
 * Test helper (not exported from the package): every GGUF block type against llama.cpp, for any
 * architecture. {@link rewriteGguf} rewrites an F32 GGUF into one block type with the project's GGUF
 * writer and quantizers (`@tp/formats` writeGguf, `@tp/quant` quantizeGgml); {@link describeBlockTypeParity}
 * defines one bun test per (file, type) that loads the rewritten file in ours and in llama.cpp (the
 * parity oracle, scripts/llama-cpp-oracle.ts, in a child process) and compares next-token
 * probabilities of every prompt row and of each greedy step, and the greedy tokens.
 *
 * Which tensors get the type: as llama.cpp's `--pure` quantization and ../shared/models/PROVENANCE.md
 * ("synthetic/"): every tensor of 2 or more dimensions, except the MoE router `ffn_gate_inp*` and the
 * delta-net conv kernel `ssm_conv1d` (llama.cpp's quantizer skips both); 1-D tensors stay F32. A tensor
 * whose rows are not whole blocks of the type gets llama.cpp's fallback type instead (src/llama-quant.cpp,
 * `llama_tensor_get_type`: Q2_K / Q3_K / IQ4_XS → IQ4_NL, Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, then
 * F16 if even that does not divide). The tiny synthetic files have rows of 64 / 128 elements, so the
 * 256-element types need a wider file to be exercised at all: a row may name one (`wide`).
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type GgufTensorInput, openGguf, writeGguf } from "@tp/formats";
import { dequantizeGgml, quantizeGgml } from "@tp/quant";
import { type Backend, encodeFromF32, type WeightFormat, weightFormatInfo } from "@tp/tensor";
import { type LoadedModel, loadModel } from "../load.ts";
import { argmax, llamaCppBinary, runLlamaCppOracle, softmax, topDiff } from "./llama-cpp.ts";

/** The block types of issue 22, GGUF spelling. */
export const BLOCK_TYPES = [
  "F32",
  "F16",
  "BF16",
  "Q8_0",
  "Q4_0",
  "Q4_1",
  "Q5_0",
  "Q5_1",
  "Q2_K",
  "Q3_K",
  "Q4_K",
  "Q5_K",
  "Q6_K",
  "IQ4_NL",
  "IQ4_XS",
] as const;
export type BlockType = (typeof BLOCK_TYPES)[number];

/**
 * Absolute tolerance on next-token probabilities (over llama.cpp's top entries) per type, and why:
 * - F32: f32 summation order only (as parity.test.ts).
 * - F16: llama.cpp rounds the activations to f16 before its f16 dot products (ggml vec_dot_f16), ours
 *   keep f32 (as parity.test.ts).
 * - BF16: both round the activations to bf16 (ggml vec_dot_bf16; our bf16 matmul), exact products,
 *   f32 sums in different orders; measured ≤ 9.2e-6.
 * - the GGUF block types: both quantize the activations to Q8_0 / Q8_1 / Q8_K blocks and take exact
 *   integer block sums, but llama.cpp's AVX2 `quantize_row_q8_0` scales by `127 / max` (the reference:
 *   `1 / (max / 127)`) and rounds half to even (`_mm256_round_ps`, `_MM_ROUND_NEAREST`) where ggml's
 *   reference and ours round half away from zero: an activation on a rounding boundary can get codes
 *   one apart. Measured ≤ 1e-5 except one step of qwen3 Q4_0 (2.1e-3; ours gives the same bits at
 *   the scalar and AVX2 levels there), so 3e-3.
 */
export const BLOCK_TYPE_PROB_TOL: Readonly<Record<BlockType, number>> = {
  F32: 5e-5,
  F16: 5e-3,
  BF16: 1e-4,
  Q8_0: 3e-3,
  Q4_0: 3e-3,
  Q4_1: 3e-3,
  Q5_0: 3e-3,
  Q5_1: 3e-3,
  Q2_K: 3e-3,
  Q3_K: 3e-3,
  Q4_K: 3e-3,
  Q5_K: 3e-3,
  Q6_K: 3e-3,
  IQ4_NL: 3e-3,
  IQ4_XS: 3e-3,
};
/**
 * A greedy step may differ only where llama.cpp's top-2 log-probability gap is below this (nats), as
 * parity.test.ts for the quantized files; F32 must give the same tokens. (F16 too may tie: llama.cpp's
 * f16-rounded activations gave two tokens the very same probability on a qwen3 step here.)
 */
export const BLOCK_TYPE_GAP_NATS = 0.02;

/** llama.cpp's fallback when rows are not whole blocks (llama-quant.cpp `llama_tensor_get_type`). */
const FALLBACK: Partial<Record<BlockType, BlockType>> = {
  Q2_K: "IQ4_NL",
  Q3_K: "IQ4_NL",
  IQ4_XS: "IQ4_NL",
  Q4_K: "Q5_0",
  Q5_K: "Q5_1",
  Q6_K: "Q8_0",
};

const formatOf = (t: BlockType) => t.toLowerCase() as WeightFormat;

/** The type a tensor with rows of `k` elements gets when `type` is asked for. */
export function typeForRow(type: BlockType, k: number): BlockType {
  const fits = (t: BlockType) => k % weightFormatInfo(formatOf(t)).blockElems === 0;
  if (fits(type)) return type;
  const f = FALLBACK[type];
  if (f !== undefined && fits(f)) return f;
  return "F16";
}

/** Tensors that stay F32 whatever the type (llama.cpp's quantizer skips them). */
const KEEP_F32 = /ffn_gate_inp|ssm_conv1d/;

/**
 * Rewrite the GGUF `src` (any tensor types; F32 expected) as `dst` with every quantizable tensor in
 * `type` (module comment). Metadata and tensor order are kept.
 * @returns for each type actually written, the number of tensors in it
 */
export function rewriteGguf(src: string, dst: string, type: BlockType): Record<string, number> {
  const f = openGguf(src);
  const counts: Record<string, number> = {};
  try {
    const tensors: GgufTensorInput[] = f.tensors.map((entry) => {
      const info = f.info(entry.name);
      const ne = info.ne;
      const count = ne.reduce((a, b) => a * b, 1);
      const values = dequantizeGgml(info.format, f.data(entry.name), count, entry.name);
      const t = ne.length >= 2 && !KEEP_F32.test(entry.name) ? typeForRow(type, ne[0] as number) : "F32";
      counts[t] = (counts[t] ?? 0) + 1;
      const fmt = formatOf(t);
      const data =
        t === "F32"
          ? new Uint8Array(values.buffer, values.byteOffset, values.byteLength)
          : t === "F16" || t === "BF16"
            ? encodeFromF32(values, t === "F16" ? "f16" : "bf16")
            : quantizeGgml(fmt, values, count, entry.name);
      return { name: entry.name, type: t, ne, data };
    });
    writeGguf(dst, f.metadata.entries.values(), tensors);
  } finally {
    f.close();
  }
  return counts;
}

/** One row of {@link describeBlockTypeParity}: an F32 GGUF, and optionally a wider one for the 256-element types. */
export interface BlockTypeRow {
  /** Label in test names (the architecture). */
  readonly label: string;
  /** Path of an F32 GGUF (for example ../shared/models/synthetic/llama-tiny-F32.gguf). */
  readonly file: string;
  /**
   * An F32 GGUF of the same architecture whose rows are whole 256-element blocks, used for Q2_K…Q6_K
   * and IQ4_XS; or a function writing one into the given path (run in beforeAll). Without it those
   * types are checked on `file` with llama.cpp's fallback types (the test name says so).
   */
  readonly wide?: string | ((path: string) => void);
  /** Prompt token ids (BOS included where the model wants it); every id below the vocabulary size. */
  readonly ids: readonly number[];
  /** Types to check (default: all of {@link BLOCK_TYPES}). */
  readonly types?: readonly BlockType[];
  /**
   * Tolerances that replace {@link BLOCK_TYPE_PROB_TOL} for some types of this row; each is stated with
   * its reason and measured figure where the row is defined.
   */
  readonly tol?: Partial<Record<BlockType, number>>;
  /** The near-tie gap of the greedy rule for this row (nats; default {@link BLOCK_TYPE_GAP_NATS}). */
  readonly gapNats?: number;
  /** Adjust our loaded model before the comparison (e.g. to emulate a rounding of llama.cpp's). */
  readonly prepare?: (loaded: LoadedModel, backend: Backend) => void;
}

/** Options of {@link checkAgainstLlamaCpp}. */
export interface CheckOptions {
  /** llama.cpp's answer, when already started. */
  readonly oracle?: Promise<Oracle>;
  /** The near-tie gap (nats; default {@link BLOCK_TYPE_GAP_NATS}). */
  readonly gapNats?: number;
  /** Adjust our loaded model first ({@link BlockTypeRow.prepare}). */
  readonly prepare?: (loaded: LoadedModel, backend: Backend) => void;
}

/** llama.cpp's answer on one file (scripts/llama-cpp-oracle.ts). */
export interface Oracle {
  ok: boolean;
  error?: string;
  greedy: number[];
  steps: [number, number][][];
  promptRows: [number, number][][];
}

/**
 * llama.cpp on one thread: its answers do not depend on the thread count here (each dot product is one
 * thread's; every figure of block-types.test.ts was the same with 1 and with 2 threads), and with
 * 2 threads its spinning thread pool took ~5× the wall time of 1 on this 2-core machine with the test
 * runner beside it (qwen35 F16, 16 steps: 5.0 s against 0.8 s).
 */
function runOracle(path: string, ids: readonly number[], n: number): Promise<Oracle> {
  return runLlamaCppOracle<Oracle>(path, { ids, n, top: 8, threads: 1 });
}

/**
 * Compare ours with llama.cpp on one rewritten file: every prompt row's probabilities, then `n`
 * greedy steps (probabilities within `tol`, tokens identical, or with `nearTies` identical up to a
 * near tie of llama.cpp's). Returns the largest probability difference seen.
 */
export async function checkAgainstLlamaCpp(
  backend: Backend,
  path: string,
  ids: readonly number[],
  n: number,
  tol: number,
  nearTies: boolean,
  options: CheckOptions = {},
): Promise<number> {
  const o = await (options.oracle ?? runOracle(path, ids, n));
  expect(o.error).toBeUndefined();
  expect(o.ok).toBe(true);
  const loaded = loadModel(path, { backend, maxContext: 64 });
  const { model, config } = loaded;
  let worst = 0;
  try {
    options.prepare?.(loaded, backend);
    const V = config.vocab_size;
    const all = model.step([...ids], { allLogits: true });
    const rows = (await backend.read(all)) as Float32Array;
    backend.free(all);
    for (let r = 0; r < ids.length; r++) {
      const d = topDiff(softmax(rows, r * V, V), o.promptRows[r] ?? []);
      worst = Math.max(worst, d);
      expect({ row: r, ok: d < tol }).toEqual({ row: r, ok: true });
    }
    let p = softmax(rows, (ids.length - 1) * V, V);
    for (let i = 0; i < n; i++) {
      const theirs = o.steps[i] ?? [];
      const next = argmax(p);
      if (next !== o.greedy[i]) {
        const gap = Math.log((theirs[0]?.[1] ?? 1) / (theirs[1]?.[1] ?? 1e-30));
        expect({
          step: i,
          ours: next,
          llama: o.greedy[i],
          gap,
          nearTie: nearTies && gap <= (options.gapNats ?? BLOCK_TYPE_GAP_NATS),
        }).toMatchObject({ nearTie: true });
        break; // diverged at a near tie: nothing after it is comparable
      }
      const d = topDiff(p, theirs);
      worst = Math.max(worst, d);
      expect({ step: i, ok: d < tol }).toEqual({ step: i, ok: true });
      if (i + 1 === n) break;
      const l = model.step([next]);
      p = softmax((await backend.read(l)) as Float32Array, 0, V);
      backend.free(l);
    }
  } finally {
    model.dispose();
  }
  return worst;
}

/** Whether llama.cpp can run here, and why not. */
export function blockTypeParitySkip(): string {
  return llamaCppBinary() === null ? "no prebuilt linux-x64 llama.cpp binary of node-llama-cpp 3.21.1" : "";
}

/**
 * Define one test per (row, type): rewrite the row's F32 file (or its wide file, for the 256-element
 * types) into the type in a temporary folder, run llama.cpp on it (2 at a time, in beforeAll), and
 * compare with {@link checkAgainstLlamaCpp} over `steps` greedy steps. Rows whose file is absent skip,
 * saying so.
 */
export function describeBlockTypeParity(
  title: string,
  rows: readonly BlockTypeRow[],
  backendFor: () => Backend,
  steps = 16,
): void {
  const skip = blockTypeParitySkip();
  describe.skipIf(skip !== "")(`${title}${skip ? ` — skipped: ${skip}` : ""}`, () => {
    const dir = mkdtempSync(join(tmpdir(), "tp-block-types-"));
    const oracles = new Map<string, Promise<Oracle>>();
    const files = new Map<string, { path: string; counts: Record<string, number> }>();
    const key = (row: BlockTypeRow, t: BlockType) => `${row.label}:${t}`;
    const wide = (t: BlockType) => weightFormatInfo(formatOf(t)).blockElems === 256;
    afterAll(() => rmSync(dir, { recursive: true, force: true }));

    beforeAll(() => {
      const slots: Promise<unknown>[] = [
        Promise.resolve(),
        Promise.resolve(),
        Promise.resolve(),
        Promise.resolve(),
      ];
      let next = 0;
      for (const row of rows) {
        if (!existsSync(row.file)) continue;
        let widePath: string | undefined;
        if (typeof row.wide === "function") {
          widePath = join(dir, `${row.label}-wide-F32.gguf`);
          row.wide(widePath);
        } else widePath = row.wide;
        for (const t of row.types ?? BLOCK_TYPES) {
          const src = wide(t) && widePath !== undefined ? widePath : row.file;
          const path = join(dir, `${row.label}-${src === row.file ? "" : "wide-"}${t}.gguf`);
          const counts = rewriteGguf(src, path, t);
          files.set(key(row, t), { path, counts });
          const slot = next++ % slots.length;
          const run = (slots[slot] as Promise<unknown>).then(() => runOracle(path, row.ids, steps));
          slots[slot] = run;
          oracles.set(key(row, t), run);
        }
      }
    }, 300_000);

    for (const row of rows) {
      for (const t of row.types ?? BLOCK_TYPES) {
        const fallback = wide(t) && row.wide === undefined;
        const tol = row.tol?.[t] ?? BLOCK_TYPE_PROB_TOL[t];
        const name = `${row.label} ${t}${fallback ? ` (rows not whole 256-blocks: llama.cpp's fallback types)` : ""}: probabilities within ${tol}, ${steps} greedy tokens`;
        test.skipIf(!existsSync(row.file))(
          existsSync(row.file) ? name : `${name} — skipped: ${row.file} is absent`,
          async () => {
            const f = files.get(key(row, t));
            if (f === undefined) throw new Error(`no rewritten file for ${key(row, t)}`);
            // the type under test is really in the file (unless the row has no wide file for it)
            if (!fallback) expect((f.counts[t] ?? 0) > 0).toBe(true);
            const oracle = oracles.get(key(row, t));
            const worst = await checkAgainstLlamaCpp(backendFor(), f.path, row.ids, steps, tol, t !== "F32", {
              ...(oracle === undefined ? {} : { oracle }),
              ...(row.gapNats === undefined ? {} : { gapNats: row.gapNats }),
              ...(row.prepare === undefined ? {} : { prepare: row.prepare }),
            });
            if (process.env.TP_BLOCK_TYPES_REPORT)
              console.log(`${row.label} ${t}: max |Δp| ${worst.toExponential(2)}`);
          },
          180_000,
        );
      }
    }
  });
}
