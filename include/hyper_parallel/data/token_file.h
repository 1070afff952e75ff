#pragma once
// Token files: a corpus tokenized once (by hp_tokenize), read by memory mapping. A 64-byte
// little-endian header - the magic "HPTOKEN1", the bytes per token (2: uint16 when the vocabulary
// fits in 65,536 ids, else 4: uint32), the vocabulary size, the token count, the EOS id that ends
// every document, the document count and the largest id - then the tokens.
//   hp::data::TokenFileWriter w("corpus.tokens", tok.vocab_size(), eos);
//   w.append_document(tok.encode(text));   // EOS appended
//   w.close();                             // written, fsynced, renamed into place
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace hyper_parallel {
namespace data {

/// What a token file's header says.
struct TokenFileInfo {
  int64_t bytes_per_token = 0;  // 2 (uint16) or 4 (uint32)
  int64_t vocab_size = 0;
  int64_t num_tokens = 0;
  int64_t eos_id = 0;
  int64_t num_documents = 0;
  int64_t max_token_id = -1;
};

/// Writes a token file: to `path`.tmp, then fsynced and renamed over `path` by close(), so a
/// reader never sees half a file. c10::ValueError for ids outside [0, vocab_size), an EOS id
/// outside it, or a write that fails (named with the OS error).
class TokenFileWriter {
 public:
  TokenFileWriter(const std::string& path, int64_t vocab_size, int64_t eos_id);
  ~TokenFileWriter();  // an unclosed writer removes its temporary file
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;
  /// Appends a document's tokens, then EOS.
  void append_document(const std::vector<int64_t>& ids);
  void close();
  const TokenFileInfo& info() const { return info_; }

 private:
  void write(const void* data, size_t n);
  std::string path_, tmp_;
  FILE* f_ = nullptr;
  TokenFileInfo info_;
  std::vector<uint8_t> buffer_;
};

/// A token file, memory-mapped read-only. Opening checks the header against the file: a file
/// that is not a token file, another bytes-per-token, a size that is not the header's count
/// (truncated), an EOS or largest id outside the vocabulary, all refused with c10::ValueError
/// naming the file.
class TokenFile {
 public:
  explicit TokenFile(const std::string& path);
  const TokenFileInfo& info() const { return info_; }
  const std::string& path() const { return path_; }
  /// Tokens [start, start + n) as int64.
  at::Tensor tokens(int64_t start, int64_t n) const;

 private:
  std::string path_;
  TokenFileInfo info_;
  std::shared_ptr<const void> mapping_;  // keeps the file mapped while this (or a move of it) lives
  const uint8_t* map_ = nullptr;
};

}  // namespace data
}  // namespace hyper_parallel
