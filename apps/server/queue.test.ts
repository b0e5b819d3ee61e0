// The NATS JetStream queue (./queue.ts) with a real nats-server (-js, a temporary store, a random
// loopback port) and the server as child processes: one front (`--queue`) and two workers
// (`--worker --queue`) on the random-weight Krea 2 checkpoints of @tp/diffusion/testing. The
// reference for every image is the same request run by an in-process ImageService (the embedded,
// queue-less default): the PNG bytes must be equal. Each job must finish exactly once (one
// "succeeded" line across the workers' logs); a worker SIGKILLed mid-job → the job is redelivered
// after --ack-wait and finished once by the other; a front killed and restarted answers the jobs it
// had queued; DELETE reaches a running job's worker; NATS stopped → 503 queue_unavailable at once,
// and jobs run again when it is back. Skipped (saying why) where nats-server is not installed.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { hostname, tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createBackend } from "@tp/backend-cpu";
import {
  TINY_KREA2_CONFIG,
  TINY_KREA2_TEXT_CONFIG,
  writeRandomKrea2Dit,
  writeRandomQwen3VlText,
  writeRandomWanVae,
} from "@tp/diffusion/testing";
import { type Subprocess, spawn } from "bun";
import { type ImageService, loadImageService } from "./images.ts";
import { loadEngine } from "./serve.ts";
import { type RunningServer, startServer } from "./server.ts";

const QWEN = resolve(import.meta.dir, "../../../shared/models/synthetic/qwen3-tiny-Q8_0.gguf");
const HAVE_QWEN = existsSync(QWEN);
if (!HAVE_QWEN) console.warn(`queue.test.ts: the chat test is skipped: ${QWEN} is absent`);

const NATS = Bun.which("nats-server");
if (NATS === null)
  console.warn("queue.test.ts skipped: nats-server is not installed (apt-get install nats-server)");

const INDEX = join(import.meta.dir, "index.ts");
const T = 240_000;
const tmp = mkdtempSync(join(tmpdir(), "tp-server-queue-test-"));
const dit = join(tmp, "krea2-random.safetensors");
const vae = join(tmp, "vae.safetensors");
const te = join(tmp, "te.safetensors");
const store = join(tmp, "js");
const model = [
  "--image-model",
  dit,
  "--vae",
  vae,
  "--text-encoder",
  te,
  "--threads",
  "1",
  ...(HAVE_QWEN ? ["-m", QWEN, "--ctx", "256"] : []),
];

interface Child {
  proc: Subprocess<"ignore", "ignore", "pipe">;
  log: string;
  exited: Promise<number>;
}

function child(cmd: string[]): Child {
  const proc = spawn(cmd, { stdin: "ignore", stdout: "ignore", stderr: "pipe" });
  const c: Child = { proc, log: "", exited: proc.exited };
  void (async () => {
    const dec = new TextDecoder();
    for await (const chunk of proc.stderr) c.log += dec.decode(chunk);
  })();
  return c;
}

async function until<T>(
  what: string,
  f: () => Promise<T | undefined> | T | undefined,
  ms = 60_000,
): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await Bun.sleep(50);
  }
}

async function freePort(): Promise<number> {
  const s = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response() });
  const p = s.port as number;
  await s.stop(true);
  return p;
}

let natsPort = 0;
let nats: Child | undefined;
let front: Child | undefined;
let frontUrl = "";
const workers: Child[] = [];
let local: ImageService;
const backend = createBackend({ threads: 1 });

async function startNats(): Promise<void> {
  nats = child([NATS as string, "-js", "-a", "127.0.0.1", "-p", String(natsPort), "-sd", store]);
  await until("nats-server to listen", () => (nats?.log.includes("Server is ready") ? true : undefined));
}

