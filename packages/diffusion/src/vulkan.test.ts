// Krea 2 end to end on the Vulkan backend (issue 6), against the goldens of ../shared/testdata/krea2-tiny
// with the cpu backend's tolerances: the shared definition in testing/device-goldens.ts (every DiT
// mode, ConvRot linears bit for bit as the cpu backend, the Wan 2.1 VAE decode, the turbo_cfg1 run).
// Skipped with the reason when ../shared is absent or no Vulkan device starts. On Mesa's llvmpipe
// (2 cores) the file takes about 20–30 s, most of it the first use of each kernel (pipeline compiles).
//
// Measured here (normalised max error): float modes ≤ 6e-7; whole-model W8A8 3.4e-3, W4A4 7e-7;
// `native` bf16 5.4e-7 (the Vulkan matmul keeps f32 x, so native bf16 is the float result); VAE 5.1e-6.
import { createBackend as createVulkan } from "@tp/backend-vulkan";
import { describeKrea2Goldens } from "./testing/device-goldens.ts";

await describeKrea2Goldens("Vulkan", () => createVulkan());
