#!/usr/bin/env bun
import { writeSync } from "node:fs";
/**
 * `bun apps/cli <command>` — TensorPencil's command line: generate / decode / encode (Krea 2,
 * generate.ts), backends, inspect, quantize (quantize.ts). This file only parses the command and
 * prints every failure as one `error E_CODE: …` line with a non-zero exit status (2 for usage errors;
 * no command at all prints the usage on stderr with status 2; `help`, `--help`, `-h` print it on
 * stdout with status 0, and `help <command>` or `<command> --help` that command's usage). SIGINT and
 * SIGTERM remove unfinished outputs and exit 130 / 143 with one line.
 */
import { nativeInterruptHandler } from "@tp/backend-cpu";
import { checkInputsUnchanged, inspectCheckpoint, installInterruptCleanup, writeInspect } from "@tp/formats";
import {
  type BackendOptions,
  backendNames,
  loadBackend,
  parseFlags,
  runCli,
  suggestFlag,
  TpError,
} from "@tp/tensor";
import { decode, encode, GENERATE_USAGE, generate } from "./generate.ts";
import { MODELS_USAGE, models } from "./models.ts";
import { QUANTIZE_USAGE, quantize } from "./quantize.ts";

/** Help lines of `backends` (indented as in the CLI's usage text). */
const BACKENDS_USAGE = `  backends [--threads N] [--json] [--verbose]
                                    list the compute backends and whether each can start here
                                    (--threads 0: all CPUs, the default; --verbose: each backend
                                    prints its device and limits on stderr, e.g. vulkan's device
                                    choice, memory, limits, features and kernel variants)`;

/** Help lines of `inspect`. */
const INSPECT_USAGE = `  inspect PATH [--json] [--array-limit N]
                                    what a checkpoint file or directory is: the detected layout,
                                    metadata (a safetensors file's __metadata__, or the GGUF keys
                                    with long arrays abridged to N elements, default 8) and the
                                    tensor table (name, dtype, shape, bytes, offset); --json for machines`;

const USAGE = `usage: bun apps/cli <command> [options]

commands:
${GENERATE_USAGE}
${BACKENDS_USAGE}
${INSPECT_USAGE}
${QUANTIZE_USAGE}
${MODELS_USAGE}
  help [COMMAND]                    this text, or one command's usage (also: COMMAND --help)`;

/** Each command's usage lines, for `help COMMAND` and `COMMAND --help`. */
const COMMAND_USAGE: Readonly<Record<string, string>> = {
  generate: GENERATE_USAGE,
  decode: GENERATE_USAGE,
  encode: GENERATE_USAGE,
  backends: BACKENDS_USAGE,
  inspect: INSPECT_USAGE,
  quantize: QUANTIZE_USAGE,
  models: MODELS_USAGE,
};

/** The commands, for messages. */
const COMMANDS = [...Object.keys(COMMAND_USAGE), "help"];

/** One command's usage, as `COMMAND --help` prints it. */
function commandUsage(command: string): string {
  return `usage: bun apps/cli\n${COMMAND_USAGE[command]}`;
}

/** `did you mean X?` for a mistyped command, or undefined when none is close. */
function suggestion(typed: string, known: readonly string[]): string | undefined {
  const guess = typed.startsWith("-") ? undefined : suggestFlag(typed, known);
  return guess === undefined ? undefined : `did you mean ${guess}?`;
}

/** Where a command's flags are listed, for parse errors. */
const flagsOf = (command: string) => ({ command, help: `bun apps/cli ${command} --help` });

/** `backends`: try to start every registered backend and report its device or the reason it cannot. */
async function backends(args: string[]): Promise<number> {
  const { values } = parseFlags(flagsOf("backends"), {
    args,
    options: {
      threads: { type: "string" },
      json: { type: "boolean", default: false },
      verbose: { type: "boolean", short: "v", default: false },
      help: { type: "boolean", short: "h", default: false },
    },
    strict: true,
  });
  if (values.help) {
    console.log(commandUsage("backends"));
    return 0;
  }
  const options: BackendOptions = values.verbose ? { verbose: true } : {};
  if (values.threads !== undefined) {
    const n = Number(values.threads);
    if (!/^\d{1,3}$/.test(values.threads) || n > 256) {
      throw new TpError(
        "E_ARG",
        `--threads must be an integer from 0 (all CPUs) to 256, got '${values.threads}'`,
      );
    }
    options.threads = n;
  }
  const rows: { backend: string; available: boolean; device: string | null; error: string | null }[] = [];
  for (const name of backendNames()) {
    try {
      const b = await loadBackend(name, options);
      rows.push({ backend: name, available: true, device: b.device, error: null });
      b.dispose();
    } catch (e) {
      const error = e instanceof TpError ? `${e.code}: ${e.message}` : String(e);
      rows.push({ backend: name, available: false, device: null, error });
    }
  }
  if (values.json) console.log(JSON.stringify(rows, null, 2));
  else
    for (const r of rows)
      console.log(`${r.backend.padEnd(8)} ${r.available ? "yes" : "no "}  ${r.device ?? r.error}`);
  return 0;
}

