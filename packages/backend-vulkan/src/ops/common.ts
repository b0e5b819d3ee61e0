/**
 * What the kernels of the vulkan backend share: the view of the backend they need ({@link VkOpHost}),
 * push-constant packing, dimension merging for strided kernels, splits that keep every binding within
 * maxStorageBufferRange, and grid sizes. Arguments reach a kernel already checked (@tp/tensor's op
 * front-end); what is left here is what only this device can refuse (E_UNSUPPORTED naming op, backend,
 * device and limit). Scratch tensors of a kernel live in `host.scope`; their device memory lives on
 * until the queued work that uses it has run (tp_vk_buffer_destroy defers it).
 */
import {
  type DTypeName,
  dtypeBytes,
  type KernelSignatures,
  type OpName,
  type Shape,
  type Tensor,
  TpError,
  type Weight,
} from "@tp/tensor";
import type { Binding, VulkanBuffer, VulkanContext, VulkanDeviceInfo } from "../ffi.ts";
import type { KernelCache, KernelName } from "../kernels.ts";
import type { ResidentWeight } from "./matmul.ts";

/** Where a tensor's elements are for a kernel: a binding, and the element offset inside it. */
export interface BoundTensor {
  readonly binding: Binding;
  /** Element offset of the view's first element from the start of the binding. */
  readonly offset: number;
}

/** The parts of VulkanBackend the op implementations use. */
export interface VkOpHost {
  /** "vulkan". */
  readonly name: string;
  readonly ctx: VulkanContext;
  readonly info: VulkanDeviceInfo;
  readonly kernels: KernelCache;
  /** Invocations per workgroup of the 1-D kernels. */
  readonly workgroup: number;
  /** A new contiguous tensor (accounted). @throws E_OOM */
  alloc(shape: Shape, dtype: DTypeName, name?: string): Tensor;
  /** Run `fn` and free every tensor it allocated except what it returns (BackendBase.scope). */
  scope<T>(fn: () => T): T;
  /** Upload host data as a new tensor. */
  upload(
    data: Float32Array | Int32Array | Uint32Array | Uint8Array,
    shape: Shape,
    dtype: DTypeName,
    name?: string,
  ): Tensor;
  /** The device buffer of a live tensor with storage (for ops that bind windows of it themselves). */
  bufferOf(t: Tensor, op: string): VulkanBuffer;
  /** The resident device copy of a weight (VulkanBackend.makeResident), if any. */
  residentWeight(w: Weight): ResidentWeight | undefined;
  /** A streamed weight's copy in the next slot of the stream ring (VulkanBackend.setStreamRing), if any. */
  streamWeight(w: Weight): ResidentWeight | undefined;
  /**
   * The binding of a live tensor of this backend (the whole buffer, or the window of it the view spans
   * when the buffer is past maxStorageBufferRange).
   * @throws TpError E_STATE for a freed or foreign tensor; E_UNSUPPORTED when the view spans more than
   *   maxStorageBufferRange
   */
  bind(t: Tensor, op: string): BoundTensor;
}

/**
 * The kernel of `op` on this backend: the {@link KernelSignatures} entry with the host first (the table
 * binds it), so its parameters take their types and meaning from that entry.
 */
export type VkKernel<Op extends OpName> = (host: VkOpHost, ...args: Parameters<KernelSignatures[Op]>) => void;

/** A TpError E_UNSUPPORTED for op `op`. */
export function unsupported(op: string, message: string): TpError {
  return new TpError("E_UNSUPPORTED", `op ${op} on backend vulkan: ${message}`);
}

/** Push constants of a kernel, packed in the order of its GLSL block (4-byte scalars, std430). */
export class Push {
  readonly #bytes: Uint8Array;
  readonly #view: DataView;
  #at = 0;

  /** @param bytes the size of the kernel's block */
  constructor(bytes: number) {
    this.#bytes = new Uint8Array(bytes);
    this.#view = new DataView(this.#bytes.buffer);
  }

  #next(): number {
    const at = this.#at;
    if (at + 4 > this.#bytes.byteLength) {
      throw new TpError("E_INTERNAL", `push constants overflow their ${this.#bytes.byteLength} bytes`);
    }
    this.#at += 4;
    return at;
  }

  /** A uint (0 ≤ v < 2^32). @throws TpError E_UNSUPPORTED past 32 bits (a size the kernels cannot index) */
  u32(v: number): this {
    if (!Number.isInteger(v) || v < 0 || v > 0xffffffff) {
      throw new TpError(
        "E_UNSUPPORTED",
        `backend vulkan: ${v} does not fit the 32-bit indices of its kernels`,
      );
    }
    this.#view.setUint32(this.#next(), v, true);
    return this;
  }

  /** An int (−2^31 ≤ v < 2^31). */
  i32(v: number): this {
    this.#view.setInt32(this.#next(), v, true);
    return this;
  }

  /** A float, rounded to f32. */
  f32(v: number): this {
    this.#view.setFloat32(this.#next(), v, true);
    return this;
  }

  /** `count` uints: the values, then zeros. */
  u32s(values: readonly number[], count: number): this {
    for (let i = 0; i < count; i++) this.u32(values[i] ?? 0);
    return this;
  }

  /** The packed bytes (the whole block; unwritten fields are 0). */
  bytes(): Uint8Array {
    return this.#bytes;
  }
}

/**
 * Merge dimensions that every operand walks contiguously (stride[k] = stride[k+1] · shape[k+1]) and
 * drop size-1 dimensions, so strided kernels loop over as few dimensions as possible.
 * @returns the merged shape and each operand's strides (same order as given)
 */
