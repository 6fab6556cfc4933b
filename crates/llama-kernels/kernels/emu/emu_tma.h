// emu_tma.h -- sm_90's tensor copies (TMA) in the emulation runtime: cp.async.bulk.tensor moves a
// box of a global tensor, described by a tensor map, into shared memory and completes its bytes
// on an mbarrier.
//
// Included by emu_runtime.h after emu_async.h, whose mbarriers, completion timing and async-proxy
// view it shares; kernel code reaches it through kernels/common/tma.cuh. The map is the
// emulator's own encoding of cuTensorMapEncodeTiled's fields (LlkEmuTensorMap, emu_abi.h). What
// is modelled, from the PTX ISA ("cp.async.bulk.tensor", "Tensor Memory Access": tensor maps,
// the bounding box, swizzling) and the driver API's rules for tiled tensor maps:
//
//   * Tile mode, rank 1 to 5, dimension 0 innermost. A copy at the signed coordinates
//     (c_0, ..., c_{r-1}) moves the box of box[0] x ... x box[r-1] elements whose element
//     (i_0, ..., i_{r-1}) is the tensor's element (c_0 + i_0, ...), at byte
//     global_address + (c_0 + i_0) esize + sum_{d >= 1} (c_d + i_d) strides[d - 1].
//   * Shared memory receives the box densely: element i at byte
//     ((((i_4 b_3 + i_3) b_2 + i_2) b_1 + i_1) b_0 + i_0) esize from the destination, then
//     swizzled on the absolute shared address with the map's span (emu_async.h's swizzled(), the
//     pattern wgmma's descriptors read).
//   * An element with any coordinate outside [0, dims) is not read: it lands as 0, or as the
//     0xff.. NaN pattern for a map with oob_nan. The box is partly or wholly outside the tensor
//     as the coordinates say; either way the copy completes the whole box's bytes on the barrier.
//   * Global memory is read at the issue (so a fault names the issuing line); the bytes land as
//     those of a 1-D bulk copy: at the block's next stall with LLK_EMU_CP_ASYNC_AT_WAIT (the
//     destination holds the NaN pattern until then), at the issue with AT_ISSUE.
//   * Checked, each a named error: a map not 64-byte aligned or without the emulator's tag (a
//     CUDA map, zeros, garbage), its fields against the encoder's rules (rank 1-5; element size
//     1, 2, 4 or 8; dims 1..2^32; strides multiples of 16 below 2^40; box 1..256 per dimension
//     with box[0] esize a multiple of 16 and at most the swizzle span; a 16-byte aligned global
//     address), the instruction's rank against the map's, a destination not 128-byte aligned or
//     past dynamic shared memory, and the barrier as for 1-D copies.
//   * Reported as unsupported rather than guessed: a swizzled map whose inner box extent
//     (box[0] esize) is narrower than the span (the hardware accepts it; its layout is not
//     modelled).
//
// Not modelled: im2col mode, element strides other than 1, interleaved layouts, multicast and
// cluster destinations, L2 promotion and cache hints, prefetch.tensormap, copies from shared to
// global (cp.async.bulk.tensor.global.shared) and cp.reduce.async.bulk.tensor, and maps changed
// on the device (tensormap.replace, fence.proxy.tensormap).
#pragma once

