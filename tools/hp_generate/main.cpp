// Generates text from an HF checkpoint of Qwen3, Qwen3-MoE or Qwen3.5 (config.json's model_type
// decides), with tensor parallelism under hprun:
//   build/tools/hprun/hprun --nproc-per-node 2 build/tools/hp_generate/hp_generate --model DIR
//       --prompt "Hello" --max-new-tokens 32 [--temperature 0.7 --top-k 50 --top-p 0.9 --seed 1] [--check] [--quiet]
// --prompt may repeat (a batch of prompts of different lengths); --prompt-ids 1,2,3 gives ids.
// --check repeats the generation in one process and exits 1 when the tokens differ.
#include <ATen/ATen.h>

#include <hyper_parallel/hyper_parallel.h>

#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <type_traits>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>

#include <functional>
#include <memory>

#include <hyper_parallel/models/hf_model_type.h>
#include <hyper_parallel/models/qwen3/generate.h>
#include <hyper_parallel/models/qwen3/pretrained.h>
#include <hyper_parallel/models/tokenizer.h>
#include <hyper_parallel/models/qwen3_5/generate.h>
#include <hyper_parallel/models/qwen3_5/pretrained.h>

namespace qwen3 = hyper_parallel::qwen3;
namespace qwen3_5 = hyper_parallel::qwen3_5;

namespace hp = hyper_parallel;

namespace {

struct Args {
  std::string model, device = "cpu", dtype = "float32";
  std::vector<std::string> prompts;
  std::vector<std::vector<int64_t>> prompt_ids;
  qwen3::GenerationConfig gen;
  bool check = false;
  bool quiet = false;  // no load progress
};

constexpr const char* kFlags =
    "flags: --model DIR (--prompt TEXT | --prompt-ids 1,2,3)... --max-new-tokens N [--temperature X --top-k N\n"
    "       --top-p X --seed N] [--dtype float32|bfloat16] [--device cpu|cuda] [--check] [--quiet] [--help]\n";

[[noreturn]] void usage(const std::string& msg) {
  std::cerr << "hp_generate: " << msg << "\n" << kFlags;
  std::exit(2);
}

// The whole of `v` as a number of type T (std::stoll/stoull/stod through `parse`), or the usage.
template <class T, class Parse>
T whole(const std::string& f, const std::string& v, Parse parse) {
  size_t used = 0;
  T x{};
  try {
    x = parse(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size() || (v[0] == '-' && std::is_unsigned<T>::value)) usage(f + " needs a number, got '" + v + "'");
  return x;
}

std::vector<int64_t> parse_ids(const std::string& v) {
  std::vector<int64_t> ids;
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    try {
      ids.push_back(std::stoll(item, &used));
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || ids.back() < 0) usage("--prompt-ids takes comma-separated token ids (integers >= 0), got '" + v + "'");
  }
  return ids;
}

Args parse(int argc, char** argv) {
  Args a;
  a.gen.max_new_tokens = 32;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "--help" || f == "-h") {
      std::cout << "hp_generate: generates text from an HF Qwen3, Qwen3-MoE or Qwen3.5 checkpoint, tensor parallel under hprun\n" << kFlags;
      std::exit(0);
    }
    if (f == "--check") {
      a.check = true;
      continue;
    }
    if (f == "--quiet") {
      a.quiet = true;
      continue;
    }
    if (i + 1 >= argc) usage("flag " + f + " needs a value");
    const std::string v = argv[++i];
    auto ll = [](const std::string& x, size_t* n) { return std::stoll(x, n); };
    auto dd = [](const std::string& x, size_t* n) { return std::stod(x, n); };
    if (f == "--model") a.model = v;
    else if (f == "--prompt") a.prompts.push_back(v);
    else if (f == "--prompt-ids") a.prompt_ids.push_back(parse_ids(v));
    else if (f == "--max-new-tokens") a.gen.max_new_tokens = whole<int64_t>(f, v, ll);
    else if (f == "--temperature") a.gen.temperature = whole<double>(f, v, dd);
    else if (f == "--top-k") a.gen.top_k = whole<int64_t>(f, v, ll);
    else if (f == "--top-p") a.gen.top_p = whole<double>(f, v, dd);
    else if (f == "--seed") a.gen.seed = whole<uint64_t>(f, v, [](const std::string& x, size_t* n) { return std::stoull(x, n); });
    else if (f == "--dtype") a.dtype = v;
    else if (f == "--device") a.device = v;
    else usage("unknown flag " + f);
  }
  // The generation's own checks, here, before anything is loaded.
  if (a.gen.max_new_tokens < 1) usage("--max-new-tokens needs an integer >= 1, got " + std::to_string(a.gen.max_new_tokens));
  if (!(a.gen.temperature >= 0) || !std::isfinite(a.gen.temperature)) usage("--temperature needs a number >= 0");
  if (a.gen.top_k < 0) usage("--top-k needs an integer >= 0 (0: no filter)");
  if (!(a.gen.top_p > 0 && a.gen.top_p <= 1)) usage("--top-p needs a number in (0, 1]");
  if (a.device != "cpu" && a.device != "cuda") usage("--device is cpu or cuda, got '" + a.device + "'");
  if (a.model.empty()) usage("--model DIR is required");
  if (a.prompts.empty() == a.prompt_ids.empty()) usage("give --prompt TEXT or --prompt-ids IDS (either may repeat), not both");
  if (a.dtype != "float32" && a.dtype != "bfloat16") usage("--dtype is float32 or bfloat16, got " + a.dtype);
  return a;
}

