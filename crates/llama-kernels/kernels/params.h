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

// ---------------------------------------------------------------------------- Tensor maps
// A TMA tensor map: how cp.async.bulk.tensor reads a box of a global tensor into shared memory
// (kernels/common/tma.cuh). 128 opaque, 128-byte aligned bytes, as CUtensorMap: on the CUDA
// target the driver's encoding (cuTensorMapEncodeTiled), on the emulated target LlkEmuTensorMap
// (kernels/emu/emu_abi.h). A params struct holds it by value, so that the kernel's
// __grid_constant__ copy is the map the copies read; src/launch/tensor_map.rs makes one.
typedef struct __attribute__((aligned(128))) LlkTensorMap {
  uint64_t opaque[16];
} LlkTensorMap;

// ---------------------------------------------------------------------------- RMSNorm
// y = x * rsqrt(mean(x^2) + eps) * weight, per row; the fused variant first forms
// r = x + residual, stores r into `residual`, and normalizes r.
// Threads per block (launch bounds) of the plain and the fused kernels; the host plans rows over
// at most this many threads (the fused kernel holds twice the loads in registers).
#define LLK_RMS_NORM_MAX_THREADS 1024
#define LLK_RMS_NORM_MAX_THREADS_FUSED 512
// 16-byte vectors each thread keeps in registers between the two passes over its row.
#define LLK_RMS_NORM_CACHE 4

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

// RMSNorm backward (rms_norm.cu): with r = rsqrt(mean(x^2) + eps) recomputed per row,
//   dx = r * (dy * w) - x * r^3 * mean(dy * w * x)   (+ d_residual, the gradient that reached the
//        fused variant's stored sum directly),
//   dw = sum over rows of dy * x * r, in f32: each block of LLK_RMS_NORM_BWD_THREADS threads takes
//        a contiguous chunk of rows (the host derives it from the shape alone), keeps its columns'
//        sums in registers and writes one f32 partial row; a second kernel adds the partial rows
//        in block order. No atomics: the result is the same on every run and schedule.
// A row must fit the registers: hidden <= LLK_RMS_NORM_BWD_THREADS * LLK_RMS_NORM_BWD_CACHE * VEC
// on the 16-byte path (VEC elements per vector), LLK_RMS_NORM_BWD_THREADS *
// LLK_RMS_NORM_BWD_CACHE_SCALAR on the scalar one.
#define LLK_RMS_NORM_BWD_THREADS 512
#define LLK_RMS_NORM_BWD_CACHE 4
#define LLK_RMS_NORM_BWD_CACHE_SCALAR 8
// Most dw partial rows (blocks) a backward launch uses; more rows share a block.
#define LLK_RMS_NORM_BWD_MAX_BLOCKS 1024
// Threads per block of the dw reduction (one column per thread).
#define LLK_RMS_NORM_DW_THREADS 256

typedef struct RmsNormBackwardParams {
  uint64_t dy;          // [rows, hidden] gradient of the output
  uint64_t x;           // [rows, hidden] the forward's normalized input (the fused variant's stored sum)
  uint64_t weight;      // [hidden], contiguous
  uint64_t dx;          // [rows, hidden] output; may be dy itself (in place)
  uint64_t d_residual;  // [rows, hidden] added to dx, or 0
  uint64_t dw_partial;  // [blocks, hidden] f32 partial sums of dw, or 0 (no dw)
  uint64_t dw;          // reduce kernel: [hidden] f32 output
  int64_t rows;
  int64_t hidden;
  int64_t rows_per_block;  // rows of one block's chunk (the last may have fewer)
  int64_t blocks;          // reduce kernel: the partial rows to add
  int64_t dy_row_stride;
  int64_t x_row_stride;
  int64_t dx_row_stride;
  int64_t d_residual_row_stride;
  float eps;
  int32_t accumulate;   // reduce kernel: 1 = dw += the sum, 0 = dw = the sum
} RmsNormBackwardParams;

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

typedef enum LlkRopeDirection {
  LLK_ROPE_FORWARD = 0,   // rotate by +p f (then the qk-norm, if any)
  LLK_ROPE_BACKWARD = 1,  // the gradient: q and k hold dy, rotated by -p f (the transpose); with
                          // the qk-norm, through the norm's backward first, from the saved inputs
} LlkRopeDirection;

// The position domain: |p| <= LLK_ROPE_MAX_POSITION is rotated to within 3e-7 of the exact angle.
// Positions outside it are clamped to +-LLK_ROPE_MAX_POSITION (on both targets, and in the
// reference): the result is still a rotation, at the clamped angle. Llama 4's longest context
// (10M tokens) is inside the domain.
#define LLK_ROPE_MAX_POSITION 16777215
// Threads per block (launch bounds); the host spreads the heads over at most this many.
#define LLK_ROPE_MAX_THREADS 256

