// emu_checks.cc -- array bounds checks for the emulated kernels.
//
// Host-only (compiled by build.rs next to the kernels/*.cu host sources, never by nvcc). build.rs
// compiles the host code with -fsanitize=bounds (GCC; -fsanitize=array-bounds with clang) and
// -fno-sanitize-recover: every index into an array of known size -- a static __shared__ array, a
// local array, a fixed-size member -- is compared with that size, and an index past it calls the
// handler below with the source location, the array's type and the index. Inside an emulated
// kernel the handler stops the launch with LLK_EMU_INDEX_OUT_OF_BOUNDS (block, thread, file and
// line in the message), like every other emulator check; the GPU would read or write the
// neighbouring shared-memory variable, or another thread's registers, without a word.
//
// Only array indexing is checked: a pointer taken from an array and moved past its end is not
// (dynamic shared memory has its own red zone, global buffers their guard pages).
//
// The handlers have the names and argument layout of the UBSan runtime's (the ABI GCC and clang
// emit calls to), so no sanitizer runtime is linked. They are weak: a program that links the
// real UBSan runtime keeps its reports for its own code, at the cost of these checks reporting
// through it (and continuing) instead of failing the launch.
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "emu_runtime.h"

namespace {

// The UBSan runtime's descriptions of a source location and of a type (compiler-emitted data).
struct SourceLocation {
  const char* file;
  uint32_t line;
  uint32_t column;
};
struct TypeDescriptor {
  uint16_t kind;  // 0: integer
  uint16_t info;  // integers: bit 0 signed, bits 1.. log2(bit width)
  char name[1];   // NUL-terminated, quoted: 'float [258]'
};
struct OutOfBoundsData {
  SourceLocation loc;
  const TypeDescriptor* array_type;
  const TypeDescriptor* index_type;
};

// The index as a printable integer (an index wider than 64 bits arrives by pointer).
void format_index(const TypeDescriptor* t, uintptr_t value, char* out, size_t n) {
  const unsigned bits = t->kind == 0 ? 1u << (t->info >> 1) : 64;
  const bool is_signed = t->kind == 0 && (t->info & 1);
  if (bits > 64) {
    snprintf(out, n, "(a %u-bit index)", bits);
  } else if (is_signed) {
    const unsigned shift = 64 - bits;
    const int64_t v = int64_t(uint64_t(value) << shift) >> shift;
    snprintf(out, n, "%" PRId64, v);
  } else {
    snprintf(out, n, "%" PRIu64, uint64_t(value));
  }
}

[[noreturn]] void out_of_bounds(const OutOfBoundsData* d, uintptr_t index) {
  char idx[48];
  format_index(d->index_type, index, idx, sizeof idx);
  char msg[300];
  snprintf(msg, sizeof msg, "index %s out of bounds for type %s", idx, d->array_type->name);
  llk_emu::Worker* w = llk_emu::tl_worker;
  if (w != nullptr && w->cur != nullptr && w->in_fiber)
    llk_emu::fail(LLK_EMU_INDEX_OUT_OF_BOUNDS, msg, d->loc.file, int(d->loc.line));
  // Outside kernel code (host code of this library): no launch to fail.
  fprintf(stderr, "llama-kernels emulator: %s at %s:%u\n", msg, d->loc.file, d->loc.line);
  abort();
}

}  // namespace

extern "C" {

[[gnu::weak]] void __ubsan_handle_out_of_bounds_abort(OutOfBoundsData* d, uintptr_t index) {
  out_of_bounds(d, index);
}

// The recoverable form, for a build that drops -fno-sanitize-recover: it fails the launch too.
[[gnu::weak]] void __ubsan_handle_out_of_bounds(OutOfBoundsData* d, uintptr_t index) { out_of_bounds(d, index); }

}  // extern "C"
