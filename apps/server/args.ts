/**
 * Command-line flags of `bun apps/server` (and `bun apps/llm serve`), parsed with the CLIs' one
 * parser (`parseFlags`, unknown flags get a "did you mean"); every bad value is a TpError E_ARG naming
 * the flag, the value and the valid range. Names follow llama-server's (`--host`, `--port`,
 * `--api-key`, `--parallel`/`-np`, `--ctx`, `-n`, `--alias`, `--reasoning-format`).
 */
import { parseFlags, TpError } from "@tp/tensor";

/** Usage text (printed by --help). */
export const USAGE = `usage: bun apps/server --model FILE [options]      (or: bun apps/llm serve …)

  --model, -m FILE        language model: a GGUF file or a safetensors checkpoint
  --image-model FILE      image model: the diffusion model (DiT) file (@tp/diffusion's registry:
                          Krea 2); with --vae and --text-encoder
  --vae FILE              the image model's VAE
  --text-encoder FILE     the image model's text encoder
  --alias NAME            the model's name in the API (default: the file name)
  --host ADDR             address to bind (default 127.0.0.1: this machine only)
  --port N                port (default 8080; 0 = any free port)
  --api-key KEY           require 'Authorization: Bearer KEY' on every route but /health
                          (default: $TP_API_KEY when set)
  --parallel, -np N       slots: requests generated concurrently (default 1)
  --queue-limit N         requests that may wait for a slot; more get 503 (default 64)
  --no-batch              run each slot's decode step alone (default: one batched forward
                          for the slots decoding at once: continuous batching)
  --ctx N                 context tokens per slot (default: min(the model's, 4096))
  -n, --n-predict N       max_tokens when a request gives none (default 512)
  --max-body BYTES        largest request body (default 1048576)
  --reasoning-format F    deepseek: <think> blocks go to reasoning_content (default); none
  --output-dir DIR        where generated images are stored (default: a temporary folder)
  --threads N             CPU threads (default: all cores)
  --backend NAME          cpu | vulkan | ptx | cuda (default cpu)
  --queue URL             NATS JetStream (nats://host:4222): without --worker this server is an API
                          front whose image jobs are run by workers (no model needed)
  --worker                with --queue: load --image-model / --model, run the queue's image jobs
                          and the LLM requests the fronts send it
  --ack-wait SECONDS      a job whose worker stops reporting is redelivered after this (default 30)
  -h, --help              this text`;

/** Parsed, checked flags. */
export interface ServerArgs {
  model: string | undefined;
  imageModel: string | undefined;
  vae: string | undefined;
  textEncoder: string | undefined;
  alias: string | undefined;
  host: string;
  port: number;
  apiKey: string | undefined;
  parallel: number;
  queueLimit: number;
  batch: boolean;
  ctx: number | undefined;
  nPredict: number;
  maxBody: number;
  reasoningFormat: "deepseek" | "none";
  outputDir: string | undefined;
  threads: number | undefined;
  backend: string;
  /** NATS server URL (--queue). */
  queue: string | undefined;
  worker: boolean;
  /** JetStream ack wait of image jobs (--ack-wait), ms. */
  ackWaitMs: number;
  help: boolean;
}

function int(flag: string, v: string | undefined, lo: number, hi: number): number | undefined {
  if (v === undefined) return undefined;
  const t = v.trim();
  const x = /^\+?\d+$/.test(t) ? Number(t) : Number.NaN;
  if (!Number.isSafeInteger(x) || x < lo || x > hi)
    throw new TpError("E_ARG", `${flag} must be an integer from ${lo} to ${hi}, got '${v}'`);
  return x;
}

const LLAMA_SHORT_FLAGS: Readonly<Record<string, string>> = {
  "-np": "--parallel",
  "-ngl": "--gpu-layers",
  "-ncmoe": "--n-cpu-moe",
  "-md": "--model-draft",
};

/** `-np` / `-np=N` → `--parallel` / `--parallel=N`, and so on for {@link LLAMA_SHORT_FLAGS}; other arguments unchanged. */
function llamaShortFlag(a: string): string {
  const eq = a.indexOf("=");
  const long = LLAMA_SHORT_FLAGS[eq < 0 ? a : a.slice(0, eq)];
  return long === undefined ? a : eq < 0 ? long : `${long}${a.slice(eq)}`;
}

/**
 * Parse `argv` (without the command).
 * @throws TpError E_ARG for an unknown flag, a bad value, or neither --model nor --image-model
 */
