/**
 * Device memory for CUDA backends: a caching sub-allocator over cuMemAlloc / cuMemFree, and pinned
 * staging buffers for uploads. Kept apart from the bun:ffi file so the bookkeeping is tested without a
 * GPU (the raw allocator is injected).
 *
 * Caching: a freed block goes to a free list by its rounded size and is handed out again to the next
 * request of that size, without a driver call. All work of a backend runs on one stream, so a block
 * reused by a later op is only touched after every earlier op that used it (stream order) — the rule
 * PyTorch's CUDA caching allocator relies on. When the driver is out of memory the cache is emptied and
 * the allocation retried once.
 *
 * Sizes: requests round up to 512 B below 1 MiB (to a power of two, so few classes), and to 2 MiB
 * above it. Source: PyTorch c10/cuda CUDACachingAllocator (the rounding idea, not its code).
 */
import { formatBytes, TpError } from "@tp/tensor";

/** The raw allocator beneath the cache (cuMemAlloc / cuMemFree for a device). */
export interface RawDeviceAllocator {
  /** @throws TpError E_OOM when the device has no room */
  alloc(bytes: number): bigint;
  free(ptr: bigint): void;
}

/** A block of device memory handed out by {@link CachingAllocator}. */
export interface DeviceBlock {
  readonly ptr: bigint;
  /** Bytes asked for. */
  readonly bytes: number;
  /** Bytes the block holds (the size class). */
  readonly capacity: number;
}

/** Byte counts of a {@link CachingAllocator}. */
export interface AllocatorStats {
  /** Bytes of blocks handed out now (their size classes). */
  readonly inUse: number;
  /** Bytes held in the free lists, ready for reuse. */
  readonly cached: number;
  /** inUse + cached: what the driver has given. */
  readonly reserved: number;
  /** Most bytes reserved at once. */
  readonly peakReserved: number;
  /** Driver allocations made and requests served from the cache. */
  readonly driverAllocs: number;
  readonly cacheHits: number;
}

const SMALL = 1 << 20;
const LARGE_ROUND = 2 << 20;

/** The size class of a request of `bytes` (see the module comment). */
export function sizeClass(bytes: number): number {
  if (!Number.isSafeInteger(bytes) || bytes < 0) throw new TpError("E_ARG", `cannot allocate ${bytes} bytes`);
  if (bytes <= 512) return 512;
  if (bytes <= SMALL) return 2 ** Math.ceil(Math.log2(bytes));
  return Math.ceil(bytes / LARGE_ROUND) * LARGE_ROUND;
}

/** The caching sub-allocator (see the module comment). */
export class CachingAllocator {
  readonly #raw: RawDeviceAllocator;
  readonly #free = new Map<number, bigint[]>();
  #inUse = 0;
  #cached = 0;
  #peak = 0;
  #driverAllocs = 0;
  #hits = 0;

  constructor(raw: RawDeviceAllocator) {
    this.#raw = raw;
  }

  /**
   * A block of at least `bytes` (1 ≤ bytes).
   * @throws TpError E_OOM naming the request and what is in use when the driver has no room even after
   *   the cache was emptied
   */
  alloc(bytes: number): DeviceBlock {
    const capacity = sizeClass(Math.max(1, bytes));
    const list = this.#free.get(capacity);
    const reused = list?.pop();
    if (reused !== undefined) {
      this.#cached -= capacity;
      this.#inUse += capacity;
      this.#hits++;
      return { ptr: reused, bytes, capacity };
    }
    let ptr: bigint;
    try {
      ptr = this.#raw.alloc(capacity);
    } catch (e) {
      if (!(e instanceof TpError) || e.code !== "E_OOM" || this.#cached === 0) throw this.#oom(e, bytes);
      this.emptyCache();
      try {
        ptr = this.#raw.alloc(capacity);
      } catch (e2) {
        throw this.#oom(e2, bytes);
      }
    }
    this.#driverAllocs++;
    this.#inUse += capacity;
    this.#peak = Math.max(this.#peak, this.#inUse + this.#cached);
    return { ptr, bytes, capacity };
  }

  #oom(e: unknown, bytes: number): unknown {
    if (!(e instanceof TpError) || e.code !== "E_OOM") return e;
    return new TpError(
      "E_OOM",
      `device allocation of ${formatBytes(bytes)} failed with ${formatBytes(this.#inUse)} in use and ` +
        `${formatBytes(this.#cached)} cached: ${e.message}`,
      { cause: e },
    );
  }

