#pragma once
// Layouts (internal): the strides libtorch gives an elementwise result, and a local piece laid out
// as its global tensor is. The global strides decide every view-or-copy question (contiguous(),
// reshape(), autograd's version checks) the same way on every rank; the local data must be laid
// out the same way, so that the local views those decisions lead to exist on every rank.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace hyper_parallel {

/// One operand of an elementwise op: its sizes and strides (broadcast against the result's).
struct OperandLayout {
  const std::vector<int64_t>* sizes;
  const std::vector<int64_t>* strides;
};

/// The strides of a new elementwise result of sizes `shape` computed from `operands` (in schema
/// order), as TensorIterator chooses them: the dims ordered by the operands' strides (the first
/// operand that orders a pair decides; broadcast dims order nothing), dense in that order.
/// Exact on every dim of size > 1; a dim of size 1 may get another stride than libtorch's fast
/// paths give it, which no view decision reads.
std::vector<int64_t> elementwise_strides(const std::vector<int64_t>& shape, const std::vector<OperandLayout>& operands);

/// The strides a local piece of sizes `local` has when it is laid out as the global tensor of
/// `shape`/`stride`: the global dims' order, dense. Empty when the global layout is not dense
/// and non-overlapping (a view's), or holds no element: no layout is imposed then.
std::vector<int64_t> local_strides_like(const std::vector<int64_t>& shape, const std::vector<int64_t>& stride,
                                        const std::vector<int64_t>& local);

/// Whether a tensor of `shape`/`stride` is dense and non-overlapping, with an element (what
/// clone() keeps under MemoryFormat::Preserve).
inline bool is_dense(const std::vector<int64_t>& shape, const std::vector<int64_t>& stride) {
  return !local_strides_like(shape, stride, shape).empty();
}

/// Whether `t` has `strides` on every dim of size > 1 (always, when `t` is empty or `strides`
/// is empty).
bool has_layout(const at::Tensor& t, const std::vector<int64_t>& strides);

/// The layout a local result must have: `strides` (empty: any), and whether they are contiguous
/// ones, which a tensor's cached is_contiguous() answers at no cost.
struct LocalLayout {
  std::vector<int64_t> strides;
  bool contiguous = false;
};
/// local_strides_like(...) of a piece of sizes `local`, as a LocalLayout.
LocalLayout local_layout_like(const std::vector<int64_t>& shape, const std::vector<int64_t>& stride,
                              const std::vector<int64_t>& local);
inline bool has_layout(const at::Tensor& t, const LocalLayout& layout) {
  return layout.contiguous ? t.is_contiguous() : has_layout(t, layout.strides);
}

/// A copy of `t` with `strides` (contiguous when `strides` is empty).
at::Tensor copy_with_layout(const at::Tensor& t, const std::vector<int64_t>& strides);

}  // namespace hyper_parallel
