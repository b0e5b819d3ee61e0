/**
 * `bun run bench quant-native`: the native weight quantizers and dequantizers of @tp/backend-cpu
 * (native/cpu/quantize_w*.c, dequant_*.c), with @tp/quant's TypeScript reference as the peer — the
 * same bytes, so the ratio is the whole story. (The `quant` suite in packages/quant/bench measures the
 * reference alone; it cannot import a backend, layer rule of tests/workspace.test.ts. This package has
 * both: @tp/quant as a dependency, @tp/backend-cpu as a devDependency.)
 *
 * Cases:
 * - quantize + write cache, int8_convrot, 1 GiB of BF16 (32 × [4096, 4096], seeded, written to a
 *   temporary folder as safetensors and deleted after): `openQuantCache` with no cache present — plan,
 *   quantization, streaming write, checksum, fsync, rename — with `createNativeQuantizer()` on every
 *   CPU (ours) and the reference (peer); then the native quantizer on one thread (no peer). 3 runs.
 * - quantize, per format ([512, 4096] BF16 in memory → int8 / int4 ConvRot, fp8 scaled, Q8_0, Q4_0,
 *   Q4_K, Q6_K), in M elements/s: native on 1 thread and on every CPU; peer: the reference.
 * - dequantize, per format ([1024, 4096] → f32, native `getRows` of every row), M elements/s: native
 *   on 1 thread and on every CPU; peer: the reference (`dequantizeConvRot` / `dequantizeFp8` /
 *   `dequantizeGgml`, one thread; the `quant` suite has it on Workers too).
 * Medians of the runs (the harness alternates ours and peer); the machine is noisy.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  createNativeQuantizer,
  type NativeQuantizeFormat,
  type NativeWeightFormat,
  quantizeRows,
} from "@tp/backend-cpu";
import {
  dequantizeConvRot,
  dequantizeFp8,
  dequantizeGgml,
  openQuantCache,
  quantizeConvRot,
  quantizeFp8Scaled,
  quantizeGgml,
  referenceQuantizer,
  type WeightQuantizer,
} from "@tp/quant";
import { f32ToBf16, weightFormatInfo } from "@tp/tensor";

const dir = mkdtempSync(join(tmpdir(), "tp-bench-quant-native-"));
const SET_TENSORS = 32;
const [SN, SK] = [4096, 4096];
const [QN, QK] = [512, 4096];
const [DN, DK] = [1024, 4096];

/** xorshift32 BF16 values ~ N(0, 0.05)-ish (sum of uniforms), deterministic per seed (as the quant suite). */
function bf16Values(n: number, seed: number): Uint8Array {
  const out = new Uint16Array(n);
  let s = seed >>> 0 || 1;
  const next = () => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return (s >>> 0) / 4294967296;
  };
  for (let i = 0; i < n; i++) out[i] = f32ToBf16((next() + next() + next() - 1.5) * 0.06);
  return new Uint8Array(out.buffer);
}

/** A safetensors file of SET_TENSORS BF16 [SN, SK] tensors, written by hand (8-byte length + JSON + data). */
function writeSet(path: string): void {
  const bytes = SN * SK * 2;
  const header: Record<string, unknown> = {};
  for (let i = 0; i < SET_TENSORS; i++) {
    header[`layers.${i}.weight`] = {
      dtype: "BF16",
      shape: [SN, SK],
      data_offsets: [i * bytes, (i + 1) * bytes],
    };
  }
  let json = JSON.stringify(header);
  json += " ".repeat((8 - ((8 + json.length) % 8)) % 8);
  const len = new Uint8Array(8);
  new DataView(len.buffer).setBigUint64(0, BigInt(json.length), true);
  writeFileSync(path, len);
  writeFileSync(path, new TextEncoder().encode(json), { flag: "a" });
  for (let i = 0; i < SET_TENSORS; i++) writeFileSync(path, bf16Values(SN * SK, i + 1), { flag: "a" });
}

/** The reference quantizer of a target format on a BF16 block. */
function referenceQuantize(format: NativeQuantizeFormat, bytes: Uint8Array, n: number, k: number): void {
  const input = { bytes, dtype: "bf16" as const };
  if (format === "int8_convrot" || format === "int4_convrot") quantizeConvRot(input, [n, k], { format });
  else if (format === "fp8_scaled") quantizeFp8Scaled(input, n * k);
  else quantizeGgml(format, input, n * k);
}

/** Stored bytes and scales of a [DN, DK] weight, for the dequantization cases. */
function weightOf(format: NativeWeightFormat): {
  data: Uint8Array;
  scale: Float32Array | null;
  group: number;
} {
  const src = bf16Values(DN * DK, 7);
  if (format === "int8_convrot" || format === "int4_convrot") {
    const q = quantizeConvRot({ bytes: src, dtype: "bf16" }, [DN, DK], { format });
    return { data: q.data, scale: q.scale, group: 256 };
  }
  if (format === "f8_e4m3fn") {
    const q = quantizeFp8Scaled({ bytes: src, dtype: "bf16" }, DN * DK);
    return { data: q.data, scale: new Float32Array([q.scale]), group: 0 };
  }
  // GGUF: seeded random blocks (every bit pattern decodes; f16 scales may be inf / NaN, as in the quant suite)
  const info = weightFormatInfo(format);
  const data = new Uint8Array((DN * DK * info.blockBytes) / info.blockElems);
  let s = 12345;
  for (let i = 0; i < data.length; i++) {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    data[i] = s >>> 24;
  }
  return { data, scale: null, group: 0 };
}

