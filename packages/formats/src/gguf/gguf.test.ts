// GGUF: the real and synthetic files of ../shared/models parse with the facts PROVENANCE.md states;
// our writer reproduces each v3 file byte for byte; an independent reader (@huggingface/gguf) agrees
// with ours; every value type (nested arrays too) round-trips; split files; hostile headers.
import { afterAll, describe, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { gguf as hfGguf } from "@huggingface/gguf";
import { isTpError, type TpError } from "@tp/tensor";
import { HAVE_MODELS, MODELS, NO_MODELS, tempDir, thrown } from "../testing/util.ts";
import { GgufArray, jsonValue } from "./array.ts";
import { type GgufFile, ggufSplitPath, openGguf, readGgufHeader } from "./file.ts";
import { GGUF_TYPE } from "./types.ts";
import { ggufKv, serializeGguf, writeGguf, writeGgufSplit } from "./write.ts";

const tmp = tempDir("gguf");
afterAll(tmp.cleanup);
const model = (f: string) => join(MODELS, f);
const v3Files = HAVE_MODELS
  ? ["real", "synthetic"].flatMap((d) =>
      readdirSync(join(MODELS, d))
        .filter((f) => !f.includes(".v1."))
        .map((f) => `${d}/${f}`),
    )
  : [];

/** Rewrite an opened file with our writer (metadata and tensor infos as read, data from the mapping). */
function rewrite(g: GgufFile): Uint8Array {
  return serializeGguf(
    g.metadata.entries.values(),
    g.tensors.map((t) => ({
      name: t.name,
      type: g.info(t.name).ggmlType,
      ne: g.info(t.name).ne,
      data: g.data(t.name),
    })),
    { version: g.version as 2 | 3 },
  );
}

describe.skipIf(!HAVE_MODELS)(
  `the files of ../shared/models (PROVENANCE.md)${HAVE_MODELS ? "" : ` — ${NO_MODELS}`}`,
  () => {
    test.skipIf(!HAVE_MODELS)("are the files PROVENANCE.md describes (size and sha256)", () => {
      const text = readFileSync(join(MODELS, "PROVENANCE.md"), "utf8");
      const rows = [...text.matchAll(/^\| `([^`]+\.gguf)` \| (\d+) \| `([0-9a-f]{64})`/gm)];
      // Every file on disk is described and every described file is on disk (the folder grows as
      // fixtures for new architectures land, so the count is taken from the folder, not written here).
      const onDisk = ["real", "synthetic"].flatMap((d) => readdirSync(join(MODELS, d))).sort();
      expect(rows.map(([, name]) => name as string).sort()).toEqual(onDisk);
      for (const [, name, size, sha] of rows) {
        const dir =
          (name as string).startsWith("llama-2") ||
          (name as string).includes("stories") ||
          (name as string).includes("tinyllamas")
            ? "real"
            : "synthetic";
        const bytes = readFileSync(model(`${dir}/${name}`));
        expect(bytes.length).toBe(Number(size));
        expect(createHash("sha256").update(bytes).digest("hex")).toBe(sha as string);
      }
    });

    test("llama-2-tiny-random: llama v3, 1 layer, n_embd 8, 2/2 heads, ffn 32, ctx 4096, 32000-token SPM vocab, 9 F16 + 3 F32, untied", () => {
      const g = openGguf(model("real/llama-2-tiny-random.gguf"));
      const m = g.metadata;
      expect(g.version).toBe(3);
      expect(g.architecture).toBe("llama");
      expect([
        m.getInt("llama.block_count"),
        m.getInt("llama.embedding_length"),
        m.getInt("llama.attention.head_count"),
      ]).toEqual([1, 8, 2]);
      expect([
        m.getInt("llama.attention.head_count_kv"),
        m.getInt("llama.rope.dimension_count"),
        m.getInt("llama.feed_forward_length"),
      ]).toEqual([2, 4, 32]);
      expect(m.getInt("llama.context_length")).toBe(4096);
      expect(m.getString("tokenizer.ggml.model")).toBe("llama");
      expect(m.has("tokenizer.ggml.pre")).toBe(false);
      expect(m.getArray("tokenizer.ggml.tokens")?.length).toBe(32000);
      expect(m.getArray("tokenizer.ggml.tokens")?.slice(0, 3)).toEqual(["<unk>", "<s>", "</s>"]);
      const f16 = g.tensors.filter((t) => t.dtype === "F16");
      const f32 = g.tensors.filter((t) => t.dtype === "F32");
      expect([g.tensors.length, f16.length, f32.length]).toEqual([12, 9, 3]);
      expect(f16.every((t) => t.shape.length === 2)).toBe(true);
      expect(f32.every((t) => t.name.endsWith("norm.weight"))).toBe(true);
      expect(g.tensor("output.weight").shape).toEqual([32000, 8]);
      expect(g.tensor("token_embd.weight").shape).toEqual([32000, 8]);
    });

    test("stories260K v3: llama, 5 layers, n_embd 64, 8/4 heads, head_dim 8, ffn 172, ctx 512, 512 vocab, 48 F32 tensors, untied", () => {
      const g = openGguf(model("real/stories260K-f32-v3.gguf"));
      const m = g.metadata;
      expect(m.getString("llama.tensor_data_layout")).toBe("Meta AI original pth");
      expect([5, 64, 8, 4, 8, 172, 512]).toEqual(
        [
          "block_count",
          "embedding_length",
          "attention.head_count",
          "attention.head_count_kv",
          "rope.dimension_count",
          "feed_forward_length",
          "context_length",
        ].map((k) => m.getInt(`llama.${k}`) as number),
      );
      expect(m.getArray("tokenizer.ggml.tokens")?.length).toBe(512);
      expect(g.tensors.length).toBe(48);
      expect(g.tensors.every((t) => t.dtype === "F32")).toBe(true);
      expect(g.tensor("blk.0.ffn_gate.weight").shape).toEqual([172, 64]);
      expect(g.has("output.weight")).toBe(true);
    });

    test("the GGUF v1 original is refused with E_FORMAT naming version 1 (llama.cpp refuses it too)", () => {
      const e = thrown(() => openGguf(model("real/tinyllamas-stories-260k-f32.v1.gguf"))) as TpError;
      expect(e.code).toBe("E_FORMAT");
      expect(e.message).toContain("version 1");
      expect(e.offset).toBe(4);
    });

    const arch = {
      qwen3: { layers: 2, heads: [4, 2], headDim: 32, ffn: 128, tied: true, vocab: 4122 },
      qwen3moe: { layers: 2, heads: [4, 2], headDim: 32, ffn: 128, tied: false, vocab: 4122 },
      gemma3: { layers: 6, heads: [4, 1], headDim: 32, ffn: 128, tied: true, vocab: 4191 },
      llama: { layers: 2, heads: [4, 2], headDim: 16, ffn: 128, tied: false, vocab: 512 },
    } as const;
    for (const [a, s] of Object.entries(arch)) {
      for (const type of ["F32", "F16", "Q8_0", "Q4_0"]) {
        test(`synthetic ${a}-tiny-${type}: shapes, heads, tied head and "pure" quantization`, () => {
          const g = openGguf(model(`synthetic/${a}-tiny-${type}.gguf`));
          const m = g.metadata;
          expect(g.architecture).toBe(a);
          expect(m.getInt(`${a}.block_count`)).toBe(s.layers);
          expect(m.getInt(`${a}.embedding_length`)).toBe(64);
          expect([m.getInt(`${a}.attention.head_count`), m.getInt(`${a}.attention.head_count_kv`)]).toEqual([
            ...s.heads,
          ]);
          expect(m.getInt(`${a}.feed_forward_length`)).toBe(s.ffn);
          expect(g.has("output.weight")).toBe(!s.tied);
          expect(m.getArray("tokenizer.ggml.tokens")?.length).toBe(s.vocab);
          expect(g.tensor("blk.0.attn_q.weight").shape).toEqual([s.heads[0] * s.headDim, 64]);
          expect(g.tensor("blk.0.attn_k.weight").shape).toEqual([s.heads[1] * s.headDim, 64]);
          for (const t of g.tensors) {
            const isNormOrRouter = t.shape.length === 1 || t.name.includes("ffn_gate_inp");
            expect(`${t.name} ${t.dtype}`).toBe(`${t.name} ${isNormOrRouter ? "F32" : type}`);
          }
          if (a === "qwen3" || a === "qwen3moe") {
            expect(m.getFloat(`${a}.rope.freq_base`)).toBe(1e6);
            expect(m.getString("tokenizer.ggml.pre")).toBe("qwen2");
            expect([
              m.getInt("tokenizer.ggml.bos_token_id"),
              m.getInt("tokenizer.ggml.eos_token_id"),
            ]).toEqual([4096, 4098]);
            expect(m.getArray("tokenizer.ggml.tokens")?.get(4097)).toBe("<|im_start|>");
            expect(m.getArray("tokenizer.ggml.merges")?.length).toBe(3840);
            expect(m.getBool("tokenizer.ggml.add_bos_token")).toBe(false);
          }
          if (a === "qwen3moe") {
            expect([
              m.getInt("qwen3moe.expert_count"),
              m.getInt("qwen3moe.expert_used_count"),
              m.getInt("qwen3moe.expert_feed_forward_length"),
            ]).toEqual([8, 2, 64]);
            expect(g.tensor("blk.1.ffn_gate_exps.weight").shape).toEqual([8, 64, 64]);
            expect(g.tensor("blk.1.ffn_gate_inp.weight").shape).toEqual([8, 64]);
          }
          if (a === "gemma3") {
            expect(m.getInt("gemma3.attention.sliding_window")).toBe(8);
            expect(
              m.has("gemma3.attention.sliding_window_pattern") || m.has("gemma3.rope.freq_base_swa"),
            ).toBe(false);
            expect(m.getString("tokenizer.ggml.model")).toBe("llama");
            expect([2, 1, 3, 0]).toEqual(
              ["bos", "eos", "unknown", "padding"].map(
                (k) => m.getInt(`tokenizer.ggml.${k}_token_id`) as number,
              ),
            );
            expect(m.getBool("tokenizer.ggml.add_space_prefix")).toBe(false);
            expect(m.getArray("tokenizer.ggml.tokens")?.get(105)).toBe("<start_of_turn>");
            expect(g.has("blk.5.post_ffw_norm.weight")).toBe(true);
          }
          if (a === "llama") {
            expect(m.getFloat("llama.rope.freq_base")).toBe(1e4);
            const stories = openGguf(model("real/stories260K-f32-v3.gguf"));
            expect(m.getArray("tokenizer.ggml.tokens")?.toArray()).toEqual(
              stories.metadata.getArray("tokenizer.ggml.tokens")?.toArray() as string[],
            );
          }
        });
      }
    }

    test("full-vocab files carry the whole tokenizers (151936 / 262144 entries) and a chat template", () => {
      const q = openGguf(model("synthetic/qwen3-fullvocab-Q4_0.gguf"));
      expect(q.metadata.getArray("tokenizer.ggml.tokens")?.length).toBe(151936);
      expect(q.metadata.getArray("tokenizer.ggml.merges")?.length).toBe(151387);
      expect(q.metadata.getArray("tokenizer.ggml.tokens")?.get(151643)).toBe("<|endoftext|>");
      expect(q.metadata.getString("tokenizer.chat_template")).toContain("<|im_start|>");
      expect(q.metadata.getInt("qwen3.embedding_length")).toBe(32);
      const g = openGguf(model("synthetic/gemma3-fullvocab-Q4_0.gguf"));
      expect(g.metadata.getArray("tokenizer.ggml.tokens")?.length).toBe(262144);
      expect(g.metadata.getString("tokenizer.chat_template")).toContain("<start_of_turn>");
    });

    test("our writer reproduces every v3 file byte for byte", () => {
      expect(v3Files.length).toBeGreaterThanOrEqual(20);
      for (const f of v3Files) {
        const g = openGguf(model(f));
        const same = Buffer.compare(Buffer.from(rewrite(g)), readFileSync(model(f))) === 0;
        expect(`${f}: ${same}`).toBe(`${f}: true`);
      }
    });

    test("an independent reader (@huggingface/gguf 0.4.6) sees the same metadata and tensor infos", async () => {
      for (const f of v3Files) {
        const theirs = await hfGguf(model(f), { allowLocalFile: true });
        const ours = openGguf(model(f));
        expect(Number(theirs.tensorDataOffset)).toBe(ours.shards[0]?.header.dataStart as number);
        expect(
          theirs.tensorInfos.map((t) => [t.name, t.shape.map(Number), t.dtype, Number(t.offset)]),
        ).toEqual(
          (ours.shards[0]?.header.tensors ?? []).map((t) => [t.name, [...t.ne], t.ggmlType, t.offset]),
        );
        const meta = theirs.metadata as Record<string, unknown>;
        // Their TextDecoder drops a leading U+FEFF; the Qwen vocabulary has a token that is exactly
        // U+FEFF (we keep it: the bytes are EF BB BF). Compare modulo that one difference.
        const noBom = (v: unknown): unknown =>
          typeof v === "string" ? v.replace(/^\uFEFF/, "") : Array.isArray(v) ? v.map(noBom) : v;
        for (const kv of ours.metadata.entries.values()) {
          const want = noBom(jsonValue(kv.value));
          const got = meta[kv.key];
          expect([
            kv.key,
            typeof got === "bigint"
              ? got.toString()
              : Array.isArray(got)
                ? got.map((x) => (typeof x === "bigint" ? x.toString() : x))
                : got,
          ]).toEqual([kv.key, want]);
        }
      }
    }, 60_000); // parses 20 files twice; slow on a loaded 2-core machine
  },
);

describe("writer and reader round trips", () => {
  const allTypes = () => [
    ggufKv("general.architecture", "str", "llama"),
    ggufKv("t.u8", "u8", 255),
    ggufKv("t.i8", "i8", -128),
    ggufKv("t.u16", "u16", 65535),
    ggufKv("t.i16", "i16", -32768),
    ggufKv("t.u32", "u32", 4294967295),
    ggufKv("t.i32", "i32", -2147483648),
    ggufKv("t.f32", "f32", 0.5),
    ggufKv("t.bool", "bool", true),
    ggufKv("t.str", "str", "héllo\nwörld ✓"),
    ggufKv("t.u64", "u64", 2n ** 64n - 1n),
    ggufKv("t.i64", "i64", -(2n ** 63n)),
    ggufKv("t.f64", "f64", Math.PI),
    ggufKv("t.arr.str", "arr", GgufArray.of("str", ["a", "", "ü", "<|im_end|>"])),
    ggufKv("t.arr.f32", "arr", GgufArray.of("f32", [1.5, -2, 0])),
    ggufKv("t.arr.bool", "arr", GgufArray.of("bool", [true, false])),
    ggufKv("t.arr.u64", "arr", GgufArray.of("u64", [1n, 2n ** 40n])),
    ggufKv("t.arr.empty", "arr", GgufArray.of("i32", [])),
    ggufKv(
      "t.arr.nested",
      "arr",
      GgufArray.of("arr", [
        GgufArray.of("i32", [1, 2]),
        GgufArray.of("str", ["x"]),
        GgufArray.of("arr", [GgufArray.of("u8", [7])]),
      ]),
    ),
  ];

  test("every value type, nested arrays included, for v2 and v3", () => {
    for (const version of [2, 3] as const) {
      const p = join(tmp.dir, `types-v${version}.gguf`);
      const data = new Uint8Array(34 * 2).fill(7);
      writeGguf(p, allTypes(), [{ name: "w", type: "q8_0", shape: [2, 32], data }], { version });
      const g = openGguf(p);
      expect(g.version).toBe(version);
      for (const kv of allTypes()) {
        expect([kv.key, jsonValue(g.metadata.get(kv.key) as never)]).toEqual([kv.key, jsonValue(kv.value)]);
        expect(g.metadata.entries.get(kv.key)?.type).toBe(kv.type as never);
      }
      expect(g.metadata.getArray("t.arr.nested")?.typeName).toBe("arr");
      expect(g.tensor("w")).toMatchObject({ dtype: "Q8_0", format: "q8_0", shape: [2, 32], byteLength: 68 });
      expect([...g.data("w")]).toEqual([...data]);
      // Writing what we read gives the same bytes again (raw arrays are copied unchanged).
      expect(Buffer.compare(Buffer.from(rewrite(g)), readFileSync(p))).toBe(0);
    }
  });

  test("utf8Spans and toTypedArray: the same values as get(i), from the file's bytes and from GgufArray.of", () => {
    const p = join(tmp.dir, "spans.gguf");
    writeGguf(p, allTypes(), []);
    const g = openGguf(p);
    const words = ["a", "", "ü", "<|im_end|>"];
    const enc = new TextEncoder();
    for (const arr of [g.metadata.getArray("t.arr.str"), GgufArray.of("str", words)]) {
      const s = (arr as GgufArray).utf8Spans();
      const got = words.map((_, i) =>
        Array.from(s.bytes.subarray(s.start[i] as number, (s.start[i] as number) + (s.length[i] as number))),
      );
      expect(got).toEqual(words.map((w) => Array.from(enc.encode(w))));
    }
    for (const arr of [g.metadata.getArray("t.arr.f32"), GgufArray.of("f32", [1.5, -2, 0])]) {
      const t = (arr as GgufArray).toTypedArray();
      expect([t instanceof Float32Array, Array.from(t)]).toEqual([true, [1.5, -2, 0]]);
    }
    expect(Array.from(GgufArray.of("i32", [-7, 2 ** 31 - 1]).toTypedArray())).toEqual([-7, 2 ** 31 - 1]);
    expect((thrown(() => GgufArray.of("u8", [1]).toTypedArray()) as TpError).code).toBe("E_ARG");
    expect((thrown(() => GgufArray.of("i32", [1]).utf8Spans()) as TpError).code).toBe("E_ARG");
    g.close();
  });

  test("alignment: a non-default alignment is written as general.alignment and every tensor lands on it", () => {
    const p = join(tmp.dir, "align.gguf");
    const layout = writeGguf(
      p,
      [ggufKv("general.architecture", "str", "x")],
      [
        { name: "a", type: "f32", shape: [3], data: new Uint8Array(12) },
        { name: "b", type: "f16", shape: [5], data: new Uint8Array(10) },
      ],
      { alignment: 64 },
    );
    const h = readGgufHeader(p);
    expect(h.alignment).toBe(64);
    expect(h.dataStart % 64).toBe(0);
    expect(h.tensors.map((t) => t.offset)).toEqual([0, 64]);
    expect(layout.fileSize).toBe(h.dataStart + 128);
  });

  test("writer argument checks are E_ARG", () => {
    const bad = [
      () => ggufKv("k", "u8", 256),
      () => ggufKv("k", "u64", -1n),
      () => ggufKv("k", "str", 5),
      () => serializeGguf([ggufKv("a", "u8", 1), ggufKv("a", "u8", 2)], []),
      () => serializeGguf([], [{ name: "x".repeat(64), type: "f32", shape: [1], data: new Uint8Array(4) }]),
      () => serializeGguf([], [{ name: "w", type: "q4_0", shape: [2, 31], data: new Uint8Array(1) }]),
      () => serializeGguf([], [{ name: "w", type: "f32", shape: [2], data: new Uint8Array(4) }]),
      () => serializeGguf([], [], { alignment: 24 }),
      () => serializeGguf([], [{ name: "w", type: "f8_e4m3fn", shape: [2], data: new Uint8Array(2) }]),
    ];
    for (const f of bad) expect(isTpError(thrown(f), "E_ARG")).toBe(true);
  });

  test("lazy string arrays: 200k strings parse without being decoded; bad UTF-8 surfaces on access as E_FORMAT", () => {
    const words = Array.from({ length: 200_000 }, (_, i) => `tok${i}`);
    const p = join(tmp.dir, "lazy.gguf");
    writeGguf(
      p,
      [
        ggufKv("tokenizer.ggml.tokens", "arr", GgufArray.of("str", words)),
        ggufKv("x", "arr", GgufArray.of("str", ["ok", "zz"])),
      ],
      [],
    );
    const g = openGguf(p);
    expect(g.metadata.getArray("tokenizer.ggml.tokens")?.get(123456)).toBe("tok123456");
    const bytes = readFileSync(p);
    const at = bytes.lastIndexOf(0x7a); // the last "z" of "zz"
    bytes[at] = 0xff;
    writeFileSync(p, bytes);
    const arr = openGguf(p).metadata.getArray("x") as GgufArray;
    expect(arr.get(0)).toBe("ok");
    const e = thrown(() => arr.get(1)) as TpError;
    expect(e.code).toBe("E_FORMAT");
    expect(e.offset).toBe(at - 1);
  });

  test("split files: written like gguf-split, opened from any shard, merged", () => {
    const tensors = [0, 1, 2, 3, 4].map((i) => ({
      name: `blk.${i}.w`,
      type: "f32",
      shape: [8],
      data: new Uint8Array(new Float32Array(8).fill(i).buffer),
    }));
    const prefix = join(tmp.dir, "model");
    const paths = writeGgufSplit(prefix, [ggufKv("general.architecture", "str", "llama")], tensors, {
      maxTensors: 2,
    });
    expect(paths).toEqual([0, 1, 2].map((i) => ggufSplitPath(prefix, i, 3)));
    expect(paths[0]?.endsWith("model-00001-of-00003.gguf")).toBe(true);
    const second = readGgufHeader(paths[1] as string);
    expect(second.metadata.has("general.architecture")).toBe(false);
    expect(second.metadata.get("split.no")?.value).toBe(1);
    expect(second.metadata.get("split.no")?.type).toBe(GGUF_TYPE.UINT16);
    for (const p of paths) {
      const g = openGguf(p);
      expect(g.files.length).toBe(3);
      expect(g.architecture).toBe("llama");
      expect(g.tensors.map((t) => t.name)).toEqual(tensors.map((t) => t.name));
      expect(new Float32Array(g.data("blk.4.w").slice().buffer)[0]).toBe(4);
    }
    // A missing shard is named.
    const bytes = readFileSync(paths[2] as string);
    writeFileSync(paths[2] as string, bytes.subarray(0, 0));
    expect(
      isTpError(
        thrown(() => openGguf(paths[0] as string)),
        "E_FORMAT",
      ),
    ).toBe(true);
  });
});

describe("hostile headers: each is E_FORMAT naming the file, the key or tensor, and the offset", () => {
  const base = () =>
    serializeGguf(
      [ggufKv("general.architecture", "str", "llama"), ggufKv("a", "arr", GgufArray.of("str", ["xy", "z"]))],
      [{ name: "w", type: "f32", shape: [2, 4], data: new Uint8Array(32) }],
    );
  // Offsets inside base(): header 24; key "general.architecture" (8 + 20) type 4, value 8 + 5 → 69;
  // key "a" (8 + 1) at 69, type 4 at 78, elem type 4 at 82, count 8 at 86, strings at 94…
  const patch = (f: (b: Uint8Array, dv: DataView) => void) => {
    const b = base();
    f(b, new DataView(b.buffer));
    return b;
  };
  const infoAt = (b: Uint8Array) => Buffer.from(b).indexOf("w", 100);
  const cases: [string, () => Uint8Array, string, string | undefined][] = [
    ["truncated file", () => base().subarray(0, 60), "remain", undefined],
    [
      "cut after tensor_count (16 bytes): the room left is 0, never negative",
      () => base().subarray(0, 16),
      "tensor_count is 1, more than the 0 the rest of the file can hold",
      undefined,
    ],
    ["wrong magic", () => patch((b) => b.set([0x47, 0x47, 0x4d, 0x4c], 0)), "magic", undefined],
    ["version 4", () => patch((_, dv) => dv.setUint32(4, 4, true)), "version 4", undefined],
    [
      "byte-swapped version",
      () => patch((_, dv) => dv.setUint32(4, 0x03000000, true)),
      "byte-swapped",
      undefined,
    ],
    [
      "more tensors than the file can hold",
      () => patch((_, dv) => dv.setBigUint64(8, 2n ** 40n, true)),
      "tensor_count",
      undefined,
    ],
    [
      "absurd KV count",
      () => patch((_, dv) => dv.setBigUint64(16, 2n ** 63n, true)),
      "metadata_kv_count",
      undefined,
    ],
    [
      "string length past the end",
      () => patch((_, dv) => dv.setBigUint64(24, 2n ** 50n, true)),
      "length of key 0",
      undefined,
    ],
    [
      "unknown value type",
      () => patch((_, dv) => dv.setUint32(52, 13, true)),
      "unknown GGUF value type 13",
      undefined,
    ],
    [
      "array length past the end",
      () => patch((_, dv) => dv.setBigUint64(86, 2n ** 33n, true)),
      "element count",
      undefined,
    ],
    [
      "array string element length past the end",
      () => patch((_, dv) => dv.setBigUint64(94, 2n ** 40n, true)),
      "past the end",
      undefined,
    ],
    [
      "bad UTF-8 in a key",
      () =>
        patch((b) => {
          b[40] = 0xff;
        }),
      "UTF-8",
      undefined,
    ],
    [
      "negative dimension",
      () => patch((b, dv) => dv.setBigUint64(infoAt(b) + 5, 2n ** 64n - 1n, true)),
      "negative",
      "w",
    ],
    ["n_dims 5", () => patch((b, dv) => dv.setUint32(infoAt(b) + 1, 5, true)), "n_dims", "w"],
    [
      "unknown ggml type",
      () => patch((b, dv) => dv.setUint32(infoAt(b) + 21, 99, true)),
      "ggml type id 99",
      "w",
    ],
    [
      "offset out of range",
      () => patch((b, dv) => dv.setBigUint64(infoAt(b) + 25, 1n << 20n, true)),
      "past the end",
      "w",
    ],
    [
      "misaligned offset",
      () => patch((b, dv) => dv.setBigUint64(infoAt(b) + 25, 8n, true)),
      "not a multiple of the alignment",
      "w",
    ],
    [
      "dtype × shape past the end of the file",
      () => patch((b, dv) => dv.setBigUint64(infoAt(b) + 13, 4096n, true)),
      "larger than the file",
      "w",
    ],
  ];
  for (const [what, make, words, tensor] of cases) {
    test(what, () => {
      const p = join(tmp.dir, `hostile-${what.replace(/\W+/g, "-")}.gguf`);
      writeFileSync(p, make());
      const e = thrown(() => openGguf(p)) as TpError;
      expect(isTpError(e, "E_FORMAT")).toBe(true);
      expect(e.message).toContain(words);
      expect(e.file).toBe(p);
      expect(typeof e.offset).toBe("number");
      if (tensor) expect(e.tensor).toBe(tensor);
    });
  }

  test("alignment that is not a power of two, duplicate keys, duplicate tensors, overlapping data, BOOL 2, deep nesting", () => {
    const write = (name: string, bytes: Uint8Array) => {
      const p = join(tmp.dir, name);
      writeFileSync(p, bytes);
      return p;
    };
    const expectFormat = (p: string, words: string) => {
      const e = thrown(() => openGguf(p)) as TpError;
      expect(e.code).toBe("E_FORMAT");
      expect(e.message).toContain(words);
    };
    const a2 = Buffer.from(serializeGguf([ggufKv("general.alignment", "u32", 32)], []));
    a2.writeUInt32LE(24, a2.indexOf("general.alignment") + 17 + 4);
    expectFormat(write("align2.gguf", a2), "general.alignment 24 is not a power of two");
    const dup = Buffer.from(serializeGguf([ggufKv("k1", "u8", 1), ggufKv("k2", "u8", 2)], []));
    dup.write("k1", dup.indexOf("k2"));
    expectFormat(write("dup.gguf", dup), "duplicate metadata key 'k1'");
    const t = (name: string) => ({ name, type: "f32", shape: [8], data: new Uint8Array(32) });
    const dupT = Buffer.from(serializeGguf([], [t("aa"), t("ab")]));
    dupT.write("aa", dupT.indexOf("ab"));
    expectFormat(write("dupt.gguf", dupT), "duplicate tensor name");
    const ov = Buffer.from(serializeGguf([], [t("aa"), t("ab")]));
    ov.writeBigUInt64LE(0n, ov.indexOf("ab") + 2 + 4 + 8 + 4);
    expectFormat(write("overlap.gguf", ov), "overlaps 'aa'");
    const b2 = Buffer.from(serializeGguf([ggufKv("b", "bool", true)], []));
    b2[b2.indexOf("b", 24) + 1 + 4] = 2; // key "b", then the u32 type, then the value
    expectFormat(write("bool.gguf", b2), "only 0 and 1 are valid");
    let deep = GgufArray.of("u8", [1]);
    for (let i = 0; i < 10; i++) deep = GgufArray.of("arr", [deep]);
    expectFormat(write("deep.gguf", serializeGguf([ggufKv("d", "arr", deep)], [])), "nest deeper than 8");
  });
});
