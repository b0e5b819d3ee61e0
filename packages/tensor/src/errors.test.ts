import { expect, test } from "bun:test";
import { formatErrorLine, TpError } from "./errors.ts";

test("messages name the file, tensor and offset; CLIs print one line", () => {
  const e = new TpError("E_FORMAT", "tensor data past the end of the file", {
    file: "/m/x.safetensors",
    tensor: "first.weight",
    offset: 1234,
  });
  expect(e.message).toBe(
    "tensor data past the end of the file (file /m/x.safetensors, tensor first.weight, offset 1234)",
  );
  expect(e.code).toBe("E_FORMAT");
  expect(e).toBeInstanceOf(Error);
  expect(formatErrorLine(new TpError("E_ARG", "bad\n  flag"))).toBe("error E_ARG: bad flag");
  expect(formatErrorLine(new RangeError("oops"))).toBe("error E_INTERNAL: oops");
  // A name from a hostile file cannot break the line (the fuzzer's GGUF tensor name "a\nb").
  expect(new TpError("E_FORMAT", "bad", { tensor: "a\nb\u0000" }).message).toBe(
    "bad (tensor a\\u000ab\\u0000)",
  );
});

test("runCli prints one line on stderr and exits 1 (2 for E_ARG)", () => {
  for (const [code, status] of [
    ["E_IO", 1],
    ["E_ARG", 2],
  ] as const) {
    const src = `import { runCli, TpError } from "${import.meta.dir}/errors.ts";
      runCli(() => { throw new TpError("${code}", "cannot open /nope", { file: "/nope" }); });`;
    const r = Bun.spawnSync(["bun", "-e", src], { stderr: "pipe", stdout: "pipe" });
    expect(r.exitCode).toBe(status);
    expect(r.stderr.toString()).toBe(`error ${code}: cannot open /nope (file /nope)\n`);
  }
});
