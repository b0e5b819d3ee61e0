/**
 * Many workers behind one API, on NATS JetStream (`bun apps/server --queue nats://host:4222`, and
 * `bun apps/server --worker --queue …`). NATS is the scheduler; nothing here is one of our own:
 *
 * - Image jobs: the front checks the body's shape, fixes the seed (a redelivered job draws the same
 *   image), writes the job's state to the KV bucket {@link JOBS_BUCKET} and publishes `{id, body}` to
 *   {@link JOB_SUBJECT}, captured by the work-queue stream {@link STREAM} (each message is removed when
 *   acknowledged). Workers pull from one durable consumer ({@link CONSUMER}, explicit ack, `ack_wait` =
 *   `--ack-wait`); a worker sends `+WPI` (working) every ack_wait / 3 while it runs a job, so a worker
 *   that dies stops extending it and the job is redelivered to another one after ack_wait.
 * - Each job finishes once: every write of a job's state is a compare-and-set on its KV revision; a
 *   worker whose write fails has lost the job (it was cancelled, or redelivered after this worker was
 *   presumed dead) and stops without writing a result. A redelivered job whose state is already final
 *   is acknowledged and skipped.
 * - Results: the PNG goes to the object store {@link IMAGES_BUCKET} under the job id; the state in KV,
 *   so any front answers `GET /v1/jobs/{id}`, `GET /v1/images/files/{id}.png` and a restarted front
 *   answers the jobs it had queued. Progress and previews travel on the core subject
 *   `tp.events.{id}` to whichever front holds the client's SSE; `DELETE` of a running job is
 *   published on `tp.cancel.{id}` (a queued one is marked cancelled in KV; the worker that pulls it
 *   acknowledges it and skips it).
 * - Workers advertise themselves (models, backend, pid) in the KV bucket {@link WORKERS_BUCKET}, whose
 *   entries expire (bucket max_age) unless the worker's heartbeat rewrites them.
 * - NATS unreachable: the front answers 503 `queue_unavailable` at once (no request hangs on a
 *   publish), and serves again when the client has reconnected.
 *
 * - LLM requests: a worker with `--model` serves it with the in-process server on loopback; the front
 *   picks a worker that advertises the body's `model` and proxies the request by NATS request/reply,
 *   the response (SSE tokens included) streamed back chunk by chunk on `tp.llm.stream.{rid}`.
 *
 * Sources: NATS docs — JetStream "Consumers" (AckExplicit, AckWait, `+WPI` in-progress acks), the
 * work-queue retention policy, "Key/Value Store" (revisions, `update` as compare-and-set, bucket TTL),
 * "Object Store"; the @nats-io/jetstream, /kv and /obj READMEs.
 */
import { hostname } from "node:os";
import { AckPolicy, type JsMsg, jetstream, jetstreamManager, RetentionPolicy } from "@nats-io/jetstream";
import { type KV, Kvm } from "@nats-io/kv";
import { type ObjectStore, Objm } from "@nats-io/obj";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { loadBackend, TpError } from "@tp/tensor";
import type { ServerArgs } from "./args.ts";
import { jsonBody, textBody } from "./body.ts";
import { ApiError, apiError, badRequest } from "./errors.ts";
import type { ImageService, JobEvent, JobState } from "./images.ts";
import { startServer } from "./server.ts";

/** The work-queue stream of image jobs. */
export const STREAM = "TP_IMAGE_JOBS";
/** The subject image jobs are published on. */
export const JOB_SUBJECT = "tp.jobs.image";
/** The workers' durable pull consumer. */
export const CONSUMER = "tp-image-workers";
/** KV bucket: job id → the job's state (JSON, GET /v1/jobs/{id}'s body without the URL). */
export const JOBS_BUCKET = "tp_jobs";
/** Object store: job id → PNG bytes. */
export const IMAGES_BUCKET = "tp_images";
/** KV bucket: worker id → its capabilities, expiring unless the heartbeat rewrites them. */
export const WORKERS_BUCKET = "tp_workers";
/** How long a finished job's state and image are kept (ms). */
const KEEP_MS = 24 * 3600 * 1000;
/** A worker's entry in {@link WORKERS_BUCKET} lives this long (ms) without a heartbeat. */
const WORKER_TTL_MS = 15_000;

const FINAL = new Set<string>(["succeeded", "failed", "cancelled"]);

