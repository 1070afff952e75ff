#include <hyper_parallel/checkpoint/sharded_checkpoint.h>
#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/nn/module.h>
#include <hyper_parallel/runtime/errors.h>
#include <hyper_parallel/runtime/program.h>
#include <hyper_parallel/runtime/fault_injection.h>
#include <hyper_parallel/runtime/collectives.h>
#include <hyper_parallel/runtime/control.h>
#include <hyper_parallel/runtime/process_group.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <exception>
#include <future>

#include "checkpoint_files.h"
#include "checkpoint_layout.h"
#include "sharded_entries.h"

namespace hyper_parallel {
using namespace checkpoint_layout;  // the layout and the steps save and load share

std::string checkpoint_generation_dir(const std::string& dir) { return gen_dir(dir, read_latest(dir).seq); }

namespace {

// Step 1 on rank 0: clears generations that never committed and opens the next one beside the
// committed one.
Generation open_generation(const std::string& dir, const char* what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  TORCH_CHECK(!ec, "hyper_parallel::", what, ": cannot create ", dir, ": ", ec.message());
  // A LATEST that cannot be read (damaged, or of an older format) is refused: taking it for "no
  // checkpoint" would remove every generation as uncommitted.
  const int64_t committed = cf::file_size(dir + "/LATEST") >= 0 ? read_latest(dir).seq : 0;
  for (int64_t g : generations(dir))
    if (g > committed) cf::remove_tree(gen_dir(dir, g));
  const auto gens = generations(dir);
  Generation gen;
  gen.seq = std::max(committed, gens.empty() ? int64_t{0} : gens.back()) + 1;
  gen.id = random_id();
  TORCH_CHECK(std::filesystem::create_directory(gen_dir(dir, gen.seq), ec) && !ec, "hyper_parallel::", what, ": cannot create ",
              gen_dir(dir, gen.seq), ": ", ec.message());
  return gen;
}

// Rank 0's generation number and id, on every rank.
Generation broadcast_generation(Generation gen) {
  const auto hdr = control_broadcast(world_group(), {gen.seq, static_cast<int64_t>(gen.id)}, 0);
  return {hdr[0], static_cast<uint64_t>(hdr[1])};
}

// Step 2 on each writing rank: its pieces raw (.bin), each at a multiple of kPieceAlign and its
// crc covering its padding, then the .meta file naming them.
void write_rank_files(const std::vector<Entry>& entries, const std::vector<Piece>& pieces, const std::string& gdir,
                      const Generation& gen, int64_t rank, int64_t step) {
  std::string meta = std::string(kMagic) + "\nid " + hex(gen.id) + "\nrank " + std::to_string(rank) + "\n";
  for (const auto& e : entries) meta += tensor_line_of(e);
  cf::FileWriter bin(rank_file(gdir, rank, ".bin"));
  static const char zeros[kPieceAlign] = {};
  std::vector<at::Tensor> data;
  for (const auto& p : pieces) data.push_back(p.data.contiguous().cpu());
  const auto padding = [&](size_t k) {
    const int64_t n = static_cast<int64_t>(data[k].nbytes());
    return static_cast<size_t>((kPieceAlign - n % kPieceAlign) % kPieceAlign);
  };
  // The checksums are computed on another thread while the bytes go to the file (the writes wait
  // for the disk): a save then takes about as long as its writes alone.
  auto crcs = std::async(std::launch::async, [&] {
    std::vector<uint32_t> out;
    for (size_t k = 0; k < data.size(); ++k)
      out.push_back(cf::crc32(zeros, padding(k), cf::crc32(data[k].data_ptr(), static_cast<size_t>(data[k].nbytes()))));
    return out;
  });
  std::vector<int64_t> at;
  try {
    for (size_t k = 0; k < data.size(); ++k) {
      at.push_back(bin.size());
      bin.write(data[k].data_ptr(), static_cast<size_t>(data[k].nbytes()));
      bin.write(zeros, padding(k));
    }
  } catch (...) {
    crcs.wait();  // its thread reads `data`: it ends before the error leaves this frame
    throw;
  }
  const std::vector<uint32_t> crc = crcs.get();
  for (size_t k = 0; k < entries.size(); ++k)
    meta += "piece " + entries[k].name + " " + join(pieces[k].offset) + " " + join(data[k].sizes()) + " " + std::to_string(crc[k]) +
            " " + std::to_string(at[k]) + "\n";
  bin.finish();
  fault_point("mid_write", step);
  meta += "bytes " + std::to_string(bin.size()) + "\n";
  cf::write_file(rank_file(gdir, rank, ".meta"), cf::seal(meta));
}

// Step 3 on rank 0: the metadata, then LATEST replaced atomically. Until that rename the
// previous generation is the checkpoint; after it, this one.
void commit_generation(const std::vector<Entry>& entries, const std::string& dir, const Generation& gen, int64_t world) {
  const std::string gdir = gen_dir(dir, gen.seq);
  std::string meta = std::string(kMagic) + "\nid " + hex(gen.id) + "\nworld_size " + std::to_string(world) + "\n";
  for (const auto& e : entries) meta += tensor_line_of(e);
  cf::write_file(gdir + "/metadata", cf::seal(meta));
  cf::sync_dir(gdir);
  write_latest(dir, Latest{gen.seq, gen.id, world});
}

// Step 4 on rank 0: keeps the newest `keep` committed generations (best effort: a failure here
// loses nothing).
void prune_generations(const std::string& dir, int64_t keep, int64_t current) {
  const auto gens = generations(dir);
  for (size_t i = 0; i + static_cast<size_t>(keep) < gens.size(); ++i)
    if (gens[i] < current) cf::remove_tree(gen_dir(dir, gens[i]));
}

}  // namespace

namespace {
// Each step ends with every rank agreeing that every rank succeeded: nobody goes on alone.
std::string on_rank(bool mine, const std::function<void()>& step) {
  std::string err;
  if (mine) {
    try {
      step();
    } catch (const std::exception& e) {
      err = message_of(e);
    }
  }
  return err;
}
}  // namespace

namespace {
// A name goes into the space-separated, line-based metadata: whitespace or a control character
// would split it or end its line, and the generation would commit but never load. Such names are
// refused before anything is written (escaping them would change a format older readers know).
// "" when every name is fine, else what is wrong with the first that is not.
std::string bad_name_error(const std::vector<Entry>& entries) {
  for (const auto& e : entries) {
    if (e.name.empty()) return "an entry has an empty name";
    for (const unsigned char ch : e.name) {
      if (ch > 0x20 && ch != 0x7f) continue;
      return c10::str("the name '", printable(e.name), "' holds ", ch == ' ' ? "a space" : "whitespace or a control character",
                      ", which the checkpoint's line-based metadata cannot hold; rename it (a module registered under such a name, ",
                      "an extra tensor's or a Stateful's key). Nothing was written");
    }
  }
  return "";
}
}  // namespace

PendingSave checkpoint_layout::begin_save(std::vector<Entry> entries, const std::string& dir, int64_t keep, const char* what,
                                          bool every_rank_writes, int64_t step, bool copy) {
  HP_CHECK_T(c10::ValueError, keep >= 1, "hyper_parallel::", what, ": keep must be at least 1, got ", keep);
  PendingSave s;
  bool has_dtensors = false;
  for (const auto& e : entries) has_dtensors = has_dtensors || is_dtensor(e.value);
  s.distributed = is_initialized();
  // Entries without DTensors are the same on every rank: rank 0 writes a 1-rank checkpoint.
  s.rank = s.distributed ? get_rank() : 0;
  s.world = s.distributed && (has_dtensors || every_rank_writes) ? get_world_size() : 1;
  s.dir = dir;
  s.what = what;
  s.keep = keep;
  s.step = step;
  agree(s.distributed, bad_name_error(entries), what, s.unchanged());
  agree(s.distributed, on_rank(s.rank == 0, [&] { s.gen = open_generation(dir, what); }), what, s.unchanged());
  if (s.distributed) s.gen = broadcast_generation(s.gen);
  // Partial values are reduced first: a collective every rank joins before anything can fail.
  for (const auto& e : entries) {
    Piece p = piece_of(e);
    if (copy) p.data = p.data.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
    s.pieces.push_back(std::move(p));
  }
  s.entries = std::move(entries);
  return s;
}

void checkpoint_layout::write_save(PendingSave& s) {
  s.error = on_rank(s.rank < s.world, [&] { write_rank_files(s.entries, s.pieces, gen_dir(s.dir, s.gen.seq), s.gen, s.rank, s.step); });
  s.pieces.clear();  // the host copies, when there are, are not needed any more
  fault_point("mid_save", s.step);
}

void checkpoint_layout::commit_save(PendingSave& s) {
  const std::string gdir = gen_dir(s.dir, s.gen.seq);
  const auto cleanup = [&] {
    if (s.rank == 0) cf::remove_tree(gdir);
  };
  try {
    agree(s.distributed, s.error, s.what, s.unchanged());
  } catch (...) {
    cleanup();
    throw;
  }
  // Every rank has written and agreed; none has replaced LATEST. A rank that fails here (or is
  // killed: HP_FAULT's before_commit) stops the commit, which rank 0 makes only after this
  // second agreement.
  fault_point("before_commit", s.step);
  agree(s.distributed, "", s.what, s.unchanged());
  const std::string err = on_rank(s.rank == 0, [&] { commit_generation(s.entries, s.dir, s.gen, s.world); });
  if (!err.empty()) cleanup();
  agree(s.distributed, err, s.what, s.unchanged());
  if (s.rank == 0) prune_generations(s.dir, s.keep, s.gen.seq);
  if (s.distributed) barrier(world_group());  // the checkpoint is committed when this returns
}

void checkpoint_layout::save_entries(const std::vector<Entry>& entries, const std::string& dir, int64_t keep, const char* what,
                                     bool every_rank_writes, int64_t step) {
  PendingSave s = begin_save(entries, dir, keep, what, every_rank_writes, step, /*copy=*/false);
  write_save(s);
  commit_save(s);
}

void save_sharded(torch::nn::Module& model, const std::string& dir, const SaveOptions& options) {
  require_real_world("save_sharded", "every rank to write its own files and agree on the commit");
  save_entries(entries_of(model), dir, options.keep, "save_sharded", /*every_rank_writes=*/false);
}

namespace {

// Every model entry is in the checkpoint with the same shape and dtype.
void check_entries(const std::vector<Entry>& entries, const Metadata& meta, const std::string& dir, const char* what) {
  for (const auto& e : entries) {
    auto it = meta.tensors.find(e.name);
    HP_CHECK_T(c10::ValueError, it != meta.tensors.end(), "hyper_parallel::", what, ": the checkpoint in ", dir, " has no '", e.name,
               "' (it holds ", meta.tensors.size(), " tensors; is it from another model?)");
    HP_CHECK_T(c10::ValueError, it->second.shape == global_shape_of(e), "hyper_parallel::", what, ": '", e.name, "' has shape ",
               c10::IntArrayRef(it->second.shape), " in the checkpoint but ", c10::IntArrayRef(global_shape_of(e)), " in the model");
    HP_CHECK_T(c10::ValueError, it->second.dtype == static_cast<int64_t>(e.value.scalar_type()), "hyper_parallel::", what, ": '",
               e.name, "' has dtype ", static_cast<at::ScalarType>(it->second.dtype), " in the checkpoint but ",
               e.value.scalar_type(), " in the model");
  }
}

// One region this rank reads: of saved `piece`, the box [lo, lo + len) (global coordinates)
// into entry `entry`, whose local shard starts at `target_offset`.
struct Read {
  size_t entry;
  const SavedPiece* piece;
  std::vector<int64_t> lo, len, target_offset;
};

// The regions of the saved pieces that this rank's shards need, each once (pieces of Replicate
// dims repeat on several ranks); throws when they do not cover the shards exactly.
std::vector<Read> plan_reads(const std::vector<Entry>& entries, const std::vector<RankMeta>& ranks, const char* what) {
  // A region several ranks saved (a replicated tensor) is read from this rank's own file when it
  // has one, so that ranks do not all open rank 0's.
  std::map<std::string, std::vector<const SavedPiece*>> by_name;
  const int64_t me = is_initialized() ? get_rank() : 0;
  if (me < static_cast<int64_t>(ranks.size()))
    for (const auto& p : ranks[static_cast<size_t>(me)].pieces) by_name[p.name].push_back(&p);
  for (size_t r = 0; r < ranks.size(); ++r)
    if (static_cast<int64_t>(r) != me)
      for (const auto& p : ranks[r].pieces) by_name[p.name].push_back(&p);
  std::vector<Read> reads;
  for (size_t k = 0; k < entries.size(); ++k) {
    auto [shape, off] = local_box_of(entries[k]);
    int64_t covered = 0;
    std::set<std::vector<int64_t>> seen;  // lo ++ len of the regions taken
    for (const SavedPiece* p : by_name[entries[k].name]) {
      std::vector<int64_t> lo, len;
      if (!intersect(off, shape, p->offset, p->shape, lo, len)) continue;
      std::vector<int64_t> region = lo;
      region.insert(region.end(), len.begin(), len.end());
      if (!seen.insert(region).second) continue;
      covered += c10::multiply_integers(len);
      reads.push_back({k, p, lo, len, off});
    }
    const int64_t want = c10::multiply_integers(shape);
    HP_CHECK_T(c10::ValueError, covered == want || want == 0, "hyper_parallel::", what, ": the pieces saved for '", entries[k].name,
               "' cover ", covered, " of the ", want, " elements this rank needs (the checkpoint's pieces overlap ",
               "or leave gaps: corrupt)");
  }
  return reads;
}

// Rank `r`'s .bin file, mapped; its size checked first.
std::shared_ptr<cf::MappedFile> map_rank_file(std::map<int64_t, std::shared_ptr<cf::MappedFile>>& files, int64_t r, const std::string& gdir,
                                               const RankMeta& rm) {
  auto it = files.find(r);
  if (it != files.end()) return it->second;
  const std::string path = rank_file(gdir, r, ".bin");
  const int64_t size = cf::file_size(path);
  if (size != rm.bin_bytes)
    cf::corrupt_file(path, "it has " + std::to_string(size) + " bytes, " + std::to_string(rm.bin_bytes) + " were written");
  return files[r] = std::make_shared<cf::MappedFile>(path, "load_sharded");
}

// Reads and verifies every region into `staged` (one contiguous tensor per entry of `shapes`).
// Each piece's bytes are checked against its crc once; a piece that is the whole of an entry's
// box is staged as a view of the mapped file (the mapping lives as long as the view), so the
// bytes are copied once, into the model, after every rank has verified everything.
void stage_reads(const std::vector<Read>& reads, const std::vector<RankMeta>& ranks, const Metadata& meta, const std::string& gdir,
                 const std::vector<std::vector<int64_t>>& shapes, const std::vector<at::TensorOptions>& options,
                 std::vector<at::Tensor>& staged) {
  std::map<int64_t, std::shared_ptr<cf::MappedFile>> files;
  std::set<const SavedPiece*> verified;
  for (const Read& n : reads) {
    const SavedPiece& p = *n.piece;
    const int64_t r = p.rank;
    const std::string path = rank_file(gdir, r, ".bin");
    const std::string piece = "the piece of '" + p.name + "' at offset [" + join(p.offset) + "]";
    const auto dtype = static_cast<at::ScalarType>(meta.tensors.at(p.name).dtype);
    const auto file = map_rank_file(files, r, gdir, ranks[static_cast<size_t>(r)]);
    const int64_t n_bytes = c10::multiply_integers(p.shape) * static_cast<int64_t>(c10::elementSize(dtype));
    const int64_t padded = (n_bytes + kPieceAlign - 1) / kPieceAlign * kPieceAlign;
    if (p.byte_offset + padded > static_cast<int64_t>(file->size())) cf::corrupt_file(path, piece + " lies beyond the end of the file");
    const char* at = file->data() + p.byte_offset;
    if (verified.insert(&p).second && cf::crc32(at, static_cast<size_t>(padded)) != p.crc)
      cf::corrupt_file(path, "crc does not match for " + piece + " (flipped bytes)");
    at::Tensor saved =
        at::from_blob(const_cast<char*>(at), p.shape, [file](void*) {}, at::TensorOptions().dtype(dtype));
    const bool whole = c10::IntArrayRef(n.len) == c10::IntArrayRef(p.shape) && c10::IntArrayRef(n.len) == c10::IntArrayRef(shapes[n.entry]);
    if (whole && !staged[n.entry].defined() && options[n.entry].device().is_cpu() && options[n.entry].dtype() == dtype) {
      staged[n.entry] = saved;
      continue;
    }
    if (!staged[n.entry].defined()) staged[n.entry] = at::empty(shapes[n.entry], options[n.entry]);
    std::vector<int64_t> src_start(n.lo.size()), dst_start(n.lo.size());
    for (size_t d = 0; d < n.lo.size(); ++d) {
      src_start[d] = n.lo[d] - p.offset[d];
      dst_start[d] = n.lo[d] - n.target_offset[d];
    }
    box(staged[n.entry], dst_start, n.len).copy_(box(saved, src_start, n.len));
  }
  for (size_t k = 0; k < staged.size(); ++k)
    if (!staged[k].defined()) staged[k] = at::empty(shapes[k], options[k]);  // an empty box: nothing to read
}

}  // namespace

SavedIndex checkpoint_layout::read_index(const std::string& dir) { return read_index(dir, read_latest(dir)); }

SavedIndex checkpoint_layout::read_index(const std::string& dir, const Latest& generation) {
  SavedIndex index;
  index.latest = generation;
  index.gdir = gen_dir(dir, index.latest.seq);
  index.meta = read_metadata(index.gdir, index.latest);
  for (int64_t r = 0; r < index.meta.world_size; ++r) index.ranks.push_back(read_rank_meta(index.gdir, r, index.latest, index.meta));
  return index;
}

void checkpoint_layout::check_saved_entries(const SavedIndex& index, const std::vector<Entry>& entries, const std::string& dir,
                                            const char* what) {
  check_entries(entries, index.meta, dir, what);
}

std::vector<at::Tensor> checkpoint_layout::read_entries(const SavedIndex& index, const std::vector<Entry>& entries, const std::string& dir,
                                     const char* what) {
  check_entries(entries, index.meta, dir, what);
  const std::vector<Read> reads = plan_reads(entries, index.ranks, what);
  std::vector<std::vector<int64_t>> shapes;
  std::vector<at::TensorOptions> options;
  for (const auto& e : entries) {
    shapes.push_back(local_box_of(e).first);
    options.push_back(local_tensor(e.value).options());
  }
  std::vector<at::Tensor> staged(entries.size());
  stage_reads(reads, index.ranks, index.meta, index.gdir, shapes, options, staged);
  return staged;
}

void checkpoint_layout::agree_to_load(bool distributed, const std::string& err, const char* what) {
  // All or nothing: every rank learns whether every rank could load, before anyone writes.
  try {
    agree(distributed, err, what, "; no rank loaded anything");
  } catch (const c10::Error& e) {
    HP_CHECK_T(c10::ValueError, false, e.what_without_backtrace());
  }
}

void load_sharded(torch::nn::Module& model, const std::string& dir) {
  require_real_world("load_sharded", "real files written by every rank of a real job");
  const auto entries = entries_of(model);
  std::vector<at::Tensor> staged;
  std::string err;
  try {
    staged = read_entries(read_index(dir), entries, dir, "load_sharded");
  } catch (const std::exception& e) {
    err = message_of(e);
  }
  agree_to_load(is_initialized(), err, "load_sharded");
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < entries.size(); ++k) local_tensor(entries[k].value).copy_(staged[k]);
}

torch::OrderedDict<std::string, at::Tensor> full_state_dict(torch::nn::Module& model) {
  torch::OrderedDict<std::string, at::Tensor> out;
  const bool chief = !is_initialized() || get_rank() == 0;
  for (const auto& e : entries_of(model)) {
    at::Tensor whole = is_dtensor(e.value) ? DTensor(e.value.detach()).full_tensor() : e.value.detach();
    if (chief) out.insert(e.name, whole.clone());
  }
  return out;
}

}  // namespace hyper_parallel
