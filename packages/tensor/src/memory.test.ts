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

test("peakWindow measures the peak inside the window and leaves the overall peak alone", () => {
  const m = new MemoryAccount("vulkan");
  m.reserve(500);
  m.release(500); // overall peak 500
  m.reserve(100);
  const end = m.peakWindow(); // opens at 100
  m.reserve(200); // 300
  m.release(200); // 100
  m.reserve(50); // 150
  expect(end()).toBe(300);
  m.reserve(1000); // after the window: not counted in it
  expect(m.peak).toBe(1150);
  const empty = m.peakWindow();
  expect(empty()).toBe(1150); // nothing reserved: the use when it opened
});
