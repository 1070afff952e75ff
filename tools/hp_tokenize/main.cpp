// Tokenizes a corpus into a token file for training (hyper_parallel/data/token_file.h):
//   build/tools/hp_tokenize/hp_tokenize --tokenizer MODEL_DIR --output corpus.tokens a.txt b.jsonl ...
// A text file is one document; a .jsonl file holds one JSON object per line whose --field (default
// "text") is a document. Every document ends with EOS (--eos, default <|endoftext|>). Documents
// are tokenized on --threads threads (default: all cores) and written in input order, so the file
// does not depend on the thread count. A progress line goes to stderr on long inputs.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <hyper_parallel/data/token_file.h>
#include <hyper_parallel/models/tokenizer.h>
#include <hyper_parallel/runtime/program.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace hp = hyper_parallel;

namespace {

struct Args {
  std::string tokenizer, output, field = "text", eos = "<|endoftext|>";
  int64_t threads = 0;
  std::vector<std::string> inputs;
};

constexpr const char* kFlags =
    "flags: --tokenizer (DIR | tokenizer.json) --output FILE.tokens [--field NAME] [--eos TOKEN] [--threads N] [--help]\n"
    "       INPUT... (text files, one document each; .jsonl files, one JSON object per line)\n";

[[noreturn]] void usage(const std::string& msg) {
  std::cerr << "hp_tokenize: " << msg << "\n" << kFlags;
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "--help" || f == "-h") {
      std::cout << "hp_tokenize: tokenizes text and JSON-lines files into a token file\n" << kFlags;
      std::exit(0);
    }
    if (f.rfind("--", 0) != 0) {
      a.inputs.push_back(f);
      continue;
    }
    if (i + 1 >= argc) usage(f + " needs a value");
    const std::string v = argv[++i];
    if (f == "--tokenizer") a.tokenizer = v;
    else if (f == "--output") a.output = v;
    else if (f == "--field") a.field = v;
    else if (f == "--eos") a.eos = v;
    else if (f == "--threads") {
      size_t used = 0;
      try {
        a.threads = std::stoll(v, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != v.size() || a.threads < 1 || a.threads > 1024) usage("--threads takes a whole number from 1 to 1024, got '" + v + "'");
    } else {
      usage("unknown flag " + f);
    }
  }
  if (a.tokenizer.empty()) usage("--tokenizer is required");
  if (a.output.empty()) usage("--output is required");
  if (a.field.empty()) usage("--field needs a name");
  if (a.inputs.empty()) usage("no input files given");
  if (std::filesystem::is_directory(a.tokenizer)) a.tokenizer += "/tokenizer.json";
  if (!std::filesystem::is_regular_file(a.tokenizer)) usage("--tokenizer: " + a.tokenizer + " is not a file");
  for (const auto& in : a.inputs)
    if (!std::filesystem::is_regular_file(in)) usage("input " + in + " is not a file");
  if (a.threads == 0) a.threads = std::max<int64_t>(1, std::thread::hardware_concurrency());
  return a;
}

bool is_json_lines(const std::string& path) {
  const std::string ext = std::filesystem::path(path).extension().string();
  return ext == ".jsonl" || ext == ".json";
}

// Reads documents from the inputs in order, a batch at a time.
class DocumentReader {
 public:
  DocumentReader(const Args& a) : a_(a) {}
  // Up to `max_bytes` of documents (at least one); false when the inputs are done.
  bool next(std::vector<std::string>& docs, size_t max_bytes) {
    docs.clear();
    size_t bytes = 0;
    while (bytes < max_bytes) {
      if (!in_.is_open()) {
        if (file_ == a_.inputs.size()) break;
        path_ = a_.inputs[file_++];
        in_.open(path_, std::ios::binary);
        if (!in_) throw std::runtime_error("cannot read " + path_);
        line_ = 0;
        if (!is_json_lines(path_)) {
          std::ostringstream s;
          s << in_.rdbuf();
          docs.push_back(s.str());
          bytes += docs.back().size();
          in_.close();
          continue;
        }
      }
      std::string line;
      if (!std::getline(in_, line)) {
        in_.close();
        continue;
      }
      ++line_;
      bytes += line.size() + 1;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const std::exception& e) {
        throw std::runtime_error(path_ + ":" + std::to_string(line_) + ": not JSON: " + e.what());
      }
      if (!j.is_object() || !j.contains(a_.field) || !j[a_.field].is_string())
        throw std::runtime_error(path_ + ":" + std::to_string(line_) + ": not an object with a string field '" + a_.field + "'");
      docs.push_back(j[a_.field].get<std::string>());
    }
    read_bytes_ += bytes;
    return !docs.empty();
  }
  size_t bytes_read() const { return read_bytes_; }

 private:
  const Args& a_;
  size_t file_ = 0, line_ = 0, read_bytes_ = 0;
  std::string path_;
  std::ifstream in_;
};

int run(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const auto tok = hp::models::Tokenizer::from_file(a.tokenizer);
  const auto eos = tok.token_to_id(a.eos);
  if (!eos) usage("--eos: the tokenizer has no token '" + a.eos + "'");
  size_t total = 0;
  for (const auto& in : a.inputs) total += std::filesystem::file_size(in);
  hp::data::TokenFileWriter out(a.output, tok.vocab_size(), *eos);
  DocumentReader reader(a);
  std::vector<std::string> docs;
  std::vector<std::vector<int64_t>> ids;
  const auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  bool progress = false;
  while (reader.next(docs, size_t{4} << 20)) {
    ids.assign(docs.size(), {});
    // Each thread takes the next document; the results are written in the documents' order.
    std::atomic<size_t> next{0};
    std::vector<std::string> errors(static_cast<size_t>(a.threads));
    std::vector<std::thread> pool;
    for (int64_t t = 0; t < a.threads; ++t)
      pool.emplace_back([&, t] {
        try {
          for (size_t k; (k = next.fetch_add(1)) < docs.size();) ids[k] = tok.encode(docs[k]);
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(t)] = e.what();
          next.store(docs.size());
        }
      });
    for (auto& th : pool) th.join();
    for (const auto& e : errors)
      if (!e.empty()) throw std::runtime_error(e);
    for (const auto& d : ids) out.append_document(d);
    const auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - last).count() > 1.0) {
      last = now;
      progress = true;
      const double secs = std::chrono::duration<double>(now - t0).count();
      std::fprintf(stderr, "\rhp_tokenize: %lld documents, %lld tokens, %.1f of %.1f MB, %.1f MB/s", static_cast<long long>(out.info().num_documents),
                   static_cast<long long>(out.info().num_tokens), reader.bytes_read() / 1e6, total / 1e6, reader.bytes_read() / 1e6 / secs);
    }
  }
  if (progress) std::fprintf(stderr, "\n");
  out.close();
  const auto& i = out.info();
  std::printf("wrote %s: %lld documents, %lld tokens (uint%lld), vocabulary %lld, EOS %lld\n", a.output.c_str(),
              static_cast<long long>(i.num_documents), static_cast<long long>(i.num_tokens), static_cast<long long>(8 * i.bytes_per_token),
              static_cast<long long>(i.vocab_size), static_cast<long long>(i.eos_id));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return hp::run_program([&] { return run(argc, argv); });
}
