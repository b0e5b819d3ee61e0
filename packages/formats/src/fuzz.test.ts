// Seeded fuzzing of the readers: thousands of mutated small safetensors and GGUF files. Every
// outcome must be a clean parse or a TpError E_FORMAT naming the file and a byte offset — never
// another exception, never a hang, and no run-away memory (the readers check every count and length
// against the bytes left in the file before they allocate).
import { afterAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { TpError } from "@tp/tensor";
import { GgufArray } from "./gguf/array.ts";
import { openGguf } from "./gguf/file.ts";
import { ggufKv, serializeGguf } from "./gguf/write.ts";
import { inspectCheckpoint } from "./inspect.ts";
import { openSafetensors } from "./safetensors/file.ts";
import { serializeSafetensors } from "./safetensors/write.ts";
import { randomBytes, rng, tempDir } from "./testing/util.ts";

const CASES_PER_FORMAT = Number(process.env.TP_FUZZ_CASES ?? 5000); // TP_FUZZ_CASES=100000 for a long run
const tmp = tempDir("fuzz");
afterAll(tmp.cleanup);

const safetensorsSeed = serializeSafetensors(
  [
    { name: "model.embed_tokens.weight", dtype: "BF16", shape: [4, 8], data: randomBytes(64, 1) },
    { name: "blocks.0.attn.wq.weight", dtype: "I8", shape: [4, 4], data: randomBytes(16, 2) },
    { name: "blocks.0.attn.wq.weight_scale", dtype: "F32", shape: [4], data: randomBytes(16, 3) },
    { name: "blocks.0.mod.lin", dtype: "F8_E4M3", shape: [8], data: randomBytes(8, 4) },
    { name: "flag", dtype: "BOOL", shape: [3], data: new Uint8Array([0, 1, 1]) },
  ],
  { metadata: { format: "pt", note: "fuzz seed" } },
);

const ggufSeed = serializeGguf(
  [
    ggufKv("general.architecture", "str", "llama"),
    ggufKv("general.alignment", "u32", 32),
    ggufKv("llama.block_count", "u32", 1),
    ggufKv("llama.rope.freq_base", "f32", 10000),
    ggufKv("x.u64", "u64", 12345678901234n),
    ggufKv("x.bool", "bool", true),
    ggufKv("tokenizer.ggml.tokens", "arr", GgufArray.of("str", ["<unk>", "<s>", "</s>", "▁the", "ü"])),
    ggufKv("tokenizer.ggml.scores", "arr", GgufArray.of("f32", [0, -1, -2, -3, -4])),
    ggufKv("x.nested", "arr", GgufArray.of("arr", [GgufArray.of("i32", [1, 2]), GgufArray.of("str", ["a"])])),
  ],
  [
    { name: "token_embd.weight", type: "q8_0", shape: [2, 32], data: randomBytes(68, 5) },
    { name: "blk.0.attn_norm.weight", type: "f32", shape: [32], data: randomBytes(128, 6) },
    { name: "output.weight", type: "f16", shape: [2, 8], data: randomBytes(32, 7) },
  ],
);

const INTERESTING = [
  0n,
  1n,
  7n,
  8n,
  31n,
  32n,
  255n,
  2n ** 31n,
  2n ** 32n - 1n,
  2n ** 32n,
  2n ** 53n,
  2n ** 63n,
  2n ** 64n - 1n,
];

/** One seeded mutation: byte flips, an interesting u32/u64, a truncation, an insertion or a deletion. */
function mutate(seed: Uint8Array, r: () => number): Uint8Array {
  let b = seed.slice();
  const steps = 1 + Math.floor(r() * 3);
  for (let s = 0; s < steps; s++) {
    const at = Math.floor(r() * b.length);
    const kind = Math.floor(r() * 6);
    if (kind === 0) b[at] = Math.floor(r() * 256);
    else if (kind === 1) b[at] = (b[at] as number) ^ (1 << Math.floor(r() * 8));
    else if (kind === 2 && at + 8 <= b.length) {
      const v = INTERESTING[Math.floor(r() * INTERESTING.length)] as bigint;
      new DataView(b.buffer, b.byteOffset).setBigUint64(at, v, true);
    } else if (kind === 3 && at + 4 <= b.length) {
      new DataView(b.buffer, b.byteOffset).setUint32(
        at,
        Number((INTERESTING[Math.floor(r() * INTERESTING.length)] as bigint) & 0xffffffffn),
        true,
      );
    } else if (kind === 4) b = b.subarray(0, at);
    else {
      const n = 1 + Math.floor(r() * 16);
      const out = new Uint8Array(b.length + n);
      out.set(b.subarray(0, at));
      out.set(randomBytes(n, Math.floor(r() * 1e9)), at);
      out.set(b.subarray(at), at + n);
      b = out;
    }
  }
  return b;
}

/** Read everything a loader would: headers, every tensor's bytes, every metadata value. */
function consume(path: string, kind: "safetensors" | "gguf"): void {
  if (kind === "safetensors") {
    const st = openSafetensors(path);
    for (const t of st.tensors) st.data(t.name);
    st.close();
    return;
  }
  const g = openGguf(path);
  for (const t of g.tensors) g.data(t.name);
  for (const kv of g.metadata.entries.values()) {
    if (kv.value instanceof GgufArray) {
      const walk = (a: GgufArray): void => {
        for (const x of a) if (x instanceof GgufArray) walk(x);
      };
      walk(kv.value);
    }
  }
  g.close();
}

describe("fuzz: mutated files fail only with TpError E_FORMAT naming file and offset", () => {
  for (const [kind, seed, seedNo] of [
    ["safetensors", safetensorsSeed, 1234],
    ["gguf", ggufSeed, 5678],
  ] as const) {
    test(`${CASES_PER_FORMAT} mutated ${kind} files (seed ${seedNo})`, () => {
      const seedPath = join(tmp.dir, `seed.${kind}`);
      writeFileSync(seedPath, seed);
      consume(seedPath, kind); // the seed itself is valid
      const r = rng(seedNo);
      const rss0 = process.memoryUsage().rss;
      let failures = 0;
      for (let i = 0; i < CASES_PER_FORMAT; i++) {
        const path = join(tmp.dir, `case-${kind}-${i}.${kind}`);
        writeFileSync(path, mutate(seed, r));
        try {
          consume(path, kind);
          if (i % 4 === 0) inspectCheckpoint(path); // layout detection and the report on top
        } catch (e) {
          failures++;
          const ok =
            e instanceof TpError && e.code === "E_FORMAT" && e.file === path && typeof e.offset === "number";
          const layoutOnly =
            e instanceof TpError &&
            e.code === "E_FORMAT" &&
            e.message.startsWith("unknown checkpoint layout");
          if (!ok && !layoutOnly) {
            throw new Error(
              `case ${i} (${path}): ${e instanceof TpError ? `${e.code} without file/offset` : "not a TpError"}: ${(e as Error).message}`,
            );
          }
        }
      }
      expect(failures).toBeGreaterThan(CASES_PER_FORMAT / 4); // the mutations do break things
      expect(process.memoryUsage().rss - rss0).toBeLessThan(256 * 2 ** 20);
    }, 60_000); // a hang in any case fails the test by this timeout
  }
});
