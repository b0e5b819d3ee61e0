// The LLM end to end on the Vulkan backend (issue 6) against the cpu backend: the shared definition in
// testing/device-parity.ts (the shared tiny GGUFs, next-token probabilities of every prompt row, the
// same 32-token greedy continuation, each step's probabilities within a stated tolerance). Skipped
// with the reason when ../shared/models is absent or no Vulkan device starts (no loader, no driver, the
// shim not built); on Mesa's llvmpipe the whole file takes a few seconds.
//
// Measured here: ≤ 2e-6 on all nine files at PROB_TOL (Vulkan's 32 × 32 tiles or split-K against the
// cpu's kernels; before the Vulkan matmul quantized GGUF activations, Q8_0 / Q4_0 differed by up to
// 6e-2 and the greedy tokens of llama-tiny-Q4_0 and qwen3-tiny-Q4_0 at their first step).
import { createBackend as createVulkan } from "@tp/backend-vulkan";
import { describeDeviceParity } from "./testing/device-parity.ts";

await describeDeviceParity("Vulkan", () => createVulkan());