/** A job's state as stored in {@link JOBS_BUCKET}. */
export interface JobRecord {
  id: string;
  object: "image.job";
  model: string | null;
  state: JobState;
  queue_position: number;
  step: number;
  steps: number;
  progress: number;
  eta_ms: number | null;
  elapsed_ms: number;
  created: number;
  params: Record<string, unknown>;
  /** The worker running or that ran it (`host-pid`), null while queued. */
  worker: string | null;
  /** Deliveries that started running it (2 after a redelivery). */
  attempts: number;
  /** DELETE asked a running job to stop (its worker stops at the next step). */
  cancel_requested?: boolean;
  error?: { message: string; code: string | null; status?: number };
  result?: { width: number; height: number; parameters: string | undefined };
}

/** What a worker advertises in {@link WORKERS_BUCKET}. */
export interface Capabilities {
  images?: string;
  llm?: string;
  backend: string;
  device: string;
  pid: number;
}

/** A worker id as one subject token (no dots, spaces or wildcards). */
function token(id: string): string {
  return id.replace(/[^\w-]/g, "_");
}

/** Frames of a proxied LLM response on `tp.llm.stream.{rid}`: the first byte says which. */
const HEAD = 0;
const DATA = 1;
const END = 2;

/** NATS connection options shared by fronts and workers: reconnect forever, quickly. */
async function connectNats(url: string, name: string): Promise<NatsConnection> {
  try {
    return await connect({
      servers: url,
      name,
      maxReconnectAttempts: -1,
      reconnectTimeWait: 250,
      timeout: 5000,
    });
  } catch (e) {
    throw new TpError("E_IO", `--queue: cannot reach NATS at ${url}: ${(e as Error).message}`);
  }
}

/** The stream, consumer, buckets (created when missing; the same config is a no-op). */
async function ensureQueue(
  nc: NatsConnection,
  ackWaitMs: number,
): Promise<{ jobs: KV; pngs: ObjectStore; workers: KV }> {
  const jsm = await jetstreamManager(nc);
  try {
    await jsm.streams.info(STREAM);
  } catch {
    await jsm.streams.add({ name: STREAM, subjects: [JOB_SUBJECT], retention: RetentionPolicy.Workqueue });
  }
  const consumer = {
    durable_name: CONSUMER,
    ack_policy: AckPolicy.Explicit,
    ack_wait: ackWaitMs * 1_000_000,
    max_ack_pending: 1000,
  };
  try {
    await jsm.consumers.add(STREAM, consumer);
  } catch {
    await jsm.consumers.update(STREAM, CONSUMER, { ack_wait: consumer.ack_wait });
  }
  const kvm = new Kvm(nc);
  const jobs = await kvm.create(JOBS_BUCKET, { history: 1, ttl: KEEP_MS });
  const workers = await kvm.create(WORKERS_BUCKET, { history: 1, ttl: WORKER_TTL_MS });
  const pngs = await new Objm(nc).create(IMAGES_BUCKET, { ttl: KEEP_MS * 1_000_000 });
  return { jobs, pngs, workers };
}

function unavailable(url: string, why: string): ApiError {
  return new ApiError(
    503,
    "unavailable_error",
    `the job queue (NATS at ${url}) is unreachable: ${why}; retry later`,
    null,
    "queue_unavailable",
  );
}

/**
 * The image routes of an API front: the same routes and bodies as {@link ImageService.route}, with
 * the jobs run by workers. `queue_position` is 0 and `eta_ms` null (the front does not see the
 * workers' queues); `worker` and `attempts` are extra fields.
 */
export class QueueFront {
  readonly created = Math.floor(Date.now() / 1000);
  readonly #nc: NatsConnection;
  readonly #jobs: KV;
  readonly #pngs: ObjectStore;
  readonly #url: string;
  #connected = true;
  /** Advertised workers: id → capabilities (from {@link WORKERS_BUCKET}). */
  readonly #workers = new Map<string, Capabilities>();
  #nextLlm = 0;
  readonly counts = { submitted: 0, unavailable: 0 };

