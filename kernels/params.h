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
// Threads per block (launch bounds) of the plain and the fused kernels; the host plans rows over
// at most this many threads (the fused kernel holds twice the loads in registers).
#define LLK_RMS_NORM_MAX_THREADS 1024
#define LLK_RMS_NORM_MAX_THREADS_FUSED 512

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

// ---------------------------------------------------------------------------- RoPE
// Rotates q and k in place: pair (a, b) at position p becomes
//   (a cos(p f_i) - b sin(p f_i), b cos(p f_i) + a sin(p f_i)),  f_i = inv_freq[i].
typedef enum LlkRopeLayout {
  LLK_ROPE_INTERLEAVED = 0,  // pairs (2i, 2i+1): Meta's reference (complex form), Llama 4 in HF
  LLK_ROPE_HALF_SPLIT = 1,   // pairs (i, i + rotary_dim/2): Hugging Face rotate_half, NeoX
} LlkRopeLayout;

typedef enum LlkIndexType {
  LLK_INDEX_I32 = 0,
  LLK_INDEX_I64 = 1,
} LlkIndexType;

typedef enum LlkRopeNorm {
  LLK_ROPE_NO_NORM = 0,
  LLK_ROPE_L2_NORM = 1,  // Llama 4: x * rsqrt(mean(x^2) + eps) over each head, after rotating
} LlkRopeNorm;

// The position domain: |p| <= LLK_ROPE_MAX_POSITION is rotated to within 3e-7 of the exact angle.
// Positions outside it are clamped to +-LLK_ROPE_MAX_POSITION (on both targets, and in the
// reference): the result is still a rotation, at the clamped angle. Llama 4's longest context
// (10M tokens) is inside the domain.
#define LLK_ROPE_MAX_POSITION 16777215

typedef struct RopeParams {
  uint64_t q;          // [tokens, q_heads, head_dim], rotated in place
  uint64_t k;          // [tokens, kv_heads, head_dim], rotated in place (0 when kv_heads == 0)
  uint64_t positions;  // [tokens], i32 or i64 (position_type)
  uint64_t inv_freq;   // [rotary_dim / 2] float2 {hi, lo}: f_i = hi + lo, from an f64 table
  int64_t tokens;
  int64_t q_heads;
  int64_t kv_heads;
  int64_t head_dim;
  int64_t rotary_dim;  // even, <= head_dim; dims from rotary_dim on pass through
  int64_t q_token_stride;
  int64_t q_head_stride;
  int64_t k_token_stride;
  int64_t k_head_stride;
  LlkRopeLayout layout;
  LlkIndexType position_type;
  LlkRopeNorm norm;
  float norm_eps;
} RopeParams;

// ---------------------------------------------------------------------------- SwiGLU
// out = silu(gate) * up, silu(g) = g / (1 + exp(-g)), in f32.
typedef enum LlkGateUpLayout {
  LLK_GATE_UP_SEPARATE = 0,    // gate and up are two row-strided tensors (also [gate | up] halves)
  LLK_GATE_UP_INTERLEAVED = 1, // one [tokens, 2d] tensor with gate at even and up at odd columns
} LlkGateUpLayout;

typedef struct SwiGluParams {
  uint64_t gate;  // [tokens, d] (SEPARATE) or [tokens, 2d] interleaved gate/up (INTERLEAVED)
  uint64_t up;    // [tokens, d] (SEPARATE); unused for INTERLEAVED
  uint64_t out;   // [tokens, d]; may be the gate itself (SEPARATE, in place)
  int64_t tokens;
  int64_t d;
  int64_t gate_row_stride;
  int64_t up_row_stride;
  int64_t out_row_stride;
  LlkGateUpLayout layout;
} SwiGluParams;

// ---------------------------------------------------------------------------- Attention
// O = softmax(scale * Q K^T + mask) V per (sequence, q head), flash style; see attention.cu.
typedef enum LlkAttnMask {
  LLK_ATTN_NONE = 0,            // every key of the sequence
  LLK_ATTN_CAUSAL = 1,          // key <= query position (bottom-right aligned)
  LLK_ATTN_CHUNKED_CAUSAL = 2,  // causal, and key in the query's chunk: floor(key / C) == floor(pos / C)
} LlkAttnMask;

typedef enum LlkAttnTemperature {
  LLK_ATTN_NO_TEMPERATURE = 0,
  // Llama 4 NoPE layers: scores of the query at position p are multiplied by
  // log(floor((p + 1) / floor_scale) + 1) * attn_scale + 1
  LLK_ATTN_LLAMA4_TEMPERATURE = 1,
} LlkAttnTemperature;

// Bits a kernel ORs into a workspace's device-side error flag when it finds invalid
// device-resident input (which the host could not validate without waiting for the device).
typedef enum LlkDeviceError {
  LLK_DEVICE_OK = 0,
  LLK_DEVICE_BAD_SEQLENS = 1,  // cu_seqlens not from 0, not non-decreasing, or not ending at the totals
  LLK_DEVICE_BAD_PAGE = 2,     // a block-table entry outside [0, num_pages)
} LlkDeviceError;

typedef struct AttentionParams {
  uint64_t q;             // [total_q, q_heads, head_dim]
  uint64_t k;             // [total_k, kv_heads, head_dim]
  uint64_t v;             // [total_k, kv_heads, head_dim]
  uint64_t out;           // [total_q, q_heads, head_dim]
  uint64_t lse;           // [q_heads, total_q] f32 natural-log sum of exp, or 0
  uint64_t cu_seqlens_q;  // [batch + 1] i32, non-decreasing, from 0 to total_q
  uint64_t cu_seqlens_k;  // [batch + 1] i32, non-decreasing, from 0 to total_k
  uint64_t cu_tiles;      // [batch + 1] i32: first grid.x tile of each sequence; blocks at or past
                          // cu_tiles[batch] exit (the grid may be an upper bound)
  int64_t batch;
  int64_t q_heads;
  int64_t kv_heads;
  int64_t head_dim;
  int64_t total_q;
  int64_t q_token_stride;
  int64_t q_head_stride;
  int64_t k_token_stride;
  int64_t k_head_stride;
  int64_t v_token_stride;
  int64_t v_head_stride;
  int64_t out_token_stride;
  int64_t out_head_stride;
  int64_t pack;           // q heads of one KV group handled by one block (divides q_heads / kv_heads)
  int64_t chunk_size;     // LLK_ATTN_CHUNKED_CAUSAL only
  LlkAttnMask mask;
  LlkAttnTemperature temperature;
  float scale;            // softmax scale, 1/sqrt(head_dim) by default
  float temp_floor_scale; // Llama 4: 8192
  float temp_attn_scale;  // Llama 4: 0.1
} AttentionParams;

// Device-resident sequence offsets: one warp validates cu_seqlens and writes cu_tiles for the
// attention launch that follows; invalid offsets set LLK_DEVICE_BAD_SEQLENS in `error_flag` and
// zero cu_tiles, so that the attention launch writes nothing.
typedef struct AttentionPlanParams {
  uint64_t cu_seqlens_q;  // [batch + 1] i32
  uint64_t cu_seqlens_k;  // [batch + 1] i32
  uint64_t cu_tiles;      // [batch + 1] i32, written
  uint64_t error_flag;    // [1] i32, LlkDeviceError bits OR-ed in
  int64_t batch;
  int64_t total_q;
  int64_t total_k;
  int64_t tokens_per_block;  // query tokens per row block (rows per block / GQA pack)
} AttentionPlanParams;

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
