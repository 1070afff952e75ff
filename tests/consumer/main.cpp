// Uses the installed headers and libraries the way a user's program does: the collectives of
// HyperParallel::hyper_parallel, and with a checkpoint directory (one that transformers wrote,
// with its expected.safetensors of greedy tokens) the models library: from_pretrained at
// tp = the world, generate, and the tokens compared with transformers'; with a second one, a
// Qwen3.5 checkpoint, the same through the Qwen3.5 family.
// The umbrella header first: it must stand on its own.
#include <hyper_parallel/hyper_parallel.h>
#include <hyper_parallel/models/qwen3/generate.h>
#include <hyper_parallel/models/qwen3/pretrained.h>
#include <hyper_parallel/models/qwen3_5/generate.h>
#include <hyper_parallel/models/qwen3_5/pretrained.h>

#include <ATen/ATen.h>

#include <iostream>

namespace hp = hyper_parallel;

namespace {

// The rows of ids [B, S] where mask is set: left-padded prompts back to their own lengths.
std::vector<std::vector<int64_t>> unpadded(const at::Tensor& ids, const at::Tensor& mask) {
  std::vector<std::vector<int64_t>> prompts(static_cast<size_t>(ids.size(0)));
  for (int64_t b = 0; b < ids.size(0); ++b)
    for (int64_t s = 0; s < ids.size(1); ++s)
      if (mask[b][s].item<int64_t>()) prompts[static_cast<size_t>(b)].push_back(ids[b][s].item<int64_t>());
  return prompts;
}

// How many of the generated tokens equal want [B, N].
int64_t same_tokens(const hp::models::GenerationResult& result, const at::Tensor& want) {
  int64_t same = 0;
  for (int64_t b = 0; b < want.size(0); ++b)
    for (int64_t t = 0; t < want.size(1); ++t) same += result.tokens[static_cast<size_t>(b)].at(static_cast<size_t>(t)) == want[b][t].item<int64_t>();
  return same;
}

}  // namespace

int run(int argc, char** argv) {
  hp::init_process_group();
  auto mesh = hp::init_device_mesh("cpu", {hp::get_world_size()}, {"tp"});
  at::Tensor x = at::ones({2});
  hp::all_reduce_(x, hp::ReduceOp::SUM, mesh.get_group());
  std::cout << "consumer ok: " << mesh.to_string() << " sum " << x[0].item<float>() << "\n";
  bool ok = x[0].item<float>() == static_cast<float>(hp::get_world_size());
  if (argc > 1) {
    const std::string dir = argv[1];
    auto loaded = hp::qwen3::from_pretrained(dir, mesh);
    hp::SafetensorsFile expected(dir + "/expected.safetensors");
    const at::Tensor ids = expected.tensor("prompt_ids"), mask = expected.tensor("prompt_mask");
    const at::Tensor want = expected.tensor("generated");
    hp::qwen3::GenerationConfig g;
    g.max_new_tokens = want.size(1);
    const int64_t same = same_tokens(hp::qwen3::generate(*loaded.model, unpadded(ids, mask), g), want), total = want.numel();
    std::cout << "consumer: from_pretrained + generate at tp=" << hp::get_world_size() << ": " << same << " of " << total
              << " greedy tokens equal transformers'\n";
    ok = ok && same == total;
  }
  if (argc > 2) {
    const std::string dir = argv[2];
    auto loaded = hp::qwen3_5::from_pretrained(dir, mesh, at::kFloat, "cpu", /*progress=*/false);
    hp::SafetensorsFile expected(dir + "/expected.safetensors");
    const at::Tensor want = expected.tensor("gen.tokens");
    hp::models::GenerationConfig g;
    g.max_new_tokens = want.size(1);
    const auto result = hp::qwen3_5::generate(*loaded.model, unpadded(expected.tensor("gen.prompt_ids"), expected.tensor("gen.attention_mask")), g);
    const int64_t same = same_tokens(result, want);
    std::cout << "consumer: Qwen3.5 from_pretrained + generate at tp=" << hp::get_world_size() << ": " << same << " of " << want.numel()
              << " greedy tokens equal transformers'\n";
    ok = ok && same == want.numel();
  }
  hp::destroy_process_group();
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  return hp::run_program([&] { return run(argc, argv); });
}
