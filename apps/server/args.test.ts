// The flags (each bad value is one E_ARG naming the flag) and the program as a user starts it: it
// binds 127.0.0.1 by default, prints where, serves /health and exits 0 on SIGTERM; `bun apps/llm serve`
// is the same program.
import { describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { TpError } from "@tp/tensor";
import { parseServerArgs } from "./args.ts";

const QWEN = resolve(import.meta.dir, "../../../shared/models/synthetic/qwen3-tiny-Q8_0.gguf");

function argError(argv: string[]): string {
  try {
    parseServerArgs(argv, {});
  } catch (e) {
    expect(e).toBeInstanceOf(TpError);
    return `${(e as TpError).code}: ${(e as Error).message}`;
  }
  throw new Error("expected an error");
}

describe("parseServerArgs", () => {
  test("--queue / --worker / --ack-wait: a front needs no model, a worker an image model", () => {
    const f = parseServerArgs(["--queue", "nats://10.0.0.5:4222"], {});
    expect([f.queue, f.worker, f.ackWaitMs, f.model]).toEqual([
      "nats://10.0.0.5:4222",
      false,
      30_000,
      undefined,
    ]);
    const w = parseServerArgs(
      [
        "--worker",
        "--queue",
        "nats://h:4222",
        "--ack-wait",
        "5",
        "--image-model",
        "d",
        "--vae",
        "v",
        "--text-encoder",
        "t",
      ],
      {},
    );
    expect([w.worker, w.ackWaitMs, w.imageModel]).toEqual([true, 5000, "d"]);
    expect(argError(["--queue", "h:4222"])).toBe(
      "E_ARG: --queue must be a NATS URL (nats://host:4222), got 'h:4222'",
    );
    expect(argError(["--worker", "-m", "x"])).toBe("E_ARG: --worker needs --queue nats://host:port");
    expect(argError(["--worker", "--queue", "nats://h:1"])).toContain("--worker needs --image-model FILE");
    expect(argError(["--queue", "nats://h:1", "-m", "x"])).toContain("a --queue front loads no model");
    expect(argError(["--queue", "nats://h:1", "--ack-wait", "0"])).toBe(
      "E_ARG: --ack-wait must be an integer from 1 to 3600, got '0'",
    );
  });

  test("defaults: loopback, port 8080, one slot, no key", () => {
    const a = parseServerArgs(["-m", "x.gguf"], {});
    expect([a.host, a.port, a.parallel, a.queueLimit, a.apiKey, a.reasoningFormat]).toEqual([
      "127.0.0.1",
      8080,
      1,
      64,
      undefined,
      "deepseek",
    ]);
  });

  test("llama-server spellings: -np, --api-key (or $TP_API_KEY), --host", () => {
    const a = parseServerArgs(["-m", "x.gguf", "-np", "4", "--host", "0.0.0.0"], { TP_API_KEY: "k1" });
    expect([a.parallel, a.host, a.apiKey]).toEqual([4, "0.0.0.0", "k1"]);
    expect(a.batch).toBe(true);
    expect(parseServerArgs(["-m", "x", "--no-batch"], {}).batch).toBe(false);
    expect(parseServerArgs(["-m", "x", "--api-key", "k2"], { TP_API_KEY: "k1" }).apiKey).toBe("k2");
  });

  test("bad values name the flag and the range", () => {
    expect(argError([])).toBe("E_ARG: --model FILE (or --image-model PATH) is required; see --help");
    expect(argError(["-m", "x", "-np", "0"])).toBe(
      "E_ARG: --parallel must be an integer from 1 to 256, got '0'",
    );
    expect(argError(["-m", "x", "--port", "70000"])).toBe(
      "E_ARG: --port must be an integer from 0 to 65535, got '70000'",
    );
    expect(argError(["-m", "x", "--reasoning-format", "r1"])).toBe(
      "E_ARG: --reasoning-format must be deepseek or none, got 'r1'",
    );
    expect(argError(["-m", "x", "--api-key", " "])).toBe("E_ARG: --api-key must not be empty");
    expect(argError(["-m", "x", "--paralel", "2"])).toContain("did you mean --parallel?");
    // llama.cpp's other multi-letter short flags: an unknown flag by its long name (not "-n … got 'gl'",
    // nor -md read as -m d)
    expect(argError(["-m", "x", "-ngl", "99"])).toStartWith(
      "E_ARG: unknown flag --gpu-layers for bun apps/server",
    );
    expect(argError(["-m", "x", "-ngl=all"])).toStartWith(
      "E_ARG: unknown flag --gpu-layers for bun apps/server",
    );
    expect(argError(["-m", "x", "-md", "d.gguf"])).toStartWith("E_ARG: unknown flag --model-draft");
    expect(argError(["-m", "x", "-ncmoe", "2"])).toStartWith("E_ARG: unknown flag --n-cpu-moe");
    expect(argError(["--image-model", "dit.safetensors", "--vae", "v"])).toBe(
      "E_ARG: --image-model needs --vae FILE and --text-encoder FILE",
    );
  });
});

describe.skipIf(!existsSync(QWEN))("the program", () => {
  for (const [name, cmd] of [
    ["bun apps/server", [resolve(import.meta.dir, "index.ts")]],
    ["bun apps/llm serve", [join(import.meta.dir, "../llm/index.ts"), "serve"]],
  ] as const)
    test(`${name}: listens on 127.0.0.1, answers /health, exits 0 on SIGTERM`, async () => {
      const p = Bun.spawn(["bun", ...cmd, "-m", QWEN, "--port", "0", "--threads", "1"], {
        stderr: "pipe",
        stdout: "pipe",
      });
      const reader = p.stderr.getReader();
      let err = "";
      while (!err.includes("\n")) {
        const { value, done } = await reader.read();
        if (done) break;
        err += new TextDecoder().decode(value);
      }
      const url = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(err)?.[1];
      expect(url).toBeDefined();
      const health = await fetch(`${url}/health`);
      expect(await health.json()).toEqual({ status: "ok" });
      p.kill("SIGTERM");
      expect(await p.exited).toBe(0);
    }, 60_000);
});
