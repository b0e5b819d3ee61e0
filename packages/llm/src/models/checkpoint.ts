/**
 * Reading a checkpoint by Hugging Face tensor names (`model.layers.0.self_attn.q_proj.weight`), whatever
 * the container calls them: a {@link CheckpointReader} maps an HF name to the file's name (GGUF
 * `blk.0.attn_q.weight` through @tp/formats' tables, or the HF name under a prefix), and
 * {@link WeightReader} reads the three kinds of weight an architecture file lists — matmul weights
 * (`Weight` views on the mapping, any stored format), the embedding, and 1-D norm scales (uploaded as
 * f32) — each checked against the shape the config implies.
 *
 * Sources: ../shared/spec/llm.md §1.1.1 (GGUF tensor names), §1.2 (safetensors checkpoints).
 */
import { loadWeight, type TensorEntry, type TensorSource } from "@tp/formats";
import { type Backend, type DTypeName, type OpName, type Tensor, TpError, Weight } from "@tp/tensor";
import { PlacedBackend } from "../placement.ts";

/**
 * A checkpoint seen through Hugging Face tensor names: `name(hf)` gives the name in the file.
 */
export interface CheckpointReader {
  /** The opened checkpoint. */
  readonly source: TensorSource;
  /** The file's name of an HF tensor name. */
  name(hf: string): string;
  /** When given, every file name looked up (read or probed) is added: the tensors the model knows. */
  readonly seen?: Set<string>;
}

/** Companions of a read `X.weight` that @tp/formats' loadWeight reads itself (scales, markers). */
const COMPANIONS = [".weight_scale", ".weight_scale_2", ".input_scale", ".comfy_quant"];

/**
 * The tensors of the checkpoint that no lookup of `r` touched (nor are companions of a read weight),
 * in file order: for a warning after the model is created. Empty when `r` does not track lookups.
 */
export function unreadTensors(r: CheckpointReader): string[] {
  const seen = r.seen;
  if (seen === undefined) return [];
  const known = new Set(seen);
  for (const n of seen) {
    if (!n.endsWith(".weight")) continue;
    for (const c of COMPANIONS) known.add(n.slice(0, -".weight".length) + c);
  }
  return r.source.tensors.filter((t) => !known.has(t.name)).map((t) => t.name);
}

/** True when the checkpoint has the tensor of this HF name. */
export function hasTensor(r: CheckpointReader, hf: string): boolean {
  const name = r.name(hf);
  r.seen?.add(name);
  return r.source.has(name);
}

/**
 * The entry of an HF name.
 * @throws TpError E_FORMAT naming file and tensor when it is missing
 */
export function tensorEntry(r: CheckpointReader, hf: string): TensorEntry {
  const name = r.name(hf);
  r.seen?.add(name);
  if (!r.source.has(name)) {
    throw new TpError(
      "E_FORMAT",
      `missing tensor '${name}'${name === hf ? "" : ` (HF ${hf})`}: the checkpoint is incomplete or not this architecture`,
      { file: r.source.path, tensor: name },
    );
  }
  return r.source.tensor(name);
}

/**
 * A matmul weight [N, K] (`y = x · Wᵀ`) by HF name, in its stored format (f32, f16, bf16, fp8 with its
 * scale, GGUF blocks, …; format detection by @tp/formats `loadWeight`), checked against the shape the
 * config implies.
 * @throws TpError E_FORMAT naming file and tensor when it is missing or its shape differs
 */
export function readWeight(r: CheckpointReader, hf: string, shape: readonly [number, number]): Weight {
  const e = tensorEntry(r, hf);
  const w = loadWeight(r.source, e.name, shape[1]);
  if (e.shape.length !== 2 || w.shape[0] !== shape[0] || w.shape[1] !== shape[1]) {
    throw new TpError(
      "E_FORMAT",
      `tensor shape [${e.shape.join(", ")}] (as [N, K]: [${w.shape.join(", ")}]) differs from [${shape.join(", ")}] that the config implies`,
      { file: e.file, tensor: e.name },
    );
  }
  return w;
}

const VECTOR_DTYPES: Readonly<Record<string, DTypeName>> = { f32: "f32", f16: "f16", bf16: "bf16" };

