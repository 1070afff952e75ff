// Qwen3 checkpoints written by Hugging Face transformers (tests/tools/hf_reference.py, random
// weights, save_pretrained) loaded into our model at any tp, against transformers' own logits and
// greedy generate() tokens; our saved checkpoints loaded back; bad files and configs refused on
// every rank with the model unchanged.
#include <gtest/gtest.h>

#include <hyper_parallel/checkpoint/hf_checkpoint.h>
#include <hyper_parallel/checkpoint/safetensors.h>
#include <hyper_parallel/runtime/collectives.h>

#include <sys/resource.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include "../../common/test_files.h"
#include "../../common/hf_reference.h"
#include "../../common/test_util.h"
#include <hyper_parallel/models/qwen3/config.h>
#include <hyper_parallel/models/qwen3/generate.h>
#include <hyper_parallel/models/qwen3/model.h>
#include <hyper_parallel/models/qwen3/pretrained.h>

namespace qwen3 = hyper_parallel::qwen3;

using namespace hp_test;
namespace fs = std::filesystem;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_models_hf_qwen3_test {
namespace {

const char* kVariants[] = {"fp32_single", "bf16_sharded_tied", "fp32_sharded_tied"};

#define REQUIRE_REFERENCE(dir) HP_REQUIRE_HF_REFERENCE(dir, "fp32_single")

at::Tensor expected(const std::string& variant_dir, const char* name) { return hp_test::hf_expected(variant_dir, name); }

// Our model from the checkpoint's config.json, in float32, split over every rank.
qwen3::CausalLM parallel_model(const std::string& variant_dir) {
  hp_test::manual_seed(99);  // any init: every parameter is loaded
  return qwen3::build_model(qwen3::load_config(variant_dir + "/config.json"), world_mesh());
}

hp::HFLoadOptions qwen_load() { return {qwen3::hf_key}; }

std::vector<std::vector<int64_t>> prompts_of(const std::string& dir) { return hp_test::hf_prompts(dir); }

std::vector<at::Tensor> snapshot(torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back((hp::is_dtensor(p) ? hp::DTensor(p).full_tensor() : p).detach().clone());
  return out;
}

bool unchanged(torch::nn::Module& m, const std::vector<at::Tensor>& before) {
  const auto now = snapshot(m);
  for (size_t i = 0; i < now.size(); ++i)
    if (!at::equal(now[i], before[i])) return false;
  return true;
}

// A directory every rank sees, removed at the end.
struct Scratch {
  explicit Scratch(const std::string& name) {
    const char* port = std::getenv("MASTER_PORT");
    path = "/tmp/hp_hf_" + std::string(port ? port : "0") + "_" + name;
    if (hp::get_rank() == 0) fs::remove_all(path);
    hp::barrier(hp::world_group());
  }
  ~Scratch() {
    hp::barrier(hp::world_group());
    if (hp::get_rank() == 0) {
      fs::remove_all(path);
      for (const auto& e : fs::directory_iterator("/tmp"))
        if (e.path().string().rfind(path + ".hp-save-", 0) == 0) fs::remove_all(e.path());
    }
  }
  std::string path;
};


// `f` must raise c10::ValueError containing `needle` on this rank (so on every rank).
template <class F>
void expect_value_error(F&& f, const std::string& needle, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": no error";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
  }
}

// The file of a sharded checkpoint that holds `key`, as its index says.
std::string file_of(const std::string& dir, const std::string& key) {
  const std::string text = read_bytes(dir + "/model.safetensors.index.json");
  const size_t at = text.find("\"" + key + "\"");
  EXPECT_NE(at, std::string::npos) << key;
  const size_t q1 = text.find('"', text.find(':', at) + 1), q2 = text.find('"', q1 + 1);
  return text.substr(q1 + 1, q2 - q1 - 1);
}

}  // namespace

