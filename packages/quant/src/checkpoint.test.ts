// Quantizing whole checkpoints (checkpoint.ts) on small synthetic Krea 2-shaped BF16 files: the plan
// (default layer table, per-layer groups, keep), the stored tensors (ComfyUI's markers byte for byte,
// scale shapes, copied tensors and metadata unchanged), equality with the per-tensor quantizers
// (including a tensor quantized in several row blocks), and every error naming its tensor or option
// with nothing left on disk. Exact answers: the streaming writer must give the quantizers' bytes.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, linkSync, readdirSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { loadWeight, openSafetensors, writeSafetensors } from "@tp/formats";
import type { TpError } from "@tp/tensor";
import {
  AUTO_CONVROT_GROUP_SIZES,
  comfyQuantMarker,
  describeAutoGroups,
  describeQuantizeReport,
  planQuantization,
  quantizeCheckpoint,
} from "./checkpoint.ts";
import { convRotFromWeight, quantizeConvRot } from "./convrot.ts";
import { quantizeFp8Scaled } from "./fp8.ts";
import type { ProgressReporter } from "./progress.ts";
import { bf16Bytes, krea2Linears, tempFolder, writeTinyKrea2 } from "./testing/checkpoints.ts";
import { thrown } from "./testing/fixtures.ts";

const tmp = tempFolder("checkpoint");
afterAll(tmp.cleanup);
const input = writeTinyKrea2(join(tmp.dir, "tiny_bf16.safetensors"), { metadata: { note: "kept" } });

describe("plan", () => {
  test("default table: the 8 block linears; per-layer groups (last match wins) and keep", () => {
    const src = openSafetensors(input);
    const plan = planQuantization(src, {
      format: "int8_convrot",
      groupSizes: [
        { pattern: "blocks.0.attn.*", groupSize: 64 },
        { pattern: "blocks.0.attn.wo", groupSize: 16 },
      ],
      keep: ["blocks.0.mlp.gate"],
    });
    const q = plan.tensors.filter((t) => t.action === "quantize");
    expect(q.map((t) => [t.name, t.groupSize]).sort()).toEqual(
      [
        ["blocks.0.attn.gate.weight", 64],
        ["blocks.0.attn.wk.weight", 64],
        ["blocks.0.attn.wo.weight", 16],
        ["blocks.0.attn.wq.weight", 64],
        ["blocks.0.attn.wv.weight", 64],
        ["blocks.0.mlp.down.weight", 256],
        ["blocks.0.mlp.up.weight", 256],
      ].sort(),
    );
    expect(plan.rule).toContain("krea2-dit");
    expect(plan.tensors.find((t) => t.name === "first.weight")?.action).toBe("copy");
    src.close();
  });

  test("explicit layers replace the table", () => {
    const src = openSafetensors(input);
    const plan = planQuantization(src, { format: "fp8_scaled", layers: ["first", "blocks.*.mlp.up"] });
    expect(plan.tensors.filter((t) => t.action === "quantize").map((t) => t.name)).toEqual([
      "blocks.0.mlp.up.weight",
      "first.weight",
    ]);
    src.close();
  });
});

