/**
 * LLM placement as llama.cpp users know it (`-ngl N`, `--cpu-moe`, `--n-cpu-moe N`) plus the
 * original project's `--cpu-layers tail|attn`: whole layers — their weights with their KV rows or
 * recurrent state — run on a device backend (Vulkan) or on the host (the cpu backend), and so may the
 * expert stacks of a mixture of experts. Results are the same with any placement (the same ops on the
 * same numbers; only their backends differ).
 *
 * The mechanism is one {@link PlacedBackend}: the Backend an architecture file is written against,
 * over two member backends. Every op runs where its input tensors are (as in torch: ops follow their
 * inputs; a weight placed elsewhere than its activation is an E_STATE, never a silent upload), and a
 * tensor's checkpoint name decides where it is allocated (as llama.cpp's tensor-name buffer
 * overrides): `model.layers.{i}.*` on layer i's backend, `model.layers.{i}.mlp.experts.*` on the host
 * when that layer's experts are, `kv.{slot}.*` / `recurrent.{slot}.*` (the KV cache's and the recurrent
 * state's own names) on the backend of the layer owning the slot, the embedding and `input_ids` with
 * layer 0, the rest (final norm, head, sampling) with the head. So the model files, the KV cache and the
 * recurrent state are unchanged; the crossings are explicit: {@link ForwardPass.next} moves the hidden
 * state [n, hidden_size] to the next block's backend (one crossing per boundary per step), and
 * {@link moeExperts} moves the routed rows to the experts' backend and back.
 *
 * Which layers: the L + 1 slots are the L blocks and the output head (the last slot), as llama.cpp
 * counts them (`src/llama-model.cpp`: `i_gpu_start = max(n_layer + 1 − n_gpu_layers, 0)`, the output
 * layer at index n_layer): `-ngl N` puts the last N slots on the device — N = 1 is the head alone,
 * N ≥ L + 1 everything. llama.cpp keeps the input embedding on the CPU always; here it goes with layer
 * 0 (the embedding of one row per token is a gather, cheap anywhere, and this keeps `-ngl all` equal to
 * running on the device alone). `--cpu-layers tail` keeps the head and a contiguous device prefix and
 * sends the last layers to the host; `--cpu-layers attn` sends the layers that keep KV rows first (from
 * the last), then the tail (llm.md §7.5: the KV-growing layers free the most as the context grows —
 * Qwen 3.5 keeps KV in ¼ of its layers). Device weights are made resident at load (llm.md §7.3.2: LLM
 * weights are pinned, never streamed per token).
 *
 * Sources: ../shared/spec/llm.md §7.3, §7.5; ../shared/ARCHITECTURE.md "Weights and memory"; llama.cpp
 * `--n-gpu-layers`, `--cpu-moe`, `--n-cpu-moe` (common/arg.cpp: experts of the first N layers on the
 * CPU).
 */
import {
  type AttentionOptions,
  type Backend,
  type BackendCapabilities,
  type Conv2dOptions,
  type DTypeName,
  type HostArray,
  type MemoryAccount,
  type OpName,
  type RopeOptions,
  residentBytesOf,
  type Shape,
  type Tensor,
  TpError,
  type Weight,
  type WeightFormat,
  weightResidency,
} from "@tp/tensor";
import type { LlmConfig } from "./model.ts";

/** Which layers `--cpu-layers` sends to the host first (llm.md §7.5). */
export type CpuLayerPolicy = "tail" | "attn";

/** Placement flags, as the CLI takes them. */
export interface PlacementOptions {
  /**
   * Slots on the device, of L + 1 (the L blocks, then the output head): `-ngl N`; "all" (or any N ≥ L + 1)
   * puts everything there, 0 nothing.
   */
  readonly gpuLayers: number | "all";
  /** Which layers go to the host (default: llama.cpp's order, the first layers). */
  readonly cpuLayers?: CpuLayerPolicy;
  /** `--cpu-moe`: the expert stacks of every layer on the host. */
  readonly cpuMoe?: boolean;
  /** `--n-cpu-moe N`: the expert stacks of the first N layers on the host. */
  readonly nCpuMoe?: number;
}

