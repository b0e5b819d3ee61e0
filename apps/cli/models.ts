/**
 * `bun apps/cli models`: the image models `generate --model` knows by name, and what the Hugging Face
 * cache (`$HF_HOME/hub`) holds — each repository's revisions, whether a download of it completed (then
 * `generate --model org/name` makes no request) and its size on disk.
 */
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { QWEN_IMAGE_REPOS } from "@tp/diffusion";
import { HubClient, hfHome } from "@tp/formats";
import { formatBytes, parseFlags } from "@tp/tensor";

/** Help lines of `models`. */
export const MODELS_USAGE = `  models [--json]                   the models generate --model knows by name (Qwen/Qwen-Image-2.1,
                                    Comfy-Org/Qwen-Image-2.1) and what the Hugging Face cache
                                    ($HF_HOME/hub) holds: revisions, complete or partial, size`;

/** One cached repository. */
interface CachedModel {
  repo: string;
  revisions: Record<string, string>;
  complete: boolean;
  bytes: number;
}

function du(dir: string): number {
  let n = 0;
  for (const f of readdirSync(dir, { recursive: true }) as string[]) {
    const p = join(dir, f);
    const s = statSync(p, { throwIfNoEntry: false });
    if (s?.isFile()) n += s.size;
  }
  return n;
}

/** `models`: known names and the cache's content. @returns exit status 0 */
export function models(args: string[]): number {
  const { values } = parseFlags(
    { command: "models", help: "bun apps/cli models --help" },
    {
      args,
      options: {
        json: { type: "boolean", default: false },
        help: { type: "boolean", short: "h", default: false },
      },
      strict: true,
    },
  );
  if (values.help) {
    console.log(`usage: bun apps/cli\n${MODELS_USAGE}`);
    return 0;
  }
  const hub = new HubClient({ token: null });
  const cached: CachedModel[] = [];
  if (existsSync(hub.cacheDir)) {
    for (const d of readdirSync(hub.cacheDir).sort()) {
      const m = /^models--([^-].*?)--(.+)$/.exec(d);
      if (!m) continue;
      const repo = `${m[1]}/${m[2]}`;
      const refs = join(hub.cacheDir, d, "refs");
      const revisions = existsSync(refs)
        ? Object.fromEntries(readdirSync(refs).map((r) => [r, readFileSync(join(refs, r), "utf8").trim()]))
        : {};
      cached.push({
        repo,
        revisions,
        complete: hub.cachedSnapshot(repo, "main") !== null,
        bytes: du(join(hub.cacheDir, d)),
      });
    }
  }
  const known = Object.values(QWEN_IMAGE_REPOS);
  if (values.json) {
    console.log(JSON.stringify({ cache: hub.cacheDir, known, cached }, null, 2));
    return 0;
  }
  console.log(`known: ${known.join(", ")} (generate --model NAME)`);
  console.log(`cache: ${hub.cacheDir}${existsSync(hub.cacheDir) ? "" : " (empty)"} (HF_HOME ${hfHome()})`);
  for (const c of cached) {
    const rev = Object.entries(c.revisions)
      .map(([r, sha]) => `${r} ${sha.slice(0, 12)}`)
      .join(", ");
    console.log(
      `  ${c.repo}  ${c.complete ? "complete" : "partial"}  ${formatBytes(c.bytes)}${rev ? `  (${rev})` : ""}`,
    );
  }
  return 0;
}
