/**
 * `Tensor`: a handle on a backend's memory — shape, dtype, strided layout and the backend that owns the
 * bytes. Model code passes tensors between backend ops and never touches their data; data reaches the
 * host only through an explicit `await backend.read(t)` (../shared/ARCHITECTURE.md, "One model
 * definition, every backend").
 *
 * Views (reshape, permute, transpose, slice, broadcastTo) share the storage of the tensor they come from.
 */

import type { Backend } from "./backend.ts";
import { type DTypeName, dtypeBytes } from "./dtype.ts";
import { TpError } from "./errors.ts";
import * as S from "./shape.ts";

/**
 * Memory owned by one backend. `handle` is the backend's own (a pointer, a buffer object); nobody else
 * looks inside. `freed` turns true when the backend frees it; every later use is an E_STATE error.
 */
export interface Storage {
  /** Backend-unique id, for messages and debugging. */
  readonly id: number;
  /** Size in bytes. */
  readonly byteLength: number;
  /** Backend-private handle. */
  readonly handle: unknown;
  /** True once freed. */
  freed: boolean;
}

/**
 * A typed, strided view on a backend's storage.
 *
 * @example
 * const x = backend.alloc([2, 3, 4], "f32");   // [batch, seq_len, hidden]
 * const y = x.permute(0, 2, 1);               // [batch, hidden, seq_len], same storage
 */
export class Tensor {
  /** The backend that owns the storage. */
  readonly backend: Backend;
  /** The memory this view walks. */
  readonly storage: Storage;
  /** Element type. */
  readonly dtype: DTypeName;
  /** Shape, element strides and element offset into the storage. */
  readonly layout: S.Layout;
  /** Optional name for messages (a checkpoint key, "hidden_states"). */
  readonly name: string | undefined;

  /**
   * Backends create tensors; programs get them from `backend.alloc` / `upload` / ops.
   * @throws TpError E_SHAPE when the layout is malformed (negative or fractional strides or offset,
   *   a stride count that differs from the rank) or reaches outside the storage.
   */
  constructor(backend: Backend, storage: Storage, dtype: DTypeName, layout: S.Layout, name?: string) {
    S.checkLayout(layout, name ?? "tensor");
    const span = S.storageSpan(layout);
    const bytes = dtypeBytes(dtype);
    if (span.hi * bytes > storage.byteLength) {
      throw new TpError(
        "E_SHAPE",
        `${name ?? "tensor"} view ${S.formatShape(layout.shape)} (strides [${layout.strides.join(", ")}], ` +
          `offset ${layout.offset}) of ${dtype} reaches past its storage of ${storage.byteLength} bytes`,
      );
    }
    this.backend = backend;
    this.storage = storage;
    this.dtype = dtype;
    this.layout = layout;
    this.name = name;
  }

  /** Shape, outermost first. */
  get shape(): S.Shape {
    return this.layout.shape;
  }
  /** Element strides. */
  get strides(): readonly number[] {
    return this.layout.strides;
  }
  /** Number of dimensions. */
  get rank(): number {
    return this.layout.shape.length;
  }
  /** Number of elements. */
  get numel(): number {
    return S.numel(this.layout.shape);
  }
  /** Bytes of the elements (numel × element size), not of the storage. */
  get byteLength(): number {
    return this.numel * dtypeBytes(this.dtype);
  }
  /** True when the elements are contiguous in row-major order. */
  get isContiguous(): boolean {
    return S.isContiguous(this.layout);
  }

  /** @throws TpError E_STATE when the storage was freed. */
  assertLive(): void {
    if (this.storage.freed) {
      throw new TpError("E_STATE", `${this.describe()} was used after its memory was freed`);
    }
  }

  /** `"hidden_states f32 [2, 3] on cpu"`. */
  describe(): string {
    return `${this.name ?? "tensor"} ${this.dtype} ${S.formatShape(this.shape)} on ${this.backend.name}`;
  }

  /** A new view of the same storage. @throws TpError E_SHAPE, E_STATE */
  view(layout: S.Layout, name = this.name): Tensor {
    this.assertLive();
    return new Tensor(this.backend, this.storage, this.dtype, layout, name);
  }

  /** Reshape without copying (`-1` infers one size). @throws TpError E_SHAPE when a copy is needed. */
  reshape(...shape: number[]): Tensor {
    return this.view(S.reshape(this.layout, shape));
  }
  /** Reorder dimensions (torch.permute). @throws TpError E_SHAPE */
  permute(...dims: number[]): Tensor {
    return this.view(S.permute(this.layout, dims));
  }
  /** Swap two dimensions. @throws TpError E_SHAPE */
  transpose(dim0: number, dim1: number): Tensor {
    return this.view(S.transpose(this.layout, dim0, dim1));
  }
  /** Python-style slice along one dimension. @throws TpError E_SHAPE */
  slice(dim: number, start: number, end?: number, step = 1): Tensor {
    return this.view(S.slice(this.layout, dim, start, end, step));
  }
  /** Broadcast view (stride 0 on expanded dimensions). @throws TpError E_SHAPE */
  broadcastTo(shape: S.Shape): Tensor {
    return this.view(S.broadcastTo(this.layout, shape));
  }

  /**
   * Free this tensor's storage (every view of it dies) unless it is already freed, so that
   * `using t = backend.matmul(x, w)` releases `t` at the end of the block.
   */
  [Symbol.dispose](): void {
    if (!this.storage.freed) this.backend.free(this);
  }

  toString(): string {
    return `Tensor(${this.describe()})`;
  }
}
