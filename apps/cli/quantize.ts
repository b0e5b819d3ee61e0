/**
 * `bun apps/cli quantize --format int8-convrot|int4-convrot|fp8-scaled [--group-size N | GLOB=N]...
 * [--layers GLOB]... [--keep GLOB]... [--threads N] [--quantizer native|typescript] IN.safetensors
 * OUT.safetensors`: a ComfyUI-loadable quantized copy of a float checkpoint, through @tp/quant's
 * `quantizeCheckpoint` (written to a temporary name and renamed; a progress bar on a terminal; a note
 * on stderr per rotation group chosen below 256; one summary line on stdout). The quantizer is @tp/backend-cpu's native one on `--threads` threads
 * (default: every CPU), or the TypeScript reference; both write the same bytes.
 */
import { createNativeQuantizer, resolveThreads } from "@tp/backend-cpu";
import { checkInputsUnchanged } from "@tp/formats";
import {
  type CheckpointQuantFormat,
  describeAutoGroups,
  describeQuantizeReport,
  type GroupSizeRule,
  type ProgressReporter,
  quantizeCheckpoint,
  referenceQuantizer,
  stderrProgress,
  type WeightQuantizer,
} from "@tp/quant";
import { parseFlags, TpError } from "@tp/tensor";
import { checkDistinctPaths, checkOutputFolder, writeAllOrNothing } from "./paths.ts";

/** The help lines of the command (indented as in the CLI's usage text). */
export const QUANTIZE_USAGE = `  quantize --format int8-convrot|int4-convrot|fp8-scaled [--group-size N] [--group-size GLOB=N]
           [--layers GLOB] [--keep GLOB] [--threads N] [--quantizer native|typescript]
           IN.safetensors OUT.safetensors
                                    write a checkpoint ComfyUI loads: the layout's linears quantized
                                    (comfy_quant markers + weight_scale), the rest copied; --group-size:
                                    ConvRot rotation group (default: per layer the largest of 256, 64,
                                    16 dividing its K, noted on stderr when not 256), GLOB=N per layer
                                    (last match wins); --layers: quantize these instead of the layout's table;
                                    --keep: leave these unquantized (flags repeat); --threads: native
                                    quantizer threads (default 0: every CPU, or $TP_THREADS);
                                    --quantizer: native (default) or the TypeScript reference (same bytes)`;

/** `--quantizer` values. */
export const QUANTIZER_FLAGS = ["native", "typescript"] as const;

/**
 * The quantizer of `--quantizer` / `--threads`: @tp/backend-cpu's native one (dispose it after), or
 * the TypeScript reference of @tp/quant.
 * @param kind    `native` (default) or `typescript`
 * @param threads `--threads` text (digits; 0 or absent: `$TP_THREADS`, else every CPU)
 * @throws TpError E_ARG naming the flag for a bad value; E_IO when the native library is not built
 *   (the message says to run 'bun run build' or pass --quantizer typescript)
 */
export function quantizerFromFlags(
  kind: string | undefined,
  threads: string | undefined,
): { quantizer: WeightQuantizer; dispose: () => void } {
  const choice = kind ?? "native";
  if (!(QUANTIZER_FLAGS as readonly string[]).includes(choice)) {
    throw new TpError(
      "E_ARG",
      `unknown --quantizer '${choice}'; expected one of: ${QUANTIZER_FLAGS.join(", ")}`,
    );
  }
  if (threads !== undefined && !/^\d{1,3}$/.test(threads)) {
    throw new TpError("E_ARG", `--threads must be an integer from 0 to 256 (0: every CPU), got '${threads}'`);
  }
  if (choice === "typescript") return { quantizer: referenceQuantizer, dispose: () => {} };
  let native: ReturnType<typeof createNativeQuantizer>;
  try {
    native = createNativeQuantizer({
      threads: resolveThreads(threads === undefined ? undefined : Number(threads)),
    });
  } catch (e) {
    if (e instanceof TpError && e.code === "E_IO") {
      throw new TpError("E_IO", `${e.message}; or pass --quantizer typescript (slower, same bytes)`, {
        cause: e,
      });
    }
    throw e;
  }
  return { quantizer: native, dispose: () => native.dispose() };
}

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

/** A progress reporter that also checks, per tensor, that IN has not changed since it was opened. */
function checkingInputs(p: ProgressReporter): ProgressReporter {
  return {
    start: (total, label) => p.start(total, label),
    advance(bytes, tensor) {
      checkInputsUnchanged(`reading tensor ${tensor}`);
      p.advance(bytes, tensor);
    },
    stop: () => p.stop(),
  };
}

/**
 * Run `quantize` with its arguments (after the command name).
 * @returns exit status 0
 * @throws TpError E_ARG for usage errors, OUT being IN included (exit 2); E_IO naming OUT when its
 *   folder is missing or not writable; others from @tp/quant / @tp/formats, naming the tensor or file
 *   (exit 1)
 */
export function quantize(args: string[]): number {
  const { values, positionals } = parseFlags(
    { command: "quantize", help: "bun apps/cli quantize --help" },
    {
      args,
      options: {
        format: { type: "string" },
        "group-size": { type: "string", multiple: true },
        layers: { type: "string", multiple: true },
        keep: { type: "string", multiple: true },
        threads: { type: "string" },
        quantizer: { type: "string" },
        help: { type: "boolean", short: "h", default: false },
      },
      allowPositionals: true,
      strict: true,
    },
  );
  if (values.help) {
    console.log(`usage: bun apps/cli\n${QUANTIZE_USAGE}`);
    return 0;
  }
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
  // the output is a safetensors file whatever its name says: a .gguf name would lie about it
  if (!output.toLowerCase().endsWith(".safetensors")) {
    throw new TpError(
      "E_ARG",
      `OUT must end in .safetensors (quantize writes a ComfyUI safetensors checkpoint; GGUF output is not supported), got '${output}'`,
    );
  }
  const groups = parseGroupSizes(values["group-size"] ?? []);
  // OUT must not be IN (resolved paths, hard links) and its folder must be writable — before any work.
  checkDistinctPaths([{ label: "IN", path: input }], [{ label: "OUT", path: output }]);
  checkOutputFolder("OUT", output);
  const { quantizer, dispose } = quantizerFromFlags(values.quantizer, values.threads);
  try {
    // inside a group, a failed write names OUT (not the temporary file)
    const report = writeAllOrNothing((stage) =>
      quantizeCheckpoint(input, stage("OUT", output), {
        format,
        ...groups,
        ...(values.layers ? { layers: values.layers } : {}),
        ...(values.keep ? { keep: values.keep } : {}),
        progress: checkingInputs(stderrProgress()),
        quantizer,
        hints: "cli",
      }),
    );
    for (const line of describeAutoGroups(report)) process.stderr.write(`note: ${line}\n`);
    console.log(`${describeQuantizeReport(report)} (${quantizer.name} quantizer)`);
  } finally {
    dispose();
  }
  return 0;
}
