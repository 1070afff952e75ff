#pragma once
// Hugging Face tokenizer.json with byte-level BPE (Qwen3's, Qwen3.5's, GPT-2's alike): added (special) tokens matched in the
// raw text first, the NFC normalizer, the Split pre-tokenizer's regex then byte-level mapping, BPE
// merges by rank, and the byte-level decoder. Regex and normalisation come from ICU.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace hyper_parallel {
namespace models {

class Tokenizer {
 public:
  /// Reads tokenizer.json. What this implementation does not do (another model type, a
  /// normalizer other than NFC, BPE dropout or byte fallback, added tokens with lstrip/rstrip/
  /// single_word, ...) is refused by name with c10::ValueError; a malformed file too.
  /// e.g. `auto tok = models::Tokenizer::from_file("Qwen3-0.6B/tokenizer.json");`
  static Tokenizer from_file(const std::string& path);
  static Tokenizer from_json(const std::string& text, const std::string& origin = "tokenizer.json");
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  /// Token ids of UTF-8 `text`; added tokens written in it ("<|im_end|>") become their ids.
  /// Invalid UTF-8 is a c10::ValueError.
  std::vector<int64_t> encode(const std::string& text) const;
  /// The text of `ids`; bytes that do not form UTF-8 become U+FFFD. c10::ValueError for an id
  /// the vocabulary lacks.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const;
  /// The id of a token (an added token's content, or a vocabulary entry), if any.
  std::optional<int64_t> token_to_id(const std::string& token) const;
  /// One more than the largest id.
  int64_t vocab_size() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// tokenizer.json for a model whose token ids are the bytes of the text (the demo's 256-token
/// vocabulary): byte-level, no merges. Both this Tokenizer and the tokenizers library read it.
std::string byte_tokenizer_json();

}  // namespace models
}  // namespace hyper_parallel
