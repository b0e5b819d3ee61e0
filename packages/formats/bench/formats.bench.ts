/**
 * `bun run bench formats`: parse + map time of checkpoint headers (issue 3: "should be milliseconds").
 *
 * Cases: a 1,000-tensor safetensors header and a 1,000-tensor GGUF header (small files), the same
 * 1,000 tensors in sparse 20 GiB files (20 MiB each, so 20 mapped regions of 1 GiB), and the real
 * Qwen3 tokenizer GGUF of ../shared/models (151,936 tokens, 151,387 merges) when it is there.
 * "parse + map" = validate the whole header and create every region mapping (`mapAll`); the pages
 * themselves are not touched. Peer for the GGUF cases: @huggingface/gguf 0.4.6 `gguf(path,
 * { allowLocalFile: true })` parsing the same header (it decodes every metadata value eagerly and maps
 * nothing). safetensors has no JavaScript peer here.
 */
import { closeSync, existsSync, ftruncateSync, mkdtempSync, openSync, rmSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { gguf as hfGguf } from "@huggingface/gguf";
import { GgufArray, ggufKv, ggufLayout, openGguf, openSafetensors, safetensorsLayout } from "@tp/formats";

const dir = mkdtempSync(join(tmpdir(), "tp-bench-formats-"));

function sparse(path: string, header: Uint8Array, size: number): string {
  const fd = openSync(path, "w");
  writeSync(fd, header, 0, header.length, 0);
  ftruncateSync(fd, size);
  closeSync(fd);
  return path;
}

/** 1,000 tensors named like a 40-layer LLM, each `elems` F16 elements. */
function names(): string[] {
  const out: string[] = [];
  for (let l = 0; out.length < 1000; l++) {
    for (const w of [
      "q_proj",
      "k_proj",
      "v_proj",
      "o_proj",
      "gate_proj",
      "up_proj",
      "down_proj",
      "input_layernorm",
      "post_attention_layernorm",
      "q_norm",
      "k_norm",
      "extra.a",
      "extra.b",
      "extra.c",
      "extra.d",
      "extra.e",
      "extra.f",
      "extra.g",
      "extra.h",
      "extra.i",
      "extra.j",
      "extra.k",
      "extra.l",
      "extra.m",
      "extra.n",
    ]) {
      if (out.length < 1000) out.push(`model.layers.${l}.${w}.weight`);
    }
  }
  return out;
}

function stFile(tag: string, rows: number): string {
  const l = safetensorsLayout(
    names().map((name) => ({ name, dtype: "F16", shape: [rows, 1024] })),
    { format: "pt" },
  );
  return sparse(join(dir, `${tag}.safetensors`), l.header, l.fileSize);
}

function ggufFile(tag: string, rows: number): string {
  const meta = [
    ggufKv("general.architecture", "str", "llama"),
    ggufKv("llama.block_count", "u32", 40),
    ggufKv(
      "tokenizer.ggml.tokens",
      "arr",
      GgufArray.of(
        "str",
        Array.from({ length: 1000 }, (_, i) => `tok${i}`),
      ),
    ),
  ];
  const l = ggufLayout(
    meta,
    names().map((name) => ({
      name: name.slice(0, 63),
      type: "f16",
      shape: [rows, 1024],
      byteLength: rows * 2048,
    })),
  );
  return sparse(join(dir, `${tag}.gguf`), l.header, l.fileSize);
}

function time(f: () => unknown): number {
  const t0 = performance.now();
  f();
  return performance.now() - t0;
}

async function timeAsync(f: () => Promise<unknown>): Promise<number> {
  const t0 = performance.now();
  await f();
  return performance.now() - t0;
}

const parseMapSt = (p: string) => () => time(() => openSafetensors(p).mapping.mapAll());
const parseMapGguf = (p: string) => () => time(() => openGguf(p).mapAll());
const hf = (p: string) => ({
  name: "@huggingface/gguf 0.4.6",
  run: () => timeAsync(() => hfGguf(p, { allowLocalFile: true })),
});

export default {
  description: "parse + map time of safetensors and GGUF headers (ms, lower is better)",
  cases() {
    const st1k = stFile("st-1k", 16); // 32 KiB each, 32 MiB in all
    const gg1k = ggufFile("gguf-1k", 16);
    const st20g = stFile("st-20g", 10240); // 20 MiB each, 20 GiB in all (sparse)
    const gg20g = ggufFile("gguf-20g", 10240);
    const cases = [
      {
        case: "safetensors, 1000 tensors (32 MiB)",
        metric: "parse+map",
        unit: "ms",
        better: "lower" as const,
        ours: parseMapSt(st1k),
      },
      {
        case: "GGUF, 1000 tensors (32 MiB)",
        metric: "parse+map",
        unit: "ms",
        better: "lower" as const,
        ours: parseMapGguf(gg1k),
        peer: hf(gg1k),
      },
      {
        case: "safetensors, 1000 tensors, sparse 20 GiB",
        metric: "parse+map",
        unit: "ms",
        better: "lower" as const,
        ours: parseMapSt(st20g),
      },
      {
        case: "GGUF, 1000 tensors, sparse 20 GiB",
        metric: "parse+map",
        unit: "ms",
        better: "lower" as const,
        ours: parseMapGguf(gg20g),
        peer: hf(gg20g),
      },
    ];
    const qwen = resolve(import.meta.dir, "../../../../shared/models/synthetic/qwen3-fullvocab-Q4_0.gguf");
    if (existsSync(qwen)) {
      cases.push({
        case: "GGUF qwen3-fullvocab (151,936 tokens)",
        metric: "parse+map",
        unit: "ms",
        better: "lower" as const,
        ours: parseMapGguf(qwen),
        peer: hf(qwen),
      });
    }
    return cases;
  },
  teardown() {
    rmSync(dir, { recursive: true, force: true });
  },
};
