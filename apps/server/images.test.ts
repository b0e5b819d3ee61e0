// The image routes on random-weight Krea 2 checkpoints written by @tp/diffusion/testing (no shared
// files needed): the served image equals the registry pipeline's own one-shot generate for the same
// settings (pixels and PNG text), jobs report state / queue position / step / ETA and stream a latent
// preview per step, DELETE cancels queued and running jobs, and bad requests are 4xx. The preview's
// projection is checked on hand-made latents against the factor table.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createBackend } from "@tp/backend-cpu";
import { decodePng, KREA2_PIPELINE } from "@tp/diffusion";
import {
  TINY_KREA2_CONFIG,
  TINY_KREA2_TEXT_CONFIG,
  writeRandomKrea2Dit,
  writeRandomQwen3VlText,
  writeRandomWanVae,
} from "@tp/diffusion/testing";
import OpenAI from "openai";
import { type ImageService, loadImageService } from "./images.ts";
import { latentToRgb, WAN21_LATENT_RGB } from "./preview.ts";
import { type RunningServer, startServer } from "./server.ts";

const tmp = mkdtempSync(join(tmpdir(), "tp-server-images-test-"));
const dit = join(tmp, "krea2-random.safetensors");
const vae = join(tmp, "vae.safetensors");
const te = join(tmp, "te.safetensors");
const backend = createBackend({ threads: 1 });
const T = 120_000;
let images: ImageService;
let server: RunningServer;
let client: OpenAI;

beforeAll(() => {
  writeRandomKrea2Dit(dit, TINY_KREA2_CONFIG, { seed: 1 });
  writeRandomWanVae(vae, undefined, { seed: 2 });
  writeRandomQwen3VlText(te, TINY_KREA2_TEXT_CONFIG, { seed: 3 });
  images = loadImageService(dit, backend, {
    vae,
    textEncoder: te,
    outputDir: join(tmp, "out"),
    queueLimit: 3,
  });
  server = startServer({ images, port: 0 });
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "none", maxRetries: 0 });
}, T);

afterAll(async () => {
  await server.stop();
  images.dispose();
  backend.dispose();
  rmSync(tmp, { recursive: true, force: true });
});

const settings = { prompt: "a lighthouse at dusk", size: "64x48", steps: 2, seed: 11, cfg_scale: 1 };

async function post(path: string, body: unknown): Promise<Response> {
  return await fetch(`${server.url}${path}`, { method: "POST", body: JSON.stringify(body) });
}

/** The SSE `data:` objects of a response, until it ends. */
async function events(res: Response): Promise<Record<string, unknown>[]> {
  const text = await res.text();
  return text
    .split("\n\n")
    .filter((b) => b.startsWith("data: "))
    .map((b) => JSON.parse(b.slice(6)) as Record<string, unknown>);
}

async function waitFor(
  id: string,
  ok: (s: Record<string, unknown>) => boolean,
): Promise<Record<string, unknown>> {
  for (let i = 0; i < 2000; i++) {
    const s = (await (await fetch(`${server.url}/v1/jobs/${id}`)).json()) as Record<string, unknown>;
    if (ok(s)) return s;
    await Bun.sleep(5);
  }
  throw new Error(`job ${id} never reached the state`);
}

describe("latent preview", () => {
  test("each channel's unit latent gives (factor row + bias + 1) / 2 in 8 bits; frame 0 of a 5-D latent", () => {
    const C = 16;
    const h = 2;
    const w = 3;
    const data = new Float32Array(C * 2 * h * w); // two frames; frame 1 is all 9 (must be ignored)
    data.fill(9);
    for (let c = 0; c < C; c++)
      for (let p = 0; p < h * w; p++) data[c * 2 * h * w + p] = p === c % (h * w) ? 1 : 0;
    const out = latentToRgb({ data, shape: [1, C, 2, h, w] }, WAN21_LATENT_RGB);
    expect([out.width, out.height]).toEqual([w, h]);
    for (let p = 0; p < h * w; p++)
      for (let k = 0; k < 3; k++) {
        let v = WAN21_LATENT_RGB.bias[k] as number;
        for (let c = 0; c < C; c++)
          if (c % (h * w) === p) v += (WAN21_LATENT_RGB.factors[c] as readonly number[])[k] as number;
        expect(out.rgb[p * 3 + k]).toBe(Math.floor(Math.min(1, Math.max(0, (v + 1) / 2)) * 255));
      }
    expect(() => latentToRgb({ data: new Float32Array(8), shape: [1, 8, 1, 1] }, WAN21_LATENT_RGB)).toThrow(
      "a latent preview needs",
    );
  });
});

