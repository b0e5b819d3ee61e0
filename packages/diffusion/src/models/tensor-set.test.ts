// Complete tensor sets and shapes, checked at load (issue 21 items 4–5), on edited copies of the tiny
// Krea 2 fixtures: a deleted tensor is E_FORMAT naming it (not a silently shorter model), a stray
// layer beyond the others is E_FORMAT (the banner would misstate the depth), a tensor the model does
// not read is a warning, and a VAE whose channels do not chain is refused before any weight is
// uploaded, naming the file and tensor — each before the first step runs.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CpuBackend } from "@tp/backend-cpu";
import { openSafetensors, writeSafetensors } from "@tp/formats";
import { isTpError } from "@tp/tensor";
import { KREA2_TINY } from "../testing/fixtures.ts";
import { loadKrea2, readKrea2DitConfig } from "./krea2.ts";
import { loadKrea2TextEncoder } from "./krea2-text.ts";
import { loadWanVae } from "./wan-vae.ts";

const DIT = join(KREA2_TINY, "checkpoints/krea2_tiny_bf16.safetensors");
const FP8 = join(KREA2_TINY, "checkpoints/krea2_tiny_fp8_scaled.safetensors");
const INT8 = join(KREA2_TINY, "checkpoints/krea2_tiny_int8_convrot.safetensors");
const VAE = join(KREA2_TINY, "checkpoints/wan21_vae_tiny_f32.safetensors");
const TE = join(KREA2_TINY, "checkpoints/qwen3vl_tiny_te_bf16.safetensors");
const missing = [DIT, FP8, INT8, VAE, TE].filter((p) => !existsSync(p));
const SKIP = missing.length > 0;
const note = SKIP ? ` [skipped: shared fixture missing: ${missing.join(", ")}]` : "";

const tmp = mkdtempSync(join(tmpdir(), "tp-tensor-set-"));
const backend = new CpuBackend({ threads: 2 });
afterAll(() => {
  backend.dispose();
  rmSync(tmp, { recursive: true, force: true });
});

type Edit = { drop?: string[]; add?: { name: string; from: string }[]; shape?: Record<string, number[]> };

/** A copy of `src` with tensors dropped, copied under new names, or given another shape (same bytes). */
let copies = 0;
function edited(src: string, edit: Edit): string {
  const f = openSafetensors(src);
  const out = join(tmp, `edit${copies++}.safetensors`);
  try {
    const tensors = f.tensors
      .filter((t) => !edit.drop?.includes(t.name))
      .map((t) => ({
        name: t.name,
        dtype: t.dtype,
        shape: edit.shape?.[t.name] ?? [...t.shape],
        data: f.data(t.name),
      }));
    for (const a of edit.add ?? []) {
      const t = f.tensor(a.from);
      tensors.push({ name: a.name, dtype: t.dtype, shape: [...t.shape], data: f.data(a.from) });
    }
    writeSafetensors(out, tensors as never, { metadata: Object.fromEntries(f.metadata ?? []) });
  } finally {
    f.close();
  }
  return out;
}

function failure(f: () => unknown): { code: string; message: string; tensor?: string; file?: string } {
  try {
    const r = f() as { dispose?: () => void } | undefined;
    r?.dispose?.();
  } catch (e) {
    if (isTpError(e)) return { code: e.code, message: e.message, tensor: e.tensor, file: e.file };
    throw e;
  }
  return { code: "ok", message: "" };
}

describe(`Krea 2 DiT: the complete tensor set, counted from every blocks.N name${note}`, () => {
  test.skipIf(SKIP)("the fixtures are complete: no unexpected tensors", () => {
    for (const p of [DIT, FP8, INT8]) {
      using d = loadKrea2(p, { backend });
      expect(d.unexpected).toEqual([]);
      expect(d.config.layers).toBe(2);
    }
  });
  test.skipIf(SKIP)("blocks.1.mod.lin deleted: E_FORMAT naming it, not a 1-block DiT", () => {
    const p = edited(DIT, { drop: ["blocks.1.mod.lin"] });
    for (const f of [() => loadKrea2(p, { backend }), () => readKrea2DitConfig(p)]) {
      const e = failure(f);
      expect(e.code).toBe("E_FORMAT");
      expect(e.tensor).toBe("blocks.1.mod.lin");
      expect(e.file).toBe(p);
      expect(e.message).toContain("blocks.1.mod.lin is missing; the file declares 2 single-stream blocks");
    }
    expect(backend.memory.current).toBe(0);
  });
  test.skipIf(SKIP)(
    "a stray blocks.7.mod.lin: E_FORMAT (blocks 2–6 missing), not a banner of 8 blocks running 2",
    () => {
      const p = edited(DIT, { add: [{ name: "blocks.7.mod.lin", from: "blocks.1.mod.lin" }] });
      const e = failure(() => loadKrea2(p, { backend }));
      expect(e.code).toBe("E_FORMAT");
      expect(e.tensor).toBe("blocks.2.prenorm.scale");
      expect(e.message).toContain("declares 8 single-stream blocks (blocks.0 … blocks.7)");
    },
  );
  test.skipIf(SKIP)("a third text-fusion refiner block: E_FORMAT (Krea 2 has two)", () => {
    const p = edited(DIT, {
      add: [
        {
          name: "txtfusion.refiner_blocks.2.prenorm.scale",
          from: "txtfusion.refiner_blocks.1.prenorm.scale",
        },
      ],
    });
    const e = failure(() => loadKrea2(p, { backend }));
    expect(e.code).toBe("E_FORMAT");
    expect(e.message).toContain("declares 3 txtfusion.refiner_blocks; Krea 2 has 2");
  });
  test.skipIf(SKIP)("an fp8 weight_scale deleted: E_FORMAT naming it (it would be read as raw fp8)", () => {
    const p = edited(FP8, { drop: ["blocks.1.mlp.up.weight_scale"] });
    const e = failure(() => loadKrea2(p, { backend }));
    expect(e.code).toBe("E_FORMAT");
    expect(e.tensor).toBe("blocks.1.mlp.up.weight_scale");
    expect(e.message).toContain("47 of its 48 fp8 weights have a weight_scale");
  });
  test.skipIf(SKIP)("a ConvRot weight_scale deleted: E_FORMAT naming the layer", () => {
    const p = edited(INT8, { drop: ["blocks.0.attn.wq.weight_scale"] });
    const e = failure(() => loadKrea2(p, { backend }));
    expect(e.code).toBe("E_FORMAT");
    expect(e.message).toContain("blocks.0.attn.wq");
  });
  test.skipIf(SKIP)("a tensor the model does not read loads, listed for a warning", () => {
    const p = edited(DIT, { add: [{ name: "blocks.0.extra.scale", from: "blocks.0.prenorm.scale" }] });
    using d = loadKrea2(p, { backend });
    expect(d.unexpected).toEqual(["blocks.0.extra.scale"]);
  });
});

