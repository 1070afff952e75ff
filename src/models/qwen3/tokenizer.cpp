#include <hyper_parallel/models/qwen3/tokenizer.h>

#include <hyper_parallel/runtime/errors.h>

#include <c10/util/SmallVector.h>
#include <nlohmann/json.hpp>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/unistr.h>
#include <unicode/utf16.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <climits>
#include <fstream>
#include <functional>
#include <mutex>
#include <queue>
#include <sstream>
#include <string_view>

namespace hyper_parallel {
namespace qwen3 {

namespace {

using nlohmann::json;

// GPT-2's byte-level alphabet: printable bytes stand for themselves, the other 68 bytes for
// code points from U+0100 on, so every byte string is a string of visible characters.
struct ByteLevel {
  std::string byte_to_char[256];  // UTF-8 of each byte's character
  int16_t char_to_byte[512];      // the alphabet's code points are all below U+0144; -1: not in it
  ByteLevel() {
    std::fill(std::begin(char_to_byte), std::end(char_to_byte), int16_t{-1});
    int32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const int32_t cp = printable ? b : next++;
      char buf[4];
      int32_t len = 0;
      U8_APPEND_UNSAFE(buf, len, cp);
      byte_to_char[b].assign(buf, static_cast<size_t>(len));
      char_to_byte[cp] = static_cast<int16_t>(b);
    }
  }
  // The bytes a byte-level token stands for; false when a character is not in the alphabet.
  bool to_bytes(std::string_view token, std::string& out) const {
    out.clear();
    const auto* s = reinterpret_cast<const uint8_t*>(token.data());
    const int32_t n = static_cast<int32_t>(token.size());
    for (int32_t i = 0; i < n;) {
      UChar32 c;
      U8_NEXT(s, i, n, c);
      if (c < 0 || c >= 512 || char_to_byte[c] < 0) return false;
      out += static_cast<char>(char_to_byte[c]);
    }
    return true;
  }
};

const ByteLevel& byte_level() {
  static const ByteLevel table;
  return table;
}

// Onig (which the tokenizers library uses) takes \s as the White_Space property. ICU documents
// its \s as [\t\n\f\r\p{Z}], without U+000B and U+0085 (the ICU 72 of Debian 12 does match
// them); spelled as the property, the split does not depend on which ICU reads it.
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
void scan_utf8(std::string_view bytes, F&& f) {
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
void append_lossy_utf8(const std::string& bytes, std::string& out) {
  scan_utf8(bytes, [&](int32_t b, int32_t e, bool valid) {
    if (valid) out.append(bytes, static_cast<size_t>(b), static_cast<size_t>(e - b));
    else out += "\xEF\xBF\xBD";
  });
}

}  // namespace

// The tables live in a named namespace: Tokenizer::Impl holds them, and an anonymous one would
// give it internal-linkage members.
namespace tokenizer_tables {

// Byte strings to ids, open addressing over one arena of keys: a vocabulary of 248k tokens is two
// allocations, not one per token, and a lookup hashes the piece where it lies in the text.
class BytesToId {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    if (cap > slots_.size()) rehash(cap);
  }
  // Inserts or overwrites; returns false when `key` was there already.
  bool insert(std::string_view key, int32_t id) {
    if (2 * (count_ + 1) > slots_.size()) rehash(std::max<size_t>(16, 2 * slots_.size()));
    Slot& s = probe(key);
    if (s.id >= 0) {
      s.id = id;
      return false;
    }
    s = {static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(key.size()), id};
    arena_.append(key);
    ++count_;
    return true;
  }
  size_t size() const { return count_; }
  int32_t find(std::string_view key) const {
    if (slots_.empty()) return -1;
    return const_cast<BytesToId*>(this)->probe(key).id;
  }
  std::string_view key_at(uint32_t off, uint32_t len) const { return std::string_view(arena_).substr(off, len); }
  // f(id, offset, length) for each key, its bytes at key_at(offset, length).
  template <class F>
  void for_each(F&& f) const {
    for (const auto& s : slots_)
      if (s.id >= 0) f(s.id, s.off, s.len);
  }

