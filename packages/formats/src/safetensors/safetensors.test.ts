// safetensors: the reference writer's exact bytes, every dtype round trip, sorting and alignment,
// sharded index files, a sparse 5 GiB file, and each hostile header named by the issue.
import { afterAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { isTpError, type TpError } from "@tp/tensor";
import { randomBytes, tempDir, thrown, writeSparse } from "../testing/util.ts";
import { SAFETENSORS_DTYPE_NAMES, SAFETENSORS_DTYPES } from "./dtypes.ts";
import { openSafetensors } from "./file.ts";
import { openSafetensorsIndex, writeShardedSafetensors } from "./sharded.ts";
import { safetensorsLayout, serializeSafetensors, writeSafetensors } from "./write.ts";

const tmp = tempDir("st");
afterAll(tmp.cleanup);
let n = 0;
function file(bytes: Uint8Array): string {
  const p = join(tmp.dir, `f${n++}.safetensors`);
  writeFileSync(p, bytes);
  return p;
}
const f32 = (...xs: number[]) => new Uint8Array(new Float32Array(xs).buffer);

describe("writer matches the reference serializer byte for byte", () => {
  // Expected bytes: huggingface/safetensors safetensors/src/tensor.rs, tests test_serialization,
  // test_serialization_forced_alignement and test_empty.
  test("test_serialization: attn.0 F32 [1, 2, 3]", () => {
    const out = serializeSafetensors([
      { name: "attn.0", dtype: "F32", shape: [1, 2, 3], data: f32(0, 1, 2, 3, 4, 5) },
    ]);
    expect([...out]).toEqual([
      64, 0, 0, 0, 0, 0, 0, 0, 123, 34, 97, 116, 116, 110, 46, 48, 34, 58, 123, 34, 100, 116, 121, 112, 101,
      34, 58, 34, 70, 51, 50, 34, 44, 34, 115, 104, 97, 112, 101, 34, 58, 91, 49, 44, 50, 44, 51, 93, 44, 34,
      100, 97, 116, 97, 95, 111, 102, 102, 115, 101, 116, 115, 34, 58, 91, 48, 44, 50, 52, 93, 125, 125, 0, 0,
      0, 0, 0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64, 0, 0, 160, 64,
    ]);
  });

  test("test_serialization_forced_alignement: the header is padded with spaces to 8 bytes", () => {
    const out = serializeSafetensors([
      { name: "attn0", dtype: "F32", shape: [1, 1, 2, 3], data: f32(0, 1, 2, 3, 4, 5) },
    ]);
    expect([...out.subarray(0, 8)]).toEqual([72, 0, 0, 0, 0, 0, 0, 0]);
    expect(new TextDecoder().decode(out.subarray(8, 80))).toBe(
      `{"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}}       `,
    );
  });

  test("test_empty: no tensors, with and without __metadata__", () => {
    expect([...serializeSafetensors([])]).toEqual([8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32]);
    const out = serializeSafetensors([], { metadata: { framework: "pt" } });
    expect([...out.subarray(0, 8)]).toEqual([40, 0, 0, 0, 0, 0, 0, 0]);
    expect(new TextDecoder().decode(out.subarray(8))).toBe(`{"__metadata__":{"framework":"pt"}}     `);
  });

  test("tensors are ordered by descending dtype, then name; offsets contiguous; data 8-aligned", () => {
    const l = safetensorsLayout([
      { name: "b", dtype: "U8", shape: [3] },
      { name: "a", dtype: "U8", shape: [1] },
      { name: "z", dtype: "F64", shape: [2] },
      { name: "m", dtype: "bf16", shape: [2] },
    ]);
    expect(l.order.map((t) => [t.name, t.begin, t.end])).toEqual([
      ["z", 0, 16],
      ["m", 16, 20],
      ["a", 20, 21],
      ["b", 21, 24],
    ]);
    expect(l.dataStart % 8).toBe(0);
  });
});

describe("reader", () => {
  test("every dtype of the format round-trips, with __metadata__ and exact bytes", () => {
    const tensors = SAFETENSORS_DTYPE_NAMES.map((d, i) => {
      const bits = SAFETENSORS_DTYPES.get(d)?.bits as number;
      const shape = bits === 4 ? [2, 4] : bits === 6 ? [2, 4] : [2, 3];
      const bytes = (shape.reduce((a, b) => a * b, 1) * bits) / 8;
      return { name: `t.${d}`, dtype: d, shape, data: randomBytes(bytes, i) };
    });
    const p = join(tmp.dir, "all.safetensors");
    writeSafetensors(p, tensors, { metadata: { format: "pt", note: "ü" } });
    const st = openSafetensors(p);
    expect(st.tensors.length).toBe(SAFETENSORS_DTYPE_NAMES.length);
    expect(st.metadata?.get("note")).toBe("ü");
    for (const t of tensors) {
      expect(st.tensor(t.name).dtype).toBe(t.dtype);
      expect(st.tensor(t.name).shape).toEqual(t.shape);
      expect([...st.data(t.name)]).toEqual([...t.data]);
    }
    expect(st.tensor("t.BF16").format).toBe("bf16");
    expect(st.tensor("t.F8_E4M3").format).toBe("f8_e4m3fn");
    expect(st.tensor("t.C64").format).toBeNull();
    // F32 at a 4-aligned offset can be viewed as a Float32Array on the mapping.
    const v = st.data("t.F32");
    expect(v.byteOffset % 4).toBe(0);
    st.close();
  });

  test("a sparse 5 GiB file: the tensor past 4 GiB reads back, nothing else is read", () => {
    const GiB = 2 ** 30;
    const layout = safetensorsLayout([
      { name: "huge", dtype: "U8", shape: [4.5 * GiB] },
      { name: "tail", dtype: "U8", shape: [16] },
    ]);
    const tail = layout.order.find((t) => t.name === "tail") as { begin: number };
    const p = join(tmp.dir, "sparse-5g.safetensors");
    const mark = new TextEncoder().encode("0123456789abcdef");
    writeSparse(p, layout.header, layout.fileSize, [[layout.dataStart + tail.begin, mark]]);
    const st = openSafetensors(p);
    expect(st.tensor("tail").byteOffset).toBeGreaterThan(4 * GiB);
    expect(new TextDecoder().decode(st.data("tail"))).toBe("0123456789abcdef");
    expect(
      isTpError(
        thrown(() => st.data("huge")),
        "E_UNSUPPORTED",
      ),
    ).toBe(true); // > 4 GiB: map in parts
    expect(st.mapping.view(st.tensor("huge").byteOffset + 4 * GiB, 8).length).toBe(8);
    st.close();
  });
});

describe("sharded checkpoints (*.safetensors.index.json)", () => {
  test("write 3 shards + index, read back through the index", () => {
    const tensors = [0, 1, 2, 3, 4].map((i) => ({
      name: `layers.${i}.w`,
      dtype: "F32",
      shape: [4],
      data: f32(i, i, i, i),
    }));
    const index = writeShardedSafetensors(tmp.dir, "model", tensors, { maxShardBytes: 32 });
    const s = openSafetensorsIndex(index);
    expect(s.files.map((f) => f.split("/").pop())).toEqual([
      "model-00001-of-00003.safetensors",
      "model-00002-of-00003.safetensors",
      "model-00003-of-00003.safetensors",
    ]);
    expect(s.index.metadata.total_size).toBe(80);
    expect(new Float32Array(s.data("layers.4.w").slice().buffer)[0]).toBe(4);
    s.close();
  });

  test("a shard path that leaves the directory, or a tensor not where the index says, is E_FORMAT", () => {
    const bad = join(tmp.dir, "bad.safetensors.index.json");
    writeFileSync(bad, JSON.stringify({ weight_map: { w: "../../etc/passwd" } }));
    expect(
      isTpError(
        thrown(() => openSafetensorsIndex(bad)),
        "E_FORMAT",
      ),
    ).toBe(true);
    writeFileSync(bad, JSON.stringify({ weight_map: { "layers.0.w": "model-00002-of-00003.safetensors" } }));
    const e = thrown(() => openSafetensorsIndex(bad)) as TpError;
    expect(e.code).toBe("E_FORMAT");
    expect(e.tensor).toBe("layers.0.w");
  });
});

describe("hostile headers: each is E_FORMAT naming the file, the tensor and the offset", () => {
  const header = (json: string, data = 0, lengthOverride?: bigint) => {
    const j = new TextEncoder().encode(json);
    const out = new Uint8Array(8 + j.length + data);
    new DataView(out.buffer).setBigUint64(0, lengthOverride ?? BigInt(j.length), true);
    out.set(j, 8);
    return out;
  };
  const ok = `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}}`;
  const cases: [string, Uint8Array, string | undefined, string][] = [
    ["truncated length prefix", new Uint8Array([1, 2, 3]), undefined, "8-byte header length"],
    ["header length past the end of the file", header(ok, 12, 10_000n), undefined, "past the end"],
    ["header length over 100 MB", header(ok, 12, 200_000_000n), undefined, "limit"],
    ["bad UTF-8", header(`{"ab":1}`).map((b, i) => (i === 10 ? 0xff : b)), undefined, "UTF-8"],
    ["bad JSON", header(`{"a":`), undefined, "JSON"],
    ["not an object", header(`[1,2]`), undefined, "object"],
    [
      "unknown dtype",
      header(`{"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}}`, 1),
      "a",
      "unknown dtype",
    ],
    [
      "negative dimension",
      header(`{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}`, 1),
      "a",
      "non-negative",
    ],
    [
      "absurd dimension",
      header(`{"a":{"dtype":"U8","shape":[1e300],"data_offsets":[0,1]}}`, 1),
      "a",
      "non-negative",
    ],
    [
      "overflowing shape",
      header(`{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,1]}}`, 1),
      "a",
      "too large",
    ],
    [
      "dtype × shape ≠ byte length",
      header(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, 8),
      "a",
      "needs 12 bytes",
    ],
    ["offset out of range (truncated data)", header(ok, 6), undefined, "truncated"],
    [
      "overlapping tensors",
      header(
        `{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}`,
        6,
      ),
      "b",
      "overlap",
    ],
    [
      "a gap",
      header(
        `{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}}`,
        10,
      ),
      "b",
      "gap",
    ],
    [
      "end before begin",
      header(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}`, 4),
      "a",
      "end before",
    ],
    ["bytes after the last tensor", header(ok, 20), undefined, "after the last tensor"],
    ["non-string metadata", header(`{"__metadata__":{"k":1}}`), undefined, "must be a string"],
    [
      "more tensors than the file can hold",
      header(`{"a":{"dtype":"F64","shape":[1000000],"data_offsets":[0,8000000]}}`, 16),
      undefined,
      "truncated",
    ],
  ];
  for (const [what, bytes, tensor, words] of cases) {
    test(what, () => {
      const p = file(bytes);
      const e = thrown(() => openSafetensors(p)) as TpError;
      expect(isTpError(e, "E_FORMAT")).toBe(true);
      expect(e.message).toContain(words);
      expect(e.file).toBe(p);
      expect(typeof e.offset).toBe("number");
      if (tensor !== undefined) expect(e.tensor).toBe(tensor);
    });
  }
});
