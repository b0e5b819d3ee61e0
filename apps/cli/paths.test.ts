// The CLI's output-path rules: same-file detection (resolved paths, symbolic and hard links), and
// all-or-nothing writes of several outputs (temporary names, renamed together; nothing left on failure).
import { afterAll, expect, test } from "bun:test";
import {
  linkSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { writeAtomically } from "@tp/formats";
import { checkDistinctPaths, writeAllOrNothing } from "./paths.ts";

const tmp = mkdtempSync(join(tmpdir(), "tp-cli-paths-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const errorOf = (f: () => void): string => {
  try {
    f();
  } catch (e) {
    return `${(e as { code?: string }).code}: ${(e as Error).message}`;
  }
  return "no error";
};

test("an output that is an input — spelled differently, a symbolic or a hard link — is E_ARG naming both", () => {
  const a = join(tmp, "a.safetensors");
  writeFileSync(a, "x");
  const sym = join(tmp, "sym.safetensors");
  symlinkSync(a, sym);
  const hard = join(tmp, "hard.safetensors");
  linkSync(a, hard);
  mkdirSync(join(tmp, "sub"));
  for (const out of [a, `${tmp}/./a.safetensors`, `${tmp}/sub/../a.safetensors`, sym, hard]) {
    expect(errorOf(() => checkDistinctPaths([{ label: "IN", path: a }], [{ label: "OUT", path: out }]))).toBe(
      `E_ARG: OUT ${out} is the same file as IN ${a}; writing it would overwrite the input — choose another OUT`,
    );
  }
  const b = join(tmp, "b.safetensors"); // not there yet
  expect(errorOf(() => checkDistinctPaths([{ label: "IN", path: a }], [{ label: "OUT", path: b }]))).toBe(
    "no error",
  );
  expect(
    errorOf(() =>
      checkDistinctPaths(
        [],
        [
          { label: "--latent-out", path: b },
          { label: "--cond-out", path: `${tmp}/sub/../b.safetensors` },
        ],
      ),
    ),
  ).toStartWith(`E_ARG: --latent-out ${b} and --cond-out ${tmp}/sub/../b.safetensors are the same file`);
});

test("writeAllOrNothing: all outputs appear together; after a failure none and no temporary file", () => {
  const dir = join(tmp, "all");
  mkdirSync(dir);
  writeAllOrNothing((stage) => {
    writeAtomically(stage("--a", join(dir, "a")), (w) => w(new TextEncoder().encode("a")));
    writeAtomically(stage("--b", join(dir, "b")), (w) => w(new TextEncoder().encode("b")));
    // written and fsynced under temporary names, not yet renamed
    expect(readdirSync(dir).filter((n) => n === "a" || n === "b")).toEqual([]);
    expect(readdirSync(dir).length).toBe(2);
  });
  expect(readdirSync(dir).sort()).toEqual(["a", "b"]);
  expect(readFileSync(join(dir, "a"), "utf8")).toBe("a");

  const dir2 = join(tmp, "fail");
  mkdirSync(dir2);
  // The second output fails while being written: the first one's temporary file goes too.
  expect(
    errorOf(() =>
      writeAllOrNothing((stage) => {
        writeAtomically(stage("--a", join(dir2, "a")), (w) => w(new Uint8Array(1)));
        writeAtomically(stage("--b", join(dir2, "b")), () => {
          throw new Error("disk full");
        });
      }),
    ),
  ).toBe(`E_IO: cannot write --b: disk full (file ${join(dir2, "b")})`);
  expect(readdirSync(dir2)).toEqual([]);
  // An output staged but never written: nothing is renamed, nothing is left.
  expect(
    errorOf(() =>
      writeAllOrNothing((stage) => {
        writeAtomically(stage("--a", join(dir2, "a")), (w) => w(new Uint8Array(1)));
        stage("--b", join(dir2, "b"));
      }),
    ),
  ).toBe(`E_STATE: --b ${join(dir2, "b")} was staged but never written; nothing was written`);
  expect(readdirSync(dir2)).toEqual([]);
});
