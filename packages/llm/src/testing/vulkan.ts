/**
 * The Vulkan backend for the LLM tests that compare it with the cpu backend, or why it cannot start
 * on this machine, for the tests' skip reasons.
 */
import { createBackend as createVulkan } from "@tp/backend-vulkan";
import type { Backend } from "@tp/tensor";
import { startBackend } from "@tp/tensor/testing";

/** A started Vulkan backend, or the reason there is none. */
export function startVulkan(): { backend?: Backend; reason?: string } {
  return startBackend(() => createVulkan());
}