export function mergeDims(
  shape: readonly number[],
  strides: readonly (readonly number[])[],
): { shape: number[]; strides: number[][] } {
  const outShape: number[] = [];
  const outStrides: number[][] = strides.map(() => []);
  for (let k = 0; k < shape.length; k++) {
    const d = shape[k] as number;
    if (d === 1) continue;
    const last = outShape.length - 1;
    const mergeable =
      last >= 0 && strides.every((s, i) => (outStrides[i] as number[])[last] === (s[k] as number) * d);
    if (mergeable) {
      outShape[last] = (outShape[last] as number) * d;
      strides.forEach((s, i) => {
        (outStrides[i] as number[])[last] = s[k] as number;
      });
    } else {
      outShape.push(d);
      strides.forEach((s, i) => {
        (outStrides[i] as number[]).push(s[k] as number);
      });
    }
  }
  return { shape: outShape, strides: outStrides };
}

/** One operand of a strided kernel: a tensor and how the kernel walks it (merged strides, offset). */
export interface StridedOperand {
  readonly t: Tensor;
  /** Element strides over the kernel's (merged) shape. */
  readonly strides: readonly number[];
  /** Element offset of the first element in the tensor's storage. */
  readonly offset: number;
}

/**
 * Split a strided kernel's iteration space along its first dimension so that what each operand
 * spans in one piece fits one binding (maxStorageBufferRange, less an alignment's slack). One piece
 * when everything fits. Each piece is the operand views to bind.
 * @throws TpError E_UNSUPPORTED when even one index of the first dimension spans too much
 */
export function splitForBindings(
  host: VkOpHost,
  op: string,
  shape: readonly number[],
  operands: readonly StridedOperand[],
): Tensor[][] {
  const views = (start: number, count: number) =>
    operands.map((o) =>
      o.t.view({
        shape: shape.length === 0 ? [] : [count, ...shape.slice(1)],
        strides: [...o.strides],
        offset: o.offset + (shape.length === 0 ? 0 : start * (o.strides[0] as number)),
      }),
    );
  const info = host.info;
  const slack = Math.max(info.minStorageBufferOffsetAlignment, 16);
  const fits = operands.every((o) => {
    const size = dtypeBytes(o.t.dtype);
    const buffer = host.bufferOf(o.t, op);
    if (Math.ceil(buffer.bytes / 16) * 16 <= info.maxStorageBufferRange) return true;
    let span = 1;
    shape.forEach((d, k) => {
      span += (d - 1) * (o.strides[k] as number);
    });
    return span * size + slack <= info.maxStorageBufferRange;
  });
  const d0 = shape[0] ?? 1;
  if (fits || shape.length === 0) return [views(0, d0)];
  let count = d0;
  for (const o of operands) {
    const size = dtypeBytes(o.t.dtype);
    const limit = Math.floor((info.maxStorageBufferRange - slack) / size);
    let inner = 1;
    shape.forEach((d, k) => {
      if (k > 0) inner += (d - 1) * (o.strides[k] as number);
    });
    const s0 = o.strides[0] as number;
    if (s0 > 0) count = Math.min(count, Math.floor((limit - inner) / s0) + 1);
  }
  if (count < 1) {
    throw unsupported(
      op,
      `${operands.map((o) => o.t.describe()).join(", ")}: one row spans more than maxStorageBufferRange (${info.maxStorageBufferRange} bytes) of ${info.name}`,
    );
  }
  const pieces: Tensor[][] = [];
  for (let start = 0; start < d0; start += count) pieces.push(views(start, Math.min(count, d0 - start)));
  return pieces;
}

/** Row-major strides of a shape (the one of @tp/tensor). */
export { contiguousStrides } from "@tp/tensor";

/**
 * Workgroup counts for `groups` workgroups: x up to the device's limit, the rest in y (kernels
 * compute the linear group as y · countX + x and skip the excess).
 * @throws TpError E_UNSUPPORTED when even x · y cannot hold them
 */
export function grid(info: VulkanDeviceInfo, groups: number, op: string): [number, number, number] {
  const maxX = info.maxWorkgroupCount[0];
  const x = Math.min(groups, maxX);
  const y = Math.ceil(groups / Math.max(x, 1));
  if (y > info.maxWorkgroupCount[1]) {
    throw unsupported(op, `${groups} workgroups are more than ${info.name} can launch at once`);
  }
  return [x, y, 1];
}

/** Dispatch `kernel` over `n` invocations of the host's workgroup size (1-D kernels). */
export function dispatch1d(
  host: VkOpHost,
  op: string,
  kernel: KernelName,
  extraSpec: readonly number[],
  bindings: readonly Binding[],
  push: Push,
  n: number,
): void {
  if (n === 0) return;
  const pipeline = host.kernels.get(kernel, [host.workgroup, ...extraSpec]);
  host.ctx.dispatch(pipeline, bindings, push.bytes(), grid(host.info, Math.ceil(n / host.workgroup), op));
}

/** Dispatch `kernel` with one workgroup of `wg` invocations per item (row, group, tile). */
export function dispatchGroups(
  host: VkOpHost,
  op: string,
  kernel: KernelName,
  spec: readonly number[],
  bindings: readonly Binding[],
  push: Push,
  groups: number,
): void {
  if (groups === 0) return;
  const pipeline = host.kernels.get(kernel, spec);
  host.ctx.dispatch(pipeline, bindings, push.bytes(), grid(host.info, groups, op));
}
