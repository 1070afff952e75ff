// The checkpoint readers under hostile input, in one process: every truncation and byte flip of a
// real checkpoint's files is refused with c10::ValueError naming the file (never a crash, another
// exception or a model changed halfway), and nonsense values with a valid checksum are rejected
// before anything is allocated for them.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <random>

#include <hyper_parallel/checkpoint/sharded_checkpoint.h>
#include <hyper_parallel/nn/layers.h>

#include "../../../src/checkpoint/checkpoint_files.h"

namespace hp = hyper_parallel;
namespace cf = hyper_parallel::checkpoint_files;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_unit_checkpoint_checkpoint_files_test {
namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

struct Fixture {
  Fixture() : dir(std::filesystem::temp_directory_path() / ("hp_ckpt_unit_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(dir);
    hp::nn::Linear saved(5, 3);
    hp::save_sharded(*saved, dir.string());
    gen = hp::checkpoint_generation_dir(dir.string());
    for (const auto& p : saved->parameters()) values.push_back(p.clone());
  }
  ~Fixture() { std::filesystem::remove_all(dir); }
  std::filesystem::path dir;
  std::string gen;
  std::vector<at::Tensor> values;
};

// Loads into a fresh model; returns the error message ("" when it loaded). Fails the test on a
// model changed by a refused load or an exception of another type.
std::string try_load(const Fixture& f) {
  hp::nn::Linear target(5, 3);
  std::vector<at::Tensor> before;
  for (const auto& p : target->parameters()) before.push_back(p.clone());
  try {
    hp::load_sharded(*target, f.dir.string());
  } catch (const c10::ValueError& e) {
    auto ps = target->parameters();
    for (size_t i = 0; i < ps.size(); ++i) EXPECT_TRUE(at::equal(ps[i], before[i])) << "partially loaded";
    return e.what_without_backtrace();
  }
  auto ps = target->parameters();
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_TRUE(at::equal(ps[i], f.values[i]));
  return "";
}

}  // namespace

TEST(CheckpointFiles, Crc32MatchesTheStandardCheckValue) {
  EXPECT_EQ(cf::crc32("123456789", 9), 0xCBF43926u);
  EXPECT_EQ(cf::crc32("", 0), 0u);
}

TEST(CheckpointFiles, FuzzedFilesAreRefusedNamingTheFile) {
  Fixture f;
  ASSERT_EQ(try_load(f), "");
  const std::vector<std::string> files = {f.dir.string() + "/LATEST", f.gen + "/metadata", f.gen + "/rank_0.meta",
                                          f.gen + "/rank_0.bin"};
  std::mt19937_64 rng(20261130);
  int refused = 0;
  for (int step = 0; step < 400; ++step) {
    const std::string& path = files[rng() % files.size()];
    const std::string original = read_bytes(path);
    std::string bad = original;
    if (rng() % 2 == 0) {
      bad.resize(rng() % original.size());  // truncated
    } else {
      for (int k = 0, n = 1 + static_cast<int>(rng() % 4); k < n; ++k)
        bad[rng() % bad.size()] ^= static_cast<char>(1 + rng() % 255);  // flipped bits
    }
    write_bytes(path, bad);
    const std::string err = try_load(f);
    write_bytes(path, original);
    ASSERT_FALSE(err.empty()) << "a damaged " << path << " loaded (step " << step << ")";
    const std::string name = std::filesystem::path(path).filename().string();
    EXPECT_NE(err.find(name), std::string::npos) << "step " << step << ": " << err;
    ++refused;
  }
  EXPECT_EQ(refused, 400);
  EXPECT_EQ(try_load(f), "");  // and the restored files still load
}

// Values that parse and carry a valid checksum, but make no sense: rejected by the bounds checks.
TEST(CheckpointFiles, NonsenseWithAValidChecksumIsRejected) {
  Fixture f;
  const std::string latest = f.dir.string() + "/LATEST", meta = f.gen + "/rank_0.meta";
  const std::string latest0 = read_bytes(latest), meta0 = read_bytes(meta);
  auto resealed = [](const std::string& text, const std::string& from, const std::string& to) {
    std::string body = text.substr(0, text.rfind("crc "));
    const size_t at = body.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    body.replace(at, from.size(), to);
    return cf::seal(body);
  };
  struct Case {
    std::string path, original, from, to, words;
  };
  const std::vector<Case> cases = {
      {latest, latest0, "world_size 1", "world_size 100000000", "not an integer in [1, 1048576]"},
      {latest, latest0, "world_size 1", "world_size x1", "'world_size' is 'x1'"},
      {latest, latest0, "generation 1", "generation -3", "'generation'"},
      {meta, meta0, "piece weight 0,0 3,5", "piece weight 0 3,5", "a box of another rank"},
      {meta, meta0, "piece weight 0,0 3,5", "piece weight 0,0 3,9", "lies outside its tensor"},
      {meta, meta0, "piece weight 0,0 3,5", "piece weight 0,zz 3,5", "'piece offset'"},
      {meta, meta0, "piece weight 0,0 3,5", "piece nothing 0,0 3,5", "names no tensor"},
  };
  for (const auto& c : cases) {
    write_bytes(c.path, resealed(c.original, c.from, c.to));
    const std::string err = try_load(f);
    write_bytes(c.path, c.original);
    EXPECT_NE(err.find(c.words), std::string::npos) << c.to << ": " << err;
  }
  EXPECT_EQ(try_load(f), "");
}

}  // namespace t_unit_checkpoint_checkpoint_files_test
