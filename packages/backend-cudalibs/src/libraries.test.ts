// Loading libcublasLt / libcudnn without a GPU: the places tried, and one error line for each way it
// can fail (absent, a truncated file, a library without the entry points, built here with cc); the
// cuda backend's "cannot start" line where libcuda.so.1 is absent.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadCudaDriver } from "@tp/backend-ptx/driver";
import { thrownTpError } from "@tp/tensor/testing";
import { createBackend } from "./backend.ts";
import { loadCublasLt } from "./cublaslt.ts";
import { loadCudnn } from "./cudnn.ts";
import { libraryCandidates } from "./libraries.ts";

const root = mkdtempSync(join(tmpdir(), "tp-cudalibs-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));
/** A fresh folder under root. */
let n = 0;
const folder = () => {
  const d = join(root, `d${n++}`);
  mkdirSync(d);
  return d;
};
const onLoaderPath = (f: () => unknown) => {
  try {
    f();
    return true;
  } catch {
    return false;
  }
};
const hasCublasLt = onLoaderPath(() => loadCublasLt({}));
const hasDriver = onLoaderPath(() => loadCudaDriver({}));
const cc = Bun.which("cc") ?? Bun.which("gcc");

describe("library candidates", () => {
  test("every TP_CUDA_LIB_DIR folder × soname, then each soname on the loader path", () => {
    expect(
      libraryCandidates(["libcublasLt.so.13", "libcublasLt.so.12"], { TP_CUDA_LIB_DIR: "/a: /b/" }),
    ).toEqual([
      "/a/libcublasLt.so.13",
      "/a/libcublasLt.so.12",
      "/b/libcublasLt.so.13",
      "/b/libcublasLt.so.12",
      "libcublasLt.so.13",
      "libcublasLt.so.12",
    ]);
    expect(libraryCandidates(["libcudnn.so.9"], {})).toEqual(["libcudnn.so.9"]);
  });
});

describe("loading cuBLASLt and cuDNN", () => {
  test.skipIf(hasCublasLt)(
    "absent: E_UNSUPPORTED naming the library, the places tried and how to install it",
    () => {
      const dir = folder();
      const e = thrownTpError(() => loadCublasLt({ TP_CUDA_LIB_DIR: dir }));
      expect(e.code).toBe("E_UNSUPPORTED");
      expect(e.message).toStartWith("libcublasLt.so.13 (cuBLASLt) was not found: tried ");
      expect(e.message).toContain(
        `${dir}/libcublasLt.so.13, ${dir}/libcublasLt.so.12, libcublasLt.so.13 on the loader path, libcublasLt.so.12 on the loader path`,
      );
      expect(e.message).toContain("nvidia-cublas wheel");
      expect(e.message).toContain("TP_CUDA_LIB_DIR");
      expect(e.message).not.toContain("\n");
      const d = thrownTpError(() => loadCudnn(0, { TP_CUDA_LIB_DIR: dir }));
      expect(d.code).toBe("E_UNSUPPORTED");
      expect(d.message).toStartWith(
        `libcudnn.so.9 (cuDNN) was not found: tried ${dir}/libcudnn.so.9, libcudnn.so.9 on the loader path`,
      );
      expect(d.message).toContain("nvidia-cudnn");
    },
  );
  test("a truncated file in TP_CUDA_LIB_DIR: E_IO naming it", () => {
    const dir = folder();
    writeFileSync(join(dir, "libcublasLt.so.13"), new Uint8Array([0x7f, 0x45, 0x4c, 0x46, 2, 1]));
    const e = thrownTpError(() => loadCublasLt({ TP_CUDA_LIB_DIR: dir }));
    expect(e.code).toBe("E_IO");
    expect(e.message).toContain(
      `${dir}/libcublasLt.so.13 (TP_CUDA_LIB_DIR) is not a usable cuBLASLt library`,
    );
    expect(e.message).toContain("truncated");
    expect(e.file).toBe(`${dir}/libcublasLt.so.13`);
  });
  test.skipIf(cc === null)(
    "a library without the entry points: E_UNSUPPORTED naming a missing symbol",
    () => {
      const dir = folder();
      writeFileSync(join(dir, "other.c"), "int tp_unrelated(void) { return 7; }\n");
      for (const so of ["libcublasLt.so.12", "libcudnn.so.9"]) {
        const r = Bun.spawnSync([
          cc as string,
          "-shared",
          "-fPIC",
          "-o",
          join(dir, so),
          join(dir, "other.c"),
        ]);
        expect(r.exitCode).toBe(0);
      }
      const e = thrownTpError(() => loadCublasLt({ TP_CUDA_LIB_DIR: dir }));
      expect(e.code).toBe("E_UNSUPPORTED");
      expect(e.message).toMatch(
        new RegExp(
          `^${dir}/libcublasLt\\.so\\.12 cannot serve as cuBLASLt: .*Symbol "cublasLt\\w+" not found`,
        ),
      );
      const d = thrownTpError(() => loadCudnn(0, { TP_CUDA_LIB_DIR: dir }));
      expect(d.message).toMatch(/cannot serve as cuDNN: .*Symbol "cudnn\w+" not found/);
    },
  );
});

describe("the cuda backend without a driver", () => {
  test.skipIf(hasDriver)("one E_UNSUPPORTED line: backend cuda cannot start, naming libcuda.so.1", () => {
    const e = thrownTpError(() => createBackend({ env: { TP_CUDA_LIB_DIR: folder() } }));
    expect(e.code).toBe("E_UNSUPPORTED");
    expect(e.message).toStartWith("backend cuda cannot start: libcuda.so.1 (the CUDA driver) was not found");
    expect(e.message).not.toContain("\n");
  });
});
