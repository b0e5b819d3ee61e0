// Weight placement under --vram-budget (issue 26) on the Vulkan backend (Mesa's llvmpipe here: its
// device memory is real and the backend's account budgets it). The Krea 2 tiny turbo_cfg1 run of
// ../shared/testdata/krea2-tiny with the budget at full residency, half, and min gives the same latents
// bit for bit as the run with no planning (everything streamed) — placement changes where a weight's
// bytes live, never the arithmetic — and matches ComfyUI's run (the same tolerances as vulkan.test.ts);
// the account's peak over the run never passes the budget; a budget one byte below min fails before
// the first step naming the bytes it needs. Under a plan the streamed weights go through the backend's
// ring of two slots (the ring's upload counter shows each streamed weight once per pass), and the VAE
// decode's peak is counted in the plan. An int8 ConvRot file with CFG 2 covers row scales and the
// negative pass. Skipped with the reason when ../shared is absent or no Vulkan device starts.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { createBackend as createCpu } from "@tp/backend-cpu";
import { createBackend as createVulkan, type VulkanBackend } from "@tp/backend-vulkan";
import { type Backend, type ResidencyPlan, TpError, type VramBudget, Weight } from "@tp/tensor";
import { startBackend } from "@tp/tensor/testing";
import { type Krea2Mode, loadKrea2 } from "./models/krea2.ts";
import { loadWanVae } from "./models/wan-vae.ts";
import { generateKrea2 } from "./pipelines/krea2.ts";
import { placeWeights } from "./residency.ts";
import { expectComfyRun, KREA2_TINY, readF32, TURBO_CFG1 } from "./testing/fixtures.ts";

/** As vulkan.test.ts: sampling latents vs ComfyUI, 8-bit image off-by-one count. */
const LATENT_TOL = 1e-5;
const MAX_BYTES_OFF_BY_ONE = 8;

const DIR = KREA2_TINY;
const RUN = join(DIR, "sampling/turbo_cfg1");
const ckpt = (v: string) => join(DIR, "checkpoints", `krea2_tiny_${v}.safetensors`);
const VAE = join(DIR, "checkpoints/wan21_vae_tiny_f32.safetensors");
const needed = [ckpt("bf16"), ckpt("int8_convrot"), VAE, join(RUN, "context_pos.bin")];
const missing = needed.filter((p) => !existsSync(p));

const vk = missing.length === 0 ? startBackend(() => createVulkan()) : {};
const SKIP =
  missing.length > 0
    ? `skipped: shared fixture missing: ${missing.join(", ")}`
    : vk.backend === undefined
      ? `skipped: no Vulkan device starts (${vk.reason})`
      : "";
const backend = vk.backend as Backend;
afterAll(() => backend?.dispose());

interface Run {
  latent: Float32Array;
  modelLatent: Float32Array;
  states: Float32Array[];
  plan: ResidencyPlan | null;
  peak: number;
  /** Bytes uploaded through the stream ring from the plan to the end of sampling, and the ring's size then. */
  ringBytes: number;
  ringSize: number;
  r: Awaited<ReturnType<typeof generateKrea2>>;
}

async function run(variant: string, mode: Krea2Mode, cfg: number, budget?: VramBudget): Promise<Run> {
  const before = backend.memory.current;
  const dit = loadKrea2(ckpt(variant), { backend, mode });
  const vae = loadWanVae(backend, VAE);
  const states: Float32Array[] = [];
  let plan: ResidencyPlan | null = null;
  const vkb = backend as VulkanBackend;
  let streamedAtPlan = vkb.streamStats.bytes;
  let ringSize = 0;
  let streamedAtEnd = -1;
  const end = backend.memory.peakWindow();
  try {
    const r = await generateKrea2({
      dit,
      vae,
      conditioning: {
        positive: { data: readF32(join(RUN, "context_pos.bin")), shape: [1, 7, 960] },
        ...(cfg === 1 ? {} : { negative: "zero" as const }),
      },
      ...TURBO_CFG1,
      // the CFG case has no golden: smaller and shorter (it compares placements with each other)
      ...(cfg === 1 ? {} : { width: 64, height: 48, steps: 2 }),
      cfg,
      ...(budget === undefined ? {} : { vramBudget: budget }),
      onResidencyPlan: (p) => {
        plan = p;
        expect(states.length).toBe(0); // planned before the first step
        streamedAtPlan = vkb.streamStats.bytes;
        ringSize = vkb.streamRingBytes;
      },
      onStep: async (s) => {
        states.push((await backend.read(s.x)) as Float32Array);
        streamedAtEnd = vkb.streamStats.bytes;
      },
    });
    return {
      latent: r.latent,
      modelLatent: r.modelLatent,
      states,
      plan,
      peak: end(),
      r,
      ringBytes: streamedAtEnd - streamedAtPlan,
      ringSize,
    };
  } finally {
    end();
    dit.dispose();
    vae.dispose();
    expect(backend.memory.current).toBe(before);
    expect(backend.memory.budget).toBeNull(); // restored
  }
}

function expectSame(a: Run, b: Run): void {
  expect(Buffer.from(b.latent.buffer).equals(Buffer.from(a.latent.buffer))).toBe(true);
  expect(Buffer.from(b.modelLatent.buffer).equals(Buffer.from(a.modelLatent.buffer))).toBe(true);
  expect(b.states.length).toBe(a.states.length);
  b.states.forEach((s, i) => {
    expect(Buffer.from(s.buffer).equals(Buffer.from((a.states[i] as Float32Array).buffer))).toBe(true);
  });
}