describe("/v1/images/generations", () => {
  test(
    "b64_json: the PNG equals the pipeline's one-shot generate (pixels and parameters chunk); url serves the same file",
    async () => {
      const r = await client.images.generate({ ...settings, response_format: "b64_json" } as never);
      const png = decodePng(Buffer.from(r.data?.[0]?.b64_json as string, "base64"));
      const ref = await KREA2_PIPELINE.generate({
        files: { dit, vae, textEncoder: te },
        backend,
        prompt: settings.prompt,
        width: 64,
        height: 48,
        steps: 2,
        seed: 11n,
        cfg: 1,
      });
      expect([png.width, png.height]).toEqual([64, 48]);
      expect(png.rgb).toEqual(ref.rgb);
      expect(png.text.parameters).toBe(ref.text.parameters);
      expect(JSON.parse(png.text.tensorpencil as string).seed).toBe("11");
      const u = await client.images.generate({ ...settings, response_format: "url" } as never);
      const url = u.data?.[0]?.url as string;
      expect(url).toMatch(/\/v1\/images\/files\/imgjob-[0-9a-f]{24}\.png$/);
      const served = decodePng(new Uint8Array(await (await fetch(url)).arrayBuffer()));
      expect(served.rgb).toEqual(ref.rgb);
    },
    T,
  );

  test("bad requests: 400 naming the field; an unknown model is 404", async () => {
    const cases: [unknown, number, string | null][] = [
      [{ ...settings, prompt: "" }, 400, "prompt"],
      [{ ...settings, size: "big" }, 400, "size"],
      [{ ...settings, size: "8x8" }, 400, "size"],
      [{ ...settings, n: 2 }, 400, "n"],
      [{ ...settings, steps: 0 }, 400, "steps"],
      [{ ...settings, seed: "x" }, 400, "seed"],
      [{ ...settings, response_format: "jpeg" }, 400, "response_format"],
      [{ ...settings, model: "dall-e-3" }, 404, "model"],
      // hostile values
      [{ ...settings, size: "0x0" }, 400, "size"],
      [{ ...settings, size: "1000000x1000000" }, 400, "size"],
      [{ ...settings, size: undefined, width: -5 }, 400, "width"],
      [{ ...settings, steps: 1e9 }, 400, "steps"],
      [{ ...settings, steps: 1.5 }, 400, "steps"],
      [{ ...settings, seed: -2 }, 400, "seed"],
      [{ ...settings, seed: "18446744073709551616" }, 400, "seed"],
      [{ ...settings, cfg_scale: "nan" }, 400, "cfg_scale"],
      [{ ...settings, negative_prompt: 3 }, 400, "negative_prompt"],
      // longer than the text encoder takes: found while encoding, still the request's fault (was a 500)
      [{ ...settings, prompt: "word ".repeat(5000) }, 400, null],
    ];
    for (const [body, status, param] of cases) {
      const r = await post("/v1/images/generations", body);
      expect(r.status).toBe(status);
      expect(((await r.json()) as { error: { param: string | null } }).error.param).toBe(param);
    }
    expect((await fetch(`${server.url}/v1/jobs/imgjob-nope`)).status).toBe(404);
    expect((await fetch(`${server.url}/v1/jobs/imgjob-nope`, { method: "DELETE" })).status).toBe(404);
    for (const p of ["..%2f..%2fetc%2fpasswd.png", "%2e%2e/x.png", "imgjob-000000000000000000000000.png"])
      expect((await fetch(`${server.url}/v1/images/files/${p}`)).status).toBe(404);
    expect((await fetch(`${server.url}/v1/chat/completions`, { method: "POST", body: "{}" })).status).toBe(
      404,
    );
  });
});

/** tp_image_jobs_total{state="cancelled"} of /metrics. */
async function cancelledJobs(): Promise<number> {
  const metrics = await (await fetch(`${server.url}/metrics`)).text();
  const m = /^tp_image_jobs_total\{state="cancelled"\} (\d+)$/m.exec(metrics);
  if (m === null) throw new Error("no cancelled count in /metrics");
  return Number(m[1]);
}

