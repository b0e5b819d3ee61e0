#!/usr/bin/env bun
/**
 * `bun run demo`: the main job — `bun apps/cli generate` — with no downloads. On first use it writes a
 * tiny Krea 2 DiT and a tiny Wan 2.1 VAE with deterministic RANDOM weights (the exact Krea 2 tensor
 * layouts, through @tp/formats' safetensors writer) and a random conditioning tensor into a cache
 * folder, then runs the real CLI on them. The picture is coloured noise — the weights are random — but
 * every stage runs: conditioning, DiT, Euler sampling, VAE decode, PNG with parameters.
 *
 * Folder: $TP_DEMO_DIR, else <tmpdir>/tensorpencil-demo. Extra arguments go to `generate` and win over
 * the demo's (e.g. `bun run demo -- --seed 7 --size 320x192 --out me.png`).
 */
import { existsSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import {
  randomConditioning,
  TINY_KREA2_CONFIG,
  TINY_WAN_VAE_CONFIG,
  writeConditioning,
  writeRandomKrea2Dit,
  writeRandomWanVae,
} from "@tp/diffusion";

const dir = process.env.TP_DEMO_DIR ?? join(tmpdir(), "tensorpencil-demo");
mkdirSync(dir, { recursive: true });
// The "-v1" names change whenever the generator changes, so a stale cache is never reused.
const dit = join(dir, "krea2-random-tiny-v1.safetensors");
const vae = join(dir, "wan21-vae-random-tiny-v1.safetensors");
const cond = join(dir, "conditioning-random-v1.safetensors");
const out = join(dir, "krea2-demo.png");
const prompt = "a lighthouse on a cliff at dawn (random weights: this text is not encoded)";

const line = "-".repeat(78);
console.error(`${line}
TensorPencil demo: Krea 2 text-to-image on the CPU with RANDOM weights.
The DiT and VAE below are tiny models in Krea 2's exact tensor layouts with random weights,
written by TensorPencil itself (no download); the picture is coloured noise, not a trained image.
Files: ${dir}
${line}`);
if (!existsSync(dit)) {
  console.error(
    `writing ${dit} (DiT: ${TINY_KREA2_CONFIG.layers} blocks × ${TINY_KREA2_CONFIG.features}, bf16)`,
  );
  writeRandomKrea2Dit(dit, TINY_KREA2_CONFIG, { dtype: "bf16", seed: 1 });
}
if (!existsSync(vae)) {
  console.error(`writing ${vae} (VAE: base width ${TINY_WAN_VAE_CONFIG.dim}, f32)`);
  writeRandomWanVae(vae, TINY_WAN_VAE_CONFIG, { seed: 2 });
}
if (!existsSync(cond)) {
  console.error(`writing ${cond} (conditioning: 16 tokens × 12 taps × ${TINY_KREA2_CONFIG.txtdim})`);
  const c = randomConditioning(16, TINY_KREA2_CONFIG.txtlayers * TINY_KREA2_CONFIG.txtdim, 3);
  writeConditioning(cond, { positive: c }, { prompt });
}

const cli = resolve(import.meta.dir, "../apps/cli/index.ts");
const args = [
  "generate",
  ...["--prompt", prompt, "--dit", dit, "--vae", vae, "--cond-in", cond],
  ...["--size", "256x256", "--steps", "8", "--seed", "0", "--out", out],
  ...process.argv.slice(2),
];
console.error(`$ bun apps/cli ${args.map((a) => (/[\s()]/.test(a) ? JSON.stringify(a) : a)).join(" ")}`);
const r = Bun.spawnSync([process.execPath, cli, ...args], { stdout: "inherit", stderr: "inherit" });
if (r.exitCode !== 0) process.exit(r.exitCode ?? 1);
console.error(`${line}
Done. With real checkpoints (ComfyUI's Krea 2 files) the same command is:
  bun apps/cli generate --prompt "…" --dit krea2_turbo_fp8_scaled.safetensors \\
    --vae qwen_image_vae.safetensors --text-encoder qwen3vl_4b_fp8_scaled.safetensors --out out.png
The Qwen3-VL text encoder is not in this build yet: until it lands, pass conditioning saved
elsewhere with --cond-in cond.safetensors (tensors 'positive' [1, seq, 12·2560] f32, optional
'negative') instead of --text-encoder. See apps/cli/README.md.
${line}`);
