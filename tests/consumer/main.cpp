// Uses the installed headers and libraries the way a user's program does: the collectives of
// HyperParallel::hyper_parallel, and with a checkpoint directory (one that transformers wrote,
// with its expected.safetensors of greedy tokens) the models library: from_pretrained at
// tp = the world, generate, and the tokens compared with transformers'.
// The umbrella header first: it must stand on its own.
#include <hyper_parallel/hyper_parallel.h>
#include <hyper_parallel/models/qwen3/generate.h>
#include <hyper_parallel/models/qwen3/pretrained.h>

#include <ATen/ATen.h>

#include <iostream>

namespace hp = hyper_parallel;

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
    std::vector<std::vector<int64_t>> prompts(static_cast<size_t>(ids.size(0)));
    for (int64_t b = 0; b < ids.size(0); ++b)
      for (int64_t s = 0; s < ids.size(1); ++s)
        if (mask[b][s].item<int64_t>()) prompts[static_cast<size_t>(b)].push_back(ids[b][s].item<int64_t>());
    hp::qwen3::GenerationConfig g;
    g.max_new_tokens = want.size(1);
    const auto result = hp::qwen3::generate(*loaded.model, prompts, g);
    int64_t same = 0, total = 0;
    for (int64_t b = 0; b < want.size(0); ++b)
      for (int64_t t = 0; t < want.size(1); ++t, ++total)
        same += result.tokens[static_cast<size_t>(b)].at(static_cast<size_t>(t)) == want[b][t].item<int64_t>();
    std::cout << "consumer: from_pretrained + generate at tp=" << hp::get_world_size() << ": " << same << " of " << total
              << " greedy tokens equal transformers'\n";
    ok = ok && same == total;
  }
  hp::destroy_process_group();
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  return hp::run_program([&] { return run(argc, argv); });
}
