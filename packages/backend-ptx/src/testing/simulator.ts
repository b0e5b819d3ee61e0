// Test helper of @tp/backend-ptx (not exported): the PTX backend on the simulator for a test file.
import { afterAll } from "bun:test";
import { PtxBackend } from "../backend.ts";

/**
 * A PtxBackend running on the PTX simulator as an sm_86 device, disposed after the calling file's
 * tests; or, where it cannot start, the first line of its error for the file's skip reason.
 */
export function startSimulator(): PtxBackend | string {
  let b: PtxBackend;
  try {
    b = new PtxBackend({ simulate: "sm_86" });
  } catch (e) {
    return e instanceof Error ? (e.message.split("\n")[0] ?? e.message) : String(e);
  }
  afterAll(() => b.dispose());
  return b;
}
