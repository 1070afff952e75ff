#pragma once
// What the tests against transformers' references share (tests/tools/hf_reference.py writes them
// into HP_HF_REF/<variant>/): where they are, their expected tensors and prompts.
#include <gtest/gtest.h>

#include <hyper_parallel/checkpoint/safetensors.h>
#include <hyper_parallel/dtensor/dtensor.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace hp_test {

/// HP_HF_REF when it holds `variant`'s references, else "" (transformers is not installed).
inline std::string hf_reference_dir(const std::string& variant) {
  const char* d = std::getenv("HP_HF_REF");
  if (d == nullptr || !std::filesystem::exists(std::string(d) + "/" + variant + "/expected.safetensors")) return "";
  return d;
}

/// Tensor `name` of `variant_dir`/expected.safetensors.
inline at::Tensor hf_expected(const std::string& variant_dir, const char* name) {
  hyper_parallel::SafetensorsFile f(variant_dir + "/expected.safetensors");
  return f.tensor(name).clone();
}

/// The reference's prompts, without their left padding (Qwen3's `prompt_ids`/`prompt_mask`, or
/// with `prefix` "gen." Qwen3.5's `gen.prompt_ids`/`gen.attention_mask`).
inline std::vector<std::vector<int64_t>> hf_prompts(const std::string& variant_dir, const std::string& prefix = "") {
  const at::Tensor ids = hf_expected(variant_dir, (prefix + "prompt_ids").c_str()),
                   mask = hf_expected(variant_dir, (prefix.empty() ? "prompt_mask" : prefix + "attention_mask").c_str());
  std::vector<std::vector<int64_t>> prompts(static_cast<size_t>(ids.size(0)));
  for (int64_t b = 0; b < ids.size(0); ++b)
    for (int64_t s = 0; s < ids.size(1); ++s)
      if (mask[b][s].item<int64_t>()) prompts[static_cast<size_t>(b)].push_back(ids[b][s].item<int64_t>());
  return prompts;
}

/// max |actual - expected| <= rel * max |expected| (and expected not all zeros), with both in the
/// message: the per-tensor tolerance of the tests against transformers. A DTensor is compared whole.
inline ::testing::AssertionResult near_relative(const at::Tensor& actual, const at::Tensor& expected, double rel) {
  const at::Tensor a = hyper_parallel::is_dtensor(actual) ? hyper_parallel::DTensor(actual).full_tensor() : actual;
  if (a.sizes() != expected.sizes()) return ::testing::AssertionFailure() << "shape " << a.sizes() << " vs " << expected.sizes();
  const double err = (a - expected).abs().max().item<double>(), scale = expected.abs().max().item<double>();
  if (err <= rel * scale && scale > 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |a - b| = " << err << ", max |b| = " << scale;
}

}  // namespace hp_test

/// Declares `dir` (the references' root) or skips the test when they are missing.
#define HP_REQUIRE_HF_REFERENCE(dir, variant)                                                                   \
  const std::string dir = hp_test::hf_reference_dir(variant);                                                  \
  if (dir.empty()) GTEST_SKIP() << "no transformers references (HP_HF_REF unset or empty: transformers is " \
                                   "not installed; scripts/setup.sh installs it)";