describe("quantizeCheckpoint", () => {
  for (const format of ["int8_convrot", "int4_convrot", "fp8_scaled"] as const) {
    test(`${format}: markers, scales and codes as the per-tensor quantizers give; the rest copied`, () => {
      const out = join(tmp.dir, `out_${format}.safetensors`);
      const events: string[] = [];
      let done = 0;
      const progress: ProgressReporter = {
        start: (total) => events.push(`start ${total}`),
        advance: (b) => {
          done += b;
        },
        stop: () => events.push("stop"),
      };
      const report = quantizeCheckpoint(input, out, { format, progress });
      const src = openSafetensors(input);
      const q = openSafetensors(out);
      expect(report.quantized).toBe(8);
      expect(report.copied).toBe(src.tensors.length - 8);
      expect(events).toEqual([`start ${report.bytesIn}`, "stop"]);
      expect(done).toBe(report.bytesIn);
      expect(q.metadata?.get("note")).toBe("kept");
      for (const [l, n, k] of krea2Linears(256, 512)) {
        const name = `blocks.0.${l}.weight`;
        const marker = new TextDecoder().decode(q.data(`blocks.0.${l}.comfy_quant`));
        expect(marker).toBe(comfyQuantMarker(format, 256));
        if (format === "fp8_scaled") {
          const want = quantizeFp8Scaled({ bytes: src.data(name), dtype: "bf16" }, n * k);
          expect(Buffer.from(q.data(name)).equals(Buffer.from(want.data))).toBe(true);
          expect(q.tensor(`blocks.0.${l}.weight_scale`).shape).toEqual([]);
          expect(loadWeight(q, name).scale).toEqual({ kind: "tensor", value: want.scale });
          continue;
        }
        const want = quantizeConvRot({ bytes: src.data(name), dtype: "bf16" }, [n, k], { format });
        const got = convRotFromWeight(loadWeight(q, name));
        expect(got.groupSize).toBe(256);
        expect(Buffer.from(got.data).equals(Buffer.from(want.data))).toBe(true);
        expect(Array.from(got.scale)).toEqual(Array.from(want.scale));
        expect(q.tensor(`blocks.0.${l}.weight_scale`).shape).toEqual(
          format === "int8_convrot" ? [n, 1] : [n],
        );
        expect(q.tensor(name).dtype).toBe("I8");
      }
      for (const t of src.tensors.filter(
        (x) => !x.name.startsWith("blocks.0.") || !x.name.endsWith(".weight"),
      )) {
        expect(Buffer.from(q.data(t.name)).equals(Buffer.from(src.data(t.name)))).toBe(true);
      }
      src.close();
      q.close();
    });
  }

  test("a tensor larger than one row block is quantized in blocks with the same bytes", () => {
    const [n, k] = [1040, 4096]; // 4.26 M elements > 4 M per block: two blocks
    const path = join(tmp.dir, "big.safetensors");
    const data = bf16Bytes(n * k, 77);
    writeSafetensors(path, [{ name: "w.weight", dtype: "BF16", shape: [n, k], data }]);
    const out = join(tmp.dir, "big_q4.safetensors");
    quantizeCheckpoint(path, out, { format: "int4_convrot", layers: ["w"] });
    const want = quantizeConvRot({ bytes: data, dtype: "bf16" }, [n, k], { format: "int4_convrot" });
    const got = convRotFromWeight(loadWeight(openSafetensors(out), "w.weight"));
    expect(Buffer.from(got.data).equals(Buffer.from(want.data))).toBe(true);
    expect(Array.from(got.scale)).toEqual(Array.from(want.scale));
  });
});