typedef struct RopeParams {
  uint64_t q;          // [tokens, q_heads, head_dim], rotated in place
  uint64_t k;          // [tokens, kv_heads, head_dim], rotated in place (0 when kv_heads == 0)
  uint64_t positions;  // [tokens], i32 or i64 (position_type)
  uint64_t inv_freq;   // [rotary_dim / 2] float2 {hi, lo}: f_i = hi + lo, from an f64 table
  uint64_t q_saved;    // LLK_ROPE_BACKWARD with the qk-norm: the forward's input q (else 0)
  uint64_t k_saved;    // ... and its input k (0 when kv_heads == 0)
  int64_t tokens;
  int64_t q_heads;
  int64_t kv_heads;
  int64_t head_dim;
  int64_t rotary_dim;  // even, <= head_dim; dims from rotary_dim on pass through
  int64_t q_token_stride;
  int64_t q_head_stride;
  int64_t k_token_stride;
  int64_t k_head_stride;
  int64_t q_saved_token_stride;
  int64_t q_saved_head_stride;
  int64_t k_saved_token_stride;
  int64_t k_saved_head_stride;
  LlkRopeLayout layout;
  LlkIndexType position_type;
  LlkRopeNorm norm;
  float norm_eps;
  LlkRopeDirection direction;
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

// SwiGLU backward (swiglu.cu): with s = sigmoid(gate),
//   d_up = d_out * gate * s,   d_gate = d_out * up * s * (1 + gate * (1 - s)),
// written in the input's layout (SEPARATE: two [tokens, d] outputs, which may be gate and up
// themselves; INTERLEAVED: one [tokens, 2d] output, which may be the input).
typedef struct SwiGluBackwardParams {
  uint64_t d_out;   // [tokens, d]
  uint64_t gate;    // [tokens, d] (SEPARATE) or [tokens, 2d] interleaved gate/up
  uint64_t up;      // [tokens, d] (SEPARATE); unused for INTERLEAVED
  uint64_t d_gate;  // like gate
  uint64_t d_up;    // like up; unused for INTERLEAVED
  int64_t tokens;
  int64_t d;
  int64_t d_out_row_stride;
  int64_t gate_row_stride;
  int64_t up_row_stride;
  int64_t d_gate_row_stride;
  int64_t d_up_row_stride;
  LlkGateUpLayout layout;
} SwiGluBackwardParams;

// ---------------------------------------------------------------------------- Dropout
// out = x * scale where a seeded Philox mask keeps the element, 0 where it drops it (dropout.cu).
// Element (t, i) drops when word i % 4 of Philox-4x32-10 at counter {i / 4, t, stream lo,
// stream hi} with key {seed lo, seed hi} is below drop_threshold (round(p 2^32)): the mask is a
// pure function of (seed, stream, t, i), the same on every target and for every access width.
// The host folds 1 / (1 - p) and any other factor (LoRA's alpha / r) into scale; accumulate adds
// the product to out (a backward adding its branch's share into an input gradient).
#define LLK_DROPOUT_THREADS 256
typedef struct DropoutParams {
  uint64_t x;    // [tokens, d]
  uint64_t out;  // [tokens, d]; may be x itself (each element is read before it is written)
  int64_t tokens;
  int64_t d;
  int64_t x_row_stride;
  int64_t out_row_stride;
  uint64_t seed;
  uint64_t stream;          // one mask per (seed, stream): a call site's own counter space
  uint32_t drop_threshold;  // an element drops when its word is below this; 0 keeps them all
  float scale;
  int32_t accumulate;  // 1 = out += the product (one rounding of the sum), 0 = out = the product
} DropoutParams;

// ---------------------------------------------------------------------------- Embedding
// out[t] = table[ids[t]], a row gather; see embedding.cu.
#define LLK_EMBEDDING_THREADS 256
#define LLK_EMBEDDING_ROWS 2  // consecutive tokens per thread and grid.y step (loads in flight)
typedef struct EmbeddingParams {
  uint64_t table;       // [vocab, hidden], rows table_row_stride elements apart
  uint64_t ids;         // [tokens] i32
  uint64_t out;         // [tokens, hidden], rows out_row_stride elements apart
  uint64_t error_flag;  // [1] i32: LLK_DEVICE_BAD_TOKEN_ID when an id lies outside [0, vocab)
  int64_t tokens;
  int64_t hidden;
  int64_t vocab;
  int64_t table_row_stride;
  int64_t out_row_stride;
} EmbeddingParams;

// ---------------------------------------------------------------------------- Cross-entropy
// loss_t = logsumexp(logits_t) - logits_t[label_t] over the rows whose label is not ignore_index,
// reduced by mean (over those rows) or sum; d loss / d logits = (softmax - onehot) * scale. See
// cross_entropy.cu.
typedef enum LlkLossReduction {
  LLK_LOSS_MEAN = 0,  // sum / (rows whose label is not ignore_index); NaN when there are none (PyTorch)
  LLK_LOSS_SUM = 1,
} LlkLossReduction;

// Threads of the per-row kernel (one block per row) and of the one-block count and reduce kernels.
#define LLK_CE_THREADS 512
#define LLK_CE_REDUCE_THREADS 1024

typedef struct CrossEntropyParams {
  uint64_t logits;      // [rows, vocab], rows logits_stride elements apart
  uint64_t labels;      // [rows] i32 or i64 (label_type)
  uint64_t grad;        // [rows, vocab] d loss / d logits, rows grad_stride apart; may be logits (in place); 0: none
  uint64_t row_loss;    // [rows] f32: logsumexp - logit[label], 0 for an ignored row, NaN for a bad label
  uint64_t count;       // [1] f32: rows whose label is not ignore_index (written by cross_entropy_count)
  uint64_t loss;        // [1] f32: the reduced loss (written by cross_entropy_reduce)
  uint64_t error_flag;  // [1] i32: LLK_DEVICE_BAD_LABEL
  int64_t rows;         // rows of this launch (a chunk's for the per-row kernel, all for count/reduce)
  int64_t vocab;
  int64_t logits_stride;
  int64_t grad_stride;
  int64_t ignore_index;
  LlkIndexType label_type;
  LlkLossReduction reduction;
  float grad_scale;     // the upstream gradient of the reduced loss (1, or a loss scale)
} CrossEntropyParams;

// The backward of the lookup: d_table[v] (+)= sum of d_out[t] over the tokens t with ids[t] == v,
// in token order (see embedding.cu). Tokens go in chunks of at most LLK_EMBEDDING_BWD_CHUNK: each
// chunk's (id, token) keys are sorted in one block, then rows are summed from the sorted keys.
#define LLK_EMBEDDING_BWD_CHUNK 4096
#define LLK_EMBEDDING_BWD_SORT_THREADS 1024
typedef enum LlkEmbeddingBwdMode {
  LLK_EMBEDDING_BWD_ROWS = 0,      // every table row overwritten: its tokens' sum, or zeros (grid: vocab rows)
  LLK_EMBEDDING_BWD_SEGMENTS = 1,  // only the rows of this chunk's ids, added to (grid: sorted keys)
} LlkEmbeddingBwdMode;

typedef struct EmbeddingBackwardParams {
  uint64_t d_out;       // [tokens, hidden] of the forward's dtype, rows d_out_row_stride apart
  uint64_t ids;         // [tokens] i32: this chunk's ids
  uint64_t keys;        // [LLK_EMBEDDING_BWD_CHUNK] u64 scratch: (id << 32 | token), sorted
  uint64_t d_table;     // [vocab, hidden] f32, rows d_table_row_stride apart
  uint64_t error_flag;  // [1] i32: LLK_DEVICE_BAD_TOKEN_ID (the token adds nothing)
  int64_t tokens;       // of this chunk (<= LLK_EMBEDDING_BWD_CHUNK)
  int64_t hidden;
  int64_t vocab;
  int64_t d_out_row_stride;
  int64_t d_table_row_stride;
  LlkEmbeddingBwdMode mode;
} EmbeddingBackwardParams;

// ---------------------------------------------------------------------------- Optimizer
// AdamW over many tensors in one launch, after a global gradient norm with clipping and a
// non-finite check (and, for f16 training, GradScaler's dynamic loss scale). See optimizer.cu.
typedef enum LlkFloatType {
  LLK_FLOAT_F32 = 0,
  LLK_FLOAT_F16 = 1,
  LLK_FLOAT_BF16 = 2,
} LlkFloatType;

// One tensor of the group.
typedef struct LlkOptimSlot {
  uint64_t param;   // [numel] of param_type, updated in place (rounded from the f32 result)
  uint64_t grad;    // [numel] of grad_type (the loss-scaled gradient)
  uint64_t m;       // [numel] f32 first moment
  uint64_t v;       // [numel] f32 second moment
  uint64_t master;  // [numel] f32 master weights (the update's source and destination), or 0
  int64_t numel;
  LlkFloatType param_type;
  LlkFloatType grad_type;
} LlkOptimSlot;

// One block's share: LLK_OPTIM_CHUNK elements of one slot from `start`.
typedef struct LlkOptimChunk {
  int64_t slot;
  int64_t start;
} LlkOptimChunk;

#define LLK_OPTIM_CHUNK 4096
#define LLK_OPTIM_THREADS 256
#define LLK_OPTIM_REDUCE_THREADS 1024

// The device state one step reads and updates (f32 unless said).
typedef struct LlkOptimState {
  float loss_scale;    // GradScaler's scale (1 when not scaling)
  float grad_norm;     // written: the global L2 norm of the unscaled gradients
  float clip_coef;     // written: min(1, max_norm / (norm + 1e-6)), times 1 / loss_scale
  int32_t found_inf;   // written: 1 when a gradient is inf or NaN (the step is skipped)
  int32_t growth_tracker;  // GradScaler's count of finite steps since the last change
  int32_t pad;
  int64_t step;        // completed steps (the bias corrections' t is step + 1)
} LlkOptimState;

typedef struct OptimizerParams {
  uint64_t slots;      // [n_slots] LlkOptimSlot
  uint64_t chunks;     // [n_chunks] LlkOptimChunk
  uint64_t partials;   // [n_chunks] f64: each chunk's sum of squared gradients
  uint64_t state;      // [1] LlkOptimState
  uint64_t lr_device;  // [1] f32 learning rate on the device (graph-friendly), or 0: use `lr`
  int64_t n_chunks;
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;
  float max_norm;      // <= 0: no clipping
  float backoff;       // GradScaler: scale *= backoff after a non-finite step (0.5)
  float growth;        // ... and *= growth after growth_interval finite steps (2)
  int32_t growth_interval;  // 0: the scale is fixed
} OptimizerParams;

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

// The attention variant prefill and decode share (kernels/common/attention_math.cuh): which keys
// a query sees, the softmax scale and Llama 4's temperature.
typedef struct LlkAttnVariant {
  int64_t chunk_size;     // LLK_ATTN_CHUNKED_CAUSAL only
  LlkAttnMask mask;
  LlkAttnTemperature temperature;
  float scale;            // softmax scale, 1/sqrt(head_dim) by default
  float temp_floor_scale; // Llama 4: 8192
  float temp_attn_scale;  // Llama 4: 0.1
} LlkAttnVariant;

// Bits a kernel ORs into a workspace's device-side error flag when it finds invalid
// device-resident input (which the host could not validate without waiting for the device).
typedef enum LlkDeviceError {
  LLK_DEVICE_OK = 0,
  LLK_DEVICE_BAD_SEQLENS = 1,  // cu_seqlens not from 0, not non-decreasing, or not ending at the totals
  LLK_DEVICE_BAD_PAGE = 2,     // a block-table entry outside [0, num_pages)
  LLK_DEVICE_BAD_EXPERT_ID = 4,  // an expert id outside [0, experts) (MoE align; the slot is dropped)
  LLK_DEVICE_BAD_TOKEN_ID = 8,   // a token id outside [0, vocab) (embedding; its row is zeros)
  LLK_DEVICE_BAD_SAMPLING_PARAMS = 16,  // a row's temperature, top_k, top_p or min_p outside its domain (token -1)
  LLK_DEVICE_NO_CANDIDATE = 32,  // a row whose logits are all -inf or NaN (token -1)
  LLK_DEVICE_BAD_LABEL = 64,     // a label outside [0, vocab) that is not ignore_index (cross-entropy; its loss is NaN)
} LlkDeviceError;

// Where the prefill kernel reads K and V from.
typedef enum LlkKvSource {
  LLK_KV_CONTIGUOUS = 0,  // k, v: [total_k, kv_heads, head_dim] with cu_seqlens_k offsets
  LLK_KV_PAGED = 1,       // k, v: page pools [num_pages, page_size, kv_heads, head_dim], key j of
                          // sequence b at page block_table[b][j / page_size], row j % page_size
} LlkKvSource;

// Prefill geometry both sides plan with: 4 warps, 64-key K/V tiles; a tensor-core block holds
// LLK_ATTN_ROWS_MMA (query token x q head) rows up to head_dim 128 and LLK_ATTN_ROWS_MMA_HD256 at
// head_dim 256; an f32 (SIMT) block LLK_ATTN_ROWS_SIMT.
#define LLK_ATTN_THREADS 128
#define LLK_ATTN_KEYS 64
#define LLK_ATTN_ROWS_MMA 128
#define LLK_ATTN_ROWS_MMA_HD256 64
#define LLK_ATTN_ROWS_SIMT 32
// Keys per K/V tile of the tensor-core kernel's second configuration (head_dim 96 and 128,
// symbols attention_hd<D>_k32_<dtype>): on GPUs whose SM does not hold two 64-key blocks but holds
// two of these (A100: 164 KiB per SM), ops::attention picks it.
#define LLK_ATTN_KEYS_SMALL 32

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
  LlkAttnVariant variant;
  // Paged K/V (kv_source == LLK_KV_PAGED): k and v are the page pools, k_token_stride and
  // k_head_stride (v_...) address a key inside its page, k_page_stride (v_...) the pages.
  LlkKvSource kv_source;
  uint64_t block_table;        // [batch, max_pages] i32, rows block_table_stride apart
  uint64_t error_flag;         // [1] i32, LlkDeviceError bits OR-ed in (bad page ids)
  int64_t block_table_stride;
  int64_t max_pages;           // entries per block-table row
  int64_t page_size;           // keys per page
  int64_t num_pages;           // pages in each pool: ids outside [0, num_pages) are never read
  int64_t k_page_stride;
  int64_t v_page_stride;
} AttentionParams;

