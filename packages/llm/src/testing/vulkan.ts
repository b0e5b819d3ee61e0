/**
 * The Vulkan backend for the LLM tests that compare it with the cpu backend, or why it cannot start
 * on this machine (the first line of its error: no loader, no device, shaders not built ...), for the
 * tests' skip reasons.
 */
import { createBackend as createVulkan } from "@tp/backend-vulkan";
import type { Backend } from "@tp/tensor";

/** A started Vulkan backend, or the reason there is none. */
export function startVulkan(): { backend?: Backend; reason?: string } {
  try {
    return { backend: createVulkan() };
  } catch (e) {
    const why = e instanceof Error ? e.message : String(e);
    return { reason: why.split("\n")[0] ?? why };
  }
}
