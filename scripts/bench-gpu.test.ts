// `bun run bench gpu`'s plumbing without a GPU: the suite at its tiny shapes on the PTX simulator (ptx,
// and cuda with the float64 cuBLASLt model), every case measured once through the harness (measureCase,
// caseRows), against a stand-in torch peer that answers fixed seconds — so the rows' shape, the s/step
// and tok/s arithmetic, the ratios and the HBM fraction are checked against values worked out by hand;
// and with no libcuda every row is "not run". Nothing here is a measurement of speed.
import { describe, expect, test } from "bun:test";
import { basename } from "node:path";
import {
  decodeParams,
  decodeWeightBytes,
  gpuSuite,
  hbmPeak,
  QWEN3_0_6B,
  QWEN3_8B,
  TINY_DECODE,
} from "../packages/diffusion/bench/gpu.bench.ts";
import { type BenchRow, caseRows, type HarnessEnv, measureCase } from "./bench-harness.ts";

const quiet: HarnessEnv = { loadAverage: () => null, sleep: async () => {}, log: () => {} };
const once = {
  runs: 1,
  reruns: 0,
  maxLoad: Number.POSITIVE_INFINITY,
  maxSpread: Number.POSITIVE_INFINITY,
  settleSeconds: 0,
};

describe("decode byte counts", () => {
  test("weights read per token, worked by hand from the Qwen3 shapes and the GGUF block sizes", () => {
    // Qwen3-8B per layer: q, o 4096² + k, v 1024·4096 + gate, up, down 12288·4096 = 192 937 984;
    // × 36 + the LM head 151936·4096 = 7 568 097 280 parameters
    expect(decodeParams(QWEN3_8B)).toBe(7_568_097_280);
    expect(decodeWeightBytes(QWEN3_8B, "q8_0")).toBe((7_568_097_280 / 32) * 34);
    expect(decodeWeightBytes(QWEN3_8B, "q4_0")).toBe((7_568_097_280 / 32) * 18);
    // Qwen3-0.6B per layer: q 2048·1024, k, v 1024², o 1024·2048, gate, up, down 3072·1024 = 15 728 640;
    // × 28 + 151936·1024
    expect(decodeParams(QWEN3_0_6B)).toBe(28 * 15_728_640 + 151936 * 1024);
    // tiny: per layer 64² + 2·32·64 + 64² + 3·128·64 = 36 864; × 2 + 256·64
    expect(decodeParams(TINY_DECODE)).toBe(90_112);
    expect(decodeWeightBytes(TINY_DECODE, "q8_0")).toBe(95_744);
    expect(decodeWeightBytes(TINY_DECODE, "q4_0")).toBe(50_688);
  });

  test("the HBM peak comes from the device name", () => {
    expect(hbmPeak("NVIDIA H200 (sm_90, 139.8 GiB)")?.bytesPerSecond).toBe(4.8e12);
    expect(hbmPeak("PTX simulator (sm_89)")).toBeNull();
  });
});

