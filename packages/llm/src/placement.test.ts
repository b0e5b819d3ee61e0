// Layer placement (placement.ts, issue 26): the llama.cpp slot rule, --cpu-layers tail|attn and the
// expert flags on a config; then the shared tiny GGUFs run split between two backends. Over two cpu
// backends (runs everywhere) the logits are bit-identical to one cpu backend: the same kernels on the
// same numbers, only the tensors' homes differ, so any difference is a placement bug (a missed
// crossing is an E_STATE, a wrong weight a different logit). On Vulkan (skipped with the reason when no
// device starts; llvmpipe here) against the cpu backend: the same greedy tokens and probabilities
// within vulkan.test.ts's PROB_TOL (5e-5: the same products summed in another order, measured ≤ 2e-6).
// Then --vram-budget: a budget below what -ngl asks fails at load naming the bytes, and a chosen -ngl
// keeps the device's accounted peak within the budget.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { createBackend as createCpu } from "@tp/backend-cpu";
import { type Backend, TpError } from "@tp/tensor";
import { type LoadPlacement, loadModel } from "./load.ts";
import type { LlmConfig } from "./model.ts";
import { describePlacement, PlacedBackend, placeLayers } from "./placement.ts";
import { startVulkan } from "./testing/vulkan.ts";

const MODELS = resolve(import.meta.dir, "../../../../shared/models");
const HAVE_MODELS = existsSync(join(MODELS, "PROVENANCE.md"));
/** The describe-name suffix of the tests that read the shared files, saying why they skip. */
const NO_MODELS = HAVE_MODELS ? "" : ` — skipped: ${MODELS} is absent`;
const SYN = (f: string) => join(MODELS, "synthetic", f);

/** A config with L layers (only the fields placement reads). */
function cfg(L: number, types?: LlmConfig["layer_types"]): LlmConfig {
  return { num_hidden_layers: L, ...(types === undefined ? {} : { layer_types: types }) } as LlmConfig;
}
const on = (p: { layers: readonly boolean[] }) => p.layers.map((d) => (d ? "D" : "h")).join("");

