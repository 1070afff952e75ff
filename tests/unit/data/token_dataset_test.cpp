// Token files and the packed dataset: the ids written are the ids read (uint16 and uint32 files),
// every data-parallel degree reads the same global batches, a resume from the saved counter
// continues exactly (across an epoch boundary, at another degree), and bad files and states are
// refused by name.
#include <gtest/gtest.h>

#include <hyper_parallel/data/token_dataset.h>
#include <hyper_parallel/data/token_file.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "../../common/test_files.h"

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_unit_data_token_dataset_test {
namespace hd = hyper_parallel::data;

struct TempDir {
  TempDir() : path(std::filesystem::temp_directory_path() / ("hp_tokens_" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::filesystem::path path;
};

// Documents of ids 1.. (EOS 0): document d holds d + 3 tokens starting at 10·d.
std::vector<std::vector<int64_t>> documents(int64_t n, int64_t scale = 1) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t d = 0; d < n; ++d) {
    std::vector<int64_t> doc;
    for (int64_t k = 0; k < d + 3; ++k) doc.push_back((10 * d + k) * scale + 1);
    out.push_back(doc);
  }
  return out;
}

std::vector<int64_t> write(const std::string& path, const std::vector<std::vector<int64_t>>& docs, int64_t vocab) {
  hd::TokenFileWriter w(path, vocab, 0);
  std::vector<int64_t> all;
  for (const auto& d : docs) {
    w.append_document(d);
    all.insert(all.end(), d.begin(), d.end());
    all.push_back(0);
  }
  w.close();
  return all;
}

TEST(TokenFile, IdsWrittenAreIdsReadInBothWidths) {
  TempDir dir;
  for (int64_t vocab : {1000, 70000}) {
    const std::string path = dir.file("c" + std::to_string(vocab) + ".tokens");
    const auto all = write(path, documents(20, vocab / 1000), vocab);
    hd::TokenFile f(path);
    EXPECT_EQ(f.info().bytes_per_token, vocab > 65535 ? 4 : 2);
    EXPECT_EQ(f.info().num_tokens, static_cast<int64_t>(all.size()));
    EXPECT_EQ(f.info().num_documents, 20);
    EXPECT_EQ(std::filesystem::file_size(path), 64 + all.size() * static_cast<size_t>(f.info().bytes_per_token));
    const at::Tensor t = f.tokens(0, f.info().num_tokens);
    EXPECT_TRUE(at::equal(t, at::tensor(all, at::kLong))) << vocab;
    EXPECT_EQ(f.info().max_token_id, *std::max_element(all.begin(), all.end()));
  }
}

TEST(TokenFile, BadFilesAreRefusedByName) {
  TempDir dir;
  const std::string path = dir.file("good.tokens");
  write(path, documents(10), 1000);
  const std::string bytes = hp_test::read_bytes(path);
  auto refused = [&](const std::string& content, const std::string& words) {
    const std::string bad = dir.file("bad.tokens");
    hp_test::write_bytes(bad, content);
    try {
      hd::TokenFile f(bad);
      ADD_FAILURE() << "opened, expected: " << words;
    } catch (const c10::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("bad.tokens"), std::string::npos) << e.what();
    }
  };
  refused(bytes.substr(0, bytes.size() - 3), "truncated");
  refused(bytes.substr(0, 40), "fewer than a token file's header");
  refused("not a token file at all, but longer than sixty-four bytes of header for the check.....", "is not a token file");
  std::string dtype = bytes;
  dtype[8] = 3;  // three bytes per token
  refused(dtype, "stores 3 bytes per token");
  // A vocabulary larger than the model's.
  try {
    hd::TokenDataset ds(path, {4, 2, 0, /*model_vocab_size=*/500});
    ADD_FAILURE() << "a 1000-id file was accepted by a 500-id model";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("vocabulary of 1000 ids, larger than the model's 500"), std::string::npos) << e.what();
  }
}

// The rows of `steps` global batches as every data-parallel rank of `dp` reads them, stacked in
// rank order.
std::vector<at::Tensor> batches(hd::TokenDataset& ds, int64_t dp, int64_t steps) {
  std::vector<at::Tensor> out;
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t before = ds.consumed_samples();
    std::vector<at::Tensor> rows;
    for (int64_t r = 0; r < dp; ++r) {
      if (r > 0) ds.load_state_dict([&] {
        auto st = ds.state_dict();
        st["consumed_samples"] = at::tensor(before, at::kLong);
        return st;
      }());
      auto [x, y] = ds.next_batch(r, dp);
      rows.push_back(at::cat({x, y}, 1));
    }
    out.push_back(at::cat(rows, 0));
  }
  return out;
}

