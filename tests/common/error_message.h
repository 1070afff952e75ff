#pragma once
// The message of the c10::Error a call raises ("no error" when it returns), for tests that
// compare what fails and how it says so.
#include <c10/util/Exception.h>

#include <string>

namespace hp_test {

template <class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "no error";
}

}  // namespace hp_test
