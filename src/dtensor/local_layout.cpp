#include "local_layout.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>

namespace hyper_parallel {

std::vector<int64_t> elementwise_strides(const std::vector<int64_t>& shape, const std::vector<OperandLayout>& operands) {
  const size_t nd = shape.size();
  std::vector<int64_t> out(nd, 1);
  if (nd == 0) return out;
  // Each operand's strides against the result's dims: 0 where it is broadcast.
  std::vector<std::vector<int64_t>> st;
  st.reserve(operands.size());
  for (const auto& op : operands) {
    const auto& s = *op.sizes;
    if (s.empty()) continue;  // a 0-dim operand orders nothing
    std::vector<int64_t> b(nd, 0);
    const size_t off = nd - s.size();
    for (size_t k = 0; k < s.size(); ++k) b[off + k] = s[k] == 1 && shape[off + k] != 1 ? 0 : (*op.strides)[k];
    st.push_back(std::move(b));
  }
  // perm[0] is the innermost dim; start from the reversed order and insertion-sort with
  // comparisons that may be undecided, as TensorIterator::reorder_dimensions does.
  std::vector<size_t> perm(nd);
  std::iota(perm.rbegin(), perm.rend(), 0);
  auto should_swap = [&](size_t d0, size_t d1) {
    for (const auto& s : st) {
      const int64_t a = s[d0], b = s[d1];
      if (a == 0 || b == 0) continue;
      if (a < b) return -1;
      if (a > b) return 1;
      if (shape[d0] > shape[d1]) return 1;
    }
    return 0;
  };
  if (nd > 1) {
    for (size_t i = 1; i < nd; ++i) {
      size_t d1 = i;
      for (size_t d0 = i; d0-- > 0;) {
        const int c = should_swap(perm[d0], perm[d1]);
        if (c > 0) {
          std::swap(perm[d0], perm[d1]);
          d1 = d0;
        } else if (c < 0) {
          break;
        }
      }
    }
  }
  bool inverted = true;
  for (size_t j = 0; j < nd; ++j) inverted = inverted && perm[j] == nd - j - 1;
  if (inverted) {  // contiguous, as an empty tensor of these sizes gets it
    int64_t next = 1;
    for (size_t k = nd; k-- > 0;) {
      out[k] = next;
      next *= std::max<int64_t>(shape[k], 1);
    }
    return out;
  }
  int64_t next = 1;
  for (size_t j = 0; j < nd; ++j) {
    out[perm[j]] = next;
    next *= shape[perm[j]];
  }
  return out;
}

std::vector<int64_t> local_strides_like(const std::vector<int64_t>& shape, const std::vector<int64_t>& stride,
                                        const std::vector<int64_t>& local) {
  const size_t nd = shape.size();
  for (int64_t s : shape)
    if (s == 0) return {};
  // Dense and non-overlapping: the dims of size > 1, innermost first, multiply up exactly.
  std::vector<size_t> big;
  for (size_t k = 0; k < nd; ++k)
    if (shape[k] > 1) big.push_back(k);
  std::stable_sort(big.begin(), big.end(), [&](size_t a, size_t b) { return stride[a] < stride[b]; });
  int64_t expect = 1;
  for (size_t k : big) {
    if (stride[k] != expect) return {};
    expect *= shape[k];
  }
  // Dense in the global order of the dims of size > 1 (innermost first in `big`); the dims of
  // size 1 (whose stride nothing reads) innermost.
  std::vector<int64_t> out(nd, 1);
  int64_t next = 1;
  for (size_t k : big) {
    out[k] = next;
    next *= std::max<int64_t>(local[k], 1);
  }
  return out;
}

LocalLayout local_layout_like(const std::vector<int64_t>& shape, const std::vector<int64_t>& stride,
                              const std::vector<int64_t>& local) {
  LocalLayout l;
  l.strides = local_strides_like(shape, stride, local);
  if (l.strides.empty()) return l;
  // Contiguous on every dim of size > 1 is what is_contiguous() checks.
  l.contiguous = true;
  int64_t expect = 1;
  for (size_t k = local.size(); k-- > 0;) {
    if (local[k] == 1) continue;
    l.contiguous = l.contiguous && l.strides[k] == expect;
    expect *= local[k];
  }
  return l;
}

bool has_layout(const at::Tensor& t, const std::vector<int64_t>& strides) {
  if (strides.empty()) return true;
  const auto sizes = t.sizes();
  const auto st = t.strides();
  bool empty = false;
  for (int64_t s : sizes) empty = empty || s == 0;
  if (empty) return true;
  for (size_t k = 0; k < strides.size(); ++k)
    if (sizes[k] > 1 && st[k] != strides[k]) return false;
  return true;
}

at::Tensor copy_with_layout(const at::Tensor& t, const std::vector<int64_t>& strides) {
  if (strides.empty()) return t.clone(at::MemoryFormat::Contiguous);
  at::Tensor out = at::empty_strided(t.sizes(), strides, t.options());
  out.copy_(t);
  return out;
}

}  // namespace hyper_parallel