describe("rotation group chosen per layer when none is given", () => {
  // K = 768 → 256; 192 = 3·64 → 64; 80 = 5·16 and 48 = 3·16 → 16 (the largest of 256, 64, 16 dividing K)
  const widths: [string, number, number][] = [
    ["a", 4, 768],
    ["b", 4, 192],
    ["c", 2, 80],
    ["d", 2, 48],
    ["e", 2, 80],
  ];
  const path = join(tmp.dir, "widths.safetensors");
  writeSafetensors(
    path,
    widths.map(([l, n, k], i) => ({
      name: `${l}.weight`,
      dtype: "BF16",
      shape: [n, k],
      data: bf16Bytes(n * k, 40 + i),
    })),
  );
  const layers = widths.map(([l]) => l);

  test("the groups are ComfyUI's: 256, 64, 16, each a power of 4", () => {
    expect(AUTO_CONVROT_GROUP_SIZES).toEqual([256, 64, 16]);
    for (const g of AUTO_CONVROT_GROUP_SIZES) expect(4 ** Math.round(Math.log(g) / Math.log(4))).toBe(g);
  });

  for (const format of ["int8_convrot", "int4_convrot"] as const) {
    test(`${format}: the largest dividing K, marked auto, its bytes those of quantizeConvRot with that group`, () => {
      const src = openSafetensors(path);
      const plan = planQuantization(src, { format, layers });
      expect(plan.tensors.map((t) => [t.name, t.groupSize, t.autoGroup])).toEqual([
        ["a.weight", 256, true],
        ["b.weight", 64, true],
        ["c.weight", 16, true],
        ["d.weight", 16, true],
        ["e.weight", 16, true],
      ]);
      const out = join(tmp.dir, `widths_${format}.safetensors`);
      const report = quantizeCheckpoint(src, out, { format, layers });
      expect(report.groups).toEqual({ "256": 1, "64": 1, "16": 3 });
      expect(describeQuantizeReport(report)).toContain(
        `: 5 layers ${format} (1×g256, 1×g64, 3×g16), 0 tensors copied`,
      );
      expect(report.autoGroups).toEqual([
        { layer: "a", k: 768, groupSize: 256 },
        { layer: "b", k: 192, groupSize: 64 },
        { layer: "c", k: 80, groupSize: 16 },
        { layer: "d", k: 48, groupSize: 16 },
        { layer: "e", k: 80, groupSize: 16 },
      ]);
      expect(describeAutoGroups(report, 2)).toEqual([
        "rotation group 64 for 1 layer whose K (192) is not a multiple of 256: b",
        "rotation group 16 for 3 layers whose K (80, 48) is not a multiple of 256 or 64: c, d, and 1 more",
      ]);
      const q = openSafetensors(out);
      for (const [l, n, k] of widths) {
        const g = k % 256 === 0 ? 256 : k % 64 === 0 ? 64 : 16;
        const want = quantizeConvRot({ bytes: src.data(`${l}.weight`), dtype: "bf16" }, [n, k], {
          format,
          groupSize: g,
        });
        const got = convRotFromWeight(loadWeight(q, `${l}.weight`));
        expect(got.groupSize).toBe(g);
        expect(new TextDecoder().decode(q.data(`${l}.comfy_quant`))).toBe(comfyQuantMarker(format, g));
        expect(Buffer.from(got.data).equals(Buffer.from(want.data))).toBe(true);
        expect(Array.from(got.scale)).toEqual(Array.from(want.scale));
      }
      q.close();
      src.close();
    });
  }

  test("a group that is given is kept: the option for all, a rule for its layers (not auto)", () => {
    const src = openSafetensors(path);
    const ruled = planQuantization(src, {
      format: "int8_convrot",
      layers,
      groupSizes: [{ pattern: "[ab]", groupSize: 16 }],
    });
    expect(ruled.tensors.map((t) => [t.groupSize, t.autoGroup ?? false])).toEqual([
      [16, false],
      [16, false],
      [16, true],
      [16, true],
      [16, true],
    ]);
    const all = planQuantization(src, { format: "int8_convrot", layers, groupSize: 16 });
    expect(all.tensors.map((t) => [t.groupSize, t.autoGroup ?? false])).toEqual(
      widths.map(() => [16, false]),
    );
    // an explicit 256 is not lowered for K = 192
    const e = thrown(() =>
      planQuantization(src, { format: "int8_convrot", layers, groupSize: 256 }),
    ) as TpError;
    expect([e.code, e.tensor]).toEqual(["E_SHAPE", "b.weight"]);
    src.close();
    expect(describeAutoGroups({ autoGroups: [{ layer: "a", k: 768, groupSize: 256 }] })).toEqual([]);
  });

  test("K that no group divides is E_SHAPE naming the tensor and the group 4 or --keep that fixes it", () => {
    const odd = join(tmp.dir, "k12.safetensors");
    writeSafetensors(odd, [{ name: "x.weight", dtype: "BF16", shape: [2, 12], data: bf16Bytes(24, 9) }]);
    const e = thrown(() =>
      quantizeCheckpoint(odd, join(tmp.dir, "k12_out.safetensors"), {
        format: "int8_convrot",
        layers: ["x"],
        hints: "cli",
      }),
    ) as TpError;
    expect(e.message).toBe(
      `K = 12 input columns is not a multiple of any ConvRot rotation group (256, 64, 16); use --group-size 'x=4' or --keep 'x' to leave it unquantized (file ${odd}, tensor x.weight)`,
    );
    expect(existsSync(join(tmp.dir, "k12_out.safetensors"))).toBe(false);
  });
});

