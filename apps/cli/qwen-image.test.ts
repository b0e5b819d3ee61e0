// `bun apps/cli generate` with Qwen-Image-2.1 as a user runs it: child processes on the tiny
// checkpoints of ../shared/testdata/qwen-image-tiny, through folders of links (so caches land in the
// test's temporary folder, never in ../shared): --model in both layouts, an RGBA PNG with its
// parameters chunk, the int4 caches (transformer and text encoder) built then hit, and the errors of
// the flags this model adds.
import { afterAll, describe, expect, test } from "bun:test";
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { decodePng } from "@tp/diffusion";
import { startMockHub } from "@tp/formats/testing/mock-hub";

const cli = resolve(import.meta.dir, "index.ts");
const run = (...args: string[]) => {
  const r = Bun.spawnSync([process.execPath, cli, ...args], { stdout: "pipe", stderr: "pipe" });
  return { code: r.exitCode, out: r.stdout.toString(), err: r.stderr.toString() };
};

const SHARED = resolve(import.meta.dir, "../..", "../shared");
const DIR = join(SHARED, "testdata/qwen-image-tiny");
const missing = [join(DIR, "diffusers/model_index.json"), join(DIR, "comfyui/vae")].filter(
  (p) => !existsSync(p),
);
const note = missing.length === 0 ? "" : ` [skipped: shared fixture missing: ${missing.join(", ")}]`;
const tmp = mkdtempSync(join(tmpdir(), "tp-cli-qimage-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

/** The diffusers folder as links, with real transformer/ and text_encoder/ folders (their caches are written there). */
function diffusersFolder(): string {
  const root = join(tmp, "diffusers");
  const own = ["transformer", "text_encoder"];
  mkdirSync(root, { recursive: true });
  for (const e of readdirSync(join(DIR, "diffusers"))) {
    if (!own.includes(e)) symlinkSync(join(DIR, "diffusers", e), join(root, e));
  }
  for (const d of own) {
    mkdirSync(join(root, d), { recursive: true });
    for (const f of readdirSync(join(DIR, "diffusers", d)))
      symlinkSync(join(DIR, "diffusers", d, f), join(root, d, f));
  }
  return root;
}

/** A ComfyUI folder (bf16 DiT) of links, with the Qwen repo's tokenizer and VAE config unless `partial`. */
function comfyFolder(name: string, partial = false): string {
  const root = join(tmp, name);
  const c = join(DIR, "comfyui");
  for (const d of ["diffusion_models", "text_encoders", "vae", "processor"])
    mkdirSync(join(root, d), { recursive: true });
  for (const f of [
    "diffusion_models/qwen_image_2.1_tiny_bf16.safetensors",
    "text_encoders/qwen3vl_8b_tiny_bf16.safetensors",
    "vae/qwen_image_2.1_vae_tiny_bf16.safetensors",
  ]) {
    symlinkSync(join(c, f), join(root, f));
  }
  if (!partial) {
    symlinkSync(join(DIR, "diffusers/processor/tokenizer.json"), join(root, "processor/tokenizer.json"));
    symlinkSync(join(DIR, "diffusers/vae/config.json"), join(root, "vae/config.json"));
  }
  return root;
}

/** The CLI as a child process without blocking this process (the mock hub answers it). */
async function runAsync(env: Record<string, string>, ...args: string[]) {
  const p = Bun.spawn([process.execPath, cli, ...args], {
    stdout: "pipe",
    stderr: "pipe",
    env: { ...process.env, ...env },
  });
  const [out, err] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text()]);
  return { code: await p.exited, out, err };
}

function tree(root: string): Record<string, Uint8Array> {
  const out: Record<string, Uint8Array> = {};
  for (const f of readdirSync(root, { recursive: true }) as string[]) {
    if (statSync(join(root, f)).isFile()) out[f] = new Uint8Array(readFileSync(join(root, f)));
  }
  return out;
}