/** `inspect PATH`: layout, metadata and tensor table of a safetensors/GGUF file or a model directory. */
function inspect(args: string[]): number {
  const { values, positionals } = parseFlags(flagsOf("inspect"), {
    args,
    options: {
      json: { type: "boolean", default: false },
      "array-limit": { type: "string" },
      help: { type: "boolean", short: "h", default: false },
    },
    allowPositionals: true,
    strict: true,
  });
  if (values.help) {
    console.log(commandUsage("inspect"));
    return 0;
  }
  if (positionals.length !== 1) {
    throw new TpError(
      "E_ARG",
      `inspect takes one PATH (a .safetensors, .gguf or .index.json file, or a directory), got ${positionals.length}`,
    );
  }
  const limit = values["array-limit"] === undefined ? 8 : Number(values["array-limit"]);
  if (!Number.isInteger(limit) || limit < 0) {
    throw new TpError(
      "E_ARG",
      `--array-limit must be a non-negative integer, got '${values["array-limit"]}'`,
    );
  }
  const report = inspectCheckpoint(positionals[0] as string, { arrayLimit: limit });
  // in chunks: a header of a million tensors never becomes one string
  writeInspect(report, values.json, writeStdout);
  return 0;
}

/** Write all of `text` to stdout synchronously (a pipe that is full is waited for). */
function writeStdout(text: string): void {
  const bytes = Buffer.from(text);
  let done = 0;
  while (done < bytes.length) {
    try {
      done += writeSync(1, bytes, done, bytes.length - done);
    } catch (e) {
      if ((e as { code?: string }).code !== "EAGAIN") throw e;
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1);
    }
  }
}

/** `help [COMMAND]`: the usage, or one command's. */
function help(args: string[]): number {
  const [command, ...extra] = args;
  if (command === undefined) {
    console.log(USAGE);
    return 0;
  }
  if (extra.length > 0 || COMMAND_USAGE[command] === undefined) {
    throw new TpError(
      "E_ARG",
      `help takes at most one COMMAND, one of: ${Object.keys(COMMAND_USAGE).join(", ")}; got '${args.join(" ")}'`,
    );
  }
  console.log(commandUsage(command));
  return 0;
}

// SIGINT / SIGTERM while an output is written: it is removed, one line, exit 130 / 143 — at once, in
// native code when the CPU library is built (a JavaScript handler would wait for a synchronous stage
// to end); loaded with the first output, so commands that write nothing do not pay for it.
installInterruptCleanup({ native: nativeInterruptHandler });

await runCli(async () => {
  const [command, ...rest] = Bun.argv.slice(2);
  try {
    switch (command) {
      case "backends":
        return await backends(rest);
      case "inspect":
        return inspect(rest);
      case "quantize":
        return quantize(rest);
      case "models":
        return models(rest);
      case "generate":
        return await generate(rest);
      case "decode":
        return await decode(rest);
      case "encode":
        return await encode(rest);
      case undefined:
        // No command is a usage error: the usage on stderr (not as an error line), exit status 2.
        process.stderr.write(`${USAGE}\n`);
        return 2;
      case "help":
      case "--help":
      case "-h":
        return help(rest);
      default:
        throw new TpError(
          "E_ARG",
          `unknown command '${command}'; ${suggestion(command, COMMANDS) ?? `expected one of: ${COMMANDS.join(", ")}`}`,
        );
    }
  } catch (e) {
    // A failed read may come from an input cut short or replaced under its mapping: say which.
    checkInputsUnchanged(undefined, e);
    // generate / decode / encode parse with node:util parseArgs themselves: its message as it is.
    if (e instanceof TypeError && String((e as { code?: string }).code).startsWith("ERR_PARSE_ARGS")) {
      throw new TpError("E_ARG", e.message);
    }
    throw e;
  }
});