describe("errors name the tensor or option, and leave nothing behind", () => {
  const failing = (name: string, options: Parameters<typeof quantizeCheckpoint>[2], from = input) => {
    const before = readdirSync(tmp.dir).sort();
    const out = join(tmp.dir, `${name}_out.safetensors`);
    const e = thrown(() => quantizeCheckpoint(from, out, options)) as TpError;
    expect(e.name).toBe("TpError");
    expect(existsSync(out)).toBe(false);
    expect(readdirSync(tmp.dir).sort()).toEqual(before);
    return e;
  };

  test("K not a multiple of the group: E_SHAPE naming the tensor and the options (or CLI flags) that fix it", () => {
    const options = {
      format: "int8_convrot",
      groupSizes: [{ pattern: "blocks.0.attn.wq", groupSize: 1024 }],
    } as const;
    const e = failing("k", options);
    expect([e.code, e.tensor]).toEqual(["E_SHAPE", "blocks.0.attn.wq.weight"]);
    expect(e.message).toBe(
      `K = 256 input columns is not a multiple of the rotation group 1024; set groupSizes [{ pattern: 'blocks.0.attn.wq', groupSize: 256 }] or keep ['blocks.0.attn.wq'] to leave it unquantized (file ${input}, tensor blocks.0.attn.wq.weight)`,
    );
    // hints "cli": the flags of `bun apps/cli quantize` only, no option names
    expect(failing("k", { ...options, hints: "cli" }).message).toBe(
      `K = 256 input columns is not a multiple of the rotation group 1024; use --group-size 'blocks.0.attn.wq=256' or --keep 'blocks.0.attn.wq' to leave it unquantized (file ${input}, tensor blocks.0.attn.wq.weight)`,
    );
  });

  test("odd K for int4: E_SHAPE naming the tensor", () => {
    const path = join(tmp.dir, "odd.safetensors");
    writeSafetensors(path, [
      { name: "odd.weight", dtype: "BF16", shape: [4, 81], data: bf16Bytes(4 * 81, 3) },
    ]);
    const e = failing("odd", { format: "int4_convrot", layers: ["odd"] }, path);
    expect([e.code, e.tensor]).toEqual(["E_SHAPE", "odd.weight"]);
    expect(e.message).toContain("needs an even K, got K = 81");
  });

  test("bad options are E_ARG: unknown format, group not a power of 4, globs that match nothing", () => {
    expect(failing("f", { format: "int5" as never }).message).toContain(
      "unknown quantization format 'int5'; expected one of: int8_convrot, int4_convrot, fp8_scaled",
    );
    expect(failing("g", { format: "int8_convrot", groupSize: 128 }).code).toBe("E_ARG");
    expect(failing("l", { format: "int8_convrot", layers: ["nope.*"] }).message).toContain(
      "'nope.*' matches no tensor",
    );
    expect(failing("kp", { format: "int8_convrot", keep: ["first"] }).message).toContain(
      "keep pattern 'first'",
    );
    expect(
      failing("gp", { format: "int8_convrot", groupSizes: [{ pattern: "zzz", groupSize: 16 }] }).message,
    ).toContain("group-size pattern 'zzz'");
  });

  test("already-quantized weights and non-safetensors inputs are refused", () => {
    const q8 = join(tmp.dir, "q8.safetensors");
    quantizeCheckpoint(input, q8, { format: "int8_convrot" });
    const e = failing("again", { format: "int4_convrot" }, q8);
    expect([e.code, e.tensor]).toEqual(["E_UNSUPPORTED", "blocks.0.attn.gate.weight"]);
    expect(e.message).toContain("not BF16, F16 or F32");
    const junk = join(tmp.dir, "junk.safetensors");
    writeFileSync(junk, "this is not a checkpoint");
    const j = failing("junk", { format: "int8_convrot" }, junk);
    expect([j.code, j.file]).toEqual(["E_FORMAT", junk]);
  });

  test("the output may not overwrite the input: same string, another spelling, a symbolic or hard link", () => {
    const sym = join(tmp.dir, "sym_in.safetensors");
    symlinkSync(input, sym);
    const hard = join(tmp.dir, "hard_in.safetensors");
    linkSync(input, hard);
    try {
      for (const out of [input, `${tmp.dir}/./tiny_bf16.safetensors`, sym, hard]) {
        const e = thrown(() => quantizeCheckpoint(input, out, { format: "int8_convrot" })) as TpError;
        expect([e.code, e.message]).toEqual([
          "E_ARG",
          `the output ${out} is the input ${input}; it must not overwrite it (file ${out})`,
        ]);
      }
      expect(openSafetensors(input).tensor("blocks.0.attn.wq.weight").dtype).toBe("BF16");
    } finally {
      rmSync(sym);
      rmSync(hard);
    }
  });
});
