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
}

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
  }

  /** Committed rows (tokens whose keys and values every layer holds): the next position. */
  get length(): number {
    return this.#length;
  }
  /** Rows allocated per layer (0 before the first reservation). */
  get capacity(): number {
    return this.#capacity;
  }
  /** Backend bytes held: 2 · layers · capacity · num_kv_heads · head_dim · 4 (f32). */
  get bytes(): number {
    return 2 * this.layers * this.#capacity * this.numKvHeads * this.headDim * 4;
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
    if (rows <= this.#capacity) return;
    const cap =
      this.#capacity === 0
        ? Math.min(this.maxContext, Math.max(rows + 1, this.#minRows))
        : Math.min(
            this.maxContext,
            Math.max(rows, Math.ceil(this.#capacity * KV_GROWTH_FACTOR), this.#capacity + KV_MIN_GROWTH),
          );
    const shape = [this.numKvHeads, cap, this.headDim];
    const fresh: Tensor[] = [];
    try {
      for (let l = 0; l < this.layers; l++) {
        fresh.push(this.backend.alloc(shape, "f32", `kv.${l}.k`));
        fresh.push(this.backend.alloc(shape, "f32", `kv.${l}.v`));
      }
      if (this.#length > 0) {
        for (let l = 0; l < this.layers; l++) {
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
      for (const t of fresh) this.backend.free(t);
      throw e;
    }
    this.#freeTensors();
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
    if (this.#length + n > this.#capacity) {
      throw new TpError(
        "E_STATE",
        `KV cache: ${n} rows at ${this.#length} exceed the capacity ${this.#capacity}; call reserve first`,
      );
    }
    // [n, kvh, hd] → [kvh, n, hd] into rows [length, length + n) of every head
    this.backend.set(this.#layerK(layer).slice(1, this.#length, this.#length + n), k.permute(1, 0, 2));
    this.backend.set(this.#layerV(layer).slice(1, this.#length, this.#length + n), v.permute(1, 0, 2));
  }

  /** Keys of rows [0, rows) of a layer: a view [1, num_kv_heads, rows, head_dim] on the cache. */
  keys(layer: number, rows: number): Tensor {
    return this.#rows(this.#layerK(layer), rows);
  }
  /** Values of rows [0, rows) of a layer: a view [1, num_kv_heads, rows, head_dim] on the cache. */
  values(layer: number, rows: number): Tensor {
    return this.#rows(this.#layerV(layer), rows);
  }

  /** All layers wrote `n` new rows: they become part of the cache. @throws TpError E_STATE past capacity */
  commit(n: number): void {
    this.#assertLive();
    if (!Number.isSafeInteger(n) || n < 0 || this.#length + n > this.#capacity) {
      throw new TpError(
        "E_STATE",
        `KV cache: cannot commit ${n} rows at ${this.#length} (capacity ${this.#capacity})`,
      );
    }
    this.#length += n;
  }

  /** Forget rows from `len` on (0 ≤ len ≤ length); the memory stays committed. @throws TpError E_ARG */
  truncate(len: number): void {
    this.#assertLive();
    if (!Number.isSafeInteger(len) || len < 0 || len > this.#length) {
      throw new TpError("E_ARG", `KV cache truncate: length must be in [0, ${this.#length}], got ${len}`);
    }
    this.#length = len;
  }

  /** Free every layer's tensors; the cache is unusable afterwards. Idempotent. */
  dispose(): void {
    if (this.#disposed) return;
    this.#freeTensors();
    this.#capacity = 0;
    this.#length = 0;
    this.#disposed = true;
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

  #rows(t: Tensor, rows: number): Tensor {
    if (!Number.isSafeInteger(rows) || rows < 0 || rows > this.#capacity) {
      throw new TpError("E_ARG", `KV cache: rows must be in [0, ${this.#capacity}], got ${rows}`);
    }
    // [kvh, rows, hd] → [1, kvh, rows, hd] (strided view, no copy)
    return t.slice(1, 0, rows).reshape(1, this.numKvHeads, rows, this.headDim);
  }
}
