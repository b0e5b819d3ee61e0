/**
 * Quantize-on-load caches (../shared/ARCHITECTURE.md "Weights and memory"; issue 4): quantizing a float
 * checkpoint to INT8 or INT4 ConvRot once, writing the result beside it, and memory-mapping it on every
 * later run.
 *
 * - Name: `<checkpoint file name>.tp-q8.cache` (int8) / `.tp-q4.cache` (int4) beside the checkpoint. When
 *   that folder is read-only (creating the temporary file fails with EACCES, EPERM or EROFS) the cache
 *   goes to a cache folder instead: `$TP_CACHE_DIR` when set, else `$XDG_CACHE_HOME/tensorpencil`, else
 *   `~/.cache/tensorpencil`, as `<file name>-<16 hex digits of the folder's path hash>.tp-q8.cache`.
 *   A run looks beside the checkpoint first, then in the cache folder.
 * - Content: a safetensors file (so `@tp/formats` maps it per region and `inspect` reads it) holding, for
 *   every quantized layer, exactly what a ComfyUI ConvRot file holds: `<layer>.weight` (I8),
 *   `<layer>.weight_scale` (F32) and `<layer>.comfy_quant` (the marker). Unquantized tensors are not
 *   copied: they are read from the checkpoint. {@link openQuantCache} returns one `TensorSource` over both.
 * - Key, in `__metadata__.tp_quant_cache` (JSON): magic, {@link QUANT_CACHE_VERSION}, the format, every
 *   source file's name, size and modification time (ns), and a hash of the plan (which layers, their
 *   dtypes, shapes and groups). Any difference makes the cache stale.
 * - Integrity, in `__metadata__.tp_quant_cache_checksum`: 16 hex digits of xxHash3-64, seeded with the
 *   hash of the key text and the tensor table (names, dtypes, shapes, offsets), then chained over each
 *   tensor's bytes in file order (`h ← xxHash3(bytes, h)`). Checked on every open (xxHash3 runs at
 *   memory speed, tens of GB/s); computed while building from the temporary file's own bytes.
 * - Written through `@tp/formats`' `SafetensorsWriter`: a temporary name in the same folder, fsync,
 *   rename. A stale, truncated or corrupt cache (bad header, wrong key, wrong version, checksum mismatch)
 *   is never used: it is rebuilt, and the result says why.
 */
import { type BigIntStats, mkdirSync, statSync } from "node:fs";
import { homedir } from "node:os";
import { basename, dirname, join, resolve } from "node:path";
import {
  lookupTensor,
  MappedFile,
  openCheckpoint,
  openSafetensors,
  type SafetensorsFile,
  SafetensorsWriter,
  type TensorEntry,
  type TensorSource,
} from "@tp/formats";
import { isTpError, TpError } from "@tp/tensor";
import {
  planQuantization,
  type QuantizePlan,
  type QuantizePlanOptions,
  referenceQuantizer,
  type WeightQuantizer,
  writeQuantizedLayer,
} from "./checkpoint.ts";
import type { ConvRotFormat } from "./convrot.ts";
import { type ProgressReporter, silentProgress, stderrProgress } from "./progress.ts";

/** Version of the cache layout and of the bytes the quantizer writes; bump it when either changes. */
export const QUANT_CACHE_VERSION = 1;
/** Environment variable naming the cache folder used when a checkpoint's folder is read-only. */
export const QUANT_CACHE_DIR_ENV = "TP_CACHE_DIR";
/** `magic` of the key. */
export const QUANT_CACHE_MAGIC = "tensorpencil-quant-cache";
const KEY_META = "tp_quant_cache";
const SUM_META = "tp_quant_cache_checksum";
const SUM_PLACEHOLDER = "0".repeat(16);

/** The file-name suffix of a cache: `.tp-q8.cache` (int8) or `.tp-q4.cache` (int4). */
export function quantCacheSuffix(format: ConvRotFormat): string {
  return format === "int8_convrot" ? ".tp-q8.cache" : ".tp-q4.cache";
}

