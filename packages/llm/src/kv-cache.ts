/**
 * The KV cache of a decoder-only transformer: per layer, the keys (post-RoPE) and values of every
 * token seen so far, in backend memory, growable up to the context window.
 *
 * Layout: per layer K and V are f32 `[num_kv_heads, capacity, head_dim]`, head-major: the rows of one
 * head are contiguous, so attention reads each head's keys and values as one sequential stream. (llm.md
 * §7.2 describes the Z project's token-major `[capacity][n_kv · hd]`; there a decoding step reads 512-byte
 * pieces 4 KiB apart — one page each, which the hardware prefetcher does not follow: measured on the
 * cpu backend, 28 layers of Qwen3-0.6B's 8 × 128 heads from DRAM, 2 threads, attention per layer at 375
 * / 1000 keys 154 / 433 µs token-major, 99 / 263 µs head-major.) The price: the cpu backend gives
 * blocks of 2 MiB and more huge pages, and a head-major layer holds rows of every head in every huge
 * page, so the first row written makes the whole capacity resident (token-major: the rows used, rounded
 * up to 2 MiB); llama.cpp holds its whole KV from the start too. Measured on the bench model at
 * capacity 1024 after a 512-token prompt: peak RSS 912 → 1030 MB. A forward writes its new rows at
 * `length` in every layer ({@link KvCache.write}) and then commits once ({@link KvCache.commit}), so all
 * layers agree on the length. Attention reads `[1, num_kv_heads, rows, head_dim]` views
 * ({@link KvCache.keys}, {@link KvCache.values}) that share the cache's storage (no copy).
 *
 * Growth (llm.md §7.3 item 3): the first {@link KvCache.reserve} commits
 * `min(maxContext, max(rows + 1, 4096))` rows; later ones grow by ×1.5 (at least +1024 rows, at least
 * what is asked) up to `maxContext`, copying the rows held so far into the new tensors with
 * `backend.set`. The bytes are backend memory, counted by the backend's account (`alloc`) and
 * reported by {@link KvCache.bytes}.
 *
 * Sliding-window layers (Gemma 3's local layers, llm.md §3.5 "Sliding-window KV ring"): a layer with
 * `slidingWindow[l] = W > 0` only ever needs the last W − 1 positions before the rows being written, so
 * it holds `min(maxContext, W + ringBatch)` rows, allocated at the first reservation and never grown.
 * Its row 0 holds position {@link KvCache.start}(l): when a reservation would run past the end, the last
 * W − 1 rows (those the next queries can still see) are moved to the front and the start advances —
 * once every ~ringBatch decoded tokens, W − 1 rows copied. Keys stay in position order, so attention
 * reads `[start, rows)` with `qOffset = offset − start` and the op's causal window mask (no wrapped
 * indices for the kernel to handle). A step may write at most `ringBatch` rows ({@link KvCache.maxStep};
 * `LanguageModel.step` splits longer prefills). Truncating keeps working down to
 * {@link KvCache.truncateFloor}: below it, rows a query would need were dropped, and only 0 (a reset) is
 * possible.
 *
 * Source: ../shared/spec/llm.md §7.2, §7.3; Z-core `kv_cache.zig`.
 */
import { type Backend, type Tensor, TpError } from "@tp/tensor";

/** Shape of a {@link KvCache}. */
export interface KvCacheOptions {
  /** Number of layers with attention (one K and one V tensor each). */
  readonly layers: number;
  /** KV heads per layer (GQA). */
  readonly numKvHeads: number;
  /** Key and value width per head. */
  readonly headDim: number;
  /** The most rows the cache may ever hold (the context window). */
  readonly maxContext: number;
  /** Rows committed by the first reservation at least; default 4096 (llm.md §7.3), capped at maxContext. */
  readonly minRows?: number;
  /**
   * Per layer: the sliding window W of a local-attention layer (it keeps W + ringBatch rows), or 0 for
   * a layer that attends the whole context. Default: every layer full.
   */
  readonly slidingWindow?: readonly number[];
  /** The most rows one step writes into a sliding-window layer (the ring's slack); default 512. */
  readonly ringBatch?: number;
}

/** Default {@link KvCacheOptions.ringBatch}: llama.cpp's default micro-batch (n_ubatch 512). */
export const KV_RING_BATCH = 512;

/** Default rows committed up front (llm.md §7.3: `max(prompt + 1, 4096)`). */
export const KV_INITIAL_ROWS = 4096;
/** Growth factor of a full cache (llm.md §7.3). */
export const KV_GROWTH_FACTOR = 1.5;
/** Smallest growth step in rows (llm.md §7.3). */
export const KV_MIN_GROWTH = 1024;

