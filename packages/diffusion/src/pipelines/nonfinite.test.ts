// Non-finite numbers are errors (issue 21 item 3): one NaN or ∞ planted in a weight of the tiny Krea 2
// DiT, VAE or a saved latent / conditioning stops the run with E_NUMERIC naming the stage and step, and
// the scan after the failure names the first tensor of the file holding it — instead of an all-black
// PNG; saved latents and conditioning holding NaN are refused when read and when written.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CpuBackend } from "@tp/backend-cpu";
import { openSafetensors, writeSafetensors } from "@tp/formats";
import { isTpError } from "@tp/tensor";
import { loadKrea2 } from "../models/krea2.ts";
import { loadWanVae } from "../models/wan-vae.ts";
import { KREA2_TINY, readF32, TURBO_CFG1 } from "../testing/fixtures.ts";
import { readConditioning, readLatent, writeConditioning, writeLatent } from "./files.ts";
import { decodeKrea2Latent, generateKrea2 } from "./krea2.ts";
import { KREA2_PIPELINE } from "./krea2-pipeline.ts";

const RUN = join(KREA2_TINY, "sampling/turbo_cfg1");
const DIT = join(KREA2_TINY, "checkpoints/krea2_tiny_bf16.safetensors");
const FP8 = join(KREA2_TINY, "checkpoints/krea2_tiny_fp8_scaled.safetensors");
const INT8 = join(KREA2_TINY, "checkpoints/krea2_tiny_int8_convrot.safetensors");
const VAE = join(KREA2_TINY, "checkpoints/wan21_vae_tiny_f32.safetensors");
const TE = join(KREA2_TINY, "checkpoints/qwen3vl_tiny_te_bf16.safetensors");
const missing = [DIT, FP8, INT8, VAE, TE, join(RUN, "context_pos.bin")].filter((p) => !existsSync(p));
const note = missing.length > 0 ? ` [skipped: shared fixture missing: ${missing.join(", ")}]` : "";

const tmp = mkdtempSync(join(tmpdir(), "tp-nonfinite-"));
const backend = new CpuBackend({ threads: 2 });
afterAll(() => {
  backend.dispose();
  rmSync(tmp, { recursive: true, force: true });
});

/** A copy of a safetensors file in tmp with element `index` of `tensor` set to the bytes `value`. */
function plant(src: string, tensor: string, index: number, value: Uint8Array, name: string): string {
  const f = openSafetensors(src);
  const out = join(tmp, name);
  try {
    const tensors = f.tensors.map((t) => {
      const data = f.data(t.name).slice();
      if (t.name === tensor) data.set(value, index * value.length);
      return { name: t.name, dtype: t.dtype, shape: [...t.shape], data };
    });
    writeSafetensors(out, tensors as never, { metadata: Object.fromEntries(f.metadata ?? []) });
  } finally {
    f.close();
  }
  return out;
}
const BF16_NAN = new Uint8Array([0xc0, 0x7f]);
const F32_NAN = new Uint8Array(new Float32Array([Number.NaN]).buffer);

const positive = () => ({
  data: readF32(join(RUN, "context_pos.bin")),
  shape: [1, 7, 960] as [number, number, number],
});

async function run(dit: string, vae: string) {
  using d = loadKrea2(dit, { backend });
  using v = loadWanVae(backend, vae);
  return await generateKrea2({
    dit: d,
    vae: v,
    conditioning: { positive: positive() },
    ...TURBO_CFG1,
  });
}

async function failure(f: () => Promise<unknown>): Promise<{ code: string; message: string }> {
  try {
    await f();
  } catch (e) {
    if (isTpError(e)) return { code: e.code, message: e.message };
    throw e;
  }
  return { code: "ok", message: "" };
}

