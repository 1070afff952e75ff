#pragma once
// The tokenizer's tables and state (internal to the models library): what tokenizer.cpp (encode,
// decode) and tokenizer_json.cpp (reading tokenizer.json) share.
#include <hyper_parallel/models/tokenizer.h>

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
namespace models {

namespace tokenizer_detail {

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

inline const ByteLevel& byte_level() {
  static const ByteLevel table;
  return table;
}

// Onig (which the tokenizers library uses) takes \s as the White_Space property. ICU documents
// its \s as [\t\n\f\r\p{Z}], without U+000B and U+0085 (the ICU 72 of Debian 12 does match
// them); spelled as the property, the split does not depend on which ICU reads it.
inline std::string portable_pattern(const std::string& p) {
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
inline void append_lossy_utf8(const std::string& bytes, std::string& out) {
  scan_utf8(bytes, [&](int32_t b, int32_t e, bool valid) {
    if (valid) out.append(bytes, static_cast<size_t>(b), static_cast<size_t>(e - b));
    else out += "\xEF\xBF\xBD";
  });
}

}  // namespace tokenizer_detail

using namespace tokenizer_detail;

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
    HP_CHECK_T(c10::ValueError, false, "hyper_parallel::models::Tokenizer::from_json: ", origin, ": ", why);
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
      HP_CHECK_T(c10::ValueError, id >= 0, "hyper_parallel::models::Tokenizer::encode: ", origin, ": the vocabulary lacks the token of byte ",
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

}  // namespace models
}  // namespace hyper_parallel