function positiveInt(name: string, v: unknown): number {
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 1) {
    throw new TpError("E_ARG", `KV cache ${name} must be a positive integer, got ${String(v)}`);
  }
  return v;
}

/**
 * Keys and values of every layer, f32 `[num_kv_heads, capacity, head_dim]` each, on one backend.
 * @example
 * const kv = new KvCache(backend, { layers: 28, numKvHeads: 8, headDim: 128, maxContext: 40960 });
 * kv.reserve(kv.length + n);          // before a forward of n new rows
 * kv.write(layer, k, v);              // k, v: [n, num_kv_heads, head_dim], rows [length, length + n)
 * const keys = kv.keys(layer, kv.length + n); // [1, num_kv_heads, length + n, head_dim] view
 * kv.commit(n);                       // after every layer wrote
 */
export class KvCache {
  readonly backend: Backend;
  readonly layers: number;
  readonly numKvHeads: number;
  readonly headDim: number;
  readonly maxContext: number;
  readonly #minRows: number;
  /** Per layer: its sliding window, 0 for full attention. */
  readonly #window: readonly number[];
  /** Rows of a sliding-window layer's ring (min(maxContext, W + ringBatch)), 0 for a full layer. */
  readonly #ringRows: readonly number[];
  readonly #ringBatch: number;
  /** Per layer: the position held in row 0 (always 0 for a full layer). */
  readonly #start: number[];
  #k: Tensor[] = [];
  #v: Tensor[] = [];
  #capacity = 0;
  #length = 0;
  #disposed = false;