/** Where each part of a model runs: true = the device. */
export interface LayerPlacement {
  /** Per block. */
  readonly layers: readonly boolean[];
  /** The final norm and the output head (and the logits). */
  readonly head: boolean;
  /** Per block: its expert stacks on the host (always true for a host layer). */
  readonly expertsOnHost: readonly boolean[];
}

/** The blocks that keep KV rows (not `linear_attention`), in slot order: slot s is layer kvLayers[s]. */
export function kvLayerIndices(c: LlmConfig): number[] {
  const t = c.layer_types;
  const all = Array.from({ length: c.num_hidden_layers }, (_, i) => i);
  return t === undefined ? all : all.filter((i) => t[i] !== "linear_attention");
}

/** The blocks with a recurrent state (`linear_attention`), in slot order. */
export function recurrentLayerIndices(c: LlmConfig): number[] {
  const t = c.layer_types;
  return t === undefined ? [] : [...t.keys()].filter((i) => t[i] === "linear_attention");
}

/**
 * Which blocks, experts and head run on the device under `o` (see the module comment for the rule).
 * @throws TpError E_ARG naming `-ngl` / `--n-cpu-moe` for a count that is not a whole number ≥ 0, and
 *   `--cpu-moe` / `--n-cpu-moe` for a model without experts (no `num_experts` in its config)
 */
export function placeLayers(c: LlmConfig, o: PlacementOptions): LayerPlacement {
  const L = c.num_hidden_layers;
  const count = (v: number, flag: string) => {
    if (!Number.isSafeInteger(v) || v < 0)
      throw new TpError("E_ARG", `${flag} takes a whole number of layers ≥ 0 (or all), got ${v}`);
  };
  const slots = o.gpuLayers === "all" ? L + 1 : o.gpuLayers;
  count(slots, "-ngl");
  const n = Math.min(slots, L + 1);
  const head = n > 0;
  const onDevice = Math.max(0, n - 1); // blocks on the device, the head taking the first slot
  const layers = new Array<boolean>(L).fill(false);
  if (o.cpuLayers === undefined) {
    for (let i = L - onDevice; i < L; i++) layers[i] = true; // llama.cpp: the last layers
  } else {
    layers.fill(true);
    let toHost = L - onDevice;
    const order: number[] = [];
    if (o.cpuLayers === "attn") order.push(...kvLayerIndices(c).reverse());
    for (let i = L - 1; i >= 0; i--) if (!order.includes(i)) order.push(i);
    for (const i of order) {
      if (toHost-- <= 0) break;
      layers[i] = false;
    }
  }
  if (o.nCpuMoe !== undefined) count(o.nCpuMoe, "--n-cpu-moe");
  if ((o.cpuMoe === true || o.nCpuMoe !== undefined) && !("num_experts" in c)) {
    const flag = o.cpuMoe === true ? "--cpu-moe" : "--n-cpu-moe";
    throw new TpError(
      "E_ARG",
      `${flag} places expert stacks, and this model has none (a dense model); drop ${flag}`,
    );
  }
  const hostExperts = o.cpuMoe === true ? L : Math.min(o.nCpuMoe ?? 0, L);
  const expertsOnHost = layers.map((dev, i) => !dev || i < hostExperts);
  return { layers, head, expertsOnHost };
}

/** "layers 0–3 on cpu, 4–27 + head on vulkan; experts of layers 4–7 on cpu" (for --verbose and banners). */
export function describePlacement(p: LayerPlacement, host: string, device: string): string {
  const ranges = (keep: (i: number) => boolean) => {
    const out: string[] = [];
    for (let i = 0; i < p.layers.length; i++) {
      if (!keep(i)) continue;
      let j = i;
      while (j + 1 < p.layers.length && keep(j + 1)) j++;
      out.push(i === j ? `${i}` : `${i}–${j}`);
      i = j;
    }
    return out.join(", ");
  };
  const dev = ranges((i) => p.layers[i] === true);
  const cpu = ranges((i) => p.layers[i] !== true);
  const exp = ranges((i) => p.layers[i] === true && p.expertsOnHost[i] === true);
  const parts = [
    cpu === "" ? "" : `layers ${cpu}${p.head ? "" : " + head"} on ${host}`,
    dev === "" && !p.head
      ? ""
      : `${dev === "" ? "head" : `layers ${dev}${p.head ? " + head" : ""}`} on ${device}`,
    exp === "" ? "" : `experts of layers ${exp} on ${host}`,
  ];
  return parts.filter((s) => s !== "").join("; ");
}

