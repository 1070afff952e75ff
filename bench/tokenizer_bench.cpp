// Our tokenizer's speed on one tokenizer.json and one text, single-threaded: one JSON line with
// the vocabulary's load time, encode MB/s on the whole text as one string, encode MB/s on its
// non-empty lines one by one, and a checksum of the ids (bench/tokenizer_vs_hf.py compares all
// of it with the tokenizers library in the same run).
//   hp_tokenizer_bench TOKENIZER_JSON TEXT_FILE [REPEATS]
#include <hyper_parallel/models/tokenizer.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>


namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: hp_tokenizer_bench TOKENIZER_JSON TEXT_FILE [REPEATS]\n");
    return 2;
  }
  try {
    const int repeats = argc > 3 ? std::max(1, std::atoi(argv[3])) : 3;
    std::ifstream in(argv[2], std::ios::binary);
    if (!in) throw std::runtime_error(std::string("cannot read ") + argv[2]);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    std::vector<std::string> lines;
    size_t short_bytes = 0;
    for (size_t at = 0; at < text.size();) {
      size_t nl = text.find('\n', at);
      if (nl == std::string::npos) nl = text.size();
      if (nl > at) {
        lines.push_back(text.substr(at, nl - at));
        short_bytes += nl - at;
      }
      at = nl + 1;
    }
    // Load: the best of `repeats` fresh loads (the file in the page cache after the first).
    double load = 1e30;
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      auto tok = hyper_parallel::models::Tokenizer::from_file(argv[1]);
      load = std::min(load, seconds_since(t0));
    }
    const auto tok = hyper_parallel::models::Tokenizer::from_file(argv[1]);
    double long_s = 1e30, short_s = 1e30;
    size_t tokens = 0, short_tokens = 0;
    int64_t checksum = 0;
    for (int r = 0; r < repeats; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      const auto ids = tok.encode(text);
      long_s = std::min(long_s, seconds_since(t0));
      tokens = ids.size();
      checksum = 0;
      for (size_t i = 0; i < ids.size(); ++i) checksum = checksum * 31 + ids[i];
      t0 = std::chrono::steady_clock::now();
      size_t n = 0;
      for (const auto& l : lines) n += tok.encode(l).size();
      short_s = std::min(short_s, seconds_since(t0));
      short_tokens = n;
    }
    std::printf(
        "{\"load_s\": %.4f, \"long_mb_s\": %.3f, \"short_mb_s\": %.3f, \"bytes\": %zu, \"tokens\": %zu, \"lines\": %zu, "
        "\"short_tokens\": %zu, \"checksum\": %lld}\n",
        load, text.size() / long_s / 1e6, short_bytes / short_s / 1e6, text.size(), tokens, lines.size(), short_tokens,
        static_cast<long long>(checksum));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hp_tokenizer_bench: %s\n", e.what());
    return 1;
  }
}
