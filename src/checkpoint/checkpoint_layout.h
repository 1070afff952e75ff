#pragma once
// The on-disk layout of a sharded checkpoint and the steps save and load share (internal):
// generations, LATEST, metadata, per-rank piece lists, the agreement of all ranks on a step.
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <hyper_parallel/runtime/agreement.h>

#include "checkpoint_files.h"

namespace hyper_parallel {
namespace checkpoint_layout {

namespace cf = checkpoint_files;

// v3: each rank's pieces raw in rank_<r>.bin (v2 kept them in a torch archive, rank_<r>.pt).
constexpr const char* kMagic = "hyper_parallel sharded checkpoint v3";
constexpr const char* kMagicV2 = "hyper_parallel sharded checkpoint v2";
// Pieces start at multiples of this in a rank's .bin file; a piece's crc covers its padding too,
// so that every byte of the file is checked.
constexpr int64_t kPieceAlign = 64;
constexpr int64_t kMaxWorld = int64_t{1} << 20;
constexpr int64_t kMaxDims = 64;
constexpr int64_t kMaxExtent = int64_t{1} << 48;
constexpr int64_t kMaxMetaBytes = int64_t{256} << 20;

// One tensor of a checkpoint: a parameter or buffer of the model, a moment of the optimizer, a
// counter. A DTensor is saved as this rank's piece of its global tensor; a plain tensor as the
// whole of it, unless `global_shape` is set: then `value` is the box at `offset` of a tensor of
// that shape (e.g. row r of a [world, n] table holding each rank's random-number state).
struct Entry {
  std::string name;
  at::Tensor value;
  std::vector<int64_t> global_shape = {}, offset = {};
};

// The shape of the tensor `e` is a piece of (what the metadata records).
std::vector<int64_t> global_shape_of(const Entry& e);
// Its "tensor <name> <dtype> <global shape>" line of the metadata and the rank files.
std::string tensor_line_of(const Entry& e);
// This rank's box of it: (local shape, offset).
std::pair<std::vector<int64_t>, std::vector<int64_t>> local_box_of(const Entry& e);

std::vector<Entry> entries_of(torch::nn::Module& model);

std::string join(at::IntArrayRef v);

std::string hex(uint64_t v);

// A fresh random 64-bit id (checkpoint ids, names of directories being written).
uint64_t random_id();

std::string gen_dir(const std::string& dir, int64_t seq);

std::string rank_file(const std::string& gdir, int64_t r, const char* ext);

// This rank's piece of `value`: the local data and its offset in the global tensor.
struct Piece {
  at::Tensor data;
  std::vector<int64_t> offset;
};

Piece piece_of(const Entry& e);

uint64_t parse_id(const cf::Lines& l);

// The committed generation: LATEST names it.
struct Latest {
  int64_t seq = 0;
  uint64_t id = 0;
  int64_t world_size = 0;
};

Latest read_latest(const std::string& dir);
// Replaces dir/LATEST (atomically) with one naming `latest`.
void write_latest(const std::string& dir, const Latest& latest);
// Generation `seq` of `dir` as its own metadata file records it (what LATEST would say of it):
// for a committed generation older than LATEST's. Throws when the file is missing or damaged.
Latest generation_record(const std::string& dir, int64_t seq);


// Generation numbers of the gen_<n> directories in `dir` (not gen_<n>.damaged: those a load found
// damaged and set aside).
std::vector<int64_t> generations(const std::string& dir);
// Sets generation `seq` aside as gen_<seq>.damaged (gen_<seq>.damaged.<k> when that exists), if
// it is still there; never removes anything.
void set_aside_damaged(const std::string& dir, int64_t seq);

struct SavedPiece {
  std::string name;
  int64_t rank;
  std::vector<int64_t> offset, shape;
  uint32_t crc;
  int64_t byte_offset = 0;  // in the rank's .bin file
};

struct TensorMeta {
  std::vector<int64_t> shape;
  int64_t dtype;
};

struct Metadata {
  int64_t world_size = 0;
  std::map<std::string, TensorMeta> tensors;
};

void check_id(const cf::Lines& l, uint64_t id, const std::string& path);

Metadata read_metadata(const std::string& gdir, const Latest& latest);

// The tensors a rank's .meta file declares (a rank may save tensors others do not have, e.g. its
// pipeline stage's parameters): added to `meta`, refused when they contradict it.

struct RankMeta {
  std::vector<SavedPiece> pieces;
  int64_t bin_bytes = 0;  // the .bin file's size
};

RankMeta read_rank_meta(const std::string& gdir, int64_t r, const Latest& latest, Metadata& meta);

// Intersection of boxes [a_off, a_off + a_shape) and [b_off, b_off + b_shape); empty when none.
bool intersect(const std::vector<int64_t>& a_off, const std::vector<int64_t>& a_shape, const std::vector<int64_t>& b_off,
               const std::vector<int64_t>& b_shape, std::vector<int64_t>& lo, std::vector<int64_t>& len);

at::Tensor box(const at::Tensor& t, const std::vector<int64_t>& start, const std::vector<int64_t>& len);


// Every rank's verdict on a step, agreed with one small all_reduce: nobody commits or loads
// alone. On failure every rank raises, naming the failed ranks and the first one's reason.
void agree(bool distributed, const std::string& my_error, const char* what, const std::string& tail);

// What agree exchanges (runtime's gather_verdicts over the world), for a caller that decides by
// more than failed or not. Not distributed: this rank's alone.
Verdicts gather_verdicts(bool distributed, int64_t code, const std::string& my_message);

std::string message_of(const std::exception& e);

}  // namespace checkpoint_layout
}  // namespace hyper_parallel