/**
 * The cache folder used when a checkpoint's own folder is read-only: `$TP_CACHE_DIR`, else
 * `$XDG_CACHE_HOME/tensorpencil`, else `~/.cache/tensorpencil` (empty variables count as unset).
 */
export function defaultQuantCacheDir(
  env: Readonly<Record<string, string | undefined>> = process.env,
): string {
  const own = env[QUANT_CACHE_DIR_ENV];
  if (own) return resolve(own);
  const xdg = env.XDG_CACHE_HOME;
  return xdg ? join(resolve(xdg), "tensorpencil") : join(homedir(), ".cache", "tensorpencil");
}

/**
 * Where the cache of `checkpoint` lives: `beside` it, or in the `fallback` folder.
 * @param cacheDir the fallback folder (default {@link defaultQuantCacheDir})
 */
export function quantCachePaths(
  checkpoint: string,
  format: ConvRotFormat,
  cacheDir: string = defaultQuantCacheDir(),
): { beside: string; fallback: string } {
  const abs = resolve(checkpoint);
  const folder = Bun.hash.xxHash3(dirname(abs)).toString(16).padStart(16, "0");
  const suffix = quantCacheSuffix(format);
  return {
    beside: `${abs}${suffix}`,
    fallback: join(cacheDir, `${basename(abs)}-${folder}${suffix}`),
  };
}

/** The key a cache must carry to be used (see the module comment). */
export interface QuantCacheKey {
  /** {@link QUANT_CACHE_MAGIC}. */
  readonly magic: string;
  /** {@link QUANT_CACHE_VERSION} of the build that wrote it. */
  readonly version: number;
  /** int8_convrot (`.tp-q8.cache`) or int4_convrot (`.tp-q4.cache`). */
  readonly format: ConvRotFormat;
  /** Every file of the source checkpoint: base name, size in bytes, modification time in ns. */
  readonly sources: readonly { readonly name: string; readonly size: number; readonly mtime_ns: string }[];
  /** Number of quantized layers. */
  readonly layers: number;
  /** xxHash3 (hex) of the plan: format and each quantized layer's name, dtype, shape and group. */
  readonly plan: string;
}

/**
 * The key of a source checkpoint and a plan (stats every file of the source).
 * @throws TpError E_IO when a source file cannot be stat'ed
 */
export function quantCacheKey(src: TensorSource, plan: QuantizePlan): QuantCacheKey {
  const sources = src.files.map((f) => {
    let st: BigIntStats;
    try {
      st = statSync(f, { bigint: true });
    } catch (e) {
      throw new TpError("E_IO", `cannot stat the checkpoint: ${(e as Error).message}`, { file: f, cause: e });
    }
    return { name: basename(f), size: Number(st.size), mtime_ns: st.mtimeNs.toString() };
  });
  const layers = plan.tensors.filter((t) => t.action === "quantize");
  const planText = JSON.stringify([plan.format, layers.map((t) => [t.name, t.dtype, t.shape, t.groupSize])]);
  return {
    magic: QUANT_CACHE_MAGIC,
    version: QUANT_CACHE_VERSION,
    format: plan.format as ConvRotFormat,
    sources,
    layers: layers.length,
    plan: Bun.hash.xxHash3(planText).toString(16).padStart(16, "0"),
  };
}

/** One tensor of the table the checksum covers. */
interface TableRow {
  readonly name: string;
  readonly dtype: string;
  readonly shape: readonly number[];
  readonly begin: number;
  readonly end: number;
}

/**
 * The cache checksum: xxHash3-64 seeded with the hash of the key text and the tensor table, chained
 * over every tensor's bytes in file order. 16 hex digits.
 */
