#pragma once
// The top of a command-line program: what every rank prints when something goes wrong.
#include <functional>
#include <string>

namespace hyper_parallel {

/// Runs a program's body and returns its exit status. An exception that escapes becomes one line
/// `error: <message>` on stderr and exit status 1, instead of std::terminate's abort and stack
/// dump: libtorch's C++ stack trace is printed only with TORCH_SHOW_CPP_STACKTRACES=1. Under
/// hprun each rank's line carries its rank.
/// e.g. `int main(int argc, char** argv) { return hp::run_program([&] { return run(argc, argv); }); }`
int run_program(const std::function<int()>& body) noexcept;

/// `text` made safe to print as one line: bytes that are not valid UTF-8 (names read from an
/// untrusted file) become \xNN, control characters other than tab become \n, \r or \xNN.
std::string printable(const std::string& text);

}  // namespace hyper_parallel
