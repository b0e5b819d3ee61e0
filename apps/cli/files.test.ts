// Inputs and outputs that are not what they claim (issue 21, items 6 and 9): a FIFO, socket or device
// given as a checkpoint is E_IO before it is opened (no hang: each run has a deadline), and an --out
// that names a folder is refused before any work, naming the user's path.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { cfgFlag } from "./generate.ts";

const cli = resolve(import.meta.dir, "index.ts");
const tmp = mkdtempSync(join(tmpdir(), "tp-cli-files-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

/** Run the CLI with a deadline: a hang fails the test instead of stalling the suite. */
function run(args: string[], timeoutMs = 15_000) {
  const p = Bun.spawnSync([process.execPath, cli, ...args], {
    stdout: "pipe",
    stderr: "pipe",
    timeout: timeoutMs,
  });
  return { code: p.exitCode, signal: p.signalCode, err: p.stderr.toString(), out: p.stdout.toString() };
}

const fifo = join(tmp, "model.safetensors");
const made = Bun.spawnSync(["mkfifo", fifo]);
const noFifo = made.exitCode === 0 ? "" : " [skipped: mkfifo is not available here]";

describe.skipIf(made.exitCode !== 0)(`a FIFO is refused without being opened${noFifo}`, () => {
  test("inspect FIFO: E_IO naming it, exit 1, at once", () => {
    const r = run(["inspect", fifo]);
    expect([r.code, r.signal]).toEqual([1, undefined]);
    expect(r.err.trim()).toBe(
      `error E_IO: ${fifo} is a FIFO (named pipe), not a regular file or a folder; pass a checkpoint file`,
    );
  });

  test("generate --dit FIFO: E_IO naming the flag", () => {
    const r = run(["generate", "--prompt", "p", "--dit", fifo, "--vae", fifo, "--text-encoder", fifo]);
    expect([r.code, r.signal]).toEqual([1, undefined]);
    expect(r.err.trim()).toBe(
      `error E_IO: --dit ${fifo} is a FIFO (named pipe), not a regular file; pass a checkpoint file`,
    );
  });

  test("quantize FIFO OUT.safetensors: E_IO naming the FIFO IN, nothing written", () => {
    const out = join(tmp, "q.safetensors");
    const r = run(["quantize", "--format", "int8-convrot", fifo, out]);
    expect([r.code, r.signal]).toEqual([1, undefined]);
    expect(r.err.trim()).toBe(
      `error E_IO: ${fifo} is a FIFO (named pipe), not a regular file; pass a checkpoint file`,
    );
    expect(existsSync(out)).toBe(false);
  });

  test("a character device (/dev/zero) is refused the same way", () => {
    const r = run(["inspect", "/dev/zero"]);
    expect(r.code).toBe(1);
    expect(r.err.trim()).toBe(
      "error E_IO: /dev/zero is a character device, not a regular file or a folder; pass a checkpoint file",
    );
  });
});

test("--out naming a folder (a trailing /) is refused before any work, naming the user's path", () => {
  const out = join(tmp, "dir.png/");
  const r = run(["decode", "--vae", "/nonexistent-vae", "--latent", "/nonexistent-latent", "--out", out]);
  expect(r.code).toBe(1);
  expect(r.err.trim()).toBe(
    `error E_IO: --out ${out} names a folder, not a file; give a file name (file ${out})`,
  );
  expect(readdirSync(tmp).filter((n) => n.startsWith("dir.png"))).toEqual([]);
});

describe("messages (issue 21, item 9)", () => {
  test("quantize … OUT.gguf is refused (it would be safetensors under a .gguf name); nothing written", () => {
    const out = join(tmp, "OUT.gguf");
    const r = run(["quantize", "--format", "int8-convrot", "/nonexistent.safetensors", out]);
    expect(r.code).toBe(2);
    expect(r.err.trim()).toBe(
      `error E_ARG: OUT must end in .safetensors (quantize writes a ComfyUI safetensors checkpoint; GGUF output is not supported), got '${out}'`,
    );
    expect(existsSync(out)).toBe(false);
  });

  test("an empty .gguf gets a GGUF message, not a safetensors one", () => {
    const empty = join(tmp, "empty.gguf");
    Bun.spawnSync(["truncate", "-s", "0", empty]);
    const r = run(["inspect", empty]);
    expect(r.code).toBe(1);
    expect(r.err.trim()).toBe(
      `error E_FORMAT: not a GGUF file: it does not start with the magic "GGUF" (file ${empty}, offset 0)`,
    );
  });

  test("--cfg 1e308 (finite, but infinite in float32) says so", () => {
    expect(() => cfgFlag("1e308")).toThrow(
      "--cfg must be a number from -3.4028e38 to 3.4028e38 (the sampler computes in float32, where '1e308' is infinite)",
    );
    expect(cfgFlag("3.4e38")).toBe(3.4e38);
    expect(() => cfgFlag("inf")).toThrow("--cfg must be a finite number, got 'inf'");
  });
});
