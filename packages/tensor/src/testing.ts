// Test-only helpers of @tp/tensor (not exported from the package).
import type { BackendCapabilities } from "./backend.ts";
import { BackendBase, type BackendOptions } from "./base.ts";
import { isTpError, type TpErrorCode } from "./errors.ts";

/** A minimal host-memory backend: storage is a Uint8Array; the only op it claims is cast (unimplemented). */
export class HostBackend extends BackendBase {
  readonly name = "host";
  readonly device = "test host memory";
  constructor(options: BackendOptions = {}) {
    super("host", options);
  }
  capabilities(): BackendCapabilities {
    return { ops: ["cast"], weightFormats: ["f32"], dtypes: ["f32", "f16"] };
  }
  protected allocStorage(bytes: number): Uint8Array {
    return new Uint8Array(bytes);
  }
  protected freeStorage(): void {}
  protected writeStorage(h: unknown, offset: number, data: Uint8Array): void {
    (h as Uint8Array).set(data, offset);
  }
  protected async readStorage(h: unknown, offset: number, length: number): Promise<Uint8Array> {
    return (h as Uint8Array).slice(offset, offset + length);
  }
}

/** The TpError code `fn` throws (another exception fails the test). */
export function errorCode(fn: () => unknown): TpErrorCode {
  try {
    fn();
  } catch (e) {
    if (isTpError(e)) return e.code;
    throw e;
  }
  throw new Error("expected a TpError");
}
