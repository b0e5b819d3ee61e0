/**
 * Sharded safetensors checkpoints: `model.safetensors.index.json` (Hugging Face transformers /
 * diffusers convention, `transformers.modeling_utils` `SAFE_WEIGHTS_INDEX_NAME`):
 * `{"metadata": {"total_size": …}, "weight_map": {"tensor name": "model-00001-of-00004.safetensors", …}}`.
 * Shard names are read from the `weight_map` values (their unique set), never guessed
 * (../shared/spec/qwen-image.md §2.1).
 */
import { basename, dirname, isAbsolute, join, normalize, sep } from "node:path";
import { TpError } from "@tp/tensor";
import { formatError } from "../errors.ts";
import { readTextFile } from "../file.ts";
import type { MapOptions } from "../mmap.ts";
import { lookupTensor, type TensorEntry, type TensorSource } from "../tensors.ts";
import { writeAtomically } from "../write-file.ts";
import { openSafetensors, type SafetensorsFile } from "./file.ts";
import { type SafetensorsTensorInput, safetensorsLayout, writeSafetensors } from "./write.ts";

/** A parsed `*.safetensors.index.json`. */
export interface SafetensorsIndex {
  /** The index's `metadata` object (often `{"total_size": bytes}`), or an empty object. */
  readonly metadata: Readonly<Record<string, unknown>>;
  /** Tensor name → shard file name (relative to the index's directory). */
  readonly weightMap: ReadonlyMap<string, string>;
  /** The shard file names, in first-seen order. */
  readonly shards: readonly string[];
}

/**
 * Read and check an index file.
 * @throws TpError E_IO when unreadable; E_FORMAT for bad JSON, a missing `weight_map`, a non-string
 *   value, or a shard path that is absolute or leaves the index's directory
 */
export function readSafetensorsIndex(path: string): SafetensorsIndex {
  const text = readTextFile(path, "the index");
  let root: unknown;
  try {
    root = JSON.parse(text);
  } catch (e) {
    throw formatError(`the index is not valid JSON: ${(e as Error).message}`, { file: path });
  }
  const obj = root as { weight_map?: unknown; metadata?: unknown } | null;
  if (
    typeof obj !== "object" ||
    obj === null ||
    typeof obj.weight_map !== "object" ||
    obj.weight_map === null
  ) {
    throw formatError('the index has no "weight_map" object', { file: path });
  }
  const weightMap = new Map<string, string>();
  const shards: string[] = [];
  for (const [tensor, shard] of Object.entries(obj.weight_map as Record<string, unknown>)) {
    if (typeof shard !== "string" || shard === "") {
      throw formatError(`weight_map value must be a file name, got ${JSON.stringify(shard)}`, {
        file: path,
        tensor,
      });
    }
    const n = normalize(shard);
    if (isAbsolute(shard) || n === ".." || n.startsWith(`..${sep}`)) {
      throw formatError(`shard '${shard}' is outside the index's directory`, { file: path, tensor });
    }
    weightMap.set(tensor, shard);
    if (!shards.includes(shard)) shards.push(shard);
  }
  const metadata =
    typeof obj.metadata === "object" && obj.metadata !== null
      ? (obj.metadata as Record<string, unknown>)
      : {};
  return { metadata, weightMap, shards };
}

/** A sharded checkpoint: every shard opened and mapped lazily. Create with {@link openSafetensorsIndex}. */
export class ShardedSafetensors implements TensorSource {
  readonly kind = "safetensors" as const;
  readonly files: readonly string[];
  readonly tensors: readonly TensorEntry[];
  readonly #byName: Map<string, { entry: TensorEntry; shard: SafetensorsFile }>;