TEST(HFQwen3, LogitsMatchTransformers) {
  REQUIRE_REFERENCE(ref);
  for (const char* variant : kVariants) {
    const std::string d = ref + "/" + variant;
    auto model = parallel_model(d);
    const hp::HFLoadReport report = hp::load_hf_checkpoint(*model, d, qwen_load());
    // Each rank read its own slices: the bytes it read are its shards' bytes, in the file's dtype.
    const int64_t file_bytes = std::string(variant).rfind("bf16", 0) == 0 ? 2 : 4;
    EXPECT_EQ(report.bytes_read, report.local_bytes / 4 * file_bytes) << variant;
    at::Tensor logits;
    {
      c10::InferenceMode inference;
      logits = model(expected(d, "input_ids"));
    }
    EXPECT_TRUE(close(logits, expected(d, "logits"), 1e-4, 1e-5)) << variant << " at tp=" << hp::get_world_size();
    if (model->config.tie_word_embeddings)
      EXPECT_TRUE(model->lm_head->weight().is_same(model->embed_tokens->weight())) << variant;
  }
}

// More ranks than KV heads: tp=4 over 2 KV heads, tp=2 and 4 over 1 (MQA). from_pretrained
// replicates the heads (rank r holds head floor(r * kv / tp)); logits and greedy tokens equal
// transformers'; the KV cache holds one head per rank; a save writes each head once (the files
// hold the checkpoint's own k/v_proj tensors).
TEST(HFQwen3, ReplicatedKVHeadsMatchTransformers) {
  REQUIRE_REFERENCE(ref);
  const int64_t tp = hp::get_world_size();
  for (const int64_t kv : {2, 1}) {
    if (tp <= kv) continue;
    SCOPED_TRACE("kv=" + std::to_string(kv) + " tp=" + std::to_string(tp));
    const std::string d = ref + "/fp32_kv" + std::to_string(kv);
    auto loaded = qwen3::from_pretrained(d, world_mesh());
    auto& model = *loaded.model;
    ASSERT_EQ(model.config.num_kv_heads, kv);
    const auto& attn = model.layers[0]->as<qwen3::DecoderLayerImpl>()->self_attn;
    const hp::DTensor k(attn->k_proj->weight());
    EXPECT_EQ(k.device_mesh().shape(), (std::vector<int64_t>{kv, tp / kv}));
    EXPECT_EQ(k.to_local().size(0), model.config.head_dim) << "one KV head per rank";
    // Rank r's rows are KV head floor(r * kv / tp) of the checkpoint.
    hp::SafetensorsFile file(d + "/model.safetensors");
    const int64_t head = hp::get_rank() * kv / tp;
    EXPECT_TRUE(at::equal(k.to_local(), file.tensor("model.layers.0.self_attn.k_proj.weight")
                                            .narrow(0, head * model.config.head_dim, model.config.head_dim)));
    at::Tensor logits;
    {
      c10::InferenceMode inference;
      logits = loaded.model(expected(d, "input_ids"));
    }
    EXPECT_TRUE(close(logits, expected(d, "logits"), 1e-4, 1e-5));
    EXPECT_EQ(model.make_cache(2, 8).keys[0].size(1), 1) << "the KV cache holds this rank's one head";
    const at::Tensor want = expected(d, "generated");
    qwen3::GenerationConfig g;
    g.max_new_tokens = want.size(1);
    const auto result = qwen3::generate(model, prompts_of(d), g);
    for (int64_t b = 0; b < want.size(0); ++b)
      EXPECT_EQ(result.tokens[static_cast<size_t>(b)], std::vector<int64_t>(want[b].data_ptr<int64_t>(), want[b].data_ptr<int64_t>() + want.size(1)))
          << "prompt " << b;
    const char* out_root = std::getenv("HP_HF_OUT");
    ASSERT_NE(out_root, nullptr);
    // Named as the other saves, so transformers reads it too (hf_transformers_reads_ours).
    const std::string out = std::string(out_root) + "/np" + std::to_string(tp) + "_fp32_kv" + std::to_string(kv);
    qwen3::save_pretrained(model, out);
    hp::SafetensorsFile saved(out + "/model.safetensors");
    for (const auto& t : file.tensors())
      EXPECT_TRUE(at::equal(saved.tensor(t.name), file.tensor(t.name))) << t.name << " saved differs from the checkpoint's";
    EXPECT_EQ(saved.tensors().size(), file.tensors().size());
  }
}

