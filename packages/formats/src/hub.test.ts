// The Hub client against a mock hub on loopback (testing/mock-hub.ts; qwen-image.md §13.3) with every
// fault switch: a dropped connection resumes at the partial size; a changed ETag restarts from 0; 503s
// are retried; a 404 is not; an ignored Range rewrites from 0; an expired signed URL gets a fresh
// Location; the token never reaches the content host; a gated repository says what to do; nothing is
// fetched when the snapshot is complete; no .incomplete or sidecar is left after success.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { isTpError } from "@tp/tensor";
import { HubClient, hfToken } from "./hub.ts";
import { startMockHub } from "./testing/mock-hub.ts";

const tmp = mkdtempSync(join(tmpdir(), "tp-hub-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));
let n = 0;
const cacheDir = () => join(tmp, `cache${n++}`);

const big = Uint8Array.from({ length: 5000 }, (_, i) => (i * 7 + 3) % 251);
const small = new TextEncoder().encode('{"_class_name":"QwenImage21Pipeline"}');
const files = () => ({ "model_index.json": small, "transformer/w.safetensors": big.slice() });
const REPO = "Qwen/Qwen-Image-2.1";

function client(endpoint: string, dir: string, token: string | null = null) {
  return new HubClient({ endpoint, cacheDir: dir, token, backoffMs: 1, retries: 4 });
}

async function errorOf(f: () => Promise<unknown>): Promise<string> {
  try {
    await f();
  } catch (e) {
    return isTpError(e) ? `${e.code}: ${e.message}` : String(e);
  }
  return "no error";
}

const leftovers = (dir: string): string[] =>
  (readdirSync(dir, { recursive: true }) as string[]).filter((f) => f.includes(".incomplete"));

describe("Hub downloads against a mock hub", () => {
  test("a whole snapshot: pinned to the commit, small file 200, LFS through the content host; then nothing fetched", async () => {
    using hub = startMockHub(REPO, files());
    const dir = cacheDir();
    const c = client(hub.endpoint, dir, "secret");
    const info = await c.repoInfo(REPO);
    expect(info.sha).toBe(hub.sha);
    const { dir: snap, fetched } = await c.ensureFiles(REPO, info, [
      "model_index.json",
      "transformer/w.safetensors",
    ]);
    expect(fetched).toEqual(["model_index.json", "transformer/w.safetensors"]);
    expect(new Uint8Array(readFileSync(join(snap, "transformer/w.safetensors")))).toEqual(big);
    expect(snap).toBe(join(dir, "models--Qwen--Qwen-Image-2.1", "snapshots", hub.sha));
    expect(
      hub.requests
        .filter((r) => r.host === "hub" && r.path.includes("/resolve/"))
        .every((r) => r.path.includes(hub.sha)),
    ).toBe(true);
    expect(hub.requests.filter((r) => r.host === "cdn").every((r) => r.authorization === null)).toBe(true);
    expect(
      hub.requests.filter((r) => r.host === "hub").every((r) => r.authorization === "Bearer secret"),
    ).toBe(true);
    c.markComplete(REPO, "main", info.sha, ["model_index.json", "transformer/w.safetensors"]);
    const before = hub.requests.length;
    expect(c.cachedSnapshot(REPO)).toBe(snap);
    expect(hub.requests.length).toBe(before);
    expect(leftovers(dir)).toEqual([]);
  });

  test("a dropped connection resumes at the partial size", async () => {
    using hub = startMockHub(REPO, files());
    hub.faults.cutAfter = { bytes: 1200, times: 2 };
    const c = client(hub.endpoint, cacheDir());
    const info = await c.repoInfo(REPO);
    const { dir } = await c.ensureFiles(REPO, info, ["transformer/w.safetensors"]);
    expect(new Uint8Array(readFileSync(join(dir, "transformer/w.safetensors")))).toEqual(big);
    const ranges = hub.requests.filter((r) => r.host === "cdn").map((r) => r.range);
    expect(ranges).toEqual(["bytes=0-", "bytes=1200-", "bytes=2400-"]);
    expect(leftovers(dir)).toEqual([]);
  });

  test("a partial file of another ETag restarts from 0 (never spliced)", async () => {
    using hub = startMockHub(REPO, files());
    const dir = cacheDir();
    hub.faults.cutAfter = { bytes: 1000, times: 1 };
    hub.faults.fail503 = 10; // after the drop: the run gives up with 1000 bytes kept
    const c = new HubClient({ endpoint: hub.endpoint, cacheDir: dir, token: null, backoffMs: 1, retries: 1 });
    const info = await c.repoInfo(REPO);
    expect(await errorOf(() => c.ensureFiles(REPO, info, ["transformer/w.safetensors"]))).toContain("E_IO");
    const partial = join(c.snapshotDir(REPO, info.sha), "transformer/w.safetensors.incomplete");
    expect(readFileSync(partial).length).toBe(1000);
    const changed = big.map((v) => 255 - v);
    hub.setFile("transformer/w.safetensors", changed);
    hub.faults.fail503 = 0;
    hub.requests.length = 0;
    const again = client(hub.endpoint, dir);
    const info2 = await again.repoInfo(REPO);
    const { dir: snap } = await again.ensureFiles(REPO, info2, ["transformer/w.safetensors"]);
    expect(new Uint8Array(readFileSync(join(snap, "transformer/w.safetensors")))).toEqual(changed);
    expect(hub.requests.filter((r) => r.host === "cdn").map((r) => r.range)).toEqual(["bytes=0-"]);
    expect(leftovers(dir)).toEqual([]);
  });

  test("503s are retried; a 404 is not; an ignored Range rewrites from 0; an expired URL gets a fresh Location", async () => {
    using hub = startMockHub(REPO, files());
    const c = client(hub.endpoint, cacheDir());
    const info = await c.repoInfo(REPO);
    hub.faults.fail503 = 2;
    await c.ensureFiles(REPO, info, ["transformer/w.safetensors"]);
    expect(hub.requests.filter((r) => r.host === "cdn").length).toBe(3);

    const missing = await errorOf(() =>
      c.downloadFile(REPO, info.sha, "nope.json", join(tmp, "x", "nope.json")),
    );
    expect(missing).toContain("nope.json does not exist (404 EntryNotFound)");
    expect(hub.requests.filter((r) => r.path.endsWith("/nope.json")).length).toBe(1);

    const d2 = cacheDir();
    const c2 = new HubClient({ endpoint: hub.endpoint, cacheDir: d2, token: null, backoffMs: 1, retries: 1 });
    hub.faults.cutAfter = { bytes: 700, times: 1 };
    hub.faults.fail503 = 1;
    expect(await errorOf(() => c2.ensureFiles(REPO, info, ["transformer/w.safetensors"]))).toContain(
      "HTTP 503",
    );
    hub.faults.ignoreRange = true;
    hub.faults.expireOnce = true;
    hub.requests.length = 0;
    const { dir } = await client(hub.endpoint, d2).ensureFiles(REPO, info, ["transformer/w.safetensors"]);
    expect(new Uint8Array(readFileSync(join(dir, "transformer/w.safetensors")))).toEqual(big);
    const heads = hub.requests.filter((r) => r.host === "hub" && r.method === "HEAD").length;
    expect(heads).toBe(2); // the first, and the fresh Location after the 403
    expect(leftovers(d2)).toEqual([]);
  });

  test("a gated repository: the licence message, no retry; a token reaches the hub only", async () => {
    using hub = startMockHub(REPO, files());
    hub.faults.gated = true;
    hub.faults.requireToken = "tok";
    const e = await errorOf(() => client(hub.endpoint, cacheDir()).repoInfo(REPO));
    expect(e).toContain("is gated: accept its licence");
    expect(hub.requests.length).toBe(1);
    const c = client(hub.endpoint, cacheDir(), "tok");
    const info = await c.repoInfo(REPO);
    await c.ensureFiles(REPO, info, ["model_index.json", "transformer/w.safetensors"]);
    expect(hub.requests.filter((r) => r.host === "cdn" && r.authorization !== null)).toEqual([]);
    expect(await errorOf(() => client(hub.endpoint, cacheDir()).repoInfo("Qwen/Other"))).toContain(
      "no such repository, or it is private",
    );
  });

  test("token sources: HF_TOKEN, then HUGGING_FACE_HUB_TOKEN, then $HF_HOME/token", () => {
    const home = join(tmp, "hfhome");
    rmSync(home, { recursive: true, force: true });
    expect(hfToken({ HF_HOME: home })).toBeNull();
    require("node:fs").mkdirSync(home, { recursive: true });
    writeFileSync(join(home, "token"), "from-file\n");
    expect(hfToken({ HF_HOME: home })).toBe("from-file");
    expect(hfToken({ HF_HOME: home, HUGGING_FACE_HUB_TOKEN: "b" })).toBe("b");
    expect(hfToken({ HF_HOME: home, HUGGING_FACE_HUB_TOKEN: "b", HF_TOKEN: "a" })).toBe("a");
    expect(existsSync(join(home, "token"))).toBe(true);
  });
});
