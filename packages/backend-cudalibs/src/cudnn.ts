/**
 * cuDNN 9 (`libcudnn.so.9`) through bun:ffi: loading, the version, a handle on the backend's stream.
 * No op uses it yet: attention stays on @tp/backend-ptx's kernel until the backend graph API (fused
 * scaled-dot-product attention) is bound here. The backend loads it when present and names its
 * version; its absence does not stop the backend.
 *
 * Source: cuDNN 9 API reference (cudnn_graph.h: cudnnGetVersion, cudnnCreate, cudnnDestroy,
 * cudnnSetStream, cudnnGetErrorString).
 */
import { CString, type FFIFunction, type Pointer } from "bun:ffi";
import { TpError } from "@tp/tensor";
import { loadLibrary } from "./libraries.ts";

export const CUDNN_SONAMES = ["libcudnn.so.9"] as const;

export const CUDNN_SIGNATURES = {
  cudnnGetVersion: { args: [], returns: "u64" },
  cudnnGetErrorString: { args: ["i32"], returns: "ptr" },
  cudnnCreate: { args: ["ptr"], returns: "i32" },
  cudnnDestroy: { args: ["ptr"], returns: "i32" },
  cudnnSetStream: { args: ["ptr", "ptr"], returns: "i32" },
} as const satisfies Record<string, FFIFunction>;

const HOW_TO_GET =
  "cuDNN 9 comes with PyTorch's nvidia-cudnn-cu13 wheel (site-packages/nvidia/cudnn/lib) or NVIDIA's cudnn9 packages";

/** The functions {@link Cudnn} calls (the loaded library, or a fake in tests). */
// biome-ignore lint/suspicious/noExplicitAny: bun:ffi functions are typed by their declarations at run time
export type CudnnSymbols = { [K in keyof typeof CUDNN_SIGNATURES]: (...args: any[]) => any };

/** A cuDNN handle bound to a stream. */
export class Cudnn {
  readonly path: string;
  /** cudnnGetVersion(): e.g. 91000 for 9.10.0. */
  readonly version: number;
  readonly handle: number;
  readonly #s: CudnnSymbols;

  /** @throws TpError naming cudnnCreate / cudnnSetStream and cuDNN's text for the status */
  constructor(path: string, symbols: CudnnSymbols, stream: number) {
    this.path = path;
    this.#s = symbols;
    this.version = Number(symbols.cudnnGetVersion());
    const h = new BigUint64Array(1);
    this.#check("cudnnCreate", symbols.cudnnCreate(h));
    this.handle = Number(h[0]);
    this.#check("cudnnSetStream", symbols.cudnnSetStream(this.handle, stream));
  }

  #check(call: string, status: number): void {
    if (status === 0) return;
    const p = this.#s.cudnnGetErrorString(status);
    const text = typeof p === "number" && p !== 0 ? String(new CString(p as Pointer)) : "no description";
    throw new TpError("E_UNSUPPORTED", `${call} failed: ${text} (cudnnStatus_t ${status})`);
  }

  /** "9.10.0" from the version number (major·10000 + minor·100 + patch in cuDNN 9). */
  versionString(): string {
    const v = this.version;
    return `${Math.floor(v / 10000)}.${Math.floor((v % 10000) / 100)}.${v % 100}`;
  }

  destroy(): void {
    this.#s.cudnnDestroy(this.handle);
  }
}

/** Load cuDNN 9 and make a handle on `stream`. @throws TpError as ./libraries.ts loadLibrary, or naming the call */
export function loadCudnn(stream: number, env: Record<string, string | undefined> = process.env): Cudnn {
  const lib = loadLibrary(
    { label: "cuDNN", sonames: CUDNN_SONAMES, symbols: CUDNN_SIGNATURES, howToGet: HOW_TO_GET },
    env,
  );
  return new Cudnn(lib.path, lib.symbols, stream);
}
