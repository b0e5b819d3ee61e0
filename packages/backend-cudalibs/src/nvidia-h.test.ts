// The constants of ./nvidia-h.ts and the bun:ffi declarations of ./cublaslt.ts and ./cudnn.ts against
// the installed headers: a C probe compiled against cublasLt.h / cudnn.h prints every enum value,
// struct size and offset the TS side assumes, and assigns each entry point to a function pointer of
// the prototype the declarations encode (-Werror: a mismatch does not compile). Headers are looked
// for in TP_CUDA_INCLUDE_DIR (':'-separated), the include folders beside TP_CUDA_LIB_DIR's lib
// folders (the nvidia wheels' layout), the wheels found by python3, CUDA_HOME and /usr/local/cuda*.
// Each header's block skips, with the reason, where it is absent.
import { describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { CUBLASLT_SIGNATURES } from "./cublaslt.ts";
import { CUDNN_SIGNATURES } from "./cudnn.ts";
import { libraryDirs } from "./libraries.ts";
import * as H from "./nvidia-h.ts";

/** Candidate include folders, existing ones only, in order. */
function includeDirs(): string[] {
  const env = process.env;
  const dirs = (env.TP_CUDA_INCLUDE_DIR ?? "").split(":").filter((d) => d.trim() !== "");
  for (const lib of libraryDirs(env)) dirs.push(join(dirname(lib), "include"));
  const py = Bun.which("python3");
  if (py !== null) {
    const r = Bun.spawnSync([py, "-c", "import nvidia, os; print(list(nvidia.__path__)[0])"], {
      stderr: "ignore",
    });
    const root = r.exitCode === 0 ? r.stdout.toString().trim() : "";
    if (root !== "")
      for (const p of ["cublas", "cudnn", "cuda_runtime", "cuda_nvrtc"]) dirs.push(join(root, p, "include"));
  }
  for (const d of [env.CUDA_HOME, "/usr/local/cuda", "/usr/local/cuda-13.0", "/usr/local/cuda-12"])
    if (d !== undefined) dirs.push(join(d, "include"));
  return [...new Set(dirs)].filter((d) => existsSync(d));
}

const dirs = includeDirs();
const cc = Bun.which("cc") ?? Bun.which("gcc");
const has = (header: string) => dirs.some((d) => existsSync(join(d, header)));
const reason = (header: string) =>
  cc === null
    ? "no C compiler (cc)"
    : has(header)
      ? null
      : `${header} not found (set TP_CUDA_INCLUDE_DIR; looked in ${dirs.join(", ") || "no existing folder"})`;

/**
 * Compile and run a probe printing JSON (the lines are C statements inside main); `checks` (top-level
 * declarations) are compiled on their own with -fsyntax-only, so they need no library to link.
 */
function probe(header: string, checks: string[], lines: string[]): Record<string, number> {
  const dir = mkdtempSync(join(tmpdir(), "tp-nvidia-h-"));
  try {
    const head = `#include <${header}>\n#include <stdio.h>\n#include <stddef.h>\n#include <stdint.h>\n`;
    const include = dirs.flatMap((d) => ["-I", d]);
    writeFileSync(join(dir, "checks.c"), `${head}${checks.join("\n")}\n`);
    const typed = Bun.spawnSync([
      cc as string,
      "-fsyntax-only",
      "-Werror=incompatible-pointer-types",
      ...include,
      join(dir, "checks.c"),
    ]);
    if (typed.exitCode !== 0)
      throw new Error(`prototype checks did not compile:\n${typed.stderr.toString()}`);
    const src = `${head}int main(void){printf("{\\n");\n${lines.join("\n")}\nprintf("\\"end\\": 0}\\n");return 0;}\n`;
    writeFileSync(join(dir, "probe.c"), src);
    const build = Bun.spawnSync([cc as string, ...include, "-o", join(dir, "probe"), join(dir, "probe.c")]);
    if (build.exitCode !== 0) throw new Error(`probe did not compile:\n${build.stderr.toString()}`);
    return JSON.parse(Bun.spawnSync([join(dir, "probe")]).stdout.toString());
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
/** The probe's values, or its failure as a message (reported by a test, not at load time). */
function attempt(f: () => Record<string, number>): { got: Record<string, number>; error?: string } {
  try {
    return { got: f() };
  } catch (e) {
    return { got: {}, error: e instanceof Error ? e.message : String(e) };
  }
}
const num = (key: string, expr: string) => `printf("\\"${key}\\": %lld,\\n", (long long)(${expr}));`;

/** The C prototype each bun:ffi declaration of cuBLASLt stands for. */
const CUBLASLT_PROTOTYPES: Record<keyof typeof CUBLASLT_SIGNATURES, string> = {
  cublasLtCreate: "cublasStatus_t (*)(cublasLtHandle_t *)",
  cublasLtDestroy: "cublasStatus_t (*)(cublasLtHandle_t)",
  cublasLtGetVersion: "size_t (*)(void)",
  cublasLtGetStatusString: "const char *(*)(cublasStatus_t)",
  cublasLtMatmulDescCreate: "cublasStatus_t (*)(cublasLtMatmulDesc_t *, cublasComputeType_t, cudaDataType_t)",
  cublasLtMatmulDescDestroy: "cublasStatus_t (*)(cublasLtMatmulDesc_t)",
  cublasLtMatmulDescSetAttribute:
    "cublasStatus_t (*)(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void *, size_t)",
  cublasLtMatrixLayoutCreate:
    "cublasStatus_t (*)(cublasLtMatrixLayout_t *, cudaDataType, uint64_t, uint64_t, int64_t)",
  cublasLtMatrixLayoutDestroy: "cublasStatus_t (*)(cublasLtMatrixLayout_t)",
  cublasLtMatmulPreferenceCreate: "cublasStatus_t (*)(cublasLtMatmulPreference_t *)",
  cublasLtMatmulPreferenceDestroy: "cublasStatus_t (*)(cublasLtMatmulPreference_t)",
  cublasLtMatmulPreferenceSetAttribute:
    "cublasStatus_t (*)(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t, const void *, size_t)",
  cublasLtMatmulAlgoGetHeuristic:
    "cublasStatus_t (*)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int, cublasLtMatmulHeuristicResult_t *, int *)",
  cublasLtMatmul:
    "cublasStatus_t (*)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *, cublasLtMatrixLayout_t, const void *, cublasLtMatrixLayout_t, const void *, const void *, cublasLtMatrixLayout_t, void *, cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *, void *, size_t, cudaStream_t)",
};
const CUDNN_PROTOTYPES: Record<keyof typeof CUDNN_SIGNATURES, string> = {
  cudnnGetVersion: "size_t (*)(void)",
  cudnnGetErrorString: "const char *(*)(cudnnStatus_t)",
  cudnnCreate: "cudnnStatus_t (*)(cudnnHandle_t *)",
  cudnnDestroy: "cudnnStatus_t (*)(cudnnHandle_t)",
  cudnnSetStream: "cudnnStatus_t (*)(cudnnHandle_t, cudaStream_t)",
  cudnnBackendCreateDescriptor: "cudnnStatus_t (*)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *)",
  cudnnBackendDestroyDescriptor: "cudnnStatus_t (*)(cudnnBackendDescriptor_t)",
  cudnnBackendSetAttribute:
    "cudnnStatus_t (*)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t, int64_t, const void *)",
  cudnnBackendGetAttribute:
    "cudnnStatus_t (*)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t, int64_t, int64_t *, void *)",
  cudnnBackendFinalize: "cudnnStatus_t (*)(cudnnBackendDescriptor_t)",
  cudnnBackendExecute: "cudnnStatus_t (*)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t)",
};
/** `typedef <proto with name> ; name p = symbol;` so that a prototype mismatch fails to compile. */
const pointerChecks = (protos: Record<string, string>) =>
  Object.entries(protos).map(([name, proto]) => {
    const typed = proto.replace("(*)", `(*tp_${name}_t)`);
    return `typedef ${typed};\nstatic tp_${name}_t tp_${name} = ${name};`;
  });

describe("the prototypes cover every declaration", () => {
  test("cuBLASLt and cuDNN", () => {
    expect(Object.keys(CUBLASLT_PROTOTYPES).sort()).toEqual(Object.keys(CUBLASLT_SIGNATURES).sort());
    expect(Object.keys(CUDNN_PROTOTYPES).sort()).toEqual(Object.keys(CUDNN_SIGNATURES).sort());
  });
});

const ENUMS = {
  CUBLAS_STATUS: H.CUBLAS_STATUS,
  CUDA_DATA_TYPE: H.CUDA_DATA_TYPE,
  CUBLAS_COMPUTE: H.CUBLAS_COMPUTE,
  CUBLAS_OP: H.CUBLAS_OP,
  CUBLASLT_ORDER: H.CUBLASLT_ORDER,
  CUBLASLT_MATMUL_DESC: H.CUBLASLT_MATMUL_DESC,
  CUBLASLT_MATRIX_LAYOUT: H.CUBLASLT_MATRIX_LAYOUT,
  CUBLASLT_MATMUL_PREF: H.CUBLASLT_MATMUL_PREF,
  CUBLASLT_EPILOGUE: H.CUBLASLT_EPILOGUE,
};

describe("cublasLt.h agrees with ./nvidia-h.ts and ./cublaslt.ts", () => {
  const why = reason("cublasLt.h");
  if (why !== null) {
    test.skip(`skipped: ${why}`, () => {});
    return;
  }
  const lines: string[] = [];
  for (const group of Object.values(ENUMS)) for (const k of Object.keys(group)) lines.push(num(k, k));
  const R = "cublasLtMatmulHeuristicResult_t";
  lines.push(
    num("cublasLtMatmulAlgo_t", "sizeof(cublasLtMatmulAlgo_t)"),
    num(R, `sizeof(${R})`),
    num(`${R}.workspaceSize`, `offsetof(${R}, workspaceSize)`),
    num(`${R}.state`, `offsetof(${R}, state)`),
    num(`${R}.wavesCount`, `offsetof(${R}, wavesCount)`),
    num("cublasStatus_t", "sizeof(cublasStatus_t)"),
    num("cublasLtHandle_t", "sizeof(cublasLtHandle_t)"),
  );
  const { got, error } = attempt(() => probe("cublasLt.h", pointerChecks(CUBLASLT_PROTOTYPES), lines));
  test("the probe compiles (prototypes included) and runs", () => {
    expect(error).toBeUndefined();
  });
  for (const [group, values] of Object.entries(ENUMS)) {
    test(group, () => {
      for (const [k, v] of Object.entries(values)) expect([k, got[k]]).toEqual([k, v]);
    });
  }
  test("struct sizes and offsets", () => {
    for (const [k, v] of Object.entries(H.CUBLASLT_SIZES)) expect([k, got[k]]).toEqual([k, v]);
  });
});

describe("cudnn.h agrees with ./nvidia-h.ts and ./cudnn.ts", () => {
  const why = reason("cudnn.h");
  if (why !== null) {
    test.skip(`skipped: ${why}`, () => {});
    return;
  }
  const CUDNN_ENUMS = {
    CUDNN_STATUS: H.CUDNN_STATUS,
    CUDNN_DATA_TYPE: H.CUDNN_DATA_TYPE,
    CUDNN_BACKEND: H.CUDNN_BACKEND,
    CUDNN_TYPE: H.CUDNN_TYPE,
    CUDNN_ATTR: H.CUDNN_ATTR,
    CUDNN_POINTWISE: H.CUDNN_POINTWISE,
    CUDNN_REDUCE: H.CUDNN_REDUCE,
    CUDNN_HEUR_MODE: H.CUDNN_HEUR_MODE,
    CUDNN_CONV_MODE: H.CUDNN_CONV_MODE,
    CUDNN_NUMERICAL_NOTE: H.CUDNN_NUMERICAL_NOTE,
  };
  // the C expression of each size in ./nvidia-h.ts CUDNN_SIZES (a CUDNN_TYPE_BOOLEAN element is a C bool)
  const SIZE_EXPR: Record<keyof typeof H.CUDNN_SIZES, string> = {
    cudnnStatus_t: "sizeof(cudnnStatus_t)",
    cudnnHandle_t: "sizeof(cudnnHandle_t)",
    cudnnBackendDescriptor_t: "sizeof(cudnnBackendDescriptor_t)",
    cudnnDataType_t: "sizeof(cudnnDataType_t)",
    cudnnPointwiseMode_t: "sizeof(cudnnPointwiseMode_t)",
    cudnnBackendHeurMode_t: "sizeof(cudnnBackendHeurMode_t)",
    cudnnBackendNumericalNote_t: "sizeof(cudnnBackendNumericalNote_t)",
    cudnnConvolutionMode_t: "sizeof(cudnnConvolutionMode_t)",
    cudnnReduceTensorOp_t: "sizeof(cudnnReduceTensorOp_t)",
    bool: "sizeof(_Bool)",
  };
  const lines: string[] = [];
  for (const group of Object.values(CUDNN_ENUMS)) for (const k of Object.keys(group)) lines.push(num(k, k));
  for (const [k, expr] of Object.entries(SIZE_EXPR)) lines.push(num(`sizeof:${k}`, expr));
  const { got, error } = attempt(() => probe("cudnn.h", pointerChecks(CUDNN_PROTOTYPES), lines));
  test("the probe compiles (every entry point's prototype included) and runs", () => {
    expect(error).toBeUndefined();
  });
  for (const [group, values] of Object.entries(CUDNN_ENUMS)) {
    test(group, () => {
      for (const [k, v] of Object.entries(values)) expect([k, got[k]]).toEqual([k, v]);
    });
  }
  test("type sizes", () => {
    for (const [k, v] of Object.entries(H.CUDNN_SIZES)) expect([k, got[`sizeof:${k}`]]).toEqual([k, v]);
  });
});
