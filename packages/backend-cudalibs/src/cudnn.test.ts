// The cuDNN backend-API binding of ./cudnn.ts called for real: a stand-in libcudnn.so.9 built here with
// cc (../test/fake-cudnn.c: descriptor records checked against the documented attribute types and
// counts, the heuristics answering three engine configurations, the graph interpreted on host memory
// in float64) is loaded through TP_CUDA_LIB_DIR like the real one. Attention (f16 / bf16, grouped
// heads, causal with a query offset) and conv2d (f32 / f16, stride and padding) go through plan and
// execute with host addresses standing for device ones, and are compared with the float64 references
// of ./testing.ts (written from the definitions, not from the stand-in). Skips without cc.
import { dlopen, ptr } from "bun:ffi";
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { thrownTpError } from "@tp/tensor/testing";
import {
  type Cudnn,
  cudnnError,
  cudnnStatusName,
  forbiddenNotes,
  loadCudnn,
  type SdpaShape,
} from "./cudnn.ts";
import {
  CUDNN_ATTR,
  CUDNN_BACKEND,
  CUDNN_DATA_TYPE,
  CUDNN_NUMERICAL_NOTE,
  CUDNN_POINTWISE,
  CUDNN_TYPE,
} from "./nvidia-h.ts";
import { bf16BitsRne, bf16Value, buildFakeCudnn, referenceAttention, referenceConv2d } from "./testing.ts";

