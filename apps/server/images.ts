/**
 * The image side of the server: one diffusion pipeline from @tp/diffusion's registry, loaded once
 * (DiT, VAE, text encoder resident), and a FIFO of jobs run one at a time.
 *
 * - `POST /v1/images/generations` (OpenAI's shape: `prompt`, `n` = 1, `size` "WxH",
 *   `response_format` "b64_json" | "url"; plus sd-server's `negative_prompt`, `steps`, `cfg_scale`,
 *   `seed`) waits for its image.
 * - `POST /v1/jobs` queues the same body and answers 202 with the job; `GET /v1/jobs/{id}` gives its
 *   state (queued, running, succeeded, failed, cancelled), queue position, step, ETA and result;
 *   `DELETE /v1/jobs/{id}` cancels it (queued: dropped; running: stopped at the next step);
 *   `GET /v1/jobs/{id}/events` is an SSE stream of progress, each step with a small PNG preview of
 *   the latent (./preview.ts), then the result.
 * - `GET /v1/images/files/{id}.png` serves a stored PNG, which carries the `parameters` text chunk
 *   (AUTOMATIC1111's format) and `tensorpencil` (the settings as JSON).
 *
 * Sources: the OpenAI API reference (Images: create); stable-diffusion.cpp `examples/server`
 * (sd-server's extra fields, async jobs); ComfyUI's `/prompt` queue and preview over its websocket.
 */
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";
import {
  type DiffusionPipeline,
  encodePng,
  type GenerateEvent,
  type ImageRequest,
  type LoadedPipeline,
  pipelineForCheckpoint,
} from "@tp/diffusion";
import { type Backend, TpError } from "@tp/tensor";
import { jsonBody } from "./body.ts";
import { ApiError, apiError, badRequest } from "./errors.ts";
import { LATENT_RGB, latentToRgb } from "./preview.ts";

/** Where the image model's files are, and the service's limits. */
export interface ImageServiceOptions {
  /** The text encoder (required: requests bring prompts, not saved conditioning). */
  textEncoder: string | undefined;
  vae: string;
  /** Folder for the PNGs (created if missing). Default: a fresh temporary folder. */
  outputDir?: string | undefined;
  /** Jobs that may wait; one more is 503. Default 64. */
  queueLimit?: number;
  /** The model's name in the API. Default: the DiT file's name. */
  name?: string | undefined;
}

/** Job states, as sd-server and OpenAI's batch API spell them. */
export type JobState = "queued" | "running" | "succeeded" | "failed" | "cancelled";

/** What a job was asked, checked. */
export interface ImageParams {
  prompt: string;
  negative: string | undefined;
  width: number;
  height: number;
  steps: number;
  cfg: number;
  seed: bigint;
  responseFormat: "b64_json" | "url";
  preview: boolean;
}

/** A progress / result event of a job (SSE `data:`). */
export type JobEvent = Record<string, unknown> & {
  type: "queued" | "started" | "step" | "succeeded" | "failed" | "cancelled";
};

interface Job {
  id: string;
  params: ImageParams;
  state: JobState;
  created: number;
  startedAt?: number;
  finishedAt?: number;
  step: number;
  steps: number;
  elapsedMs: number;
  error?: { message: string; code: string | null };
  file?: string;
  png?: Uint8Array;
  width?: number;
  height?: number;
  parameters?: string;
  cancel: boolean;
  /** The latest step's preview (a PNG data URL), sent with the status to a client that joins late. */
  preview?: string;
  /** The latest step's latent while nobody listened (its preview is made when first asked for). */
  denoised?: { readonly data: Float32Array; readonly shape: readonly number[] };
  listeners: Set<(e: JobEvent) => void>;
  done: Promise<void>;
  resolve: () => void;
}

/** Jobs kept for GET after they end (the oldest finished ones are forgotten first). */
const KEEP_JOBS = 256;

class Cancelled extends Error {}

/** OpenAI's `size` ("1024x768") or `width`/`height`. */
function sizeOf(
  b: Record<string, unknown>,
  d: { width: number; height: number },
): { width: number; height: number } {
  if (b.size !== undefined && b.size !== null && b.size !== "auto") {
    const m = typeof b.size === "string" ? /^(\d{1,5})x(\d{1,5})$/.exec(b.size) : null;
    if (m === null)
      throw badRequest(
        `'size' must be WIDTHxHEIGHT (e.g. "1024x1024"), got ${JSON.stringify(b.size)}`,
        "size",
      );
    return { width: Number(m[1]), height: Number(m[2]) };
  }
  const side = (k: string, dflt: number) => {
    const v = b[k];
    if (v === undefined || v === null) return dflt;
    if (typeof v !== "number" || !Number.isSafeInteger(v)) throw badRequest(`'${k}' must be an integer`, k);
    return v;
  };
  return { width: side("width", d.width), height: side("height", d.height) };
}