// A loaded model of either family, behind what generation needs of it.
struct Loaded {
  std::function<hp::models::GenerationResult(const std::vector<std::vector<int64_t>>&, const hp::models::GenerationConfig&)> generate;
  hp::HFLoadReport load;
  std::vector<int64_t> eos;
  int64_t pad = 0;
  std::string layout;  // what the ranks hold, for the summary line
};

Loaded load(const std::string& dir, const c10::optional<hp::DeviceMesh>& tp, at::ScalarType dtype, const std::string& device, bool progress) {
  const std::string type = hp::models::hf_model_type(dir);
  Loaded out;
  if (hp::models::is_qwen3_5_type(type)) {
    auto p = std::make_shared<qwen3_5::Pretrained>(qwen3_5::from_pretrained(dir, tp, dtype, device, progress));
    out.generate = [p](const auto& prompts, const auto& g) { return qwen3_5::generate(*p->model, prompts, g); };
    out.load = p->load;
    out.eos = p->model->config.eos_token_ids;
    out.pad = p->model->config.pad_token_id.value_or(0);
    int64_t full = 0;
    for (bool f : p->model->config.full_attention) full += f ? 1 : 0;
    out.layout = "Qwen3.5, " + std::to_string(p->model->config.num_layers - full) + " Gated DeltaNet and " + std::to_string(full) +
                 " gated attention layers";
    return out;
  }
  HP_CHECK_T(c10::ValueError, type == "qwen3" || type == "qwen3_moe", "hyper_parallel::hp_generate: ", dir, "/config.json: model_type is \"", type,
             "\"; hp_generate runs \"qwen3\", \"qwen3_moe\", \"qwen3_5_text\" and \"qwen3_5\"");
  auto p = std::make_shared<qwen3::Pretrained>(qwen3::from_pretrained(dir, tp, dtype, device, progress));
  out.generate = [p](const auto& prompts, const auto& g) { return qwen3::generate(*p->model, prompts, g); };
  out.load = p->load;
  out.eos = p->model->config.eos_token_ids;
  out.pad = p->model->config.pad_token_id.value_or(0);
  out.layout = type == "qwen3" ? "Qwen3" : "Qwen3-MoE";
  // A Qwen3-MoE model's experts, as from_pretrained laid them out.
  for (const auto& layer : *p->model->layers) {
    const auto& moe = layer->as<qwen3::DecoderLayerImpl>()->moe;
    if (!moe) continue;
    const hp::nn::ExpertPlacement& pl = moe->experts->placement;
    out.layout += ", " + std::to_string(moe->options.num_experts()) + " experts" +
                  (pl.ep.defined() ? " over ep=" + std::to_string(pl.ep.size())
                   : pl.tp.defined() ? " split by columns over tp=" + std::to_string(pl.tp.size()) : std::string());
    break;
  }
  return out;
}

}  // namespace