// The Hopper prefill kernel (attention_sm90.cu, attention_sm90_hd<D>_<dtype>): a producer
// warpgroup loading Q once and K/V tiles into a ring of stages by TMA, and two consumer
// warpgroups of 64 rows each computing on wgmma. LLK_ATTN_ROWS_MMA rows per block at every head
// dim; K/V tiles of LLK_ATTN_SM90_KEYS keys (LLK_ATTN_SM90_KEYS_HD256 at head_dim 256). Its
// dynamic shared memory (Q, the K and V stages, the mbarriers, alignment) is declared with the
// kernels, from their layout (attention_sm90.cu).
#define LLK_ATTN_SM90_THREADS 384
// The register split (setmaxnreg): the producer warpgroup drops to LLK_ATTN_SM90_REGS_PRODUCER
// registers per thread, the two consumers rise to LLK_ATTN_SM90_REGS_CONSUMER. The raise waits
// until the block's pool holds them, and the pool is what the kernel was launched with:
// LLK_ATTN_SM90_REGS per thread (ptxas's count at __launch_bounds__(384, 1), 65536 / 384 rounded
// down to a multiple of 8). 128 x 24 + 256 x 240 = 384 x 168; if ptxas ever reported fewer, the
// consumers would wait for ever (a static check compares the count ptxas reports).
#define LLK_ATTN_SM90_REGS 168
#define LLK_ATTN_SM90_REGS_PRODUCER 24
#define LLK_ATTN_SM90_REGS_CONSUMER 240
#define LLK_ATTN_SM90_KEYS 128
#define LLK_ATTN_SM90_STAGES 2
#define LLK_ATTN_SM90_PANEL 64
#define LLK_ATTN_SM90_KEYS_HD256 64

