#pragma once
// Exception types. PyTorch's Python exceptions map onto libtorch's C++ ones so that a libtorch
// user catches them as usual: TypeError -> c10::TypeError, ValueError -> c10::ValueError,
// NotImplementedError -> c10::NotImplementedError, RuntimeError -> c10::Error. Python's
// AssertionError has no libtorch twin, hence hyper_parallel::AssertionError.
#include <c10/util/Exception.h>

#include <string>
#include <vector>

namespace hyper_parallel {

/// Raised where PyTorch raises AssertionError (e.g. PrepareModuleInput layout lengths differ).
class AssertionError : public c10::Error {
  using c10::Error::Error;
};

}  // namespace hyper_parallel

/// Throws `type` (a c10::Error subclass) with a message built from the arguments, like TORCH_CHECK.
#define HP_CHECK_T(type, cond, ...)                                                          \
  do {                                                                                       \
    if (C10_UNLIKELY(!(cond))) {                                                             \
      throw type(::c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, \
                 ::c10::str(__VA_ARGS__));                                                   \
    }                                                                                        \
  } while (false)

namespace hyper_parallel {

/// `items` joined with ", ": the first `most` of them, then "and N more" (a message that names
/// every bad entry of a large model would run to pages).
/// e.g. `join_listed({"'a'", "'b'", "'c'"}, 2)` == "'a', 'b' and 1 more".
inline std::string join_listed(const std::vector<std::string>& items, size_t most = 8) {
  std::string s;
  for (size_t i = 0; i < items.size() && i < most; ++i) s += (i ? ", " : "") + items[i];
  if (items.size() > most) s += " and " + std::to_string(items.size() - most) + " more";
  return s;
}

/// `dim` in [-ndim, ndim) made non-negative (a 0-dim tensor counts as 1-D when `scalar_as_1d`);
/// c10::IndexError "hyper_parallel::<what>: dim <dim> is out of range for <of> with <ndim>
/// dimensions" otherwise (`what`: the function's name below hyper_parallel::).
/// e.g. `wrap_dim(-1, 3, "all_gather")` == 2.
inline int64_t wrap_dim(int64_t dim, int64_t ndim, const char* what, const char* of = "a tensor", bool scalar_as_1d = false) {
  const int64_t n = scalar_as_1d && ndim == 0 ? 1 : ndim;
  HP_CHECK_T(c10::IndexError, dim >= -n && dim < n, "hyper_parallel::", what, ": dim ", dim, " is out of range for ", of, " with ", ndim,
             " dimensions");
  return dim < 0 ? dim + n : dim;
}

}  // namespace hyper_parallel