namespace llk_emu {

// What is wrong with an emulated tensor map, or null.
inline const char* tensor_map_problem(const LlkEmuTensorMap& m) {
  if (m.tag != LLK_EMU_TENSOR_MAP_TAG)
    return "cp.async.bulk.tensor with a tensor map the emulator did not encode (no tag: zeros, a CUDA "
           "encoding or garbage)";
  if (m.rank < 1 || m.rank > 5) return "tensor map rank outside 1..5";
  if (m.element_bytes != 1 && m.element_bytes != 2 && m.element_bytes != 4 && m.element_bytes != 8)
    return "tensor map element size not 1, 2, 4 or 8 bytes";
  if (m.global_address % 16 != 0) return "tensor map global address not 16-byte aligned";
  if (m.swizzle_bytes != 0 && m.swizzle_bytes != 32 && m.swizzle_bytes != 64 && m.swizzle_bytes != 128)
    return "tensor map swizzle span not 0, 32, 64 or 128 bytes";
  for (uint32_t d = 0; d < m.rank; ++d) {
    if (m.dims[d] < 1 || m.dims[d] > (uint64_t(1) << 32)) return "tensor map dimension outside 1..2^32";
    if (m.box[d] < 1 || m.box[d] > 256) return "tensor map box extent outside 1..256";
    if (d + 1 < m.rank && (m.strides[d] % 16 != 0 || m.strides[d] >= (uint64_t(1) << 40)))
      return "tensor map stride not a multiple of 16 bytes below 2^40";
  }
  const uint64_t inner = uint64_t(m.box[0]) * m.element_bytes;
  if (inner % 16 != 0) return "tensor map inner box extent (box[0] x element size) not a multiple of 16 bytes";
  if (m.swizzle_bytes != 0 && inner > m.swizzle_bytes)
    return "tensor map inner box extent (box[0] x element size) wider than its swizzle span";
  return nullptr;
}

// cp.async.bulk.tensor.<rank>d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.
inline void tensor_copy_to_shared(void* dst, const void* map, int rank, const int32_t* coords, void* bar,
                                  const char* file, int line) {
  if (reinterpret_cast<uintptr_t>(map) & 63u) fail(LLK_EMU_MISALIGNED, "tensor map not 64-byte aligned", file, line);
  LlkEmuTensorMap m;
  memcpy(&m, map, sizeof m);
  if (const char* what = tensor_map_problem(m)) fail(LLK_EMU_KERNEL_TRAP, what, file, line);
  if (int(m.rank) != rank) {
    char msg[160];
    snprintf(msg, sizeof msg, "cp.async.bulk.tensor.%dd with a tensor map of rank %u", rank, m.rank);
    fail(LLK_EMU_KERNEL_TRAP, msg, file, line);
  }
  const uint32_t esize = m.element_bytes, row = m.box[0] * esize;
  if (m.swizzle_bytes != 0 && row != m.swizzle_bytes)
    fail(LLK_EMU_UNSUPPORTED,
         "a swizzled tensor copy whose inner box extent is narrower than the swizzle span (not modelled)", file, line);
  if (reinterpret_cast<uintptr_t>(dst) & 127u)
    fail(LLK_EMU_MISALIGNED, "cp.async.bulk.tensor destination not 128-byte aligned", file, line);
  const uint32_t addr = shared_address(dst);
  uint64_t rows = 1;
  for (uint32_t d = 1; d < m.rank; ++d) rows *= m.box[d];
  const uint64_t bytes = rows * row;
  if (addr + bytes > tl_async.dyn_smem_bytes)
    fail(LLK_EMU_MEMORY_FAULT, "cp.async.bulk.tensor destination past the launch's dynamic shared memory", file, line);
  mbarrier_of(bar, file, line);

  // Gather the box row by row (a row: box[0] elements along dimension 0), in landing order.
  BulkCopy c{dst, nullptr, uint32_t(bytes), bar, file, line, std::vector<unsigned char>(size_t(bytes))};
  const unsigned char* base = reinterpret_cast<const unsigned char*>(uintptr_t(m.global_address));
  const unsigned char fill = m.oob_nan ? 0xff : 0x00;
  for (uint64_t r = 0; r < rows; ++r) {
    // The row's coordinates in dimensions 1..rank-1, and whether they are inside the tensor.
    int64_t offset = 0;
    bool inside = true;
    uint64_t rest = r;
    for (uint32_t d = 1; d < m.rank; ++d) {
      const int64_t x = int64_t(coords[d]) + int64_t(rest % m.box[d]);
      rest /= m.box[d];
      inside = inside && x >= 0 && x < int64_t(m.dims[d]);
      offset += x * int64_t(m.strides[d - 1]);
    }
    for (uint32_t i = 0; i < m.box[0]; ++i) {
      const int64_t x = int64_t(coords[0]) + i;
      const uint32_t at = swizzled(addr + uint32_t(r * row) + i * esize, m.swizzle_bytes) - addr;
      if (inside && x >= 0 && x < int64_t(m.dims[0]))
        memcpy(c.staged.data() + at, base + offset + x * esize, esize);
      else
        memset(c.staged.data() + at, fill, esize);
    }
  }
  bulk_copy_issue(std::move(c));
}

}  // namespace llk_emu
