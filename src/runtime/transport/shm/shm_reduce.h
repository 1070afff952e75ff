#pragma once
// The shared-memory transport's element loops (internal to runtime/): reductions over the peers'
// buffers and the copy out of a peer's buffer. Compiled apart, at -O3 (see src/CMakeLists.txt).
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>

#include <hyper_parallel/runtime/reduce_op.h>

namespace hyper_parallel {
namespace shm {

/// out[i] = in[0][i] op in[1][i] op ... in rank order, for `n` elements of `t` (`out` may be one
/// of the inputs). bf16/fp16 accumulate in fp32 and are rounded once; max/min let a NaN win.
/// AVG is summed (the caller divides).
void reduce(void* out, const void* const* in, int64_t g, size_t n, c10::ScalarType t, ReduceOp op);

/// memcpy of bytes another core has just written, prefetching ahead.
void copy_from_peer(void* dst, const void* src, size_t n);

}  // namespace shm
}  // namespace hyper_parallel
