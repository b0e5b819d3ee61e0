// The streaming SafetensorsWriter: tensors written in any order (each in several pieces) give exactly
// the bytes of writeSafetensors; metadata can be filled in at commit when its length is unchanged; and
// every misuse is a TpError with nothing left under the final name (no temporary file either).
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import type { TpError } from "@tp/tensor";
import { randomBytes, tempDir, thrown } from "../testing/util.ts";
import { openSafetensors } from "./file.ts";
import { SafetensorsWriter, serializeSafetensors } from "./write.ts";

const tmp = tempDir("writer");
afterAll(tmp.cleanup);
const tensors = [
  { name: "b.weight", dtype: "I8", shape: [3, 5], data: randomBytes(15, 1) },
  { name: "a.scale", dtype: "F32", shape: [3, 1], data: randomBytes(12, 2) },
  { name: "c.marker", dtype: "U8", shape: [4], data: new TextEncoder().encode("{ok}") },
  { name: "d", dtype: "BF16", shape: [], data: randomBytes(2, 3) },
];
const specs = tensors.map(({ name, dtype, shape }) => ({ name, dtype, shape }));

describe("SafetensorsWriter", () => {
  test("any order, in pieces, equals the reference layout byte for byte; metadata filled in at commit", () => {
    const path = join(tmp.dir, "ok.safetensors");
    const w = new SafetensorsWriter(path, specs, { metadata: { sum: "0000" } });
    expect(existsSync(path)).toBe(false);
    for (const t of [...tensors].reverse()) {
      const half = t.data.length >> 1;
      w.write(t.name, t.data.subarray(0, half));
      w.write(t.name, t.data.subarray(half));
    }
    expect(w.missing()).toEqual([]);
    w.commit({ metadata: { sum: "beef" } });
    const want = serializeSafetensors(tensors, { metadata: { sum: "beef" } });
    expect(Buffer.from(readFileSync(path)).equals(Buffer.from(want))).toBe(true);
    expect(openSafetensors(path).metadata?.get("sum")).toBe("beef");
    expect(readdirSync(tmp.dir)).toEqual(["ok.safetensors"]);
  });

  test("misuse: unknown tensor or too many bytes (E_ARG), incomplete commit (E_STATE), longer metadata (E_ARG)", () => {
    const path = join(tmp.dir, "bad.safetensors");
    const w = new SafetensorsWriter(path, specs);
    expect((thrown(() => w.write("nope", new Uint8Array(1))) as TpError).code).toBe("E_ARG");
    expect((thrown(() => w.write("c.marker", new Uint8Array(5))) as TpError).code).toBe("E_ARG");
    w.write("c.marker", new Uint8Array(4));
    const e = thrown(() => w.commit()) as TpError;
    expect([e.code, e.message.startsWith("3 tensor(s) not completely written")]).toEqual(["E_STATE", true]);
    expect((thrown(() => w.write("d", new Uint8Array(2))) as TpError).code).toBe("E_STATE");
    expect(existsSync(path)).toBe(false);

    const w2 = new SafetensorsWriter(path, specs, { metadata: { sum: "00" } });
    for (const t of tensors) w2.write(t.name, t.data);
    expect((thrown(() => w2.commit({ metadata: { sum: "0".repeat(40) } })) as TpError).code).toBe("E_ARG");
    w2.abort();
    w2.abort(); // idempotent
    expect(readdirSync(tmp.dir).filter((f) => f.startsWith("bad"))).toEqual([]);
  });

  test("a folder that does not exist is E_IO naming the temporary file, keeping the system code", () => {
    const e = thrown(
      () => new SafetensorsWriter(join(tmp.dir, "no/such/dir/x.safetensors"), specs),
    ) as TpError;
    expect(e.code).toBe("E_IO");
    expect((e.cause as { code?: string }).code).toBe("ENOENT");
  });
});

test("a missing output folder is E_IO naming the output, not its temporary name", () => {
  const path = join(tmp.dir, "no-such-dir", "out.safetensors");
  const e = thrown(() => new SafetensorsWriter(path, specs)) as TpError;
  expect([e.code, e.file]).toEqual(["E_IO", path]);
  expect(e.message).toBe(`cannot create the output file: no such file or directory (file ${path})`);
});
