/**
 * A mock Hugging Face hub on loopback for tests (../shared/spec/qwen-image.md §13.3): repository info,
 * `resolve` for small git files (200 + ETag sha1) and "LFS" files (302 to a content host on another
 * port with X-Linked-Etag / X-Linked-Size / X-Repo-Commit), the content route with Range / 206 / 416,
 * and 404 / 401 error headers; fault switches per test; every request recorded.
 */
import { createHash } from "node:crypto";

/** Fault switches (each consumed as it fires). */
export interface MockHubFaults {
  /** Cut the next content bodies after this many bytes (a connection drop), `times` times. */
  cutAfter?: { bytes: number; times: number };
  /** Answer 503 this many times on the content host. */
  fail503?: number;
  /** Answer content requests with 200 and the whole body, ignoring Range. */
  ignoreRange?: boolean;
  /** Answer the next content request 403 (an expired signed URL). */
  expireOnce?: boolean;
  /** Require `Authorization: Bearer <token>` on the hub. */
  requireToken?: string;
  /** Mark the repository gated (401 GatedRepo without the token). */
  gated?: boolean;
}

/** One recorded request. */
export interface MockHubRequest {
  readonly host: "hub" | "cdn";
  readonly method: string;
  readonly path: string;
  readonly range: string | null;
  readonly authorization: string | null;
}

/** A running mock hub. */
export interface MockHub extends Disposable {
  readonly endpoint: string;
  readonly repo: string;
  readonly sha: string;
  readonly requests: MockHubRequest[];
  readonly faults: MockHubFaults;
  /** Replace a file's content (its ETag changes with it). */
  setFile(path: string, data: Uint8Array): void;
  stop(): void;
}

const sha256 = (b: Uint8Array) => createHash("sha256").update(b).digest("hex");
const sha1 = (b: Uint8Array) => createHash("sha1").update(b).digest("hex");

/**
 * Start a mock hub serving one repository.
 * @param files path → content; files ≥ `lfsFrom` bytes are "LFS" (served by the content host)
 */