describe(`generate with Qwen-Image-2.1${note}`, () => {
  test.skipIf(missing.length > 0)(
    "--model Qwen/Qwen-Image-2.1 from a mock hub (HF_ENDPOINT, HF_HOME): downloaded with progress once, then used as cached",
    async () => {
      using hub = startMockHub("Qwen/Qwen-Image-2.1", tree(join(DIR, "diffusers")));
      const env = { HF_ENDPOINT: hub.endpoint, HF_HOME: join(tmp, "hf"), HF_TOKEN: "" };
      const args = [
        "generate",
        "--model",
        "Qwen/Qwen-Image-2.1",
        "--prompt",
        "p",
        "--size",
        "64x64",
        "--steps",
        "2",
        "--f32",
      ];
      const a = await runAsync(env, ...args, "--out", join(tmp, "hub1.png"));
      expect([a.code, a.err.includes("error")]).toEqual([0, false]);
      expect(a.err).toMatch(
        /downloading transformer\/diffusion_pytorch_model-00001-of-00002\.safetensors .* MiB\/s {2}ETA/,
      );
      const n = hub.requests.length;
      const b = await runAsync(env, ...args, "--out", join(tmp, "hub2.png"));
      expect([b.code, b.err.includes("downloading")]).toEqual([0, false]);
      expect(hub.requests.length).toBe(n);
      expect(readFileSync(join(tmp, "hub1.png"))).toEqual(readFileSync(join(tmp, "hub2.png")));
      const listed = await runAsync(env, "models", "--json");
      const j = JSON.parse(listed.out);
      expect(j.known).toEqual(["Qwen/Qwen-Image-2.1", "Comfy-Org/Qwen-Image-2.1"]);
      expect(j.cached.map((c: { repo: string; complete: boolean }) => [c.repo, c.complete])).toEqual([
        ["Qwen/Qwen-Image-2.1", true],
      ]);
    },
    120000,
  );

  test.skipIf(missing.length > 0)(
    "--model in both layouts: the same RGBA PNG with its parameters; --q4 builds its cache once",
    () => {
      const comfy = comfyFolder("comfy");
      const diff = diffusersFolder();
      const common = [
        "--prompt",
        "a red cube on a white table",
        "--size",
        "64x96",
        "--steps",
        "2",
        "--seed",
        "5",
      ];
      const a = run("generate", "--model", comfy, ...common, "--f32", "--out", join(tmp, "a.png"));
      expect([a.code, a.err.includes("error")]).toEqual([0, false]);
      const b = run("generate", "--model", diff, ...common, "--f32", "--out", join(tmp, "b.png"));
      expect(b.code).toBe(0);
      const pa = decodePng(new Uint8Array(readFileSync(join(tmp, "a.png"))));
      const pb = decodePng(new Uint8Array(readFileSync(join(tmp, "b.png"))));
      expect([pa.width, pa.height]).toEqual([64, 96]);
      expect(Array.from(pa.rgba)).toEqual(Array.from(pb.rgba));
      expect(pa.text.parameters).toContain("a red cube on a white table\nSteps: 2, Sampler: Euler");
      expect(pa.text.parameters).toContain("Quantization: f32");
      expect(JSON.parse(pa.text.tensorpencil as string).model).toBe("qwen-image-2.1");
      // --latent-out → decode gives the same RGBA image
      const lat = run(
        "generate",
        "--model",
        comfy,
        ...common,
        "--f32",
        "--latent-out",
        join(tmp, "a.safetensors"),
        "--out",
        join(tmp, "a2.png"),
      );
      expect(lat.code).toBe(0);
      const dec = run(
        "decode",
        "--vae",
        join(comfy, "vae/qwen_image_2.1_vae_tiny_bf16.safetensors"),
        "--latent",
        join(tmp, "a.safetensors"),
        "--out",
        join(tmp, "a3.png"),
      );
      expect([dec.code, dec.err.includes("error")]).toEqual([0, false]);
      expect(Array.from(decodePng(new Uint8Array(readFileSync(join(tmp, "a3.png")))).rgba)).toEqual(
        Array.from(pa.rgba),
      );
      const q1 = run("generate", "--model", diff, ...common, "--q4", "--out", join(tmp, "c.png"));
      expect(q1.code).toBe(0);
      expect(q1.err).toContain("note: transformer int4 ConvRot cache built");
      expect(q1.err).toContain("note: text encoder int4 ConvRot cache built");
      for (const d of ["transformer", "text_encoder"])
        expect(readdirSync(join(diff, d)).some((f) => f.endsWith(".tp-q4.cache"))).toBe(true);
      const q2 = run(
        "generate",
        "--model",
        diff,
        ...common,
        "--q4",
        "--schedule",
        "comfy",
        "--out",
        join(tmp, "d.png"),
      );
      expect(q2.code).toBe(0);
      expect(q2.err).toContain("note: transformer int4 ConvRot cache hit");
      expect(q2.err).toContain("note: text encoder int4 ConvRot cache hit");
      // --te-mode beside --q4 wins for the text encoder alone
      const q3 = run(
        ...["generate", "--model", diff, ...common, "--q4", "--te-mode", "q8"],
        ...["--out", join(tmp, "d2.png")],
      );
      expect(q3.code).toBe(0);
      expect(q3.err).toContain("note: transformer int4 ConvRot cache hit");
      expect(q3.err).toContain("note: text encoder int8 ConvRot cache built");
      expect(q2.err).toMatch(/s\/step, ETA/);
    },
    120000,
  );

  test.skipIf(missing.length > 0)("errors: a partial folder, --q4 with --f32, --q4 on another model", () => {
    const partial = run(
      "generate",
      "--model",
      comfyFolder("partial", true),
      "--prompt",
      "p",
      "--out",
      join(tmp, "e.png"),
    );
    expect(partial.code).toBe(1);
    expect(partial.err.trim().split("\n")).toHaveLength(1);
    expect(partial.err).toContain("is missing: processor/tokenizer.json, vae/config.json");
    const both = run(
      "generate",
      "--model",
      comfyFolder("both"),
      "--prompt",
      "p",
      "--q4",
      "--f32",
      "--out",
      join(tmp, "f.png"),
    );
    expect(both.err).toContain("give --q4 or --f32, not both");
    const krea = join(SHARED, "testdata/krea2-tiny/checkpoints/krea2_tiny_bf16.safetensors");
    if (existsSync(krea)) {
      const other = run("generate", "--dit", krea, "--prompt", "p", "--q4", "--out", join(tmp, "g.png"));
      expect(other.err).toContain("--q4 is a Qwen-Image-2.1 flag");
    }
    expect(["e.png", "f.png", "g.png"].some((f) => existsSync(join(tmp, f)))).toBe(false);
  });
});