const LAYER_NAME = /^model\.layers\.(\d+)\.(mlp\.experts\.)?/;
const SLOT_NAME = /^(kv|recurrent)\.(\d+)\./;

/**
 * The Backend a placed model is built over: ops run on the backend of their first input tensor,
 * allocations go by name (module comment), scopes and persist span both members.
 */
export class PlacedBackend implements Backend {
  /** The cpu backend. */
  readonly host: Backend;
  /** The device backend (vulkan). */
  readonly deviceBackend: Backend;
  readonly placement: LayerPlacement;
  readonly name: string;
  readonly #kvLayers: readonly number[];
  readonly #recurrentLayers: readonly number[];
  /** Where each weight was placed (a tied embedding can be in both). */
  readonly #weights = new Map<Weight, Set<Backend>>();
  readonly #resident: Weight[] = [];
  readonly #names = new Map<string, Weight>();

  /** Whether device weights are made resident (false: streamed per op, for a dry run's count). */
  readonly #pin: boolean;

  /**
   * @param options.resident make the device's weights resident at load (default true; false streams
   *   them per op, as a dry run that counts the working peak does)
   * @throws TpError E_ARG when host and device are the same backend
   */
  constructor(
    host: Backend,
    device: Backend,
    config: LlmConfig,
    placement: LayerPlacement,
    options: { readonly resident?: boolean } = {},
  ) {
    if (host === device) throw new TpError("E_ARG", "placement: the host and the device are one backend");
    this.host = host;
    this.deviceBackend = device;
    this.placement = placement;
    this.name = `${device.name}+${host.name}`;
    this.#kvLayers = kvLayerIndices(config);
    this.#recurrentLayers = recurrentLayerIndices(config);
    this.#pin = options.resident ?? true;
  }

  /** The backend of block i (i = num_hidden_layers: the head's). */
  layerBackend(i: number): Backend {
    if (i >= this.placement.layers.length) return this.headBackend;
    return this.placement.layers[i] === true ? this.deviceBackend : this.host;
  }
  get headBackend(): Backend {
    return this.placement.head ? this.deviceBackend : this.host;
  }
  /** Every member, device first. */
  get members(): readonly Backend[] {
    return [this.deviceBackend, this.host];
  }

