// The PTX simulator against hand-derived values: number formats (IEEE binary16, bfloat16, OCP fp8),
// the shfl.sync modes by the PTX ISA's pseudocode worked by hand, mma.sync fragment entries read off
// the ISA's figures, and the faults it must report (out of bounds, misaligned, deadlock, exited lanes).
import { describe, expect, test } from "bun:test";
import { TpError } from "@tp/tensor";
import { SimCudaDriver } from "./driver.ts";
import { fromE4m3, fromHalf, toBfloat, toE4m3, toE5m2, toHalf } from "./numeric.ts";

/** Run one kernel of PTX text on a fresh simulated sm_86 with `args` (Float32Array / Uint32Array buffers or numbers). */
function run(
  body: string,
  params: string,
  grid: [number, number, number],
  block: [number, number, number],
  args: (Float32Array | Uint32Array | Int32Array | number)[],
): (Float32Array | Uint32Array | Int32Array | number)[] {
  const d = new SimCudaDriver({ sm: 86, memoryBytes: 1 << 20 });
  const ptx = `.version 7.8\n.target sm_86\n.address_size 64\n.visible .entry k(${params})\n{\n${body}\n}\n`;
  const fn = d.loadPtx(ptx, "k");
  const ptrs = args.map((a) => {
    if (typeof a === "number") return null;
    const p = d.memAlloc(a.byteLength);
    const h = d.memAllocHost(a.byteLength);
    h.bytes.set(new Uint8Array(a.buffer, a.byteOffset, a.byteLength));
    d.copyHtoDAsync(p, h.address, a.byteLength, 0);
    return { p, h };
  });
  d.launch(
    fn,
    grid,
    block,
    0,
    0,
    args.map((a, i) => (typeof a === "number" ? { u32: a } : { u64: (ptrs[i] as { p: bigint }).p })),
  );
  return args.map((a, i) => {
    if (typeof a === "number") return a;
    const { p, h } = ptrs[i] as { p: bigint; h: { address: number; bytes: Uint8Array } };
    d.copyDtoHAsync(h.address, p, a.byteLength, 0);
    const out = new (a.constructor as Float32ArrayConstructor)(a.length);
    new Uint8Array(out.buffer).set(h.bytes.subarray(0, a.byteLength));
    return out;
  });
}

function fault(f: () => unknown): string {
  try {
    f();
  } catch (e) {
    if (e instanceof TpError) return `${e.code}: ${e.message}`;
    throw e;
  }
  return "no error";
}

describe("number formats", () => {
  test("binary16: exact values, ties to even, overflow, subnormals, NaN", () => {
    expect(toHalf(1)).toBe(0x3c00);
    expect(toHalf(-2)).toBe(0xc000);
    expect(toHalf(65504)).toBe(0x7bff);
    expect(toHalf(65519.99)).toBe(0x7bff);
    expect(toHalf(65520)).toBe(0x7c00); // rounds past the largest finite
    expect(toHalf(2 ** -24)).toBe(0x0001);
    expect(toHalf(2 ** -25)).toBe(0x0000); // tie to even (0)
    expect(toHalf(3 * 2 ** -25)).toBe(0x0002); // tie to even (2)
    expect(toHalf(1 + 2 ** -11)).toBe(0x3c00); // tie to even
    expect(toHalf(1 + 3 * 2 ** -11)).toBe(0x3c02);
    expect(toHalf(-0)).toBe(0x8000);
    expect(toHalf(Number.NaN)).toBe(0x7fff);
    expect(fromHalf(0x3555)).toBeCloseTo(0.333251953125, 12);
    expect(fromHalf(0x0400)).toBe(2 ** -14);
  });
  test("bfloat16: round to nearest even on the upper 16 bits", () => {
    expect(toBfloat(1)).toBe(0x3f80);
    expect(toBfloat(1 + 2 ** -8)).toBe(0x3f80); // tie, even
    expect(toBfloat(1 + 3 * 2 ** -8)).toBe(0x3f82); // tie, up to even
    expect(toBfloat(Number.NaN)).toBe(0x7fff);
  });
  test("fp8: e4m3 saturates at 448 with NaN 0x7f; e5m2 at 57344", () => {
    expect(toE4m3(448)).toBe(0x7e);
    expect(toE4m3(1000)).toBe(0x7e);
    expect(toE4m3(-1000)).toBe(0xfe);
    expect(toE4m3(2 ** -9)).toBe(0x01);
    expect(toE4m3(1.0625)).toBe(0x38); // 1 + 1/16 ties to 1.0 (even)
    expect(toE4m3(1.1875)).toBe(0x3a); // 1 + 3/16 ties up to 1.25
    expect(toE4m3(Number.NaN)).toBe(0x7f);
    expect(fromE4m3(0x7f)).toBeNaN();
    expect(fromE4m3(0x7e)).toBe(448);
    expect(toE5m2(1e6)).toBe(0x7b);
    expect(toE5m2(1.5)).toBe(0x3e);
  });
});

