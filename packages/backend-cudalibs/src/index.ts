/**
 * @tp/backend-cudalibs: the NVIDIA libraries backend, registered as `cuda` (`--backend cuda`).
 *
 * Not implemented yet: cuBLASLt and cuDNN (plus small PTX kernels) through bun:ffi. Until it lands, {@link createBackend} throws E_UNSUPPORTED, so asking
 * for this backend is a clear error and never a silent fallback to another backend.
 */

import { type Backend, type BackendOptions, TpError } from "@tp/tensor";

/**
 * Create the `cuda` backend.
 * @throws TpError E_UNSUPPORTED — this backend is not implemented in this build.
 */
export function createBackend(_options: BackendOptions = {}): Backend {
  throw new TpError(
    "E_UNSUPPORTED",
    "backend cuda is not implemented in this build yet; use --backend cpu (or vulkan where it starts)",
  );
}
