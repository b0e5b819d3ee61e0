// The shared conformance suite: every case of ./cases on every backend of SUITE_BACKENDS. A backend
// that cannot start skips with its reason in the test name; a case whose op / formats the backend
// does not `supports()` skips saying so; a case whose fixture is missing skips naming the file.
import { afterAll, describe, expect, test } from "bun:test";
import type { Backend } from "@tp/tensor";
import { runCase } from "./case.ts";
import { allCases } from "./cases/index.ts";
import { SUITE_BACKENDS, startBackend } from "./suite.ts";

const cases = allCases();
const started = await Promise.all(SUITE_BACKENDS.map(startBackend));
const live: Backend[] = [];

afterAll(() => {
  for (const b of live) b.dispose();
});

SUITE_BACKENDS.forEach((sb, i) => {
  const s = started[i];
  if (s?.backend === undefined) {
    test.skip(`${sb.label}: cannot start (${s?.reason})`, () => {});
    return;
  }
  const backend = s.backend;
  live.push(backend);
  describe(sb.label, () => {
    for (const c of cases) {
      if (c.skip !== undefined) {
        test.skip(`${c.name} [skipped: ${c.skip}]`, () => {});
      } else if (!backend.supports(c.op, c.formats)) {
        test.skip(`${c.name} [skipped: ${sb.backend} does not support ${c.op} with ${c.formats.join(" × ")}]`, () => {});
      } else {
        test(c.name, async () => {
          expect(await runCase(backend, c)).toEqual([]);
        });
      }
    }
  });
});
