// The cuda backend's attention and conv2d routing with cuDNN, without a GPU: a host whose "device
// memory" is host memory at real addresses, cuDNN the stand-in libcudnn.so.9 built with cc
// (../test/fake-cudnn.c) loaded through bun:ffi, and in place of the PTX kernels a base table that
// computes on the host and, as the PTX entries do, takes attention and conv2d in f32 only (casts,
// copies and adds on any float dtype). Checks which path each dtype / mask / library state takes, that
// the f32 → bf16 route is opt-in only, and the numbers of every path against the float64 references of
// ./testing.ts. Skips without cc.
import { ptr } from "bun:ffi";
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { LaunchArg, ptx } from "@tp/backend-ptx";
import {
  type AttentionParams,
  BackendBase,
  type DTypeName,
  dtypeBytes,
  type KernelTable,
  type Tensor,
  type Weight,
} from "@tp/tensor";
import { type CudaOpHost, cudaKernelTable, cudnnAttentionRoute } from "./backend.ts";
import { CublasLt } from "./cublaslt.ts";
import { type Cudnn, loadCudnn } from "./cudnn.ts";
import { fakeCublasLt } from "./fake-cublaslt.ts";
import { bf16BitsRne, bf16Value, buildFakeCudnn, referenceAttention, referenceConv2d } from "./testing.ts";

interface HostStorage {
  readonly bytes: Uint8Array;
  readonly addr: bigint;
}

/** Element i of a float buffer of `dtype`. */
function readElement(v: DataView, dtype: DTypeName, i: number): number {
  if (dtype === "f32") return v.getFloat32(4 * i, true);
  const bits = v.getUint16(2 * i, true);
  return dtype === "f16" ? (new Float16Array(new Uint16Array([bits]).buffer)[0] as number) : bf16Value(bits);
}
function writeElement(v: DataView, dtype: DTypeName, i: number, x: number): void {
  if (dtype === "f32") v.setFloat32(4 * i, x, true);
  else if (dtype === "f16")
    v.setUint16(2 * i, new Uint16Array(new Float16Array([x]).buffer)[0] as number, true);
  else v.setUint16(2 * i, bf16BitsRne(x), true);
}

class DnnHost extends BackendBase implements CudaOpHost {
  readonly name = "fake-cuda";
  readonly device = "fake";
  readonly sm = 90;
  readonly w4a4 = false;
  readonly stream = 5;
  readonly fp8Activations = false;
  readonly lt = new CublasLt(fakeCublasLt().symbols);
  readonly calls: string[] = [];
  readonly #kernels = new Map<string, ptx.KernelSource>();
  constructor(
    readonly cudnn: Cudnn | null,
    readonly cudnnF32Attention = false,
  ) {
    super("fake-cuda");
  }
  protected allocStorage(bytes: number): HostStorage {
    // 256-byte aligned, as the device allocator's blocks are
    // backed by an ArrayBuffer from the start: a small typed array's storage moves when a view of it is made
    const raw = new Uint8Array(new ArrayBuffer(bytes + 512));
    const base = BigInt(ptr(raw));
    const skip = Number((256n - (base % 256n)) % 256n);
    return { bytes: raw.subarray(skip, skip + Math.max(bytes, 1)), addr: base + BigInt(skip) };
  }
  protected freeStorage(): void {}
  protected writeStorage(h: unknown, offset: number, data: Uint8Array): void {
    (h as HostStorage).bytes.set(data, offset);
  }
  protected async readStorage(h: unknown, offset: number, length: number): Promise<Uint8Array> {
    return (h as HostStorage).bytes.slice(offset, offset + length);
  }
  address(t: Tensor): bigint {
    return (t.storage.handle as HostStorage).addr + BigInt(t.layout.offset * dtypeBytes(t.dtype));
  }
  /** The values of a view, in row-major order of its shape. */
  values(t: Tensor): number[] {
    const st = t.storage.handle as HostStorage;
    const v = new DataView(st.bytes.buffer, st.bytes.byteOffset, st.bytes.byteLength);
    const out: number[] = [];
    const idx = new Array<number>(t.rank).fill(0);
    for (let n = 0; n < t.numel; n++) {
      let at = t.layout.offset;
      for (let d = 0; d < t.rank; d++) at += (idx[d] as number) * (t.strides[d] as number);
      out.push(readElement(v, t.dtype, at));
      for (let d = t.rank - 1; d >= 0; d--) {
        idx[d] = (idx[d] as number) + 1;
        if ((idx[d] as number) < (t.shape[d] as number)) break;
        idx[d] = 0;
      }
    }
    return out;
  }
  /** Write `xs` into a contiguous tensor. */
  put(t: Tensor, xs: readonly number[]): void {
    const st = t.storage.handle as HostStorage;
    const v = new DataView(st.bytes.buffer, st.bytes.byteOffset, st.bytes.byteLength);
    for (const [i, x] of xs.entries()) writeElement(v, t.dtype, t.layout.offset + i, x);
  }
  tensor(shape: number[], dtype: DTypeName, xs: readonly number[]): Tensor {
    const t = this.alloc(shape, dtype);
    this.put(t, xs);
    return t;
  }
  workspace() {
    return { ptr: 0x10n, bytes: 1 << 20 };
  }
  kernel(name: string, make: () => ptx.KernelSource): ptx.KernelSource {
    let k = this.#kernels.get(name);
    if (k === undefined) {
      k = make();
      this.#kernels.set(name, k);
    }
    return k;
  }
  launch(_k: ptx.KernelSource, _g: readonly [number, number, number], _a: Record<string, LaunchArg>): void {
    throw new Error("no PTX launch expected here");
  }
  fill(): void {}
  weightBytes(w: Weight): Tensor {
    return this.upload(w.data, [w.data.byteLength], "u8", w.name);
  }
  weightScale(w: Weight): Tensor {
    return this.upload(new Float32Array(w.shape[0]), [w.shape[0]], "f32");
  }
  table(key: string, make: () => Float64Array): Tensor {
    const d = make();
    return this.upload(d, [d.length], "f64", key);
  }
}

