/**
 * Hugging Face Hub downloads with resume (../shared/spec/qwen-image.md §13): repository info pinned to
 * one commit per run, files fetched one by one (small files first is the caller's order) into the Hub
 * cache layout, each missing or partial file fetched alone with `Range` into `<file>.incomplete` beside
 * a sidecar recording the ETag and size it belongs to (a changed ETag restarts from 0, never splices
 * two versions), retries with backoff on connection drops, 5xx and 429 (never on 401/404), the token
 * sent to the hub only (dropped on a redirect to another host), a fresh `Location` when a signed URL
 * has expired (403 from the content host), and nothing fetched when a completed snapshot is present.
 *
 * Cache: `$HF_HOME/hub` (default `~/.cache/huggingface/hub`), per repository
 * `models--{org}--{name}/refs/{revision}` (the commit) and `snapshots/{commit}/{path}`, as
 * huggingface_hub lays it out; files are stored in the snapshot folder itself (no `blobs/` links), and
 * `snapshots/{commit}/.tp-complete.json` lists what a finished download holds.
 * Environment: `HF_ENDPOINT` (default https://huggingface.co), `HF_TOKEN`, else
 * `HUGGING_FACE_HUB_TOKEN`, else the file `$HF_HOME/token`; `HF_HOME`.
 *
 * Sources: qwen-image.md §13.1 (endpoints, headers, errors), §13.2 (resume); huggingface_hub
 * `file_download.py` (metadata rule: X-Linked-Etag / X-Linked-Size / X-Repo-Commit), `constants.py`.
 */
import {
  closeSync,
  existsSync,
  fsyncSync,
  mkdirSync,
  openSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
  writeSync,
} from "node:fs";
import { homedir } from "node:os";
import { dirname, join } from "node:path";
import { TpError } from "@tp/tensor";

/** Where and how to reach the hub. */
export interface HubOptions {
  /** Hub base URL; default `$HF_ENDPOINT` or https://huggingface.co. */
  readonly endpoint?: string;
  /** Bearer token; default from the environment / `$HF_HOME/token` (see the module comment). */
  readonly token?: string | null;
  /** The cache folder (the `hub` folder); default `$HF_HOME/hub`. */
  readonly cacheDir?: string;
  /** Tries per request before giving up (default 5). */
  readonly retries?: number;
  /** First backoff in ms, doubled per try (default 500). */
  readonly backoffMs?: number;
  /** Byte progress of each file: done and total bytes. */
  readonly onProgress?: (file: string, done: number, total: number) => void;
  /** The fetch to use (tests); default the global one. */
  readonly fetch?: typeof fetch;
}

/** One file of a repository at a commit. */
export interface HubFile {
  readonly path: string;
  readonly size?: number;
}

/** What repository info answers. */
export interface HubRepoInfo {
  readonly id: string;
  /** The commit every later request is pinned to. */
  readonly sha: string;
  readonly gated: boolean | string;
  readonly private: boolean;
  readonly files: readonly HubFile[];
}

/** HF_HOME (default ~/.cache/huggingface). */
export function hfHome(env: NodeJS.ProcessEnv = process.env): string {
  return env.HF_HOME ?? join(env.XDG_CACHE_HOME ?? join(homedir(), ".cache"), "huggingface");
}

/** The token: HF_TOKEN, else HUGGING_FACE_HUB_TOKEN, else `$HF_HOME/token`; the environment wins. */
export function hfToken(env: NodeJS.ProcessEnv = process.env): string | null {
  const t = env.HF_TOKEN ?? env.HUGGING_FACE_HUB_TOKEN;
  if (t !== undefined && t.trim() !== "") return t.trim();
  const file = join(hfHome(env), "token");
  if (existsSync(file)) {
    const v = readFileSync(file, "utf8").trim();
    if (v !== "") return v;
  }
  return null;
}

/** `org/name`, checked. */
function checkRepo(repo: string): void {
  if (!/^[A-Za-z0-9][\w.-]*\/[A-Za-z0-9][\w.-]*$/.test(repo)) {
    throw new TpError("E_ARG", `'${repo}' is not a Hugging Face repository name (org/name)`);
  }
}