TEST(HFQwen3, GreedyGenerateMatchesTransformers) {
  REQUIRE_REFERENCE(ref);
  for (const char* variant : kVariants) {
    const std::string d = ref + "/" + variant;
    auto model = parallel_model(d);
    hp::load_hf_checkpoint(*model, d, qwen_load());
    const at::Tensor want = expected(d, "generated");
    qwen3::GenerationConfig g;
    g.max_new_tokens = want.size(1);
    const auto result = qwen3::generate(*model, prompts_of(d), g);
    ASSERT_EQ(static_cast<int64_t>(result.tokens.size()), want.size(0));
    for (int64_t b = 0; b < want.size(0); ++b)
      EXPECT_EQ(result.tokens[static_cast<size_t>(b)], std::vector<int64_t>(want[b].data_ptr<int64_t>(), want[b].data_ptr<int64_t>() + want.size(1)))
          << variant << " prompt " << b << " at tp=" << hp::get_world_size();
  }
}

TEST(HFQwen3, SampledGenerationIsTheSameOnEveryRankAndInOneProcess) {
  REQUIRE_REFERENCE(ref);
  const std::string d = ref + "/fp32_single";
  auto model = parallel_model(d);
  hp::load_hf_checkpoint(*model, d, qwen_load());
  qwen3::GenerationConfig g;
  g.max_new_tokens = 12;
  g.temperature = 0.8;
  g.top_k = 40;
  g.top_p = 0.9;
  g.seed = 17;
  const auto tp = qwen3::generate(*model, prompts_of(d), g);
  // One process, no DTensors.
  qwen3::CausalLM single(qwen3::load_config(d + "/config.json"));
  hp::load_hf_checkpoint(*single, d, qwen_load());
  const auto one = qwen3::generate(*single, prompts_of(d), g);
  EXPECT_EQ(tp.tokens, one.tokens);
  // Every rank picked the same tokens: rank 0's reach everyone and are compared.
  std::vector<int64_t> mine;
  for (const auto& t : tp.tokens) mine.insert(mine.end(), t.begin(), t.end());
  at::Tensor all = at::tensor(mine, at::kLong);
  at::Tensor from0 = all.clone();
  hp::broadcast_(from0, 0, hp::world_group());
  EXPECT_TRUE(at::equal(all, from0));
}

TEST(HFQwen3, OurCheckpointLoadsBackAndIsLeftForTransformers) {
  REQUIRE_REFERENCE(ref);
  const char* out_root = std::getenv("HP_HF_OUT");
  for (const char* variant : {"fp32_single", "bf16_sharded_tied"}) {
    const std::string d = ref + "/" + variant;
    auto model = parallel_model(d);
    hp::load_hf_checkpoint(*model, d, qwen_load());
    // Kept for the transformers check that runs after this test (hf_transformers_reads_ours).
    const std::string out = out_root ? std::string(out_root) + "/np" + std::to_string(hp::get_world_size()) + "_" + variant
                                     : "/tmp/hp_hf_ours_" + std::to_string(hp::get_world_size()) + "_" + variant;
    hp::HFSaveOptions save{qwen3::hf_key};
    save.max_shard_size = 60'000;  // several files and an index
    save.extra_files["config.json"] = qwen3::config_to_json(model->config);
    if (hp::get_rank() == 0 && fs::exists(out)) fs::remove_all(out);
    const auto written = hp::save_hf_checkpoint(*model, out, save);
    EXPECT_GT(written.files.size(), 1u);
    EXPECT_TRUE(fs::exists(out + "/model.safetensors.index.json"));
    auto back = parallel_model(out);
    hp::load_hf_checkpoint(*back, out, qwen_load());
    const auto a = snapshot(*model), b = snapshot(*back);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << variant << " parameter " << i;
    // Saving again over it replaces the whole checkpoint and keeps the files it does not write.
    if (hp::get_rank() == 0) write_bytes(out + "/tokenizer.json", "{}");
    hp::barrier(hp::world_group());
    save.max_shard_size = int64_t{1} << 40;  // one file now: the old shards and index must go
    hp::save_hf_checkpoint(*model, out, save);
    EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
    EXPECT_FALSE(fs::exists(out + "/model.safetensors.index.json"));
    EXPECT_FALSE(fs::exists(out + "/model-00001-of-00002.safetensors"));
    EXPECT_EQ(read_bytes(out + "/tokenizer.json"), "{}");
    save.max_shard_size = 60'000;
    hp::save_hf_checkpoint(*model, out, save);  // as the transformers check expects it
  }
}