describe(`Wan 2.1 VAE: the complete decoder set and its channel chain, at load${note}`, () => {
  test.skipIf(SKIP)("the fixture is complete", () => {
    using v = loadWanVae(backend, VAE);
    expect(v.unexpected).toEqual([]);
  });
  test.skipIf(SKIP)("decoder.conv1.bias deleted: E_FORMAT naming it", () => {
    const p = edited(VAE, { drop: ["decoder.conv1.bias"] });
    const e = failure(() => loadWanVae(backend, p));
    expect(e.code).toBe("E_FORMAT");
    expect(e.tensor).toBe("decoder.conv1.bias");
    expect(e.message).toContain("the Wan 2.1 VAE decoder is incomplete: decoder.conv1.bias is missing");
  });
  test.skipIf(SKIP)("a gap among decoder.upsamples: E_FORMAT, not a decoder that stops at the gap", () => {
    const f = openSafetensors(VAE);
    const drop = f.tensors.filter((t) => t.name.startsWith("decoder.upsamples.5.")).map((t) => t.name);
    f.close();
    const p = edited(VAE, { drop });
    const e = failure(() => loadWanVae(backend, p));
    expect(e.code).toBe("E_FORMAT");
    expect(e.tensor).toBe("decoder.upsamples.5.residual.0.gamma");
    expect(e.message).toContain("declares 15 decoder.upsamples");
  });
  test.skipIf(SKIP)("channels that do not chain: E_FORMAT naming file, tensor and the shape needed", () => {
    // head.0.gamma of 8 channels after a last block of 4 (the late "toRgb8: 3072 values" of issue 21)
    const p = edited(VAE, { shape: { "decoder.head.0.gamma": [2, 2, 1, 1] } });
    const e = failure(() => loadWanVae(backend, p));
    expect(e.code).toBe("E_FORMAT");
    expect(e.file).toBe(p);
    expect(e.tensor).toBe("decoder.head.0.gamma");
    expect(e.message).toContain("has shape [2, 2, 1, 1]; the decoder's channels need [4, 1, …]");
    // a resample conv whose input is not the previous block's output
    const q = edited(VAE, { shape: { "decoder.upsamples.3.resample.1.weight": [16, 8, 3, 3] } });
    const r = failure(() => loadWanVae(backend, q));
    expect(r.code).toBe("E_FORMAT");
    expect(r.tensor).toBe("decoder.upsamples.3.resample.1.weight");
    expect(r.message).toContain("need [16, 16, 3, 3]");
    expect(backend.memory.current).toBe(0);
  });
});

describe(`Qwen3-VL text encoder: layers counted from every layers.N name${note}`, () => {
  test.skipIf(SKIP)(
    "the last layer's input_layernorm deleted: E_FORMAT naming it, not a 35-layer encoder",
    () => {
      const name = "model.language_model.layers.35.input_layernorm.weight";
      const p = edited(TE, { drop: [name] });
      const e = failure(() => loadKrea2TextEncoder(p, { backend, tokenizer: {} as never }));
      expect(e.code).toBe("E_FORMAT");
      expect(e.tensor).toBe(name);
      expect(e.file).toBe(p);
      expect(backend.memory.current).toBe(0);
    },
  );
  test.skipIf(SKIP)("a q_proj of the wrong shape: E_FORMAT at load naming file and tensor", () => {
    const name = "model.language_model.layers.1.self_attn.q_proj.weight";
    const f = openSafetensors(TE);
    const [n, k] = f.tensor(name).shape as [number, number];
    f.close();
    const p = edited(TE, { shape: { [name]: [k, n] } });
    const e = failure(() => loadKrea2TextEncoder(p, { backend, tokenizer: {} as never }));
    expect(e.tensor).toBe(name);
    expect(e.file).toBe(p);
    expect(e.message).toContain("that the config implies");
  });
});
