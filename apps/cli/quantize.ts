/**
 * `bun apps/cli quantize --format int8-convrot|int4-convrot|fp8-scaled [--group-size N | GLOB=N]...
 * [--layers GLOB]... [--keep GLOB]... IN.safetensors OUT.safetensors`: a ComfyUI-loadable quantized copy
 * of a float checkpoint, through @tp/quant's `quantizeCheckpoint` (written to a temporary name and
 * renamed; a progress bar on a terminal; one summary line on stdout).
 */
import { parseArgs } from "node:util";
import {
  type CheckpointQuantFormat,
  describeQuantizeReport,
  type GroupSizeRule,
  quantizeCheckpoint,
  stderrProgress,
} from "@tp/quant";
import { TpError } from "@tp/tensor";

/** The help lines of the command (indented as in the CLI's usage text). */
export const QUANTIZE_USAGE = `  quantize --format int8-convrot|int4-convrot|fp8-scaled [--group-size N] [--group-size GLOB=N]
           [--layers GLOB] [--keep GLOB] IN.safetensors OUT.safetensors
                                    write a checkpoint ComfyUI loads: the layout's linears quantized
                                    (comfy_quant markers + weight_scale), the rest copied; --group-size:
                                    ConvRot rotation group (default 256), GLOB=N per layer (last match
                                    wins); --layers: quantize these instead of the layout's table;
                                    --keep: leave these unquantized (flags repeat)`;

/** `--format` spellings of the CLI → @tp/quant formats. */
export const QUANT_FORMAT_FLAGS: Readonly<Record<string, CheckpointQuantFormat>> = {
  "int8-convrot": "int8_convrot",
  "int4-convrot": "int4_convrot",
  "fp8-scaled": "fp8_scaled",
};

/**
 * `--group-size N` or `--group-size GLOB=N` → the default group and per-layer rules (powers of 4 are
 * checked by @tp/quant).
 * @throws TpError E_ARG naming the flag for a value that is not N or GLOB=N
 */
export function parseGroupSizes(values: readonly string[]): {
  groupSize?: number;
  groupSizes: GroupSizeRule[];
} {
  let groupSize: number | undefined;
  const rules: GroupSizeRule[] = [];
  for (const v of values) {
    const eq = v.lastIndexOf("=");
    const text = eq < 0 ? v : v.slice(eq + 1);
    if (!/^\d+$/.test(text) || eq === 0) {
      throw new TpError(
        "E_ARG",
        `--group-size must be N or GLOB=N with N a power of 4 (16, 64, 256, …), got '${v}'`,
      );
    }
    if (eq < 0) groupSize = Number(text);
    else rules.push({ pattern: v.slice(0, eq), groupSize: Number(text) });
  }
  return { ...(groupSize === undefined ? {} : { groupSize }), groupSizes: rules };
}

/**
 * Run `quantize` with its arguments (after the command name).
 * @returns exit status 0
 * @throws TpError E_ARG for usage errors (exit 2); others from @tp/quant / @tp/formats, naming the
 *   tensor or file (exit 1)
 */
export function quantize(args: string[]): number {
  const { values, positionals } = parseArgs({
    args,
    options: {
      format: { type: "string" },
      "group-size": { type: "string", multiple: true },
      layers: { type: "string", multiple: true },
      keep: { type: "string", multiple: true },
    },
    allowPositionals: true,
    strict: true,
  });
  const known = Object.keys(QUANT_FORMAT_FLAGS).join(", ");
  if (values.format === undefined) throw new TpError("E_ARG", `quantize needs --format, one of: ${known}`);
  const format = QUANT_FORMAT_FLAGS[values.format];
  if (format === undefined) {
    throw new TpError("E_ARG", `unknown --format '${values.format}'; expected one of: ${known}`);
  }
  if (positionals.length !== 2) {
    throw new TpError(
      "E_ARG",
      `quantize takes IN.safetensors and OUT.safetensors, got ${positionals.length} path(s)`,
    );
  }
  const [input, output] = positionals as [string, string];
  const report = quantizeCheckpoint(input, output, {
    format,
    ...parseGroupSizes(values["group-size"] ?? []),
    ...(values.layers ? { layers: values.layers } : {}),
    ...(values.keep ? { keep: values.keep } : {}),
    progress: stderrProgress(),
  });
  console.log(describeQuantizeReport(report));
  return 0;
}
