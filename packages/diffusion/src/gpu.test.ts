// Krea 2 tiny goldens on the real ptx and cuda backends: the shared definition in
// testing/device-goldens.ts (as vulkan.test.ts and ptx-sim.test.ts run it) for each backend that
// TP_GPU_GOLDENS names — "ptx", "cuda", "ptx,cuda", or "1" for both. `bun run test:gpu` sets it, one
// backend per step, on the GPU host; unset (the ordinary `bun test`), the file is one skipped test.
// Without a GPU each block is skipped with the backend's reason (no libcuda.so.1, no device).
// Time limits: 2 × llvmpipe's, for the first use of each kernel (the driver's PTX JIT) and the cpu
// backend's share of the linear tests.
import { test } from "bun:test";
import { loadBackend } from "@tp/tensor";
import { gpuGoldenBackends } from "@tp/tensor/testing";
import { describeKrea2Goldens } from "./testing/device-goldens.ts";

const names = gpuGoldenBackends();
if (names.length === 0)
  test.skip("skipped: TP_GPU_GOLDENS is unset (bun run test:gpu sets it to ptx / cuda on the GPU host)", () => {});
for (const name of names) await describeKrea2Goldens(name, () => loadBackend(name), { timeScale: 2 });
