// Row-ranged checkpoint keys (CheckpointKeyMap "name[a:b]"): three projections held as separate
// parameters save as one fused tensor, rows [q ‖ k ‖ v], exactly their concatenation, and load back
// from it into plain tensors and into Colwise shards at every world size; ranges that leave rows
// unclaimed or claim them twice are refused by name, on load and on save, with nothing changed.
#include <gtest/gtest.h>

#include <hyper_parallel/checkpoint/hf_checkpoint.h>
#include <hyper_parallel/checkpoint/safetensors.h>
#include <hyper_parallel/hyper_parallel.h>

#include <cstdlib>
#include <filesystem>

#include "../../common/error_message.h"
#include "../../common/test_util.h"

namespace hp = hyper_parallel;
namespace hnn = hyper_parallel::nn;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_checkpoint_hf_row_ranges_test {
namespace {

struct QkvImpl : hnn::ModuleBase<QkvImpl> {
  QkvImpl() {
    q = register_module("q", hnn::Linear(hnn::LinearOptions(6, 4).bias(false)));
    k = register_module("k", hnn::Linear(hnn::LinearOptions(6, 4).bias(false)));
    v = register_module("v", hnn::Linear(hnn::LinearOptions(6, 8).bias(false)));
    o = register_module("o", hnn::Linear(hnn::LinearOptions(8, 6).bias(false)));
  }
  hnn::Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};
};
HP_MODULE(Qkv);

// q, k and v as rows of one "qkv.weight" [16, 6]; o as itself. `v_rows` moves v's range.
hp::CheckpointKeyMap fused(const std::string& v_rows = "8:16") {
  return [v_rows](const std::string& fqn) -> std::string {
    if (fqn == "q.weight") return "qkv.weight[0:4]";
    if (fqn == "k.weight") return "qkv.weight[4:8]";
    if (fqn == "v.weight") return "qkv.weight[" + v_rows + "]";
    return fqn;
  };
}

// A model seeded alike on every rank, its projections Colwise over every rank when there are several.
Qkv model(uint64_t seed) {
  hp_test::manual_seed(seed);
  Qkv m;
  if (hp::get_world_size() > 1)
    hp::parallelize_module(*m, hp_test::world_mesh(), {{"q", hp::ColwiseParallel()}, {"k", hp::ColwiseParallel()}, {"v", hp::ColwiseParallel()}});
  return m;
}

at::Tensor whole(const at::Tensor& t) { return hp::is_dtensor(t) ? hp::DTensor(t).full_tensor() : t.detach(); }

std::string out_dir(const char* what) {
  const char* root = std::getenv("HP_HF_OUT");
  const std::string base = root != nullptr ? root : std::filesystem::temp_directory_path().string();
  // Not "np<N>_<variant>": those are the checkpoints transformers reads back (hf_transformers_reads_ours).
  return base + "/" + what + "_np" + std::to_string(hp::get_world_size());
}

}  // namespace

TEST(HFCheckpoint, RowRangesSaveOneFusedTensorAndLoadBackIntoShards) {
  Qkv a = model(1);
  const std::string dir = out_dir("row_ranges");
  hp::HFSaveOptions save;
  save.key_map = fused();
  hp::save_hf_checkpoint(*a, dir, save);
  hp::barrier(hp::world_group());
  hp::SafetensorsFile f(dir + "/model.safetensors");
  ASSERT_EQ(f.tensors().size(), 2u) << "qkv.weight and o.weight";
  const at::Tensor want = at::cat({whole(a->q->weight()), whole(a->k->weight()), whole(a->v->weight())}, 0);
  EXPECT_TRUE(at::equal(f.tensor("qkv.weight"), want));
  EXPECT_TRUE(at::equal(f.tensor("o.weight"), whole(a->o->weight())));
  // Into shards of another model (another seed), and into a plain one on this rank alone.
  Qkv b = model(2);
  hp::load_hf_checkpoint(*b, dir, {fused()});
  hp_test::manual_seed(3);
  Qkv c;
  hp::load_hf_checkpoint(*c, dir, {fused()});
  for (const char* name : {"q", "k", "v", "o"}) {
    const at::Tensor expect = whole(a->named_parameters()[std::string(name) + ".weight"]);
    EXPECT_TRUE(at::equal(whole(b->named_parameters()[std::string(name) + ".weight"]), expect)) << name << " (shards)";
    EXPECT_TRUE(at::equal(c->named_parameters()[std::string(name) + ".weight"], expect)) << name << " (plain)";
  }
}

TEST(HFCheckpoint, RowRangesThatDoNotTileTheirTensorAreRefusedByName) {
  Qkv a = model(1);
  const std::string dir = out_dir("row_ranges_refused");
  hp::HFSaveOptions save;
  save.key_map = fused();
  hp::save_hf_checkpoint(*a, dir, save);
  hp::barrier(hp::world_group());
  Qkv b = model(2);
  const at::Tensor before = whole(b->v->weight()).clone();
  // v claims rows 6:14: rows 4:6 twice (with k) and 14:16 by nobody.
  const std::string msg = hp_test::error_message([&] { hp::load_hf_checkpoint(*b, dir, {fused("6:14")}); });
  EXPECT_NE(msg.find("row ranges do not cover each row once: 'qkv.weight' (16 rows; the parameters take 0:4, 4:8, 6:14)"),
            std::string::npos)
      << msg;
  EXPECT_TRUE(at::equal(whole(b->v->weight()), before)) << "nothing loaded";
  // A save whose ranges leave a gap writes nothing.
  save.key_map = fused("9:17");
  const std::string gap = hp_test::error_message([&] { hp::save_hf_checkpoint(*a, out_dir("row_ranges_gap"), save); });
  EXPECT_NE(gap.find("the row ranges of 'qkv.weight' (0:4, 4:8, 9:17) do not cover rows 0:17 once each"), std::string::npos) << gap;
  EXPECT_FALSE(std::filesystem::exists(out_dir("row_ranges_gap") + "/model.safetensors"));
  // A range whose length is not the parameter's rows.
  save.key_map = fused("8:15");
  const std::string len = hp_test::error_message([&] { hp::save_hf_checkpoint(*a, out_dir("row_ranges_len"), save); });
  EXPECT_NE(len.find("maps to rows 8:15 of 'qkv.weight', which is 7 rows"), std::string::npos) << len;
  const std::string bad = hp_test::error_message([&] { hp::load_hf_checkpoint(*b, dir, {fused("8:x")}); });
  EXPECT_NE(bad.find("'qkv.weight[8:x]' ends in ']' but not in a range [a:b] or [:, a:b] with a < b"), std::string::npos) << bad;
  // A range of dim 1 is read, never written: a save names it.
  save.key_map = fused(":, 0:4");
  const std::string cols = hp_test::error_message([&] { hp::save_hf_checkpoint(*a, out_dir("row_ranges_cols"), save); });
  EXPECT_NE(cols.find("maps to a range of dim 1 of 'qkv.weight' ('qkv.weight[:, 0:4]'); a save writes row ranges (dim 0) only"),
            std::string::npos)
      << cols;
  EXPECT_FALSE(std::filesystem::exists(out_dir("row_ranges_cols") + "/model.safetensors"));
}

}  // namespace t_dist_checkpoint_hf_row_ranges_test