// AttentionParams and the TMA maps of the three inputs, dimension 0 innermost (LlkTensorMap).
typedef struct AttentionSm90Params {
  AttentionParams attn;  // contiguous K/V only (kv_source LLK_KV_CONTIGUOUS)
  LlkTensorMap q_map;    // dims (head_dim, q_heads, total_q), box (PANEL, pack, ROWS_MMA / pack)
  LlkTensorMap k_map;    // dims (head_dim, kv_heads, total_k), box (PANEL, 1, keys per tile)
  LlkTensorMap v_map;    // as k_map
} AttentionSm90Params;

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

// ---------------------------------------------------------------------------- Attention backward
// dQ, dK, dV of prefill attention from Q, K, V, the forward's output O and log-sum-exp, and dO
// (FlashAttention-2's algorithm, deterministic); see attention_backward.cu. Two launches: the
// dQ kernel over query-row blocks (it also writes delta = rowsum(dO * O) for the second), then
// the dK/dV kernel over key blocks of one KV head, looping over the group's q heads and the
// query blocks that see its keys. A block has LLK_ATTN_BWD_THREADS threads, LLK_ATTN_BWD_LANES
// lanes per row (LLK_ATTN_BWD_LANES_HD256 at head_dim 256), so 32 (16) rows or keys per block.
#define LLK_ATTN_BWD_THREADS 128
#define LLK_ATTN_BWD_LANES 4
#define LLK_ATTN_BWD_LANES_HD256 8
// The tensor-core kernels (bf16, f16 at head_dim 64 and 128): 4 warps of 16 rows, so
// LLK_ATTN_BWD_MMA_ROWS query rows per dQ block and keys per dK/dV block; the other operand
// streams through shared memory LLK_ATTN_BWD_MMA_TILE keys (dQ) or queries (dK/dV) at a time.
#define LLK_ATTN_BWD_MMA_ROWS 64
#define LLK_ATTN_BWD_MMA_TILE 32

typedef struct AttentionBackwardParams {
  // The forward call: q, k, v (contiguous K/V), out = the forward's output O (read), lse (read,
  // natural log, [q_heads, total_q]), the offsets, cu_tiles (query tiles of the dQ kernel),
  // strides, pack and variant. The dQ kernel writes `delta` and its flag bits to error_flag.
  AttentionParams attn;
  uint64_t d_out;          // [total_q, q_heads, head_dim] dO
  uint64_t dq;             // [total_q, q_heads, head_dim], written
  uint64_t dk;             // [total_k, kv_heads, head_dim], written (summed over the group's q heads)
  uint64_t dv;             // [total_k, kv_heads, head_dim], written
  uint64_t delta;          // [q_heads, total_q] f32 rowsum(dO * O): written by the dQ kernel
  uint64_t cu_key_tiles;   // [batch + 1] i32: first grid.x key block of each sequence (dK/dV kernel)
  int64_t d_out_token_stride;
  int64_t d_out_head_stride;
  int64_t dq_token_stride;
  int64_t dq_head_stride;
  int64_t dk_token_stride;
  int64_t dk_head_stride;
  int64_t dv_token_stride;
  int64_t dv_head_stride;
} AttentionBackwardParams;

// ---------------------------------------------------------------------------- Paged KV cache
// K and V pages are [num_pages, page_size, kv_heads, head_dim] (NHD), each page contiguous, pages
// `page_stride` elements apart. A key's slot is page * page_size + row. fp8 pages hold e4m3fn
// (OCP, +-448, no infinities): stored = fp8(x / scale), read = fp8 * scale, with one scale per
// tensor or per KV head (both are passed per head: a per-tensor scale is repeated).
#define LLK_KV_MAX_SCALES 128     // KV heads an fp8 cache may have (the scales travel in the params)
#define LLK_DECODE_MAX_Q_LEN 8    // query tokens per sequence in one decode call
#define LLK_DECODE_KEYS 64        // keys per K/V tile; split boundaries fall on tile boundaries
#define LLK_DECODE_ROWS_MMA 64    // rows (query token x q head of one KV group) per tensor-core block
#define LLK_DECODE_ROWS_SIMT 32   // rows per f32 (SIMT) block
#define LLK_DECODE_THREADS 128
// K/V stages of the tensor-core decode kernel's second configuration (head_dim 96 and 128 with
// 16-bit pages, symbols paged_decode_hd<D>_s2_<dtype>; the first has 3 there): picked by
// ops::attention where it gives more resident blocks per SM (A100: two instead of one; 8.6/8.9:
// one instead of none).
#define LLK_DECODE_STAGES_SMALL 2
#define LLK_DECODE_MAX_SPLITS 256

// kv_append: writes new tokens' k and v into their slots, converting to the page dtype.
typedef struct KvAppendParams {
  uint64_t k;             // [tokens, kv_heads, head_dim] (any token/head strides)
  uint64_t v;             // [tokens, kv_heads, head_dim]
  uint64_t slot_mapping;  // [tokens] i64: page * page_size + row, or -1 to skip the token
  uint64_t k_pages;       // [num_pages, page_size, kv_heads, head_dim]
  uint64_t v_pages;       // [num_pages, page_size, kv_heads, head_dim]
  uint64_t error_flag;    // [1] i32, LLK_DEVICE_BAD_PAGE when a slot lies outside the pool
  int64_t tokens;
  int64_t kv_heads;
  int64_t head_dim;
  int64_t num_pages;
  int64_t page_size;
  int64_t k_token_stride;
  int64_t k_head_stride;
  int64_t v_token_stride;
  int64_t v_head_stride;
  int64_t k_page_stride;
  int64_t v_page_stride;
  float k_scale[LLK_KV_MAX_SCALES];  // fp8 pages: per KV head (unused otherwise)
  float v_scale[LLK_KV_MAX_SCALES];
} KvAppendParams;