  /** @internal use {@link openSafetensorsIndex} */
  constructor(
    readonly path: string,
    /** The parsed index. */
    readonly index: SafetensorsIndex,
    /** The opened shards, in `index.shards` order. */
    readonly shards: readonly SafetensorsFile[],
  ) {
    this.files = shards.map((s) => s.path);
    this.#byName = new Map();
    for (const shard of shards) {
      for (const t of shard.tensors) {
        const prev = this.#byName.get(t.name);
        if (prev) {
          throw formatError(
            `tensor is in two shards (${basename(prev.shard.path)} and ${basename(shard.path)})`,
            {
              file: shard.path,
              tensor: t.name,
              offset: t.byteOffset,
            },
          );
        }
        this.#byName.set(t.name, { entry: t, shard });
      }
    }
    for (const [tensor, shardName] of index.weightMap) {
      const found = this.#byName.get(tensor);
      const want = join(dirname(path), shardName);
      if (!found || found.shard.path !== want) {
        throw formatError(`the index puts this tensor in ${shardName}, which does not hold it`, {
          file: path,
          tensor,
        });
      }
    }
    this.tensors = shards.flatMap((s) => s.tensors);
  }

  has(name: string): boolean {
    return this.#byName.has(name);
  }

  tensor(name: string): TensorEntry {
    const t = this.#byName.get(name);
    return t ? t.entry : lookupTensor(new Map(), name, this.path);
  }

  data(name: string): Uint8Array {
    const t = this.#byName.get(name);
    if (!t) return lookupTensor(new Map(), name, this.path) as never;
    return t.shard.data(name);
  }

  close(): void {
    for (const s of this.shards) s.close();
  }
}

/**
 * Open a sharded checkpoint from its index file; every shard's header is validated.
 * @throws TpError E_IO / E_FORMAT from the index or any shard; E_FORMAT when a tensor is in two shards
 *   or not where the index says
 */
export function openSafetensorsIndex(path: string, options: MapOptions = {}): ShardedSafetensors {
  const index = readSafetensorsIndex(path);
  const shards: SafetensorsFile[] = [];
  try {
    for (const s of index.shards) shards.push(openSafetensors(join(dirname(path), s), options));
    return new ShardedSafetensors(path, index, shards);
  } catch (e) {
    for (const s of shards) s.close();
    throw e;
  }
}

/**
 * Write a sharded checkpoint the way transformers' `save_pretrained` names it:
 * `PREFIX-00001-of-0000N.safetensors` … plus `PREFIX.safetensors.index.json` with `total_size` (the
 * sum of tensor bytes) and the `weight_map`. Tensors go to shards in the given order; a shard is
 * closed when the next tensor would take it past `maxShardBytes` (a lone tensor larger than that gets
 * a shard of its own).
 * @param dir    output directory
 * @param prefix e.g. `"model"` or `"diffusion_pytorch_model"`
 * @returns the index path
 * @throws TpError E_ARG for a bad `maxShardBytes` or tensor; E_IO when writing fails
 */
export function writeShardedSafetensors(
  dir: string,
  prefix: string,
  tensors: readonly SafetensorsTensorInput[],
  options: { maxShardBytes: number; metadata?: Readonly<Record<string, string>> },
): string {
  if (!(options.maxShardBytes > 0))
    throw new TpError("E_ARG", `maxShardBytes must be positive, got ${options.maxShardBytes}`);
  safetensorsLayout(tensors.map((t) => ({ ...t, byteLength: t.data.byteLength }))); // validate all first
  const groups: SafetensorsTensorInput[][] = [];
  let cur: SafetensorsTensorInput[] = [];
  let bytes = 0;
  for (const t of tensors) {
    if (cur.length > 0 && bytes + t.data.byteLength > options.maxShardBytes) {
      groups.push(cur);
      cur = [];
      bytes = 0;
    }
    cur.push(t);
    bytes += t.data.byteLength;
  }
  if (cur.length > 0 || groups.length === 0) groups.push(cur);
  const pad = (i: number) => String(i).padStart(5, "0");
  const weightMap: Record<string, string> = {};
  let total = 0;
  groups.forEach((g, i) => {
    const name = `${prefix}-${pad(i + 1)}-of-${pad(groups.length)}.safetensors`;
    writeSafetensors(join(dir, name), g, options.metadata ? { metadata: options.metadata } : {});
    for (const t of g) {
      weightMap[t.name] = name;
      total += t.data.byteLength;
    }
  });
  const indexPath = join(dir, `${prefix}.safetensors.index.json`);
  const json = `${JSON.stringify({ metadata: { total_size: total }, weight_map: weightMap }, null, 2)}\n`;
  writeAtomically(indexPath, (write) => write(new TextEncoder().encode(json)));
  return indexPath;
}
