// Krea 2 end to end on the ptx backend's PTX simulator (`simulate: "sm_86"`: every kernel executed in
// JavaScript, each memory access bounds-checked; @tp/backend-ptx README, "The PTX simulator"), against
// the goldens of ../shared/testdata/krea2-tiny with the cpu backend's tolerances: the shared definition
// in testing/device-goldens.ts, as vulkan.test.ts runs it. Says what the kernels compute on whole
// models without a GPU; nothing about speed. Skipped with the reason when ../shared is absent or the
// backend cannot start. The simulator is slow: each DiT mode takes 6–14 s and the sampling run about
// 50 s on 2 cores (the file 150 s), so every time limit is 6 × llvmpipe's (180 s per test, 360 s for
// the sampling run).
//
// Measured here (normalised max error): float modes ≤ 6.6e-7; whole-model W8A8 3.7e-3, W4A4 6.4e-7;
// `native` bf16 2.4e-3 and int8 5.2e-3 (the ptx bf16 tensor-core matmul rounds x to bf16, as the cpu
// backend does); VAE 4.1e-6.
import { type BackendOptions, loadBackend } from "@tp/tensor";
import { describeKrea2Goldens } from "./testing/device-goldens.ts";

await describeKrea2Goldens(
  "ptx (simulated sm_86)",
  () => loadBackend("ptx", { simulate: "sm_86" } as BackendOptions),
  {
    timeScale: 6,
  },
);