// Split-KV decode over the paged cache; see paged_attention.cu.
typedef struct PagedDecodeParams {
  uint64_t q;             // [batch * q_len, q_heads, head_dim], token b * q_len + i
  uint64_t k_pages;       // [num_pages, page_size, kv_heads, head_dim]
  uint64_t v_pages;       // [num_pages, page_size, kv_heads, head_dim]
  uint64_t block_table;   // [batch, max_pages] i32, rows block_table_stride apart
  uint64_t seq_lens;      // [batch] i32: keys of each sequence, its q_len new tokens included
  uint64_t out;           // [batch * q_len, q_heads, head_dim] (num_splits == 1)
  uint64_t lse;           // [q_heads, batch * q_len] f32 or 0 (num_splits == 1)
  uint64_t partial_out;   // [num_splits, batch * q_len, q_heads, head_dim] f32 (num_splits > 1)
  uint64_t partial_lse;   // [num_splits, batch * q_len, q_heads] f32 (num_splits > 1)
  uint64_t error_flag;    // [1] i32, LlkDeviceError bits
  int64_t batch;
  int64_t q_len;
  int64_t q_heads;
  int64_t kv_heads;
  int64_t head_dim;
  int64_t num_pages;
  int64_t page_size;
  int64_t max_pages;
  int64_t block_table_stride;
  int64_t q_token_stride;
  int64_t q_head_stride;
  int64_t out_token_stride;
  int64_t out_head_stride;
  int64_t k_page_stride;
  int64_t v_page_stride;
  int64_t num_splits;     // grid.x = batch * num_splits
  int64_t row_blocks;     // grid.y = kv_heads * row_blocks
  LlkAttnVariant variant; // mask LLK_ATTN_CAUSAL or LLK_ATTN_CHUNKED_CAUSAL
  float k_scale[LLK_KV_MAX_SCALES];  // per KV head (1 for 16/32-bit pages)
  float v_scale[LLK_KV_MAX_SCALES];
} PagedDecodeParams;

// Merges attention states (o_s, lse_s) computed over disjoint key sets:
//   lse = log sum_s exp(lse_s),  o = sum_s exp(lse_s - lse) o_s.
// Two layouts: the decode splits (`num_states` f32 partials stacked as written by the decode
// kernel), or two states a and b of the output dtype with any strides (merge_attention_states).
typedef struct MergeStatesParams {
  uint64_t v_a;           // split variant: partial_out; else [tokens, heads, head_dim]
  uint64_t lse_a;         // split variant: partial_lse; else f32 at token * lse_token_stride + head * lse_head_stride
  uint64_t v_b;           // pair variant only
  uint64_t lse_b;         // pair variant only
  uint64_t out;           // [tokens, heads, head_dim]
  uint64_t lse_out;       // [heads, tokens] f32 or 0 (split variant); pair variant: like lse_a
  int64_t tokens;
  int64_t heads;
  int64_t head_dim;
  int64_t num_states;     // split variant
  int64_t a_token_stride;
  int64_t a_head_stride;
  int64_t b_token_stride;
  int64_t b_head_stride;
  int64_t out_token_stride;
  int64_t out_head_stride;
  int64_t lse_a_token_stride;
  int64_t lse_a_head_stride;
  int64_t lse_b_token_stride;
  int64_t lse_b_head_stride;
  int64_t lse_out_token_stride;
  int64_t lse_out_head_stride;
} MergeStatesParams;

// Test support: the kernels' own e4m3fn conversions, on every code and on given values.
typedef struct Fp8ConvertParams {
  uint64_t input;    // [n] f32
  uint64_t codes;    // [n] u8: e4m3fn(input) (round to nearest even, saturating, NaN kept)
  uint64_t decoded;  // [5][256] f32, the value of every code: 0 scalar decode; 1, 2 the packed
                     // f16 / bf16 paths of the decode kernel (pairs in order); 3, 4 the same
                     // across pairs (ldmatrix.trans order); packed paths scaled back by 2^8
  int64_t n;
} Fp8ConvertParams;
// ---------------------------------------------------------------------------- MoE
// The feed-forward of a mixture-of-experts layer, in five kernels (see kernels/moe.cu):
//   route -> align (counts, padded offsets, row of every (token, slot), block -> expert map)
//   -> gather (expert-contiguous rows) -> grouped GEMM (gate_up + SwiGLU, then down) -> combine.
// A "slot" is one (token, j) pair, j < top_k, numbered s = token * top_k + j.
#define LLK_MOE_MAX_EXPERTS 512
#define LLK_MOE_MAX_TOP_K 8           // Llama 4 and softmax routing
#define LLK_MOE_MAX_TOP_K_GROUPED 16  // grouped (DeepSeek-V3) routing
#define LLK_MOE_MAX_GROUPS 32         // grouped routing: n_group
#define LLK_MOE_ROUTE_WARPS 4         // tokens per route block (one warp each)
#define LLK_MOE_ROUTE_SMALL_EXPERTS 128  // the `_e128` route kernels take up to this many experts
// Align: a chunk is LLK_MOE_ALIGN_WARPS warps x 32 lanes x `iters` slots, iters a multiple of 4.
#define LLK_MOE_ALIGN_THREADS 256
#define LLK_MOE_ALIGN_WARPS 8
#define LLK_MOE_ALIGN_MIN_CHUNK 1024  // slots per chunk (per align block) at least
#define LLK_MOE_ALIGN_MAX_CHUNKS 128  // the chunk grows so that there are at most this many
// Grouped GEMM, tensor-core path (bf16, f16): blocks of BLOCK_M rows x BLOCK_N weight columns
// (SwiGLU: BLOCK_N / 2 gate and BLOCK_N / 2 up columns -> BLOCK_N / 2 outputs), BLOCK_K deep,
// through a STAGES-deep cp.async pipeline. Prefill: 64 rows x 128 columns; decode: 16 rows x 64
// columns (more blocks over the same weights: decode streams weights and needs every SM).
#define LLK_MOE_GEMM_THREADS 128
#define LLK_MOE_GEMM_BLOCK_M 64
#define LLK_MOE_GEMM_BLOCK_M_DECODE 16
#define LLK_MOE_GEMM_BLOCK_N 128
#define LLK_MOE_GEMM_BLOCK_N_DECODE 64
#define LLK_MOE_GEMM_BLOCK_K 64
#define LLK_MOE_GEMM_STAGES 3
#define LLK_MOE_GEMM_STAGES_DECODE 4
// Grouped GEMM, SIMT path (f32): BLOCK_M rows x 64 weight columns, 256 threads, static shared memory.
#define LLK_MOE_SIMT_THREADS 256
#define LLK_MOE_SIMT_BLOCK_N 64
// Gather and combine: threads per block (each moves 16-byte vectors along a row).
#define LLK_MOE_ROW_THREADS 256