export function startMockHub(
  repo: string,
  files: Record<string, Uint8Array>,
  options: { lfsFrom?: number; otherRepos?: Record<string, Record<string, Uint8Array>> } = {},
): MockHub {
  const lfsFrom = options.lfsFrom ?? 64;
  const content = new Map(Object.entries(files));
  const repos = new Map<string, Map<string, Uint8Array>>([
    [repo, content],
    ...Object.entries(options.otherRepos ?? {}).map(([r, f]) => [r, new Map(Object.entries(f))] as const),
  ]);
  const sha = "0123456789abcdef0123456789abcdef01234567";
  const requests: MockHubRequest[] = [];
  const faults: MockHubFaults = {};
  const record = (host: "hub" | "cdn", req: Request) => {
    const u = new URL(req.url);
    requests.push({
      host,
      method: req.method,
      path: u.pathname,
      range: req.headers.get("range"),
      authorization: req.headers.get("authorization"),
    });
  };

  const cdn = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    fetch(req) {
      record("cdn", req);
      const hash = new URL(req.url).pathname.replace(/^\/cdn\//, "");
      const data = [...repos.values()].flatMap((m) => [...m.values()]).find((d) => sha256(d) === hash);
      if (data === undefined) return new Response("gone", { status: 404 });
      const total = data.length;
      const m = /^bytes=(\d+)-$/.exec(req.headers.get("range") ?? "");
      let start = 0;
      let status = 200;
      const headers: Record<string, string> = { "Accept-Ranges": "bytes", ETag: `"${hash}"` };
      if (m && !faults.ignoreRange) {
        start = Number(m[1]);
        if (start >= total) {
          return new Response(null, { status: 416, headers: { "Content-Range": `bytes */${total}` } });
        }
        status = 206;
        headers["Content-Range"] = `bytes ${start}-${total - 1}/${total}`;
      }
      const body = data.subarray(start);
      const cut = faults.cutAfter;
      if (cut && cut.times > 0) {
        cut.times--;
        const k = Math.min(cut.bytes, body.length - 1);
        const stream = new ReadableStream<Uint8Array>({
          start(c) {
            c.enqueue(body.slice(0, k));
            setTimeout(() => c.error(new Error("connection reset")), 10);
          },
        });
        return new Response(stream, {
          status,
          headers: { ...headers, "Content-Length": String(body.length) },
        });
      }
      if (faults.fail503 && faults.fail503 > 0) {
        faults.fail503--;
        return new Response("busy", { status: 503 });
      }
      if (faults.expireOnce) {
        faults.expireOnce = false;
        return new Response("expired", { status: 403 });
      }
      return new Response(body, { status, headers });
    },
  });
  const cdnBase = `http://127.0.0.1:${cdn.port}`;

  const hub = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    fetch(req) {
      record("hub", req);
      const u = new URL(req.url);
      const authOk =
        faults.requireToken === undefined ||
        req.headers.get("authorization") === `Bearer ${faults.requireToken}`;
      const gatedHeaders = {
        "X-Error-Code": "GatedRepo",
        "X-Error-Message": "Access to this model is restricted",
      };
      const which = [...repos.keys()].find(
        (r) => u.pathname.startsWith(`/api/models/${r}/revision/`) || u.pathname.startsWith(`/${r}/resolve/`),
      );
      const served = which === undefined ? undefined : repos.get(which);
      if (u.pathname.startsWith("/api/models/") && served !== undefined) {
        if (!authOk) {
          return new Response("no", {
            status: 401,
            headers: faults.gated ? gatedHeaders : { "X-Error-Code": "RepoNotFound" },
          });
        }
        const siblings = [...served].map(([p, d]) =>
          d.length >= lfsFrom
            ? { rfilename: p, size: d.length, lfs: { sha256: sha256(d), size: d.length, pointerSize: 130 } }
            : { rfilename: p, size: d.length },
        );
        return Response.json({
          id: which,
          sha,
          private: false,
          gated: faults.gated ? "manual" : false,
          siblings,
        });
      }
      if (u.pathname.startsWith("/api/models/")) {
        return new Response("no", { status: 401, headers: { "X-Error-Code": "RepoNotFound" } });
      }
      const prefix = `/${which}/resolve/${sha}/`;
      if (served === undefined || !u.pathname.startsWith(prefix)) {
        return new Response("no", {
          status: 404,
          headers: { "X-Error-Code": "RevisionNotFound", "X-Repo-Commit": sha },
        });
      }
      if (!authOk) return new Response("no", { status: 401, headers: faults.gated ? gatedHeaders : {} });
      const path = decodeURIComponent(u.pathname.slice(prefix.length));
      const data = served.get(path);
      if (data === undefined) {
        return new Response("no", {
          status: 404,
          headers: { "X-Error-Code": "EntryNotFound", "X-Repo-Commit": sha },
        });
      }
      if (data.length >= lfsFrom) {
        const h = sha256(data);
        return new Response("Found. Redirecting", {
          status: 302,
          headers: {
            Location: `${cdnBase}/cdn/${h}`,
            "X-Linked-Etag": `"${h}"`,
            "X-Linked-Size": String(data.length),
            "X-Repo-Commit": sha,
          },
        });
      }
      return new Response(req.method === "HEAD" ? null : data, {
        headers: { ETag: `W/"${sha1(data)}"`, "X-Repo-Commit": sha, "Content-Length": String(data.length) },
      });
    },
  });
  const stop = () => {
    hub.stop(true);
    cdn.stop(true);
  };
  return {
    endpoint: `http://127.0.0.1:${hub.port}`,
    repo,
    sha,
    requests,
    faults,
    setFile: (p, d) => void content.set(p, d),
    stop,
    [Symbol.dispose]: stop,
  };
}
