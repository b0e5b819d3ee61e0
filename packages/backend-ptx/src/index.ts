/**
 * @tp/backend-ptx: the PTX backend, registered as `ptx` (`--backend ptx`).
 *
 * Not implemented yet: PTX text emitted from TypeScript, loaded and launched through the CUDA driver API (`libcuda.so.1`) with bun:ffi. Until it lands, {@link createBackend} throws E_UNSUPPORTED, so asking
 * for this backend is a clear error and never a silent fallback to another backend.
 */

import { type Backend, type BackendOptions, TpError } from "@tp/tensor";

/**
 * Create the `ptx` backend.
 * @throws TpError E_UNSUPPORTED — this backend is not implemented in this build.
 */
export function createBackend(_options: BackendOptions = {}): Backend {
  throw new TpError(
    "E_UNSUPPORTED",
    "backend ptx is not implemented in this build yet; use --backend cpu (or vulkan where it starts)",
  );
}