  private constructor(nc: NatsConnection, url: string, jobs: KV, pngs: ObjectStore, workers: KV) {
    this.#nc = nc;
    this.#url = url;
    this.#jobs = jobs;
    this.#pngs = pngs;
    void (async () => {
      for await (const s of nc.status()) {
        if (s.type === "disconnect") this.#connected = false;
        else if (s.type === "reconnect") this.#connected = true;
      }
    })();
    void (async () => {
      const w = await workers.watch();
      for await (const e of w) {
        if (e.operation !== "PUT") this.#workers.delete(e.key);
        else this.#workers.set(e.key, e.json<Capabilities>());
      }
    })().catch(() => {});
  }

  /** Connect and make sure the stream, consumer and buckets exist. @throws TpError E_IO */
  static async open(url: string, ackWaitMs: number): Promise<QueueFront> {
    const nc = await connectNats(url, `tp-front-${hostname()}-${process.pid}`);
    const { jobs, pngs, workers } = await ensureQueue(nc, ackWaitMs);
    return new QueueFront(nc, url, jobs, pngs, workers);
  }

  /** The image model the workers serve (the first one advertised), "images" before any has. */
  get name(): string {
    for (const c of this.#workers.values()) if (c.images !== undefined) return c.images;
    return "images";
  }

  /** Run `f` against NATS; a lost connection or a NATS error is 503. */
  async #q<T>(f: () => Promise<T>): Promise<T> {
    if (!this.#connected || this.#nc.isClosed()) {
      this.counts.unavailable++;
      throw unavailable(this.#url, "not connected");
    }
    try {
      return await f();
    } catch (e) {
      if (e instanceof ApiError) throw e;
      this.counts.unavailable++;
      throw unavailable(this.#url, (e as Error).message);
    }
  }

  async #record(id: string): Promise<{ rec: JobRecord; revision: number } | undefined> {
    const e = await this.#q(() => this.#jobs.get(id));
    if (e === null || e.operation !== "PUT") return undefined;
    return { rec: e.json<JobRecord>(), revision: e.revision };
  }

  #status(rec: JobRecord, origin: string): Record<string, unknown> {
    const { result, ...rest } = rec;
    if (rec.state !== "succeeded" || result === undefined) return rest;
    return { ...rest, result: { url: `${origin}/v1/images/files/${rec.id}.png`, ...result } };
  }