export function quantCacheChecksum(
  keyText: string,
  table: readonly TableRow[],
  bytesOf: (row: TableRow) => Uint8Array,
): string {
  const tableText = JSON.stringify(table.map((t) => [t.name, t.dtype, t.shape, t.begin, t.end]));
  let h = Bun.hash.xxHash3(`${keyText}\n${tableText}`);
  for (const row of table) h = Bun.hash.xxHash3(bytesOf(row), h);
  return h.toString(16).padStart(16, "0");
}

/** The outcome of {@link checkQuantCache}. */
export type QuantCacheCheck =
  | { readonly ok: true; readonly file: SafetensorsFile }
  | { readonly ok: false; readonly reason: string };

/**
 * Whether the cache file at `path` may be used for `key` and `plan`: it parses as safetensors, carries
 * the same key, holds every planned tensor with the planned dtype and shape, and its checksum matches.
 * Never throws for a bad cache: the reason says what is wrong ("missing", "corrupt or truncated: …",
 * "stale: …", "version …", "checksum mismatch").
 */
export function checkQuantCache(path: string, key: QuantCacheKey, plan: QuantizePlan): QuantCacheCheck {
  let file: SafetensorsFile;
  try {
    statSync(path);
  } catch {
    return { ok: false, reason: "missing" };
  }
  try {
    file = openSafetensors(path);
  } catch (e) {
    return { ok: false, reason: `corrupt or truncated: ${(e as Error).message}` };
  }
  const fail = (reason: string): QuantCacheCheck => {
    file.close();
    return { ok: false, reason };
  };
  const keyText = file.metadata?.get(KEY_META);
  const sum = file.metadata?.get(SUM_META);
  if (keyText === undefined || sum === undefined)
    return fail("not a TensorPencil quantization cache (no key)");
  let stored: QuantCacheKey;
  try {
    stored = JSON.parse(keyText) as QuantCacheKey;
  } catch {
    return fail("corrupt: the key is not JSON");
  }
  if (stored.magic !== QUANT_CACHE_MAGIC) return fail("not a TensorPencil quantization cache (magic)");
  if (stored.version !== key.version)
    return fail(`version ${stored.version}, this build writes ${key.version}`);
  if (stored.format !== key.format) return fail(`stale: holds ${stored.format}, ${key.format} wanted`);
  if (JSON.stringify(stored.sources) !== JSON.stringify(key.sources)) {
    return fail(
      `stale: the checkpoint changed (was ${JSON.stringify(stored.sources)}, now ${JSON.stringify(key.sources)})`,
    );
  }
  if (stored.plan !== key.plan || stored.layers !== key.layers)
    return fail("stale: different layers or group sizes");
  for (const p of plan.tensors) {
    if (p.action !== "quantize") continue;
    for (const o of p.outputs) {
      const t = file.has(o.name) ? file.tensor(o.name) : undefined;
      if (t === undefined || t.dtype !== o.dtype || JSON.stringify(t.shape) !== JSON.stringify(o.shape))
        return fail(`corrupt: tensor ${o.name} is missing or has the wrong dtype or shape`);
    }
  }
  const dataStart = file.header.dataStart;
  const table = file.header.tensors.map((t) => ({
    name: t.name,
    dtype: t.dtype,
    shape: t.shape,
    begin: t.dataOffsets[0],
    end: t.dataOffsets[1],
  }));
  let actual: string;
  try {
    actual = quantCacheChecksum(keyText, table, (r) =>
      file.mapping.view(dataStart + r.begin, r.end - r.begin, r.name),
    );
  } catch (e) {
    return fail(`corrupt or truncated: ${(e as Error).message}`);
  }
  if (actual !== sum) return fail(`checksum mismatch (stored ${sum}, computed ${actual})`);
  return { ok: true, file };
}

