// Test-only helpers of @tp/tensor: `@tp/tensor/testing` (a subpath export, not part of the main entry).
import type { Backend } from "./backend.ts";
import { BackendBase, type BackendOptions } from "./base.ts";
import { decodeToF32, encodeFromF32 } from "./convert.ts";
import { dtypeBytes } from "./dtype.ts";
import { isTpError, TpError, type TpErrorCode } from "./errors.ts";
import type { KernelTable } from "./kernels.ts";
import { elementOffsets } from "./shape.ts";
import type { Tensor } from "./tensor.ts";

/**
 * A minimal host-memory backend: storage is a Uint8Array; its kernel table has one entry, cast between
 * f32 and f16 (a copy for the same dtype), which the front-end tests count calls of.
 */
export class HostBackend extends BackendBase {
  readonly name = "host";
  readonly device = "test host memory";
  /** Calls of the cast kernel (the front-end must check arguments before it runs). */
  castCalls = 0;
  override readonly kernelTable: KernelTable = {
    cast: {
      dtypes: ["f32", "f16"],
      run: (out, x, saturate) => {
        this.castCalls++;
        const src = this.bytes(x);
        const dst = this.bytes(out);
        if (x.dtype === out.dtype) dst.set(src);
        else if (x.dtype === "f32") {
          const values = new Float32Array(src.slice().buffer);
          dst.set(encodeFromF32(values, out.dtype, { saturate }));
        } else dst.set(new Uint8Array(decodeToF32(src, x.dtype, x.numel).buffer));
      },
    },
  };
  constructor(options: BackendOptions = {}) {
    super("host", options);
  }
  /** The bytes of a contiguous tensor (the only layout the cast kernel here takes). */
  bytes(t: Tensor): Uint8Array {
    if (!t.isContiguous)
      throw new TpError("E_UNSUPPORTED", `op cast on backend host: ${t.describe()} is strided`);
    const size = dtypeBytes(t.dtype);
    const at = t.layout.offset * size;
    return (t.storage.handle as Uint8Array).subarray(at, at + t.numel * size);
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

/** The TpError `fn` throws, with its file / tensor fields (another exception, or none, fails the test). */
export function thrownTpError(fn: () => unknown): TpError {
  try {
    fn();
  } catch (e) {
    if (isTpError(e)) return e;
    throw e;
  }
  throw new Error("expected a TpError");
}

/** The code and message of the TpError `fn` throws (another exception, or none, fails the test). */
export function thrown(fn: () => unknown): { code: TpErrorCode; message: string } {
  const e = thrownTpError(fn);
  return { code: e.code, message: e.message };
}

/** The TpError code `fn` throws (another exception fails the test). */
export function errorCode(fn: () => unknown): TpErrorCode {
  return thrown(fn).code;
}

/**
 * A host-memory backend whose kernel table the test writes (`new TableBackend((b) => ({ ... }))`), for
 * the front-end tests: `f32(t)` reads any f32 view synchronously, `write(t, values)` fills a
 * contiguous f32 tensor.
 */
export class TableBackend extends BackendBase {
  readonly name = "table";
  readonly device = "test host memory with a kernel table";
  override readonly kernelTable: KernelTable;
  constructor(table: (b: TableBackend) => KernelTable, options: BackendOptions = {}) {
    super("table", options);
    this.kernelTable = table(this);
  }
  /** The f32 elements of any view, in row-major order. */
  f32(t: Tensor): Float32Array {
    const all = new Float32Array((t.storage.handle as Uint8Array).buffer);
    const offsets = elementOffsets(t.layout);
    return Float32Array.from(offsets, (o) => all[o] as number);
  }
  /** Fill a contiguous f32 tensor. */
  write(t: Tensor, values: ArrayLike<number>): void {
    new Float32Array((t.storage.handle as Uint8Array).buffer, t.layout.offset * 4, t.numel).set(values);
  }
  protected allocStorage(bytes: number): Uint8Array {
    return new Uint8Array(Math.ceil(bytes / 8) * 8);
  }
  protected freeStorage(): void {}
  protected writeStorage(h: unknown, offset: number, data: Uint8Array): void {
    (h as Uint8Array).set(data, offset);
  }
  protected async readStorage(h: unknown, offset: number, length: number): Promise<Uint8Array> {
    return (h as Uint8Array).slice(offset, offset + length);
  }
}

/**
 * A backend from `create`, or why it cannot start on this machine (the first line of its error:
 * no loader, no device, library not built …), for a test's skip reason.
 */
export function startBackend(create: () => Backend): { backend?: Backend; reason?: string } {
  try {
    return { backend: create() };
  } catch (e) {
    const why = e instanceof Error ? e.message : String(e);
    return { reason: why.split("\n")[0] ?? why };
  }
}

/** The GPU backends the device tests (`gpu.test.ts` of @tp/diffusion and @tp/llm) run on. */
export type GpuGoldenBackend = "ptx" | "cuda";

/**
 * The backends TP_GPU_GOLDENS names (`bun run test:gpu` sets it, one backend per step, on the GPU host):
 * "ptx", "cuda", a comma list of them, or "1" for both; unset or blank, none (the file's one skipped test).
 * @param raw the variable's value (default: process.env.TP_GPU_GOLDENS)
 * @throws TpError E_ARG naming TP_GPU_GOLDENS and the entry that is not ptx or cuda
 */
export function gpuGoldenBackends(raw = process.env.TP_GPU_GOLDENS ?? ""): GpuGoldenBackend[] {
  const s = raw.trim();
  const names =
    s === "1"
      ? ["ptx", "cuda"]
      : s
          .split(",")
          .map((n) => n.trim())
          .filter((n) => n !== "");
  for (const n of names)
    if (n !== "ptx" && n !== "cuda")
      throw new TpError(
        "E_ARG",
        `TP_GPU_GOLDENS: '${n}' is not a GPU backend; expected ptx, cuda, ptx,cuda or 1`,
      );
  return names as GpuGoldenBackend[];
}
