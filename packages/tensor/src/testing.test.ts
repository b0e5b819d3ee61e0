import { describe, expect, test } from "bun:test";
import { errorCode, gpuGoldenBackends, thrownTpError } from "./testing.ts";

describe("gpuGoldenBackends (TP_GPU_GOLDENS)", () => {
  test("names one backend, a comma list (spaces trimmed, empty entries dropped) or 1 for both", () => {
    expect(gpuGoldenBackends("ptx")).toEqual(["ptx"]);
    expect(gpuGoldenBackends(" cuda ")).toEqual(["cuda"]);
    expect(gpuGoldenBackends("ptx, cuda,")).toEqual(["ptx", "cuda"]);
    expect(gpuGoldenBackends("1")).toEqual(["ptx", "cuda"]);
  });
  test("unset or blank is none", () => {
    expect(gpuGoldenBackends("")).toEqual([]);
    expect(gpuGoldenBackends("  ")).toEqual([]);
  });
  test("anything else is E_ARG naming the variable and the entry", () => {
    expect(errorCode(() => gpuGoldenBackends("ptx,vulkan"))).toBe("E_ARG");
    expect(thrownTpError(() => gpuGoldenBackends("0")).message).toBe(
      "TP_GPU_GOLDENS: '0' is not a GPU backend; expected ptx, cuda, ptx,cuda or 1",
    );
  });
});