const same = (a: readonly number[], b: readonly number[]) =>
  a.length === b.length && a.every((x, i) => x === b[i]);

/** The PTX stand-in: host computations; attention and conv2d refuse anything but f32, as the PTX entries do. */
function hostBase(host: DnnHost): KernelTable {
  const f32only = (op: string, ...ts: (Tensor | null)[]) => {
    for (const t of ts) if (t !== null && t.dtype !== "f32") throw new Error(`PTX ${op} got ${t.dtype}`);
  };
  return {
    cast: {
      dtypes: ["f32", "f16", "bf16"],
      run: (out, x) => {
        host.calls.push(`cast ${x.dtype}→${out.dtype}`);
        host.put(out, host.values(x));
      },
    },
    copy: {
      dtypes: ["f32", "f16", "bf16"],
      run: (out, x) => {
        host.calls.push(`copy ${x.dtype}`);
        host.put(out, host.values(x));
      },
    },
    add: {
      dtypes: ["f32", "f16", "bf16"],
      run: (out, a, b) => {
        host.calls.push("add");
        const [va, vb] = [host.values(a), host.values(b)];
        host.put(
          out,
          va.map((x, i) => x + (vb[i] as number)),
        );
      },
    },
    attention: {
      dtypes: ["f32"],
      run: (out, q, k, v, p: AttentionParams) => {
        f32only("attention", q, k, v, out);
        host.calls.push("ptx attention");
        host.put(out, referenceAttention(host.values(q), host.values(k), host.values(v), p));
      },
    },
    conv2d: {
      dtypes: ["f32"],
      run: (out, x, w, bias, stride, padding) => {
        f32only("conv2d", x, w, bias, out);
        host.calls.push("ptx conv2d");
        const [n, c, h, wi] = x.shape as number[];
        const [k, , r, s] = w.shape as number[];
        host.put(
          out,
          referenceConv2d(host.values(x), host.values(w), bias === null ? null : host.values(bias), {
            n: n as number,
            c: c as number,
            h: h as number,
            w: wi as number,
            k: k as number,
            r: r as number,
            s: s as number,
            stride: [...stride] as [number, number],
            pad: [...padding] as [number, number],
          }),
        );
      },
    },
  };
}