int run(int argc, char** argv) {
  const Args a = parse(argc, argv);
  hp::InitOptions init;
  init.device_type = a.device;
  hp::init_process_group(init);
  const bool chief = hp::get_rank() == 0;
  const int64_t world = hp::get_world_size();
  const at::ScalarType dtype = a.dtype == "bfloat16" ? at::kBFloat16 : at::kFloat;
  c10::optional<hp::DeviceMesh> tp;
  if (world > 1) tp = hp::init_device_mesh(a.device, {world}, {"tp"});

  std::vector<std::vector<int64_t>> prompts = a.prompt_ids;
  c10::optional<hyper_parallel::models::Tokenizer> tok;
  const std::string tok_path = a.model + "/tokenizer.json";
  if (std::filesystem::exists(tok_path)) tok = hyper_parallel::models::Tokenizer::from_file(tok_path);
  if (!a.prompts.empty()) {
    HP_CHECK_T(c10::ValueError, tok.has_value(), "hyper_parallel::hp_generate: --prompt needs ", tok_path, "; give --prompt-ids instead");
    for (const auto& p : a.prompts) prompts.push_back(tok->encode(p));
  }
  const Loaded loaded = load(a.model, tp, dtype, a.device, /*progress=*/!a.quiet);
  qwen3::GenerationConfig g = a.gen;
  g.eos_token_ids = loaded.eos;
  g.pad_token_id = loaded.pad;
  const auto result = loaded.generate(prompts, g);
  int rc = 0;
  if (chief) {
    std::printf("hp_generate: %s (%s), tp=%lld, %s; each rank read %.2f MB of the checkpoint for %.2f MB of local shards\n",
                a.model.c_str(), loaded.layout.c_str(), static_cast<long long>(world), a.dtype.c_str(), loaded.load.bytes_read / 1e6,
                loaded.load.local_bytes / 1e6);
    for (size_t b = 0; b < prompts.size(); ++b) {
      if (tok) std::printf("[%zu] %s%s\n", b, a.prompts.empty() ? "" : a.prompts[b].c_str(), tok->decode(result.tokens[b], true).c_str());
      std::printf("[%zu] tokens:", b);
      for (int64_t t : result.tokens[b]) std::printf(" %lld", static_cast<long long>(t));
      std::printf("\n");
    }
    std::printf("prefill: %lld tokens in %.3f s (%.1f tokens/s); decode: %lld steps x %zu sequences in %.3f s (%.1f tokens/s)\n",
                static_cast<long long>(result.prefill_tokens), result.prefill_seconds, result.prefill_tokens / result.prefill_seconds,
                static_cast<long long>(result.decode_steps), prompts.size(), result.decode_seconds,
                result.decode_steps ? result.decode_steps * prompts.size() / result.decode_seconds : 0.0);
  }
  if (a.check) {
    // The same generation in one process, without DTensors: rank 0 compares the tokens.
    if (chief) {
      const auto ref = load(a.model, c10::nullopt, dtype, a.device, /*progress=*/!a.quiet).generate(prompts, g);
      const bool same = ref.tokens == result.tokens;
      std::printf("--check: one process %s the tokens of tp=%lld\n", same ? "gives" : "DOES NOT give", static_cast<long long>(world));
      rc = same ? 0 : 1;
    }
    hp::barrier(hp::world_group());
  }
  hp::destroy_process_group();
  return rc;
}

int main(int argc, char** argv) {
  return hyper_parallel::run_program([&] { return run(argc, argv); });
}
