// `bun apps/cli generate | decode | encode` as a user runs them: child processes on tiny checkpoints.
// With ../shared: ComfyUI's turbo_cfg1 run through the CLI (its conditioning written to a --cond-in file
// here), the PNG's pixels against ComfyUI's image and its parameters chunk, --latent-out → decode, and
// --cond-out. Always (random-weight checkpoints written by the test): a run with CFG, and every error —
// one `error E_CODE: …` line on stderr, exit 1 (2 for usage errors), and no file written.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { decodePng, readConditioning, writeConditioning, writeLatent } from "@tp/diffusion";
import {
  randomConditioning,
  TINY_KREA2_CONFIG,
  TINY_KREA2_TEXT_CONFIG,
  writeRandomKrea2Dit,
  writeRandomQwen3VlText,
  writeRandomWanVae,
} from "@tp/diffusion/testing";
import { loadBackend } from "@tp/tensor";

/** Bytes of the 8-bit image allowed off by one vs ComfyUI (measured 1 of 36,864; see the pipeline test). */
const MAX_BYTES_OFF_BY_ONE = 8;

const cli = resolve(import.meta.dir, "index.ts");
const run = (...args: string[]) => {
  const r = Bun.spawnSync([process.execPath, cli, ...args], { stdout: "pipe", stderr: "pipe" });
  return { code: r.exitCode, out: r.stdout.toString(), err: r.stderr.toString() };
};

// <repo root>/../shared; this file is apps/cli/, two levels below the root.
const SHARED = resolve(import.meta.dir, "../..", "../shared");
const DIR = join(SHARED, "testdata/krea2-tiny");
const RUN = join(DIR, "sampling/turbo_cfg1");
const DIT = join(DIR, "checkpoints/krea2_tiny_bf16.safetensors");
const VAE = join(DIR, "checkpoints/wan21_vae_tiny_f32.safetensors");
const needed = [DIT, VAE, join(RUN, "context_pos.bin"), join(RUN, "decoded_image01.bin")];
const missing = needed.filter((p) => !existsSync(p));
const skip = missing.length > 0;
const note = skip ? ` [skipped: shared fixture missing: ${missing.join(", ")}]` : "";

const tmp = mkdtempSync(join(tmpdir(), "tp-cli-generate-"));
const out = join(tmp, "out");
mkdirSync(out);
const rdit = join(tmp, "random-dit.safetensors");
const rvae = join(tmp, "random-vae.safetensors");
const rcond = join(tmp, "random-cond.safetensors");
const rte = join(tmp, "random-te.safetensors");
beforeAll(() => {
  writeRandomKrea2Dit(rdit, TINY_KREA2_CONFIG, { seed: 1 });
  writeRandomQwen3VlText(rte, TINY_KREA2_TEXT_CONFIG, { seed: 4 });
  writeRandomWanVae(rvae, undefined, { seed: 2 });
  writeConditioning(rcond, { positive: randomConditioning(4, 960, 3) }, { prompt: "saved prompt" });
}, 60_000);
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

function readF32(path: string): Float32Array {
  const b = readFileSync(path);
  return new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));
}