describe("placeLayers: which layers go to the device", () => {
  test("-ngl N counts L + 1 slots from the end, the head last (llama.cpp's i_gpu_start = L + 1 − N)", () => {
    const c = cfg(4);
    expect(
      [0, 1, 2, 3, 4, 5, 99].map((n) => [
        on(placeLayers(c, { gpuLayers: n })),
        placeLayers(c, { gpuLayers: n }).head,
      ]),
    ).toEqual([
      ["hhhh", false],
      ["hhhh", true], // the head alone
      ["hhhD", true],
      ["hhDD", true],
      ["hDDD", true],
      ["DDDD", true],
      ["DDDD", true],
    ]);
    expect(on(placeLayers(c, { gpuLayers: "all" }))).toBe("DDDD");
  });
  test("--cpu-layers tail keeps a device prefix; attn sends the KV layers first, from the last", () => {
    const q35 = cfg(8, [
      ...(["linear_attention", "linear_attention", "linear_attention", "full_attention"] as const),
      ...(["linear_attention", "linear_attention", "linear_attention", "full_attention"] as const),
    ]);
    expect(on(placeLayers(q35, { gpuLayers: 7, cpuLayers: "tail" }))).toBe("DDDDDDhh");
    expect(on(placeLayers(q35, { gpuLayers: 8, cpuLayers: "attn" }))).toBe("DDDDDDDh");
    expect(on(placeLayers(q35, { gpuLayers: 7, cpuLayers: "attn" }))).toBe("DDDhDDDh");
    expect(on(placeLayers(q35, { gpuLayers: 6, cpuLayers: "attn" }))).toBe("DDDhDDhh"); // then the tail
    expect(placeLayers(q35, { gpuLayers: 1, cpuLayers: "attn" }).head).toBe(true);
  });
  test("--n-cpu-moe N: the experts of the first N layers on the host; --cpu-moe: all; host layers always", () => {
    const c = { ...cfg(4), num_experts: 8 } as LlmConfig;
    expect(placeLayers(c, { gpuLayers: "all", nCpuMoe: 2 }).expertsOnHost).toEqual([
      true,
      true,
      false,
      false,
    ]);
    expect(placeLayers(c, { gpuLayers: "all", cpuMoe: true }).expertsOnHost).toEqual([
      true,
      true,
      true,
      true,
    ]);
    expect(placeLayers(c, { gpuLayers: 3 }).expertsOnHost).toEqual([true, true, false, false]);
  });
  test("bad counts are E_ARG naming the flag", () => {
    const c = cfg(2);
    for (const [o, flag] of [
      [{ gpuLayers: -1 }, "-ngl"],
      [{ gpuLayers: 1.5 }, "-ngl"],
      [{ gpuLayers: "all", nCpuMoe: -2 }, "--n-cpu-moe"],
      // a dense model (no num_experts): the MoE flags would place nothing, so they are refused
      [{ gpuLayers: "all", nCpuMoe: 1 }, "--n-cpu-moe"],
      [{ gpuLayers: "all", cpuMoe: true }, "--cpu-moe"],
    ] as const) {
      let err: unknown;
      try {
        placeLayers(c, o);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(TpError);
      expect((err as TpError).code).toBe("E_ARG");
      expect((err as TpError).message.startsWith(flag)).toBe(true);
    }
  });
  test("names decide where a tensor lives", () => {
    const c = {
      ...cfg(3, ["linear_attention", "full_attention", "linear_attention"]),
      num_experts: 4,
    } as LlmConfig;
    const host = createCpu({ threads: 1 });
    const dev = createCpu({ threads: 1 });
    try {
      const pb = new PlacedBackend(host, dev, c, placeLayers(c, { gpuLayers: 3, nCpuMoe: 2 }));
      const where = (n: string) => (pb.backendFor(n) === dev ? "dev" : "host");
      expect(
        [
          "model.layers.0.input_layernorm.weight",
          "model.layers.1.mlp.experts.gate_proj.weight", // layer 1 on the device, its experts kept on the host
          "model.layers.1.mlp.gate.weight",
          "model.layers.2.mlp.experts.up_proj.weight",
          "kv.0.k", // the one KV slot: layer 1
          "recurrent.0.conv", // layer 0
          "recurrent.1.ssm", // layer 2
          "model.embed_tokens.weight",
          "input_ids",
          "lm_head.weight",
          "positions",
        ].map(where),
      ).toEqual(["host", "host", "dev", "dev", "dev", "host", "dev", "host", "host", "dev", "dev"]);
      expect(describePlacement(pb.placement, "cpu", "vulkan")).toBe(
        "layers 0 on cpu; layers 1–2 + head on vulkan; experts of layers 1 on cpu",
      );
    } finally {
      host.dispose();
      dev.dispose();
    }
  });
});

/** Logits of the prompt's rows, then 12 greedy steps (their logits), under a placement or none. */
async function run(backend: Backend, file: string, placement?: LoadPlacement, allLogits = true) {
  const { model, tokenizer, config } = loadModel(SYN(file), {
    backend,
    maxContext: 64,
    kvRingBatch: 8, // gemma's ring (8 + 8 rows) wraps within the run; the prompt (6 rows) is one forward
    ...(placement === undefined ? {} : { placement }),
  });
  try {
    const V = config.vocab_size;
    const ids = tokenizer.encode("Once upon a time", { addSpecial: true });
    const rows: Float32Array[] = [];
    const greedy: number[] = [];
    let t = model.step(ids, { allLogits });
    for (let i = 0; ; i++) {
      const l = (await model.backend.read(t)) as Float32Array;
      model.backend.free(t);
      rows.push(l);
      const last = l.subarray(l.length - V);
      let best = 0;
      for (let j = 1; j < V; j++) if ((last[j] as number) > (last[best] as number)) best = j;
      greedy.push(best);
      if (i === 12) break;
      t = model.step([best]);
    }
    return { rows, greedy, V };
  } finally {
    model.dispose();
  }
}

/** Largest |softmax(a) − softmax(b)| over every row. */
function probDiff(a: Float32Array[], b: Float32Array[], V: number): number {
  let m = 0;
  a.forEach((x, r) => {
    const y = b[r] as Float32Array;
    for (let o = 0; o < x.length; o += V) {
      const p = softmax(x.subarray(o, o + V));
      const q = softmax(y.subarray(o, o + V));
      for (let i = 0; i < V; i++) m = Math.max(m, Math.abs((p[i] as number) - (q[i] as number)));
    }
  });
  return m;
}
function softmax(l: Float32Array): Float64Array {
  let mx = Number.NEGATIVE_INFINITY;
  for (const v of l) mx = Math.max(mx, v);
  const p = Float64Array.from(l, (v) => Math.exp(v - mx));
  const s = p.reduce((a, b) => a + b, 0);
  return p.map((v) => v / s);
}

/** The placements every file runs under, with the files they apply to. */
const CASES: { name: string; o: Omit<LoadPlacement, "host">; files?: RegExp }[] = [
  { name: "-ngl 0", o: { gpuLayers: 0 } },
  { name: "-ngl 1 (head only)", o: { gpuLayers: 1 } },
  { name: "-ngl 2 (last layer + head)", o: { gpuLayers: 2 } },
  { name: "-ngl all", o: { gpuLayers: "all" } },
  { name: "-ngl 2 --cpu-layers tail", o: { gpuLayers: 2, cpuLayers: "tail" } },
  { name: "-ngl 5 --cpu-layers attn", o: { gpuLayers: 5, cpuLayers: "attn" }, files: /qwen35/ },
  { name: "-ngl all --n-cpu-moe 1", o: { gpuLayers: "all", nCpuMoe: 1 }, files: /moe/ },
  { name: "-ngl all --cpu-moe", o: { gpuLayers: "all", cpuMoe: true }, files: /moe/ },
];
const FILES = [
  "llama-tiny-F32.gguf",
  "qwen3-tiny-F32.gguf",
  "qwen3moe-tiny-F32.gguf",
  "gemma3-tiny-F32.gguf",
  "qwen35-tiny-F32.gguf",
  "qwen35moe-tiny-F32.gguf",
  "qwen3-tiny-Q8_0.gguf",
];

describe.skipIf(!HAVE_MODELS)(`placed over two cpu backends: bit-identical logits${NO_MODELS}`, () => {
  const ref = createCpu({ threads: 2 });
  const host = createCpu({ threads: 2 });
  const dev = createCpu({ threads: 2 });
  afterAll(() => {
    for (const b of [ref, host, dev]) b.dispose();
  });
  for (const file of FILES) {
    test(`${file}: every placement gives the one-backend logits exactly`, async () => {
      const want = await run(ref, file);
      for (const c of CASES) {
        if (c.files !== undefined && !c.files.test(file)) continue;
        const got = await run(dev, file, { host, ...c.o });
        expect({ case: c.name, greedy: got.greedy }).toEqual({ case: c.name, greedy: want.greedy });
        expect({ case: c.name, same: got.rows.every((r, i) => Bun.deepEquals(r, want.rows[i])) }).toEqual({
          case: c.name,
          same: true,
        });
        expect({ case: c.name, host: host.memory.current, dev: dev.memory.current }).toEqual({
          case: c.name,
          host: 0,
          dev: 0,
        }); // the model, its KV cache, state and every crossing freed
      }
    }, 60_000);
  }
});

describe.skipIf(!HAVE_MODELS)(`hidden states of a placed model (forward with collect)${NO_MODELS}`, () => {
  const ref = createCpu({ threads: 1 });
  const host = createCpu({ threads: 1 });
  const dev = createCpu({ threads: 1 });
  afterAll(() => {
    for (const b of [ref, host, dev]) b.dispose();
  });
  for (const file of ["qwen3-tiny-F32.gguf", "qwen35-tiny-F32.gguf"]) {
    test(`${file}: every hidden state as on one backend, bit for bit, under -ngl 2 --cpu-layers tail`, async () => {
      const read = async (backend: Backend, placement?: LoadPlacement) => {
        const { model, config } = loadModel(SYN(file), {
          backend,
          maxContext: 16,
          ...(placement === undefined ? {} : { placement }),
        });
        try {
          const all = Array.from({ length: config.num_hidden_layers + 1 }, (_, k) => k);
          const hs = model.forward([1, 2, 3, 4], { collect: all });
          const out = await Promise.all(hs.map((h) => model.backend.read(h)));
          for (const h of hs) model.backend.free(h);
          return out;
        } finally {
          model.dispose();
        }
      };
      const want = await read(ref);
      const got = await read(dev, { host, gpuLayers: 2, cpuLayers: "tail" });
      expect(got.length).toBe(want.length);
      expect(got.map((h, k) => Bun.deepEquals(h, want[k]))).toEqual(want.map(() => true));
      expect([host.memory.current, dev.memory.current]).toEqual([0, 0]);
    });
  }
  test("stepCollect (the EAGLE-3 taps of a cached step): logits and hidden states as on one backend", async () => {
    const tap = async (backend: Backend, placement?: LoadPlacement) => {
      const { model, config } = loadModel(SYN("qwen3-tiny-F32.gguf"), {
        backend,
        maxContext: 16,
        ...(placement === undefined ? {} : { placement }),
      });
      try {
        const L = config.num_hidden_layers;
        model.backend.free(model.step([1, 2]));
        const r = model.stepCollect([3, 4], [0, 1, L]);
        const out = await Promise.all([r.logits, ...r.hidden].map((t) => model.backend.read(t)));
        for (const t of [r.logits, ...r.hidden]) model.backend.free(t);
        return out;
      } finally {
        model.dispose();
      }
    };
    const want = await tap(ref);
    const got = await tap(dev, { host, gpuLayers: 2, cpuLayers: "tail" }); // the last block on the host, the head not
    expect(got.map((t, i) => Bun.deepEquals(t, want[i]))).toEqual(want.map(() => true));
    expect([host.memory.current, dev.memory.current]).toEqual([0, 0]);
  });
});

describe.skipIf(!HAVE_MODELS)(`crossings: one per boundary per step${NO_MODELS}`, () => {
  // Uploads of one decode step, over two cpu backends: input_ids and positions (1 each), a copy of the
  // positions for the other backend when it runs a block, and one hidden state [1, H] per boundary
  // between consecutive slots (layer 0 … L − 1, head) on different backends — nothing else crosses.
  const host = createCpu({ threads: 1 });
  const dev = createCpu({ threads: 1 });
  afterAll(() => {
    host.dispose();
    dev.dispose();
  });
  const count = (b: Backend) => {
    const up = b.upload.bind(b);
    const box = { n: 0, restore: () => Reflect.deleteProperty(b, "upload") }; // the prototype's again
    b.upload = (...a: Parameters<Backend["upload"]>) => {
      box.n++;
      return up(...a);
    };
    return box;
  };
  for (const [name, o, boundaries, positionCopies] of [
    ["-ngl 0", { gpuLayers: 0 }, 0, 0],
    ["-ngl 1 (head only)", { gpuLayers: 1 }, 1, 1],
    ["-ngl 2", { gpuLayers: 2 }, 1, 1],
    ["-ngl 2 --cpu-layers tail", { gpuLayers: 2, cpuLayers: "tail" }, 2, 1],
    ["-ngl all", { gpuLayers: "all" }, 0, 0],
  ] as const) {
    test(`llama-tiny (2 layers), ${name}: ${boundaries} hidden-state crossing(s) per decode step`, () => {
      const { model } = loadModel(SYN("llama-tiny-F32.gguf"), {
        backend: dev,
        maxContext: 16,
        placement: { host, ...o },
      });
      try {
        model.backend.free(model.step([1, 2, 3]));
        const h = count(host);
        const d = count(dev);
        model.backend.free(model.step([4]));
        h.restore();
        d.restore();
        expect(h.n + d.n).toBe(2 + positionCopies + boundaries);
      } finally {
        model.dispose();
      }
    });
  }
});

const vk = HAVE_MODELS ? startVulkan() : {};
const SKIP = !HAVE_MODELS
  ? `skipped: ${MODELS} is absent`
  : vk.backend === undefined
    ? `skipped: no Vulkan device starts (${vk.reason})`
    : "";
/** vulkan.test.ts PROB_TOL: the same products summed in another order (measured ≤ 2e-6 on these files). */
const PROB_TOL = 5e-5;

describe.skipIf(SKIP !== "")(`placed over Vulkan + cpu vs the cpu backend${SKIP ? ` — ${SKIP}` : ""}`, () => {
  const cpu = createCpu({ threads: 2 });
  const host = createCpu({ threads: 2 });
  const gpu = vk.backend as Backend;
  afterAll(() => {
    cpu.dispose();
    host.dispose();
    gpu?.dispose();
  });
  for (const file of FILES) {
    test(`${file}: the same greedy tokens, probabilities within ${PROB_TOL}, under every placement`, async () => {
      const want = await run(cpu, file);
      for (const c of CASES) {
        if (c.files !== undefined && !c.files.test(file)) continue;
        const got = await run(gpu, file, { host, ...c.o });
        expect({ case: c.name, greedy: got.greedy }).toEqual({ case: c.name, greedy: want.greedy });
        const d = probDiff(got.rows, want.rows, want.V);
        expect({ case: c.name, within: d <= PROB_TOL }).toEqual({ case: c.name, within: true });
        expect({ case: c.name, dev: gpu.memory.current, host: host.memory.current }).toEqual({
          case: c.name,
          dev: 0,
          host: 0,
        });
      }
    }, 120_000);
  }

  test("--vram-budget below what -ngl all needs fails at load, naming the bytes; a chosen -ngl holds its budget", async () => {
    const file = "qwen3moe-tiny-F32.gguf";
    let err: unknown;
    try {
      loadModel(SYN(file), {
        backend: gpu,
        maxContext: 64,
        kvRingBatch: 8, // as run(): the activation bound counts one micro-batch of min(context, ring batch) rows
        placement: { host, gpuLayers: "all", vramBudget: 100_000 },
      });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(TpError);
    expect((err as TpError).code).toBe("E_OOM");
    const needed = Number(/below the (\d+) bytes -ngl all needs/.exec((err as TpError).message)?.[1]);
    expect(needed).toBeGreaterThan(100_000);
    expect(gpu.memory.current).toBe(0); // nothing was placed
    // exactly what -ngl all needs: all of it is chosen, and the device's accounted peak stays within
    const lines: string[] = [];
    gpu.memory.resetPeak?.();
    // the last row's logits only, as the dry step that counted the working peak (load.ts placementCosts)
    const got = await run(gpu, file, { host, vramBudget: needed, onPlan: (l) => lines.push(l) }, false);
    expect(lines[0]?.startsWith("placement: -ngl 3 of 3 (chosen by --vram-budget)")).toBe(true);
    expect(gpu.memory.peak).toBeLessThanOrEqual(needed);
    expect(got.greedy).toEqual((await run(cpu, file)).greedy);
    expect(gpu.memory.current).toBe(0);
    // one byte less: a slot fewer
    lines.length = 0;
    await run(gpu, file, { host, vramBudget: needed - 1, onPlan: (l) => lines.push(l) }, false);
    expect(lines[0]).toStartWith("placement: -ngl 2 of 3");
    gpu.memory.setBudget(null);
  }, 60_000);
});

if (SKIP !== "") test.skip(SKIP, () => {});
