// from_pretrained's memory, measured from /proc in a fresh process: the model is built on meta,
// each rank allocates only its shards and the checkpoint is copied straight into them, so
// anonymous memory grows by the local shard bytes (no whole tensor, no float32 copy of a bf16
// model), and the pages of the checkpoint's files leave the resident set as they are copied.
#include <gtest/gtest.h>

#include <hyper_parallel/checkpoint/safetensors.h>
#include <hyper_parallel/runtime/process_memory.h>

#include <algorithm>
#include <filesystem>

#include "../../common/test_util.h"
#include <hyper_parallel/models/qwen3/pretrained.h>

namespace qwen3 = hyper_parallel::qwen3;

using namespace hp_test;
namespace fs = std::filesystem;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_models_load_memory_test {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

}  // namespace

// The bounds of the issue that introduced meta construction (per rank, RssAnon): at most
// 1.03 x the local shard bytes + 128 MiB while loading, the local shard bytes + 64 MiB after; the
// checkpoint's mapped pages at most its largest file while loading, no mapping afterwards.
TEST(LoadMemoryDist, FromPretrainedAllocatesOnlyLocalShards) {
  const char* ref = std::getenv("HP_HF_REF");
  const std::string dir = ref ? std::string(ref) + "/bf16_memory" : "";
  if (dir.empty() || !fs::exists(dir + "/config.json"))
    GTEST_SKIP() << "no transformers checkpoint (HP_HF_REF unset or transformers not installed)";
  int64_t largest_file = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") largest_file = std::max<int64_t>(largest_file, static_cast<int64_t>(e.file_size()));
  const auto tp = world_mesh();
  const std::string prefix = fs::canonical(dir).string() + "/";
  const int64_t before = hp::resident_anonymous_bytes();
  ASSERT_GT(before, 0) << "/proc/self/status has no RssAnon";
  qwen3::Pretrained loaded;
  int64_t peak_anon = 0, peak_mapped = 0;
  {
    hp::MemoryPeakSampler sampler(prefix);
    loaded = qwen3::from_pretrained(dir, tp, at::kBFloat16);
    sampler.stop();
    peak_anon = sampler.peak_anonymous_bytes();
    peak_mapped = sampler.peak_file_resident_bytes();
  }
  const int64_t after = hp::resident_anonymous_bytes();
  const int64_t local = loaded.load.local_bytes;
  std::printf("rank %lld: local shards %.1f MiB; RssAnon +%.1f MiB at peak, +%.1f MiB after; checkpoint pages resident at "
              "most %.1f MiB (largest file %.1f MiB)\n",
              static_cast<long long>(hp::get_rank()), local / double(kMiB), (peak_anon - before) / double(kMiB),
              (after - before) / double(kMiB), peak_mapped / double(kMiB), largest_file / double(kMiB));
  EXPECT_GE(local, 64 * kMiB) << "the model is too small to tell a whole-model build from a sharded one";
  EXPECT_LE(peak_anon - before, static_cast<int64_t>(1.03 * static_cast<double>(local)) + 128 * kMiB);
  EXPECT_LE(after - before, local + 64 * kMiB);
  EXPECT_LE(peak_mapped, largest_file);
  EXPECT_EQ(hp::file_mappings(prefix).mappings, 0) << "a mapping of the checkpoint is left";
  // The shards hold the checkpoint's values: lm_head's rows of this rank (Colwise).
  const at::Tensor w = hp::DTensor(loaded.model->lm_head->weight()).to_local();
  at::Tensor expected = at::empty_like(w);
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    hp::SafetensorsFile f(e.path().string());
    if (f.find("lm_head.weight")) f.read_box("lm_head.weight", {hp::get_rank() * w.size(0), 0}, expected);
  }
  EXPECT_TRUE(at::equal(w, expected));
}

}  // namespace t_dist_models_load_memory_test