/**
 * A 1-D float tensor of `length` (a norm scale) by HF name, uploaded to the backend as f32 [length]
 * (f16 / bf16 are converted with backend.cast).
 * @throws TpError E_FORMAT naming file and tensor when missing, of another length, or not a float type
 */
export function readVector(backend: Backend, r: CheckpointReader, hf: string, length: number): Tensor {
  const e = tensorEntry(r, hf);
  const numel = e.shape.reduce((a, b) => a * b, 1);
  const dtype = e.format === null ? undefined : VECTOR_DTYPES[e.format];
  if (dtype === undefined || numel !== length || e.shape.filter((d) => d !== 1).length > 1) {
    throw new TpError(
      "E_FORMAT",
      `expected a float vector of ${length} (f32, f16 or bf16), got ${e.dtype} [${e.shape.join(", ")}]`,
      { file: e.file, tensor: e.name },
    );
  }
  const up = backend.upload(r.source.data(e.name), [length], dtype, hf);
  if (dtype === "f32") return up;
  using _stored = up;
  return backend.cast(up, "f32");
}

/**
 * What an architecture file reads its weights with: every method takes the HF name and the shape the
 * config implies, and checks at load (not at the first forward) that the backend runs the weight's
 * format. Call it inside `backend.scope(() => …)` returning the weights as plain objects, so a failure
 * half-way frees the norm scales already uploaded.
 */
export class WeightReader {
  readonly backend: Backend;
  readonly checkpoint: CheckpointReader;

  constructor(backend: Backend, checkpoint: CheckpointReader) {
    this.backend = backend;
    this.checkpoint = checkpoint;
  }

  /** True when the checkpoint has this HF name. */
  has(hf: string): boolean {
    return hasTensor(this.checkpoint, hf);
  }

  /**
   * A projection [N, K] for `backend.matmul`.
   * @throws TpError E_FORMAT (missing, mis-shaped); E_UNSUPPORTED when the backend's matmul does not
   *   take its format, naming file and tensor
   */
  linear(hf: string, shape: readonly [number, number]): Weight {
    return this.#weight(hf, shape, LINEAR);
  }

  /**
   * The token embedding [vocab_size, hidden_size] for `backend.embedding`, and for `backend.matmul`
   * too when it is also the output head (`tied`).
   * @throws TpError as {@link WeightReader.linear}
   */
  embedding(hf: string, shape: readonly [number, number], tied: boolean): Weight {
    if (!tied) return this.#weight(hf, shape, EMBEDDING);
    const w = this.#weight(hf, shape, EMBEDDING_AND_HEAD);
    return this.#supported("lm_head.weight", w, LINEAR); // the head's placement too (placement.ts)
  }

  /**
   * A stack of expert projections [experts, N, K] (GGUF `blk.N.ffn_*_exps`, stored expert-major) for
   * `backend.matmulId`: one Weight [experts·N, K] over the stored bytes, not copied. A checkpoint
   * without the stack that has every expert as its own tensor (HF `mlp.experts.{e}.gate_proj.weight`
   * for the stack `mlp.experts.gate_proj.weight`) gets them copied, once at load, into one host stack
   * ({@link stackExperts}).
   * @throws TpError E_FORMAT (missing, not that 3-D shape); E_UNSUPPORTED when the backend's matmul_id
   *   does not take its format, naming file and tensor
   */
  experts(hf: string, shape: readonly [number, number, number]): Weight {
    const [e, n, k] = shape;
    const perExpert = (i: number) => hf.replace(/experts\.(?=[^.]+\.weight$)/, `experts.${i}.`);
    if (!this.has(hf) && perExpert(0) !== hf && this.has(perExpert(0))) {
      const parts = Array.from({ length: e }, (_, i) => readWeight(this.checkpoint, perExpert(i), [n, k]));
      return this.#supported(hf, stackExperts(hf, parts, this.checkpoint.source.path), MATMUL_ID);
    }
    const entry = tensorEntry(this.checkpoint, hf);
    if (entry.shape.length !== 3 || entry.shape[0] !== e || entry.shape[1] !== n || entry.shape[2] !== k) {
      throw new TpError(
        "E_FORMAT",
        `tensor shape [${entry.shape.join(", ")}] differs from the expert stack [${shape.join(", ")}] that the config implies`,
        { file: entry.file, tensor: entry.name },
      );
    }
    return this.#supported(hf, loadWeight(this.checkpoint.source, entry.name, k), MATMUL_ID);
  }

