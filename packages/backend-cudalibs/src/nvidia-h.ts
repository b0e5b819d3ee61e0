/**
 * Every enum value, attribute number and struct size this package passes to cuBLASLt and cuDNN, in
 * one place, each with its header. ./nvidia-h.test.ts compiles a C probe against cublasLt.h /
 * cudnn.h where they are installed (TP_CUDA_INCLUDE_DIR, the nvidia wheels' include folders, the CUDA
 * toolkit) and compares every value here with the header's.
 *
 * Sources: cublasLt.h, cublas_api.h and library_types.h (cudaDataType_t) as published with CUDA 12.x,
 * cudnn_graph.h of cuDNN 9 (cudnnStatus_t), and the cuBLAS documentation (docs.nvidia.com/cuda/cublas,
 * §cuBLASLt API: cublasLtMatmulDescAttributes_t, cublasLtMatrixLayoutAttribute_t,
 * cublasLtMatmulPreferenceAttributes_t, cublasLtEpilogue_t, cublasLtMatmulHeuristicResult_t). Every value
 * below was found identical in several public copies of those headers; none was checked against CUDA
 * 13's own headers (not installed where this was written): the probe does that on the GPU host.
 */

/** cublasStatus_t (cublas_api.h). */
export const CUBLAS_STATUS = {
  CUBLAS_STATUS_SUCCESS: 0,
  CUBLAS_STATUS_NOT_INITIALIZED: 1,
  CUBLAS_STATUS_ALLOC_FAILED: 3,
  CUBLAS_STATUS_INVALID_VALUE: 7,
  CUBLAS_STATUS_ARCH_MISMATCH: 8,
  CUBLAS_STATUS_MAPPING_ERROR: 11,
  CUBLAS_STATUS_EXECUTION_FAILED: 13,
  CUBLAS_STATUS_INTERNAL_ERROR: 14,
  CUBLAS_STATUS_NOT_SUPPORTED: 15,
  CUBLAS_STATUS_LICENSE_ERROR: 16,
} as const;

/** cudaDataType_t (library_types.h). */
export const CUDA_DATA_TYPE = {
  CUDA_R_32F: 0,
  CUDA_R_16F: 2,
  CUDA_R_8I: 3,
  CUDA_R_32I: 10,
  CUDA_R_16BF: 14,
  CUDA_R_8F_E4M3: 28,
  CUDA_R_8F_E5M2: 29,
} as const;

/** cublasComputeType_t (cublas_api.h). */
export const CUBLAS_COMPUTE = {
  CUBLAS_COMPUTE_32F: 68,
  CUBLAS_COMPUTE_32I: 72,
} as const;

/** cublasOperation_t (cublas_api.h). */
export const CUBLAS_OP = { CUBLAS_OP_N: 0, CUBLAS_OP_T: 1 } as const;

/** cublasLtOrder_t (cublasLt.h). */
export const CUBLASLT_ORDER = { CUBLASLT_ORDER_COL: 0, CUBLASLT_ORDER_ROW: 1 } as const;

/** cublasLtMatmulDescAttributes_t (cublasLt.h), with the C type each attribute takes. */
export const CUBLASLT_MATMUL_DESC = {
  /** int32_t cublasComputeType_t (read only after create). */
  CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: 0,
  /** int32_t cudaDataType_t. */
  CUBLASLT_MATMUL_DESC_SCALE_TYPE: 1,
  /** int32_t cublasLtPointerMode_t. */
  CUBLASLT_MATMUL_DESC_POINTER_MODE: 2,
  /** int32_t cublasOperation_t. */
  CUBLASLT_MATMUL_DESC_TRANSA: 3,
  CUBLASLT_MATMUL_DESC_TRANSB: 4,
  /** uint32_t cublasLtEpilogue_t. */
  CUBLASLT_MATMUL_DESC_EPILOGUE: 7,
  /** const void * (device). */
  CUBLASLT_MATMUL_DESC_BIAS_POINTER: 8,
  /** const void * (device): scale of A / B for narrow types (fp8). */
  CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: 17,
  CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: 18,
} as const;

/** cublasLtMatrixLayoutAttribute_t (cublasLt.h). */
export const CUBLASLT_MATRIX_LAYOUT = {
  CUBLASLT_MATRIX_LAYOUT_TYPE: 0,
  /** int32_t cublasLtOrder_t. */
  CUBLASLT_MATRIX_LAYOUT_ORDER: 1,
  CUBLASLT_MATRIX_LAYOUT_ROWS: 2,
  CUBLASLT_MATRIX_LAYOUT_COLS: 3,
  CUBLASLT_MATRIX_LAYOUT_LD: 4,
  CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: 5,
} as const;

/** cublasLtMatmulPreferenceAttributes_t (cublasLt.h). */
export const CUBLASLT_MATMUL_PREF = {
  CUBLASLT_MATMUL_PREF_SEARCH_MODE: 0,
  /** uint64_t. */
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: 1,
} as const;

/** cublasLtEpilogue_t (cublasLt.h). */
export const CUBLASLT_EPILOGUE = {
  CUBLASLT_EPILOGUE_DEFAULT: 1,
  CUBLASLT_EPILOGUE_BIAS: 4,
  CUBLASLT_EPILOGUE_GELU: 32,
  CUBLASLT_EPILOGUE_GELU_BIAS: 36,
} as const;

/**
 * Struct sizes (bytes) and offsets on x86-64 Linux (LP64): cublasLtMatmulAlgo_t is uint64_t[8];
 * cublasLtMatmulHeuristicResult_t is { algo; size_t workspaceSize; cublasStatus_t state; float
 * wavesCount; int reserved[4]; }.
 */
export const CUBLASLT_SIZES = {
  cublasLtMatmulAlgo_t: 64,
  cublasLtMatmulHeuristicResult_t: 96,
  "cublasLtMatmulHeuristicResult_t.workspaceSize": 64,
  "cublasLtMatmulHeuristicResult_t.state": 72,
  "cublasLtMatmulHeuristicResult_t.wavesCount": 76,
  cublasStatus_t: 4,
  cublasLtHandle_t: 8,
} as const;

/** cudnnStatus_t (cudnn_graph.h of cuDNN 9): the success code; others are named by cudnnGetErrorString. */
export const CUDNN_STATUS = { CUDNN_STATUS_SUCCESS: 0 } as const;

/** Sizes of the cuDNN types used here. */
export const CUDNN_SIZES = { cudnnStatus_t: 4, cudnnHandle_t: 8 } as const;