describe.skipIf(SKIP !== "")("--vram-budget on the Vulkan backend: Krea 2 tiny", () => {
  for (const [variant, mode, cfg] of [
    ["bf16", "upcast", 1],
    ["int8_convrot", "native", 2],
  ] as const) {
    test(`${variant} ${mode} cfg ${cfg}: full / half / min give the streamed run's latents bit for bit, peak ≤ budget`, async () => {
      const passes = cfg === 1 ? 1 : 2;
      // The ring carries every streamed weight once per pass, and nothing else; the plan's ring
      // (2 slots of the largest streamed weight) is in the account, so the peak bound covers it.
      const expectRing = (x: Run) => {
        const p = x.plan as unknown as ResidencyPlan;
        expect(x.ringBytes).toBe(p.streamedBytesPerPass * passes * x.states.length);
        expect(x.ringSize > 0).toBe(p.streamed.length > 0);
        expect(x.peak).toBeLessThanOrEqual(p.expectedPeak);
        expect(p.laterPeak).toBeGreaterThan(0); // the VAE decode was counted
      };
      const streamed = await run(variant, mode, cfg);
      expect(streamed.plan).toBeNull();
      expect(streamed.ringBytes).toBe(0); // no plan, no ring: per-op copies
      if (cfg === 1) {
        expectComfyRun(RUN, streamed.r, streamed.states, {
          latent: LATENT_TOL,
          bytesOffByOne: MAX_BYTES_OFF_BY_ONE,
        });
      }
      const full = await run(variant, mode, cfg, Number.MAX_SAFE_INTEGER);
      const fp = full.plan as unknown as ResidencyPlan;
      expect(fp.streamed).toEqual([]);
      expect(fp.residentBytes).toBeGreaterThan(0);
      expectRing(full);
      expectSame(streamed, full);
      // half of the weights' bytes above what min needs; then min itself
      const halfBudget = fp.minBytes + Math.floor(fp.residentBytes / 2);
      const half = await run(variant, mode, cfg, halfBudget);
      const hp = half.plan as unknown as ResidencyPlan;
      expect(hp.budget).toBe(halfBudget);
      expect(hp.resident.length).toBeGreaterThan(0);
      expect(hp.streamed.length).toBeGreaterThan(0);
      expect(hp.residentBytes).toBeLessThanOrEqual(halfBudget - hp.minBytes);
      expect(hp.minBytes).toBe(fp.minBytes); // the dry run counts the same bytes
      expect(half.peak).toBeLessThanOrEqual(halfBudget);
      expectRing(half);
      expect(half.ringBytes).toBeGreaterThan(0);
      expectSame(streamed, half);
      const min = await run(variant, mode, cfg, "min");
      const mp = min.plan as unknown as ResidencyPlan;
      expect([mp.min, mp.budget, mp.residentBytes]).toEqual([true, fp.minBytes, 0]);
      expect(min.peak).toBeLessThanOrEqual(mp.budget);
      expectRing(min);
      expect(min.ringBytes).toBe(fp.residentBytes * passes * min.states.length); // every weight streamed
      expectSame(streamed, min);
      // one byte below min: E_OOM before the first step, naming what it needs
      let err: unknown;
      try {
        await run(variant, mode, cfg, fp.minBytes - 1);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(TpError);
      expect((err as TpError).code).toBe("E_OOM");
      expect((err as TpError).message).toContain(`at least ${fp.minBytes} bytes`);
    }, 600_000);
  }
});

test.skipIf(SKIP !== "")(
  "placeWeights: the dry step's count (ring included) sets min; counted peaks are reused without a dry run",
  async () => {
    const f32w = (name: string, values: number[]) =>
      new Weight({
        name,
        format: "f32",
        shape: [values.length / 4, 4],
        data: new Uint8Array(Float32Array.from(values).buffer),
      });
    const ws = [
      { name: "a", weight: f32w("a", [1, 2, 3, 4, 5, 6, 7, 8]) },
      { name: "b", weight: f32w("b", [1, 2, 3, 4]) },
    ];
    let dry = 0;
    const held = backend.memory.current;
    const first = await placeWeights(backend, ws, "min", async () => {
      dry++;
      using scratch = backend.alloc([256], "f32", "dry scratch"); // 1024 bytes
      expect(scratch.numel).toBe(256);
    });
    // held + the ring (2 slots of the larger weight, 32 bytes) + the scratch
    expect(first.plan.workingPeak).toBe(held + 2 * 32 + 1024);
    expect((backend as VulkanBackend).streamRingBytes).toBe(64); // min: both streamed
    first.restore();
    expect((backend as VulkanBackend).streamRingBytes).toBe(0);
    const again = await placeWeights(
      backend,
      ws,
      "min",
      async () => {
        dry++;
      },
      "--vram-budget",
      undefined,
      { workingPeak: first.plan.workingPeak, laterPeak: first.plan.laterPeak },
    );
    expect(dry).toBe(1);
    expect(again.plan).toEqual(first.plan);
    again.restore();
  },
);

test("--vram-budget on the cpu backend (weights read from the mapping) is E_UNSUPPORTED", async () => {
  const cpu = createCpu({ threads: 1 });
  try {
    await expect(placeWeights(cpu, [], "min", async () => {})).rejects.toThrow(/applies to device backends/);
  } finally {
    cpu.dispose();
  }
});

if (SKIP !== "") test.skip(SKIP, () => {});