TEST(HFQwen3, CorruptFilesFailOnEveryRankAndLeaveTheModelUnchanged) {
  REQUIRE_REFERENCE(ref);
  Scratch s("corrupt");
  const std::string good = read_bytes(ref + "/fp32_single/model.safetensors");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(good[static_cast<size_t>(i)]);
  const std::string header = good.substr(8, n);
  auto with_header = [&](const std::string& h) { return safetensors_bytes(h, good.substr(8 + n)); };
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string h = header;
    const size_t at = h.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return with_header(h.replace(at, from.size(), to));
  };
  const std::string key = "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[64]";
  ASSERT_NE(header.find(key), std::string::npos) << header.substr(0, 300);
  const std::vector<std::tuple<std::string, std::string, std::string>> cases{
      {"truncated", good.substr(0, good.size() - 100), "end past the data buffer"},
      {"short", good.substr(0, 5), "fewer than the 8-byte header length"},
      {"header_length", std::string("\xff\xff\xff\x00\x00\x00\x00\x00", 8) + good.substr(8), "header length"},
      {"not_json", with_header("{\"model.norm.weight\": [" + header.substr(1)), "not valid JSON"},
      {"dtype", replaced(key, "\"model.norm.weight\":{\"dtype\":\"F31\",\"shape\":[64]"), "dtype 'F31'"},
      {"shape", replaced(key, "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[65]"), "model.norm.weight"},
      {"padded", good + std::string(16, '\0'), "bytes after the header"},
  };
  hp_test::manual_seed(3);
  qwen3::CausalLM model = qwen3::build_model(qwen3::load_config(ref + "/fp32_single/config.json"), world_mesh());
  const auto before = snapshot(*model);
  for (const auto& [name, bytes, needle] : cases) {
    const std::string dir = s.path + "/" + name;
    if (hp::get_rank() == 0) {
      fs::create_directories(dir);
      write_bytes(dir + "/model.safetensors", bytes);
    }
    hp::barrier(hp::world_group());
    expect_value_error([&] { hp::load_hf_checkpoint(*model, dir, qwen_load()); }, needle, name);
    expect_value_error([&] { hp::load_hf_checkpoint(*model, dir, qwen_load()); }, dir + "/model.safetensors", name + " names the file");
    EXPECT_TRUE(unchanged(*model, before)) << name;
  }
  // A file that only one rank finds broken: the others raise too, naming that rank.
  const std::string one = s.path + "/one_rank";
  if (hp::get_rank() == 0) fs::create_directories(one);
  hp::barrier(hp::world_group());
  const std::string victim = one + "/rank_view.safetensors";
  if (hp::get_rank() == hp::get_world_size() - 1) write_bytes(victim, good.substr(0, good.size() - 4));
  else if (hp::get_rank() == 0) write_bytes(victim + ".ok", good);
  hp::barrier(hp::world_group());
  const std::string path = hp::get_rank() == hp::get_world_size() - 1 ? victim : victim + ".ok";
  if (hp::get_world_size() > 1)
    expect_value_error([&] { hp::load_hf_checkpoint(*model, path, qwen_load()); },
                       "rank(s) [" + std::to_string(hp::get_world_size() - 1) + "] failed", "one rank's file");
  EXPECT_TRUE(unchanged(*model, before));
}