const cc = Bun.which("cc") ?? Bun.which("gcc");
const dir = mkdtempSync(join(tmpdir(), "tp-fake-cudnn-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Deterministic values in [−1, 1). */
const values = (n: number, seed: number) =>
  Array.from({ length: n }, (_, i) => (((i * 37 + seed * 101) % 97) / 97) * 2 - 1);

const ws = new Uint8Array(1 << 12);
const workspace = { ptr: BigInt(ptr(ws)), bytes: ws.byteLength };
const addr = (a: Parameters<typeof ptr>[0]) => BigInt(ptr(a));

describe("cuDNN through bun:ffi (a stand-in library built with cc)", () => {
  if (cc === null) {
    test.skip("skipped: no C compiler (cc)", () => {});
    return;
  }
  const build = buildFakeCudnn(dir);
  test("the stand-in builds", () => {
    expect(build.stderr).toBe("");
    expect(build.exitCode).toBe(0);
  });
  const fake = dlopen(join(dir, "libcudnn.so.9"), {
    tp_fake_live: { args: [], returns: "i32" },
    tp_fake_handles: { args: [], returns: "i32" },
    tp_fake_last_engine: { args: [], returns: "i32" },
    tp_fake_stream: { args: [], returns: "u64" },
    tp_fake_math: { args: ["i32"], returns: "i32" },
  }).symbols;
  const open = (): Cudnn => loadCudnn(0x5, { TP_CUDA_LIB_DIR: dir });

  test("load from TP_CUDA_LIB_DIR: version 9.10.0, a handle on the stream", () => {
    const dnn = open();
    expect(dnn.path).toBe(join(dir, "libcudnn.so.9"));
    expect(dnn.versionString()).toBe("9.10.0");
    expect(fake.tp_fake_stream()).toBe(5n);
    dnn.destroy();
    expect(fake.tp_fake_handles()).toBe(0);
  });

  for (const [dtype, tol] of [
    ["f16", 2e-3],
    ["bf16", 1.6e-2],
  ] as const) {
    test(`attention ${dtype}: grouped heads (4 over 2), causal with qOffset 2, then full; plans cached`, () => {
      const live = fake.tp_fake_live();
      const dnn = open();
      const base = { batch: 2, heads: 4, kvHeads: 2, sq: 5, skv: 7, headDim: 8 };
      const { batch, heads, kvHeads, sq, skv, headDim } = base;
      // inputs exact in the element type: round once here and give both sides the rounded values
      const toBits = (xs: number[]) =>
        dtype === "f16" ? new Uint16Array(new Float16Array(xs).buffer) : new Uint16Array(xs.map(bf16BitsRne));
      const fromBits = (b: Uint16Array) =>
        dtype === "f16" ? [...new Float16Array(b.buffer, b.byteOffset, b.length)] : [...b].map(bf16Value);
      const qb = toBits(values(batch * heads * sq * headDim, 1));
      const kb = toBits(values(batch * kvHeads * skv * headDim, 2));
      const vb = toBits(values(batch * kvHeads * skv * headDim, 3));
      for (const causal of [true, false]) {
        const shape: SdpaShape = { dtype, ...base, causal };
        const plan = dnn.sdpaPlan(shape);
        expect(plan).not.toBeNull();
        if (plan === null) return;
        // engine 7 carries the tensor-core note, which f16 / bf16 data may use
        expect(plan.engine).toBe(7);
        expect(plan.workspaceBytes).toBe(1024);
        const ob = new Uint16Array(batch * heads * sq * headDim);
        const scale = 1 / Math.sqrt(headDim);
        for (let rep = 0; rep < 2; rep++)
          dnn.sdpa(
            dnn.sdpaPlan(shape) as NonNullable<typeof plan>,
            { q: addr(qb), k: addr(kb), v: addr(vb), o: addr(ob), scale, qOffset: 2 },
            workspace,
          );
        const want = referenceAttention(fromBits(qb), fromBits(kb), fromBits(vb), {
          ...base,
          scale,
          causal,
          qOffset: 2,
        });
        const got = fromBits(ob);
        const err = Math.max(...got.map((g, i) => Math.abs(g - (want[i] as number))));
        expect(err).toBeLessThan(tol);
        // the first query of the causal case sees keys 0..2 only: not the full softmax
        if (causal) {
          const full = referenceAttention(fromBits(qb), fromBits(kb), fromBits(vb), {
            ...base,
            scale,
            causal: false,
            qOffset: 2,
          });
          expect(Math.abs((got[0] as number) - (full[0] as number))).toBeGreaterThan(0.05);
        }
      }
      // the causal mask's precisions (cudnn-frontend's): GEN_INDEX f32 math, the offset in int32, CMP_GE boolean
      const P = CUDNN_POINTWISE;
      const D = CUDNN_DATA_TYPE;
      expect(fake.tp_fake_math(P.CUDNN_POINTWISE_GEN_INDEX)).toBe(D.CUDNN_DATA_FLOAT);
      expect(fake.tp_fake_math(P.CUDNN_POINTWISE_ADD)).toBe(D.CUDNN_DATA_INT32);
      expect(fake.tp_fake_math(P.CUDNN_POINTWISE_CMP_GE)).toBe(D.CUDNN_DATA_BOOLEAN);
      expect(fake.tp_fake_math(P.CUDNN_POINTWISE_EXP)).toBe(D.CUDNN_DATA_FLOAT);
      expect(dnn.heuristicQueries).toBe(2);
      expect(dnn.planCount()).toBe(2);
      dnn.destroy();
      expect(fake.tp_fake_live()).toBe(live);
    });
  }

  test("conv2d f32: stride 2, padding 1; TF32 (tensor-core) engine refused, the next one fails to plan, the third runs", () => {
    const dnn = open();
    const s = {
      n: 2,
      c: 3,
      h: 7,
      w: 6,
      k: 4,
      r: 3,
      s: 3,
      stride: [2, 2] as [number, number],
      pad: [1, 1] as [number, number],
    };
    const x = new Float32Array(values(s.n * s.c * s.h * s.w, 4));
    const w = new Float32Array(values(s.k * s.c * s.r * s.s, 5));
    const plan = dnn.convPlan({
      dtype: "f32",
      n: s.n,
      cIn: s.c,
      h: s.h,
      w: s.w,
      cOut: s.k,
      kh: s.r,
      kw: s.s,
      stride: s.stride,
      padding: s.pad,
    });
    expect(plan?.engine).toBe(9);
    const y = new Float32Array(s.n * s.k * 4 * 3);
    dnn.conv(plan as NonNullable<typeof plan>, { x: addr(x), w: addr(w), y: addr(y) }, workspace);
    expect(fake.tp_fake_last_engine()).toBe(9);
    const want = referenceConv2d(x, w, null, s);
    expect(want.length).toBe(y.length);
    for (let i = 0; i < y.length; i++)
      expect(Math.abs((y[i] as number) - (want[i] as number))).toBeLessThan(1e-5);
    dnn.destroy();
  });

  test("conv2d f16: 1×1 and 3×3 (padding 1) kernels; the tensor-core engine is kept for f16", () => {
    const dnn = open();
    for (const [r, pad] of [
      [1, 0],
      [3, 1],
    ] as const) {
      const s = {
        n: 1,
        c: 4,
        h: 5,
        w: 5,
        k: 3,
        r,
        s: r,
        stride: [1, 1] as [number, number],
        pad: [pad, pad] as [number, number],
      };
      const xh = new Float16Array(values(s.n * s.c * s.h * s.w, 6));
      const wh = new Float16Array(values(s.k * s.c * r * r, 7));
      const plan = dnn.convPlan({
        dtype: "f16",
        n: 1,
        cIn: 4,
        h: 5,
        w: 5,
        cOut: 3,
        kh: r,
        kw: r,
        stride: [1, 1],
        padding: [pad, pad],
      });
      expect(plan?.engine).toBe(7);
      const y = new Float16Array(s.k * 25);
      dnn.conv(plan as NonNullable<typeof plan>, { x: addr(xh), w: addr(wh), y: addr(y) }, workspace);
      const want = referenceConv2d([...xh], [...wh], null, s);
      for (let i = 0; i < y.length; i++)
        expect(Math.abs((y[i] as number) - (want[i] as number))).toBeLessThan(
          4e-3 * Math.max(1, Math.abs(want[i] as number)),
        );
    }
    dnn.destroy();
  });

  test("a shape the library refuses: null (cached, PTX keeps it) with the reason", () => {
    const live = fake.tp_fake_live();
    const dnn = open();
    const shape: SdpaShape = {
      dtype: "f16",
      batch: 1,
      heads: 1,
      kvHeads: 1,
      sq: 4,
      skv: 70000,
      headDim: 64,
      causal: true,
    };
    expect(dnn.sdpaPlan(shape)).toBeNull();
    expect(dnn.sdpaPlan(shape)).toBeNull();
    expect(dnn.whyNoPlan.get("sdpa:f16:1x1/1x4x70000x64:causal")).toBe(
      "operation graph: CUDNN_STATUS_NOT_SUPPORTED_SHAPE",
    );
    expect(dnn.heuristicQueries).toBe(0);
    // refused while the graph is described (the convolution operation's finalize)
    const conv = {
      dtype: "f32",
      n: 1,
      cIn: 1,
      h: 40,
      w: 40,
      cOut: 1,
      kh: 33,
      kw: 3,
      stride: [1, 1],
      padding: [0, 0],
    } as const;
    expect(dnn.convPlan(conv)).toBeNull();
    expect(dnn.whyNoPlan.get("conv:f32:1x1x40x40:1x33x3:s1,1:p0,0")).toStartWith(
      "cudnnBackendFinalize failed: CUDNN_STATUS_NOT_SUPPORTED_SHAPE (3002)",
    );
    dnn.destroy();
    expect(fake.tp_fake_live()).toBe(live);
  });

  test("failing calls: TpError naming the call, the status name and cuDNN's text", () => {
    const live = fake.tp_fake_live();
    const dnn = open();
    const owned: number[] = [];
    const t = dnn.create(CUDNN_BACKEND.CUDNN_BACKEND_TENSOR_DESCRIPTOR, owned);
    // a data type given as INT64: the attribute's documented type is CUDNN_TYPE_DATA_TYPE
    const e = thrownTpError(() =>
      dnn.set(t, CUDNN_ATTR.CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE.CUDNN_TYPE_INT64, [0], "probe"),
    );
    expect(e.code).toBe("E_ARG");
    expect(e.message).toBe(
      "cudnnBackendSetAttribute failed: CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE (2010): fake: a bad parameter; attribute 901, probe",
    );
    // nine dimensions: past CUDNN_DIM_MAX (8)
    const d = thrownTpError(() =>
      dnn.set(t, CUDNN_ATTR.CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE.CUDNN_TYPE_INT64, new Array(9).fill(1)),
    );
    expect(d.message).toStartWith("cudnnBackendSetAttribute failed: CUDNN_STATUS_BAD_PARAM (2000)");
    // finalizing without the mandatory attributes
    const f = thrownTpError(() => dnn.finalize(t, "bare tensor"));
    expect(f.message).toBe(
      "cudnnBackendFinalize failed: CUDNN_STATUS_BAD_PARAM (2000): fake: a bad parameter; bare tensor",
    );
    for (const x of owned) dnn.destroyDescriptor(x);
    // a workspace smaller than the plan's: refused before the call
    const plan = dnn.convPlan({
      dtype: "f32",
      n: 1,
      cIn: 1,
      h: 3,
      w: 3,
      cOut: 1,
      kh: 3,
      kw: 3,
      stride: [1, 1],
      padding: [0, 0],
    });
    const small = thrownTpError(() =>
      dnn.conv(plan as NonNullable<typeof plan>, { x: 1n, w: 1n, y: 1n }, { ptr: 1n, bytes: 16 }),
    );
    expect(small.code).toBe("E_ARG");
    expect(small.message).toContain("needs 1024 B of workspace, given 16");
    // a null workspace pointer reaches the library, which refuses it
    const nul = thrownTpError(() =>
      dnn.conv(plan as NonNullable<typeof plan>, { x: 1n, w: 1n, y: 1n }, { ptr: 0n, bytes: 1 << 20 }),
    );
    expect(nul.message).toStartWith("cudnnBackendExecute failed: CUDNN_STATUS_BAD_PARAM_NULL_POINTER (2002)");
    // a shape that is not one
    expect(
      thrownTpError(() =>
        dnn.sdpaPlan({
          dtype: "f16",
          batch: 1,
          heads: 3,
          kvHeads: 2,
          sq: 1,
          skv: 1,
          headDim: 8,
          causal: false,
        }),
      ).message,
    ).toContain("3 heads are not a multiple of 2");
    dnn.destroy();
    expect(fake.tp_fake_live()).toBe(live);
  });
});

describe("status names and codes", () => {
  test("by category; unknown codes by number", () => {
    expect(cudnnStatusName(3001)).toBe("CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN");
    expect(cudnnStatusName(3999)).toBe("cudnnStatus_t 3999");
    expect(cudnnError("cudnnBackendExecute", 4004).code).toBe("E_OOM");
    expect(cudnnError("cudnnBackendExecute", 5000).code).toBe("E_INTERNAL");
    expect(cudnnError("cudnnBackendFinalize", 3002, "", "k").message).toBe(
      "cudnnBackendFinalize failed: CUDNN_STATUS_NOT_SUPPORTED_SHAPE (3002); k",
    );
  });
  test("numerics kept: no TF32 for f32 data; no down-converted inputs or half reductions for any", () => {
    const N = CUDNN_NUMERICAL_NOTE;
    expect(forbiddenNotes("f32")).toContain(N.CUDNN_NUMERICAL_NOTE_TENSOR_CORE);
    expect(forbiddenNotes("f16")).not.toContain(N.CUDNN_NUMERICAL_NOTE_TENSOR_CORE);
    expect(forbiddenNotes("bf16")).toContain(N.CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS);
  });
});