const cc = Bun.which("cc") ?? Bun.which("gcc");
const dir = mkdtempSync(join(tmpdir(), "tp-fake-cudnn-be-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const values = (n: number, seed: number) =>
  Array.from({ length: n }, (_, i) => (((i * 29 + seed * 53) % 89) / 89) * 2 - 1);
/** Rounded to `dtype`, as the tensors hold them. */
const rounded = (xs: number[], dtype: DTypeName) =>
  dtype === "f32"
    ? [...new Float32Array(xs)]
    : dtype === "f16"
      ? [...new Float16Array(xs)]
      : xs.map((x) => bf16Value(bf16BitsRne(x)));

function params(p: Partial<AttentionParams> & { headDim: number }): AttentionParams {
  return {
    batch: 1,
    heads: 4,
    kvHeads: 2,
    sq: 3,
    skv: 6,
    headDimV: p.headDim,
    scale: 1 / Math.sqrt(p.headDim),
    causal: true,
    qOffset: 3,
    window: 0,
    fullPrefix: 0,
    softcap: 0,
    ...p,
  };
}

describe("routing rules", () => {
  const p = params({ headDim: 64 });
  test("f16 / bf16 with no mask or causal; f32 only with the opt-in (through bf16)", () => {
    expect(cudnnAttentionRoute(["f16", "f16", "f16"], p, 90, false)).toBe("f16");
    expect(cudnnAttentionRoute(["bf16", "bf16", "bf16"], { ...p, causal: false }, 80, false)).toBe("bf16");
    expect(cudnnAttentionRoute(["f32", "f32", "f32"], p, 90, false)).toBeNull();
    expect(cudnnAttentionRoute(["f32", "f32", "f32"], p, 90, true)).toBe("bf16");
    expect(cudnnAttentionRoute(["f16", "bf16", "f16"], p, 90, true)).toBeNull();
  });
  test("masks and shapes it does not take stay on PTX", () => {
    const f16 = ["f16", "f16", "f16"] as const;
    expect(cudnnAttentionRoute(f16, { ...p, window: 4 }, 90, false)).toBeNull();
    expect(cudnnAttentionRoute(f16, { ...p, fullPrefix: 2 }, 90, false)).toBeNull();
    expect(cudnnAttentionRoute(f16, { ...p, softcap: 30 }, 90, false)).toBeNull();
    expect(cudnnAttentionRoute(f16, { ...p, qOffset: -1 }, 90, false)).toBeNull();
    expect(cudnnAttentionRoute(f16, { ...p, headDim: 60, headDimV: 60 }, 90, false)).toBeNull();
    expect(cudnnAttentionRoute(f16, { ...p, headDimV: 32 }, 90, false)).toBeNull();
    expect(cudnnAttentionRoute(f16, { ...p, headDim: 256, headDimV: 256 }, 90, false)).toBe("f16");
    expect(cudnnAttentionRoute(f16, { ...p, headDim: 256, headDimV: 256 }, 86, false)).toBeNull();
    expect(cudnnAttentionRoute(f16, { ...p, sq: 1 }, 90, false)).toBeNull();
    expect(cudnnAttentionRoute(f16, p, 75, false)).toBeNull();
  });
});

describe("attention and conv2d through the stand-in cuDNN", () => {
  if (cc === null) {
    test.skip("skipped: no C compiler (cc)", () => {});
    return;
  }
  const build = buildFakeCudnn(dir);
  test("the stand-in builds", () => {
    expect(build.exitCode).toBe(0);
  });
  const setup = (withCudnn: boolean, optIn = false) => {
    const host = new DnnHost(withCudnn ? loadCudnn(5, { TP_CUDA_LIB_DIR: dir }) : null, optIn);
    const table = cudaKernelTable(host, hostBase(host));
    return {
      host,
      attention: (out: Tensor, q: Tensor, k: Tensor, v: Tensor, p: AttentionParams) =>
        (table.attention as NonNullable<KernelTable["attention"]>).run(out, q, k, v, p),
      conv: (
        out: Tensor,
        x: Tensor,
        w: Tensor,
        b: Tensor | null,
        stride: [number, number],
        pad: [number, number],
      ) => (table.conv2d as NonNullable<KernelTable["conv2d"]>).run(out, x, w, b, stride, pad),
      dtypes: [table.attention?.dtypes, table.conv2d?.dtypes],
    };
  };
  const qkv = (host: DnnHost, p: AttentionParams, dtype: DTypeName) => {
    const q = rounded(values(p.batch * p.heads * p.sq * p.headDim, 1), dtype);
    const k = rounded(values(p.batch * p.kvHeads * p.skv * p.headDim, 2), dtype);
    const v = rounded(values(p.batch * p.kvHeads * p.skv * p.headDim, 3), dtype);
    return {
      ref: referenceAttention(q, k, v, p),
      q: host.tensor([p.batch, p.heads, p.sq, p.headDim], dtype, q),
      k: host.tensor([p.batch, p.kvHeads, p.skv, p.headDim], dtype, k),
      v: host.tensor([p.batch, p.kvHeads, p.skv, p.headDim], dtype, v),
      out: host.alloc([p.batch, p.heads, p.sq, p.headDim], dtype),
    };
  };
  const maxErr = (a: number[], b: number[]) => Math.max(...a.map((x, i) => Math.abs(x - (b[i] as number))));

  test("the table takes f32 / f16 / bf16 attention and f32 / f16 conv2d, with or without cuDNN", () => {
    for (const w of [true, false]) {
      expect(setup(w).dtypes).toEqual([
        ["f32", "f16", "bf16"],
        ["f32", "f16"],
      ]);
    }
  });

  test("f16 causal attention: cuDNN, no conversion, the plan built once", () => {
    const { host, attention } = setup(true);
    const p = params({ headDim: 8 });
    const t = qkv(host, p, "f16");
    attention(t.out, t.q, t.k, t.v, p);
    attention(t.out, t.q, t.k, t.v, p);
    expect(host.calls).toEqual([]);
    expect(host.cudnn?.heuristicQueries).toBe(1);
    expect(maxErr(host.values(t.out), t.ref)).toBeLessThan(2e-3);
  });

  test("bf16 attention from a transposed (strided) k: one copy, then cuDNN", () => {
    const { host, attention } = setup(true);
    const p = params({ headDim: 8, causal: false });
    const t = qkv(host, p, "bf16");
    // k stored [b, hk, d, skv] and viewed as [b, hk, skv, d]
    const kv = host.values(t.k);
    const kT = host.alloc([1, 2, 8, 6], "bf16");
    const kTv: number[] = [];
    for (let h = 0; h < 2; h++)
      for (let e = 0; e < 8; e++) for (let j = 0; j < 6; j++) kTv.push(kv[(h * 6 + j) * 8 + e] as number);
    host.put(kT, kTv);
    attention(t.out, t.q, kT.transpose(2, 3), t.v, p);
    expect(host.calls).toEqual(["copy bf16"]);
    expect(maxErr(host.values(t.out), t.ref)).toBeLessThan(1.6e-2);
  });

  test("f16 with a head_dim cuDNN does not take (12): f32 PTX kernel between exact conversions", () => {
    const { host, attention } = setup(true);
    const p = params({ headDim: 12 });
    const t = qkv(host, p, "f16");
    attention(t.out, t.q, t.k, t.v, p);
    expect(host.calls).toEqual([
      "cast f16→f32",
      "cast f16→f32",
      "cast f16→f32",
      "ptx attention",
      "cast f32→f16",
    ]);
    expect(host.cudnn?.heuristicQueries).toBe(0);
    expect(maxErr(host.values(t.out), t.ref)).toBeLessThan(1e-3);
  });

  test("f32 attention: PTX by default; through bf16 cuDNN only with the opt-in", () => {
    const p = params({ headDim: 8 });
    const plain = setup(true);
    const a = qkv(plain.host, p, "f32");
    plain.attention(a.out, a.q, a.k, a.v, p);
    expect(plain.host.calls).toEqual(["ptx attention"]);
    expect(maxErr(plain.host.values(a.out), a.ref)).toBeLessThan(1e-6);
    const opt = setup(true, true);
    const b = qkv(opt.host, p, "f32");
    opt.attention(b.out, b.q, b.k, b.v, p);
    expect(opt.host.calls).toEqual(["cast f32→bf16", "cast f32→bf16", "cast f32→bf16", "cast bf16→f32"]);
    const err = maxErr(opt.host.values(b.out), b.ref);
    expect(err).toBeLessThan(3e-2);
    expect(err).toBeGreaterThan(1e-6); // the bf16 rounding shows: this path changes the numerics
  });

  test("without libcudnn.so.9: every dtype on the PTX kernel", () => {
    const { host, attention } = setup(false);
    const p = params({ headDim: 8 });
    const t = qkv(host, p, "bf16");
    attention(t.out, t.q, t.k, t.v, p);
    expect(host.calls.at(-2)).toBe("ptx attention");
    expect(maxErr(host.values(t.out), t.ref)).toBeLessThan(8e-3);
  });

  test("conv2d f32 + bias: cuDNN, then the bias added; f16 from a strided view; mixed dtypes on PTX", () => {
    const { host, conv } = setup(true);
    const s = {
      n: 1,
      c: 3,
      h: 6,
      w: 5,
      k: 2,
      r: 3,
      s: 3,
      stride: [1, 2] as [number, number],
      pad: [1, 1] as [number, number],
    };
    const xs = values(s.n * s.c * s.h * s.w, 4);
    const ws = values(s.k * s.c * s.r * s.s, 5);
    const bs = [0.5, -0.25];
    const out = host.alloc([1, 2, 6, 3], "f32");
    conv(
      out,
      host.tensor([1, 3, 6, 5], "f32", xs),
      host.tensor([2, 3, 3, 3], "f32", ws),
      host.tensor([2], "f32", bs),
      s.stride,
      s.pad,
    );
    expect(host.calls).toEqual(["add"]);
    expect(
      maxErr(host.values(out), referenceConv2d(rounded(xs, "f32"), rounded(ws, "f32"), bs, s)),
    ).toBeLessThan(1e-5);

    host.calls.length = 0;
    const x16 = rounded(xs, "f16");
    const w16 = rounded(ws, "f16");
    // x stored [1, 3, 5, 6] and viewed as [1, 3, 6, 5]
    const xT: number[] = [];
    for (let c = 0; c < 3; c++)
      for (let i = 0; i < 5; i++) for (let j = 0; j < 6; j++) xT.push(x16[(c * 6 + j) * 5 + i] as number);
    const o16 = host.alloc([1, 2, 6, 3], "f16");
    conv(
      o16,
      host.tensor([1, 3, 5, 6], "f16", xT).transpose(2, 3),
      host.tensor([2, 3, 3, 3], "f16", w16),
      null,
      s.stride,
      s.pad,
    );
    expect(host.calls).toEqual(["copy f16"]);
    expect(maxErr(host.values(o16), referenceConv2d(x16, w16, null, s))).toBeLessThan(8e-3);

    host.calls.length = 0;
    const o = host.alloc([1, 2, 6, 3], "f16");
    conv(
      o,
      host.tensor([1, 3, 6, 5], "f16", x16),
      host.tensor([2, 3, 3, 3], "f32", ws),
      null,
      s.stride,
      s.pad,
    );
    expect(host.calls).toEqual(["cast f16→f32", "ptx conv2d", "cast f32→f16"]);
    expect(host.cudnn?.heuristicQueries).toBe(2);
  });

  test("conv2d without libcudnn.so.9: f16 through the f32 PTX kernel", () => {
    const { host, conv } = setup(false);
    const s = {
      n: 1,
      c: 2,
      h: 4,
      w: 4,
      k: 1,
      r: 1,
      s: 1,
      stride: [1, 1] as [number, number],
      pad: [0, 0] as [number, number],
    };
    const x = rounded(values(32, 6), "f16");
    const w = rounded([0.5, -1], "f16");
    const o = host.alloc([1, 1, 4, 4], "f16");
    conv(o, host.tensor([1, 2, 4, 4], "f16", x), host.tensor([1, 2, 1, 1], "f16", w), null, s.stride, s.pad);
    expect(host.calls).toEqual(["cast f16→f32", "cast f16→f32", "ptx conv2d", "cast f32→f16"]);
    expect(same(host.values(o), rounded(referenceConv2d(x, w, null, s), "f16"))).toBe(true);
  });
});
