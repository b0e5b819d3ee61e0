// Quantize-on-load caches (cache.ts) on small synthetic BF16 checkpoints in temporary folders: built
// once then mapped (a hit gives the same weights as quantizing directly); and every way a cache can go
// bad — the checkpoint's mtime changes, the cache is truncated, one byte flipped (data or header), a
// different version, other group sizes — is detected and rebuilt, never used. A read-only checkpoint
// folder sends the cache to the cache folder ($TP_CACHE_DIR), run as an unprivileged user when the
// tests run as root (root ignores folder permissions).
import { afterAll, describe, expect, test } from "bun:test";
import {
  chmodSync,
  closeSync,
  copyFileSync,
  ftruncateSync,
  mkdirSync,
  openSync,
  readdirSync,
  readSync,
  statSync,
  utimesSync,
  writeFileSync,
  writeSync,
} from "node:fs";
import { join, resolve } from "node:path";
import { loadWeight, openSafetensors } from "@tp/formats";
import {
  buildQuantCache,
  checkQuantCache,
  defaultQuantCacheDir,
  openQuantCache,
  QUANT_CACHE_VERSION,
  type QuantCacheOptions,
  quantCacheKey,
  quantCachePaths,
} from "./cache.ts";
import { planQuantization } from "./checkpoint.ts";
import { convRotFromWeight, quantizeConvRot } from "./convrot.ts";
import { tempFolder, writeTinyKrea2 } from "./testing/checkpoints.ts";

const tmp = tempFolder("cache");
afterAll(tmp.cleanup);
let seq = 0;
/** A fresh folder with a fresh checkpoint. */
function fresh(): { dir: string; ckpt: string; cacheDir: string } {
  const dir = join(tmp.dir, `case${seq++}`);
  mkdirSync(dir);
  const cacheDir = join(dir, "cache-home");
  return { dir, ckpt: writeTinyKrea2(join(dir, "tiny_bf16.safetensors"), { seed: 5 }), cacheDir };
}
const q8 = (cacheDir: string, extra: Partial<QuantCacheOptions> = {}): QuantCacheOptions => ({
  format: "int8_convrot",
  cacheDir,
  progress: null,
  ...extra,
});

function flipByte(path: string, at: number): void {
  const fd = openSync(path, "r+");
  const b = new Uint8Array(1);
  readSync(fd, b, 0, 1, at);
  b[0] = (b[0] as number) ^ 0x40;
  writeSync(fd, b, 0, 1, at);
  closeSync(fd);
}

describe("build, then map", () => {
  test("first run builds <name>.tp-q8.cache beside the checkpoint; the next run maps it (hit)", () => {
    const { dir, ckpt, cacheDir } = fresh();
    const a = openQuantCache(ckpt, q8(cacheDir));
    expect([a.status, a.path, a.reasons]).toEqual(["built", `${ckpt}.tp-q8.cache`, []]);
    a.source.close();
    const b = openQuantCache(ckpt, q8(cacheDir));
    expect(b.status).toBe("hit");
    // The hit serves ConvRot layers with markers, equal to quantizing directly, and the rest from the checkpoint.
    const name = "blocks.0.mlp.down.weight";
    const w = convRotFromWeight(loadWeight(b.source, name));
    const want = quantizeConvRot({ bytes: bf16Of(ckpt, name), dtype: "bf16" }, [256, 512]);
    expect([w.format, w.groupSize, w.shape]).toEqual(["int8_convrot", 256, [256, 512]]);
    expect(Buffer.from(w.data).equals(Buffer.from(want.data))).toBe(true);
    expect(b.source.files).toEqual([ckpt, `${ckpt}.tp-q8.cache`]);
    expect(loadWeight(b.source, "first.weight").format).toBe("bf16");
    b.source.close();
    expect(readdirSync(dir).sort()).toEqual(["tiny_bf16.safetensors", "tiny_bf16.safetensors.tp-q8.cache"]);
  });

  test("int4 gets its own .tp-q4.cache; the cache holds the codes the quantizer gives", () => {
    const { ckpt, cacheDir } = fresh();
    const r = openQuantCache(ckpt, { ...q8(cacheDir), format: "int4_convrot" });
    expect(r.path).toBe(`${ckpt}.tp-q4.cache`);
    const name = "blocks.0.attn.wq.weight";
    const got = convRotFromWeight(loadWeight(r.source, name));
    const want = quantizeConvRot({ bytes: bf16Of(ckpt, name), dtype: "bf16" }, [256, 256], {
      format: "int4_convrot",
    });
    expect(Buffer.from(got.data).equals(Buffer.from(want.data))).toBe(true);
    expect(Array.from(got.scale)).toEqual(Array.from(want.scale));
    r.source.close();
  });

  test("a progress reporter sees the bytes of the quantized layers, and stop", () => {
    const { ckpt, cacheDir } = fresh();
    let total = 0;
    let done = 0;
    let stopped = false;
    openQuantCache(ckpt, {
      ...q8(cacheDir),
      progress: { start: (t) => (total = t), advance: (b) => (done += b), stop: () => (stopped = true) },
    }).source.close();
    expect(total).toBe((5 * 256 * 256 + 3 * 256 * 512) * 2);
    expect([done, stopped]).toEqual([total, true]);
  });
});

