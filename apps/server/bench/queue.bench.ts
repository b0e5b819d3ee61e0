/**
 * `bun run bench queue`: what the NATS JetStream queue (../queue.ts) adds, on loopback. The same
 * server is run twice as child processes: once in-process (`bun apps/server --image-model … -m …`)
 * and once as a front (`--queue`) with one worker holding the same models, on one `nats-server -js`.
 * Cases: one image job (POST /v1/images/generations, tiny random Krea 2, 64×48, 1 step) and one
 * streamed chat (qwen3-tiny Q8_0, greedy, 32 tokens) per run, through each; the derived rows are the
 * queue's overhead per job (target ≤ 50 ms, issue 29) and per streamed token (target ≤ 1 ms).
 * Needs nats-server (skipped saying so without it) and ../shared/models/synthetic/qwen3-tiny-Q8_0.gguf
 * for the chat rows.
 */
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import {
  TINY_KREA2_CONFIG,
  TINY_KREA2_TEXT_CONFIG,
  writeRandomKrea2Dit,
  writeRandomQwen3VlText,
  writeRandomWanVae,
} from "@tp/diffusion/testing";
import { TpError } from "@tp/tensor";
import { type Subprocess, spawn } from "bun";

const INDEX = resolve(import.meta.dir, "../index.ts");
const QWEN = resolve(import.meta.dir, "../../../../shared/models/synthetic/qwen3-tiny-Q8_0.gguf");
const children: Subprocess<"ignore", "ignore", "pipe">[] = [];
let tmp = "";

async function start(cmd: string[], ready: RegExp): Promise<RegExpExecArray> {
  const proc = spawn(cmd, { stdin: "ignore", stdout: "ignore", stderr: "pipe" });
  children.push(proc);
  let log = "";
  const dec = new TextDecoder();
  const reader = proc.stderr.getReader();
  const end = Date.now() + 60_000;
  for (;;) {
    const m = ready.exec(log);
    if (m !== null) {
      void (async () => {
        while (!(await reader.read()).done);
      })();
      return m;
    }
    if (Date.now() > end) throw new TpError("E_INTERNAL", `${cmd.join(" ")} did not start: ${log}`);
    const r = await reader.read();
    if (r.done) throw new TpError("E_INTERNAL", `${cmd.join(" ")} exited: ${log}`);
    log += dec.decode(r.value);
  }
}

const median = (xs: readonly number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;

export default {
  description: "an image job and a streamed chat through NATS JetStream vs in-process (loopback)",
  async cases() {
    const nats = Bun.which("nats-server");
    if (nats === null) {
      console.error("skipped: nats-server is not installed (apt-get install nats-server)");
      return [];
    }
    tmp = mkdtempSync(join(tmpdir(), "tp-queue-bench-"));
    const dit = join(tmp, "dit.safetensors");
    const vae = join(tmp, "vae.safetensors");
    const te = join(tmp, "te.safetensors");
    writeRandomKrea2Dit(dit, TINY_KREA2_CONFIG, { seed: 1 });
    writeRandomWanVae(vae, undefined, { seed: 2 });
    writeRandomQwen3VlText(te, TINY_KREA2_TEXT_CONFIG, { seed: 3 });
    const chat = existsSync(QWEN);
    if (!chat) console.error(`the chat rows are skipped: ${QWEN} is absent`);
    const models = [
      ...["--image-model", dit, "--vae", vae, "--text-encoder", te, "--threads", "1"],
      ...(chat ? ["-m", QWEN, "--ctx", "256"] : []),
    ];
    const probe = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response() });
    const port = probe.port as number;
    await probe.stop(true);
    await start(
      [nats, "-js", "-a", "127.0.0.1", "-p", String(port), "-sd", join(tmp, "js")],
      /Server is ready/,
    );
    const q = `nats://127.0.0.1:${port}`;
    const listening = /\[listening on (http:\/\/[^:]+:\d+)/;
    const local = (await start(["bun", INDEX, ...models, "--port", "0"], listening))[1] as string;
    const front = (await start(["bun", INDEX, "--queue", q, "--port", "0"], listening))[1] as string;
    await start(["bun", INDEX, "--worker", "--queue", q, ...models], /pulling from/);
    await Bun.sleep(500); // the front sees the worker's capabilities

    const image = async (base: string) => {
      const t = performance.now();
      const r = await fetch(`${base}/v1/images/generations`, {
        method: "POST",
        body: JSON.stringify({ prompt: "a lighthouse", size: "64x48", steps: 1, seed: 7, cfg_scale: 1 }),
      });
      if (r.status !== 200) throw new TpError("E_INTERNAL", `image job: HTTP ${r.status}: ${await r.text()}`);
      await r.arrayBuffer();
      return performance.now() - t;
    };
    const perToken = async (base: string) => {
      const t = performance.now();
      const r = await fetch(`${base}/v1/chat/completions`, {
        method: "POST",
        body: JSON.stringify({
          messages: [{ role: "user", content: "Count slowly." }],
          temperature: 0,
          max_tokens: 32,
          stream: true,
        }),
      });
      const text = await r.text();
      const chunks = text.split("\n\n").filter((b) => b.includes('"content":"')).length;
      if (r.status !== 200 || chunks === 0)
        throw new TpError("E_INTERNAL", `chat: HTTP ${r.status}, ${chunks} chunks`);
      return (performance.now() - t) / chunks;
    };
    const seen = new Map<string, number[]>();
    const rec = (k: string) => (v: number) => {
      seen.set(k, [...(seen.get(k) ?? []), v]);
      return v;
    };
    const diff = (a: string, b: string) =>
      median(seen.get(a) ?? [Number.NaN]) - median(seen.get(b) ?? [Number.NaN]);
    const peerName = "in-process (no --queue)";
    const cases: object[] = [
      {
        case: "tiny Krea 2 64x48, 1 step",
        metric: "image job time",
        unit: "ms",
        better: "lower",
        runs: 9,
        ours: async () => rec("iq")(await image(front)),
        peer: { name: peerName, run: async () => rec("il")(await image(local)) },
      },
      {
        case: "tiny Krea 2 64x48, 1 step",
        metric: "queue overhead per job (target ≤ 50)",
        unit: "ms",
        better: "lower",
        timed: false,
        ours: () => diff("iq", "il"),
      },
    ];
    if (chat)
      cases.push(
        {
          case: "qwen3-tiny Q8_0 streamed chat, 32 tokens",
          metric: "time per streamed token",
          unit: "ms",
          better: "lower",
          runs: 9,
          ours: async () => rec("cq")(await perToken(front)),
          peer: { name: peerName, run: async () => rec("cl")(await perToken(local)) },
        },
        {
          case: "qwen3-tiny Q8_0 streamed chat, 32 tokens",
          metric: "queue overhead per token (target ≤ 1)",
          unit: "ms",
          better: "lower",
          timed: false,
          ours: () => diff("cq", "cl"),
        },
      );
    return cases as never;
  },
  async teardown() {
    for (const c of children) c.kill("SIGKILL");
    await Promise.all(children.map((c) => c.exited));
    if (tmp !== "") rmSync(tmp, { recursive: true, force: true });
  },
};
