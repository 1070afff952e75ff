#pragma once
// The transaction behind save_sharded / load_sharded, over any list of tensors (internal): the
// model's parameters for those, the model, optimizer state and counters for save_train_state.
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "checkpoint_layout.h"

namespace hyper_parallel {
namespace checkpoint_layout {

/// Saves `entries` as one committed generation of `dir` (the protocol of save_sharded), keeping
/// the newest `keep`. With `every_rank_writes`, every rank writes its file even when nothing is a
/// DTensor (its entries may differ from the others'). Collective; errors name `what`. With
/// `step` >= 0 it marks the fault points "mid_save" and "before_commit" of that step.
void save_entries(const std::vector<Entry>& entries, const std::string& dir, int64_t keep, const char* what, bool every_rank_writes,
                  int64_t step = -1);

/// A generation being written: its number and random id (every file of it carries the id).
struct Generation {
  int64_t seq = 0;
  uint64_t id = 0;
};

/// A save in three steps, so that the writing can run on another thread: begin_save (collective:
/// the generation opened, this rank's pieces taken, copied to host memory with `copy`), write_save
/// (this rank's files, no collectives; the outcome kept in `error`), commit_save (collective: the
/// ranks agree, rank 0 commits and prunes).
struct PendingSave {
  std::vector<Entry> entries;
  std::vector<Piece> pieces;
  std::string dir;
  const char* what = "";
  Generation gen;
  int64_t keep = 1, rank = 0, world = 1, step = -1;
  bool distributed = false;
  std::string error;
  std::string unchanged() const { return "; the checkpoint in " + dir + " is unchanged"; }
};
PendingSave begin_save(std::vector<Entry> entries, const std::string& dir, int64_t keep, const char* what, bool every_rank_writes,
                       int64_t step, bool copy);
void write_save(PendingSave& s);
void commit_save(PendingSave& s);

/// The committed generation of `dir`: LATEST, the tensors every rank declared, every rank's pieces.
struct SavedIndex {
  Latest latest;
  std::string gdir;
  Metadata meta;
  std::vector<RankMeta> ranks;
};
SavedIndex read_index(const std::string& dir);
/// The same for `generation` (LATEST's, or an older one's generation_record).
SavedIndex read_index(const std::string& dir, const Latest& generation);

/// Whether every entry is in `index` with its shape and dtype (the model's config, not the files'
/// integrity); throws naming `what` and the first that is not.
void check_saved_entries(const SavedIndex& index, const std::vector<Entry>& entries, const std::string& dir, const char* what);

/// This rank's boxes of `entries` (each must be in `index` with its shape and dtype), read and
/// verified into new tensors; nothing of `entries` is written. Throws naming `what`.
std::vector<at::Tensor> read_entries(const SavedIndex& index, const std::vector<Entry>& entries, const std::string& dir,
                                     const char* what);

/// Every rank's `err` ("" when it could load) agreed; on any failure every rank raises
/// c10::ValueError naming the ranks that failed.
void agree_to_load(bool distributed, const std::string& err, const char* what);

}  // namespace checkpoint_layout
}  // namespace hyper_parallel