  /** Queue a job: its state in KV, then the message. @throws ApiError 400 for a bad body, 503 */
  async submit(body: unknown): Promise<JobRecord> {
    if (typeof body !== "object" || body === null || Array.isArray(body))
      throw badRequest("the request body must be a JSON object");
    const b = { ...(body as Record<string, unknown>) };
    if (typeof b.prompt !== "string") throw badRequest("'prompt' must be a string", "prompt");
    // the seed is drawn here, so that a redelivered job draws the same image
    if (b.seed === undefined || b.seed === null || b.seed === -1)
      b.seed = Math.floor(Math.random() * 2 ** 53);
    const id = `imgjob-${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`;
    const steps = typeof b.steps === "number" ? b.steps : 0;
    const rec: JobRecord = {
      id,
      object: "image.job",
      model: null,
      state: "queued",
      queue_position: 0,
      step: 0,
      steps,
      progress: 0,
      eta_ms: null,
      elapsed_ms: 0,
      created: Math.floor(Date.now() / 1000),
      params: { prompt: b.prompt, seed: String(b.seed) },
      worker: null,
      attempts: 0,
    };
    await this.#q(async () => {
      await this.#jobs.create(id, JSON.stringify(rec));
      await jetstream(this.#nc).publish(JOB_SUBJECT, JSON.stringify({ id, body: b }), { msgID: id });
    });
    this.counts.submitted++;
    return rec;
  }

  /** Cancel: a queued job is marked cancelled (compare-and-set), a running one is told its worker. */
  async cancel(id: string): Promise<JobRecord | undefined> {
    for (let i = 0; i < 8; i++) {
      const r = await this.#record(id);
      if (r === undefined) return undefined;
      if (r.rec.state === "queued") {
        const rec: JobRecord = { ...r.rec, state: "cancelled" };
        try {
          await this.#q(() => this.#jobs.update(id, JSON.stringify(rec), r.revision));
          this.#nc.publish(`tp.events.${id}`, JSON.stringify({ type: "cancelled" }));
          return rec;
        } catch (e) {
          if (e instanceof ApiError && !this.#connected) throw e;
          continue; // a worker took it meanwhile: read again
        }
      }
      if (r.rec.state === "running") {
        // the flag in KV reaches the worker at its next state write even if the message is missed
        const rec: JobRecord = { ...r.rec, cancel_requested: true };
        try {
          if (r.rec.cancel_requested !== true)
            await this.#q(() => this.#jobs.update(id, JSON.stringify(rec), r.revision));
        } catch (e) {
          if (e instanceof ApiError && !this.#connected) throw e;
          continue; // the worker wrote a step meanwhile: read again
        }
        this.#nc.publish(`tp.cancel.${id}`, "");
        return rec;
      }
      return r.rec;
    }
    return (await this.#record(id))?.rec;
  }

  /** Wait until the job's state is final (events, and a KV read every 250 ms in case one is missed). */
  async #final(id: string, signal: AbortSignal): Promise<JobRecord> {
    const sub = this.#nc.subscribe(`tp.events.${id}`);
    let wake = () => {};
    void (async () => {
      for await (const m of sub) {
        const t = (m.json() as JobEvent).type;
        if (FINAL.has(t)) wake();
      }
    })();
    const onAbort = () => void this.cancel(id).catch(() => {});
    signal.addEventListener("abort", onAbort, { once: true });
    try {
      for (;;) {
        const r = await this.#record(id);
        if (r === undefined) throw new ApiError(500, "server_error", `the job ${id} vanished from the queue`);
        if (FINAL.has(r.rec.state)) return r.rec;
        await new Promise<void>((resolve) => {
          wake = resolve;
          setTimeout(resolve, 250);
        });
      }
    } finally {
      signal.removeEventListener("abort", onAbort);
      sub.unsubscribe();
    }
  }

  #notFound(id: string): ApiError {
    return new ApiError(
      404,
      "not_found_error",
      `no job '${id}' (it never existed, or it finished long ago)`,
      "id",
      "job_not_found",
    );
  }

  /** The image routes; undefined when the path is not one of them. */
  async route(req: Request, url: URL, limit: number): Promise<[string, Response] | undefined> {
    const path = url.pathname;
    const origin = url.origin;
    const body = () => jsonBody(req, limit);
    if (path === "/v1/images/generations" && req.method === "POST") {
      const b = await body();
      const rec = await this.#final((await this.submit(b)).id, req.signal);
      if (rec.state === "cancelled") return [path, new Response(null, { status: 499 })];
      if (rec.state === "failed") {
        // E_ARG (e.g. a prompt longer than the text encoder takes): the request's fault, as in-process
        const status = rec.error?.status ?? (rec.error?.code === "E_ARG" ? 400 : 500);
        throw new ApiError(
          status,
          status === 400 ? "invalid_request_error" : "server_error",
          rec.error?.message ?? "the image failed",
          null,
          rec.error?.code ?? null,
        );
      }
      const png = await this.#q(() => this.#pngs.getBlob(rec.id));
      if (png === null) throw new ApiError(500, "server_error", `the image of ${rec.id} is missing`);
      const rf = (b as Record<string, unknown>).response_format;
      const item =
        rf === "url"
          ? { url: `${origin}/v1/images/files/${rec.id}.png` }
          : { b64_json: Buffer.from(png).toString("base64") };
      return [
        path,
        Response.json({
          created: Math.floor(Date.now() / 1000),
          data: [{ ...item, revised_prompt: rec.params.prompt }],
          usage: {
            steps: rec.steps,
            seed: rec.params.seed,
            width: rec.result?.width,
            height: rec.result?.height,
          },
        }),
      ];
    }
    if (path === "/v1/jobs" && req.method === "POST") {
      const rec = await this.submit(await body());
      return ["/v1/jobs", Response.json(this.#status(rec, origin), { status: 202 })];
    }
    if (path === "/v1/jobs" && req.method === "GET") {
      const data = await this.#q(async () => {
        const out: Record<string, unknown>[] = [];
        for await (const k of await this.#jobs.keys()) {
          const r = await this.#record(k);
          if (r !== undefined) out.push(this.#status(r.rec, origin));
        }
        return out;
      });
      return ["/v1/jobs", Response.json({ object: "list", data })];
    }
    const m = /^\/v1\/jobs\/(imgjob-[0-9a-f]{24})(\/events)?$/.exec(path);
    if (m !== null) {
      const id = m[1] as string;
      if (m[2] !== undefined && req.method === "GET")
        return [path, await this.#events(id, origin, req.signal)];
      if (m[2] === undefined && req.method === "GET") {
        const r = await this.#record(id);
        if (r === undefined) throw this.#notFound(id);
        return [path, Response.json(this.#status(r.rec, origin))];
      }
      if (m[2] === undefined && req.method === "DELETE") {
        const rec = await this.cancel(id);
        if (rec === undefined) throw this.#notFound(id);
        return [path, Response.json(this.#status(rec, origin))];
      }
    } else if (/^\/v1\/jobs\/[^/]+(\/events)?$/.test(path))
      throw this.#notFound(path.split("/")[3] as string);
    const f = /^\/v1\/images\/files\/(imgjob-[0-9a-f]{24})\.png$/.exec(path);
    if (f !== null && req.method === "GET") {
      const png = await this.#q(() => this.#pngs.getBlob(f[1] as string));
      if (png === null) throw new ApiError(404, "not_found_error", `no image ${f[1]}.png`);
      return [path, new Response(png, { headers: { "content-type": "image/png" } })];
    }
    return undefined;
  }

  /** SSE: the job's state now, then the worker's events until it ends. */
  async #events(id: string, origin: string, signal: AbortSignal): Promise<Response> {
    const sub = this.#nc.subscribe(`tp.events.${id}`);
    const first = await this.#record(id).catch((e) => {
      sub.unsubscribe();
      throw e;
    });
    if (first === undefined) {
      sub.unsubscribe();
      throw this.#notFound(id);
    }
    const te = new TextEncoder();
    const stream = new ReadableStream<Uint8Array>({
      start: async (controller) => {
        let open = true;
        const send = (data: unknown) => {
          if (open) controller.enqueue(te.encode(`data: ${JSON.stringify(data)}\n\n`));
        };
        const close = () => {
          if (!open) return;
          open = false;
          sub.unsubscribe();
          controller.close();
        };
        signal.addEventListener("abort", close, { once: true });
        send({ type: "status", ...this.#status(first.rec, origin) });
        if (FINAL.has(first.rec.state)) return close();
        for await (const m of sub) {
          const e = m.json() as JobEvent;
          if (FINAL.has(e.type)) {
            const r = await this.#record(id).catch(() => undefined);
            send({ ...e, ...(r === undefined ? {} : this.#status(r.rec, origin)) });
            return close();
          }
          send(e);
        }
        close();
      },
      cancel: () => sub.unsubscribe(),
    });
    return new Response(stream, {
      headers: { "content-type": "text/event-stream", "cache-control": "no-cache" },
    });
  }

  /**
   * A completion route through a worker that advertises the body's `model` (round robin among them):
   * a request on `tp.llm.worker.{id}` (answered at once), then the worker's HTTP response — status,
   * headers, each body chunk as it comes (SSE tokens) — on `tp.llm.stream.{rid}`. A client that goes
   * away sends `tp.llm.cancel.{rid}`.
   * @throws ApiError 404 when no worker has the model, 503 when none serves one or NATS is away
   */
  async llm(req: Request, route: string, limit: number): Promise<Response> {
    const text = await textBody(req, limit);
    let model: unknown;
    try {
      model = (JSON.parse(text) as { model?: unknown } | null)?.model;
    } catch (e) {
      throw badRequest(`the request body is not valid JSON: ${(e as Error).message}`);
    }
    const llms = [...this.#workers].filter(([, c]) => c.llm !== undefined);
    if (llms.length === 0)
      throw new ApiError(
        503,
        "unavailable_error",
        "no worker serves a language model now (start one with --worker --queue … --model FILE)",
        null,
        "no_worker",
      );
    const fit = llms.filter(([, c]) => model === undefined || model === null || c.llm === model);
    if (fit.length === 0)
      throw new ApiError(
        404,
        "not_found_error",
        `no worker has the model '${String(model)}'; the workers have ${[...new Set(llms.map(([, c]) => `'${c.llm}'`))].join(", ")}`,
        "model",
        "model_not_found",
      );
    const [id] = fit[this.#nextLlm++ % fit.length] as [string, Capabilities];
    const rid = crypto.randomUUID().replaceAll("-", "");
    const nc = this.#nc;
    const sub = nc.subscribe(`tp.llm.stream.${rid}`);
    const frames = sub[Symbol.asyncIterator]();
    try {
      await this.#q(() =>
        nc.request(`tp.llm.worker.${token(id)}`, JSON.stringify({ rid, route, body: text }), {
          timeout: 5000,
        }),
      );
    } catch (e) {
      sub.unsubscribe();
      throw e;
    }
    const first = await frames.next();
    const head = first.done ? undefined : first.value.data;
    if (head === undefined || head[0] !== HEAD) {
      sub.unsubscribe();
      throw new ApiError(502, "server_error", `the worker ${id} sent no response`);
    }
    const h = JSON.parse(new TextDecoder().decode(head.subarray(1))) as {
      status: number;
      headers: Record<string, string>;
    };
    const cancel = () => {
      nc.publish(`tp.llm.cancel.${rid}`, "");
      sub.unsubscribe();
    };
    req.signal.addEventListener("abort", cancel, { once: true });
    const body = new ReadableStream<Uint8Array>({
      pull: async (controller) => {
        const r = await frames.next();
        const d = r.done ? undefined : r.value.data;
        if (d === undefined || d[0] === END) {
          req.signal.removeEventListener("abort", cancel);
          sub.unsubscribe();
          controller.close();
        } else controller.enqueue(d.slice(1));
      },
      cancel,
    });
    return new Response(body, { status: h.status, headers: h.headers });
  }

  /** /metrics lines. */
  metrics(
    metric: (name: string, type: "counter" | "gauge", help: string, values: [string, number][]) => void,
  ): void {
    metric("tp_queue_jobs_submitted_total", "counter", "Image jobs published to the queue.", [
      ["", this.counts.submitted],
    ]);
    metric("tp_queue_unavailable_total", "counter", "Requests answered 503 (NATS unreachable).", [
      ["", this.counts.unavailable],
    ]);
    metric("tp_queue_connected", "gauge", "1 while connected to NATS.", [["", this.#connected ? 1 : 0]]);
    metric("tp_queue_image_workers", "gauge", "Image workers advertised (heartbeat within the TTL).", [
      ["", [...this.#workers.values()].filter((c) => c.images !== undefined).length],
    ]);
  }

  /** Drain the connection. */
  async close(): Promise<void> {
    await this.#nc.drain().catch(() => {});
  }
}

/** One delivery of a job on a worker. @returns what the worker did, for its log */
async function runJob(
  m: JsMsg,
  ctx: {
    nc: NatsConnection;
    jobs: KV;
    pngs: ObjectStore;
    images: ImageService;
    worker: string;
    ackWaitMs: number;
  },
): Promise<string> {
  const { id, body } = m.json<{ id: string; body: unknown }>();
  const entry = await ctx.jobs.get(id);
  if (entry === null || entry.operation !== "PUT") {
    m.term();
    return `job ${id}: no state in ${JOBS_BUCKET}; dropped`;
  }
  let rec = entry.json<JobRecord>();
  let revision = entry.revision;
  if (FINAL.has(rec.state)) {
    await m.ackAck();
    return `job ${id}: already ${rec.state}; acknowledged`;
  }
  const events = `tp.events.${id}`;
  let onCancel = () => {};
  /** Compare-and-set the job's state; false when another owner changed it (the job is lost). */
  const write = async (next: JobRecord): Promise<boolean> => {
    for (let i = 0; i < 4; i++) {
      try {
        revision = await ctx.jobs.update(id, JSON.stringify(next), revision);
        rec = next;
        return true;
      } catch {
        // still ours, and a front asked it to stop: take the flag and write again
        const e = await ctx.jobs.get(id);
        if (e === null || e.operation !== "PUT") return false;
        const now = e.json<JobRecord>();
        if (now.state !== "running" || now.worker !== ctx.worker || now.attempts !== next.attempts)
          return false;
        if (now.cancel_requested !== true) return false;
        revision = e.revision;
        next = { ...next, cancel_requested: true };
        onCancel();
      }
    }
    return false;
  };
  let params: ReturnType<ImageService["params"]>;
  try {
    params = ctx.images.params(body);
  } catch (e) {
    const err = apiError(e);
    if (
      await write({
        ...rec,
        state: "failed",
        error: { message: err.message, code: err.code, status: err.status },
      })
    )
      ctx.nc.publish(events, JSON.stringify({ type: "failed", error: rec.error }));
    await m.ackAck();
    return `job ${id}: failed (${err.message})`;
  }
  const started = {
    ...rec,
    state: "running" as const,
    model: ctx.images.name,
    worker: ctx.worker,
    attempts: rec.attempts + 1,
    steps: params.steps,
    params: {
      prompt: params.prompt,
      negative_prompt: params.negative ?? null,
      width: params.width,
      height: params.height,
      steps: params.steps,
      cfg_scale: params.cfg,
      seed: String(params.seed),
    },
  };
  if (!(await write(started))) {
    m.nak(); // cancelled or taken meanwhile: the next delivery reads the new state
    return `job ${id}: its state changed before it started; released`;
  }
  const heartbeat = setInterval(() => m.working(), Math.max(100, ctx.ackWaitMs / 3));
  const job = ctx.images.submit(params);
  onCancel = () => ctx.images.cancel(job);
  let lost = false;
  let chain = Promise.resolve();
  const cancelSub = ctx.nc.subscribe(`tp.cancel.${id}`, { callback: () => ctx.images.cancel(job) });
  job.listeners.add((e) => {
    if (FINAL.has(e.type)) return; // written below, after the image is stored
    ctx.nc.publish(events, JSON.stringify(e));
    if (e.type !== "step") return;
    const next = {
      ...rec,
      step: e.step as number,
      steps: e.steps as number,
      progress: (e.step as number) / (e.steps as number),
      eta_ms: e.eta_ms as number,
      elapsed_ms: job.elapsedMs,
    };
    chain = chain.then(async () => {
      if (lost) return;
      if (!(await write(next))) {
        lost = true;
        ctx.images.cancel(job);
      }
    });
  });
  try {
    await job.done;
    await chain;
  } finally {
    clearInterval(heartbeat);
    cancelSub.unsubscribe();
  }
  if (lost) return `job ${id}: lost (its state was changed by another owner); stopped`;
  if (job.state === "succeeded") {
    await ctx.pngs.putBlob({ name: id }, job.png as Uint8Array);
  }
  const final: JobRecord = {
    ...rec,
    state: job.state,
    step: job.step,
    steps: job.steps,
    progress: job.state === "succeeded" ? 1 : rec.progress,
    eta_ms: job.state === "running" ? rec.eta_ms : 0,
    elapsed_ms: job.elapsedMs,
    ...(job.error ? { error: job.error } : {}),
    ...(job.state === "succeeded"
      ? {
          result: {
            width: job.width as number,
            height: job.height as number,
            parameters: job.parameters,
          },
        }
      : {}),
  };
  if (!(await write(final))) return `job ${id}: lost before its result was written; stopped`;
  await m.ackAck();
  ctx.nc.publish(events, JSON.stringify({ type: job.state, ...(job.error ? { error: job.error } : {}) }));
  return `job ${id}: ${job.state}`;
}

/**
 * `bun apps/server --worker --queue URL --image-model …`: load the image model, advertise it, pull
 * jobs one at a time until SIGINT / SIGTERM. Each finished job logs `[worker W: job ID: STATE]`.
 * @throws TpError E_ARG without --image-model, E_IO when NATS is unreachable
 */
export async function serveWorker(args: ServerArgs): Promise<number> {
  if (args.imageModel === undefined && args.model === undefined)
    throw new TpError("E_ARG", "--worker needs --image-model (with --vae, --text-encoder) or --model FILE");
  const backend = await loadBackend(
    args.backend,
    args.threads === undefined ? {} : { threads: args.threads },
  );
  let images: ImageService | undefined;
  if (args.imageModel !== undefined) {
    const { loadImageService } = await import("./images.ts");
    images = loadImageService(args.imageModel, backend, {
      vae: args.vae as string,
      textEncoder: args.textEncoder,
      outputDir: args.outputDir,
      queueLimit: 1,
    });
  }
  // the language model is served by the in-process server on loopback; requests are proxied to it
  const { loadEngine } = await import("./serve.ts");
  const engine = args.model === undefined ? undefined : loadEngine(args, backend);
  const local =
    engine === undefined
      ? undefined
      : startServer({ llm: engine, host: "127.0.0.1", port: 0, maxBodyBytes: args.maxBody });
  const url = args.queue as string;
  const worker = `${hostname()}-${process.pid}`;
  const nc = await connectNats(url, `tp-worker-${worker}`);
  const { jobs, pngs, workers } = await ensureQueue(nc, args.ackWaitMs);
  const caps: Capabilities = {
    ...(images === undefined ? {} : { images: images.name }),
    ...(engine === undefined ? {} : { llm: engine.options.name }),
    backend: backend.name,
    device: backend.device,
    pid: process.pid,
  };
  const capabilities = JSON.stringify(caps);
  const advertise = () => void workers.put(worker, capabilities).catch(() => {});
  let stopping = false;
  const stop = new Promise<void>((resolve) => {
    const f = () => {
      stopping = true;
      resolve();
    };
    process.once("SIGINT", f);
    process.once("SIGTERM", f);
  });
  let llmSub: ReturnType<NatsConnection["subscribe"]> | undefined;
  if (local !== undefined)
    llmSub = nc.subscribe(`tp.llm.worker.${token(worker)}`, {
      callback: (_err, msg) => {
        const { rid, route, body } = msg.json<{ rid: string; route: string; body: string }>();
        msg.respond("ok");
        const out = `tp.llm.stream.${rid}`;
        const abort = new AbortController();
        const cancel = nc.subscribe(`tp.llm.cancel.${rid}`, { max: 1, callback: () => abort.abort() });
        const frame = (kind: number, bytes: Uint8Array) => {
          const f = new Uint8Array(bytes.length + 1);
          f[0] = kind;
          f.set(bytes, 1);
          nc.publish(out, f);
        };
        void (async () => {
          try {
            const res = await fetch(`${local.url}${route}`, {
              method: "POST",
              body,
              headers: { "content-type": "application/json" },
              signal: abort.signal,
            });
            const headers: Record<string, string> = {};
            res.headers.forEach((v, k) => {
              if (k === "content-type" || k === "cache-control" || k.startsWith("access-control-"))
                headers[k] = v;
            });
            frame(HEAD, new TextEncoder().encode(JSON.stringify({ status: res.status, headers })));
            if (res.body !== null) for await (const chunk of res.body) frame(DATA, chunk);
          } catch {
            // aborted by the client, or the local server failed: the stream ends
          } finally {
            frame(END, new Uint8Array(0));
            cancel.unsubscribe();
          }
        })();
      },
    });
  await nc.flush();
  advertise();
  const beat = setInterval(advertise, WORKER_TTL_MS / 3);
  const what = [images?.name, engine?.options.name].filter((x) => x !== undefined).join(", ");
  process.stderr.write(`[worker ${worker}: ${what} on ${backend.name}, pulling from ${url}]\n`);
  let loop: Promise<void> = Promise.resolve();
  if (images !== undefined) {
    const consumer = await jetstream(nc).consumers.get(STREAM, CONSUMER);
    const ctx = { nc, jobs, pngs, images, worker, ackWaitMs: args.ackWaitMs };
    loop = (async () => {
      while (!stopping) {
        let m: JsMsg | null;
        try {
          m = await consumer.next({ expires: 1000 });
        } catch {
          await Bun.sleep(250); // NATS away: try again once reconnected
          continue;
        }
        if (m === null) continue;
        try {
          process.stderr.write(`[worker ${worker}: ${await runJob(m, ctx)}]\n`);
        } catch (e) {
          process.stderr.write(`[worker ${worker}: job failed in the queue: ${(e as Error).message}]\n`);
        }
      }
    })();
  }
  await stop;
  await loop;
  clearInterval(beat);
  llmSub?.unsubscribe();
  await workers.delete(worker).catch(() => {});
  await nc.drain().catch(() => {});
  await local?.stop();
  engine?.dispose();
  images?.dispose();
  backend.dispose();
  return 0;
}

/**
 * `bun apps/server --queue URL`: an API front whose image jobs are run by workers. It loads no model.
 * @throws TpError E_IO when NATS is unreachable at start
 */
export async function serveFront(args: ServerArgs): Promise<number> {
  const url = args.queue as string;
  const front = await QueueFront.open(url, args.ackWaitMs);
  const server = startServer({
    images: front,
    llmProxy: (req, route) => front.llm(req, route, args.maxBody),
    host: args.host,
    port: args.port,
    apiKey: args.apiKey,
    maxBodyBytes: args.maxBody,
  });
  process.stderr.write(
    `[listening on ${server.url}: image jobs through ${url}${args.apiKey === undefined ? "" : "; API key required"}]\n`,
  );
  await new Promise<void>((resolve) => {
    process.once("SIGINT", () => resolve());
    process.once("SIGTERM", () => resolve());
  });
  await server.stop();
  await front.close();
  return 0;
}
