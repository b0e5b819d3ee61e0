/*
 * The ConvRot weight-row quantizer (quantize_w_body.h) compiled with the AVX2 flags of the build
 * (native/cpu/README.md, "Flags"); chosen by quantize_w.c when the context's ISA level allows it.
 * Bit-exact with the scalar level: the same IEEE operations in the same order, only vectorized.
 */
#define QW_SUFFIX avx2
#include "quantize_w_body.h"