typedef enum LlkMoeRouting {
  LLK_MOE_ROUTE_LLAMA4 = 0,   // top-k of the logits; weight = sigmoid(logit)
  LLK_MOE_ROUTE_SOFTMAX = 1,  // softmax over all experts (f32), top-k; optionally renormalized
  LLK_MOE_ROUTE_GROUPED = 2,  // DeepSeek-V3: sigmoid + bias, best groups, top-k inside them
} LlkMoeRouting;

typedef enum LlkMoeRenormalize {
  LLK_MOE_KEEP_WEIGHTS = 0,
  LLK_MOE_RENORMALIZE = 1,  // divide the k weights by their sum (grouped: sum + 1e-20)
} LlkMoeRenormalize;

typedef struct MoeRouteParams {
  uint64_t logits;   // [tokens, experts] f32/f16/bf16, rows `logits_row_stride` apart
  uint64_t bias;     // [experts] f32 selection bias (grouped: e_score_correction_bias), or 0
  uint64_t ids;      // [tokens, top_k] i32, best first
  uint64_t weights;  // [tokens, top_k] f32
  int64_t tokens;
  int64_t experts;
  int64_t top_k;
  int64_t logits_row_stride;
  int64_t n_group;     // grouped only
  int64_t topk_group;  // grouped only
  LlkMoeRouting mode;
  LlkMoeRenormalize renormalize;  // softmax and grouped
  float routed_scaling_factor;    // grouped: multiplies the final weights
} MoeRouteParams;

// Three kernels share these parameters: moe_align_histogram (grid: chunks), moe_align_scan (one
// block), moe_align_scatter (grid: chunks).
typedef struct MoeAlignParams {
  uint64_t ids;           // [slots] i32 expert ids (the route output, [tokens, top_k] flat)
  uint64_t chunk_counts;  // [chunks, experts] i32 scratch: counts per chunk, then each chunk's base
  uint64_t counts;        // [experts] i32 rows routed to each expert
  uint64_t offsets;       // [experts + 1] i32 start of each expert's padded segment; [experts] = padded total
  uint64_t rows;          // [slots] i32 row of each slot in the padded buffer (-1: invalid id, dropped)
  uint64_t block_expert;  // [max_blocks] i32 expert of each BLOCK_M-row block below the padded total
  uint64_t error_flag;    // [1] i32, LlkDeviceError bits OR-ed in
  int64_t slots;
  int64_t experts;
  int64_t chunks;
  int64_t chunk_slots;  // slots per chunk: a multiple of LLK_MOE_ALIGN_MIN_CHUNK
  int64_t block_m;      // rows per GEMM block: segments are padded to a multiple of it
} MoeAlignParams;

typedef enum LlkMoeScale {
  LLK_MOE_UNSCALED = 0,
  LLK_MOE_SCALED = 1,  // multiply by the slot's routing weight
} LlkMoeScale;

typedef struct MoeGatherParams {
  uint64_t x;        // [tokens, hidden]
  uint64_t rows;     // [tokens * top_k] i32 padded row of each slot (-1: skipped)
  uint64_t weights;  // [tokens * top_k] f32 (LLK_MOE_SCALED only)
  uint64_t out;      // [out_rows, hidden] expert-contiguous rows; padding rows are not written
  int64_t tokens;
  int64_t top_k;
  int64_t hidden;
  int64_t x_row_stride;
  int64_t out_row_stride;
  int64_t out_rows;  // rows of `out`: a slot whose row is not below it is skipped
  LlkMoeScale scale;
} MoeGatherParams;

typedef enum LlkMoeWeightLayout {
  LLK_MOE_WEIGHT_KN = 0,  // W[e] is [k, n], n contiguous: y = x @ W[e] (Hugging Face Llama 4 experts)
  LLK_MOE_WEIGHT_NK = 1,  // W[e] is [n, k], k contiguous: y = x @ W[e]^T (nn.Linear per expert)
} LlkMoeWeightLayout;

typedef enum LlkMoeEpilogue {
  LLK_MOE_EPILOGUE_PLAIN = 0,
  LLK_MOE_EPILOGUE_SWIGLU = 1,  // y = silu(x @ gate) * (x @ up), gate and up both n columns
} LlkMoeEpilogue;

typedef enum LlkMoeSchedule {
  LLK_MOE_GROUPED = 0,  // row blocks from the align output (offsets, counts, block_expert)
  LLK_MOE_DENSE = 1,    // one group: `rows` rows, expert 0 (a dense layer, e.g. the shared expert)
} LlkMoeSchedule;

typedef struct MoeGemmParams {
  uint64_t x;             // [rows, k] activations
  uint64_t w;             // [experts, k, n] (KN) or [experts, n, k] (NK); SwiGLU: the gate columns
  uint64_t w_up;          // SwiGLU: the up columns, with w's strides; else 0
  uint64_t y;             // [rows, n]
  uint64_t offsets;       // [experts + 1] i32 (grouped)
  uint64_t counts;        // [experts] i32 (grouped)
  uint64_t block_expert;  // [blocks] i32 (grouped)
  int64_t rows;           // dense: rows; grouped: rows of x and y (blocks past them are skipped)
  int64_t n;              // output columns (SwiGLU: the intermediate size)
  int64_t k;
  int64_t experts;
  int64_t x_row_stride;
  int64_t y_row_stride;
  int64_t w_expert_stride;  // elements between W[e] and W[e + 1]
  int64_t w_row_stride;     // KN: between rows of k; NK: between rows of n
  LlkMoeWeightLayout layout;
  LlkMoeEpilogue epilogue;
  LlkMoeSchedule schedule;
} MoeGemmParams;

typedef struct MoeCombineParams {
  uint64_t y;         // [y_rows, hidden] expert outputs, expert-contiguous
  uint64_t rows;      // [tokens * top_k] i32 row of each slot (-1: skipped)
  uint64_t weights;   // [tokens * top_k] f32 (LLK_MOE_SCALED only)
  uint64_t shared;    // [tokens, hidden] shared-expert output, or 0
  uint64_t residual;  // [tokens, hidden] or 0; may be `out` itself
  uint64_t out;       // [tokens, hidden]
  int64_t tokens;
  int64_t top_k;
  int64_t hidden;
  int64_t y_rows;
  int64_t y_row_stride;
  int64_t shared_row_stride;
  int64_t residual_row_stride;
  int64_t out_row_stride;
  LlkMoeScale scale;  // SCALED: out = sum w y (softmax routing); UNSCALED: sum y (Llama 4)
} MoeCombineParams;

