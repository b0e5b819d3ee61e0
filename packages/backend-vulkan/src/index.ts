/**
 * @tp/backend-vulkan: the Vulkan backend, registered as `vulkan` (`--backend vulkan`).
 *
 * Not implemented yet: Vulkan 1.2+ compute: a C shim over the Vulkan loader (`native/vulkan`) and GLSL compute shaders compiled to SPIR-V at build time. Until it lands, {@link createBackend} throws E_UNSUPPORTED, so asking
 * for this backend is a clear error and never a silent fallback to another backend.
 */

import { type Backend, type BackendOptions, TpError } from "@tp/tensor";

/**
 * Create the `vulkan` backend.
 * @throws TpError E_UNSUPPORTED — this backend is not implemented in this build.
 */
export function createBackend(_options: BackendOptions = {}): Backend {
  throw new TpError(
    "E_UNSUPPORTED",
    "backend vulkan is not implemented in this build yet; use --backend cpu",
  );
}