describe("bad caches are detected and rebuilt, never used", () => {
  /** Build a cache, damage it, reopen: must be rebuilt, with the reason, and then be valid again. */
  function damaged(
    damage: (cache: string, ckpt: string) => void,
    reason: string,
    extra: Partial<QuantCacheOptions> = {},
  ) {
    const { ckpt, cacheDir } = fresh();
    openQuantCache(ckpt, q8(cacheDir)).source.close();
    const cache = `${ckpt}.tp-q8.cache`;
    damage(cache, ckpt);
    const r = openQuantCache(ckpt, q8(cacheDir, extra));
    expect(r.status).toBe("rebuilt");
    expect(r.reasons.length).toBe(1);
    expect(r.reasons[0]).toContain(reason);
    const name = "blocks.0.mlp.up.weight";
    const want = quantizeConvRot({ bytes: bf16Of(ckpt, name), dtype: "bf16" }, [512, 256], {
      groupSize: (extra.groupSize as number | undefined) ?? 256,
    });
    expect(
      Buffer.from(convRotFromWeight(loadWeight(r.source, name)).data).equals(Buffer.from(want.data)),
    ).toBe(true);
    r.source.close();
    expect(openQuantCache(ckpt, q8(cacheDir, extra)).status).toBe("hit");
  }

  test("stale: the checkpoint's modification time changed", () => {
    damaged((_, ckpt) => {
      const t = statSync(ckpt).mtime;
      utimesSync(ckpt, t, new Date(t.getTime() + 5000));
    }, "stale: the checkpoint changed");
  });

  test("stale: other group sizes than the cache was built with", () => {
    damaged(() => {}, "stale: different layers or group sizes", { groupSize: 64 });
  });

  test("truncated", () => {
    damaged((cache) => {
      const fd = openSync(cache, "r+");
      ftruncateSync(fd, statSync(cache).size - 100);
      closeSync(fd);
    }, "corrupt or truncated");
  });

  test("one flipped byte in the tensor data", () => {
    damaged((cache) => flipByte(cache, statSync(cache).size - 1000), "checksum mismatch");
  });

  test("one flipped byte in a tensor name of the header", () => {
    damaged((cache) => {
      const head = new Uint8Array(4096);
      const fd = openSync(cache, "r");
      readSync(fd, head, 0, head.length, 0);
      closeSync(fd);
      const at = new TextDecoder().decode(head).indexOf("blocks.0.attn.wk.weight_scale");
      expect(at).toBeGreaterThan(0);
      flipByte(cache, at + 7); // '0' → 'p': a tensor the plan does not know
    }, "corrupt: tensor blocks.0.attn.wk.weight_scale is missing");
  });

  test("wrong version", () => {
    damaged(
      (cache, ckpt) => {
        const src = openSafetensors(ckpt);
        const plan = planQuantization(src, { format: "int8_convrot" });
        buildQuantCache(cache, src, plan, { ...quantCacheKey(src, plan), version: QUANT_CACHE_VERSION + 1 });
        src.close();
      },
      `version ${QUANT_CACHE_VERSION + 1}, this build writes ${QUANT_CACHE_VERSION}`,
    );
  });

  test("a file that is not a cache at all", () => {
    damaged(
      (cache) => copyFileSync(cache.replace(/\.tp-q8\.cache$/, ""), cache),
      "not a TensorPencil quantization cache",
    );
  });

  test("checkQuantCache reports a missing file as 'missing'", () => {
    const { ckpt } = fresh();
    const src = openSafetensors(ckpt);
    const plan = planQuantization(src, { format: "int8_convrot" });
    expect(checkQuantCache(`${ckpt}.nothing`, quantCacheKey(src, plan), plan)).toEqual({
      ok: false,
      reason: "missing",
    });
    src.close();
  });
});