TEST(HFQwen3, MismatchedConfigsAndKeysFailOnEveryRankAndLeaveTheModelUnchanged) {
  REQUIRE_REFERENCE(ref);
  const std::string d = ref + "/fp32_single";
  const qwen3::Config good = qwen3::load_config(d + "/config.json");
  auto check = [&](qwen3::Config c, const hp::HFLoadOptions& options, const std::string& needle, const std::string& what) {
    hp_test::manual_seed(4);
    qwen3::CausalLM model = qwen3::build_model(c, world_mesh());
    const auto before = snapshot(*model);
    expect_value_error([&] { hp::load_hf_checkpoint(*model, d, options); }, needle, what);
    EXPECT_TRUE(unchanged(*model, before)) << what;
  };
  qwen3::Config more_layers = good;
  more_layers.num_layers = 3;
  check(more_layers, qwen_load(), "the checkpoint lacks 'model.layers.2.", "a layer the checkpoint lacks");
  qwen3::Config fewer_layers = good;
  fewer_layers.num_layers = 1;
  check(fewer_layers, qwen_load(), "no parameter takes 'model.layers.1.", "keys no parameter takes");
  qwen3::Config wider = good;
  wider.intermediate_size = good.intermediate_size + 4 * hp::get_world_size();
  check(wider, qwen_load(), "model.layers.0.mlp.down_proj.weight' in", "a shape mismatch");
  check(good, {}, "the checkpoint lacks 'embed_tokens.weight'", "no key map");
  // Skipping unexpected keys is the caller's choice.
  hp_test::manual_seed(4);
  qwen3::CausalLM partial = qwen3::build_model(fewer_layers, world_mesh());
  hp::HFLoadOptions lax{qwen3::hf_key, /*strict=*/false};
  EXPECT_EQ(hp::load_hf_checkpoint(*partial, d, lax).tensors, 1 + 11 + 1 + 1);
}

TEST(HFQwen3, ConfigKeysWeDoNotImplementAreRefusedByName) {
  const std::string base = R"({"model_type": "qwen3", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8,
    "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4)";
  EXPECT_EQ(qwen3::config_from_json(base + "}").num_kv_heads, 1);
  const std::vector<std::pair<std::string, std::string>> refused{
      {R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})", "rope_scaling"},
      {R"(, "rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0}})", "rope_type"},
      {R"(, "use_sliding_window": true})", "use_sliding_window"},
      {R"(, "layer_types": ["sliding_attention"]})", "layer_types"},
      {R"(, "attention_bias": true})", "attention_bias"},
      {R"(, "hidden_act": "gelu"})", "hidden_act"},
      {R"(, "torch_dtype": "float8"})", "torch_dtype"},
      {R"(, "model_type": "llama"})", "model_type"},
      {R"(, "vocab_size": "10"})", "vocab_size"},
  };
  for (const auto& [tail, needle] : refused)
    expect_value_error([&] { qwen3::config_from_json(base + tail); }, needle, tail);
  expect_value_error([&] { qwen3::config_from_json("{\"model_type\": \"qwen3\"}"); }, "'vocab_size' is missing", "missing key");
  expect_value_error([&] { qwen3::config_from_json("{"); }, "not valid JSON", "bad JSON");
  // What we write reads back to the same model.
  qwen3::Config c = qwen3::config_from_json(base + R"(, "tie_word_embeddings": true, "eos_token_id": [3, 4]})");
  const qwen3::Config back = qwen3::config_from_json(qwen3::config_to_json(c));
  EXPECT_EQ(back.tie_word_embeddings, true);
  EXPECT_EQ(back.eos_token_ids, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(back.head_dim, 4);
}

