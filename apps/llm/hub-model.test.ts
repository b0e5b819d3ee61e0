// `--model org/name[:TAG]` (llama.cpp's -hf habit) against the mock hub of @tp/formats on loopback:
// the pick from a repository listing (tag any case, Q4_K_M by default, shards together, projectors
// never, ambiguous / missing tags one E_ARG listing the files), the download into the Hub cache layout
// and no request at all on the second run; and `bun apps/llm -m ORG/NAME:TAG` end to end giving the
// same greedy answer as the local file it downloaded.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { startMockHub } from "@tp/formats/testing/mock-hub";
import { isTpError } from "@tp/tensor";
import { parseHubModelRef, pickGgufFiles, resolveModelArg } from "./hub-model.ts";

const tmp = mkdtempSync(join(tmpdir(), "tp-llm-hub-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));
let n = 0;
const cacheDir = () => join(tmp, `cache${n++}`);

const LISTING = [
  ".gitattributes",
  "README.md",
  "Qwen3-0.6B-Q8_0.gguf",
  "Qwen3-0.6B-Q4_K_M.gguf",
  "Qwen3-0.6B-Q4_K_S.gguf",
  "mmproj-Qwen3-F16.gguf",
  "big/Qwen3-0.6B-Q6_K-00002-of-00002.gguf",
  "big/Qwen3-0.6B-Q6_K-00001-of-00002.gguf",
];

function errorOf(f: () => unknown): string {
  try {
    f();
  } catch (e) {
    return isTpError(e) ? `${e.code}: ${e.message}` : String(e);
  }
  return "no error";
}

describe("pickGgufFiles: the tag against the repository listing", () => {
  test("a tag matches case-insensitively; no tag is Q4_K_M; a split model is all its shards", () => {
    expect(pickGgufFiles("Qwen/Qwen3-0.6B-GGUF", LISTING, "q8_0")).toEqual(["Qwen3-0.6B-Q8_0.gguf"]);
    expect(pickGgufFiles("Qwen/Qwen3-0.6B-GGUF", LISTING, undefined)).toEqual(["Qwen3-0.6B-Q4_K_M.gguf"]);
    expect(pickGgufFiles("Qwen/Qwen3-0.6B-GGUF", LISTING, "Q6_K")).toEqual([
      "big/Qwen3-0.6B-Q6_K-00001-of-00002.gguf",
      "big/Qwen3-0.6B-Q6_K-00002-of-00002.gguf",
    ]);
    // without Q4_K_M: the first model listed (projectors and non-GGUF files never count)
    expect(pickGgufFiles("a/b", ["mmproj-F16.gguf", "x-Q5_0.gguf", "x-Q8_0.gguf"], undefined)).toEqual([
      "x-Q5_0.gguf",
    ]);
    // a tag standing alone between separators wins over one inside a longer tag
    expect(pickGgufFiles("a/b", ["x-Q4_0.gguf", "x-IQ4_0_X.gguf"], "Q4_0")).toEqual(["x-Q4_0.gguf"]);
  });

  test("an ambiguous or missing tag is one E_ARG line listing the GGUF files", () => {
    const amb = errorOf(() => pickGgufFiles("Qwen/Qwen3-0.6B-GGUF", LISTING, "Q4_K"));
    expect(amb).toStartWith("E_ARG: --model Qwen/Qwen3-0.6B-GGUF:Q4_K: 'Q4_K' matches several models");
    expect(amb).toContain("Qwen3-0.6B-Q4_K_M.gguf, Qwen3-0.6B-Q4_K_S.gguf");
    const missing = errorOf(() => pickGgufFiles("Qwen/Qwen3-0.6B-GGUF", LISTING, "IQ2_XS"));
    expect(missing).toStartWith("E_ARG: --model Qwen/Qwen3-0.6B-GGUF:IQ2_XS: no .gguf file matches 'IQ2_XS'");
    expect(missing).toContain("Qwen3-0.6B-Q8_0.gguf");
    expect(missing).not.toContain("mmproj");
    expect(missing.split("\n").length).toBe(1);
    expect(errorOf(() => pickGgufFiles("Qwen/Qwen3-0.6B-GGUF", LISTING, "F16"))).toContain(
      "no .gguf file matches 'F16'",
    );
    expect(errorOf(() => pickGgufFiles("a/b", ["README.md", "model.safetensors"], undefined))).toContain(
      "the repository has no .gguf model file (files: README.md, model.safetensors)",
    );
  });

  test("parseHubModelRef: paths stay paths", () => {
    expect(parseHubModelRef("Qwen/Qwen3-0.6B-GGUF:Q8_0")).toEqual({
      repo: "Qwen/Qwen3-0.6B-GGUF",
      tag: "Q8_0",
    });
    expect(parseHubModelRef("Qwen/Qwen3-0.6B-GGUF")).toEqual({
      repo: "Qwen/Qwen3-0.6B-GGUF",
      tag: undefined,
    });
    expect(parseHubModelRef("models/qwen3.gguf")).toBeNull(); // a missing file, not a repository
    expect(parseHubModelRef("./a/b")).toBeNull();
    expect(parseHubModelRef("/abs/path")).toBeNull();
    expect(parseHubModelRef("a/b/c")).toBeNull();
    expect(parseHubModelRef(import.meta.dir.split("/").slice(-2).join("/"))).toBeNull(); // exists
  });
});

const REPO = "Qwen/Qwen3-0.6B-GGUF";
const bytes = (seed: number, len: number) => Uint8Array.from({ length: len }, (_, i) => (i * seed + 1) % 251);

describe("resolveModelArg against the mock hub", () => {
  test("downloads the pick into the Hub cache pinned to the commit; the second run requests nothing", async () => {
    const files: Record<string, Uint8Array<ArrayBuffer>> = {};
    LISTING.forEach((f, i) => {
      files[f] = bytes(i + 3, 300 + i);
    });
    using hub = startMockHub(REPO, files);
    const dir = cacheDir();
    const o = { endpoint: hub.endpoint, cacheDir: dir, token: null, backoffMs: 1 };
    const p = await resolveModelArg(`${REPO}:Q6_K`, o);
    const snap = join(dir, "models--Qwen--Qwen3-0.6B-GGUF", "snapshots", hub.sha);
    expect(p).toBe(join(snap, "big/Qwen3-0.6B-Q6_K-00001-of-00002.gguf"));
    for (const f of ["big/Qwen3-0.6B-Q6_K-00001-of-00002.gguf", "big/Qwen3-0.6B-Q6_K-00002-of-00002.gguf"])
      expect(new Uint8Array(readFileSync(join(snap, f)))).toEqual(files[f] as Uint8Array<ArrayBuffer>);
    expect(existsSync(join(snap, "Qwen3-0.6B-Q8_0.gguf"))).toBe(false);
    expect(readFileSync(join(dir, "models--Qwen--Qwen3-0.6B-GGUF", "refs", "main"), "utf8")).toBe(hub.sha);
    expect(
      hub.requests
        .filter((r) => r.host === "hub" && r.path.includes("/resolve/"))
        .every((r) => r.path.includes(hub.sha)),
    ).toBe(true);

    const before = hub.requests.length;
    expect(await resolveModelArg(`${REPO}:q6_k`, o)).toBe(p);
    expect(hub.requests.length).toBe(before); // complete: no request

    // another tag of the same repository: fetched, and the earlier pick stays complete
    const q4 = await resolveModelArg(REPO, o);
    expect(q4).toBe(join(snap, "Qwen3-0.6B-Q4_K_M.gguf"));
    expect(new Uint8Array(readFileSync(q4))).toEqual(
      files["Qwen3-0.6B-Q4_K_M.gguf"] as Uint8Array<ArrayBuffer>,
    );
    const after = hub.requests.length;
    expect(await resolveModelArg(`${REPO}:Q6_K`, o)).toBe(p);
    expect(await resolveModelArg(REPO, o)).toBe(q4);
    expect(hub.requests.length).toBe(after);

    // a tag that is not there: one E_ARG naming the files (the listing is kept: still no request)
    let e: unknown;
    try {
      await resolveModelArg(`${REPO}:Q2_K`, o);
    } catch (x) {
      e = x;
    }
    expect(isTpError(e, "E_ARG")).toBe(true);
    expect((e as Error).message).toContain(
      "no .gguf file matches 'Q2_K'; the repository has Qwen3-0.6B-Q8_0.gguf",
    );
  });

  test("a local path is answered unchanged, without any request", async () => {
    using hub = startMockHub(REPO, { "x-Q8_0.gguf": bytes(5, 100) });
    const o = { endpoint: hub.endpoint, cacheDir: cacheDir(), token: null };
    expect(await resolveModelArg(import.meta.path, o)).toBe(import.meta.path);
    expect(await resolveModelArg("missing/file.gguf", o)).toBe("missing/file.gguf");
    expect(hub.requests).toEqual([]);
  });
});

const MODELS = resolve(import.meta.dir, "../../../shared/models");
const QWEN = join(MODELS, "synthetic/qwen3-tiny-F32.gguf");
const APP = resolve(import.meta.dir, "index.ts");

describe.skipIf(!existsSync(QWEN))("bun apps/llm -m ORG/NAME:TAG end to end", () => {
  if (!existsSync(QWEN)) test.skip(`skipped: ${QWEN} is absent (the shared models folder)`, () => {});

  async function run(args: string[], env: Record<string, string>) {
    const p = Bun.spawn(["bun", APP, ...args], {
      stdin: "ignore",
      stdout: "pipe",
      stderr: "pipe",
      env: { ...process.env, ...env },
    });
    const [stdout, stderr, code] = await Promise.all([
      new Response(p.stdout).text(),
      new Response(p.stderr).text(),
      p.exited,
    ]);
    return { code, stdout, stderr };
  }

  test("downloads the tagged file and answers as the local file does; a wrong tag is one error line", async () => {
    const data = new Uint8Array(readFileSync(QWEN));
    using hub = startMockHub("tp-test/qwen3-tiny-GGUF", {
      "README.md": new TextEncoder().encode("# tiny\n"),
      "qwen3-tiny-F32.gguf": data,
      "qwen3-tiny-Q8_0.gguf": bytes(7, 1000), // not a model: must not be fetched
    });
    const home = join(tmp, "hfhome");
    const env = { HF_HOME: home, HF_ENDPOINT: hub.endpoint, HF_TOKEN: "" };
    const args = ["-p", "Hello", "-n", "6", "--temp", "0", "--seed", "1", "--json"];
    const viaHub = await run(["-m", "tp-test/qwen3-tiny-GGUF:f32", ...args], env);
    expect(viaHub.code).toBe(0);
    const local = await run(["-m", QWEN, ...args], {});
    expect(local.code).toBe(0);
    const a = JSON.parse(viaHub.stdout);
    const b = JSON.parse(local.stdout);
    expect(a.ids.length).toBeGreaterThan(0);
    expect(a.prompt_ids).toEqual(b.prompt_ids);
    expect(a.ids).toEqual(b.ids);
    const snap = join(home, "hub", "models--tp-test--qwen3-tiny-GGUF", "snapshots", hub.sha);
    expect(new Uint8Array(readFileSync(join(snap, "qwen3-tiny-F32.gguf")))).toEqual(data);
    expect(existsSync(join(snap, "qwen3-tiny-Q8_0.gguf"))).toBe(false);

    const wrong = await run(["-m", "tp-test/qwen3-tiny-GGUF:Q4_K", "-p", "x"], env);
    expect(wrong.code).toBe(2);
    expect(wrong.stderr.trim().split("\n").length).toBe(1);
    expect(wrong.stderr).toContain(
      "no .gguf file matches 'Q4_K'; the repository has qwen3-tiny-F32.gguf, qwen3-tiny-Q8_0.gguf",
    );
  }, 90_000);
});
