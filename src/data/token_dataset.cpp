// The packed, shuffled token dataset read from one global sample counter (token_dataset.h).
#include <hyper_parallel/data/token_dataset.h>

#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

namespace hyper_parallel {
namespace data {

TokenDataset::TokenDataset(const std::string& path, const TokenDatasetOptions& options) : file_(path), options_(options) {
  HP_CHECK_T(c10::ValueError, options.seq_len >= 1, "hyper_parallel::data::TokenDataset: seq_len must be at least 1, got ", options.seq_len);
  HP_CHECK_T(c10::ValueError, options.global_batch >= 1, "hyper_parallel::data::TokenDataset: global_batch must be at least 1, got ",
             options.global_batch);
  const TokenFileInfo& info = file_.info();
  HP_CHECK_T(c10::ValueError, options.model_vocab_size == 0 || info.vocab_size <= options.model_vocab_size, "hyper_parallel::data::TokenDataset: ",
             path, " was tokenized with a vocabulary of ", info.vocab_size, " ids, larger than the model's ", options.model_vocab_size);
  samples_ = (info.num_tokens - 1) / options.seq_len;
  HP_CHECK_T(c10::ValueError, samples_ >= 1, "hyper_parallel::data::TokenDataset: ", path, " holds ", info.num_tokens,
             " tokens, fewer than one sequence of ", options.seq_len, " + 1");
}

int64_t TokenDataset::sample_at(int64_t global_index) {
  const int64_t epoch = global_index / samples_;
  if (epoch != epoch_) {
    // One permutation per epoch, from the seed and the epoch alone: every rank, every layout
    // and every resume draws the same.
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(options_.seed + static_cast<uint64_t>(epoch));
    order_ = at::randperm(samples_, gen, at::kLong);
    epoch_ = epoch;
  }
  return order_.data_ptr<int64_t>()[global_index % samples_];
}

std::pair<at::Tensor, at::Tensor> TokenDataset::next_batch(int64_t dp_rank, int64_t dp_size) {
  HP_CHECK_T(c10::ValueError, dp_size >= 1 && options_.global_batch % dp_size == 0 && dp_rank >= 0 && dp_rank < dp_size,
             "hyper_parallel::data::TokenDataset::next_batch: the global batch of ", options_.global_batch,
             " must split evenly over ", dp_size, " data-parallel ranks (rank ", dp_rank, ")");
  const int64_t rows = options_.global_batch / dp_size, seq = options_.seq_len;
  at::Tensor x = at::empty({rows, seq}, at::kLong), y = at::empty({rows, seq}, at::kLong);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t s = sample_at(consumed_ + dp_rank * rows + r);
    const at::Tensor t = file_.tokens(s * seq, seq + 1);
    x[r].copy_(t.narrow(0, 0, seq));
    y[r].copy_(t.narrow(0, 1, seq));
  }
  consumed_ += options_.global_batch;
  return {x, y};
}

std::map<std::string, at::Tensor> TokenDataset::state_dict() const {
  auto i64 = [](int64_t v) { return at::tensor(v, at::kLong); };
  return {{"consumed_samples", i64(consumed_)},
          {"global_batch", i64(options_.global_batch)},
          {"seq_len", i64(options_.seq_len)},
          {"seed", i64(static_cast<int64_t>(options_.seed))},
          {"num_tokens", i64(file_.info().num_tokens)}};
}

void TokenDataset::check_state_dict(const std::map<std::string, at::Tensor>& state) const {
  const auto now = state_dict();
  for (const auto& [key, value] : now) {
    auto it = state.find(key);
    HP_CHECK_T(c10::ValueError, it != state.end() && it->second.numel() == 1, "hyper_parallel::data::TokenDataset::load_state_dict: the ",
               "saved data state has no '", key, "'");
    if (key == "consumed_samples") continue;
    const int64_t saved = it->second.item<int64_t>(), mine = value.item<int64_t>();
    HP_CHECK_T(c10::ValueError, saved == mine, "hyper_parallel::data::TokenDataset::load_state_dict: ",
               key == "num_tokens" ? "the token file" : key, " was ", saved, key == "num_tokens" ? " tokens" : "", " when the run was saved and is ",
               mine, " now", key == "global_batch" ? " (a resumed run keeps its global batch; the data-parallel degree may change)" : "");
  }
  HP_CHECK_T(c10::ValueError, state.at("consumed_samples").item<int64_t>() >= 0,
             "hyper_parallel::data::TokenDataset::load_state_dict: consumed_samples is negative");
}

void TokenDataset::load_state_dict(const std::map<std::string, at::Tensor>& state) {
  check_state_dict(state);
  consumed_ = state.at("consumed_samples").item<int64_t>();
}

}  // namespace data
}  // namespace hyper_parallel