describe(`generate on ComfyUI's turbo_cfg1 run${note}`, () => {
  test.skipIf(skip)(
    "PNG pixels and parameters; --cond-out; --latent-out then decode",
    () => {
      const cond = join(tmp, "turbo-cond.safetensors");
      const positive = {
        data: readF32(join(RUN, "context_pos.bin")),
        shape: [1, 7, 960] as [number, number, number],
      };
      writeConditioning(cond, { positive });
      const dir = join(tmp, "turbo");
      mkdirSync(dir);
      const png = join(dir, "turbo.png");
      const latent = join(dir, "turbo-latent.safetensors");
      const condOut = join(dir, "turbo-cond-out.safetensors");
      const r = run(
        "generate",
        ...["--prompt", "a fluffy orange cat, sitting: on a windowsill"],
        ...["--dit", DIT, "--vae", VAE, "--cond-in", cond, "--dit-mode", "upcast", "--noise", "default"],
        ...["--width", "128", "--height", "96", "--steps", "4", "--seed", "42", "--threads", "2"],
        ...["--out", png, "--latent-out", latent, "--cond-out", condOut],
      );
      expect(r.err).not.toContain("error");
      expect(r.code).toBe(0);
      expect(r.out).toBe(`wrote ${png} (128x96, 4 steps, cfg 1, seed 42); also ${condOut}, ${latent}\n`);
      expect(r.err).toContain("sampling step 4/4");
      expect(r.err).toMatch(
        /timings: conditioning .*, load .*, text .*, sampling .* s\/step\), decode .*, write .*, total/,
      );
      expect(r.err).toMatch(/memory: peak .* on cpu, peak RSS .*, mapped weights [\d.]+ MiB \(page cache/);

      const img = decodePng(new Uint8Array(readFileSync(png)));
      expect([img.width, img.height]).toEqual([128, 96]);
      const ref = readF32(join(RUN, "decoded_image01.bin"));
      const plane = 128 * 96;
      let off = 0;
      let maxOff = 0;
      for (let c = 0; c < 3; c++) {
        for (let i = 0; i < plane; i++) {
          const d = Math.abs(
            Math.trunc(Math.fround(255 * (ref[c * plane + i] as number))) - (img.rgb[i * 3 + c] as number),
          );
          if (d) off++;
          maxOff = Math.max(maxOff, d);
        }
      }
      expect(maxOff).toBeLessThanOrEqual(1);
      expect(off).toBeLessThanOrEqual(MAX_BYTES_OFF_BY_ONE);
      expect(img.text.parameters).toBe(
        "a fluffy orange cat, sitting: on a windowsill\nSteps: 4, Sampler: Euler, Schedule type: Simple, CFG scale: 1.0, Seed: 42, Size: 128x96, Shift: 1.15, Model: krea2_tiny_bf16, VAE: wan21_vae_tiny_f32, Version: TensorPencil",
      );
      expect(JSON.parse(img.text.tensorpencil as string)).toMatchObject({
        prompt: "a fluffy orange cat, sitting: on a windowsill",
        seed: "42",
        steps: 4,
        schedule: "simple",
        noise: "default",
        dit_mode: "upcast",
      });
      expect(readConditioning(condOut).positive).toEqual(positive);

      const png2 = join(dir, "turbo-decoded.png");
      const d = run("decode", "--vae", VAE, "--latent", latent, "--out", png2, "--threads", "2");
      expect(d.code).toBe(0);
      expect(d.out).toBe(`wrote ${png2} (128x96)\n`);
      const img2 = decodePng(new Uint8Array(readFileSync(png2)));
      expect(img2.rgb).toEqual(img.rgb);
      expect(img2.text).toEqual(img.text); // the parameters travel with the latent
    },
    60_000,
  );
});

// The text encoder: ComfyUI's tiny Qwen3-VL encoder through `encode` (its conditioning against the
// golden), the tiny encoder's width (12 × 16) against the tiny DiT's (12 × 80) as an E_SHAPE error, and
// a whole run with a random tiny encoder whose width fits the random DiT.
const TE = join(DIR, "checkpoints/qwen3vl_tiny_te_bf16.safetensors");
const TE_COND = join(DIR, "te/prompt1_cond_bf16.bin");
const teMissing = [TE, TE_COND].filter((p) => !existsSync(p));
const teNote = teMissing.length > 0 ? ` [skipped: shared fixture missing: ${teMissing.join(", ")}]` : "";
/** `--te-mode upcast` vs ComfyUI's fp32 conditioning, relative to max |ref| (measured 5.3e-7). */
const UPCAST_COND_REL_TOL = 1e-5;