describe("instructions", () => {
  const shflParams = ".param .u64 k_out";
  const shfl = (mode: string, b: number, c: number) => `
    .reg .b32 %r<4>;
    .reg .b64 %rd<3>;
    .reg .pred %p<1>;
    ld.param.u64 %rd0, [k_out];
    cvta.to.global.u64 %rd0, %rd0;
    mov.u32 %r0, %laneid;
    add.u32 %r1, %r0, 100;
    shfl.sync.${mode}.b32 %r2|%p0, %r1, ${b}, ${c}, -1;
    selp.u32 %r3, 1000, 0, %p0;
    add.u32 %r2, %r2, %r3;
    mul.wide.u32 %rd1, %r0, 4;
    add.u64 %rd2, %rd0, %rd1;
    st.global.u32 [%rd2], %r2;
    ret;`;
  // out[l] = source lane's value (100 + j) + 1000 when the source lane was in range.
  const lanes = (f: (l: number) => [number, boolean]) =>
    Array.from({ length: 32 }, (_, l) => {
      const [j, ok] = f(l);
      return 100 + j + (ok ? 1000 : 0);
    });
  test("shfl.sync down / up / bfly / idx by the ISA's pseudocode", () => {
    const down = run(shfl("down", 3, 31), shflParams, [1, 1, 1], [32, 1, 1], [new Uint32Array(32)])[0];
    expect([...(down as Uint32Array)]).toEqual(lanes((l) => (l + 3 <= 31 ? [l + 3, true] : [l, false])));
    const up = run(shfl("up", 2, 0), shflParams, [1, 1, 1], [32, 1, 1], [new Uint32Array(32)])[0];
    expect([...(up as Uint32Array)]).toEqual(lanes((l) => (l - 2 >= 0 ? [l - 2, true] : [l, false])));
    const bfly = run(shfl("bfly", 5, 31), shflParams, [1, 1, 1], [32, 1, 1], [new Uint32Array(32)])[0];
    expect([...(bfly as Uint32Array)]).toEqual(lanes((l) => [l ^ 5, true]));
    // idx with c = 0x1f | (0x18 << 8): segments of 8 lanes, lane 2 of each.
    const idx = run(shfl("idx", 2, 0x181f), shflParams, [1, 1, 1], [32, 1, 1], [new Uint32Array(32)])[0];
    expect([...(idx as Uint32Array)]).toEqual(lanes((l) => [(l & 0x18) | 2, true]));
  });

  test("mma.sync m16n8k16 f16: A and B fragment entries of the ISA's figures land in D", () => {
    // Every lane loads its 4 A, 2 B registers as given (packed halves); A = identity-like probes.
    // A has one 1.0 at (row, col); B[k][n] = k + 16·n (exact in f16). Then D[row][n] = B[col][n].
    // Figure "MMA .m16n8k16 fragment layout for matrix A": lane 4·g + t holds a0,a1 = A[g][2t, 2t+1],
    // a2,a3 = A[g+8][2t, 2t+1], a4,a5 = A[g][2t+8, 2t+9], a6,a7 = A[g+8][2t+8, 2t+9]; B: b0,b1 =
    // B[2t, 2t+1][g], b2,b3 = B[2t+8, 2t+9][g]; C/D: c0,c1 = D[g][2t, 2t+1], c2,c3 = D[g+8][2t, 2t+1].
    const params = ".param .u64 k_a, .param .u64 k_b, .param .u64 k_d";
    const body = `
      .reg .b32 %r<8>;
      .reg .b64 %rd<8>;
      .reg .f32 %f<4>;
      ld.param.u64 %rd0, [k_a];
      ld.param.u64 %rd1, [k_b];
      ld.param.u64 %rd2, [k_d];
      mov.u32 %r0, %laneid;
      mul.wide.u32 %rd3, %r0, 16;
      add.u64 %rd4, %rd0, %rd3;
      ld.global.v4.u32 {%r1, %r2, %r3, %r4}, [%rd4];
      mul.wide.u32 %rd3, %r0, 8;
      add.u64 %rd5, %rd1, %rd3;
      ld.global.v2.u32 {%r5, %r6}, [%rd5];
      mov.f32 %f0, 0f00000000;
      mov.f32 %f1, 0f00000000;
      mov.f32 %f2, 0f00000000;
      mov.f32 %f3, 0f00000000;
      mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f0, %f1, %f2, %f3}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%f0, %f1, %f2, %f3};
      mul.wide.u32 %rd3, %r0, 16;
      add.u64 %rd6, %rd2, %rd3;
      st.global.v4.f32 [%rd6], {%f0, %f1, %f2, %f3};
      ret;`;
    const h = (x: number) => toHalf(x);
    for (const [row, col] of [
      [0, 0],
      [9, 3],
      [5, 12],
      [15, 15],
    ] as const) {
      const A = (r: number, c: number) => (r === row && c === col ? 1 : 0);
      const B = (k: number, n: number) => k + 16 * n;
      const a = new Uint32Array(32 * 4);
      const b = new Uint32Array(32 * 2);
      for (let l = 0; l < 32; l++) {
        const g = l >> 2;
        const t = l & 3;
        const pairs = [
          [g, 2 * t],
          [g + 8, 2 * t],
          [g, 2 * t + 8],
          [g + 8, 2 * t + 8],
        ] as const;
        pairs.forEach(([r, c], i) => {
          a[4 * l + i] = h(A(r, c)) | (h(A(r, c + 1)) << 16);
        });
        b[2 * l] = h(B(2 * t, g)) | (h(B(2 * t + 1, g)) << 16);
        b[2 * l + 1] = h(B(2 * t + 8, g)) | (h(B(2 * t + 9, g)) << 16);
      }
      const d = run(body, params, [1, 1, 1], [32, 1, 1], [a, b, new Float32Array(128)])[2] as Float32Array;
      const D = (r: number, n: number) => {
        const g = r % 8;
        const l = 4 * g + (n >> 1);
        return d[4 * l + 2 * (r >= 8 ? 1 : 0) + (n & 1)] as number;
      };
      for (let r = 0; r < 16; r++)
        for (let n = 0; n < 8; n++) expect(D(r, n)).toBe(r === row ? B(col, n) : 0);
    }
  });

  test("cvt: f16x2 packs the first source in the upper half; rni / rzi saturate, NaN → 0", () => {
    const params = ".param .u64 k_out";
    const body = `
      .reg .b32 %r<4>;
      .reg .b64 %rd<1>;
      .reg .f32 %f<3>;
      ld.param.u64 %rd0, [k_out];
      mov.f32 %f0, 0f3F800000;
      mov.f32 %f1, 0fC0000000;
      cvt.rn.f16x2.f32 %r0, %f0, %f1;
      mov.f32 %f2, 0f4F800000;
      cvt.rzi.s32.f32 %r1, %f2;
      mov.f32 %f2, 0f7FC00000;
      cvt.rni.s32.f32 %r2, %f2;
      mov.f32 %f2, 0f40200000;
      cvt.rni.s32.f32 %r3, %f2;
      st.global.v4.u32 [%rd0], {%r0, %r1, %r2, %r3};
      ret;`;
    const out = run(body, params, [1, 1, 1], [1, 1, 1], [new Uint32Array(4)])[0] as Uint32Array;
    expect(out[0]).toBe((0x3c00 << 16) | 0xc000);
    expect(out[1]).toBe(0x7fffffff); // 2^32 saturates to INT_MAX
    expect(out[2]).toBe(0); // NaN
    expect(out[3]).toBe(2); // 2.5 to even
  });
});