/** Options of {@link openQuantCache}. */
export interface QuantCacheOptions extends Omit<QuantizePlanOptions, "format"> {
  /** int8_convrot or int4_convrot. */
  readonly format: ConvRotFormat;
  /** Fallback cache folder (default {@link defaultQuantCacheDir}: `$TP_CACHE_DIR`, XDG, `~/.cache`). */
  readonly cacheDir?: string;
  /** Progress while quantizing: default {@link stderrProgress} (a bar on a terminal, else nothing); null: none. */
  readonly progress?: ProgressReporter | null;
  /**
   * The quantizer used when the cache is built (default the TypeScript `referenceQuantizer`; pass
   * `@tp/backend-cpu`'s `createNativeQuantizer()` for the native, multi-threaded one). It does not
   * enter the cache key: every quantizer writes the same bytes.
   */
  readonly quantizer?: WeightQuantizer;
}

/** What {@link openQuantCache} found or did. */
export interface QuantCacheResult {
  /** The checkpoint with its quantized layers taken from the cache (close it when done). */
  readonly source: TensorSource;
  /** The cache file used. */
  readonly path: string;
  /** `hit`: a valid cache was mapped; `built`: there was none; `rebuilt`: one existed but was not usable. */
  readonly status: "hit" | "built" | "rebuilt";
  /** Why existing caches were not used (path: reason), for `rebuilt`. */
  readonly reasons: readonly string[];
  /** The plan (which layers were quantized, with which group). */
  readonly plan: QuantizePlan;
}

const READ_ONLY_CODES = new Set(["EACCES", "EPERM", "EROFS"]);

function isReadOnlyError(e: unknown): boolean {
  if (!isTpError(e, "E_IO")) return false;
  const code = (e.cause as { code?: string } | undefined)?.code;
  return code !== undefined && READ_ONLY_CODES.has(code);
}

/**
 * Open a float checkpoint with its layers quantized to INT8 or INT4 ConvRot through a cache: map a
 * valid cache, or quantize (with a progress bar), write the cache atomically, and map it.
 * @param checkpoint a `.safetensors` / `.safetensors.index.json` path, or an opened source (not closed
 *   here on failure; closed with the result's `source`)
 * @param options format, group sizes and layer selection (as `planQuantization`), cache folder, progress
 * @returns the combined source, the cache path, and whether it was a hit
 * @throws TpError as `planQuantization` (naming the tensor); E_IO when neither the checkpoint's folder
 *   nor the cache folder can take the cache, or reading the checkpoint fails
 */
export function openQuantCache(
  checkpoint: string | TensorSource,
  options: QuantCacheOptions,
): QuantCacheResult {
  const src = typeof checkpoint === "string" ? openCheckpoint(checkpoint) : checkpoint;
  try {
    const plan = planQuantization(src, options);
    const key = quantCacheKey(src, plan);
    const paths = quantCachePaths(src.path, options.format, options.cacheDir);
    const reasons: string[] = [];
    for (const p of [paths.beside, paths.fallback]) {
      const c = checkQuantCache(p, key, plan);
      if (c.ok) return { source: new QuantCacheSource(src, c.file), path: p, status: "hit", reasons, plan };
      if (c.reason !== "missing") reasons.push(`${p}: ${c.reason}`);
    }
    const progress = options.progress === undefined ? stderrProgress() : (options.progress ?? silentProgress);
    let path = paths.beside;
    try {
      buildQuantCache(path, src, plan, key, progress, options.quantizer);
    } catch (e) {
      if (!isReadOnlyError(e)) throw e;
      path = paths.fallback;
      try {
        mkdirSync(dirname(path), { recursive: true });
        buildQuantCache(path, src, plan, key, progress, options.quantizer);
      } catch (e2) {
        throw new TpError(
          "E_IO",
          `cannot write the quantization cache beside the checkpoint (read-only) nor in ${dirname(path)}: ${(e2 as Error).message}; set ${QUANT_CACHE_DIR_ENV} to a writable folder`,
          { file: src.path, cause: e2 },
        );
      }
    }
    const file = openSafetensors(path);
    return {
      source: new QuantCacheSource(src, file),
      path,
      status: reasons.length > 0 ? "rebuilt" : "built",
      reasons,
      plan,
    };
  } catch (e) {
    if (typeof checkpoint === "string") src.close();
    throw e;
  }
}

