// llama.cpp loads what our GGUF writer writes: the prebuilt CPU llama.cpp of node-llama-cpp 3.21.1
// (a pinned devDependency; no download or build at run time) loads (1) a model re-assembled by our
// writer from decoded JavaScript values (no raw bytes copied from the header) and (2) the same model
// split in 3 shards, and both give the same greedy tokens as the original file. Each load runs in a
// child process (scripts/llama-cpp-check.ts), so a native crash cannot take the runner down.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { join, resolve } from "node:path";
import { HAVE_MODELS, MODELS, tempDir } from "../testing/util.ts";
import { GgufArray, type GgufValue } from "./array.ts";
import { openGguf } from "./file.ts";
import { GGUF_TYPE } from "./types.ts";
import { type GgufKvInput, writeGguf, writeGgufSplit } from "./write.ts";

function llamaBinary(): string | null {
  try {
    const req = createRequire(import.meta.url);
    const dir = resolve(req.resolve("@node-llama-cpp/linux-x64/package.json"), "..");
    return existsSync(join(dir, "bins")) ? dir : null;
  } catch {
    return null;
  }
}
const bin = process.platform === "linux" && process.arch === "x64" ? llamaBinary() : null;
const skip = !HAVE_MODELS || bin === null;
const script = resolve(import.meta.dir, "../../scripts/llama-cpp-check.ts");
const tmp = tempDir("llama");
afterAll(tmp.cleanup);

async function check(
  path: string,
): Promise<{ ok: boolean; greedy?: number[]; nTensors?: number; error?: string }> {
  const p = Bun.spawn([process.execPath, script, path, "8"], { stdout: "pipe", stderr: "pipe" });
  const timer = setTimeout(() => p.kill(), 60_000);
  const out = await new Response(p.stdout).text();
  await p.exited;
  clearTimeout(timer);
  return JSON.parse(out.trim().split("\n").pop() ?? "{}");
}

/** Re-type every value through JavaScript (arrays via GgufArray.of), so nothing raw is copied. */
function decoded(values: Iterable<GgufKvInput>): GgufKvInput[] {
  return [...values].map((kv) => {
    const v = kv.value;
    return v instanceof GgufArray
      ? { key: kv.key, type: GGUF_TYPE.ARRAY, value: GgufArray.of(v.type, v.toArray() as GgufValue[]) }
      : kv;
  });
}

describe.skipIf(skip)(
  `llama.cpp (node-llama-cpp 3.21.1) loads our files${skip ? " — skipped: no ../shared/models or no prebuilt linux-x64 llama.cpp binary" : ""}`,
  () => {
    test("rewritten and split models load and give the original's greedy tokens", async () => {
      const src = join(MODELS, "synthetic/llama-tiny-Q8_0.gguf");
      const g = openGguf(src);
      const tensors = g.tensors.map((t) => ({
        name: t.name,
        type: t.dtype,
        shape: t.shape,
        data: g.data(t.name),
      }));
      const whole = join(tmp.dir, "llama-rewritten.gguf");
      writeGguf(whole, decoded(g.metadata.entries.values()), tensors);
      const shards = writeGgufSplit(
        join(tmp.dir, "llama-split"),
        decoded(g.metadata.entries.values()),
        tensors,
        { maxTensors: 8 },
      );
      expect(shards.length).toBe(3);
      const [orig, ours] = await Promise.all([check(src), check(whole)]);
      const split = await check(shards[0] as string);
      expect(orig.ok).toBe(true);
      expect(orig.greedy?.length).toBe(8);
      expect(ours).toEqual(orig);
      // node-llama-cpp's fileInfo lists the first shard's tensors only; llama.cpp itself merges all 3.
      expect({ ...split, nTensors: orig.nTensors } as unknown).toEqual(orig);
    }, 120_000);

    test("llama.cpp refuses what it should: a GGUF v1 file", async () => {
      const r = await check(join(MODELS, "real/tinyllamas-stories-260k-f32.v1.gguf"));
      expect(r.ok).toBe(false);
      expect(r.error).toContain("version 1");
    }, 60_000);
  },
);