  /** Where a tensor of this name is allocated (module comment). */
  backendFor(name: string | undefined): Backend {
    if (name === undefined) return this.headBackend;
    const m = LAYER_NAME.exec(name);
    if (m !== null) {
      const i = Number(m[1]);
      if (m[2] !== undefined && this.placement.expertsOnHost[i] === true) return this.host;
      return this.layerBackend(i);
    }
    const s = SLOT_NAME.exec(name);
    if (s !== null) {
      const layer = (s[1] === "kv" ? this.#kvLayers : this.#recurrentLayers)[Number(s[2])];
      return layer === undefined ? this.headBackend : this.layerBackend(layer);
    }
    if (name.startsWith("model.embed_tokens") || name === "input_ids") return this.layerBackend(0);
    return this.headBackend;
  }

  /**
   * Place a weight read under checkpoint name `hf` on {@link backendFor}(hf), resident there when that
   * backend keeps weights (a device); returns that backend (for the format checks of the reader).
   * @throws TpError E_OOM from the device's budget
   */
  placeWeight(hf: string, w: Weight): Backend {
    const b = this.backendFor(hf);
    this.#names.set(hf, w);
    const at = this.#weights.get(w) ?? new Set<Backend>();
    if (!at.has(b)) {
      const r = this.#pin ? weightResidency(b) : null;
      if (r !== null) {
        r.makeResident(w);
        this.#resident.push(w);
      }
      at.add(b);
    }
    this.#weights.set(w, at);
    return b;
  }

  /** The backend holding weight `w` for an op whose activation is `x` (x's when `w` is there too). */
  weightBackend(w: Weight, x: Tensor): Backend {
    const at = this.#weights.get(w);
    if (at === undefined || at.has(x.backend)) return x.backend;
    return at.values().next().value as Backend;
  }

  /** Every weight placed so far, by HF name (for {@link PlacementCosts}). */
  get weightsByName(): ReadonlyMap<string, Weight> {
    return this.#names;
  }

  /** Bytes of the weights made resident on the device. */
  get residentWeightBytes(): number {
    return this.#resident.reduce((s, w) => s + residentBytesOf(w), 0);
  }

  /** Give the device's resident weight copies back (the model's dispose). */
  releaseWeights(): void {
    for (const w of this.#resident) weightResidency(this.deviceBackend)?.evict(w);
    this.#resident.length = 0;
    this.#weights.clear();
  }

  #placed(w: Weight, x: Tensor, op: string): Backend {
    const at = this.#weights.get(w);
    if (at !== undefined && !at.has(x.backend)) {
      throw new TpError(
        "E_STATE",
        `placement: ${op} of weight ${w.name} (on ${[...at].map((b) => b.name).join(", ")}) with ${x.describe()} on ${x.backend.name}; move the activation first (transfer)`,
      );
    }
    return x.backend;
  }

  // ---- Backend: identity and memory -----------------------------------------------------------------

  /** Both devices, for banners. */
  get device(): string {
    return `${this.deviceBackend.device} + ${this.host.device}`;
  }
  get memory(): MemoryAccount {
    return this.deviceBackend.memory;
  }
  capabilities(): BackendCapabilities {
    return this.headBackend.capabilities();
  }
  supports(op: OpName, formats?: readonly (WeightFormat | DTypeName)[]): boolean {
    return this.members.every((b) => b.supports(op, formats));
  }
  alloc(shape: Shape, dtype: DTypeName, name?: string): Tensor {
    return this.backendFor(name).alloc(shape, dtype, name);
  }
  free(t: Tensor): void {
    t.backend.free(t);
  }
  upload(data: HostArray, shape: Shape, dtype: DTypeName, name?: string): Tensor {
    return this.backendFor(name).upload(data, shape, dtype, name);
  }
  read(t: Tensor): Promise<HostArray> {
    return t.backend.read(t);
  }
  scope<T>(fn: () => T): T {
    return this.deviceBackend.scope(() => this.host.scope(fn));
  }
  persist<T>(value: T): T {
    this.host.persist(value);
    return this.deviceBackend.persist(value);
  }
  async synchronize(): Promise<void> {
    await this.deviceBackend.synchronize();
    await this.host.synchronize();
  }
  /** The members belong to their creator: this gives back the resident weights only. */
  dispose(): void {
    this.releaseWeights();
  }

  // ---- Backend: ops, on the backend of their input ----------------------------------------------------

  matmul(x: Tensor, w: Weight, options?: { bias?: Tensor }): Tensor {
    return this.#placed(w, x, "matmul").matmul(x, w, options);
  }
  matmulId(x: Tensor, w: Weight, ids: Tensor, options: { experts: number }): Tensor {
    return this.#placed(w, x, "matmul_id").matmulId(x, w, ids, options);
  }
  attention(q: Tensor, k: Tensor, v: Tensor, options?: AttentionOptions): Tensor {
    return q.backend.attention(q, k, v, options);
  }
  rmsNorm(x: Tensor, weight: Tensor | null, options: { eps: number; unitOffset?: boolean }): Tensor {
    return x.backend.rmsNorm(x, weight, options);
  }
  layerNorm(x: Tensor, weight: Tensor | null, bias: Tensor | null, options: { eps: number }): Tensor {
    return x.backend.layerNorm(x, weight, bias, options);
  }
  groupNorm(
    x: Tensor,
    groups: number,
    weight: Tensor | null,
    bias: Tensor | null,
    options: { eps: number },
  ): Tensor {
    return x.backend.groupNorm(x, groups, weight, bias, options);
  }
  rope(x: Tensor, positions: Tensor, options: RopeOptions): Tensor {
    return x.backend.rope(x, positions, options);
  }
  silu(x: Tensor): Tensor {
    return x.backend.silu(x);
  }
  gelu(x: Tensor, options?: { approximate?: "none" | "tanh" }): Tensor {
    return x.backend.gelu(x, options);
  }
  sigmoid(x: Tensor): Tensor {
    return x.backend.sigmoid(x);
  }
  softplus(x: Tensor): Tensor {
    return x.backend.softplus(x);
  }
  swiglu(gate: Tensor, up: Tensor): Tensor {
    return gate.backend.swiglu(gate, up);
  }
  softmax(x: Tensor, options?: { dim?: number }): Tensor {
    return x.backend.softmax(x, options);
  }
  add(a: Tensor, b: Tensor): Tensor {
    return a.backend.add(a, b);
  }
  sub(a: Tensor, b: Tensor): Tensor {
    return a.backend.sub(a, b);
  }
  mul(a: Tensor, b: Tensor): Tensor {
    return a.backend.mul(a, b);
  }
  scale(x: Tensor, s: number): Tensor {
    return x.backend.scale(x, s);
  }
  modulate(x: Tensor, scale: Tensor, shift: Tensor): Tensor {
    return x.backend.modulate(x, scale, shift);
  }
  embedding(table: Weight, ids: Tensor): Tensor {
    return this.#placed(table, ids, "embedding").embedding(table, ids);
  }
  conv2d(x: Tensor, weight: Tensor, bias: Tensor | null, options?: Conv2dOptions): Tensor {
    return x.backend.conv2d(x, weight, bias, options);
  }
  upsampleNearest2d(x: Tensor, factor: number): Tensor {
    return x.backend.upsampleNearest2d(x, factor);
  }
  concat(tensors: readonly Tensor[], dim: number): Tensor {
    const first = tensors[0];
    if (first === undefined) return this.headBackend.concat(tensors, dim); // its own E_ARG
    return first.backend.concat(tensors, dim);
  }
  slice(x: Tensor, dim: number, start: number, end: number): Tensor {
    return x.backend.slice(x, dim, start, end);
  }
  copy(x: Tensor): Tensor {
    return x.backend.copy(x);
  }
  set(dst: Tensor, src: Tensor): void {
    dst.backend.set(dst, src);
  }
  cast(x: Tensor, dtype: DTypeName, options?: { saturate?: boolean }): Tensor {
    return x.backend.cast(x, dtype, options);
  }
  argmax(x: Tensor): Tensor {
    return x.backend.argmax(x);
  }
  topK(x: Tensor, k: number): { values: Tensor; indices: Tensor } {
    return x.backend.topK(x, k);
  }
  countNonFinite(x: Tensor): Tensor {
    return x.backend.countNonFinite(x);
  }
  ssmConv(x: Tensor, weight: Tensor): Tensor {
    return x.backend.ssmConv(x, weight);
  }
  gatedDeltaNet(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor,
    options?: { scale?: number; chunk?: number },
  ): Tensor {
    return q.backend.gatedDeltaNet(q, k, v, g, beta, state, options);
  }
}

/**
 * The backend holding weight `w` for an op on activation `x`: x's own unless `b` is a
 * {@link PlacedBackend} that put `w` elsewhere (experts kept on the host).
 */
export function weightBackend(b: Backend, w: Weight, x: Tensor): Backend {
  return b instanceof PlacedBackend ? b.weightBackend(w, x) : x.backend;
}

// ---------------------------------------------------------------------------------------------------
// Device memory of a placement, and `--vram-budget` choosing -ngl

/** What one placement costs on the device, in bytes (the account's units). */
export interface DeviceCost {
  /** Resident weights: the device layers' (less experts kept on the host), the head, the embedding with layer 0. */
  readonly weights: number;
  /** KV rows of the device layers at the full context window (rings: their fixed rows). */
  readonly kv: number;
  /** Recurrent state of the device layers, with its snapshots. */
  readonly state: number;
  /** One step's working peak (0 when nothing is on the device; see {@link PlacementCosts.activations}). */
  readonly activations: number;
  readonly total: number;
}

/** What {@link deviceCost} counts from: the weights by checkpoint name, and the per-layer state sizes. */
export interface PlacementCosts {
  readonly config: LlmConfig;
  /** Every weight the architecture reads, by HF name (one Weight may appear under two names when tied). */
  readonly weights: ReadonlyMap<string, Weight>;
  /** Bytes per KV slot at the context window (KvCache: 2 · rows · kv_heads · head_dim · 4). */
  readonly kvSlotBytes: readonly number[];
  /** Bytes per recurrent slot, snapshots included. */
  readonly stateSlotBytes: readonly number[];
  /**
   * The working peak of one step of a micro-batch on the device: the most bytes its account held
   * during a dry step with every weight streamed, beyond what it kept after (its KV rows) — the
   * activations, the scratch and one weight in flight, counted, as the residency planner's
   * `workingPeak` (@tp/tensor residency.ts); with weights resident a step needs at most this.
   */
  readonly activations: number;
}

/** The device bytes of `placement` (the head's, the device layers' weights, their KV and state, activations). */
export function deviceCost(costs: PlacementCosts, placement: LayerPlacement): DeviceCost {
  const probe = new PlacedBackend(PROBE_HOST, PROBE_DEVICE, costs.config, placement);
  const counted = new Set<Weight>();
  let weights = 0;
  for (const [hf, w] of costs.weights) {
    if (probe.backendFor(hf) !== PROBE_DEVICE || counted.has(w)) continue;
    counted.add(w);
    weights += residentBytesOf(w);
  }
  const sum = (slots: readonly number[], layers: readonly number[]) =>
    slots.reduce((s, b, i) => s + (placement.layers[layers[i] as number] === true ? b : 0), 0);
  const kv = sum(costs.kvSlotBytes, kvLayerIndices(costs.config));
  const state = sum(costs.stateSlotBytes, recurrentLayerIndices(costs.config));
  const any = placement.head || placement.layers.includes(true);
  const activations = any ? costs.activations : 0;
  return { weights, kv, state, activations, total: weights + kv + state + activations };
}

/** Stand-ins for {@link deviceCost}'s name lookups (no memory is touched through them). */
const PROBE_HOST = { name: "host" } as Backend;
const PROBE_DEVICE = { name: "device" } as Backend;

/** "12.3 MiB (weights 10.0 MiB, KV 2.0 MiB, state 0 B, activations 0.3 MiB)" */
export function describeDeviceCost(d: DeviceCost): string {
  const mib = (b: number) => `${(b / 2 ** 20).toFixed(2)} MiB`;
  return `${mib(d.total)} (weights ${mib(d.weights)}, KV ${mib(d.kv)}, state ${mib(d.state)}, working peak ${mib(d.activations)})`;
}

/**
 * The placement under a device budget: with `o.gpuLayers`, that one, checked to fit; without, the
 * most slots (llama.cpp's count, see {@link placeLayers}) whose {@link deviceCost} fits — `min` is 0
 * (everything on the host).
 * @throws TpError E_OOM naming `--vram-budget`, the bytes the asked placement needs and their parts
 */
export function placeUnderBudget(
  costs: PlacementCosts,
  o: Omit<PlacementOptions, "gpuLayers"> & { readonly gpuLayers?: number | "all" },
  budget: number | "min",
): { placement: LayerPlacement; cost: DeviceCost; gpuLayers: number } {
  const L = costs.config.num_hidden_layers;
  const bytes = budget === "min" ? 0 : budget;
  const at = (n: number) => {
    const placement = placeLayers(costs.config, { ...o, gpuLayers: n });
    return { placement, cost: deviceCost(costs, placement), gpuLayers: n };
  };
  if (o.gpuLayers !== undefined) {
    const n = o.gpuLayers === "all" ? L + 1 : Math.min(o.gpuLayers, L + 1);
    const p = at(n);
    if (p.cost.total > bytes) {
      throw new TpError(
        "E_OOM",
        `--vram-budget ${bytes} bytes is below the ${p.cost.total} bytes -ngl ${o.gpuLayers} needs on the device: ` +
          `${describeDeviceCost(p.cost)}; raise the budget or lower -ngl`,
      );
    }
    return p;
  }
  for (let n = L + 1; n > 0; n--) {
    const p = at(n);
    if (p.cost.total <= bytes) return p;
  }
  return at(0);
}
