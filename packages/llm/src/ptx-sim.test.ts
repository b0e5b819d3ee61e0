// The LLM end to end on the ptx backend's PTX simulator (`simulate: "sm_86"`: every kernel executed in
// JavaScript, each memory access bounds-checked; @tp/backend-ptx README, "The PTX simulator") against
// the cpu backend: the shared definition in testing/device-parity.ts, as vulkan.test.ts runs it (the
// shared tiny GGUFs, every prompt row's probabilities, 32 greedy tokens, each step's probabilities).
// Says what the kernels compute on whole models without a GPU; nothing about speed. Skipped with the
// reason when ../shared/models is absent or the backend cannot start. The whole file takes about 3 min
// on 2 cores; each file's time limit is 4 × llvmpipe's (240 s).
import { type BackendOptions, loadBackend } from "@tp/tensor";
import { describeDeviceParity } from "./testing/device-parity.ts";

await describeDeviceParity(
  "ptx (simulated sm_86)",
  () => loadBackend("ptx", { simulate: "sm_86" } as BackendOptions),
  {
    timeScale: 4,
  },
);
