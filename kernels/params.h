// params.h -- one plain C struct of parameters per kernel family, shared with Rust.
//
// Every kernel takes exactly one of these by value (`const __grid_constant__ XxxParams p`), on the
// CUDA target and on the emulated target alike. The Rust mirror (src/params.rs) is generated from
// this file by bindgen (`scripts/regen-params.sh`) and committed; a test fails when it is stale.
//
// Conventions: pointers are 64-bit device addresses (uint64_t, 0 when absent); sizes, strides and
// offsets are int64_t and counted in elements, never bytes; choices are enums, never bare ints.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// ---------------------------------------------------------------------------- RMSNorm
// y = x * rsqrt(mean(x^2) + eps) * weight, per row; the fused variant first forms
// r = x + residual, stores r into `residual`, and normalizes r.
typedef struct RmsNormParams {
  uint64_t x;         // [rows, hidden] input, rows `x_row_stride` apart
  uint64_t residual;  // [rows, hidden] fused variant only: residual in, x + residual out
  uint64_t weight;    // [hidden], contiguous
  uint64_t y;         // [rows, hidden] output; may be x itself (in place)
  int64_t rows;
  int64_t hidden;
  int64_t x_row_stride;
  int64_t residual_row_stride;
  int64_t y_row_stride;
  float eps;
} RmsNormParams;

// ---------------------------------------------------------------------------- Self-tests
// Small kernels that exercise the emulation runtime (and, on a GPU, check that the emulated PTX
// wrappers match the hardware). See kernels/selftest.cu.
typedef enum LlkSelftestVariant {
  LLK_SELFTEST_CORRECT = 0,      // the kernel as it should be written
  LLK_SELFTEST_PLANTED_BUG = 1,  // with the bug the test must catch (missing barrier, ...)
} LlkSelftestVariant;

typedef struct SelftestParams {
  uint64_t input;  // [n] f32 (kernel-specific meaning)
  uint64_t out;    // [n] f32 or i32 (kernel-specific meaning)
  int64_t n;
  LlkSelftestVariant variant;
} SelftestParams;

#ifdef __cplusplus
}
#endif
