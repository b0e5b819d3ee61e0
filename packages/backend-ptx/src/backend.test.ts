// createBackend where the driver is missing (this machine): one E_UNSUPPORTED line, "backend ptx
// cannot start: …", which the conformance suite shows as its skip reason; a bad device selector is
// E_ARG. On a machine with a driver these cases skip and `bun run test:gpu` covers the rest.
import { describe, expect, test } from "bun:test";
import { loadBackend, TpError } from "@tp/tensor";
import { loadCudaDriver } from "./driver/cuda.ts";
import { createBackend, parseDeviceOrdinal } from "./index.ts";

const hasDriver = (() => {
  try {
    loadCudaDriver();
    return true;
  } catch {
    return false;
  }
})();

describe("createBackend without libcuda.so.1", () => {
  test.skipIf(hasDriver)("one E_UNSUPPORTED line naming the library and how to get it", async () => {
    let err: unknown;
    try {
      await loadBackend("ptx");
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(TpError);
    const e = err as TpError;
    expect(e.code).toBe("E_UNSUPPORTED");
    expect(e.message).toStartWith("backend ptx cannot start: libcuda.so.1 (the CUDA driver) was not found");
    expect(e.message).toContain("TP_CUDA_LIB_DIR");
    expect(e.message).not.toContain("\n");
  });
  test("a device selector that is not an ordinal is E_ARG", () => {
    expect(() => createBackend({ device: "rtx" })).toThrow(
      "backend ptx cannot start: TP_CUDA_DEVICE / --device must be a device ordinal (0, 1, …), got 'rtx'",
    );
    expect(parseDeviceOrdinal(undefined)).toBe(0);
    expect(parseDeviceOrdinal(" 2 ")).toBe(2);
  });
});
