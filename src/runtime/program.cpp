// run_program: exceptions at the top of a program become one printable line and status 1.
#include <hyper_parallel/runtime/program.h>

#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

namespace hyper_parallel {

namespace {

// The length of the valid UTF-8 sequence at s[i], or 0 (RFC 3629: no overlongs, no surrogates,
// nothing above U+10FFFF).
size_t utf8_sequence(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  return n;
}

void hex_byte(std::string& out, unsigned char c) {
  static const char* digits = "0123456789abcdef";
  out += "\\x";
  out += digits[c >> 4];
  out += digits[c & 15];
}

}  // namespace

std::string printable(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const size_t n = utf8_sequence(text, i);
    if (n == 0) {
      hex_byte(out, c);
      ++i;
    } else if (n == 1 && (c < 0x20 || c == 0x7F) && c != '\t') {
      if (c == '\n') out += "\\n";
      else if (c == '\r') out += "\\r";
      else hex_byte(out, c);
      ++i;
    } else {
      out.append(text, i, n);
      i += n;
    }
  }
  return out;
}

int run_program(const std::function<int()>& body) noexcept {
  std::string message;
  try {
    return body();
  } catch (const c10::Error& e) {
    const char* show = std::getenv("TORCH_SHOW_CPP_STACKTRACES");
    if (show != nullptr && std::strcmp(show, "1") == 0) {
      // The trace is many lines: printed as it is, after the one-line message.
      std::fprintf(stderr, "error: %s\n%s\n", printable(e.what_without_backtrace()).c_str(), e.what());
      std::fflush(stderr);
      return 1;
    }
    message = e.what_without_backtrace();
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
    message = "an exception of unknown type";
  }
  try {
    std::fprintf(stderr, "error: %s\n", printable(message).c_str());
  } catch (...) {
    std::fputs("error: (the message could not be printed)\n", stderr);
  }
  std::fflush(stderr);
  return 1;
}

}  // namespace hyper_parallel