describe(`E_NUMERIC at the stage that first holds NaN / ∞, naming the damaged tensor${note}`, () => {
  test.skipIf(missing.length > 0)(
    "a NaN in blocks.0.attn.wq.weight (bf16 DiT): sampling step 1 of 4, the DiT file's tensor",
    async () => {
      const dit = plant(DIT, "blocks.0.attn.wq.weight", 1000, BF16_NAN, "nan-wq.safetensors");
      const e = await failure(() => run(dit, VAE));
      expect(e.code).toBe("E_NUMERIC");
      expect(e.message).toContain("sampling step 1 of 4: ");
      expect(e.message).toContain(
        `the DiT file ${dit} holds NaN in tensor blocks.0.attn.wq.weight (element 1000)`,
      );
      expect(backend.memory.current).toBe(0);
    },
  );
  test.skipIf(missing.length > 0)(
    "an fp8 NaN byte 0x7f in a scaled-fp8 weight is named the same way",
    async () => {
      const f = openSafetensors(FP8);
      const fp8 = f.tensors.find((t) => t.dtype === "F8_E4M3" && t.name.startsWith("blocks.1."));
      f.close();
      expect(fp8).toBeDefined();
      const name = fp8?.name as string;
      const dit = plant(FP8, name, 3, new Uint8Array([0x7f]), "nan-fp8.safetensors");
      const e = await failure(() => run(dit, VAE));
      expect(e.code).toBe("E_NUMERIC");
      expect(e.message).toContain("sampling step 1 of 4");
      expect(e.message).toContain(`holds NaN in tensor ${name} (element 3)`);
    },
  );
  test.skipIf(missing.length > 0)(
    "a NaN INT8 ConvRot row scale: sampling step 1, naming the scale tensor",
    async () => {
      const dit = plant(INT8, "blocks.1.mlp.down.weight_scale", 17, F32_NAN, "nan-int8-scale.safetensors");
      const e = await failure(() => run(dit, VAE));
      expect(e.code).toBe("E_NUMERIC");
      expect(e.message).toContain("sampling step 1 of 4");
      expect(e.message).toContain("holds NaN in tensor blocks.1.mlp.down.weight_scale (element 17)");
    },
  );
  test.skipIf(missing.length > 0)("an ∞ in last.linear.bias: the first step's latent", async () => {
    const dit = plant(DIT, "last.linear.bias", 5, new Uint8Array([0x80, 0x7f]), "inf-last.safetensors");
    const e = await failure(() => run(dit, VAE));
    expect(e.code).toBe("E_NUMERIC");
    expect(e.message).toContain("sampling step 1 of 4");
    expect(e.message).toContain("holds Infinity in tensor last.linear.bias (element 5)");
  });
  test.skipIf(missing.length > 0)(
    "a NaN VAE weight: the VAE decode, naming the VAE file's tensor",
    async () => {
      const vae = plant(VAE, "decoder.conv1.bias", 7, F32_NAN, "nan-vae.safetensors");
      const e = await failure(() => run(DIT, vae));
      expect(e.code).toBe("E_NUMERIC");
      expect(e.message).toContain("VAE decode: ");
      expect(e.message).toContain(`the VAE file ${vae} holds NaN in tensor decoder.conv1.bias (element 7)`);
      const l = { data: new Float32Array(16 * 4 * 4).fill(0.1), shape: [1, 16, 1, 4, 4] };
      using v = loadWanVae(backend, vae);
      const d = await failure(() => decodeKrea2Latent(v, l));
      expect(d.code).toBe("E_NUMERIC");
      expect(d.message).toContain("VAE decode: ");
    },
  );
  test.skipIf(missing.length > 0)(
    "device conditioning with an ∞: the conditioning stage, before the DiT runs",
    async () => {
      using d = loadKrea2(DIT, { backend });
      using v = loadWanVae(backend, VAE);
      const pos = positive();
      pos.data[100] = Number.NEGATIVE_INFINITY;
      const e = await failure(() =>
        generateKrea2({ dit: d, vae: v, conditioning: { positive: pos }, ...TURBO_CFG1 }),
      );
      expect(e.code).toBe("E_NUMERIC");
      expect(e.message).toContain("conditioning (positive): 1 of 6720 values is NaN or infinite");
    },
  );
  test.skipIf(missing.length > 0)(
    "encode with a NaN text-encoder weight: the conditioning stage, naming the encoder's tensor; nothing returned",
    async () => {
      const name = "model.language_model.layers.0.input_layernorm.weight";
      const te = plant(TE, name, 2, BF16_NAN, "nan-te.safetensors");
      const e = await failure(() => KREA2_PIPELINE.encode({ textEncoder: te, backend, prompt: "a cat" }));
      expect(e.code).toBe("E_NUMERIC");
      expect(e.message).toContain("conditioning (positive): ");
      expect(e.message).toContain(`the text encoder file ${te} holds NaN in tensor ${name} (element 2)`);
      expect(backend.memory.current).toBe(0);
    },
  );
  test("saved latents and conditioning with NaN are refused when read and when written, naming the file", async () => {
    const good = { data: new Float32Array(16 * 2 * 2).fill(0.5), shape: [1, 16, 1, 2, 2] };
    const bad = { data: good.data.slice(), shape: good.shape };
    bad.data[9] = Number.NaN;
    const out = join(tmp, "bad-latent.safetensors");
    const w = await failure(async () => writeLatent(out, bad));
    expect(w.code).toBe("E_NUMERIC");
    expect(w.message).toContain("the latent to write: 1 of 64 values is NaN or infinite");
    expect(existsSync(out)).toBe(false);
    // A file with a NaN written by another program (the raw writer), read back.
    const raw = join(tmp, "raw-latent.safetensors");
    writeSafetensors(raw, [
      { name: "latent", dtype: "F32", shape: [1, 16, 1, 2, 2], data: new Uint8Array(bad.data.buffer) },
    ]);
    const r = await failure(async () => readLatent(raw));
    expect(r.code).toBe("E_NUMERIC");
    expect(r.message).toContain(
      `the saved latent: 1 of 64 values is NaN or infinite (file ${raw}, tensor latent)`,
    );
    const c = { data: new Float32Array(2 * 48).fill(1), shape: [1, 2, 48] as [number, number, number] };
    c.data[0] = Number.POSITIVE_INFINITY;
    const cw = await failure(async () => writeConditioning(join(tmp, "c.safetensors"), { positive: c }));
    expect(cw.code).toBe("E_NUMERIC");
    const rawC = join(tmp, "raw-cond.safetensors");
    writeSafetensors(rawC, [
      { name: "positive", dtype: "F32", shape: [1, 2, 48], data: new Uint8Array(c.data.buffer) },
    ]);
    const cr = await failure(async () => readConditioning(rawC));
    expect(cr.code).toBe("E_NUMERIC");
    expect(cr.message).toContain(
      `the saved conditioning: 1 of 96 values is NaN or infinite (file ${rawC}, tensor positive)`,
    );
  });
});