/** The cache folder of a repository. */
export function hubRepoDir(cacheDir: string, repo: string): string {
  checkRepo(repo);
  return join(cacheDir, `models--${repo.replace("/", "--")}`);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const stripEtag = (e: string | null): string | null =>
  e === null ? null : e.replace(/^W\//, "").replace(/"/g, "");

/** A client of one hub (see the module comment). */
export class HubClient {
  readonly endpoint: string;
  readonly cacheDir: string;
  readonly #token: string | null;
  readonly #retries: number;
  readonly #backoff: number;
  readonly #fetch: typeof fetch;
  readonly #progress: HubOptions["onProgress"];

  constructor(o: HubOptions = {}) {
    this.endpoint = (o.endpoint ?? process.env.HF_ENDPOINT ?? "https://huggingface.co").replace(/\/+$/, "");
    this.cacheDir = o.cacheDir ?? join(hfHome(), "hub");
    this.#token = o.token === undefined ? hfToken() : o.token;
    this.#retries = o.retries ?? 5;
    this.#backoff = o.backoffMs ?? 500;
    this.#fetch = o.fetch ?? fetch;
    this.#progress = o.onProgress;
  }

  /** Headers for a URL: the token only when it is on the hub's own host. */
  #headers(url: string, extra: Record<string, string> = {}): Record<string, string> {
    const h: Record<string, string> = { "Accept-Encoding": "identity", ...extra };
    if (this.#token !== null && new URL(url).host === new URL(this.endpoint).host) {
      h.Authorization = `Bearer ${this.#token}`;
    }
    return h;
  }

  /** An error for a hub answer that will not get better with a retry (401, 403, 404). */
  #refusal(r: Response, repo: string, what: string): TpError {
    const code = r.headers.get("x-error-code") ?? "";
    const msg = r.headers.get("x-error-message");
    if (code === "GatedRepo" || (r.status === 403 && code !== "")) {
      return new TpError(
        "E_IO",
        `${repo} is gated: accept its licence on ${this.endpoint}/${repo} and set a token (HF_TOKEN or ${join(hfHome(), "token")})`,
      );
    }
    if (r.status === 401 || code === "RepoNotFound") {
      return new TpError(
        "E_IO",
        `${repo}: no such repository, or it is private (${r.status}${msg ? `: ${msg}` : ""}); check the name, or set HF_TOKEN for a private one`,
      );
    }
    if (code === "RevisionNotFound") return new TpError("E_IO", `${repo}: no such revision (${what})`);
    if (r.status === 404)
      return new TpError("E_IO", `${repo}: ${what} does not exist (404${code ? ` ${code}` : ""})`);
    return new TpError("E_IO", `${repo}: ${what}: HTTP ${r.status}${msg ? ` (${msg})` : ""}`);
  }

  /** fetch with retries on network errors, 5xx and 429 (backoff doubling); other answers returned. */
  async #request(url: string, init: RequestInit, repo: string, what: string): Promise<Response> {
    let last: unknown;
    for (let attempt = 0; attempt < this.#retries; attempt++) {
      if (attempt > 0) await sleep(this.#backoff * 2 ** (attempt - 1));
      try {
        const r = await this.#fetch(url, init);
        if (r.status >= 500 || r.status === 429) {
          last = new TpError("E_IO", `${repo}: ${what}: HTTP ${r.status}`);
          await r.body?.cancel();
          continue;
        }
        return r;
      } catch (e) {
        last = e;
      }
    }
    throw last instanceof TpError
      ? new TpError("E_IO", `${last.message} after ${this.#retries} tries`)
      : new TpError(
          "E_IO",
          `${repo}: ${what}: ${(last as Error)?.message ?? last} after ${this.#retries} tries`,
          {
            cause: last,
          },
        );
  }

  /**
   * Repository info at a revision (`GET /api/models/{repo}/revision/{rev}`): the commit to pin to and
   * the file list.
   * @throws TpError E_ARG for a bad name; E_IO for a missing, private or gated repository (no retry),
   *   or the network after the retries
   */
  async repoInfo(repo: string, revision = "main"): Promise<HubRepoInfo> {
    checkRepo(repo);
    const url = `${this.endpoint}/api/models/${repo}/revision/${encodeURIComponent(revision)}?blobs=true`;
    const r = await this.#request(url, { headers: this.#headers(url) }, repo, "repository info");
    if (!r.ok) throw this.#refusal(r, repo, `revision ${revision}`);
    const j = (await r.json()) as {
      id?: string;
      sha?: string;
      gated?: boolean | string;
      private?: boolean;
      siblings?: { rfilename: string; size?: number; lfs?: { size?: number } }[];
    };
    if (typeof j.sha !== "string" || !/^[0-9a-f]{40}$/.test(j.sha) || !Array.isArray(j.siblings)) {
      throw new TpError("E_FORMAT", `${url}: not a Hugging Face repository answer (no sha / siblings)`);
    }
    return {
      id: j.id ?? repo,
      sha: j.sha,
      gated: j.gated ?? false,
      private: j.private ?? false,
      files: j.siblings.map((s) => {
        const size = s.lfs?.size ?? s.size;
        return size === undefined ? { path: s.rfilename } : { path: s.rfilename, size };
      }),
    };
  }

  /** The snapshot folder of a commit. */
  snapshotDir(repo: string, sha: string): string {
    return join(hubRepoDir(this.cacheDir, repo), "snapshots", sha);
  }

  /**
   * The snapshot folder of a revision when a download of it completed ({@link markComplete}) and every
   * file it listed is present with its size — without any network request; else null.
   */
  cachedSnapshot(repo: string, revision = "main"): string | null {
    const ref = join(hubRepoDir(this.cacheDir, repo), "refs", revision);
    if (!existsSync(ref)) return null;
    const dir = this.snapshotDir(repo, readFileSync(ref, "utf8").trim());
    const manifest = join(dir, ".tp-complete.json");
    if (!existsSync(manifest)) return null;
    let done: Record<string, number>;
    try {
      done = JSON.parse(readFileSync(manifest, "utf8")) as Record<string, number>;
    } catch {
      return null;
    }
    for (const [f, size] of Object.entries(done)) {
      const p = join(dir, f);
      if (!existsSync(p) || statSync(p).size !== size) return null;
    }
    return dir;
  }

  /**
   * HEAD of a file at a commit, not following a redirect to another host: where to GET it, its ETag
   * (X-Linked-Etag else ETag) and size (X-Linked-Size else Content-Length).
   */
  async #head(
    repo: string,
    sha: string,
    path: string,
  ): Promise<{ location: string; etag: string; size: number }> {
    let url = `${this.endpoint}/${repo}/resolve/${sha}/${path.split("/").map(encodeURIComponent).join("/")}`;
    for (let hops = 0; hops < 5; hops++) {
      const r = await this.#request(
        url,
        { method: "HEAD", headers: this.#headers(url), redirect: "manual" },
        repo,
        path,
      );
      if (r.status >= 300 && r.status < 400) {
        const loc = r.headers.get("location");
        if (loc === null) throw new TpError("E_IO", `${repo}: ${path}: redirect without Location`);
        const next = new URL(loc, url).toString();
        const etag = stripEtag(r.headers.get("x-linked-etag") ?? r.headers.get("etag"));
        const size = Number(r.headers.get("x-linked-size") ?? Number.NaN);
        if (new URL(next).host !== new URL(url).host && etag !== null && Number.isSafeInteger(size)) {
          return { location: next, etag, size }; // LFS / Xet: the content host
        }
        url = next; // a renamed repository: same host, keep the token
        continue;
      }
      if (!r.ok) throw this.#refusal(r, repo, path);
      if (r.headers.get("x-repo-commit") === null) {
        throw new TpError("E_FORMAT", `${url}: not a Hugging Face hub (no X-Repo-Commit)`);
      }
      const etag = stripEtag(r.headers.get("x-linked-etag") ?? r.headers.get("etag"));
      const size = Number(r.headers.get("x-linked-size") ?? r.headers.get("content-length") ?? Number.NaN);
      if (etag === null || !Number.isSafeInteger(size)) {
        throw new TpError("E_FORMAT", `${url}: the hub gave no ETag or size`);
      }
      return { location: url, etag, size };
    }
    throw new TpError("E_IO", `${repo}: ${path}: too many redirects`);
  }

  /**
   * One file into `dest` with resume (qwen-image.md §13.2).
   * @throws TpError E_IO for refusals (no retry) or the network after the retries; E_FORMAT for answers
   *   that are not a hub's
   */
  async downloadFile(repo: string, sha: string, path: string, dest: string): Promise<void> {
    const part = `${dest}.incomplete`;
    const side = `${dest}.incomplete.json`;
    let meta = await this.#head(repo, sha, path);
    if (existsSync(dest) && statSync(dest).size === meta.size) return;
    mkdirSync(dirname(dest), { recursive: true });
    let expiredOnce = false;
    let failures = 0;
    for (;;) {
      // the partial data must belong to this ETag and size, else start over
      let have = 0;
      if (existsSync(part) && existsSync(side)) {
        try {
          const s = JSON.parse(readFileSync(side, "utf8")) as { etag?: string; size?: number };
          if (s.etag === meta.etag && s.size === meta.size) have = statSync(part).size;
        } catch {
          have = 0;
        }
      }
      if (have === 0 || have > meta.size) {
        writeFileSync(part, new Uint8Array(0));
        writeFileSync(side, JSON.stringify({ etag: meta.etag, size: meta.size }));
        have = 0;
      }
      if (have === meta.size) break;
      const headers = this.#headers(meta.location, { Range: `bytes=${have}-` });
      const r = await this.#request(meta.location, { headers }, repo, path);
      if (r.status === 416 && have === meta.size) break;
      if (r.status === 403 && !expiredOnce && new URL(meta.location).host !== new URL(this.endpoint).host) {
        expiredOnce = true; // a signed URL expired: a fresh Location
        await r.body?.cancel();
        meta = await this.#head(repo, sha, path);
        continue;
      }
      if (r.status === 401 || r.status === 403 || r.status === 404) throw this.#refusal(r, repo, path);
      let offset: number;
      if (r.status === 206) {
        const m = /^bytes (\d+)-\d+\/(\d+)$/.exec(r.headers.get("content-range") ?? "");
        if (!m || Number(m[1]) !== have) {
          await r.body?.cancel();
          writeFileSync(part, new Uint8Array(0)); // a range we did not ask for: restart
          continue;
        }
        offset = have;
      } else if (r.status === 200) {
        offset = 0; // the range was ignored: the whole body
      } else {
        await r.body?.cancel();
        throw new TpError("E_IO", `${repo}: ${path}: HTTP ${r.status} from ${new URL(meta.location).host}`);
      }
      const fd = openSync(part, offset === 0 ? "w" : "r+");
      let pos = offset;
      let got = 0;
      try {
        const reader = (r.body as ReadableStream<Uint8Array>).getReader();
        for (;;) {
          const { done, value } = await reader.read();
          if (done) break;
          writeSync(fd, value, 0, value.length, pos);
          pos += value.length;
          got += value.length;
          this.#progress?.(path, pos, meta.size);
        }
        fsyncSync(fd);
      } catch (e) {
        if (got === 0) failures++;
        else failures = 0; // bytes arrived: the counter restarts
        if (failures >= this.#retries) {
          throw new TpError(
            "E_IO",
            `${repo}: ${path}: the connection kept dropping (${(e as Error).message})`,
            {
              cause: e,
            },
          );
        }
        await sleep(this.#backoff * 2 ** Math.max(0, failures - 1));
        continue;
      } finally {
        closeSync(fd);
      }
      if (pos < meta.size) {
        // the body ended early without an error: resume from what arrived
        if (got === 0 && ++failures >= this.#retries) {
          throw new TpError("E_IO", `${repo}: ${path}: the body ended at ${pos} of ${meta.size} bytes`);
        }
        continue;
      }
      if (pos > meta.size) {
        throw new TpError("E_IO", `${repo}: ${path}: ${pos} bytes arrived, the hub said ${meta.size}`);
      }
      break;
    }
    if (statSync(part).size !== meta.size) {
      throw new TpError("E_IO", `${repo}: ${path}: ${statSync(part).size} bytes, expected ${meta.size}`);
    }
    renameSync(part, dest);
    rmSync(side, { force: true });
  }

  /**
   * Fetch the `files` of a commit that are not in its snapshot folder yet, in the given order (small
   * files first, so layout errors surface before the large ones), one at a time, each resumable.
   * @returns the snapshot folder and the files fetched
   * @throws TpError E_IO for a file the commit does not have (from its info), and as {@link downloadFile}
   */
  async ensureFiles(
    repo: string,
    info: HubRepoInfo,
    files: readonly string[],
  ): Promise<{ dir: string; fetched: readonly string[] }> {
    const known = new Set(info.files.map((f) => f.path));
    const absent = files.filter((f) => !known.has(f));
    if (absent.length > 0) {
      throw new TpError("E_IO", `${repo} at ${info.sha.slice(0, 12)} has no ${absent.join(", ")}`);
    }
    const dir = this.snapshotDir(repo, info.sha);
    const fetched: string[] = [];
    for (const f of files) {
      const dest = join(dir, f);
      const want = info.files.find((x) => x.path === f)?.size;
      if (existsSync(dest) && want !== undefined && statSync(dest).size === want) continue;
      await this.downloadFile(repo, info.sha, f, dest);
      fetched.push(f);
    }
    return { dir, fetched };
  }

  /** Record that `files` of a commit are complete and that `revision` points at it. */
  markComplete(repo: string, revision: string, sha: string, files: readonly string[]): void {
    const dir = this.snapshotDir(repo, sha);
    const done = Object.fromEntries(files.map((f) => [f, statSync(join(dir, f)).size]));
    writeFileSync(join(dir, ".tp-complete.json"), JSON.stringify(done));
    const refs = join(hubRepoDir(this.cacheDir, repo), "refs");
    mkdirSync(refs, { recursive: true });
    writeFileSync(join(refs, revision), sha);
  }
}
