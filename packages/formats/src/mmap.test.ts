// What Bun.mmap does on this Bun (the facts mmap.ts is designed around), and MappedFile on a sparse
// 5 GiB file: per-region views past 4 GiB, unaligned offsets, alignment kept, private mappings; and
// files the process may only read (Bun.mmap opens read-write; the libc fallback maps them).
import { afterAll, describe, expect, test } from "bun:test";
import { chmodSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { isTpError } from "@tp/tensor";
import { MAX_VIEW_BYTES, MappedFile, planRegions } from "./mmap.ts";
import { writeSafetensors } from "./safetensors/write.ts";
import { tempDir, thrown, writeSparse } from "./testing/util.ts";

const GiB = 2 ** 30;
const tmp = tempDir("mmap");
afterAll(tmp.cleanup);
const big = join(tmp.dir, "sparse-5g.bin");
const marker = new TextEncoder().encode("MARKER-past-4GiB");
const farOffset = 4.5 * GiB + 3; // unaligned and past 2^32
writeSparse(big, new TextEncoder().encode("head"), 5 * GiB, [[farOffset, marker]]);

describe("Bun.mmap on this Bun (design facts)", () => {
  test("one view of more than 2^32 bytes throws; exactly 2^32 works", () => {
    expect(() => Bun.mmap(big, { offset: 0, size: MAX_VIEW_BYTES + 1, shared: false })).toThrow();
    expect(() => Bun.mmap(big)).toThrow(); // the whole 5 GiB file
    expect(Bun.mmap(big, { offset: 4096, size: MAX_VIEW_BYTES, shared: false }).byteLength).toBe(
      MAX_VIEW_BYTES,
    );
  });

  test("an unaligned offset past 4 GiB maps the right bytes", () => {
    const v = Bun.mmap(big, { offset: farOffset, size: marker.length, shared: false });
    expect(new TextDecoder().decode(v)).toBe("MARKER-past-4GiB");
  });

  test("shared: false is copy-on-write: writing into the view leaves the file alone", () => {
    const small = join(tmp.dir, "cow.bin");
    writeSparse(small, new Uint8Array([1, 2, 3, 4]), 4);
    const v = Bun.mmap(small, { offset: 0, size: 4, shared: false });
    v[0] = 99;
    expect([...readFileSync(small)]).toEqual([1, 2, 3, 4]);
  });
});

describe("MappedFile", () => {
  test("regions hold whole spans, start on 4096-byte boundaries, and a huge span gets its own", () => {
    const r = planRegions(
      [
        { start: 10, end: 100 },
        { start: 100, end: 5000 },
        { start: 5000, end: 9000 },
        { start: 9000, end: 9000 + 3 * GiB },
      ],
      8192,
    );
    expect(r).toEqual([
      { start: 0, end: 5000 },
      { start: 4096, end: 9000 },
      { start: 8192, end: 9000 + 3 * GiB },
    ]);
  });

  test("views past 4 GiB in a 5 GiB file, lazily mapped per region", () => {
    const spans = [
      { start: 0, end: 4 },
      { start: farOffset, end: farOffset + marker.length },
    ];
    const m = new MappedFile(big, 5 * GiB, spans);
    expect(m.regionCount).toBe(2);
    expect(m.mappedCount).toBe(0);
    expect(new TextDecoder().decode(m.view(farOffset, marker.length, "far"))).toBe("MARKER-past-4GiB");
    expect(m.mappedCount).toBe(1);
    expect(new TextDecoder().decode(m.view(0, 4))).toBe("head");
    // An unplanned range still works, through its own mapping, and keeps the file offset's alignment.
    const v = m.view(4 * GiB + 12, 8);
    expect(v.byteOffset % 4).toBe(0);
    expect(m.mapAll()).toBe(2);
  });

  test("ranges outside the file are E_FORMAT; more than 4 GiB in one view is E_UNSUPPORTED", () => {
    const m = new MappedFile(big, 5 * GiB);
    const e1 = thrown(() => m.view(5 * GiB - 2, 10, "t"));
    expect(isTpError(e1, "E_FORMAT")).toBe(true);
    expect((e1 as Error).message).toContain("tensor t");
    expect(
      isTpError(
        thrown(() => m.view(-1, 1)),
        "E_FORMAT",
      ),
    ).toBe(true);
    expect(
      isTpError(
        thrown(() => m.view(0, 4.5 * GiB)),
        "E_UNSUPPORTED",
      ),
    ).toBe(true);
    m.close();
    expect(
      isTpError(
        thrown(() => m.view(0, 4)),
        "E_STATE",
      ),
    ).toBe(true);
  });
});

describe("files the process may only read", () => {
  // Bun.mmap opens files read-write; mapRange falls back to a read-only descriptor (mmap-readonly.ts).
  // Root may write anything, so as root the check runs as an unprivileged user through setpriv.
  const root = process.getuid?.() === 0;
  const setpriv = Bun.which("setpriv");
  // The unprivileged user must be able to read this checkout (not so under a private 0700 folder).
  const nobodyReads =
    !root ||
    (setpriv !== null &&
      Bun.spawnSync([
        setpriv,
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "test",
        "-r",
        import.meta.path,
      ]).exitCode === 0);
  const skip = process.platform !== "linux" || (root && setpriv === null) || !nobodyReads;
  test.skipIf(skip)(
    `a 0444 checkpoint in a read-only folder opens, maps, reads; writes stay private; mappings are freed${skip ? " [skipped: not Linux, root without setpriv, or the checkout is not readable by an unprivileged user]" : ""}`,
    () => {
      const base = join(tmp.dir, "readonly");
      const ro = join(base, "models");
      mkdirSync(ro, { recursive: true });
      chmodSync(tmp.dir, 0o755);
      chmodSync(base, 0o755);
      const file = join(ro, "w.safetensors");
      const data = new Uint8Array(3 * 4096 + 5).map((_, i) => i & 255);
      writeSafetensors(file, [{ name: "w", dtype: "U8", shape: [data.length], data }]);
      chmodSync(file, 0o444);
      chmodSync(ro, 0o555);
      const script = join(base, "read.ts");
      const formats = join(import.meta.dir, "index.ts");
      writeFileSync(
        script,
        `import { openSafetensors } from ${JSON.stringify(formats)};
let sum = 0;
for (let i = 0; i < 300; i++) {
  const f = openSafetensors(${JSON.stringify(file)});
  const v = f.data("w");
  for (let j = 0; j < v.length; j += 97) sum += v[j];
  v[0] = 255; // private: never reaches the file
  f.close();
  if (i % 100 === 99) Bun.gc(true);
}
console.log(JSON.stringify({ sum }));`,
      );
      chmodSync(script, 0o644);
      const cmd = root
        ? [setpriv as string, "--reuid=65534", "--regid=65534", "--clear-groups", process.execPath, script]
        : [process.execPath, script];
      const r = Bun.spawnSync(cmd, {
        env: { PATH: process.env.PATH ?? "", HOME: base, BUN_RUNTIME_TRANSPILER_CACHE_PATH: "0" },
        stdout: "pipe",
        stderr: "pipe",
      });
      chmodSync(ro, 0o755);
      expect(r.stderr.toString()).toBe("");
      let want = 0;
      for (let j = 0; j < data.length; j += 97) want += data[j] as number;
      expect(JSON.parse(r.stdout.toString())).toEqual({ sum: want * 300 });
      const back = readFileSync(file);
      expect(back.subarray(back.length - data.length).equals(Buffer.from(data))).toBe(true);
    },
  );
});