// ---------------------------------------------------------------------------- Sampling
// One token per row of logits (kernels/sampling.cu): temperature (0 = greedy argmax), top-k,
// top-p, min-p, then an inverse-CDF draw from a Philox-4x32-10 stream keyed by the row's seed at
// counter (offset, 0). Per-row parameters are device arrays (0 when absent: the default below).
// Threads per block (launch bounds; the host plans a multiple of 32 up to this many).
#define LLK_SAMPLE_MAX_THREADS 1024
// Elements each thread takes in index order per step of the draw pass.
#define LLK_SAMPLE_DRAW_PER_THREAD 8
// Weights are summed as fixed-point integers w * 2^LLK_SAMPLE_MASS_BITS (truncated), exactly
// and in any order: w <= 1, so a row of up to 2^23 elements sums below 2^63.
#define LLK_SAMPLE_MASS_BITS 40
// Largest vocabulary (the fixed-point sums above, and i32 token ids).
#define LLK_SAMPLE_MAX_VOCAB 8388608

typedef struct SampleParams {
  uint64_t logits;       // [batch, vocab] f32/f16/bf16, rows `logits_row_stride` apart
  uint64_t temperature;  // [batch] f32; 0 = greedy (required)
  uint64_t top_k;        // [batch] i32; 0 = off (absent: off)
  uint64_t top_p;        // [batch] f32; 1 = off (absent: off)
  uint64_t min_p;        // [batch] f32; 0 = off (absent: off)
  uint64_t seeds;        // [batch] i64 (the bits as u64): Philox key (absent: 0)
  uint64_t offsets;      // [batch] i64 (the bits as u64): Philox counter (absent: 0)
  uint64_t tokens;       // [batch] i32 output: the sampled id, or -1 (see LlkDeviceError)
  uint64_t error_flag;   // i32, LlkDeviceError bits ORed in
  int64_t batch;
  int64_t vocab;
  int64_t logits_row_stride;
} SampleParams;

// ---------------------------------------------------------------------------- Quantized linear
// y = x W^T (or y += x W^T) with W [n, k] kept packed (kernels/qlinear.cu; the layout is
// src/spec/quant.rs, which owns the plane offsets). Every format is read in chunks of
// LLK_QUANT_CHUNK consecutive elements of a row; a chunk's values sit in the `qs` plane
// (4-bit formats: 16 bytes, byte i = element i in the low nibble and element i + 16 in the high
// nibble; Q8_0: 32 signed bytes), Q6_K's top two bits in the `qh` plane (8 bytes per chunk, byte i
// = elements i, i + 8, i + 16, i + 24 in bits 0-1, 2-3, 4-5, 6-7), the 5-bit formats' fifth bits
// in the `qh` plane too (4 bytes per chunk, a little-endian word whose bit i is element i's), and
// each block's header (its scales, as the format stores them) in the `meta` plane.
typedef enum LlkQuantFormat {
  LLK_QUANT_Q8_0 = 0,  // blocks of 32: meta f16 d; w = q * d
  LLK_QUANT_Q4_0 = 1,  // blocks of 32: meta f16 d; w = (q - 8) * d
  LLK_QUANT_Q4_1 = 2,  // blocks of 32: meta f16 d, f16 m; w = q * d + m
  LLK_QUANT_Q4_K = 3,  // super-blocks of 256: meta f16 d, f16 dmin, 12 bytes of 6-bit scales/mins
  LLK_QUANT_Q6_K = 4,  // super-blocks of 256: meta 16 i8 scales, f16 d; w = (d * sc) * (q - 32)
  LLK_QUANT_NF4 = 5,   // blocks of `block` (a power of two >= 32): meta f32 absmax; w = code[q] * absmax
  LLK_QUANT_Q5_0 = 6,  // blocks of 32: meta f16 d; w = (q - 16) * d, q's fifth bit in qh
  LLK_QUANT_Q5_1 = 7,  // blocks of 32: meta f16 d, f16 m; w = q * d + m, q's fifth bit in qh
  LLK_QUANT_Q5_K = 8,  // super-blocks of 256: meta as Q4_K; w = (d * sc) * q - (dmin * mn), fifth bit in qh
} LlkQuantFormat;

#define LLK_QUANT_CHUNK 32
// Warps per block of the GEMV (one warp per output column), and the most activation rows it
// takes; more rows go through the dequantize kernel and a dense GEMM.
#define LLK_QGEMV_WARPS 4
#define LLK_QGEMV_MAX_ROWS 16
// The most warps that share one output feature of the GEMV (split-K inside a block: warp w of a
// split of s takes chunks w % s, w % s + s, ... of every lane's stride; the partial sums are added
// in warp order). The host picks the split from the shape alone (src/ops/qlinear.rs), so a
// result does not depend on the device.
#define LLK_QGEMV_MAX_SPLIT 4
// Chunks of packed loads each GEMV lane keeps in flight (its software pipeline: the next chunk is
// loaded before the current one is decoded). The static performance report's latency term uses it.
#define LLK_QGEMV_DEPTH 2
// Threads per block of the dequantize kernel (one chunk per thread).
#define LLK_QDEQUANT_THREADS 256
// The tensor-core GEMM of prefill (bf16, f16): blocks of LLK_QGEMM_BLOCK_M activation rows x
// LLK_QGEMM_BLOCK_N weight rows, LLK_QGEMM_BLOCK_K deep per step; the activations in a
// LLK_QGEMM_STAGES-stage cp.async ring, the weights dequantized into two buffers; all 16-bit.
#define LLK_QGEMM_THREADS 128
#define LLK_QGEMM_BLOCK_M 64
#define LLK_QGEMM_BLOCK_N 128
#define LLK_QGEMM_BLOCK_K 64
#define LLK_QGEMM_STAGES 3
// Split-K of the GEMM (grid.z: each split takes a contiguous range of 64-deep steps and writes its
// f32 partial tile to `partial`; the reduce kernel adds the splits in order): at most this many.
#define LLK_QGEMM_MAX_SPLITS 16
// Threads per block of the split-K reduce kernel (one output element per thread).
#define LLK_QREDUCE_THREADS 256
// The tensor-core GEMV of decode (bf16, f16; Q4_0, Q4_1, Q4_K and Q6_K): one 16-row tile of W per
// block of LLK_QMMV_WARPS warps, which split its k range in groups of LLK_QMMV_GROUP chunks;
// at most LLK_QMMV_MAX_ROWS activation rows (one mma n-tile). Split-K over grid.z as the GEMM's.
#define LLK_QMMV_WARPS 4
#define LLK_QMMV_GROUP 4
#define LLK_QMMV_MAX_ROWS 8
// Groups of packed loads each warp of it keeps in flight (the next group is loaded before the
// current one is exchanged and multiplied). The static performance report's latency term uses it.
#define LLK_QMMV_DEPTH 2