TEST(TokenDataset, PackedSamplesShuffledPerEpochAndTheSameAtEveryDataParallelDegree) {
  TempDir dir;
  const std::string path = dir.file("c.tokens");
  const auto all = write(path, documents(12), 1000);  // 12 documents, 138 tokens
  const hd::TokenDatasetOptions o{8, 4, 7, 1000};
  hd::TokenDataset ds(path, o);
  const int64_t n = ds.samples_per_epoch();
  EXPECT_EQ(n, (static_cast<int64_t>(all.size()) - 1) / 8);
  // One epoch and a half: each sample of the first epoch once, labels the inputs shifted by one.
  const auto one = batches(ds, 1, (n + n / 2) / 4);
  std::set<int64_t> firsts;
  int64_t seen = 0;
  for (const auto& b : one)
    for (int64_t r = 0; r < b.size(0); ++r, ++seen) {
      const at::Tensor x = b[r].narrow(0, 0, 8), y = b[r].narrow(0, 8, 8);
      EXPECT_TRUE(at::equal(x.narrow(0, 1, 7), y.narrow(0, 0, 7)));
      // The sample's start in the corpus.
      int64_t start = -1;
      for (int64_t s = 0; s < n; ++s)
        if (at::equal(x, at::tensor(std::vector<int64_t>(all.begin() + s * 8, all.begin() + s * 8 + 8), at::kLong))) start = s;
      ASSERT_GE(start, 0);
      if (seen < n) EXPECT_TRUE(firsts.insert(start).second) << "sample " << start << " twice in one epoch";
    }
  EXPECT_EQ(static_cast<int64_t>(firsts.size()), n);
  // Shuffled: not the file's order.
  EXPECT_FALSE(at::equal(one[0][0].narrow(0, 0, 8), at::tensor(std::vector<int64_t>(all.begin(), all.begin() + 8), at::kLong)) &&
               at::equal(one[0][1].narrow(0, 0, 8), at::tensor(std::vector<int64_t>(all.begin() + 8, all.begin() + 16), at::kLong)));
  // dp = 2 and 4 read the same global batches.
  for (int64_t dp : {2, 4}) {
    hd::TokenDataset other(path, o);
    const auto b = batches(other, dp, static_cast<int64_t>(one.size()));
    for (size_t s = 0; s < one.size(); ++s) EXPECT_TRUE(at::equal(b[s], one[s])) << "dp " << dp << " step " << s;
  }
}

TEST(TokenDataset, ResumedFromItsStateContinuesExactlyAcrossTheEpochBoundary) {
  TempDir dir;
  const std::string path = dir.file("c.tokens");
  write(path, documents(12), 1000);
  const hd::TokenDatasetOptions o{8, 4, 3, 1000};
  hd::TokenDataset ref(path, o);
  const int64_t steps = 2 * ref.samples_per_epoch() / 4 + 1;  // crosses the first epoch's end
  const auto want = batches(ref, 1, steps);
  hd::TokenDataset first(path, o);
  batches(first, 2, 3);
  const auto state = first.state_dict();
  EXPECT_EQ(state.at("consumed_samples").item<int64_t>(), 12);
  hd::TokenDataset resumed(path, o);
  resumed.load_state_dict(state);
  const auto got = batches(resumed, 4, steps - 3);  // at another data-parallel degree
  for (int64_t s = 3; s < steps; ++s) EXPECT_TRUE(at::equal(got[static_cast<size_t>(s - 3)], want[static_cast<size_t>(s)])) << "step " << s;
  // The companion: a state one sample off continues elsewhere.
  auto off = state;
  off["consumed_samples"] = at::tensor(int64_t{13}, at::kLong);
  hd::TokenDataset shifted(path, o);
  shifted.load_state_dict(off);
  EXPECT_FALSE(at::equal(batches(shifted, 1, 1)[0], want[3]));
  // Another global batch is refused by name.
  hd::TokenDataset bigger(path, {8, 8, 3, 1000});
  try {
    bigger.check_state_dict(state);
    ADD_FAILURE() << "a changed global batch was accepted";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("global_batch was 4 when the run was saved and is 8 now"), std::string::npos) << e.what();
  }
}

}  // namespace t_unit_data_token_dataset_test
