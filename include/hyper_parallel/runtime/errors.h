#pragma once
// Exception types. The seed's Python exceptions map onto libtorch's C++ ones so that a libtorch
// user catches them as usual: TypeError -> c10::TypeError, ValueError -> c10::ValueError,
// NotImplementedError -> c10::NotImplementedError, RuntimeError -> c10::Error. Python's
// AssertionError has no libtorch twin, hence hyper_parallel::AssertionError.
#include <c10/util/Exception.h>

namespace hyper_parallel {

/// Raised where the seed raises AssertionError (e.g. PrepareModuleInput layout lengths differ).
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