  /** A norm scale f32 [length]. @throws TpError E_FORMAT naming file and tensor */
  norm(hf: string, length: number): Tensor {
    return readVector(this.backend, this.checkpoint, hf, length);
  }

  /**
   * Refuse a bias the forward does not add (`{module}.bias` beside `{module}.weight`).
   * @throws TpError E_UNSUPPORTED naming file and tensor
   */
  noBias(module: string, architecture: string): void {
    if (!this.has(`${module}.bias`)) return;
    throw new TpError("E_UNSUPPORTED", `${architecture} with attention biases is not implemented`, {
      file: this.checkpoint.source.path,
      tensor: this.checkpoint.name(`${module}.bias`),
    });
  }

  #weight(hf: string, shape: readonly [number, number], ops: readonly OpName[]): Weight {
    return this.#supported(hf, readWeight(this.checkpoint, hf, shape), ops);
  }

  /** `w` when the backend runs every op of `ops` on its format. @throws TpError E_UNSUPPORTED naming file and tensor */
  #supported(hf: string, w: Weight, ops: readonly OpName[]): Weight {
    const placed = this.backend instanceof PlacedBackend ? this.backend : null;
    const b = placed?.backendFor(hf) ?? this.backend; // a placed model: the backend its name puts it on
    for (const op of ops) {
      if (!b.supports(op, [w.format])) {
        throw new TpError(
          "E_UNSUPPORTED",
          `backend ${b.name} cannot run ${op} on ${w.format} weights; formats it has: ${b.capabilities().weightFormats.join(", ")}`,
          { file: this.checkpoint.source.path, tensor: this.checkpoint.name(hf) },
        );
      }
    }
    placed?.placeWeight(hf, w); // resident on a device
    return w;
  }
}

/**
 * One Weight [experts·N, K] from the experts' own Weights [N, K] (the same format), their bytes copied
 * expert-major into one host buffer — the layout of a GGUF stack, so matmul_id reads it alike. Row
 * scales (ConvRot) are concatenated; a per-tensor scale (fp8) must be the same for every expert.
 * @param name the stack's name; @param file for messages
 * @throws TpError E_FORMAT when the experts differ in format or rotation group; E_UNSUPPORTED for
 *   per-tensor scales that differ between experts
 */
export function stackExperts(name: string, parts: readonly Weight[], file: string): Weight {
  const first = parts[0];
  if (first === undefined) throw new TpError("E_ARG", `no experts to stack for ${name}`, { file });
  const [n, k] = first.shape;
  for (const p of parts) {
    if (p.format !== first.format || p.rotationGroup !== first.rotationGroup) {
      throw new TpError(
        "E_FORMAT",
        `the experts of a stack must share one format: ${p.name} is ${p.format}, ${first.name} ${first.format}`,
        { file, tensor: p.name },
      );
    }
    if (
      first.scale?.kind === "tensor" &&
      (p.scale?.kind !== "tensor" || p.scale.value !== first.scale.value)
    ) {
      throw new TpError(
        "E_UNSUPPORTED",
        `experts with different per-tensor scales (${p.name}, ${first.name}) cannot share one matmul_id weight`,
        { file, tensor: p.name },
      );
    }
  }
  const data = new Uint8Array(parts.reduce((a, p) => a + p.data.byteLength, 0));
  let at = 0;
  for (const p of parts) {
    data.set(p.data, at);
    at += p.data.byteLength;
  }
  let scale = first.scale;
  if (scale?.kind === "row") {
    const values = new Float32Array(parts.length * n);
    parts.forEach((p, i) => {
      if (p.scale?.kind === "row") values.set(p.scale.values, i * n);
    });
    scale = { kind: "row", values };
  }
  return new Weight({
    name,
    format: first.format,
    shape: [parts.length * n, k],
    data,
    ...(scale === undefined ? {} : { scale }),
    ...(first.rotationGroup === undefined ? {} : { rotationGroup: first.rotationGroup }),
  });
}

const LINEAR: readonly OpName[] = ["matmul"];
const MATMUL_ID: readonly OpName[] = ["matmul_id"];
const EMBEDDING: readonly OpName[] = ["embedding"];
const EMBEDDING_AND_HEAD: readonly OpName[] = ["embedding", "matmul"];