 private:
  struct Slot {
    uint32_t off = 0, len = 0;
    int32_t id = -1;
  };
  Slot& probe(std::string_view key) {
    const size_t mask = slots_.size() - 1;
    for (size_t i = std::hash<std::string_view>{}(key) & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (s.id < 0 || (s.len == key.size() && std::string_view(arena_).substr(s.off, s.len) == key)) return s;
    }
  }
  void rehash(size_t cap) {
    std::vector<Slot> old(cap);
    old.swap(slots_);
    for (const auto& s : old)
      if (s.id >= 0) probe(key_at(s.off, s.len)) = s;
  }
  std::string arena_;
  std::vector<Slot> slots_;
  size_t count_ = 0;
};

// A pair of token ids to the merge's rank and the id it makes.
class MergeMap {
 public:
  struct Merge {
    int32_t rank = -1, new_id = -1;
  };
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    slots_.assign(cap, Slot{});
    count_ = 0;
  }
  // A later merge of the same pair replaces the earlier one, as the tokenizers library's map does.
  void insert(int32_t left, int32_t right, Merge m) {
    if (2 * (count_ + 1) > slots_.size()) grow();
    Slot& s = probe(key(left, right));
    if (s.m.rank < 0) ++count_;
    s.key = key(left, right);
    s.m = m;
  }
  Merge find(int32_t left, int32_t right) const {
    if (slots_.empty()) return {};
    return const_cast<MergeMap*>(this)->probe(key(left, right)).m;
  }

 private:
  struct Slot {
    uint64_t key = 0;
    Merge m;
  };
  static uint64_t key(int32_t l, int32_t r) { return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r); }
  Slot& probe(uint64_t k) {
    const size_t mask = slots_.size() - 1;
    for (size_t i = ((k * 0x9E3779B97F4A7C15ull) >> 20) & mask;; i = (i + 1) & mask)
      if (slots_[i].m.rank < 0 || slots_[i].key == k) return slots_[i];
  }
  void grow() {
    std::vector<Slot> old(std::max<size_t>(16, 2 * slots_.size()));
    old.swap(slots_);
    for (const auto& s : old)
      if (s.m.rank >= 0) probe(s.key) = s;
  }
  std::vector<Slot> slots_;
  size_t count_ = 0;
};

}  // namespace tokenizer_tables

struct Tokenizer::Impl {
  struct JsonReader;
  std::string origin;
  // Vocabulary entries by the bytes they stand for (every byte-level token), and by their text
  // for any entry that is not byte-level (no pre-tokenized text can reach those; decode names them).
  tokenizer_tables::BytesToId vocab_bytes;
  std::unordered_map<std::string, int64_t> odd_tokens;
  std::unordered_map<int64_t, std::string> odd_by_id;
  std::unordered_map<int64_t, std::pair<uint32_t, uint32_t>> bytes_of_id;  // into vocab_bytes' arena
  int32_t byte_id[256];  // the token of each single byte; -1: the vocabulary lacks it
  tokenizer_tables::MergeMap merges;
  struct Added {
    std::string content;
    int64_t id;
    bool special;
  };
  std::vector<Added> added;  // longest first, so the longest match at a position wins
  std::vector<uint32_t> added_by_first_byte[256];  // indices into `added`, longest first
  std::unordered_map<int64_t, size_t> added_by_id;
  bool nfc = false, ignore_merges = false;
  std::unique_ptr<icu::RegexPattern> split;  // null: the whole text is one piece
  // Matchers are stateful: each encode takes one from here and gives it back, so concurrent
  // encodes on one Tokenizer never share one, and none is compiled again per call.
  mutable std::mutex matcher_mutex;
  mutable std::vector<std::unique_ptr<icu::RegexMatcher>> free_matchers;
  int64_t size = 0;

  [[noreturn]] void fail(const std::string& why) const {
    HP_CHECK_T(c10::ValueError, false, "hyper_parallel::qwen3::Tokenizer::from_json: ", origin, ": ", why);
  }

  // The id of a vocabulary entry spelt as in tokenizer.json; -1 if there is none.
  int64_t id_of_token(const std::string& token, std::string& scratch) const {
    if (byte_level().to_bytes(token, scratch)) {
      const int32_t id = vocab_bytes.find(scratch);
      if (id >= 0) return id;
    }
    auto it = odd_tokens.find(token);
    return it == odd_tokens.end() ? -1 : it->second;
  }