describe("bench gpu --tiny (TP_BENCH_GPU_TINY=1)", () => {
  test("every case runs on the simulated ptx and cuda backends, peers and ratios add up", async () => {
    const asked: Record<string, unknown>[] = [];
    const fake = (script: string) => ({
      info: { torch: "fake", threads: 1, sdpa: true, blas: "none", cuda: "Fake GPU" },
      ask: async (req: Record<string, unknown>) => {
        asked.push({ script, ...req });
        return req.op === "block" ? 0.5 : 0.01; // s per block; s per token
      },
      close: () => {},
    });
    const suite = gpuSuite({ tiny: true, hbmPeak: 1e9 });
    const rows: BenchRow[] = [];
    try {
      const cases = await suite.cases({
        startTorch: async (script: string) => fake(basename(script)),
      });
      for (const c of cases) rows.push(...caseRows(c, await measureCase(c, once, quiet), null));
    } finally {
      suite.teardown();
    }
    // rows: 4 formats on ptx and cuda, the fp8 W8A8 opt-in on each; on each, 2 decode formats × with and
    // without attention × (tok/s, fraction)
    expect(rows.length).toBe(10 + 16);
    for (const r of rows) {
      expect(Object.keys(r).sort()).toEqual(
        [
          "case",
          "metric",
          "unit",
          "ours",
          "peer",
          "peer_value",
          "ratio",
          "runs",
          "ours_min",
          "ours_max",
          "peer_min",
          "peer_max",
          "load_avg_min",
          "load_avg_max",
          "attempts",
          "disturbed",
        ].sort(),
      );
    }
    const ptx = rows.filter((r) => / on ptx/.test(r.case));
    expect(ptx.length).toBe(5 + 8);
    for (const r of ptx) {
      // ran: a finite positive figure, no failure, a finite block output
      expect(r.case).not.toMatch(/failed|not run|non-finite/);
      expect(Number.isFinite(r.ours) && r.ours > 0).toBe(true);
    }
    const blocks = ptx.filter((r) => r.metric === "s/step");
    expect(blocks.map((r) => r.case.split(" 64²")[0])).toEqual([
      "Krea 2 INT8 ConvRot W8A8",
      "Krea 2 INT4 ConvRot W4A4",
      "Krea 2 bf16",
      "Krea 2 fp8 e4m3 scaled",
      "Krea 2 fp8 e4m3 scaled",
    ]);
    for (const r of blocks) {
      expect(r.peer).toContain("Fake GPU");
      expect(r.peer_value).toBe(28 * 0.5);
      expect(r.ratio).toBeCloseTo(14 / r.ours, 12);
    }
    const decodeRows = ptx.filter((r) => r.metric !== "s/step");
    expect(
      decodeRows.map(
        (r) =>
          `${r.metric} ${/Q[48]_0/.exec(r.case)?.[0]} ${/attention over 8|no attention/.exec(r.case)?.[0]}`,
      ),
    ).toEqual([
      "tok/s Q8_0 attention over 8",
      "HBM fraction Q8_0 attention over 8",
      "tok/s Q8_0 no attention",
      "HBM fraction Q8_0 no attention",
      "tok/s Q4_0 attention over 8",
      "HBM fraction Q4_0 attention over 8",
      "tok/s Q4_0 no attention",
      "HBM fraction Q4_0 no attention",
    ]);
    for (let i = 0; i < decodeRows.length; i += 2) {
      const [tps, frac] = [decodeRows[i], decodeRows[i + 1]] as [BenchRow, BenchRow];
      expect(tps.peer_value).toBeCloseTo(100, 9); // 1 / 0.01 s per token
      const bytes = decodeWeightBytes(TINY_DECODE, tps.case.includes("Q8_0") ? "q8_0" : "q4_0");
      expect(frac.ours).toBeCloseTo((bytes * tps.ours) / 1e9, 12);
      expect(frac.peer_value).toBeCloseTo((90_112 * 2 * 100) / 1e9, 12);
    }
    // cuda on the simulator (its cuBLASLt the float64 model): the same rows ran
    const cuda = rows.filter((x) => / on cuda/.test(x.case));
    expect(cuda.length).toBe(5 + 8);
    for (const r of cuda) {
      expect(r.case).not.toMatch(/failed|not run|non-finite/);
      expect(Number.isFinite(r.ours) && r.ours > 0).toBe(true);
    }
    // the peers got the shapes and the device the suite names
    const block = asked.find((a) => a.op === "block");
    expect(block).toMatchObject({
      script: "krea2-torch-peer.py",
      device: "cuda",
      features: 64,
      h: 4,
      w: 4,
      txt: 4,
    });
    expect(asked.filter((a) => a.op === "decode").map((a) => a.attention)).toContain(false);
    const decode = asked.find((a) => a.op === "decode");
    expect(decode).toMatchObject({
      script: "decode-torch-peer.py",
      device: "cuda",
      layers: 2,
      hidden: 64,
      ctx: 8,
    });
  }, 240_000);

  test("no libcuda: every row is 'not run: <reason>', untimed; a torch without CUDA is named in the description", async () => {
    const suite = gpuSuite({ tiny: false });
    try {
      const cases = await suite.cases({
        startTorch: async () => ({
          info: { torch: "fake", threads: 1, sdpa: true, blas: "none", cuda: null },
          ask: async () => 1,
          close: () => {},
        }),
      });
      expect(suite.description).toContain("torch: not run: torch fake sees no CUDA device");
      if (!suite.description.includes("ptx: not run: ")) return; // a GPU is here: the real bench is not a test
      expect(cases.length).toBe(10 + 32);
      for (const c of cases) {
        expect(c.timed).toBe(false);
        const [r] = caseRows(c, await measureCase(c, once, quiet), null) as [BenchRow];
        expect(r.case).toMatch(/ — not run: backend (ptx|cuda) cannot start: /);
        expect(Number.isNaN(r.ours)).toBe(true);
      }
    } finally {
      suite.teardown();
    }
  }, 60_000);
});
