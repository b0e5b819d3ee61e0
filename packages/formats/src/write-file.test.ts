// The atomic-write helper every writer goes through: exclusive, unpredictable temporary names that no
// planted link can redirect; the registry of live temporary files; stale temporary files of dead
// processes removed; all-or-nothing groups; ENOSPC named by the output; concurrent writers.
import { afterAll, describe, expect, test } from "bun:test";
import {
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import type { TpError } from "@tp/tensor";
import {
  AtomicFile,
  liveTemporaryFiles,
  removeStaleTemporaryFiles,
  setWriteNotice,
  temporaryPath,
  writeAllOrNothing,
  writeAtomically,
} from "./write-file.ts";

const tmp = mkdtempSync(join(tmpdir(), "tp-write-file-"));
const enc = (s: string) => new TextEncoder().encode(s);

function thrown(f: () => unknown): TpError {
  try {
    f();
  } catch (e) {
    return e as TpError;
  }
  throw new Error("expected an error");
}

/** A PID no process has: beyond Linux's pid_max limit (2^22). */
const DEAD_PID = 4_194_304 + 17;

describe("temporary names", () => {
  test("beside the output, carrying the PID and 64 random bits; never the same twice", () => {
    const names = new Set(Array.from({ length: 1000 }, () => temporaryPath("/a/b/x.png")));
    expect(names.size).toBe(1000);
    for (const n of names) expect(n).toMatch(new RegExp(`^/a/b/x\\.png\\.tmp-${process.pid}-[0-9a-f]{16}$`));
  });

  test("a symbolic link planted at the temporary name is not followed (O_EXCL | O_NOFOLLOW)", () => {
    const dir = join(tmp, "planted");
    mkdirSync(dir);
    const victim = join(dir, "victim.txt");
    writeFileSync(victim, "precious");
    const out = join(dir, "x.png");
    // The old predictable names, and the very name the next call draws (the CSPRNG stubbed once).
    for (let i = 0; i < 4; i++) symlinkSync(victim, `${out}.tmp-${process.pid}-${i}`);
    const planted = `${out}.tmp-${process.pid}-${"00".repeat(8)}`;
    symlinkSync(victim, planted);
    const real = crypto.getRandomValues.bind(crypto);
    let calls = 0;
    crypto.getRandomValues = (<T extends ArrayBufferView | null>(a: T): T => {
      calls++;
      return calls === 1 ? a : real(a as never);
    }) as typeof crypto.getRandomValues;
    try {
      writeAtomically(out, (w) => w(enc("image")));
    } finally {
      crypto.getRandomValues = real;
    }
    expect(calls).toBe(2); // the planted name was refused (EEXIST), a fresh one drawn
    expect(readFileSync(victim, "utf8")).toBe("precious");
    expect(lstatSync(out).isFile()).toBe(true);
    expect(readFileSync(out, "utf8")).toBe("image");
    expect(readlinkSync(planted)).toBe(victim); // left alone: not ours
    expect(liveTemporaryFiles()).toEqual([]);
  });

  test("an output that is a symbolic link is replaced by the file, the link's target untouched", () => {
    const dir = join(tmp, "outlink");
    mkdirSync(dir);
    const victim = join(dir, "victim.txt");
    writeFileSync(victim, "precious");
    const out = join(dir, "x.png");
    symlinkSync(victim, out);
    writeAtomically(out, (w) => w(enc("image")));
    expect(lstatSync(out).isFile()).toBe(true);
    expect(readFileSync(victim, "utf8")).toBe("precious");
  });
});

describe("registry and stale files", () => {
  test("a live temporary file is registered until commit or abort", () => {
    const out = join(tmp, "reg.bin");
    const f = new AtomicFile(out);
    expect(liveTemporaryFiles()).toEqual([f.tmpPath]);
    f.write(enc("abc"));
    f.abort();
    expect(liveTemporaryFiles()).toEqual([]);
    expect(readdirSync(tmp).filter((n) => n.startsWith("reg.bin"))).toEqual([]);
    const g = new AtomicFile(out);
    g.write(enc("abc"));
    g.commit();
    expect(liveTemporaryFiles()).toEqual([]);
    expect(readFileSync(out, "utf8")).toBe("abc");
  });

  test("a temporary file of a process that is gone is removed by the next write, with a notice", () => {
    const dir = join(tmp, "stale");
    mkdirSync(dir);
    const out = join(dir, "z.safetensors");
    const stale = [`${out}.tmp-${DEAD_PID}-0123456789abcdef`, `${out}.tmp-${DEAD_PID}-2.tmp-${DEAD_PID}-3`];
    for (const s of stale) writeFileSync(s, "half");
    // not removed: a running process's file (ours, PID 1's), another output's, a link
    const kept = [`${out}.tmp-1-00000000000000aa`, join(dir, `y.safetensors.tmp-${DEAD_PID}-1`)];
    for (const k of kept) writeFileSync(k, "other");
    symlinkSync("/nonexistent", `${out}.tmp-${DEAD_PID}-link`);
    const notes: string[] = [];
    setWriteNotice((t) => notes.push(t));
    try {
      writeAtomically(out, (w) => w(enc("ok")));
    } finally {
      setWriteNotice(() => {});
    }
    expect(readdirSync(dir).sort()).toEqual(
      [
        "z.safetensors",
        "z.safetensors.tmp-1-00000000000000aa",
        `y.safetensors.tmp-${DEAD_PID}-1`,
        `z.safetensors.tmp-${DEAD_PID}-link`,
      ].sort(),
    );
    expect(notes.sort()).toEqual(
      stale
        .map((s) => `removed ${s}, a temporary file left by process ${DEAD_PID}, which is no longer running`)
        .sort(),
    );
    expect(removeStaleTemporaryFiles(out)).toEqual([]);
  });
});

describe("writeAllOrNothing", () => {
  test("a failing writer inside names the output's flag and leaves nothing", () => {
    const dir = join(tmp, "group");
    mkdirSync(dir);
    const e = thrown(() =>
      writeAllOrNothing((stage) => {
        writeAtomically(stage("--cond-out", join(dir, "c.safetensors")), (w) => w(enc("c")));
        new AtomicFile(stage("--out", join(dir, "missing", "x.png")));
      }),
    );
    expect([e.code, e.message]).toEqual([
      "E_IO",
      `cannot create --out: no such file or directory (file ${join(dir, "missing", "x.png")})`,
    ]);
    expect(readdirSync(dir)).toEqual([]);
    expect(liveTemporaryFiles()).toEqual([]);
  });
});

// A full disk: a 64 KiB tmpfs where this machine lets the test mount one (root in a container with
// CAP_SYS_ADMIN); elsewhere the case is skipped, saying why.
const full = join(tmp, "full");
mkdirSync(full);
const mounted = Bun.spawnSync(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", full], { stderr: "pipe" });
const mountNote =
  mounted.exitCode === 0
    ? ""
    : ` [skipped: cannot mount a tmpfs here: ${mounted.stderr.toString().trim() || `exit ${mounted.exitCode}`}]`;
afterAll(() => {
  if (mounted.exitCode === 0) Bun.spawnSync(["umount", full]);
  rmSync(tmp, { recursive: true, force: true });
});

test.skipIf(mounted.exitCode !== 0)(
  `ENOSPC is E_IO naming the output and its flag, not the temporary file${mountNote}`,
  () => {
    const out = join(full, "x.png");
    const e = thrown(() =>
      writeAllOrNothing((stage) => writeAtomically(stage("--out", out), (w) => w(new Uint8Array(1 << 20)))),
    );
    expect([e.code, e.message]).toEqual([
      "E_IO",
      `cannot write --out: no space left on device (file ${out})`,
    ]);
    expect(readdirSync(full)).toEqual([]);
    const f = thrown(() => writeAtomically(out, (w) => w(new Uint8Array(1 << 20))));
    expect(f.message).toBe(`cannot write the output file: no space left on device (file ${out})`);
    expect(readdirSync(full)).toEqual([]);
  },
);

test("two processes writing one output at once: it is always one writer's whole file; no temporary left", async () => {
  const dir = join(tmp, "concurrent");
  mkdirSync(dir);
  const out = join(dir, "same.bin");
  const script = join(dir, "..", "writer.ts");
  writeFileSync(
    script,
    `import { writeAtomically } from ${JSON.stringify(resolve(import.meta.dir, "write-file.ts"))};
const [out, ch] = process.argv.slice(2);
const bytes = new Uint8Array(1 << 20).fill(ch.charCodeAt(0));
for (let i = 0; i < 20; i++) writeAtomically(out, (w) => { w(bytes.subarray(0, 1 << 19)); w(bytes.subarray(1 << 19)); });
`,
  );
  const procs = ["A", "B"].map((ch) => Bun.spawn([process.execPath, script, out, ch], { stderr: "pipe" }));
  const seen = new Set<string>();
  while (procs.some((p) => p.exitCode === null)) {
    try {
      const b = readFileSync(out);
      const first = b[0] as number;
      expect(b.length).toBe(1 << 20);
      expect(b.every((x) => x === first)).toBe(true); // never a mix, never short
      seen.add(String.fromCharCode(first));
    } catch (e) {
      if ((e as { code?: string }).code !== "ENOENT") throw e;
    }
    await Bun.sleep(1);
  }
  for (const p of procs) expect(await p.exited).toBe(0);
  expect(readdirSync(dir)).toEqual(["same.bin"]);
  expect(seen.size).toBeGreaterThan(0);
});