  // Byte-level BPE of one piece of pre-tokenized text. The merges apply as the tokenizers
  // library applies them: always the adjacent pair of the lowest rank, the leftmost of equals,
  // pairs that a merge forms taking their place by rank at once.
  void bpe(std::string_view piece, std::vector<int64_t>& out) const {
    if (piece.empty()) return;
    if (ignore_merges || piece.size() == 1) {
      const int32_t id = vocab_bytes.find(piece);
      if (id >= 0) {
        out.push_back(id);
        return;
      }
    }
    const int32_t n = static_cast<int32_t>(piece.size());
    c10::SmallVector<int32_t, 64> ids(n), next(n), prev(n);
    for (int32_t i = 0; i < n; ++i) {
      const int32_t id = byte_id[static_cast<uint8_t>(piece[i])];
      HP_CHECK_T(c10::ValueError, id >= 0, "hyper_parallel::qwen3::Tokenizer::encode: ", origin, ": the vocabulary lacks the token of byte ",
                 static_cast<int>(static_cast<uint8_t>(piece[i])), " (no unk_token to stand in)");
      ids[i] = id;
      next[i] = i + 1 < n ? i + 1 : -1;
      prev[i] = i - 1;
    }
    struct Candidate {
      int32_t rank, pos, new_id;
      bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Candidate, c10::SmallVector<Candidate, 64>, std::greater<Candidate>> queue;
    auto consider = [&](int32_t pos) {
      if (pos < 0 || next[pos] < 0) return;
      const auto m = merges.find(ids[pos], ids[next[pos]]);
      if (m.rank >= 0) queue.push({m.rank, pos, m.new_id});
    };
    for (int32_t i = 0; i + 1 < n; ++i) consider(i);
    while (!queue.empty()) {
      const Candidate top = queue.top();
      queue.pop();
      // An entry goes stale when either of its symbols has merged since it was queued.
      if (ids[top.pos] < 0 || next[top.pos] < 0) continue;
      const auto m = merges.find(ids[top.pos], ids[next[top.pos]]);
      if (m.rank != top.rank || m.new_id != top.new_id) continue;
      const int32_t right = next[top.pos];
      ids[top.pos] = top.new_id;
      ids[right] = -1;
      next[top.pos] = next[right];
      if (next[right] >= 0) prev[next[right]] = top.pos;
      consider(prev[top.pos]);
      consider(top.pos);
    }
    for (int32_t i = 0; i >= 0; i = next[i]) out.push_back(ids[i]);
  }

  std::unique_ptr<icu::RegexMatcher> take_matcher() const {
    {
      std::lock_guard<std::mutex> lock(matcher_mutex);
      if (!free_matchers.empty()) {
        auto m = std::move(free_matchers.back());
        free_matchers.pop_back();
        return m;
      }
    }
    UErrorCode st = U_ZERO_ERROR;
    std::unique_ptr<icu::RegexMatcher> m(split->matcher(st));
    if (U_FAILURE(st)) fail(std::string("the pre-tokenizer regex failed: ") + u_errorName(st));
    return m;
  }
  void give_back(std::unique_ptr<icu::RegexMatcher> m) const {
    std::lock_guard<std::mutex> lock(matcher_mutex);
    free_matchers.push_back(std::move(m));
  }

  // Plain text (no added tokens in it, valid UTF-8): normalised, split by the regex, each piece
  // through BPE. The regex runs on UTF-16 (ICU's fast path); each piece is cut from the UTF-8
  // text by the byte offsets of its UTF-16 bounds, not converted back.
  void encode_plain(std::string_view text, std::vector<int64_t>& out) const {
    if (text.empty()) return;
    std::string normalized;
    if (nfc) {
      UErrorCode st = U_ZERO_ERROR;
      const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(st);
      const icu::StringPiece sp(text.data(), static_cast<int32_t>(text.size()));
      if (U_SUCCESS(st) && !n->isNormalizedUTF8(sp, st)) {
        icu::StringByteSink<std::string> sink(&normalized);
        n->normalizeUTF8(0, sp, sink, nullptr, st);
        text = normalized;
      }
      if (U_FAILURE(st)) fail(std::string("NFC normalisation failed: ") + u_errorName(st));
    }
    if (!split) {
      bpe(text, out);
      return;
    }
    const auto* s = reinterpret_cast<const uint8_t*>(text.data());
    const int32_t n = static_cast<int32_t>(text.size());
    icu::UnicodeString u;
    std::vector<int32_t> byte_at;  // UTF-16 index -> byte offset; one past the end included
    byte_at.reserve(text.size() + 1);
    {
      char16_t* buf = u.getBuffer(n);  // UTF-8 never has fewer bytes than UTF-16 units
      int32_t len = 0;
      for (int32_t i = 0; i < n;) {
        const int32_t at = i;
        UChar32 c;
        U8_NEXT_UNSAFE(s, i, c);
        byte_at.push_back(at);
        if (c > 0xFFFF) byte_at.push_back(at);
        U16_APPEND_UNSAFE(buf, len, c);
      }
      u.releaseBuffer(len);
      byte_at.push_back(n);
    }
    auto matcher = take_matcher();
    UErrorCode st = U_ZERO_ERROR;
    matcher->reset(u);
    int32_t at = 0;
    auto emit = [&](int32_t from, int32_t to) {
      if (to > from) bpe(text.substr(byte_at[from], byte_at[to] - byte_at[from]), out);
    };
    // "Isolated": every match is a piece, and so is every stretch between matches.
    while (matcher->find(st)) {
      const int32_t b = matcher->start(st), e = matcher->end(st);
      emit(at, b);
      emit(b, e);
      at = e;
    }
    static const icu::UnicodeString kNothing;
    matcher->reset(kNothing);  // drop the reference to `u` before it goes
    give_back(std::move(matcher));
    if (U_FAILURE(st)) fail(std::string("the pre-tokenizer regex failed: ") + u_errorName(st));
    emit(at, u.length());
  }
};

// Reads tokenizer.json through nlohmann's SAX interface: model.vocab and model.merges (hundreds of
// thousands of entries) go straight into the tokenizer's tables; the rest, a few small objects,
// becomes a json document that from_json checks as before.
struct Tokenizer::Impl::JsonReader : public nlohmann::json_sax<nlohmann::json> {
  using json = nlohmann::json;
  explicit JsonReader(Impl& t) : t_(t) {}