async function startFront(): Promise<void> {
  front = child(["bun", INDEX, "--queue", `nats://127.0.0.1:${natsPort}`, "--port", "0", "--ack-wait", "2"]);
  frontUrl = await until("the front to listen", () => {
    if (front?.proc.exitCode !== null) throw new Error(`the front exited: ${front?.log}`);
    return /\[listening on (http:\/\/[^:]+:\d+)/.exec(front?.log ?? "")?.[1];
  });
}

function startWorker(): Child {
  const w = child([
    "bun",
    INDEX,
    "--worker",
    "--queue",
    `nats://127.0.0.1:${natsPort}`,
    "--ack-wait",
    "2",
    ...model,
  ]);
  workers.push(w);
  return w;
}

async function post(path: string, body: unknown): Promise<Response> {
  return await fetch(`${frontUrl}${path}`, { method: "POST", body: JSON.stringify(body) });
}

async function job(id: string): Promise<Record<string, unknown>> {
  return (await (await fetch(`${frontUrl}/v1/jobs/${id}`)).json()) as Record<string, unknown>;
}

async function finalState(id: string, ms = 60_000): Promise<Record<string, unknown>> {
  return await until(
    `job ${id} to end`,
    async () => {
      const s = await job(id);
      return s.state === "succeeded" || s.state === "failed" || s.state === "cancelled" ? s : undefined;
    },
    ms,
  );
}

/** The in-process server's PNG for the same body. */
async function localPng(body: Record<string, unknown>): Promise<Uint8Array> {
  const j = local.submit(local.params(body));
  await j.done;
  expect(j.state).toBe("succeeded");
  return j.png as Uint8Array;
}

async function png(id: string): Promise<Uint8Array> {
  const res = await fetch(`${frontUrl}/v1/images/files/${id}.png`);
  expect(res.status).toBe(200);
  return new Uint8Array(await res.arrayBuffer());
}

/** How many times the workers' logs say the job succeeded. */
function successes(id: string): number {
  return workers.reduce(
    (n, w) => n + w.log.split("\n").filter((l) => l.includes(`job ${id}: succeeded`)).length,
    0,
  );
}

const body = (i: number, steps = 2) => ({
  prompt: `a lighthouse, take ${i}`,
  size: "64x48",
  steps,
  seed: 100 + i,
  cfg_scale: 1,
});

describe.skipIf(NATS === null)("image jobs through NATS JetStream", () => {
  beforeAll(async () => {
    writeRandomKrea2Dit(dit, TINY_KREA2_CONFIG, { seed: 1 });
    writeRandomWanVae(vae, undefined, { seed: 2 });
    writeRandomQwen3VlText(te, TINY_KREA2_TEXT_CONFIG, { seed: 3 });
    local = loadImageService(dit, backend, { vae, textEncoder: te, outputDir: join(tmp, "local") });
    natsPort = await freePort();
    await startNats();
    await startFront();
    startWorker();
    startWorker();
    await until("both workers to pull", () => {
      for (const w of workers) if (w.proc.exitCode !== null) throw new Error(`a worker exited: ${w.log}`);
      return workers.every((w) => w.log.includes("pulling from")) ? true : undefined;
    });
  }, T);

  afterAll(async () => {
    for (const c of [front, ...workers, nats]) c?.proc.kill("SIGKILL");
    await Promise.all([front, ...workers, nats].map((c) => c?.exited));
    local?.dispose();
    backend.dispose();
    rmSync(tmp, { recursive: true, force: true });
  });

  const N = 12;
  test(
    `${N} jobs on one front and two workers: each finishes once with the local PNG`,
    async () => {
      const ids: string[] = [];
      for (let i = 0; i < N; i++) {
        const res = await post("/v1/jobs", body(i));
        expect(res.status).toBe(202);
        const s = (await res.json()) as { id: string; state: string };
        expect(s.state).toBe("queued");
        ids.push(s.id);
      }
      const sse = fetch(`${frontUrl}/v1/jobs/${ids[N - 1]}/events`).then((r) => r.text());
      for (let i = 0; i < N; i++) {
        const id = ids[i] as string;
        const s = await finalState(id);
        expect(s.state).toBe("succeeded");
        expect([s.step, s.steps, s.attempts]).toEqual([2, 2, 1]);
        expect(Buffer.from(await png(id)).equals(Buffer.from(await localPng(body(i))))).toBe(true);
      }
      await Bun.sleep(200); // the last log lines
      for (const id of ids) expect(successes(id)).toBe(1);
      // the last job's SSE: its status, then (when it was still queued) steps with previews, then the result
      const events = (await sse)
        .split("\n\n")
        .filter((b) => b.startsWith("data: "))
        .map((b) => JSON.parse(b.slice(6)) as Record<string, unknown>);
      expect(events[0]?.type).toBe("status");
      const last = events[events.length - 1] as Record<string, unknown>;
      expect([last.type, last.state]).toEqual(["succeeded", "succeeded"]);
      expect((last.result as { url: string }).url).toBe(`${frontUrl}/v1/images/files/${ids[N - 1]}.png`);
      for (const e of events.filter((e) => e.type === "step"))
        expect(String(e.preview).startsWith("data:image/png;base64,")).toBe(true);
    },
    T,
  );

  test(
    "POST /v1/images/generations waits for a worker's image",
    async () => {
      const res = await post("/v1/images/generations", body(50));
      expect(res.status).toBe(200);
      const r = (await res.json()) as { data: { b64_json: string }[] };
      const got = Buffer.from(r.data[0]?.b64_json as string, "base64");
      expect(got.equals(Buffer.from(await localPng(body(50))))).toBe(true);
      const bad = await post("/v1/images/generations", { ...body(51), steps: 0 });
      expect(bad.status).toBe(400); // the worker's check of the body, answered as the local server does
      expect(((await bad.json()) as { error: { message: string } }).error.message).toContain("steps");
      // a chunked body past --max-body (1 MiB): the front stops reading at the limit, 413 in the OpenAI shape
      const huge = await fetch(`${frontUrl}/v1/images/generations`, {
        method: "POST",
        body: new ReadableStream({
          start(c) {
            for (let i = 0; i < 40; i++) c.enqueue(new Uint8Array(1 << 16).fill(32));
            c.close();
          },
        }),
        duplex: "half",
      } as RequestInit);
      expect(huge.status).toBe(413);
      expect(((await huge.json()) as { error: { code: string } }).error.code).toBe("request_too_large");
    },
    T,
  );

  test.skipIf(!HAVE_QWEN)(
    "chat through a worker (JSON and streamed) equals the in-process server's answer",
    async () => {
      const engine = loadEngine(
        {
          model: QWEN,
          alias: undefined,
          ctx: 256,
          parallel: 1,
          queueLimit: 8,
          nPredict: 32,
          reasoningFormat: "deepseek",
          batch: true,
        },
        backend,
      );
      const ref: RunningServer = startServer({ llm: engine, port: 0 });
      try {
        const req = {
          model: engine.options.name,
          messages: [{ role: "user", content: "Name three colours." }],
          temperature: 0,
          max_tokens: 24,
        };
        const ask = async (base: string, stream: boolean) => {
          const r = await fetch(`${base}/v1/chat/completions`, {
            method: "POST",
            body: JSON.stringify({ ...req, stream }),
          });
          expect(r.status).toBe(200);
          if (!stream) {
            const j = (await r.json()) as { choices: { message: { content: string } }[] };
            return j.choices[0]?.message.content as string;
          }
          expect(r.headers.get("content-type")).toBe("text/event-stream");
          const text = await r.text();
          expect(text.endsWith("data: [DONE]\n\n")).toBe(true);
          return text
            .split("\n\n")
            .filter((b) => b.startsWith("data: {"))
            .map(
              (b) =>
                (JSON.parse(b.slice(6)) as { choices: { delta: { content?: string } }[] }).choices[0]?.delta
                  .content ?? "",
            )
            .join("");
        };
        const want = await ask(ref.url, false);
        expect(want.length).toBeGreaterThan(0);
        expect(await ask(frontUrl, false)).toBe(want);
        expect(await ask(frontUrl, true)).toBe(want);
        expect(await ask(frontUrl, false)).toBe(want); // the other worker (round robin)
        const missing = await fetch(`${frontUrl}/v1/chat/completions`, {
          method: "POST",
          body: JSON.stringify({ ...req, model: "nope" }),
        });
        expect(missing.status).toBe(404);
        expect(((await missing.json()) as { error: { message: string } }).error.message).toContain(
          engine.options.name,
        );
      } finally {
        await ref.stop();
        engine.dispose();
      }
    },
    T,
  );

  test(
    "a worker SIGKILLed mid-job: the job is redelivered and finished once by the other",
    async () => {
      const b = body(60, 40);
      const { id } = (await (await post("/v1/jobs", b)).json()) as { id: string };
      const s = await until("the job to run a step", async () => {
        const s = await job(id);
        return s.state === "running" && (s.step as number) >= 1 ? s : undefined;
      });
      const victim = workers.find((w) => `${hostname()}-${w.proc.pid}` === s.worker) as Child;
      expect(victim).toBeDefined();
      victim.proc.kill("SIGKILL");
      await victim.exited;
      const f = await finalState(id, 120_000);
      expect(f.state).toBe("succeeded");
      expect(f.attempts).toBe(2);
      expect(f.worker).not.toBe(s.worker);
      expect(Buffer.from(await png(id)).equals(Buffer.from(await localPng(b)))).toBe(true);
      await Bun.sleep(200);
      expect(successes(id)).toBe(1);
      workers.splice(workers.indexOf(victim), 1);
    },
    T,
  );

  test(
    "DELETE reaches the worker of a running job, and drops a queued one",
    async () => {
      // every worker busy with a long job, then one more job: it stays queued
      const running: string[] = [];
      for (let i = 0; i < workers.length; i++)
        running.push(((await (await post("/v1/jobs", body(70 + i, 200))).json()) as { id: string }).id);
      for (const id of running)
        await until("the job to run", async () => ((await job(id)).state === "running" ? true : undefined));
      const queued = ((await (await post("/v1/jobs", body(79))).json()) as { id: string }).id;
      const d = await fetch(`${frontUrl}/v1/jobs/${queued}`, { method: "DELETE" });
      expect(((await d.json()) as { state: string }).state).toBe("cancelled");
      for (const id of running) await fetch(`${frontUrl}/v1/jobs/${id}`, { method: "DELETE" });
      for (const id of running) {
        const f = await finalState(id);
        expect(f.state).toBe("cancelled");
        expect(f.step as number).toBeLessThan(200);
      }
      expect((await finalState(queued)).state).toBe("cancelled");
    },
    T,
  );

  test(
    "a front killed and restarted answers the jobs it had queued",
    async () => {
      const ids: string[] = [];
      for (let i = 0; i < 3; i++)
        ids.push(((await (await post("/v1/jobs", body(80 + i))).json()) as { id: string }).id);
      front?.proc.kill("SIGKILL");
      await front?.exited;
      await startFront();
      for (let i = 0; i < 3; i++) {
        const id = ids[i] as string;
        expect((await finalState(id)).state).toBe("succeeded");
        expect(Buffer.from(await png(id)).equals(Buffer.from(await localPng(body(80 + i))))).toBe(true);
      }
    },
    T,
  );

  test(
    "NATS stopped: 503 queue_unavailable at once; jobs run again when it is back",
    async () => {
      nats?.proc.kill("SIGTERM");
      await nats?.exited;
      const res = await until("a 503", async () => {
        const t = Date.now();
        const r = await post("/v1/jobs", body(90));
        return r.status === 503 ? { r, ms: Date.now() - t } : undefined;
      });
      expect(res.ms).toBeLessThan(1000);
      const e = (await res.r.json()) as { error: { code: string; message: string } };
      expect(e.error.code).toBe("queue_unavailable");
      expect(e.error.message).toContain(`nats://127.0.0.1:${natsPort}`);
      await startNats();
      const ok = await until("a 202 after NATS is back", async () => {
        const r = await post("/v1/jobs", body(91));
        return r.status === 202 ? ((await r.json()) as { id: string }) : undefined;
      });
      expect((await finalState(ok.id)).state).toBe("succeeded");
      expect(Buffer.from(await png(ok.id)).equals(Buffer.from(await localPng(body(91))))).toBe(true);
    },
    T,
  );
});