  /** Give a block back to the cache (not to the driver). @throws TpError E_STATE on a double free */
  free(block: DeviceBlock): void {
    const list = this.#free.get(block.capacity) ?? [];
    if (list.includes(block.ptr)) throw new TpError("E_STATE", `device block ${block.ptr} freed twice`);
    list.push(block.ptr);
    this.#free.set(block.capacity, list);
    this.#inUse -= block.capacity;
    this.#cached += block.capacity;
  }

  /** Return every cached block to the driver. */
  emptyCache(): void {
    for (const list of this.#free.values()) for (const p of list) this.#raw.free(p);
    this.#free.clear();
    this.#cached = 0;
  }

  stats(): AllocatorStats {
    return {
      inUse: this.#inUse,
      cached: this.#cached,
      reserved: this.#inUse + this.#cached,
      peakReserved: this.#peak,
      driverAllocs: this.#driverAllocs,
      cacheHits: this.#hits,
    };
  }
}

/** What {@link PinnedStaging} needs of the driver: pinned buffers, asynchronous copies, events. */
export interface StagingDriver {
  memAllocHost(bytes: number): { address: number; bytes: Uint8Array };
  memFreeHost(address: number): void;
  copyHtoDAsync(dst: bigint, src: number, bytes: number, stream: number): void;
  copyDtoHAsync(dst: number, src: bigint, bytes: number, stream: number): void;
  eventCreate(timing?: boolean): number;
  eventDestroy(event: number): void;
  eventRecord(event: number, stream: number): void;
  eventSynchronize(event: number): void;
  streamSynchronize(stream: number): void;
}

/** One pinned chunk and the event recorded behind its last copy. */
interface StagingChunk {
  readonly address: number;
  readonly bytes: Uint8Array;
  readonly event: number;
  pending: boolean;
}

/**
 * Uploads through page-locked staging buffers: host bytes (e.g. a view on the memory-mapped
 * checkpoint) are copied into one of `count` pinned chunks and the device copy is queued on the
 * stream, so the next chunk is filled while the previous one is copied and kernels already queued run.
 * A chunk is refilled only after the event recorded behind its copy has passed.
 */
export class PinnedStaging {
  readonly #driver: StagingDriver;
  readonly #stream: number;
  readonly #chunks: StagingChunk[] = [];
  readonly chunkBytes: number;
  #next = 0;

  constructor(driver: StagingDriver, stream: number, chunkBytes = 16 << 20, count = 2) {
    this.#driver = driver;
    this.#stream = stream;
    this.chunkBytes = chunkBytes;
    for (let i = 0; i < count; i++) {
      const m = driver.memAllocHost(chunkBytes);
      this.#chunks.push({ ...m, event: driver.eventCreate(false), pending: false });
    }
  }

  #take(): StagingChunk {
    const c = this.#chunks[this.#next] as StagingChunk;
    this.#next = (this.#next + 1) % this.#chunks.length;
    if (c.pending) this.#driver.eventSynchronize(c.event);
    c.pending = false;
    return c;
  }

  /** Queue a copy of `data` to device address `dst` (returns once `data` has been read). */
  upload(dst: bigint, data: Uint8Array): void {
    for (let at = 0; at < data.byteLength; at += this.chunkBytes) {
      const n = Math.min(this.chunkBytes, data.byteLength - at);
      const c = this.#take();
      c.bytes.set(data.subarray(at, at + n));
      this.#driver.copyHtoDAsync(dst + BigInt(at), c.address, n, this.#stream);
      this.#driver.eventRecord(c.event, this.#stream);
      c.pending = true;
    }
  }

  /** Wait for queued work, then copy `length` bytes from device address `src` to a new host array. */
  download(src: bigint, length: number): Uint8Array {
    const out = new Uint8Array(length);
    for (let at = 0; at < length; at += this.chunkBytes) {
      const n = Math.min(this.chunkBytes, length - at);
      const c = this.#take();
      this.#driver.copyDtoHAsync(c.address, src + BigInt(at), n, this.#stream);
      this.#driver.streamSynchronize(this.#stream);
      out.set(c.bytes.subarray(0, n), at);
    }
    return out;
  }

  /** Free the pinned chunks (after waiting for their copies). */
  dispose(): void {
    for (const c of this.#chunks) {
      if (c.pending) this.#driver.eventSynchronize(c.event);
      this.#driver.eventDestroy(c.event);
      this.#driver.memFreeHost(c.address);
    }
    this.#chunks.length = 0;
  }
}