/**
 * Quantize the planned layers of `src` into a cache file at `path` (temporary name, checksum from the
 * written bytes, rename), with `quantizer` (default the TypeScript reference).
 * @throws TpError E_IO (the cause keeps the system code: EACCES/EROFS for a read-only folder), or from
 *   quantization; the temporary file is removed
 */
export function buildQuantCache(
  path: string,
  src: TensorSource,
  plan: QuantizePlan,
  key: QuantCacheKey,
  progress: ProgressReporter = silentProgress,
  quantizer: WeightQuantizer = referenceQuantizer,
): void {
  const layers = plan.tensors.filter((t) => t.action === "quantize");
  const keyText = JSON.stringify(key);
  const meta = (sum: string) => ({ [KEY_META]: keyText, [SUM_META]: sum });
  const writer = new SafetensorsWriter(
    path,
    layers.flatMap((t) => t.outputs),
    { metadata: meta(SUM_PLACEHOLDER) },
  );
  try {
    progress.start(
      layers.reduce((a, t) => a + src.tensor(t.name).byteLength, 0),
      `quantizing ${basename(src.path)} to ${plan.format}`,
    );
    for (const p of layers) {
      writeQuantizedLayer(
        p,
        plan.format,
        src.data(p.name),
        writer,
        (b) => progress.advance(b, p.name),
        quantizer,
      );
    }
    const { order, dataStart, fileSize } = writer.layout;
    const mapped = new MappedFile(
      writer.tmpPath,
      fileSize,
      order.map((t) => ({ start: dataStart + t.begin, end: dataStart + t.end })),
    );
    const sum = quantCacheChecksum(keyText, order, (r) =>
      mapped.view(dataStart + r.begin, r.end - r.begin, r.name),
    );
    mapped.close();
    writer.commit({ metadata: meta(sum) });
  } catch (e) {
    writer.abort();
    throw e;
  } finally {
    progress.stop();
  }
}

/**
 * A float checkpoint whose quantized layers come from a cache: the cache's `<layer>.weight`,
 * `.weight_scale` and `.comfy_quant` replace or join the checkpoint's tensors; the rest are the
 * checkpoint's own. `@tp/formats`' `loadWeight` / `detectTensorFormat` see ConvRot layers with markers.
 */
export class QuantCacheSource implements TensorSource {
  readonly kind = "safetensors" as const;
  readonly path: string;
  readonly files: readonly string[];
  readonly tensors: readonly TensorEntry[];
  readonly #from: Map<string, TensorSource>;
  readonly #byName: Map<string, TensorEntry>;

  /**
   * @param base  the float checkpoint
   * @param cache the opened cache file
   */
  constructor(
    readonly base: TensorSource,
    readonly cache: SafetensorsFile,
  ) {
    this.path = base.path;
    this.files = [...base.files, cache.path];
    const mine = new Set(cache.tensors.map((t) => t.name));
    this.tensors = [...base.tensors.filter((t) => !mine.has(t.name)), ...cache.tensors];
    this.#from = new Map(this.tensors.map((t) => [t.name, mine.has(t.name) ? cache : base]));
    this.#byName = new Map(this.tensors.map((t) => [t.name, t]));
  }

  /** The checkpoint's `__metadata__` (not the cache's), or null. */
  get metadata(): ReadonlyMap<string, string> | null {
    const m = (this.base as { metadata?: unknown }).metadata;
    return m instanceof Map ? (m as ReadonlyMap<string, string>) : null;
  }

  has(name: string): boolean {
    return this.#byName.has(name);
  }

  tensor(name: string): TensorEntry {
    return lookupTensor(this.#byName, name, this.path);
  }

  data(name: string): Uint8Array {
    const src = this.#from.get(name);
    if (src === undefined) this.tensor(name); // throws E_FORMAT naming it
    return (src as TensorSource).data(name);
  }

  close(): void {
    this.cache.close();
    this.base.close();
  }
}