  /** @throws TpError E_ARG for a non-positive size */
  constructor(backend: Backend, options: KvCacheOptions) {
    this.backend = backend;
    this.layers = positiveInt("layers", options.layers);
    this.numKvHeads = positiveInt("numKvHeads", options.numKvHeads);
    this.headDim = positiveInt("headDim", options.headDim);
    this.maxContext = positiveInt("maxContext", options.maxContext);
    this.#minRows = positiveInt("minRows", options.minRows ?? KV_INITIAL_ROWS);
    this.#ringBatch = positiveInt("ringBatch", options.ringBatch ?? KV_RING_BATCH);
    const windows = options.slidingWindow ?? [];
    if (windows.length !== 0 && windows.length !== this.layers) {
      throw new TpError(
        "E_ARG",
        `KV cache slidingWindow must have one entry per layer (${this.layers}), got ${windows.length}`,
      );
    }
    this.#window = Array.from({ length: this.layers }, (_, l) => {
      const w = windows[l] ?? 0;
      return w === 0 ? 0 : positiveInt(`slidingWindow[${l}]`, w);
    });
    this.#ringRows = this.#window.map((w) => (w === 0 ? 0 : Math.min(this.maxContext, w + this.#ringBatch)));
    this.#start = this.#window.map(() => 0);
  }

  /** Committed rows (tokens whose keys and values every layer holds): the next position. */
  get length(): number {
    return this.#length;
  }
  /** Rows allocated per full-attention layer (0 before the first reservation). */
  get capacity(): number {
    return this.#capacity;
  }
  /**
   * Backend bytes held: 2 · Σ_layers rows · num_kv_heads · head_dim · 4 (f32), rows = capacity for a
   * full layer and its ring for a sliding-window one (0 before the first reservation).
   */
  get bytes(): number {
    if (this.#capacity === 0) return 0;
    let rows = 0;
    for (let l = 0; l < this.layers; l++) rows += this.#layerRows(l);
    return 2 * rows * this.numKvHeads * this.headDim * 4;
  }
  /** The most rows one step may write (ringBatch with a sliding-window layer, else unbounded). */
  get maxStep(): number {
    return this.#window.some((w) => w > 0) ? this.#ringBatch : Number.POSITIVE_INFINITY;
  }
  /** The position held in row 0 of a layer's tensors (> 0 once a sliding-window ring moved on). */
  start(layer: number): number {
    this.#assertLive();
    const s = this.#start[layer];
    if (s === undefined) throw new TpError("E_ARG", `KV cache: no layer ${layer} (of ${this.layers})`);
    return s;
  }
  /**
   * The shortest length {@link KvCache.truncate} can keep besides 0: a query at position `len` of a
   * sliding-window layer needs positions from len − W + 1 on, which must still be held. 0 when every
   * length down to 0 works.
   */
  get truncateFloor(): number {
    let floor = 0;
    for (let l = 0; l < this.layers; l++) {
      const s = this.#start[l] as number;
      if (s > 0) floor = Math.max(floor, s + (this.#window[l] as number) - 1);
    }
    return floor;
  }

  /** Rows allocated in layer l (its ring, or the full capacity). */
  #layerRows(l: number): number {
    return (this.#ringRows[l] as number) > 0 ? (this.#ringRows[l] as number) : this.#capacity;
  }

  #assertLive(): void {
    if (this.#disposed) throw new TpError("E_STATE", "the KV cache was disposed");
  }

  /**
   * Make room for `rows` rows in total (allocating or growing every layer; the rows held are kept).
   * @throws TpError E_ARG when rows > maxContext ("context window full"); E_OOM from the backend
   *   (the cache is unchanged then)
   */
  reserve(rows: number): void {
    this.#assertLive();
    if (!Number.isSafeInteger(rows) || rows < 0) {
      throw new TpError("E_ARG", `KV cache reserve: rows must be a non-negative integer, got ${rows}`);
    }
    if (rows > this.maxContext) {
      throw new TpError(
        "E_ARG",
        `context window full: ${rows} tokens do not fit the context of ${this.maxContext} (raise --ctx)`,
      );
    }
    const n = rows - this.#length;
    if (n > this.maxStep) {
      throw new TpError(
        "E_STATE",
        `KV cache: a step of ${n} rows exceeds the sliding-window ring's batch of ${this.#ringBatch}; split it`,
      );
    }
    if (this.#capacity > 0) this.#advanceRings(rows);
    if (rows <= this.#capacity) return;
    const cap =
      this.#capacity === 0
        ? Math.min(this.maxContext, Math.max(rows + 1, this.#minRows))
        : Math.min(
            this.maxContext,
            Math.max(rows, Math.ceil(this.#capacity * KV_GROWTH_FACTOR), this.#capacity + KV_MIN_GROWTH),
          );
    const first = this.#capacity === 0;
    const fresh: Tensor[] = [];
    try {
      for (let l = 0; l < this.layers; l++) {
        const ring = this.#ringRows[l] as number;
        if (ring > 0 && !first) {
          fresh.push(this.#k[l] as Tensor, this.#v[l] as Tensor); // rings are allocated once
          continue;
        }
        const shape = [this.numKvHeads, ring > 0 ? ring : cap, this.headDim];
        fresh.push(this.backend.alloc(shape, "f32", `kv.${l}.k`));
        fresh.push(this.backend.alloc(shape, "f32", `kv.${l}.v`));
      }
      if (this.#length > 0) {
        for (let l = 0; l < this.layers; l++) {
          if ((this.#ringRows[l] as number) > 0) continue;
          this.backend.set(
            (fresh[2 * l] as Tensor).slice(1, 0, this.#length),
            (this.#k[l] as Tensor).slice(1, 0, this.#length),
          );
          this.backend.set(
            (fresh[2 * l + 1] as Tensor).slice(1, 0, this.#length),
            (this.#v[l] as Tensor).slice(1, 0, this.#length),
          );
        }
      }
    } catch (e) {
      for (let i = 0; i < fresh.length; i++) {
        if (first || (this.#ringRows[i >> 1] as number) === 0) this.backend.free(fresh[i] as Tensor);
      }
      throw e;
    }
    for (let l = 0; l < this.#k.length; l++) {
      if ((this.#ringRows[l] as number) > 0) continue; // kept as they are
      this.backend.free(this.#k[l] as Tensor);
      this.backend.free(this.#v[l] as Tensor);
    }
    this.backend.persist(fresh); // the cache outlives any backend.scope it grows in
    this.#k = fresh.filter((_, i) => i % 2 === 0);
    this.#v = fresh.filter((_, i) => i % 2 === 1);
    this.#capacity = cap;
  }

  /**
   * Write the keys and values of `n` new positions of one layer at rows [length, length + n) (not yet
   * committed). k, v: f32 [n, num_kv_heads, head_dim] (any view).
   * @throws TpError E_STATE before {@link reserve} made room; E_SHAPE from `backend.set`
   */
  write(layer: number, k: Tensor, v: Tensor): void {
    this.#assertLive();
    const n = k.shape[0] ?? 0;
    const at = this.#length - this.start(layer); // the row of position `length` in this layer
    if (this.#capacity === 0 || at + n > this.#layerRows(layer)) {
      throw new TpError(
        "E_STATE",
        `KV cache: ${n} rows at ${this.#length} exceed the capacity of layer ${layer}; call reserve first`,
      );
    }
    // [n, kvh, hd] → [kvh, n, hd] into the rows of positions [length, length + n) of every head
    this.backend.set(this.#layerK(layer).slice(1, at, at + n), k.permute(1, 0, 2));
    this.backend.set(this.#layerV(layer).slice(1, at, at + n), v.permute(1, 0, 2));
  }

  /**
   * Keys of positions [start(layer), rows) of a layer: a view [1, num_kv_heads, rows − start, head_dim]
   * on the cache (start is 0 for a full layer).
   */
  keys(layer: number, rows: number): Tensor {
    return this.#rows(layer, this.#layerK(layer), rows);
  }
  /** Values of positions [start(layer), rows) of a layer, as {@link KvCache.keys}. */
  values(layer: number, rows: number): Tensor {
    return this.#rows(layer, this.#layerV(layer), rows);
  }

  /** All layers wrote `n` new rows: they become part of the cache. @throws TpError E_STATE past capacity */
  commit(n: number): void {
    this.#assertLive();
    if (!Number.isSafeInteger(n) || n < 0 || !this.#fits(this.#length + n)) {
      throw new TpError(
        "E_STATE",
        `KV cache: cannot commit ${n} rows at ${this.#length} (capacity ${this.#capacity})`,
      );
    }
    this.#length += n;
  }

  /**
   * Forget rows from `len` on (0 ≤ len ≤ length); the memory stays committed. With sliding-window
   * layers, `len` must be 0 or at least {@link KvCache.truncateFloor}.
   * @throws TpError E_ARG outside [0, length]; E_STATE between 0 and the floor (naming both)
   */
  truncate(len: number): void {
    this.#assertLive();
    if (!Number.isSafeInteger(len) || len < 0 || len > this.#length) {
      throw new TpError("E_ARG", `KV cache truncate: length must be in [0, ${this.#length}], got ${len}`);
    }
    const floor = this.truncateFloor;
    if (len > 0 && len < floor) {
      throw new TpError(
        "E_STATE",
        `KV cache truncate: the sliding-window rows before position ${floor} were dropped, so ${len} cannot be kept; truncate to 0 or to at least ${floor}`,
      );
    }
    this.#length = len;
    if (len === 0) this.#start.fill(0);
  }

  /** Free every layer's tensors; the cache is unusable afterwards. Idempotent. */
  dispose(): void {
    if (this.#disposed) return;
    this.#freeTensors();
    this.#capacity = 0;
    this.#length = 0;
    this.#disposed = true;
  }

  /** Every layer holds positions [start, rows) (nothing is allocated before the first reservation). */
  #fits(rows: number): boolean {
    if (this.#capacity === 0) return rows === 0;
    for (let l = 0; l < this.layers; l++) {
      if (rows - (this.#start[l] as number) > this.#layerRows(l)) return false;
    }
    return true;
  }

  /**
   * Before rows [length, rows) are written: move each sliding-window ring whose rows would run past its
   * end so that it holds the last W − 1 positions before `length` at its front (through a temporary:
   * the source and destination rows may overlap).
   */
  #advanceRings(rows: number): void {
    for (let l = 0; l < this.layers; l++) {
      const ring = this.#ringRows[l] as number;
      const start = this.#start[l] as number;
      if (ring === 0 || rows - start <= ring) continue;
      const keep = Math.min(this.#length - start, (this.#window[l] as number) - 1);
      const from = this.#length - keep - start; // row of the first position kept
      for (const t of [this.#k[l] as Tensor, this.#v[l] as Tensor]) {
        if (keep === 0) break;
        const moved = this.backend.copy(t.slice(1, from, from + keep));
        try {
          this.backend.set(t.slice(1, 0, keep), moved);
        } finally {
          this.backend.free(moved);
        }
      }
      this.#start[l] = this.#length - keep;
    }
  }

  #freeTensors(): void {
    for (const t of [...this.#k, ...this.#v]) this.backend.free(t);
    this.#k = [];
    this.#v = [];
  }

  #layerK(layer: number): Tensor {
    this.#assertLive();
    const t = this.#k[layer];
    if (t === undefined)
      throw new TpError("E_STATE", `KV cache: no keys for layer ${layer} (capacity ${this.#capacity})`);
    return t;
  }
  #layerV(layer: number): Tensor {
    this.#assertLive();
    const t = this.#v[layer];
    if (t === undefined)
      throw new TpError("E_STATE", `KV cache: no values for layer ${layer} (capacity ${this.#capacity})`);
    return t;
  }

  #rows(layer: number, t: Tensor, rows: number): Tensor {
    const start = this.start(layer);
    const held = rows - start;
    if (!Number.isSafeInteger(rows) || held < 0 || held > this.#layerRows(layer)) {
      throw new TpError(
        "E_ARG",
        `KV cache: rows must be in [${start}, ${start + this.#layerRows(layer)}] for layer ${layer}, got ${rows}`,
      );
    }
    // [kvh, held, hd] → [1, kvh, held, hd] (strided view, no copy)
    return t.slice(1, 0, held).reshape(1, this.numKvHeads, held, this.headDim);
  }
}