describe(`the text encoder through the CLI${teNote}`, () => {
  test.skipIf(teMissing.length > 0)(
    "encode: ComfyUI's tiny Qwen3-VL encoder; its 192-wide conditioning does not fit the tiny DiT",
    () => {
      const prompt = "a fluffy orange cat sitting on a windowsill";
      const dir = join(tmp, "te-encode");
      mkdirSync(dir);
      const cond = join(dir, "cond.safetensors");
      const r = run(
        ...["encode", "--text-encoder", TE, "--prompt", prompt, "--negative", ""],
        ...["--te-mode", "upcast", "--out", cond, "--threads", "2"],
      );
      expect(r.err).not.toContain("error");
      expect(r.code).toBe(0);
      expect(r.out).toBe(`wrote ${cond} (positive [1, 14, 192], negative [1, 5, 192])\n`);
      const saved = readConditioning(cond);
      const ref = readF32(TE_COND);
      let d = 0;
      let m = 0;
      for (let i = 0; i < ref.length; i++) {
        d = Math.max(d, Math.abs((saved.positive.data[i] as number) - (ref[i] as number)));
        m = Math.max(m, Math.abs(ref[i] as number));
      }
      expect(saved.positive.shape).toEqual([1, 14, 192]);
      expect(d / m).toBeLessThan(UPCAST_COND_REL_TOL);
      expect(saved.negative?.shape).toEqual([1, 5, 192]);
      expect(saved.metadata).toMatchObject({
        prompt,
        negative_prompt: "",
        text_encoder: "qwen3vl_tiny_te_bf16.safetensors",
        text_encoder_mode: "upcast",
      });

      const png = join(dir, "never.png");
      const g = run(
        ...["generate", "--prompt", prompt, "--dit", rdit, "--vae", rvae, "--text-encoder", TE],
        ...["--size", "32x32", "--steps", "1", "--out", png],
      );
      expect(`${g.code} ${g.err}`).toStartWith(
        `1 error E_SHAPE: the text encoder ${TE} gives conditioning 12×16 = 192 wide; the DiT ${rdit} takes 12×80 = 960`,
      );
      expect(g.err.trimEnd().split("\n").length).toBe(1);
      expect(readdirSync(dir)).toEqual(["cond.safetensors"]);
    },
    60_000,
  );

  test("generate end to end with a random tiny text encoder (cfg 2, a text negative), --cond-out = encode", () => {
    const dir = join(tmp, "te-run");
    mkdirSync(dir);
    const png = join(dir, "te.png");
    const condOut = join(dir, "te-cond.safetensors");
    const prompt = "a lighthouse on a cliff at dawn";
    const r = run(
      ...["generate", "--prompt", prompt, "--negative", "blurry", "--cfg", "2"],
      ...["--dit", rdit, "--vae", rvae, "--text-encoder", rte, "--size", "64x48", "--steps", "2"],
      ...["--out", png, "--cond-out", condOut, "--threads", "2"],
    );
    expect(r.err).not.toContain("error");
    expect(r.code).toBe(0);
    expect(r.out).toBe(`wrote ${png} (64x48, 2 steps, cfg 2, seed 0); also ${condOut}\n`);
    expect(r.err).toContain(
      "; text encoder random-te (Qwen3-VL (hidden size 80) text encoder, bf16, 36 layers",
    );
    const img = decodePng(new Uint8Array(readFileSync(png)));
    expect([img.width, img.height]).toEqual([64, 48]);
    expect(img.text.parameters).toStartWith(`${prompt}\nNegative prompt: blurry\nSteps: 2,`);
    expect(JSON.parse(img.text.tensorpencil as string)).toMatchObject({
      prompt,
      negative_prompt: "blurry",
      negative: "text",
      te_mode: "native",
      conditioning: "random-te.safetensors",
    });
    const saved = readConditioning(condOut);
    expect(saved.positive.shape[2]).toBe(960);

    const cond = join(dir, "encoded.safetensors");
    const e = run("encode", "--text-encoder", rte, "--prompt", prompt, "--negative", "blurry", "--out", cond);
    expect(e.code).toBe(0);
    const encoded = readConditioning(cond);
    expect(encoded.positive).toEqual(saved.positive);
    expect(encoded.negative).toEqual(saved.negative as NonNullable<typeof saved.negative>);

    // --cond-in with a negative prompt encoded by --text-encoder gives the same image
    const png2 = join(dir, "te2.png");
    const r2 = run(
      ...["generate", "--cond-in", cond, "--negative", "blurry", "--cfg", "2", "--text-encoder", rte],
      ...["--dit", rdit, "--vae", rvae, "--size", "64x48", "--steps", "2", "--out", png2, "--threads", "2"],
    );
    expect(r2.code).toBe(0);
    expect(decodePng(new Uint8Array(readFileSync(png2))).rgb).toEqual(img.rgb);
  }, 120_000);
});

/**
 * A folder this process cannot write to: chmod 0555 for an ordinary user; as root (who ignores
 * permissions) the immutable attribute, `chattr +i`, when the file system supports it. `skip` says
 * why the test cannot run here.
 */
