/**
 * `bun run bench vulkan`: the vulkan backend against the cpu backend on the same ops, shapes and data,
 * side by side, in one process (time per op including `read`, which waits for the device). The peer is
 * loaded by name through @tp/tensor's registry.
 *
 * Here the vulkan device is usually Mesa's llvmpipe, a CPU running Vulkan: only the ratio means
 * anything there (how far the kernels are from the native CPU kernels on the same cores), not the
 * absolute times. On a GPU (TP_VULKAN_DEVICE) the same suite gives real figures.
 */
import { type Backend, encodeFromF32, f32ToF16, loadBackend, type Tensor, Weight } from "@tp/tensor";
import { createBackend } from "../src/index.ts";

const vk = createBackend();
const cpu = await loadBackend("cpu");

function randn(n: number, seed: number): Float32Array {
  let s = seed >>> 0;
  return Float32Array.from({ length: n }, () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return (s / 2 ** 32 - 0.5) * 3.4;
  });
}

/** Milliseconds of one op call and the read of its output (the output is freed). */
async function ms(b: Backend, fn: () => Tensor): Promise<number> {
  const t0 = performance.now();
  const out = fn();
  await b.read(out);
  const t = performance.now() - t0;
  b.free(out);
  return t;
}

/** A case timing `op` on both backends with inputs uploaded once to each. */
function opCase(
  name: string,
  inputs: { data: Float32Array | Int32Array; shape: number[] }[],
  op: (b: Backend, t: Tensor[]) => Tensor,
  runs = 5,
) {
  const up = (b: Backend) =>
    inputs.map((i) => b.upload(i.data, i.shape, i.data instanceof Int32Array ? "i32" : "f32"));
  const vt = up(vk);
  const ct = up(cpu);
  return {
    case: name,
    metric: "time",
    unit: "ms",
    better: "lower" as const,
    runs,
    ours: () => ms(vk, () => op(vk, vt)),
    peer: { name: `cpu (${cpu.device})`, run: () => ms(cpu, () => op(cpu, ct)) },
  };
}

/** Q8_0 blocks of `w` (ggml quantize_row_q8_0: d = amax / 127, q = round(x / d)); data for timing only. */
function q8_0(w: Float32Array): Uint8Array {
  const out = new Uint8Array((w.length / 32) * 34);
  const view = new DataView(out.buffer);
  for (let b = 0; b < w.length / 32; b++) {
    let amax = 0;
    for (let i = 0; i < 32; i++) amax = Math.max(amax, Math.abs(w[32 * b + i] as number));
    const d = amax / 127;
    view.setUint16(34 * b, f32ToF16(d), true);
    for (let i = 0; i < 32; i++)
      view.setInt8(34 * b + 2 + i, d === 0 ? 0 : Math.round((w[32 * b + i] as number) / d));
  }
  return out;
}

function weight(format: "f16" | "q8_0", n: number, k: number): Weight {
  const w = randn(n * k, 7).map((v) => v * 0.1);
  const data = format === "f16" ? encodeFromF32(w, "f16") : q8_0(w);
  const wt = new Weight({ name: `w_${format}`, format, shape: [n, k], data });
  vk.makeResident(wt); // uploaded once; the cpu backend reads the host bytes directly
  return wt;
}

export default {
  description: `vulkan on ${vk.device} vs the cpu backend, ms per op incl. read (on llvmpipe only the ratio means anything)`,
  cases() {
    const k = 2048;
    const n = 2048;
    const cases = [];
    for (const format of ["f16", "q8_0"] as const) {
      const w = weight(format, n, k);
      for (const m of [1, 32]) {
        cases.push(
          opCase(
            `matmul ${format} [${m}, ${k}] · [${n}, ${k}]ᵀ`,
            [{ data: randn(m * k, m), shape: [m, k] }],
            (b, [x]) => b.matmul(x as Tensor, w),
          ),
        );
      }
    }
    const [h, s, d] = [8, 256, 64];
    const qkv = [1, 2, 3].map((seed) => ({ data: randn(h * s * d, seed), shape: [1, h, s, d] }));
    cases.push(
      opCase(`attention causal [1, ${h}, ${s}, ${d}]`, qkv, (b, [q, kk, v]) =>
        b.attention(q as Tensor, kk as Tensor, v as Tensor, { causal: true }),
      ),
    );
    const rows = { data: randn(64 * 4096, 5), shape: [64, 4096] };
    cases.push(
      opCase("rms_norm [64, 4096]", [rows], (b, [x]) => b.rmsNorm(x as Tensor, null, { eps: 1e-6 })),
    );
    cases.push(opCase("softmax [64, 4096]", [rows], (b, [x]) => b.softmax(x as Tensor)));
    cases.push(
      opCase("silu [1 M]", [{ data: randn(1 << 20, 6), shape: [1 << 20] }], (b, [x]) => b.silu(x as Tensor)),
    );
    const rp = { data: Int32Array.from({ length: 128 }, (_, i) => i), shape: [128] };
    cases.push(
      opCase(
        "rope neox [1, 128, 16, 128]",
        [{ data: randn(128 * 16 * 128, 8), shape: [1, 128, 16, 128] }, rp],
        (b, [x, p]) => b.rope(x as Tensor, p as Tensor, { mode: "neox", theta: 1e6 }),
      ),
    );
    return cases;
  },
  teardown() {
    vk.dispose();
    cpu.dispose();
  },
};
