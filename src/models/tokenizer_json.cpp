#include "tokenizer_impl.h"

namespace hyper_parallel {
namespace models {

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

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  HP_CHECK_T(c10::ValueError, in.good(), "hyper_parallel::models::Tokenizer::from_file: cannot read ", path);
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

}  // namespace models
}  // namespace hyper_parallel