test("cvt between integer widths: u64 ← u32 keeps all 32 bits, u8 / s16 truncate", () => {
  const body = `
    .reg .b32 %r<4>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd0, [k_out];
    mov.u32 %r0, 0xdeadbeef;
    cvt.u64.u32 %rd1, %r0;
    st.global.u64 [%rd0], %rd1;
    cvt.u8.u32 %r1, %r0;
    cvt.s16.u32 %r2, %r0;
    st.global.u32 [%rd0+8], %r1;
    st.global.u32 [%rd0+12], %r2;
    ret;`;
  const out = run(body, ".param .u64 k_out", [1, 1, 1], [1, 1, 1], [new Uint32Array(4)])[0] as Uint32Array;
  expect([...out]).toEqual([0xdeadbeef, 0, 0xef, 0xffffbeef]);
});

describe("faults", () => {
  const params = ".param .u64 k_out, .param .u32 k_n";
  const store = (extra: string) => `
    .reg .b32 %r<3>;
    .reg .b64 %rd<3>;
    .reg .pred %p<1>;
    ld.param.u64 %rd0, [k_out];
    ld.param.u32 %r0, [k_n];
    mov.u32 %r1, %tid.x;
    ${extra}
    mul.wide.u32 %rd1, %r1, 4;
    add.u64 %rd2, %rd0, %rd1;
    st.global.u32 [%rd2], %r1;
    ret;`;
  test("a store past the allocation names the kernel, the line and how far past", () => {
    const msg = fault(() => run(store(""), params, [1, 1, 1], [65, 1, 1], [new Uint32Array(64), 64]));
    expect(msg).toMatch(
      /E_INTERNAL: PTX simulator: kernel k, line \d+: st\.global\.u32 \[%rd2\], %r1: 4-byte access at 0x[0-9a-f]+ is 4 B past the end of an allocation of 256 B/,
    );
  });
  test("the bounds-checked store is fine", () => {
    const ok = store("setp.ge.u32 %p0, %r1, %r0;\n    @%p0 bra $L_end;").replace("ret;", "$L_end:\n    ret;");
    const out = run(ok, params, [1, 1, 1], [65, 1, 1], [new Uint32Array(64), 64])[0] as Uint32Array;
    expect([...out]).toEqual(Array.from({ length: 64 }, (_, i) => i));
  });
  test("a misaligned 4-byte store", () => {
    const msg = fault(() =>
      run(store("add.u64 %rd0, %rd0, 2;"), params, [1, 1, 1], [1, 1, 1], [new Uint32Array(4), 4]),
    );
    expect(msg).toMatch(/misaligned 4-byte access/);
  });
  test("bar.sync under a divergent branch deadlocks with where each thread waits", () => {
    const body = `
      .reg .b32 %r<2>;
      .reg .pred %p<1>;
      mov.u32 %r0, %tid.x;
      setp.lt.u32 %p0, %r0, 16;
      @%p0 bra $L_a;
      bar.sync 0;
      ret;
    $L_a:
      shfl.sync.bfly.b32 %r1, %r0, 1, 31, -1;
      bar.sync 0;
      ret;`;
    const msg = fault(() => run(body, ".param .u32 k_n", [1, 1, 1], [32, 1, 1], [0]));
    expect(msg).toMatch(
      /kernel k deadlocks: 16 threads wait at line \d+ \(shfl\.sync.*; 16 threads wait at line \d+ \(bar\.sync 0\)/,
    );
  });
  test("a shfl whose member mask names an exited lane", () => {
    const body = `
      .reg .b32 %r<2>;
      .reg .pred %p<1>;
      mov.u32 %r0, %tid.x;
      setp.ge.u32 %p0, %r0, 30;
      @%p0 bra $L_out;
      shfl.sync.bfly.b32 %r1, %r0, 1, 31, -1;
    $L_out:
      ret;`;
    const msg = fault(() => run(body, ".param .u32 k_n", [1, 1, 1], [32, 1, 1], [0]));
    expect(msg).toMatch(/lane 30 of the member mask has exited/);
  });
  // Thread 0 writes sh[0]; every thread then reads it: with bar.sync between, all read 7.
  const shared = (sync: boolean, order: "raw" | "war") => `
    .reg .b32 %r<4>;
    .reg .b64 %rd<3>;
    .reg .pred %p<1>;
    .shared .align 4 .b8 k_sh[128];
    ld.param.u64 %rd0, [k_out];
    mov.u32 %r0, %tid.x;
    mov.u32 %r1, k_sh;
    mov.u32 %r2, 7;
    setp.eq.u32 %p0, %r0, ${order === "raw" ? 0 : 31};
    ${order === "raw" ? "@%p0 st.shared.u32 [%r1], %r2;" : "ld.shared.u32 %r3, [%r1];"}
    ${sync ? "bar.sync 0;" : ""}
    ${order === "raw" ? "ld.shared.u32 %r3, [%r1];" : "@%p0 st.shared.u32 [%r1], %r2;"}
    mul.wide.u32 %rd1, %r0, 4;
    add.u64 %rd2, %rd0, %rd1;
    st.global.u32 [%rd2], %r3;
    ret;`;
  test("shared memory: a read of another thread's write with no bar.sync between is a race", () => {
    const ok = run(shared(true, "raw"), ".param .u64 k_out", [1, 1, 1], [32, 1, 1], [new Uint32Array(32)]);
    expect([...(ok[0] as Uint32Array)]).toEqual(Array(32).fill(7));
    const msg = fault(() =>
      run(shared(false, "raw"), ".param .u64 k_out", [1, 1, 1], [32, 1, 1], [new Uint32Array(32)]),
    );
    expect(msg).toMatch(
      /shared-memory race at byte 0: thread 1 reads it at line \d+ \(ld\.shared\.u32 %r3, \[%r1\]\) after thread 0 wrote it at line \d+ \(@%p0 st\.shared|shared-memory race at byte 0: thread 1 reads it .* after thread 0 wrote it/,
    );
  });
  test("shared memory: a write over a word other threads read in the same epoch is a race", () => {
    const msg = fault(() =>
      run(shared(false, "war"), ".param .u64 k_out", [1, 1, 1], [32, 1, 1], [new Uint32Array(32)]),
    );
    expect(msg).toMatch(/shared-memory race at byte 0: thread 31 writes it .* after other threads read it/);
    // the barrier orders them: no race (every thread read the NaN-filled word, 0xffffffff)
    const ok = run(shared(true, "war"), ".param .u64 k_out", [1, 1, 1], [32, 1, 1], [new Uint32Array(32)]);
    expect([...(ok[0] as Uint32Array)]).toEqual(Array(32).fill(0xffffffff));
  });
  test("PTX outside the simulated subset is refused at load naming the line", () => {
    const msg = fault(() => run("\tbrkpt;\n\tret;", ".param .u32 k_n", [1, 1, 1], [1, 1, 1], [0]));
    expect(msg).toMatch(/E_UNSUPPORTED: PTX simulator: kernel k, line 6: instruction brkpt is not simulated/);
  });
});
