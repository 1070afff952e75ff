#include "tokenizer_impl.h"

namespace hyper_parallel {
namespace models {

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<int64_t> Tokenizer::encode(const std::string& text) const {
  const Impl& t = *impl_;
  scan_utf8(text, [](int32_t b, int32_t, bool valid) {
    HP_CHECK_T(c10::ValueError, valid, "hyper_parallel::models::Tokenizer::encode: the text is not valid UTF-8 (byte ", b, ")");
  });
  std::vector<int64_t> out;
  out.reserve(text.size() / 3 + 4);
  const std::string_view view(text);
  size_t plain = 0;
  // Added tokens are found in the raw text, leftmost first and the longest at a position.
  for (size_t i = 0; i < text.size(); ++i) {
    const auto& candidates = t.added_by_first_byte[static_cast<uint8_t>(text[i])];
    if (candidates.empty()) continue;
    const Impl::Added* hit = nullptr;
    for (uint32_t k : candidates)
      if (view.compare(i, t.added[k].content.size(), t.added[k].content) == 0) {
        hit = &t.added[k];
        break;
      }
    if (!hit) continue;
    t.encode_plain(view.substr(plain, i - plain), out);
    out.push_back(hit->id);
    i += hit->content.size() - 1;
    plain = i + 1;
  }
  t.encode_plain(view.substr(std::min(plain, text.size())), out);
  return out;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  const Impl& t = *impl_;
  std::string out, bytes;
  for (int64_t id : ids) {
    auto a = t.added_by_id.find(id);
    if (a != t.added_by_id.end()) {
      append_lossy_utf8(bytes, out);
      bytes.clear();
      if (!(skip_special_tokens && t.added[a->second].special)) out += t.added[a->second].content;
      continue;
    }
    auto tok = t.bytes_of_id.find(id);
    if (tok != t.bytes_of_id.end()) {
      bytes += t.vocab_bytes.key_at(tok->second.first, tok->second.second);
      continue;
    }
    auto odd = t.odd_by_id.find(id);
    if (odd != t.odd_by_id.end())
      HP_CHECK_T(c10::ValueError, false, "hyper_parallel::models::Tokenizer::decode: token ", id, " '", odd->second, "' is not byte-level");
    HP_CHECK_T(c10::ValueError, false, "hyper_parallel::models::Tokenizer::decode: id ", id, " is not in the vocabulary");
  }
  append_lossy_utf8(bytes, out);
  return out;
}

std::optional<int64_t> Tokenizer::token_to_id(const std::string& token) const {
  for (const auto& a : impl_->added)
    if (a.content == token) return a.id;
  std::string scratch;
  const int64_t id = impl_->id_of_token(token, scratch);
  if (id >= 0) return id;
  return std::nullopt;
}

int64_t Tokenizer::vocab_size() const { return impl_->size; }

std::string byte_tokenizer_json() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level().byte_to_char[b]] = b;
  const json byte_level_step = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  json j = {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", json::array()},
            {"normalizer", nullptr},
            {"pre_tokenizer", byte_level_step},
            {"post_processor", nullptr},
            {"decoder", byte_level_step},
            {"model",
             {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
              {"vocab", vocab}, {"merges", json::array()}}}};
  return j.dump();
}

}  // namespace models
}  // namespace hyper_parallel
