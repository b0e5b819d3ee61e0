import { expect, test } from "bun:test";
import { isTpError } from "./errors.ts";
import { formatBytes, MemoryAccount } from "./memory.ts";

test("current, peak and budget", () => {
  const m = new MemoryAccount("cpu", 1000);
  m.reserve(400, "a");
  m.reserve(500, "b");
  m.release(400);
  m.reserve(300, "c");
  expect(m.stats()).toEqual({ owner: "cpu", current: 800, peak: 900, budget: 1000, allocations: 2 });
  try {
    m.reserve(201, "blocks.3.mlp.up.weight");
    throw new Error("no error");
  } catch (e) {
    expect(isTpError(e, "E_OOM")).toBe(true);
    expect((e as Error).message).toBe(
      "cpu: blocks.3.mlp.up.weight needs 201 B but 800 B of the 1000 B budget is in use; raise the budget or free memory",
    );
  }
  expect(m.current).toBe(800); // a refused reservation changes nothing
  m.resetPeak();
  expect(m.peak).toBe(800);
  expect(() => m.release(801)).toThrow(/release of 801 bytes with 800 reserved/);
  expect(() => new MemoryAccount("x", -1)).toThrow(/budget/);
  expect(formatBytes(1536)).toBe("1.50 KiB");
  expect(formatBytes(3 * 2 ** 30)).toBe("3.00 GiB");
});