  json root;
  bool vocab_streamed = false, merges_streamed = false;
  std::vector<std::pair<std::string, std::string>> merge_pairs;
  std::string syntax_error;

  bool null() override { return value(json()); }
  bool boolean(bool v) override { return value(json(v)); }
  bool number_integer(number_integer_t v) override { return value(json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return value(json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return value(json(v)); }
  bool string(string_t& v) override {
    if (mode_ == Mode::kMerges) {  // "left right" (older files)
      const size_t sp = v.find(' ');
      if (sp == std::string::npos || v.find(' ', sp + 1) != std::string::npos) t_.fail("merge '" + v + "' is not two tokens");
      merge_pairs.emplace_back(v.substr(0, sp), v.substr(sp + 1));
      return true;
    }
    if (mode_ == Mode::kMergePair) {
      if (pair_len_ < 2) pair_[pair_len_] = std::move(v);
      ++pair_len_;
      return true;
    }
    return value(json(std::move(v)));
  }
  bool binary(binary_t&) override { return value(json()); }  // JSON text has none
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool start_object(std::size_t) override {
    if (mode_ == Mode::kMerges) bad_merge("an object");
    if (mode_ != Mode::kDom) return value(json());  // refused there by value()
    if (at_model_member("vocab")) {
      mode_ = Mode::kVocab;
      vocab_streamed = true;
      t_.vocab_bytes.reserve(1 << 17);
      return true;
    }
    return open(json::object());
  }
  bool end_object() override {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      return true;
    }
    return close();
  }
  bool start_array(std::size_t) override {
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kMergePair;
      pair_len_ = 0;
      return true;
    }
    if (mode_ != Mode::kDom) return value(json());
    if (at_model_member("merges")) {
      mode_ = Mode::kMerges;
      merges_streamed = true;
      return true;
    }
    return open(json::array());
  }
  bool end_array() override {
    if (mode_ == Mode::kMergePair) {
      if (pair_len_ != 2) bad_merge("an array of " + std::to_string(pair_len_) + " strings");
      merge_pairs.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      mode_ = Mode::kMerges;
      return true;
    }
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kDom;
      return true;
    }
    return close();
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    syntax_error = e.what();
    return false;
  }

 private:
  enum class Mode { kDom, kVocab, kMerges, kMergePair };

  bool at_model_member(const char* name) const {
    return stack_.size() == 2 && path_.size() == 2 && path_[1] == "model" && stack_[1]->is_object() && key_ == name;
  }
  [[noreturn]] void bad_merge(const std::string& what) {
    t_.fail("merge " + std::to_string(merge_pairs.size()) + " (" + what + ") is neither \"a b\" nor [\"a\", \"b\"]");
  }
  bool value(json&& v) {
    switch (mode_) {
      case Mode::kVocab: {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
          t_.fail("the id of '" + key_ + "' is not a non-negative 32-bit integer");
        add_vocab(key_, static_cast<int32_t>(v.get<int64_t>()));
        return true;
      }
      case Mode::kMerges:
        t_.fail("merge " + v.dump() + " is neither \"a b\" nor [\"a\", \"b\"]");
      case Mode::kMergePair:
        bad_merge("an array holding " + v.dump());
      case Mode::kDom:
        break;
    }
    if (stack_.empty()) {
      root = std::move(v);
      return true;
    }
    json& parent = *stack_.back();
    if (parent.is_object()) parent[key_] = std::move(v);
    else parent.push_back(std::move(v));
    return true;
  }
  bool open(json&& container) {
    json* slot;
    if (stack_.empty()) {
      root = std::move(container);
      slot = &root;
    } else if (stack_.back()->is_object()) {
      slot = &((*stack_.back())[key_] = std::move(container));
    } else {
      stack_.back()->push_back(std::move(container));
      slot = &stack_.back()->back();
    }
    path_.push_back(stack_.empty() ? std::string() : key_);
    stack_.push_back(slot);
    return true;
  }
  bool close() {
    stack_.pop_back();
    path_.pop_back();
    return true;
  }
  void add_vocab(const std::string& token, int32_t id) {
    t_.size = std::max<int64_t>(t_.size, int64_t{id} + 1);
    if (byte_level().to_bytes(token, scratch_)) {
      t_.vocab_bytes.insert(scratch_, id);
      if (scratch_.size() == 1) t_.byte_id[static_cast<uint8_t>(scratch_[0])] = id;
    } else {
      t_.odd_tokens[token] = id;
      t_.odd_by_id[id] = token;
    }
  }