typedef struct QLinearParams {
  uint64_t x;          // [rows, k] activations, rows x_row_stride elements apart, 16-byte aligned (GEMV, GEMM)
  uint64_t y;          // [rows, n] output (GEMV, GEMM) or [n_band, k] dense weights (dequantize)
  uint64_t qs;         // the packed planes of W (see src/spec/quant.rs); qh is 0 unless Q6_K
  uint64_t qh;
  uint64_t meta;
  int64_t rows;        // activation rows (GEMV: 1..=LLK_QGEMV_MAX_ROWS; GEMM: any)
  int64_t n;           // output features: rows of W (dequantize: the band's rows)
  int64_t k;           // input features, a multiple of the format's block
  int64_t block;       // the format's block (elements per meta entry)
  int64_t row_first;   // dequantize: the band's first row of W
  int64_t x_row_stride;
  int64_t y_row_stride;
  int64_t qs_row_bytes;
  int64_t qh_row_bytes;
  int64_t meta_row_bytes;
  float code[16];      // NF4's code book (bitsandbytes' NF4 table or the checkpoint's quant_map)
  LlkQuantFormat format;
  int32_t accumulate;  // GEMV, GEMM: 1 = y += x W^T (one rounding of the sum), 0 = y = x W^T
  int32_t split;       // GEMV: warps per output feature (1, 2 or 4 = LLK_QGEMV_MAX_SPLIT)
  int32_t block_shift; // log2(block): every format's block is a power of two
  uint64_t partial;    // GEMM with k_splits > 1, reduce: [k_splits][rows][n] f32 partial products
  int32_t k_splits;    // GEMM, reduce: 1 = the GEMM writes y itself; more = grid.z splits of k
  int32_t k_steps_per_split;  // per split (the last may take fewer): GEMM 64-deep steps, tensor-core GEMV groups
} QLinearParams;

// The token embedding lookup from a packed table (embedding.cu, qembedding_<format>_<dtype>):
// out[t] = the dequantized row ids[t] of W, rounded to the dtype; an id outside [0, vocab) gives
// a row of zeros and raises LLK_DEVICE_BAD_TOKEN_ID, as the dense lookup does.
typedef struct QEmbeddingParams {
  QLinearParams w;       // the table's planes: n = vocab, k = hidden (the other fields unused)
  uint64_t ids;          // [tokens] i32
  uint64_t out;          // [tokens, hidden], rows out_row_stride elements apart
  uint64_t error_flag;   // [1] i32
  int64_t tokens;
  int64_t out_row_stride;
} QEmbeddingParams;

// ---------------------------------------------------------------------------- Self-tests
// Small kernels that exercise the emulation runtime (and, on a GPU, check that the emulated PTX
// wrappers match the hardware). See kernels/selftest.cu.
typedef enum LlkSelftestVariant {
  LLK_SELFTEST_CORRECT = 0,      // the kernel as it should be written
  LLK_SELFTEST_PLANTED_BUG = 1,  // with the bug the test must catch (missing barrier, ...)
} LlkSelftestVariant;

// selftest_wgmma's input, in 32-bit words: a header (word 0 the case, then the operands' swizzle,
// leading and stride byte offsets, accumulate, image bytes, A and B offsets, issues, planted bug:
// see kernels/selftest.cu), the accumulators at LLK_WGMMA_TEST_C ([128][N/2] f32), the A
// fragments at LLK_WGMMA_TEST_A ([128][4]), the shared-memory image at LLK_WGMMA_TEST_IMAGE (up to
// LLK_WGMMA_TEST_SMEM bytes, its dynamic shared memory). Output: [128][N/2] f32 accumulators.
#define LLK_WGMMA_TEST_C 16
#define LLK_WGMMA_TEST_A 16400
#define LLK_WGMMA_TEST_IMAGE 16912
#define LLK_WGMMA_TEST_SMEM 49152

// selftest_mbarrier's input, in 32-bit words: a header (tiles, stages, copies per tile, planted
// bug: see kernels/selftest.cu), then tiles x LLK_MBARRIER_TEST_TILE f32 from word
// LLK_MBARRIER_TEST_DATA. One block: a producer warp and LLK_MBARRIER_TEST_TILE consumer threads;
// dynamic shared memory LLK_MBARRIER_TEST_SMEM bytes (barriers, then the stages). Output:
// [tiles][LLK_MBARRIER_TEST_TILE] f32, out[i][c] = 2 tile[i][c] + i.
#define LLK_MBARRIER_TEST_DATA 16
#define LLK_MBARRIER_TEST_TILE 64
#define LLK_MBARRIER_TEST_MAX_TILES 16
#define LLK_MBARRIER_TEST_MAX_STAGES 4
#define LLK_MBARRIER_TEST_STAGES_AT 128
#define LLK_MBARRIER_TEST_SMEM 2048

// selftest_warp_specialize's input, in 32-bit words: a header (rounds, planted bug: see
// kernels/selftest.cu), then rounds x 128 f32 from word LLK_WS_TEST_DATA. One block of two
// warpgroups (LLK_WS_TEST_BLOCK threads) handing a 128-float slot of dynamic shared memory back
// and forth on named barriers. Output: [rounds][128] f32, out[r][i] = 3 data[r][i] + r, then
// the lane each of the 8 warps elected.
#define LLK_WS_TEST_DATA 16
#define LLK_WS_TEST_MAX_ROUNDS 8
#define LLK_WS_TEST_BLOCK 256
#define LLK_WS_TEST_SMEM 512

// selftest_tma's input, in 32-bit words: a header (the map's rank, the box coordinates at words
// 1-5 as i32, the destination's offset in dynamic shared memory in bytes, the bytes expected,
// planted bug: see kernels/selftest.cu); its source is the tensor map in the params. One block
// of LLK_TMA_TEST_BLOCK threads, LLK_TMA_TEST_SMEM bytes of dynamic shared memory (the barrier
// in its last 8). Output: the dynamic shared memory after the copy, [LLK_TMA_TEST_SMEM / 4]
// words, as the copy left it (the destination) or poisoned (the rest).
#define LLK_TMA_TEST_HEADER 16
#define LLK_TMA_TEST_BLOCK 64
#define LLK_TMA_TEST_SMEM 32768

// selftest_declared_smem: one block of LLK_DECLARED_SMEM_TEST_BLOCK threads reverses `in` through
// dynamic shared memory of exactly the LLK_DECLARED_SMEM_TEST_BYTES its row declares (one float
// per thread); the planted bug also writes the float just past the declaration.
#define LLK_DECLARED_SMEM_TEST_BLOCK 256
#define LLK_DECLARED_SMEM_TEST_BYTES (LLK_DECLARED_SMEM_TEST_BLOCK * 4)

typedef struct SelftestParams {
  uint64_t input;  // [n] f32 (kernel-specific meaning)
  uint64_t out;    // [n] f32 or i32 (kernel-specific meaning)
  int64_t n;
  LlkSelftestVariant variant;
  LlkTensorMap tensor_map;  // selftest_tma: the source of its copy (all zero for the others)
} SelftestParams;

#ifdef __cplusplus
}
#endif
