#include <hyper_parallel/models/qwen3/tokenizer.h>

#include <hyper_parallel/runtime/errors.h>

#include <nlohmann/json.hpp>
#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/unistr.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <climits>
#include <fstream>
#include <sstream>

namespace hyper_parallel {
namespace qwen3 {

namespace {

using nlohmann::json;

// GPT-2's byte-level alphabet: printable bytes stand for themselves, the other 68 bytes for
// code points from U+0100 on, so every byte string is a string of visible characters.
struct ByteLevel {
  std::string byte_to_char[256];          // UTF-8 of each byte's character
  std::unordered_map<int32_t, uint8_t> char_to_byte;
  ByteLevel() {
    int32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const int32_t cp = printable ? b : next++;
      char buf[4];
      int32_t len = 0;
      U8_APPEND_UNSAFE(buf, len, cp);
      byte_to_char[b].assign(buf, static_cast<size_t>(len));
      char_to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};

const ByteLevel& byte_level() {
  static const ByteLevel table;
  return table;
}

// Onig (which the tokenizers library uses) takes \s as the White_Space property; ICU's \s is
// [\t\n\f\r\p{Z}], without U+000B and U+0085. Spelled as the property, both engines agree.
std::string portable_pattern(const std::string& p) {
  std::string out;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == '\\' && i + 1 < p.size()) {
      if (p[i + 1] == 's') out += "\\p{White_Space}";
      else if (p[i + 1] == 'S') out += "\\P{White_Space}";
      else out += p.substr(i, 2);
      ++i;
    } else {
      out += p[i];
    }
  }
  return out;
}

// Calls f(begin, end, valid) for each character of `bytes`, and for each maximal invalid
// sequence (as the Unicode standard and Rust's from_utf8_lossy delimit them).
template <class F>
void scan_utf8(const std::string& bytes, F&& f) {
  const auto* s = reinterpret_cast<const uint8_t*>(bytes.data());
  const int32_t n = static_cast<int32_t>(bytes.size());
  for (int32_t i = 0; i < n;) {
    const int32_t start = i;
    UChar32 c;
    U8_NEXT(s, i, n, c);
    f(start, i, c >= 0);
  }
}

// Each maximal invalid UTF-8 sequence becomes U+FFFD, as Rust's from_utf8_lossy does.
std::string lossy_utf8(const std::string& bytes) {
  std::string out;
  scan_utf8(bytes, [&](int32_t b, int32_t e, bool valid) {
    if (valid) out.append(bytes, static_cast<size_t>(b), static_cast<size_t>(e - b));
    else out += "\xEF\xBF\xBD";
  });
  return out;
}

}  // namespace

struct Tokenizer::Impl {
  std::string origin;
  std::unordered_map<std::string, int64_t> vocab;
  std::unordered_map<int64_t, std::string> id_to_token;
  std::unordered_map<std::string, int> merge_rank;  // "left right" -> rank
  struct Added {
    std::string content;
    int64_t id;
    bool special;
  };
  std::vector<Added> added;  // longest first, so the longest match at a position wins
  std::unordered_map<int64_t, size_t> added_by_id;
  bool nfc = false, ignore_merges = false;
  std::unique_ptr<icu::RegexPattern> split;  // null: the whole text is one piece
  int64_t size = 0;

  [[noreturn]] void fail(const std::string& why) const {
    HP_CHECK_T(c10::ValueError, false, "hyper_parallel::qwen3::Tokenizer::from_json: ", origin, ": ", why);
  }

  void bpe(const std::string& piece, std::vector<int64_t>& out) const {
    std::string mapped;
    for (unsigned char b : piece) mapped += byte_level().byte_to_char[b];
    if (ignore_merges) {
      auto it = vocab.find(mapped);
      if (it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    std::vector<std::string> symbols;
    for (unsigned char b : piece) symbols.push_back(byte_level().byte_to_char[b]);
    // The lowest-ranked adjacent pair merges first, everywhere it occurs, left to right.
    while (symbols.size() > 1) {
      int best = INT_MAX;
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        auto it = merge_rank.find(symbols[i] + " " + symbols[i + 1]);
        if (it != merge_rank.end()) best = std::min(best, it->second);
      }
      if (best == INT_MAX) break;
      std::vector<std::string> merged;
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size()) {
          auto it = merge_rank.find(symbols[i] + " " + symbols[i + 1]);
          if (it != merge_rank.end() && it->second == best) {
            merged.push_back(symbols[i] + symbols[i + 1]);
            ++i;
            continue;
          }
        }
        merged.push_back(symbols[i]);
      }
      symbols.swap(merged);
    }
    for (const auto& s : symbols) {
      auto it = vocab.find(s);
      if (it == vocab.end()) fail("the vocabulary lacks the token '" + s + "' that the merges produce (no unk_token to stand in)");
      out.push_back(it->second);
    }
  }