TEST(HFQwen3, DiskFullDuringSaveLeavesThePreviousCheckpoint) {
  REQUIRE_REFERENCE(ref);
  Scratch s("full");
  const std::string d = ref + "/fp32_single";
  auto model = parallel_model(d);
  hp::load_hf_checkpoint(*model, d, qwen_load());
  const std::string out = s.path + "/ckpt";
  hp::HFSaveOptions save{qwen3::hf_key};
  save.max_shard_size = 100'000;
  hp::save_hf_checkpoint(*model, out, save);
  const std::string before = read_bytes(out + "/model.safetensors.index.json");
  // Rank 0 reserves every file's space before anyone writes: give it a tiny file-size limit.
  struct rlimit old_limit;
  ::getrlimit(RLIMIT_FSIZE, &old_limit);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  if (hp::get_rank() == 0) {
    struct rlimit small = old_limit;
    small.rlim_cur = 4096;
    ::setrlimit(RLIMIT_FSIZE, &small);
  }
  save.dtype = at::kBFloat16;
  try {
    hp::save_hf_checkpoint(*model, out, save);
    ADD_FAILURE() << "a save on a full disk succeeded";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("File too large"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("is unchanged"), std::string::npos) << e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(read_bytes(out + "/model.safetensors.index.json"), before);
  auto back = parallel_model(d);
  hp::load_hf_checkpoint(*back, out, qwen_load());
  const auto a = snapshot(*model), b = snapshot(*back);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << "parameter " << i;
  for (const auto& e : fs::directory_iterator(s.path)) EXPECT_EQ(e.path().filename(), "ckpt") << "left behind";
}

TEST(HFCheckpoint, LoadsEveryRankBoxOfAnyPlacementsAndCastsPieceByPiece) {
  REQUIRE_REFERENCE(ref);
  // bf16 files, sizes that split unevenly (301, 90); the model in float32.
  const std::string d = ref + "/bf16_uneven";
  qwen3::Config c = qwen3::load_config(d + "/config.json");
  hp_test::manual_seed(8);
  qwen3::CausalLM model(c);
  const int64_t n = hp::get_world_size();
  std::vector<hp::DeviceMesh> meshes{world_mesh()};
  std::vector<std::vector<hp::Placements>> layouts{{{hp::Shard(0)}, {hp::Shard(1)}, {hp::Replicate()}}};
  if (n == 4) {  // and a 2-D mesh: both dims on one tensor dim, or one each
    meshes.push_back(hp::init_device_mesh(test_device_type(), {2, 2}, {"dp", "tp"}));
    layouts.push_back({{hp::Shard(0), hp::Shard(0)}, {hp::Shard(0), hp::Shard(1)}, {hp::Replicate(), hp::Shard(0)}, {hp::Shard(1), hp::Replicate()}});
  }
  size_t k = 0;
  std::vector<std::string> names;
  for (const auto& [fqn, m] : hp::nn::modules_with_names(*model))
    for (const auto& p : m->named_parameters(false)) {
      const size_t mesh = k % meshes.size();
      const auto& options = layouts[mesh];
      hp::Placements pl = options[(k / meshes.size()) % options.size()];
      for (auto& x : pl)
        if (x.is_shard() && x.dim() >= p.value().dim()) x = hp::Shard(0);
      hp::nn::replace_parameter(*m, p.key(), hp::distribute_tensor(p.value().detach(), meshes[mesh], pl));
      names.push_back((fqn.empty() ? "" : fqn + ".") + p.key());
      ++k;
    }
  const auto report = hp::load_hf_checkpoint(*model, d, qwen_load());
  EXPECT_EQ(report.bytes_read * 2, report.local_bytes);  // bf16 read, float32 held: this rank's elements only
  const auto params = model->named_parameters();
  int64_t whole = 0;
  for (const auto& name : names) {
    const at::Tensor& p = params[name];
    whole += p.numel() * 4;
    const hp::SafetensorsFile f(d + "/" + file_of(d, qwen3::hf_key(name)));
    EXPECT_TRUE(at::equal(hp::DTensor(p).full_tensor().cpu(), f.tensor(qwen3::hf_key(name)).to(at::kFloat))) << name;
  }
  if (n > 1) EXPECT_LT(report.local_bytes, whole);  // nobody held the whole model
}

}  // namespace t_dist_models_hf_qwen3_test

#undef REQUIRE_REFERENCE
