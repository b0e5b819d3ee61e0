/**
 * @tp/backend-vulkan: the Vulkan backend, registered as `vulkan` (`--backend vulkan`).
 *
 * libtp_vulkan.so (native/vulkan, a thin C shim over the Vulkan loader, which it opens at run time)
 * is loaded through bun:ffi by `./ffi.ts`; the compute kernels are GLSL compiled to SPIR-V at build
 * time. `./backend.ts` is the `Backend`: device memory with accounting, command batches, and the
 * kernel table of ./ops/table.ts (what `capabilities()` lists); @tp/tensor's op front-end checks
 * arguments and calls it; everything else is E_UNSUPPORTED naming op, backend and format.
 */

export {
  createBackend,
  parseDeviceSelector,
  VulkanBackend,
  type VulkanBackendOptions,
} from "./backend.ts";
export {
  type Binding,
  buildUnavailableReason,
  type ContextOptions,
  checkLibraryFile,
  defaultShaderDir,
  defaultVulkanLibraryPath,
  loadVulkanLibrary,
  type Pointer,
  TP_VK_ABI_VERSION,
  TP_VK_FEATURES,
  TP_VK_FLAGS,
  TP_VK_STATUS,
  type VulkanBuffer,
  VulkanContext,
  type VulkanDeviceInfo,
  type VulkanFeature,
  VulkanLibrary,
  type VulkanPipeline,
  type VulkanStats,
  type VulkanSymbols,
} from "./ffi.ts";
export { KERNELS, KernelCache, type KernelName, type KernelSpec } from "./kernels.ts";
export { vulkanKernelTable } from "./ops/table.ts";