/**
 * A loaded image model and its job queue.
 */
export class ImageService {
  readonly name: string;
  readonly created = Math.floor(Date.now() / 1000);
  readonly pipeline: DiffusionPipeline;
  readonly outputDir: string;
  readonly #loaded: LoadedPipeline;
  readonly #jobs = new Map<string, Job>();
  readonly #queue: Job[] = [];
  readonly #queueLimit: number;
  #running: Job | null = null;
  /** Recent step times (ms), for ETAs. */
  #stepMs = 0;
  readonly counts = { succeeded: 0, failed: 0, cancelled: 0, rejected: 0, steps: 0, stepSeconds: 0 };

  constructor(loaded: LoadedPipeline, options: { name: string; outputDir: string; queueLimit: number }) {
    this.#loaded = loaded;
    this.pipeline = loaded.pipeline;
    this.name = options.name;
    this.outputDir = options.outputDir;
    this.#queueLimit = options.queueLimit;
  }

  /** Jobs waiting. */
  get queueDepth(): number {
    return this.#queue.length;
  }

  /** Check a request body against the pipeline's limits. @throws ApiError 400 naming the field */
  params(v: unknown): ImageParams {
    if (typeof v !== "object" || v === null || Array.isArray(v))
      throw badRequest("the request body must be a JSON object");
    const b = v as Record<string, unknown>;
    const p = this.pipeline;
    const d = p.defaults;
    const L = p.limits;
    if (b.model !== undefined && b.model !== null && b.model !== this.name)
      throw new ApiError(
        404,
        "not_found_error",
        `the model '${String(b.model)}' does not exist; this server has '${this.name}'`,
        "model",
        "model_not_found",
      );
    if (typeof b.prompt !== "string" || b.prompt.trim() === "")
      throw badRequest("'prompt' must be a non-empty string", "prompt");
    if (b.n !== undefined && b.n !== null && b.n !== 1)
      throw badRequest("'n' must be 1 (one image per request)", "n");
    const rf = b.response_format ?? "b64_json";
    if (rf !== "b64_json" && rf !== "url")
      throw badRequest("'response_format' must be b64_json or url", "response_format");
    const { width, height } = sizeOf(b, d);
    for (const [k, x] of [
      ["width", width],
      ["height", height],
    ] as const)
      if (x < L.minSize || x > L.maxSize)
        throw badRequest(
          `the image ${k} must be from ${L.minSize} to ${L.maxSize} pixels, got ${x}`,
          b.size !== undefined ? "size" : k,
        );
    const steps = b.steps ?? b.sample_steps ?? d.steps;
    if (typeof steps !== "number" || !Number.isSafeInteger(steps) || steps < 1 || steps > L.maxSteps)
      throw badRequest(`'steps' must be an integer from 1 to ${L.maxSteps}`, "steps");
    const cfg = b.cfg_scale ?? b.cfg ?? b.guidance_scale ?? d.cfg;
    if (typeof cfg !== "number" || !Number.isFinite(cfg) || cfg < 0 || cfg > 100)
      throw badRequest("'cfg_scale' must be a number from 0 to 100", "cfg_scale");
    const negative = b.negative_prompt ?? undefined;
    if (negative !== undefined && negative !== null && typeof negative !== "string")
      throw badRequest("'negative_prompt' must be a string", "negative_prompt");
    let seed: bigint;
    const s = b.seed;
    if (s === undefined || s === null || s === -1) seed = BigInt(Math.floor(Math.random() * 2 ** 53));
    else if (typeof s === "number" && Number.isSafeInteger(s) && s >= 0) seed = BigInt(s);
    else if (typeof s === "string" && /^\d{1,20}$/.test(s) && BigInt(s) < 2n ** 64n) seed = BigInt(s);
    else
      throw badRequest(
        "'seed' must be an integer from 0 to 2^64 − 1 (a string above 2^53), or -1 for a random one",
        "seed",
      );
    return {
      prompt: b.prompt,
      negative: (negative as string | null | undefined) ?? undefined,
      width,
      height,
      steps,
      cfg,
      seed,
      responseFormat: rf,
      preview: b.preview !== false,
    };
  }