const disposers: (() => void)[] = [];
const throughput = (elements: number, ms: number) => elements / ms / 1e3; // M elements / s

export default {
  description:
    "native weight quantizers (quantize + write cache for 1 GiB BF16, quantize per format) and dequantizers of @tp/backend-cpu, 1 thread and every CPU; peer: @tp/quant's TypeScript reference (same bytes).",
  async cases() {
    const set = join(dir, "set_bf16.safetensors");
    writeSet(set);
    const all = createNativeQuantizer({ threads: 0 });
    const one = createNativeQuantizer({ threads: 1 });
    disposers.push(
      () => all.dispose(),
      () => one.dispose(),
    );
    const cache = `${set}.tp-q8.cache`;
    const build = (quantizer: WeightQuantizer) => {
      rmSync(cache, { force: true });
      const t = performance.now();
      const r = openQuantCache(set, {
        format: "int8_convrot",
        layers: ["*"],
        progress: null,
        cacheDir: dir,
        quantizer,
      });
      const s = (performance.now() - t) / 1000;
      if (r.status === "hit") throw new Error("expected a build");
      r.source.close();
      return s;
    };
    const cases = [
      {
        case: `quantize + write cache, int8_convrot, 1 GiB BF16 (32 × [4096, 4096]), native ${all.context.threads} threads`,
        metric: "time",
        unit: "s",
        better: "lower" as const,
        runs: 3,
        ours: () => build(all),
        peer: { name: "@tp/quant TypeScript reference (1 thread)", run: () => build(referenceQuantizer) },
      },
      {
        case: "quantize + write cache, int8_convrot, 1 GiB BF16, native 1 thread",
        metric: "time",
        unit: "s",
        better: "lower" as const,
        runs: 3,
        ours: () => build(one),
      },
    ];

    const quantCases = [];
    const qsrc = bf16Values(QN * QK, 3);
    const formats: NativeQuantizeFormat[] = [
      "int8_convrot",
      "int4_convrot",
      "fp8_scaled",
      "q8_0",
      "q4_0",
      "q4_k",
      "q6_k",
    ];
    for (const format of formats) {
      for (const [label, q] of [
        ["1 thread", one],
        [`${all.context.threads} threads`, all],
      ] as const) {
        quantCases.push({
          case: `quantize ${format} [${QN}, ${QK}] from BF16, native ${label}`,
          metric: "throughput",
          unit: "Melem/s",
          better: "higher" as const,
          runs: 5,
          ours() {
            const t = performance.now();
            quantizeRows(q.context, format, { bytes: qsrc, dtype: "bf16" }, [QN, QK]);
            return throughput(QN * QK, performance.now() - t);
          },
          peer: {
            name: "@tp/quant TypeScript reference (1 thread)",
            run() {
              const t = performance.now();
              referenceQuantize(format, qsrc, QN, QK);
              return throughput(QN * QK, performance.now() - t);
            },
          },
        });
      }
    }

    const dequantCases = [];
    const dq: NativeWeightFormat[] = [
      "int8_convrot",
      "int4_convrot",
      "f8_e4m3fn",
      "q4_0",
      "q4_1",
      "q5_0",
      "q5_1",
      "q8_0",
      "q2_k",
      "q3_k",
      "q4_k",
      "q5_k",
      "q6_k",
    ];
    const out = new Float32Array(DN * DK);
    for (const format of dq) {
      const w = weightOf(format);
      const nw = { format, n: DN, k: DK, data: w.data, scale: w.scale, group: w.group };
      const ref = () => {
        if (format === "int8_convrot" || format === "int4_convrot") {
          dequantizeConvRot({
            format,
            shape: [DN, DK],
            groupSize: 256,
            data: w.data,
            scale: w.scale as Float32Array,
          });
        } else if (format === "f8_e4m3fn") dequantizeFp8(w.data, format, (w.scale as Float32Array)[0]);
        else dequantizeGgml(format, w.data, DN * DK);
      };
      const label = format === "f8_e4m3fn" ? "f8_e4m3fn scaled" : format;
      for (const [threads, q] of [
        ["1 thread", one],
        [`${all.context.threads} threads`, all],
      ] as const) {
        dequantCases.push({
          case: `dequantize ${label} [${DN}, ${DK}], native ${threads}`,
          metric: "throughput",
          unit: "Melem/s",
          better: "higher" as const,
          runs: 5,
          ours() {
            const t = performance.now();
            q.context.getRows(nw, null, DN, out);
            return throughput(DN * DK, performance.now() - t);
          },
          peer: {
            name: "@tp/quant TypeScript reference (1 thread)",
            run() {
              const t = performance.now();
              ref();
              return throughput(DN * DK, performance.now() - t);
            },
          },
        });
      }
    }
    return [...cases, ...quantCases, ...dequantCases];
  },
  teardown() {
    for (const d of disposers) d();
    rmSync(dir, { recursive: true, force: true });
  },
};