  Impl& t_;
  Mode mode_ = Mode::kDom;
  std::vector<json*> stack_;
  std::vector<std::string> path_;  // the key each open container sits under
  std::string key_, scratch_;
  std::string pair_[2];
  int pair_len_ = 0;
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  HP_CHECK_T(c10::ValueError, in.good(), "hyper_parallel::qwen3::Tokenizer::from_file: cannot read ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json(ss.str(), path);
}

Tokenizer Tokenizer::from_json(const std::string& text, const std::string& origin) {
  auto impl = std::make_unique<Impl>();
  Impl& t = *impl;
  t.origin = origin;
  std::fill(std::begin(t.byte_id), std::end(t.byte_id), -1);
  Impl::JsonReader reader(t);
  bool parsed = false;
  try {
    parsed = json::sax_parse(text, &reader);
  } catch (const json::exception& e) {
    t.fail(std::string("not valid JSON (") + e.what() + ")");
  }
  if (!parsed) t.fail("not valid JSON (" + reader.syntax_error + ")");
  json& j = reader.root;
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) t.fail("no \"model\" object");
  try {
    const json& model = j["model"];
    if (model.value("type", "") != "BPE") t.fail("model type " + model.value("type", std::string("(none)")) + " is not supported (only BPE)");
    if (model.contains("dropout") && !model["dropout"].is_null()) t.fail("BPE dropout is not supported");
    if (model.value("byte_fallback", false)) t.fail("BPE byte_fallback is not supported (byte-level BPE needs none)");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (model.contains(key) && !model[key].is_null() && model[key] != "") t.fail(std::string("BPE ") + key + " is not supported");
    t.ignore_merges = model.value("ignore_merges", false);
    if (!reader.vocab_streamed) t.fail("model.vocab is not an object");
    if (!reader.merges_streamed) t.fail("model.merges is not an array");
    t.bytes_of_id.reserve(2 * t.vocab_bytes.size());
    t.vocab_bytes.for_each([&](int32_t id, uint32_t off, uint32_t len) { t.bytes_of_id[id] = {off, len}; });
    // Merges by id, checked as the tokenizers library checks them when it loads: both sides
    // and what they make must be in the vocabulary.
    t.merges.reserve(reader.merge_pairs.size());
    std::string scratch;
    int32_t rank = 0;
    for (const auto& [left, right] : reader.merge_pairs) {
      const int64_t l = t.id_of_token(left, scratch), r = t.id_of_token(right, scratch);
      const int64_t made = t.id_of_token(left + right, scratch);
      if (l < 0 || r < 0)
        t.fail("merge '" + left + " " + right + "': '" + (l < 0 ? left : right) + "' is not in the vocabulary");
      if (made < 0) t.fail("merge '" + left + " " + right + "': what it makes, '" + left + right + "', is not in the vocabulary");
      t.merges.insert(static_cast<int32_t>(l), static_cast<int32_t>(r), {rank++, static_cast<int32_t>(made)});
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
      for (size_t i = 0; i < t.added.size(); ++i) {
        t.added_by_id[t.added[i].id] = i;
        t.added_by_first_byte[static_cast<uint8_t>(t.added[i].content[0])].push_back(static_cast<uint32_t>(i));
      }
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
      HP_CHECK_T(c10::ValueError, false, "hyper_parallel::qwen3::Tokenizer::decode: token ", id, " '", odd->second, "' is not byte-level");
    HP_CHECK_T(c10::ValueError, false, "hyper_parallel::qwen3::Tokenizer::decode: id ", id, " is not in the vocabulary");
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

}  // namespace qwen3
}  // namespace hyper_parallel