  /** Queue a job. @throws ApiError 503 when the queue is full */
  submit(params: ImageParams): Job {
    if (this.#queue.length >= this.#queueLimit) {
      this.counts.rejected++;
      throw new ApiError(
        503,
        "unavailable_error",
        `the image queue is full (${this.#queue.length} jobs; --queue-limit); retry later`,
        null,
        "server_busy",
      );
    }
    let resolve = () => {};
    const done = new Promise<void>((r) => {
      resolve = r;
    });
    const job: Job = {
      id: `imgjob-${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`,
      params,
      state: "queued",
      created: Date.now(),
      step: 0,
      steps: params.steps,
      elapsedMs: 0,
      cancel: false,
      listeners: new Set(),
      done,
      resolve,
    };
    this.#jobs.set(job.id, job);
    this.#queue.push(job);
    this.#forgetOld();
    queueMicrotask(() => this.#pump());
    return job;
  }

  /** Cancel a job: a queued one ends now, a running one at its next step. */
  cancel(job: Job): void {
    if (job.state === "queued") {
      this.#queue.splice(this.#queue.indexOf(job), 1);
      this.#finish(job, "cancelled");
    } else if (job.state === "running") job.cancel = true;
  }

  /** The job's state as GET /v1/jobs/{id} answers it. */
  status(job: Job, origin: string): Record<string, unknown> {
    const position = job.state === "queued" ? this.#queue.indexOf(job) + 1 : 0;
    const perStep = this.#stepMs > 0 ? this.#stepMs : undefined;
    let eta: number | null = null;
    if (perStep !== undefined) {
      if (job.state === "running") eta = Math.max(0, (job.steps - job.step) * perStep);
      else if (job.state === "queued") {
        const ahead = this.#queue.slice(0, position - 1).reduce((a, j) => a + j.steps, 0);
        const running = this.#running === null ? 0 : this.#running.steps - this.#running.step;
        eta = (ahead + running + job.steps) * perStep;
      }
    }
    return {
      id: job.id,
      object: "image.job",
      model: this.name,
      state: job.state,
      queue_position: position,
      step: job.step,
      steps: job.steps,
      progress: job.steps > 0 ? job.step / job.steps : 0,
      eta_ms: eta,
      elapsed_ms: job.elapsedMs,
      created: Math.floor(job.created / 1000),
      params: this.#paramsJson(job.params),
      ...(job.error ? { error: job.error } : {}),
      ...(job.state === "succeeded"
        ? {
            result: {
              url: `${origin}/v1/images/files/${job.id}.png`,
              width: job.width,
              height: job.height,
              parameters: job.parameters,
            },
          }
        : {}),
    };
  }

  #paramsJson(p: ImageParams): Record<string, unknown> {
    return {
      prompt: p.prompt,
      negative_prompt: p.negative ?? null,
      width: p.width,
      height: p.height,
      steps: p.steps,
      cfg_scale: p.cfg,
      seed: String(p.seed),
    };
  }