  // Plain text (no added tokens in it): normalised, split by the regex, each piece through BPE.
  void encode_plain(const std::string& text, std::vector<int64_t>& out) const {
    if (text.empty()) return;
    UErrorCode st = U_ZERO_ERROR;
    icu::UnicodeString u = icu::UnicodeString::fromUTF8(text);
    if (nfc) {
      const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(st);
      u = n->normalize(u, st);
      if (U_FAILURE(st)) fail(std::string("NFC normalisation failed: ") + u_errorName(st));
    }
    if (!split) {
      std::string s;
      bpe(u.toUTF8String(s), out);
      return;
    }
    std::unique_ptr<icu::RegexMatcher> m(split->matcher(u, st));
    if (U_FAILURE(st)) fail(std::string("the pre-tokenizer regex failed: ") + u_errorName(st));
    int32_t at = 0;
    auto emit = [&](int32_t from, int32_t to) {
      if (to <= from) return;
      std::string s;
      icu::UnicodeString(u, from, to - from).toUTF8String(s);
      bpe(s, out);
    };
    // "Isolated": every match is a piece, and so is every stretch between matches.
    while (m->find(st)) {
      const int32_t b = m->start(st), e = m->end(st);
      emit(at, b);
      emit(b, e);
      at = e;
    }
    emit(at, u.length());
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path);
  HP_CHECK_T(c10::ValueError, in.good(), "hyper_parallel::qwen3::Tokenizer::from_file: cannot read ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json(ss.str(), path);
}

Tokenizer Tokenizer::from_json(const std::string& text, const std::string& origin) {
  auto impl = std::make_unique<Impl>();
  Impl& t = *impl;
  t.origin = origin;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    t.fail(std::string("not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) t.fail("no \"model\" object");
  try {
    const json& model = j["model"];
    if (model.value("type", "") != "BPE") t.fail("model type " + model.value("type", std::string("(none)")) + " is not supported (only BPE)");
    if (model.contains("dropout") && !model["dropout"].is_null()) t.fail("BPE dropout is not supported");
    if (model.value("byte_fallback", false)) t.fail("BPE byte_fallback is not supported (byte-level BPE needs none)");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (model.contains(key) && !model[key].is_null() && model[key] != "") t.fail(std::string("BPE ") + key + " is not supported");
    t.ignore_merges = model.value("ignore_merges", false);
    if (!model.contains("vocab") || !model["vocab"].is_object()) t.fail("model.vocab is not an object");
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0) t.fail("the id of '" + it.key() + "' is not a non-negative integer");
      const int64_t id = it.value().get<int64_t>();
      t.vocab[it.key()] = id;
      t.id_to_token[id] = it.key();
      t.size = std::max(t.size, id + 1);
    }
    if (!model.contains("merges") || !model["merges"].is_array()) t.fail("model.merges is not an array");
    int rank = 0;
    for (const auto& m : model["merges"]) {
      std::string left, right;
      if (m.is_string()) {  // "left right" (older files)
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) t.fail("merge '" + s + "' is not two tokens");
        left = s.substr(0, sp);
        right = s.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        left = m[0].get<std::string>();
        right = m[1].get<std::string>();
      } else {
        t.fail("merge " + m.dump() + " is neither \"a b\" nor [\"a\", \"b\"]");
      }
      t.merge_rank.emplace(left + " " + right, rank++);
    }
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
      for (const auto& a : j["added_tokens"]) {
        if (!a.is_object() || !a.contains("id") || !a.contains("content") || !a["id"].is_number_integer() || !a["content"].is_string())
          t.fail("added token " + a.dump() + " lacks an integer id or a content string");
        for (const char* key : {"single_word", "lstrip", "rstrip"})
          if (a.value(key, false)) t.fail("added token " + a["content"].dump() + " sets " + key + ", which is not supported");
        const std::string content = a["content"].get<std::string>();
        if (content.empty()) t.fail("an added token is empty");
        t.added.push_back({content, a["id"].get<int64_t>(), a.value("special", false)});
        t.size = std::max(t.size, a["id"].get<int64_t>() + 1);
      }
      std::stable_sort(t.added.begin(), t.added.end(), [](const auto& a, const auto& b) { return a.content.size() > b.content.size(); });
      for (size_t i = 0; i < t.added.size(); ++i) t.added_by_id[t.added[i].id] = i;
    }
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
      const std::string type = j["normalizer"].value("type", "");
      if (type != "NFC") t.fail("normalizer " + type + " is not supported (only NFC or none)");
      t.nfc = true;
    }
    // The pre-tokenizer: Split(regex, Isolated) then ByteLevel(use_regex=false), as Qwen's; or
    // ByteLevel alone.
    const json pre = j.value("pre_tokenizer", json());
    std::vector<json> steps;
    if (pre.is_object() && pre.value("type", "") == "Sequence") steps = pre.value("pretokenizers", std::vector<json>{});
    else if (pre.is_object()) steps = {pre};
    if (steps.empty() || steps.back().value("type", "") != "ByteLevel")
      t.fail("the pre_tokenizer must end with ByteLevel (byte-level BPE); got " + pre.dump().substr(0, 200));
    if (steps.back().value("add_prefix_space", false)) t.fail("ByteLevel add_prefix_space is not supported");
    if (steps.back().value("use_regex", true)) t.fail("ByteLevel use_regex (GPT-2's own split) is not supported; Qwen splits with Split");
    if (steps.size() > 2) t.fail("a pre_tokenizer Sequence of more than Split then ByteLevel is not supported");
    if (steps.size() == 2) {
      const json& s = steps[0];
      if (s.value("type", "") != "Split" || !s.contains("pattern") || !s["pattern"].contains("Regex"))
        t.fail("the first pre-tokenizer must be Split with a Regex pattern, got " + s.dump().substr(0, 200));
      if (s.value("behavior", "") != "Isolated" || s.value("invert", false))
        t.fail("Split behavior " + s.value("behavior", std::string("?")) + (s.value("invert", false) ? " inverted" : "") +
               " is not supported (only Isolated)");
      const std::string pattern = portable_pattern(s["pattern"]["Regex"].get<std::string>());
      UErrorCode st = U_ZERO_ERROR;
      UParseError pe;
      t.split.reset(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(pattern), 0, pe, st));
      if (U_FAILURE(st)) t.fail("the Split regex does not compile (" + std::string(u_errorName(st)) + " at offset " + std::to_string(pe.offset) + ")");
    }
    const json dec = j.value("decoder", json());
    if (!dec.is_null() && dec.value("type", "") != "ByteLevel") t.fail("decoder " + dec.value("type", std::string("?")) + " is not supported (only ByteLevel)");
    const json post = j.value("post_processor", json());
    if (!post.is_null() && post.value("type", "") != "ByteLevel")
      t.fail("post_processor " + post.value("type", std::string("?")) + " is not supported (only ByteLevel, which adds no tokens)");
  } catch (const json::exception& e) {  // a field of the wrong JSON type
    t.fail(std::string("malformed (") + e.what() + ")");
  }
  return Tokenizer(std::move(impl));
}