describe("where caches go", () => {
  test("cache folder: $TP_CACHE_DIR, else $XDG_CACHE_HOME/tensorpencil, else ~/.cache/tensorpencil", () => {
    expect(defaultQuantCacheDir({ TP_CACHE_DIR: "/a/b", XDG_CACHE_HOME: "/x" })).toBe("/a/b");
    expect(defaultQuantCacheDir({ TP_CACHE_DIR: "", XDG_CACHE_HOME: "/x" })).toBe("/x/tensorpencil");
    expect(defaultQuantCacheDir({})).toEndWith("/.cache/tensorpencil");
    const p = quantCachePaths("/m/tiny.safetensors", "int4_convrot", "/c");
    expect(p.beside).toBe("/m/tiny.safetensors.tp-q4.cache");
    expect(p.fallback).toMatch(/^\/c\/tiny\.safetensors-[0-9a-f]{16}\.tp-q4\.cache$/);
    expect(quantCachePaths("/n/tiny.safetensors", "int4_convrot", "/c").fallback).not.toBe(p.fallback);
  });

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
  const skip = (root && setpriv === null) || !nobodyReads;
  test.skipIf(skip)(
    `read-only checkpoint folder: the cache goes to $TP_CACHE_DIR, and is a hit there next time${skip ? " [skipped: running as root without setpriv to drop privileges, or the checkout is not readable by an unprivileged user]" : ""}`,
    () => {
      const base = join(tmp.dir, `ro${seq++}`);
      chmodSync(tmp.dir, 0o755); // mkdtemp makes 0700; the unprivileged user must reach `base`
      const ro = join(base, "models");
      const cacheDir = join(base, "cache");
      mkdirSync(ro, { recursive: true });
      mkdirSync(cacheDir);
      const ckpt = writeTinyKrea2(join(ro, "tiny_bf16.safetensors"), { seed: 9 });
      const script = join(base, "open.ts");
      const quant = resolve(import.meta.dir, "index.ts");
      writeFileSync(
        script,
        `import { openQuantCache } from ${JSON.stringify(quant)};
const r = openQuantCache(${JSON.stringify(ckpt)}, { format: "int8_convrot", progress: null });
console.log(JSON.stringify({ status: r.status, path: r.path }));`,
      );
      const nobody = 65534;
      for (const p of [base, cacheDir]) chmodSync(p, 0o777);
      chmodSync(script, 0o644);
      // The checkpoint is read-only too (0444, owned by someone else when run as root): @tp/formats maps
      // such files from a read-only descriptor.
      chmodSync(ckpt, 0o444);
      chmodSync(ro, 0o555);
      const run = () => {
        const cmd = root
          ? [
              setpriv as string,
              `--reuid=${nobody}`,
              `--regid=${nobody}`,
              "--clear-groups",
              process.execPath,
              script,
            ]
          : [process.execPath, script];
        const r = Bun.spawnSync(cmd, {
          env: {
            PATH: process.env.PATH ?? "",
            HOME: cacheDir,
            TP_CACHE_DIR: cacheDir,
            BUN_RUNTIME_TRANSPILER_CACHE_PATH: "0",
          },
          stdout: "pipe",
          stderr: "pipe",
        });
        expect(r.stderr.toString()).toBe("");
        return JSON.parse(r.stdout.toString()) as { status: string; path: string };
      };
      try {
        const first = run();
        expect(first.status).toBe("built");
        expect(first.path).toBe(quantCachePaths(ckpt, "int8_convrot", cacheDir).fallback);
        expect(readdirSync(ro)).toEqual(["tiny_bf16.safetensors"]);
        expect(run()).toEqual({ status: "hit", path: first.path });
      } finally {
        chmodSync(ro, 0o755);
      }
    },
  );
});

/** The BF16 bytes of a tensor of a checkpoint (through @tp/formats). */
function bf16Of(ckpt: string, name: string): Uint8Array {
  const src = openSafetensors(ckpt);
  const b = src.data(name).slice();
  src.close();
  return b;
}
