/**
 * `--model org/name[:TAG]`: a GGUF model from the Hugging Face Hub, as llama.cpp's `-hf` flag takes it.
 * A repository name with an optional quantization tag picks `.gguf` files of the repository listing
 * (the `mmproj` projector files excluded), downloads them with the Hub client of @tp/formats (pinned
 * to one commit, resumable, into the Hub cache conventions: `HF_HOME`, `HF_ENDPOINT`, `HF_TOKEN`), and
 * answers the local path of the file to load. A local path is answered unchanged.
 *
 * The pick ({@link pickGgufFiles}):
 * - TAG given: the files whose path contains TAG, case-insensitively (`Q8_0` → `*Q8_0*.gguf`); when
 *   those are several models, the ones where TAG stands alone between separators (`-`, `.`, `/`) win;
 * - no TAG: `Q4_K_M` when the repository has it (llama.cpp's default), else the first model listed;
 * - a split model (`…-00001-of-00003.gguf`) is all of its shards; the first shard is loaded.
 * A missing or ambiguous TAG is one TpError E_ARG that lists the repository's GGUF files.
 *
 * Offline reuse: the repository listing of the pinned commit is kept beside the snapshot
 * (`snapshots/{commit}/.tp-listing.json`); when `refs/{revision}` points at a commit whose listing is
 * kept and whose picked files are all present with their sizes, nothing is requested.
 */
import { existsSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { HubClient, type HubFile, type HubOptions, hubRepoDir } from "@tp/formats";
import { TpError } from "@tp/tensor";

/** `org/name` or `org/name:TAG`, parsed; null when `arg` is not of that form. */
export interface HubModelRef {
  readonly repo: string;
  readonly tag: string | undefined;
}

/** Model file extensions: an argument ending in one is a path, never a repository. */
const FILE_EXT = /\.(gguf|safetensors|json|bin)$/i;

/**
 * `arg` as a Hub reference when it is one: not an existing path, exactly one `/`, no leading `.`, `/`
 * or `~`, not ending in a model file extension, and `org/name` of the Hub's characters with an
 * optional `:TAG`.
 */
export function parseHubModelRef(arg: string): HubModelRef | null {
  if (existsSync(arg) || FILE_EXT.test(arg)) return null;
  const m = /^([A-Za-z0-9][\w.-]*\/[A-Za-z0-9][\w.-]*)(?::([\w.-]+))?$/.exec(arg);
  if (m === null) return null;
  return { repo: m[1] as string, tag: m[2] };
}

/** `name-00001-of-00003.gguf` → the shard's model key `name` and count. */
const SHARD = /^(.*)-(\d{5})-of-(\d{5})\.gguf$/i;

/** One model of a listing: a single file, or every shard of a split model in order. */
interface GgufModel {
  readonly files: readonly string[];
}

/** The listing's `.gguf` models (projectors excluded), in listing order of their first file. */
function ggufModels(files: readonly string[]): GgufModel[] {
  const models: { key: string; files: string[] }[] = [];
  for (const f of files) {
    if (!/\.gguf$/i.test(f) || /(^|\/)[^/]*mmproj[^/]*$/i.test(f)) continue;
    const s = SHARD.exec(f);
    const key = s === null ? f : `${s[1]}-of-${s[3]}`;
    const m = models.find((x) => x.key === key);
    if (m === undefined) models.push({ key, files: [f] });
    else m.files.push(f);
  }
  for (const m of models) m.files.sort();
  return models;
}

const escapeRe = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");

/**
 * The files to download for `tag` (see the module comment), the first the one to load.
 * @param repo for messages
 * @param files the repository listing (paths)
 * @throws TpError E_ARG when the repository holds no GGUF model, no model matches `tag`, or several do
 *   (each message lists the GGUF files)
 */
export function pickGgufFiles(repo: string, files: readonly string[], tag: string | undefined): string[] {
  const models = ggufModels(files);
  const listing = () => models.flatMap((m) => m.files).join(", ");
  if (models.length === 0) {
    throw new TpError(
      "E_ARG",
      `--model ${repo}: the repository has no .gguf model file (files: ${files.slice(0, 12).join(", ")}${files.length > 12 ? ", …" : ""})`,
    );
  }
  const contains = (t: string) => models.filter((m) => m.files.some((f) => f.toLowerCase().includes(t)));
  if (tag === undefined) {
    const q4 = contains("q4_k_m");
    return [...((q4.length === 1 ? q4[0] : models[0]) as GgufModel).files];
  }
  let hits = contains(tag.toLowerCase());
  if (hits.length > 1) {
    const alone = new RegExp(`(^|[-./])${escapeRe(tag)}([-./]|$)`, "i");
    const exact = hits.filter((m) => m.files.some((f) => alone.test(f)));
    if (exact.length > 0) hits = exact;
  }
  if (hits.length === 0)
    throw new TpError(
      "E_ARG",
      `--model ${repo}:${tag}: no .gguf file matches '${tag}'; the repository has ${listing()}`,
    );
  if (hits.length > 1)
    throw new TpError(
      "E_ARG",
      `--model ${repo}:${tag}: '${tag}' matches several models (${hits.map((m) => m.files[0]).join(", ")}); give a longer tag; the repository has ${listing()}`,
    );
  return [...(hits[0] as GgufModel).files];
}

/** Kept listing of a commit: the repository's files with their sizes. */
const LISTING = ".tp-listing.json";

/**
 * The local file to load for `--model`: `arg` itself unless it is a Hub reference
 * ({@link parseHubModelRef}); else the picked files in the Hub cache (downloaded when missing, with
 * resume), the first of them.
 * @param options the Hub client's options (endpoint, token, cache folder, progress) and the revision
 * @throws TpError E_ARG for a tag that picks no file or several; E_IO for the network and refusals
 *   (gated, private or missing repositories: what to do) as {@link HubClient}
 */
export async function resolveModelArg(
  arg: string,
  options: HubOptions & { readonly revision?: string } = {},
): Promise<string> {
  const ref = parseHubModelRef(arg);
  if (ref === null) return arg;
  const hub = new HubClient(options);
  const revision = options.revision ?? "main";
  const offline = cachedPick(hub, ref, revision);
  if (offline !== null) return offline;
  const info = await hub.repoInfo(ref.repo, revision);
  const picked = pickGgufFiles(
    ref.repo,
    info.files.map((f) => f.path),
    ref.tag,
  );
  const { dir } = await hub.ensureFiles(ref.repo, info, picked);
  writeFileSync(join(dir, LISTING), JSON.stringify(info.files));
  hub.markComplete(ref.repo, revision, info.sha, [...new Set([...completed(dir), ...picked])]);
  return join(dir, picked[0] as string);
}

/** The files an earlier {@link HubClient.markComplete} listed for a snapshot folder. */
function completed(dir: string): string[] {
  try {
    return Object.keys(JSON.parse(readFileSync(join(dir, ".tp-complete.json"), "utf8")) as object);
  } catch {
    return [];
  }
}

/** The path to load when the revision's snapshot already holds the pick complete; else null. */
function cachedPick(hub: HubClient, ref: HubModelRef, revision: string): string | null {
  const refFile = join(hubRepoDir(hub.cacheDir, ref.repo), "refs", revision);
  if (!existsSync(refFile)) return null;
  const dir = hub.snapshotDir(ref.repo, readFileSync(refFile, "utf8").trim());
  let listing: HubFile[];
  try {
    listing = JSON.parse(readFileSync(join(dir, LISTING), "utf8")) as HubFile[];
  } catch {
    return null;
  }
  const picked = pickGgufFiles(
    ref.repo,
    listing.map((f) => f.path),
    ref.tag,
  );
  for (const p of picked) {
    const want = listing.find((f) => f.path === p)?.size;
    const file = join(dir, p);
    if (!existsSync(file) || want === undefined || statSync(file).size !== want) return null;
  }
  return join(dir, picked[0] as string);
}
