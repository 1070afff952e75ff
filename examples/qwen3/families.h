#pragma once
// The two model families the demo trains (--model qwen3 | qwen3_5): what differs between them,
// behind one interface, so that train.cpp runs the same loop, plan and checks for both.
#include <hyper_parallel/hyper_parallel.h>

#include <cstdio>
#include <string>

#include <hyper_parallel/models/qwen3/generate.h>
#include <hyper_parallel/models/qwen3/model.h>
#include <hyper_parallel/models/qwen3/parallelize.h>
#include <hyper_parallel/models/qwen3/pretrained.h>
#include <hyper_parallel/models/qwen3_5/generate.h>
#include <hyper_parallel/models/qwen3_5/model.h>
#include <hyper_parallel/models/qwen3_5/parallelize.h>
#include <hyper_parallel/models/qwen3_5/pretrained.h>

namespace demo {
namespace hp = hyper_parallel;
namespace qwen3 = hyper_parallel::qwen3;
namespace qwen3_5 = hyper_parallel::qwen3_5;

struct Qwen3Family {
  using Config = qwen3::Config;
  using CausalLM = qwen3::CausalLM;
  static Config config(const qwen3::Config& flags) { return flags; }
  static CausalLM stage(const Config& c, int64_t stage, int64_t stages) { return CausalLM(c, qwen3::pipeline_stage_span(c, stage, stages)); }
  static void parallelize_tp(qwen3::CausalLMImpl& m, const hp::DeviceMesh& tp, bool sp, bool lp) { qwen3::parallelize_qwen3_tp(m, tp, sp, lp); }
  // Causal attention only: the head-tail order evens out each rank's work.
  static constexpr bool kCpLoadBalance = true;
  static void parallelize_cp(qwen3::CausalLMImpl& m, const hp::DeviceMesh& cp, const std::string& mode, const std::string&) {
    qwen3::parallelize_qwen3_cp(m, cp, mode, kCpLoadBalance);
  }
  static hp::HFSaveReport save(qwen3::CausalLMImpl& m, const std::string& dir, const std::string& tokenizer) {
    return qwen3::save_pretrained(m, dir, tokenizer);
  }
  // The first prompt's new tokens from `dir`'s checkpoint, with its load report.
  static hp::models::GenerationResult generate(const std::string& dir, const c10::optional<hp::DeviceMesh>& tp, const std::string& device,
                                               const std::vector<int64_t>& prompt, int64_t new_tokens, hp::HFLoadReport& load) {
    auto loaded = qwen3::from_pretrained(dir, tp, at::kFloat, device);
    load = loaded.load;
    hp::models::GenerationConfig g;
    g.max_new_tokens = new_tokens;
    return qwen3::generate(*loaded.model, {prompt}, g);
  }
  static std::string describe(const Config& c) {
    return "qwen3: " + std::to_string(c.num_layers) + " layers, hidden " + std::to_string(c.hidden_size) + ", heads " +
           std::to_string(c.num_heads) + "/" + std::to_string(c.num_kv_heads) + " kv";
  }
};

// Qwen3.5's hybrid layers from the same flags: every 4th layer gated full attention (the last one
// when there are fewer than 4), the others Gated DeltaNet with num_heads / 2 key heads serving
// num_heads value heads of head_dim each.
struct Qwen3_5Family {
  using Config = qwen3_5::Config;
  using CausalLM = qwen3_5::CausalLM;
  static Config config(const qwen3::Config& flags) {
    Config c;
    c.vocab_size = flags.vocab_size;
    c.hidden_size = flags.hidden_size;
    c.intermediate_size = flags.intermediate_size;
    c.num_layers = flags.num_layers;
    c.num_heads = flags.num_heads;
    c.num_kv_heads = flags.num_kv_heads;
    c.head_dim = flags.head_dim;
    c.linear_num_key_heads = std::max<int64_t>(1, flags.num_heads / 2);
    c.linear_num_value_heads = flags.num_heads;
    c.linear_key_head_dim = c.linear_value_head_dim = flags.head_dim;
    c.full_attention.clear();
    for (int64_t i = 0; i < c.num_layers; ++i) c.full_attention.push_back((i + 1) % 4 == 0 || (c.num_layers < 4 && i + 1 == c.num_layers));
    c.tie_word_embeddings = flags.tie_word_embeddings;
    return c;
  }
  static CausalLM stage(const Config& c, int64_t stage, int64_t stages) { return CausalLM(c, qwen3_5::pipeline_stage_span(c, stage, stages)); }
  static void parallelize_tp(qwen3_5::CausalLMImpl& m, const hp::DeviceMesh& tp, bool sp, bool lp) { qwen3_5::parallelize_qwen3_5_tp(m, tp, sp, lp); }
  // The Gated DeltaNet reads the sequence in order: contiguous shards.
  static constexpr bool kCpLoadBalance = false;
  static void parallelize_cp(qwen3_5::CausalLMImpl& m, const hp::DeviceMesh& cp, const std::string& mode, const std::string& linear_mode) {
    qwen3_5::parallelize_qwen3_5_cp(m, cp, linear_mode, mode);
  }
  static hp::HFSaveReport save(qwen3_5::CausalLMImpl& m, const std::string& dir, const std::string& tokenizer) {
    return qwen3_5::save_pretrained(m, dir, tokenizer);
  }
  static hp::models::GenerationResult generate(const std::string& dir, const c10::optional<hp::DeviceMesh>& tp, const std::string& device,
                                               const std::vector<int64_t>& prompt, int64_t new_tokens, hp::HFLoadReport& load) {
    auto loaded = qwen3_5::from_pretrained(dir, tp, at::kFloat, device);
    load = loaded.load;
    hp::models::GenerationConfig g;
    g.max_new_tokens = new_tokens;
    return qwen3_5::generate(*loaded.model, {prompt}, g);
  }
  static std::string describe(const Config& c) {
    int64_t full = 0;
    for (bool f : c.full_attention) full += f ? 1 : 0;
    return "qwen3_5: " + std::to_string(c.num_layers) + " layers (" + std::to_string(c.num_layers - full) + " Gated DeltaNet, " +
           std::to_string(full) + " gated attention), hidden " + std::to_string(c.hidden_size) + ", heads " + std::to_string(c.num_heads) +
           "/" + std::to_string(c.num_kv_heads) + " kv, linear heads " + std::to_string(c.linear_num_key_heads) + " key / " +
           std::to_string(c.linear_num_value_heads) + " value";
  }
};

}  // namespace demo
