// The seeded mutation fuzzer of issue 21 (tests/fuzz/harness.ts) at a CI size: TP_FUZZ_CASES cases
// (default 8000, about 35 s on the loaded 2-core development VM) over the readers and `inspect`, Krea 2's DiT
// and VAE loaders with a one-step run, `loadModel` + two tokens on two tiny GGUFs, and the CLIs in
// child processes. Every case must be a valid result or one clean TpError — no crash, no file left,
// no backend memory left allocated, none slower than the bound — and the RSS must stay bounded.
// `bun run fuzz N` runs more (same checks, figures per surface). Surfaces whose ../shared fixtures
// are absent are skipped, saying so.
import { expect, test } from "bun:test";
import { formatReport, RSS_LIMIT_BYTES, runFuzz } from "./fuzz/harness.ts";

const CASES = Number(process.env.TP_FUZZ_CASES ?? 8000);

test(`fuzz: ${CASES} mutated safetensors / GGUF files through readers, loaders and CLIs`, async () => {
  const { reports, rssGrowth } = await runFuzz({ cases: CASES, seed: 21 });
  for (const r of reports) console.log(formatReport(r));
  for (const r of reports) {
    if (r.skipped) continue;
    const where = `${r.surface}: ${r.problems.join("; ")}`;
    expect(r.crashes, where).toBe(0);
    expect(r.filesLeft, where).toBe(0);
    expect(r.leaks, where).toBe(0);
    expect(r.slow, where).toBe(0);
    expect(r.valid + r.cleanErrors).toBe(r.cases);
    // The mutations do break things, and some still parse (the checks past the parser are exercised).
    if (r.cases >= 50) {
      expect(r.cleanErrors, r.surface).toBeGreaterThan(r.cases / 4);
      expect(r.valid, r.surface).toBeGreaterThan(0);
    }
  }
  // Values that pass the parser and the loaders but not the stage checks: NaN weights reach E_NUMERIC.
  const numeric = reports.reduce((a, r) => a + (r.byCode.E_NUMERIC ?? 0), 0);
  if (reports.some((r) => !r.skipped && r.surface.startsWith("krea2"))) expect(numeric).toBeGreaterThan(0);
  expect(rssGrowth).toBeLessThan(RSS_LIMIT_BYTES);
}, 600_000);
