// Sigma tables and "simple" schedules against ComfyUI's own float32 values
// (../shared/testdata/krea2-tiny/sampling/): compared bit for bit, no tolerance.
import { describe, expect, test } from "bun:test";
import { existsSync, readdirSync } from "node:fs";
import { join, resolve } from "node:path";
import { isTpError } from "@tp/tensor";
import { auraFlowSigmaTable, fluxSigmaTable, krea2Sigmas, simpleSchedule } from "./schedule.ts";
import { readF32 } from "./testing/fixtures.ts";

// <repo root>/../shared; this file is packages/diffusion/src/, three levels below the root.
const SHARED = resolve(import.meta.dir, "../../..", "../shared");
const DIR = join(SHARED, "testdata/krea2-tiny/sampling");
const skip = !existsSync(join(DIR, "schedules"));
const note = skip ? ` [skipped: shared fixture missing: ${DIR}/schedules]` : "";

describe(`ComfyUI sigma tables${note}`, () => {
  test.skipIf(skip)("ModelSamplingFlux(1.15).sigmas, 10000 entries, exact", () => {
    expect(Array.from(fluxSigmaTable(1.15, 10000))).toEqual(
      Array.from(readF32(join(DIR, "model_sampling_sigmas.bin"))),
    );
  });
  test.skipIf(skip)("ModelSamplingDiscreteFlow(1.15, multiplier 1).sigmas (AuraFlow node), exact", () => {
    const ref = readF32(join(DIR, "schedules/auraflow_shift1.15_table.bin"));
    expect(Array.from(auraFlowSigmaTable(1.15, 1000))).toEqual(Array.from(ref));
  });
  test.skipIf(skip)("every list in schedules/ and turbo_cfg1/sigmas.bin, exact", () => {
    const files = readdirSync(join(DIR, "schedules")).filter((f) => /_simple_\d+\.bin$/.test(f));
    expect(files.length).toBeGreaterThanOrEqual(12);
    for (const f of files) {
      const m = /^(krea2_default|auraflow1\.15)_simple_(\d+)\.bin$/.exec(f);
      expect(m).not.toBeNull();
      const steps = Number((m as RegExpExecArray)[2]);
      const sampling = (m as RegExpExecArray)[1] === "krea2_default" ? "flux" : "auraflow";
      const ours = Array.from(krea2Sigmas(steps, { sampling }));
      expect([f, ...ours]).toEqual([f, ...Array.from(readF32(join(DIR, "schedules", f)))]);
    }
    expect(Array.from(krea2Sigmas(4))).toEqual(Array.from(readF32(join(DIR, "turbo_cfg1/sigmas.bin"))));
  });
});

describe("schedule (no fixtures)", () => {
  test("spec §4.1 values: 4 steps; sigma_0 = 1; trailing 0", () => {
    const s = krea2Sigmas(4);
    expect(Array.from(s).map((v) => Number(v.toPrecision(9)))).toEqual([
      1, 0.904530764, 0.759510934, 0.512844086, 0,
    ]);
    const s20 = krea2Sigmas(20);
    expect(s20[0]).toBe(1);
    expect(s20[20]).toBe(0);
    for (let i = 0; i < 20; i++) expect(s20[i] as number).toBeGreaterThan(s20[i + 1] as number);
  });
  test("AuraFlow shift 1 is the identity t = i/n", () => {
    expect(auraFlowSigmaTable(1, 4)).toEqual(Float32Array.from([0.25, 0.5, 0.75, 1]));
  });
  test("simpleSchedule picks table[len − 1 − ⌊x·len/steps⌋]", () => {
    const t = Float32Array.from([0.1, 0.2, 0.3, 0.4, 0.5, 0.6]);
    expect(Array.from(simpleSchedule(t, 4))).toEqual([0.6, 0.5, 0.3, 0.2, 0].map(Math.fround));
  });
  test("bad arguments are E_ARG", () => {
    const bad = [
      () => krea2Sigmas(0),
      () => krea2Sigmas(2.5),
      () => krea2Sigmas(4, { shift: Number.NaN }),
      () => krea2Sigmas(4, { sampling: "karras" as "flux" }),
      () => simpleSchedule(new Float32Array(0), 4),
    ];
    for (const f of bad) {
      let code = "";
      try {
        f();
      } catch (e) {
        if (isTpError(e)) code = e.code;
      }
      expect(code).toBe("E_ARG");
    }
  });
});
