#pragma once
// A memory-mapped token dataset for pretraining: documents packed into fixed-length sequences,
// their order shuffled per epoch by a seed, read from one global sample counter (Megatron's
// consumed_samples) so that a run resumed at another data-parallel degree sees exactly the samples
// the uninterrupted run would have seen.
//   hp::data::TokenDataset ds("corpus.tokens", {/*seq_len=*/2048, /*global_batch=*/64, /*seed=*/0});
//   auto [x, y] = ds.next_batch(dp_rank, dp_size);   // this rank's rows of the next global batch
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include <hyper_parallel/checkpoint/train_state.h>
#include <hyper_parallel/data/token_file.h>

namespace hyper_parallel {
namespace data {

struct TokenDatasetOptions {
  int64_t seq_len = 0;
  /// Sequences per optimizer step over all data-parallel ranks.
  int64_t global_batch = 0;
  uint64_t seed = 0;
  /// The model's vocabulary: a file whose vocabulary is larger is refused (0: not checked).
  int64_t model_vocab_size = 0;
};

/// Sample i of an epoch is tokens [i·seq_len, i·seq_len + seq_len + 1) of the file (inputs: the
/// first seq_len, labels: the last seq_len; documents run on across sequences, separated by EOS).
/// Epoch e visits the samples in the order of a permutation drawn from seed + e; global sample g
/// is sample g mod n of epoch g / n. next_batch() hands data-parallel rank r of d the rows
/// [r·B/d, (r+1)·B/d) of the next global batch of B and advances the counter by B on every rank.
class TokenDataset : public Stateful {
 public:
  /// c10::ValueError (naming the file or the option) for a bad file, a vocabulary larger than
  /// the model's, seq_len < 1, global_batch < 1, or a file shorter than one sequence.
  TokenDataset(const std::string& path, const TokenDatasetOptions& options);
  /// This rank's rows of the next global batch: (inputs, labels), int64 [B/d, seq_len] each.
  std::pair<at::Tensor, at::Tensor> next_batch(int64_t dp_rank, int64_t dp_size);
  /// Global samples handed out so far (all ranks alike).
  int64_t consumed_samples() const { return consumed_; }
  int64_t samples_per_epoch() const { return samples_; }
  const TokenFileInfo& file_info() const { return file_.info(); }

  /// consumed_samples, global_batch, seq_len, seed and the file's token count.
  std::map<std::string, at::Tensor> state_dict() const override;
  /// Refuses by name a state of another global batch, sequence length, seed or file.
  void check_state_dict(const std::map<std::string, at::Tensor>& state) const override;
  void load_state_dict(const std::map<std::string, at::Tensor>& state) override;

 private:
  int64_t sample_at(int64_t global_index);
  TokenFile file_;
  TokenDatasetOptions options_;
  int64_t samples_ = 0;
  int64_t consumed_ = 0;
  int64_t epoch_ = -1;  // the epoch whose order is cached
  at::Tensor order_;
};

}  // namespace data
}  // namespace hyper_parallel