describe("/v1/jobs", () => {
  test(
    "a job: 202 queued, then SSE status → started → a step event with a latent preview per step → succeeded with the result",
    async () => {
      // a long job first, so that this one is still queued when its stream connects (a 3-step tiny job
      // can otherwise end before that), then the long one cancelled
      const blocker = (await (await post("/v1/jobs", { ...settings, steps: 40 })).json()) as { id: string };
      const res = await post("/v1/jobs", { ...settings, steps: 3 });
      expect(res.status).toBe(202);
      const job = (await res.json()) as { id: string; state: string; steps: number };
      expect(job.steps).toBe(3);
      const stream = await fetch(`${server.url}/v1/jobs/${job.id}/events`);
      expect((await fetch(`${server.url}/v1/jobs/${blocker.id}`, { method: "DELETE" })).status).toBe(200);
      const list = await events(stream);
      const types = list.map((e) => e.type);
      // the stream starts with the job's state when it connects (it may have run a step already)
      expect(types[0]).toBe("status");
      const done = (list[0] as { step: number }).step;
      const stepEvents = list.filter((e) => e.type === "step");
      expect(types.slice(-(stepEvents.length + 1))).toEqual([...stepEvents.map(() => "step"), "succeeded"]);
      expect(done + stepEvents.length).toBe(3);
      expect(stepEvents.length).toBeGreaterThan(0);
      for (const [k, e] of stepEvents.entries()) {
        expect(e.step).toBe(done + k + 1);
        expect(e.steps).toBe(3);
        expect(e.eta_ms as number).toBeGreaterThanOrEqual(0);
        const preview = decodePng(
          Buffer.from((e.preview as string).replace(/^data:image\/png;base64,/, ""), "base64"),
        );
        expect([preview.width, preview.height]).toEqual([8, 6]); // the latent's resolution
      }
      const last = list.at(-1) as { state: string; result: { url: string; width: number } };
      expect(last.state).toBe("succeeded");
      expect(last.result.width).toBe(64);
      const s = (await (await fetch(`${server.url}/v1/jobs/${job.id}`)).json()) as Record<string, unknown>;
      expect([s.state, s.step, s.steps, s.queue_position, s.eta_ms]).toEqual(["succeeded", 3, 3, 0, null]);
      expect((await fetch(last.result.url)).headers.get("content-type")).toBe("image/png");
      // a client that joins after the end gets the state with the last step's preview, and the end
      const late = await events(await fetch(`${server.url}/v1/jobs/${job.id}/events`));
      expect(late.map((e) => [e.type, e.state])).toEqual([["status", "succeeded"]]);
      expect(late[0]?.preview).toBe(stepEvents.at(-1)?.preview as string);
    },
    T,
  );

  test(
    "queue positions, DELETE of a queued and of a running job, and 503 past the queue limit",
    async () => {
      const cancelledBefore = await cancelledJobs();
      const submit = async (steps: number) =>
        ((await (await post("/v1/jobs", { ...settings, steps })).json()) as { id: string }).id;
      const long = await submit(40);
      const next = await submit(2);
      const dropped = await submit(2);
      const more = [await submit(2), await submit(2)];
      const s0 = await waitFor(long, (s) => s.state === "running" && (s.step as number) >= 1);
      expect(s0.eta_ms as number).toBeGreaterThan(0);
      const q = (await (await fetch(`${server.url}/v1/jobs/${dropped}`)).json()) as Record<string, unknown>;
      expect([q.state, q.queue_position]).toEqual(["queued", 2]);
      // three wait (next, dropped, more[0]); more[1] was past --queue-limit 3
      expect(more[1]).toBeUndefined();
      const busy = await post("/v1/jobs", settings);
      expect(busy.status).toBe(503);
      const del = (await (
        await fetch(`${server.url}/v1/jobs/${dropped}`, { method: "DELETE" })
      ).json()) as Record<string, unknown>;
      expect(del.state).toBe("cancelled");
      await fetch(`${server.url}/v1/jobs/${long}`, { method: "DELETE" });
      const ended = await waitFor(long, (s) => s.state !== "running");
      expect(ended.state).toBe("cancelled");
      expect(ended.step as number).toBeLessThan(40);
      expect((await waitFor(next, (s) => s.state === "succeeded" || s.state === "failed")).state).toBe(
        "succeeded",
      );
      expect((await waitFor(more[0] as string, (s) => s.state === "succeeded")).state).toBe("succeeded");
      expect(await cancelledJobs()).toBe(cancelledBefore + 2); // the server is shared by the file's tests
    },
    T,
  );
});