std::vector<int64_t> Tokenizer::encode(const std::string& text) const {
  const Impl& t = *impl_;
  scan_utf8(text, [](int32_t b, int32_t, bool valid) {
    HP_CHECK_T(c10::ValueError, valid, "hyper_parallel::qwen3::Tokenizer::encode: the text is not valid UTF-8 (byte ", b, ")");
  });
  std::vector<int64_t> out;
  size_t plain = 0;
  for (size_t i = 0; i < text.size();) {
    const Impl::Added* hit = nullptr;
    for (const auto& a : t.added)
      if (text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    if (!hit) {
      ++i;
      continue;
    }
    t.encode_plain(text.substr(plain, i - plain), out);
    out.push_back(hit->id);
    i += hit->content.size();
    plain = i;
  }
  t.encode_plain(text.substr(plain), out);
  return out;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  const Impl& t = *impl_;
  std::string out, bytes;
  const auto& table = byte_level().char_to_byte;
  for (int64_t id : ids) {
    auto a = t.added_by_id.find(id);
    if (a != t.added_by_id.end()) {
      out += lossy_utf8(bytes);
      bytes.clear();
      if (!(skip_special_tokens && t.added[a->second].special)) out += t.added[a->second].content;
      continue;
    }
    auto tok = t.id_to_token.find(id);
    HP_CHECK_T(c10::ValueError, tok != t.id_to_token.end(), "hyper_parallel::qwen3::Tokenizer::decode: id ", id, " is not in the vocabulary");
    const auto* s = reinterpret_cast<const uint8_t*>(tok->second.data());
    const int32_t n = static_cast<int32_t>(tok->second.size());
    for (int32_t i = 0; i < n;) {
      UChar32 c;
      U8_NEXT(s, i, n, c);
      auto b = table.find(c);
      HP_CHECK_T(c10::ValueError, b != table.end(), "hyper_parallel::qwen3::Tokenizer::decode: token ", id, " '", tok->second, "' is not byte-level");
      bytes += static_cast<char>(b->second);
    }
  }
  return out + lossy_utf8(bytes);
}

std::optional<int64_t> Tokenizer::token_to_id(const std::string& token) const {
  for (const auto& a : impl_->added)
    if (a.content == token) return a.id;
  auto it = impl_->vocab.find(token);
  if (it != impl_->vocab.end()) return it->second;
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

}  // namespace qwen3
}  // namespace hyper_parallel