  #emit(job: Job, e: JobEvent): void {
    for (const l of job.listeners) l(e);
  }

  /** The job's latest preview as a PNG data URL (encoding a pending latent once), or undefined. */
  #preview(job: Job): string | undefined {
    const proj = LATENT_RGB[this.pipeline.id];
    if (job.denoised !== undefined && proj !== undefined) {
      const pv = latentToRgb(job.denoised, proj);
      job.preview = `data:image/png;base64,${Buffer.from(encodePng(pv.rgb, pv.width, pv.height)).toString("base64")}`;
    }
    job.denoised = undefined;
    return job.preview;
  }

  #finish(job: Job, state: JobState, error?: { message: string; code: string | null }): void {
    this.#preview(job); // the last latent becomes a small PNG; the latent itself is not kept
    job.state = state;
    job.finishedAt = Date.now();
    if (error) job.error = error;
    if (state === "succeeded") this.counts.succeeded++;
    else if (state === "failed") this.counts.failed++;
    else if (state === "cancelled") this.counts.cancelled++;
    this.#emit(job, { type: state as "succeeded" | "failed" | "cancelled", ...(error ? { error } : {}) });
    job.resolve();
  }

  #forgetOld(): void {
    if (this.#jobs.size <= KEEP_JOBS) return;
    for (const [id, j] of this.#jobs) {
      if (this.#jobs.size <= KEEP_JOBS) break;
      if (j.state !== "queued" && j.state !== "running") this.#jobs.delete(id);
    }
  }

  async #pump(): Promise<void> {
    if (this.#running !== null) return;
    const job = this.#queue.shift();
    if (job === undefined) return;
    this.#running = job;
    job.state = "running";
    job.startedAt = Date.now();
    this.#emit(job, { type: "started" });
    const proj = LATENT_RGB[this.pipeline.id];
    try {
      const p = job.params;
      const request: ImageRequest = {
        prompt: p.prompt,
        ...(p.negative === undefined ? {} : { negative: p.negative }),
        width: p.width,
        height: p.height,
        steps: p.steps,
        cfg: p.cfg,
        seed: p.seed,
        preview: p.preview && proj !== undefined,
      };
      const image = await this.#loaded.generate(request, async (e: GenerateEvent) => {
        if (job.cancel) throw new Cancelled();
        if (e.kind !== "step") return;
        job.step = e.step;
        job.steps = e.steps;
        job.elapsedMs = e.elapsedMs;
        this.#stepMs = e.stepMs;
        this.counts.steps++;
        this.counts.stepSeconds += e.stepMs / 1000;
        const event: JobEvent = {
          type: "step",
          step: e.step,
          steps: e.steps,
          step_ms: e.stepMs,
          eta_ms: (e.steps - e.step) * e.stepMs,
        };
        if (e.denoised !== undefined && proj !== undefined) {
          job.denoised = e.denoised; // encoded now for listeners, else only when someone asks
          if (job.listeners.size > 0) event.preview = this.#preview(job);
        }
        this.#emit(job, event);
        // a turn of the event loop between steps: other requests (a DELETE, the LLM) get to run
        await new Promise((resolve) => setImmediate(resolve));
        if (job.cancel) throw new Cancelled();
      });
      if (job.cancel) throw new Cancelled();
      const png = encodePng(image.rgb, image.width, image.height, { text: image.text });
      const file = join(this.outputDir, `${job.id}.png`);
      writeFileSync(file, png);
      Object.assign(job, {
        png,
        file,
        width: image.width,
        height: image.height,
        parameters: image.text.parameters,
      });
      this.#finish(job, "succeeded");
    } catch (e) {
      if (e instanceof Cancelled) this.#finish(job, "cancelled");
      else {
        const err = apiError(e);
        this.#finish(job, "failed", { message: err.message, code: err.code });
      }
    } finally {
      this.#running = null;
      queueMicrotask(() => this.#pump());
    }
  }

  /** The image routes; undefined when the path is not one of them. */
  async route(req: Request, url: URL, limit: number): Promise<[string, Response] | undefined> {
    const path = url.pathname;
    const origin = url.origin;
    const body = () => jsonBody(req, limit);
    if (path === "/v1/images/generations" && req.method === "POST") {
      const params = this.params(await body());
      const job = this.submit(params);
      const cancel = () => this.cancel(job);
      req.signal.addEventListener("abort", cancel, { once: true });
      await job.done;
      req.signal.removeEventListener("abort", cancel);
      if (job.state === "cancelled") return [path, new Response(null, { status: 499 })];
      // E_ARG (a prompt longer than the text encoder takes, found while encoding): the request's fault
      if (job.state === "failed" && job.error?.code === "E_ARG")
        throw badRequest(job.error.message, null, "E_ARG");
      if (job.state === "failed")
        throw new ApiError(
          500,
          "server_error",
          job.error?.message ?? "the image failed",
          null,
          job.error?.code ?? null,
        );
      const png = job.png as Uint8Array;
      const item =
        params.responseFormat === "url"
          ? { url: `${origin}/v1/images/files/${job.id}.png` }
          : { b64_json: Buffer.from(png).toString("base64") };
      return [
        path,
        Response.json({
          created: Math.floor((job.finishedAt ?? Date.now()) / 1000),
          data: [{ ...item, revised_prompt: params.prompt }],
          usage: { steps: job.steps, seed: String(params.seed), width: job.width, height: job.height },
        }),
      ];
    }
    if (path === "/v1/jobs" && req.method === "POST") {
      const job = this.submit(this.params(await body()));
      return ["/v1/jobs", Response.json(this.status(job, origin), { status: 202 })];
    }
    if (path === "/v1/jobs" && req.method === "GET") {
      const data = [...this.#jobs.values()].map((j) => this.status(j, origin));
      return ["/v1/jobs", Response.json({ object: "list", data })];
    }
    const m = /^\/v1\/jobs\/([\w-]+)(\/events)?$/.exec(path);
    if (m !== null) {
      const job = this.#jobs.get(m[1] as string);
      if (job === undefined)
        throw new ApiError(
          404,
          "not_found_error",
          `no job '${m[1]}' (it never existed, or it finished long ago)`,
          "id",
          "job_not_found",
        );
      if (m[2] !== undefined && req.method === "GET") return [path, this.#events(job, origin, req.signal)];
      if (m[2] === undefined && req.method === "GET") return [path, Response.json(this.status(job, origin))];
      if (m[2] === undefined && req.method === "DELETE") {
        this.cancel(job);
        return [path, Response.json(this.status(job, origin))];
      }
    }
    const f = /^\/v1\/images\/files\/(imgjob-[0-9a-f]{24})\.png$/.exec(path);
    if (f !== null && req.method === "GET") {
      const job = this.#jobs.get(f[1] as string);
      let bytes: Uint8Array | undefined = job?.png;
      if (bytes === undefined) {
        try {
          bytes = readFileSync(join(this.outputDir, `${f[1]}.png`));
        } catch {
          throw new ApiError(404, "not_found_error", `no image ${basename(path)}`);
        }
      }
      return [path, new Response(bytes, { headers: { "content-type": "image/png" } })];
    }
    return undefined;
  }

  /** SSE: the job's state now, then every event until it ends. */
  #events(job: Job, origin: string, signal: AbortSignal): Response {
    const enc = new TextEncoder();
    let listener: ((e: JobEvent) => void) | undefined;
    const stream = new ReadableStream<Uint8Array>({
      start: (controller) => {
        let open = true;
        const send = (data: unknown) => {
          if (open) controller.enqueue(enc.encode(`data: ${JSON.stringify(data)}\n\n`));
        };
        const close = () => {
          if (!open) return;
          open = false;
          if (listener) job.listeners.delete(listener);
          controller.close();
        };
        // the status first, with the latest preview for a client that joins after steps have run
        const preview = this.#preview(job);
        send({ type: "status", ...this.status(job, origin), ...(preview === undefined ? {} : { preview }) });
        if (job.state !== "queued" && job.state !== "running") return close();
        listener = (e) => {
          send(
            e.type === "succeeded" || e.type === "failed" || e.type === "cancelled"
              ? { ...e, ...this.status(job, origin) }
              : e,
          );
          if (e.type === "succeeded" || e.type === "failed" || e.type === "cancelled") close();
        };
        job.listeners.add(listener);
        signal.addEventListener("abort", close, { once: true });
      },
      cancel: () => {
        if (listener) job.listeners.delete(listener);
      },
    });
    return new Response(stream, {
      headers: { "content-type": "text/event-stream", "cache-control": "no-cache" },
    });
  }

  /** /metrics lines. */
  metrics(
    metric: (name: string, type: "counter" | "gauge", help: string, values: [string, number][]) => void,
  ): void {
    const c = this.counts;
    metric("tp_image_jobs_total", "counter", "Image jobs ended, by state.", [
      ['{state="succeeded"}', c.succeeded],
      ['{state="failed"}', c.failed],
      ['{state="cancelled"}', c.cancelled],
    ]);
    metric("tp_image_jobs_rejected_total", "counter", "Image jobs answered 503 (queue full).", [
      ["", c.rejected],
    ]);
    metric("tp_image_queue_depth", "gauge", "Image jobs waiting.", [["", this.#queue.length]]);
    metric("tp_image_running", "gauge", "Image jobs running (0 or 1).", [
      ["", this.#running === null ? 0 : 1],
    ]);
    metric("tp_image_steps_total", "counter", "Sampling steps run.", [["", c.steps]]);
    metric("tp_image_step_seconds_total", "counter", "Seconds spent in sampling steps.", [
      ["", c.stepSeconds],
    ]);
  }

  /** Free the networks. */
  dispose(): void {
    this.#loaded.dispose();
  }
}

/**
 * Load the image model: the pipeline found by the DiT file's tensors, its networks resident.
 * @throws TpError E_ARG without a text encoder; the registry's and the loaders' errors (naming the file)
 */
export function loadImageService(dit: string, backend: Backend, options: ImageServiceOptions): ImageService {
  if (options.textEncoder === undefined)
    throw new TpError("E_ARG", "--image-model needs --text-encoder FILE (requests bring prompts to encode)", {
      file: dit,
    });
  const pipeline = pipelineForCheckpoint(dit);
  const loaded = pipeline.load({
    files: { dit, vae: options.vae, textEncoder: options.textEncoder },
    backend,
  });
  let outputDir = options.outputDir;
  if (outputDir === undefined) outputDir = mkdtempSync(join(tmpdir(), "tp-server-images-"));
  else mkdirSync(outputDir, { recursive: true });
  return new ImageService(loaded, {
    name: options.name ?? basename(dit).replace(/\.safetensors$/i, ""),
    outputDir,
    queueLimit: options.queueLimit ?? 64,
  });
}