const readOnly = (() => {
  const root = process.getuid?.() === 0;
  const chattr = Bun.which("chattr");
  const lock = (dir: string) => {
    if (root) Bun.spawnSync([chattr as string, "+i", dir]);
    else chmodSync(dir, 0o555);
  };
  const unlock = (dir: string) => {
    if (root) Bun.spawnSync([chattr as string, "-i", dir]);
    else chmodSync(dir, 0o755);
  };
  let skip: string | null = null;
  if (root && chattr === null) skip = "running as root without chattr to make a folder read-only";
  else {
    const probe = mkdtempSync(join(tmpdir(), "tp-cli-ro-"));
    try {
      lock(probe);
      try {
        writeFileSync(join(probe, "x"), "x");
        skip = `writing into a ${root ? "chattr +i" : "0555"} folder still succeeds here`;
      } catch {
        // read-only, as wanted
      } finally {
        unlock(probe);
      }
    } finally {
      rmSync(probe, { recursive: true, force: true });
    }
  }
  return { skip, lock, unlock };
})();

describe("generate, decode and encode on random-weight checkpoints", () => {
  test("a run with CFG (zeroed negative), a rounded size and the AuraFlow schedule", () => {
    const png = join(out, "random.png");
    const r = run(
      "generate",
      ...["--dit", rdit, "--vae", rvae, "--cond-in", rcond, "--size", "50x33", "--steps", "2"],
      ...[
        "--cfg",
        "2.5",
        "--schedule",
        "auraflow",
        "--sampler-shift",
        "1.15",
        "--out",
        png,
        "--threads",
        "1",
      ],
    );
    expect(r.code).toBe(0);
    expect(r.err).toStartWith(
      "note: size 50x33 is not a multiple of 8: generating 48x32 (latent 6x4), as ComfyUI does\n",
    );
    const img = decodePng(new Uint8Array(readFileSync(png)));
    expect([img.width, img.height]).toEqual([48, 32]);
    expect(img.text.parameters).toStartWith(
      "saved prompt\nSteps: 2, Sampler: Euler, Schedule type: Simple (AuraFlow shift), CFG scale: 2.5, Seed: 0, Size: 48x32, Shift: 1.15, Negative: ConditioningZeroOut, Model: random-dit",
    );
    rmSync(png);
  }, 60_000);

  test("--vram-budget: min on vulkan prints the plan and stays in it; cpu E_UNSUPPORTED; a bad size E_ARG", async () => {
    const png = join(out, "budget.png");
    const base = ["--dit", rdit, "--vae", rvae, "--cond-in", rcond, "--size", "32x32", "--steps", "2"];
    const bad = run("generate", ...base, "--out", png, "--vram-budget", "lots");
    expect(bad.err).toBe(
      "error E_ARG: --vram-budget takes min or a size such as 2GiB, 512M or 1048576 bytes, got 'lots'\n",
    );
    const cpu = run("generate", ...base, "--out", png, "--vram-budget", "min", "--threads", "1");
    expect(cpu.code).toBe(1);
    expect(cpu.err).toContain(
      "error E_UNSUPPORTED: --vram-budget: backend cpu reads weights from their mapping",
    );
    expect(existsSync(png)).toBe(false);
    let vulkan = true;
    try {
      (await loadBackend("vulkan")).dispose();
    } catch {
      vulkan = false; // no Vulkan device here: the rest needs one
    }
    if (!vulkan) return;
    const r = run("generate", ...base, "--out", png, "--vram-budget", "min", "--backend", "vulkan");
    expect(r.err).not.toContain("error");
    expect(r.code).toBe(0);
    const m =
      /note: residency: budget min = ([\d.]+) MiB; 0 weights resident \(0\.00 MiB\), (\d+) streamed/.exec(
        r.err,
      );
    expect(m).not.toBeNull();
    // the backend's peak from the first step on stays within min; the CLI's peak line covers the
    // whole run (the conditioning upload before it is smaller than a step)
    const peak = /memory: peak ([\d.]+) (KiB|MiB) on vulkan/.exec(r.err);
    expect(peak).not.toBeNull();
    const peakMiB = Number(peak?.[1]) / (peak?.[2] === "KiB" ? 1024 : 1);
    expect(peakMiB).toBeLessThanOrEqual(Number(m?.[1]) + 0.01); // both printed to 0.01
    rmSync(png);
    // No flag: the default budget (the device's free memory less the margin), said with --verbose;
    // the last line names the budget and the mapped weights (about the three input files).
    const d = run("generate", ...base, "--out", png, "--backend", "vulkan", "--verbose");
    expect(d.err).not.toContain("error");
    expect(d.code).toBe(0);
    const def =
      /note: default --vram-budget (\d+) MiB: (\d+) MiB free of (\d+) MiB \((.*?)\) less a margin of (\d+) MiB/.exec(
        d.err,
      );
    expect(def).not.toBeNull();
    if (!String(def?.[4]).startsWith("VK_EXT_memory_budget")) {
      expect(def?.[4]).toContain("no VK_EXT_memory_budget");
      expect(def?.[2]).toBe(def?.[3]); // the heap size stands in for free memory
      expect(d.err).toContain("memory other processes hold is not seen");
    }
    const plan = /note: residency: budget ([\d.]+) MiB; (\d+) weights resident .*, 0 streamed/.exec(d.err);
    expect(plan).not.toBeNull(); // the tiny DiT fits: everything resident
    const last =
      /memory: peak [\d.]+ (?:KiB|MiB) on vulkan \(budget ([\d.]+) (GiB|MiB)\), peak RSS [\d.]+ MiB, mapped weights ([\d.]+) (KiB|MiB) \(page cache/.exec(
        d.err,
      );
    expect(last).not.toBeNull();
    const mib = (v: string | undefined, u: string | undefined) =>
      Number(v) * (u === "GiB" ? 1024 : u === "KiB" ? 1 / 1024 : 1);
    const files = [rdit, rvae, rcond].map((f) => statSync(f).size / 2 ** 20);
    const mapped = mib(last?.[3], last?.[4]);
    expect(mapped).toBeGreaterThan(files[0] as number); // at least the DiT's tensors
    // headers are mapped on their own and regions start on 4 KiB pages below their first tensor:
    // a few KiB per file past the files' sizes
    expect(mapped).toBeLessThanOrEqual(files.reduce((x, y) => x + y, 0) + 64 / 1024);
    rmSync(png);
  }, 120_000);

  test("errors: one line, exit 1 (2 for usage), and nothing written", () => {
    const png = join(out, "never.png");
    const base = ["--dit", rdit, "--vae", rvae, "--cond-in", rcond, "--size", "32x32", "--steps", "1"];
    const gen = (...extra: string[]) => run("generate", ...base, "--out", png, ...extra);
    const smallCond = join(tmp, "cond-192.safetensors");
    writeConditioning(smallCond, { positive: randomConditioning(3, 192) });
    const te = join(tmp, "te.safetensors"); // an existing file that is not a text encoder
    writeConditioning(te, { positive: randomConditioning(1, 4) });
    // Latents decode refuses before reading their data: too wide, empty, effectively unbounded.
    const latent = (name: string, shape: number[]) => {
      const p = join(tmp, name);
      writeLatent(p, { data: new Float32Array(shape.reduce((a, b) => a * b, 1)), shape });
      return p;
    };
    const latent2100 = latent("latent-2100.safetensors", [1, 16, 1, 1, 2100]);
    const latentEmpty = latent("latent-empty.safetensors", [1, 16, 1, 0, 8]);
    const latentWide = latent("latent-wide.safetensors", [1, 16, 1, 1, 200000]);
    // A text encoder 12 × 64 wide: its width is checked against the DiT's 12 × 80 before it runs.
    const wideTe = join(tmp, "te-64.safetensors");
    writeRandomQwen3VlText(wideTe, { ...TINY_KREA2_TEXT_CONFIG, hidden_size: 64 }, { seed: 5 });
    const cases: [string[], number, string][] = [
      [
        ["generate", ...base.slice(0, 2), "--vae", join(tmp, "nope.safetensors"), "--cond-in", rcond],
        1,
        `error E_IO: --vae ${join(tmp, "nope.safetensors")}: no such file (the Wan 2.1 / Qwen-Image VAE) (file ${join(tmp, "nope.safetensors")})`,
      ],
      [
        ["generate", "--dit", rvae, "--vae", rvae, "--cond-in", rcond, "--size", "32x32", "--out", png],
        1,
        `error E_FORMAT: ${rvae} is not a Krea 2 DiT (no blocks.0.mod.lin + txtfusion.projector.weight) or Qwen-Image-2.1 transformer (no img_in.weight + modulation.1.weight): it looks like a Wan 2.1-family VAE`,
      ],
      [
        ["generate", "--dit", rdit, "--vae", rdit, "--cond-in", rcond, "--size", "32x32", "--out", png],
        1,
        "error E_FORMAT: not a Wan 2.1 VAE: conv2.weight, decoder.conv1.weight or decoder.head.0.gamma is missing",
      ],
      [
        ["generate", "--dit", rdit, "--vae", rvae, "--cond-in", rvae, "--size", "32x32", "--out", png],
        1,
        `error E_FORMAT: ${rvae} is not a conditioning file: no tensor 'positive'; it looks like a Wan 2.1-family VAE`,
      ],
      [
        ["generate", "--dit", rdit, "--vae", rvae, "--cond-in", smallCond, "--size", "32x32", "--out", png],
        1,
        "error E_SHAPE: the positive conditioning is [1, 3, 192]; this DiT takes [1, seq ≥ 1, 12×80 = 960]",
      ],
      [
        ["generate", "--prompt", "p", "--dit", rdit, "--vae", rvae, "--text-encoder", te, "--out", png],
        1,
        `error E_FORMAT: ${te} is not a Qwen3-VL text encoder`,
      ],
      [
        [
          ...["generate", "--prompt", "p", "--dit", rdit, "--vae", rvae, "--text-encoder", rte],
          "--te-mode",
          "fast",
        ],
        2,
        "error E_ARG: unknown --te-mode 'fast'; expected one of: native, upcast",
      ],
      [
        [...["generate", ...base, "--out", png], "--cfg", "3", "--negative", "blurry"],
        2,
        "error E_ARG: --negative needs --text-encoder F (to encode it) or a 'negative' tensor in --cond-in",
      ],
      [
        ["generate", ...base.slice(0, 6), "--size", "8x4096", "--out", png],
        2,
        "error E_ARG: --size must be WIDTHxHEIGHT with each side an integer from 16 to 16384 (e.g. 1024x768), got '8x4096'",
      ],
      [
        ["generate", ...base.slice(0, 6), "--size", "0x0", "--out", png],
        2,
        "error E_ARG: --size must be WIDTHxHEIGHT with each side an integer from 16 to 16384 (e.g. 1024x768), got '0x0'",
      ],
      [
        ["generate", ...base.slice(0, 6), "--size", "15x16", "--out", png],
        2,
        "error E_ARG: --size must be WIDTHxHEIGHT with each side an integer from 16 to 16384 (e.g. 1024x768), got '15x16'",
      ],
      [
        ["generate", ...base.slice(0, 6), "--width", "15", "--out", png],
        2,
        "error E_ARG: --width must be an integer from 16 to 16384, got '15'",
      ],
      [
        ["generate", ...base.slice(0, 6), "--height", "16385", "--out", png],
        2,
        "error E_ARG: --height must be an integer from 16 to 16384, got '16385'",
      ],
      [
        ["generate", ...base, "--out", png, "--steps", "1001"],
        2,
        "error E_ARG: --steps must be an integer from 1 to 1000, got '1001'",
      ],
      [
        ["generate", ...base, "--out", png, "--sampler-shift", "89"],
        2,
        "error E_ARG: --sampler-shift must be a positive number up to 88.72283905206835 with --schedule simple (above it e^shift overflows float32 and the sigmas are NaN), got '89'",
      ],
      [
        ["generate", ...base, "--out", png, "--schedule", "auraflow", "--sampler-shift", "4e38"],
        2,
        "error E_ARG: --sampler-shift must be a positive number up to 3.4028234663852886e+38 with --schedule auraflow",
      ],
      [
        ["generate", ...base, "--out", png, "--cond-out", rcond],
        2,
        `error E_ARG: --cond-out ${rcond} is the same file as --cond-in ${rcond}; writing it would overwrite the input`,
      ],
      [
        ["generate", ...base, "--out", png, "--cond-out", join(tmp, ".", "random-cond.safetensors")],
        2,
        `error E_ARG: --cond-out ${join(tmp, ".", "random-cond.safetensors")} is the same file as --cond-in ${rcond}`,
      ],
      [
        ["generate", ...base, "--out", png, "--latent-out", rdit],
        2,
        `error E_ARG: --latent-out ${rdit} is the same file as --dit ${rdit}`,
      ],
      [
        [
          ...["generate", ...base, "--out", png],
          ...["--latent-out", join(out, "z.safetensors"), "--cond-out", `${out}/../out/z.safetensors`],
        ],
        2,
        `error E_ARG: --cond-out ${out}/../out/z.safetensors and --latent-out ${join(out, "z.safetensors")} are the same file; one would overwrite the other`,
      ],
      [
        ["decode", "--vae", rvae, "--latent", latent2100, "--out", png],
        1,
        `error E_SHAPE: the latent is [1, 16, 1, 1, 2100]; Krea 2 decodes [1, 16, 1, h, w] f32 with h and w from 2 to 2048 (images of 16 to 16384 pixels per side) (file ${latent2100}, tensor latent)`,
      ],
      [
        ["decode", "--vae", rvae, "--latent", latentEmpty, "--out", png],
        1,
        `error E_SHAPE: the latent is [1, 16, 1, 0, 8]; Krea 2 decodes [1, 16, 1, h, w] f32 with h and w from 2 to 2048 (images of 16 to 16384 pixels per side) (file ${latentEmpty}, tensor latent)`,
      ],
      [
        ["decode", "--vae", rvae, "--latent", latentWide, "--out", png],
        1,
        `error E_SHAPE: the latent is [1, 16, 1, 1, 200000]; Krea 2 decodes [1, 16, 1, h, w] f32`,
      ],
      [
        ["encode", "--text-encoder", rte, "--prompt", "p", "--out", `${tmp}/./random-te.safetensors`],
        2,
        `error E_ARG: --out ${tmp}/./random-te.safetensors is the same file as --text-encoder ${rte}`,
      ],
      [
        [
          ...["generate", "--prompt", "p", "--dit", rdit, "--vae", rvae, "--text-encoder", wideTe],
          ...["--size", "32x32", "--out", png],
        ],
        1,
        `error E_SHAPE: the text encoder ${wideTe} gives conditioning 12×64 = 768 wide; the DiT ${rdit} takes 12×80 = 960: pass the text encoder that belongs to this DiT`,
      ],
      [
        ["generate", ...base, "--out", join(tmp, "no-such-dir", "x.png")],
        1,
        `error E_IO: --out ${join(tmp, "no-such-dir", "x.png")}: the folder ${join(tmp, "no-such-dir")} does not exist`,
      ],
      [
        ["generate", ...base, "--out", png, "--steps", "x"],
        2,
        "error E_ARG: --steps must be an integer from 1 to 1000, got 'x'",
      ],
      [
        ["generate", ...base, "--out", png, "--cfg", "abc"],
        2,
        "error E_ARG: --cfg must be a finite number, got 'abc'",
      ],
      [
        ["generate", ...base, "--out", png, "--seed", "1.5"],
        2,
        "error E_ARG: --seed must be an integer from 0 to 18446744073709551615, got '1.5'",
      ],
      [
        ["generate", ...base, "--out", png, "--width", "64"],
        2,
        "error E_ARG: give either --size WxH or --width/--height, not both",
      ],
      [
        ["generate", ...base, "--out", png, "--schedule", "karras"],
        2,
        "error E_ARG: unknown --schedule 'karras'; expected one of: simple, auraflow",
      ],
      [
        ["generate", ...base, "--out", join(out, "x.jpg")],
        2,
        `error E_ARG: --out must end in .png, got '${join(out, "x.jpg")}'`,
      ],
      [
        ["generate", ...base, "--out", png, "--bogus"],
        2,
        "error E_ARG: unknown flag --bogus for generate; see 'bun apps/cli generate --help'",
      ],
      [
        ["generate", ...base, "--out", png, "--stpes", "2"],
        2,
        "error E_ARG: unknown flag --stpes for generate; did you mean --steps?",
      ],
      [
        ["decode", "--vae", rvae, "--latnet", rcond, "--out", png],
        2,
        "error E_ARG: unknown flag --latnet for decode; did you mean --latent?",
      ],
      [
        ["generate", "--dit", rdit, "--vae", rvae],
        2,
        "error E_ARG: generate needs --prompt (or --cond-in with saved conditioning)",
      ],
      [
        ["generate", "--prompt", "p", "--dit", rdit, "--vae", rvae, "--out", png],
        2,
        "error E_ARG: missing --text-encoder (the Qwen3-VL text encoder, or pass --cond-in)",
      ],
      [
        ["decode", "--vae", rvae, "--latent", rcond, "--out", png],
        1,
        `error E_FORMAT: ${rcond} is not a latent file: no tensor 'latent'`,
      ],
      [
        ["encode", "--text-encoder", te, "--prompt", "p", "--out", join(out, "c.safetensors")],
        1,
        `error E_FORMAT: ${te} is not a Qwen3-VL text encoder`,
      ],
      [
        ["encode", "--text-encoder", te, "--prompt", "p"],
        2,
        "error E_ARG: encode needs --out cond.safetensors",
      ],
      // an over-long text is named as the flag it came from (5000 × "cat " = 5006 templated tokens)
      [
        [
          ...["encode", "--pipeline", "krea2", "--text-encoder", rte, "--prompt", "p"],
          "--negative",
          "cat ".repeat(5000),
          "--out",
          join(out, "c.safetensors"),
        ],
        2,
        "error E_ARG: the negative prompt is 5006 tokens in Krea 2's template; Krea 2 runs take at most 4096",
      ],
      [
        [
          ...["encode", "--pipeline", "krea2", "--text-encoder", rte, "--negative", "p"],
          "--prompt",
          "cat ".repeat(5000),
          "--out",
          join(out, "c.safetensors"),
        ],
        2,
        "error E_ARG: the prompt is 5006 tokens in Krea 2's template; Krea 2 runs take at most 4096",
      ],
    ];
    for (const [args, code, start] of cases) {
      const r = run(...args);
      expect(`${r.code} ${r.err}`).toStartWith(`${code} ${start}`);
      expect(
        r.err
          .trimEnd()
          .split("\n")
          .filter((l) => l.startsWith("error ")).length,
      ).toBe(1);
      expect(r.err.endsWith("\n")).toBe(true);
      expect(r.out).toBe("");
      expect(readdirSync(out)).toEqual([]); // no output, no temporary file
    }
    expect(gen().code).toBe(0); // the same base flags do work
    expect(readdirSync(out)).toEqual(["never.png"]);
    rmSync(png);
  }, 120_000);

  test.skipIf(readOnly.skip !== null)(
    `a read-only output folder is found before any work; no --latent-out / --cond-out left behind${readOnly.skip ? ` [skipped: ${readOnly.skip}]` : ""}`,
    () => {
      const ro = join(tmp, "read-only");
      mkdirSync(ro);
      const ok = join(tmp, "writable");
      mkdirSync(ok);
      readOnly.lock(ro);
      try {
        const png = join(ro, "x.png");
        const r = run(
          ...["generate", "--dit", rdit, "--vae", rvae, "--cond-in", rcond, "--size", "32x32"],
          ...["--steps", "1", "--out", png, "--latent-out", join(ok, "z.safetensors")],
          ...["--cond-out", join(ok, "c.safetensors")],
        );
        expect(r.err).toStartWith(`error E_IO: --out ${png}: the folder ${ro} is not writable`);
        expect(r.err).not.toContain("sampling"); // found before any work
        expect(r.code).toBe(1);
        const d = run("decode", "--vae", rvae, "--latent", rcond, "--out", png);
        expect(d.err).toStartWith(`error E_IO: --out ${png}: the folder ${ro} is not writable`);
        const e = run("encode", "--text-encoder", rte, "--prompt", "p", "--out", join(ro, "c.safetensors"));
        expect(e.err).toStartWith(
          `error E_IO: --out ${join(ro, "c.safetensors")}: the folder ${ro} is not writable`,
        );
        expect(readdirSync(ro)).toEqual([]);
        expect(readdirSync(ok)).toEqual([]);
      } finally {
        readOnly.unlock(ro);
      }
    },
    60_000,
  );

  test("help lists the commands", () => {
    const r = run("help");
    expect(r.out).toContain("  generate --prompt P --dit F --vae F (--text-encoder F | --cond-in F)");
    expect(r.out).toContain("  decode --vae F --latent F");
    expect(r.out).toContain("  encode --text-encoder F --prompt P");
  });
});