export function parseServerArgs(
  argv: string[],
  env: Record<string, string | undefined> = process.env,
): ServerArgs {
  const { values } = parseFlags(
    { command: "bun apps/server", help: "bun apps/server --help" },
    {
      // llama-server spells --parallel as -np, which node's parseArgs would read as -n p; its other
      // multi-letter short flags (-ngl, -ncmoe, -md) are mapped to their long names, which this server
      // does not take (an unknown-flag E_ARG, not '-n must be an integer, got gl' or -m 'd')
      args: argv.map(llamaShortFlag),
      options: {
        model: { type: "string", short: "m" },
        "image-model": { type: "string" },
        vae: { type: "string" },
        "text-encoder": { type: "string" },
        alias: { type: "string" },
        host: { type: "string" },
        port: { type: "string" },
        "api-key": { type: "string" },
        parallel: { type: "string" },
        "queue-limit": { type: "string" },
        "no-batch": { type: "boolean", default: false },
        ctx: { type: "string" },
        "n-predict": { type: "string", short: "n" },
        "max-body": { type: "string" },
        "reasoning-format": { type: "string" },
        "output-dir": { type: "string" },
        threads: { type: "string" },
        backend: { type: "string" },
        queue: { type: "string" },
        worker: { type: "boolean", default: false },
        "ack-wait": { type: "string" },
        help: { type: "boolean", short: "h", default: false },
      },
      strict: true,
      allowPositionals: false,
    },
  );
  const s = (k: string) => (values as Record<string, string | boolean | undefined>)[k] as string | undefined;
  const help = values.help === true;
  const queue = s("queue");
  const worker = values.worker === true;
  if (queue !== undefined && !/^(nats|tls|wss?):\/\/[^\s/]+/.test(queue))
    throw new TpError("E_ARG", `--queue must be a NATS URL (nats://host:4222), got '${queue}'`);
  if (worker && queue === undefined) throw new TpError("E_ARG", "--worker needs --queue nats://host:port");
  if (worker && s("image-model") === undefined && s("model") === undefined)
    throw new TpError(
      "E_ARG",
      "--worker needs --image-model FILE (with --vae, --text-encoder) or --model FILE",
    );
  if (queue !== undefined && !worker && (s("model") !== undefined || s("image-model") !== undefined))
    throw new TpError(
      "E_ARG",
      "a --queue front loads no model: give --model / --image-model to the --worker",
    );
  if (!help && queue === undefined && s("model") === undefined && s("image-model") === undefined)
    throw new TpError("E_ARG", "--model FILE (or --image-model PATH) is required; see --help");
  if (s("image-model") !== undefined && (s("vae") === undefined || s("text-encoder") === undefined))
    throw new TpError("E_ARG", "--image-model needs --vae FILE and --text-encoder FILE");
  const rf = s("reasoning-format") ?? "deepseek";
  if (rf !== "deepseek" && rf !== "none")
    throw new TpError("E_ARG", `--reasoning-format must be deepseek or none, got '${rf}'`);
  const key = s("api-key") ?? env.TP_API_KEY;
  if (key !== undefined && key.trim() === "") throw new TpError("E_ARG", "--api-key must not be empty");
  const host = s("host") ?? "127.0.0.1";
  if (host.trim() === "") throw new TpError("E_ARG", "--host must not be empty");
  return {
    model: s("model"),
    imageModel: s("image-model"),
    vae: s("vae"),
    textEncoder: s("text-encoder"),
    alias: s("alias"),
    host,
    port: int("--port", s("port"), 0, 65535) ?? 8080,
    apiKey: key,
    parallel: int("--parallel", s("parallel"), 1, 256) ?? 1,
    queueLimit: int("--queue-limit", s("queue-limit"), 0, 1 << 20) ?? 64,
    batch: values["no-batch"] !== true,
    ctx: int("--ctx", s("ctx"), 2, 1 << 24),
    nPredict: int("-n", s("n-predict"), 1, 1 << 24) ?? 512,
    maxBody: int("--max-body", s("max-body"), 1024, 1 << 30) ?? 1 << 20,
    reasoningFormat: rf,
    outputDir: s("output-dir"),
    threads: int("--threads", s("threads"), 0, 256),
    backend: s("backend") ?? "cpu",
    queue,
    worker,
    ackWaitMs: (int("--ack-wait", s("ack-wait"), 1, 3600) ?? 30) * 1000,
    help,
  };
}
