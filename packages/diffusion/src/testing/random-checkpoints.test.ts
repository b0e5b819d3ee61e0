// Random-weight checkpoints in the Krea 2 layouts: their names and shapes equal the krea2-tiny
// checkpoints made by ComfyUI's harness (when ../shared is present), they load through the real loaders,
// and a whole generation runs on them without any fixture (what `bun run demo` does). CPU backend.
import { afterAll, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { CpuBackend } from "@tp/backend-cpu";
import { identifyCheckpoint, openSafetensors } from "@tp/formats";
import { loadKrea2 } from "../models/krea2.ts";
import { loadWanVae } from "../models/wan-vae.ts";
import { generateKrea2 } from "../pipelines/krea2.ts";
import {
  krea2TensorSpecs,
  randomConditioning,
  TINY_KREA2_CONFIG,
  TINY_WAN_VAE_CONFIG,
  wanVaeTensorSpecs,
  writeRandomKrea2Dit,
  writeRandomWanVae,
} from "./random-checkpoints.ts";

const SHARED = resolve(import.meta.dir, "../../../..", "../shared");
const CKPTS = join(SHARED, "testdata/krea2-tiny/checkpoints");
const skipShared = !existsSync(join(CKPTS, "krea2_tiny_bf16.safetensors"));
const note = skipShared ? ` [skipped: shared fixture missing: ${CKPTS}]` : "";

const tmp = mkdtempSync(join(tmpdir(), "tp-random-ckpt-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

test.skipIf(skipShared)(`layouts equal the krea2-tiny checkpoints (names and shapes)${note}`, () => {
  const table = (path: string, keep: (n: string) => boolean) => {
    const src = openSafetensors(path);
    const m = Object.fromEntries(src.tensors.filter((t) => keep(t.name)).map((t) => [t.name, [...t.shape]]));
    src.close();
    return m;
  };
  const asTable = (specs: { name: string; shape: number[] }[]) =>
    Object.fromEntries(specs.map((s) => [s.name, s.shape]));
  expect(asTable(krea2TensorSpecs(TINY_KREA2_CONFIG))).toEqual(
    table(join(CKPTS, "krea2_tiny_bf16.safetensors"), () => true),
  );
  // the VAE file also holds the encoder half and conv1, which decoding never reads
  expect(asTable(wanVaeTensorSpecs(TINY_WAN_VAE_CONFIG))).toEqual(
    table(
      join(CKPTS, "wan21_vae_tiny_f32.safetensors"),
      (n) => n.startsWith("decoder.") || n.startsWith("conv2."),
    ),
  );
});

test("written files are deterministic, detected, loadable, and generate an image", async () => {
  const dit = join(tmp, "dit.safetensors");
  const vae = join(tmp, "vae.safetensors");
  writeRandomKrea2Dit(dit, TINY_KREA2_CONFIG, { seed: 1 });
  writeRandomWanVae(vae, TINY_WAN_VAE_CONFIG, { seed: 2 });
  const again = join(tmp, "dit2.safetensors");
  writeRandomKrea2Dit(again, TINY_KREA2_CONFIG, { seed: 1 });
  expect(readFileSync(again).equals(readFileSync(dit))).toBe(true);

  const src = openSafetensors(dit);
  expect(identifyCheckpoint(src).kind).toBe("krea2-dit");
  src.close();
  const b = new CpuBackend({ threads: 2 });
  const d = loadKrea2(dit, { backend: b });
  const v = loadWanVae(b, vae);
  expect(d.config).toMatchObject({
    features: 256,
    heads: 2,
    kvheads: 1,
    layers: 2,
    txtdim: 80,
    txtlayers: 12,
  });
  expect(v.config).toMatchObject({ z_dim: 16, dim: 4, scale: 8 });
  const r = await generateKrea2({
    dit: d,
    vae: v,
    conditioning: { positive: randomConditioning(5, 960, 3) },
    width: 48,
    height: 32,
    steps: 2,
    cfg: 2,
  });
  expect(r.rgb.length).toBe(48 * 32 * 3);
  expect(r.latent.every(Number.isFinite)).toBe(true);
  expect(new Set(r.rgb).size).toBeGreaterThan(16); // not a flat image
  d.dispose();
  v.dispose();
  expect(b.memory.current).toBe(0);
  b.dispose();
});
