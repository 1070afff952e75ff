#include <hyper_parallel/checkpoint/sharded_checkpoint.h>
#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/nn/module.h>
#include <hyper_parallel/runtime/errors.h>
#include <hyper_parallel/runtime/process_group.h>

#include <ATen/ATen.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <sys/stat.h>

#include <fstream>
#include <map>
#include <sstream>

namespace hyper_parallel {
namespace {

constexpr const char* kMagic = "hyper_parallel sharded checkpoint v1";

struct Entry {  // one parameter or buffer of the model
  std::string name;
  at::Tensor value;
};

std::vector<Entry> entries_of(torch::nn::Module& model) {
  std::vector<Entry> out;
  for (const auto& [fqn, m] : nn::modules_with_names(model)) {
    const std::string prefix = fqn.empty() ? "" : fqn + ".";
    for (const auto& p : m->named_parameters(false)) out.push_back({prefix + p.key(), p.value()});
    for (const auto& b : m->named_buffers(false))
      if (b.value().defined()) out.push_back({prefix + b.key(), b.value()});
  }
  return out;
}

std::string join(at::IntArrayRef v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s.empty() ? "-" : s;
}

std::vector<int64_t> split_ints(const std::string& s) {
  std::vector<int64_t> out;
  if (s == "-") return out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoll(item));
  return out;
}

std::string rank_file(const std::string& dir, int64_t r, const char* ext) {
  return dir + "/rank_" + std::to_string(r) + ext;
}

int64_t file_size(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

// This rank's piece of `value`: the local data and its offset in the global tensor.
struct Piece {
  at::Tensor data;
  std::vector<int64_t> offset;
};

Piece piece_of(const at::Tensor& value) {
  if (!is_dtensor(value)) return {value.detach(), std::vector<int64_t>(static_cast<size_t>(value.dim()), 0)};
  DTensor d(value);
  if (d.spec().has_partial()) d = d.redistribute(without_partial(d.placements()));  // a Partial has no piece of its own
  return {d.to_local().detach(), d.spec().local_shape_and_offset(*d.device_mesh().get_coordinate()).second};
}

struct SavedPiece {
  std::string name;
  int64_t rank;
  std::vector<int64_t> offset, shape;
};

struct Metadata {
  int64_t world_size = 0;
  std::map<std::string, std::pair<std::vector<int64_t>, int64_t>> tensors;  // name -> (shape, dtype)
};

[[noreturn]] void corrupt(const std::string& path, const std::string& why) {
  throw c10::ValueError(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                        c10::str("load_sharded: checkpoint file ", path, " is truncated or corrupt: ", why));
}

Metadata read_metadata(const std::string& dir) {
  const std::string path = dir + "/metadata";
  std::ifstream in(path);
  HP_CHECK_T(c10::ValueError, in.good(), "load_sharded: ", path, " does not exist (not a sharded checkpoint directory?)");
  std::string line;
  std::getline(in, line);
  if (line != kMagic) corrupt(path, "unexpected header '" + line + "'");
  Metadata m;
  bool ended = false;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string kind;
    ls >> kind;
    if (kind == "world_size") ls >> m.world_size;
    else if (kind == "tensor") {
      std::string name, shape;
      int64_t dtype;
      ls >> name >> dtype >> shape;
      m.tensors[name] = {split_ints(shape), dtype};
    } else if (kind == "end") ended = true;
  }
  if (!ended || m.world_size <= 0) corrupt(path, "it ends early");
  return m;
}

std::vector<SavedPiece> read_rank_meta(const std::string& dir, int64_t r, int64_t& pt_size) {
  const std::string path = rank_file(dir, r, ".meta");
  std::ifstream in(path);
  HP_CHECK_T(c10::ValueError, in.good(), "load_sharded: ", path, " is missing: the checkpoint was written by ",
             "a job whose rank ", r, " did not finish saving, or files were removed");
  std::string line;
  std::getline(in, line);
  if (line != kMagic) corrupt(path, "unexpected header");
  std::vector<SavedPiece> out;
  bool ended = false;
  pt_size = -1;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string kind;
    ls >> kind;
    if (kind == "piece") {
      SavedPiece p;
      std::string off, shape;
      ls >> p.name >> off >> shape;
      p.rank = r;
      p.offset = split_ints(off);
      p.shape = split_ints(shape);
      out.push_back(std::move(p));
    } else if (kind == "bytes") {
      ls >> pt_size;
    } else if (kind == "end") {
      ended = true;
    }
  }
  if (!ended) corrupt(path, "it ends early");
  return out;
}

// Intersection of boxes [a_off, a_off + a_shape) and [b_off, b_off + b_shape); empty when none.
bool intersect(const std::vector<int64_t>& a_off, const std::vector<int64_t>& a_shape, const std::vector<int64_t>& b_off,
               const std::vector<int64_t>& b_shape, std::vector<int64_t>& lo, std::vector<int64_t>& len) {
  lo.resize(a_off.size());
  len.resize(a_off.size());
  for (size_t d = 0; d < a_off.size(); ++d) {
    lo[d] = std::max(a_off[d], b_off[d]);
    const int64_t hi = std::min(a_off[d] + a_shape[d], b_off[d] + b_shape[d]);
    len[d] = hi - lo[d];
    if (len[d] <= 0) return false;
  }
  return true;
}

at::Tensor box(const at::Tensor& t, const std::vector<int64_t>& start, const std::vector<int64_t>& len) {
  at::Tensor v = t;
  for (size_t d = 0; d < start.size(); ++d) v = v.narrow(static_cast<int64_t>(d), start[d], len[d]);
  return v;
}

}  // namespace

void save_sharded(torch::nn::Module& model, const std::string& dir) {
  const auto entries = entries_of(model);
  bool distributed = false;
  for (const auto& e : entries) distributed = distributed || is_dtensor(e.value);
  // A model without DTensors is the same on every rank: rank 0 writes a 1-rank checkpoint.
  const int64_t rank = is_initialized() ? get_rank() : 0;
  const int64_t world = is_initialized() && distributed ? get_world_size() : 1;
  ::mkdir(dir.c_str(), 0755);
  if (rank >= world) {
    barrier(world_group());
    return;
  }
  torch::serialize::OutputArchive archive;
  std::ostringstream meta;
  meta << kMagic << "\n";
  for (const auto& e : entries) {
    Piece p = piece_of(e.value);
    archive.write(e.name, p.data.contiguous(), /*is_buffer=*/true);
    meta << "piece " << e.name << " " << join(p.offset) << " " << join(p.data.sizes()) << "\n";
  }
  const std::string pt = rank_file(dir, rank, ".pt");
  archive.save_to(pt);
  meta << "bytes " << file_size(pt) << "\nend\n";
  std::ofstream(rank_file(dir, rank, ".meta")) << meta.str();
  if (rank == 0) {
    std::ofstream out(dir + "/metadata");
    out << kMagic << "\nworld_size " << world << "\n";
    for (const auto& e : entries)
      out << "tensor " << e.name << " " << static_cast<int64_t>(e.value.scalar_type()) << " " << join(e.value.sizes()) << "\n";
    out << "end\n";
  }
  if (is_initialized()) barrier(world_group());  // the directory is complete when save returns
}

void load_sharded(torch::nn::Module& model, const std::string& dir) {
  const Metadata meta = read_metadata(dir);
  const auto entries = entries_of(model);
  // 1. Keys, shapes and dtypes.
  for (const auto& e : entries) {
    auto it = meta.tensors.find(e.name);
    HP_CHECK_T(c10::ValueError, it != meta.tensors.end(), "load_sharded: the checkpoint in ", dir, " has no '", e.name,
               "' (it holds ", meta.tensors.size(), " tensors; is it from another model?)");
    HP_CHECK_T(c10::ValueError, it->second.first == e.value.sizes().vec(), "load_sharded: '", e.name, "' has shape ",
               c10::IntArrayRef(it->second.first), " in the checkpoint but ", e.value.sizes(), " in the model");
    HP_CHECK_T(c10::ValueError, it->second.second == static_cast<int64_t>(e.value.scalar_type()), "load_sharded: '",
               e.name, "' has dtype ", static_cast<at::ScalarType>(it->second.second), " in the checkpoint but ",
               e.value.scalar_type(), " in the model");
  }
  // 2. The saved pieces, and which of them this rank's shards need.
  std::vector<std::vector<SavedPiece>> pieces(static_cast<size_t>(meta.world_size));
  std::vector<int64_t> pt_sizes(static_cast<size_t>(meta.world_size));
  for (int64_t r = 0; r < meta.world_size; ++r) pieces[static_cast<size_t>(r)] = read_rank_meta(dir, r, pt_sizes[static_cast<size_t>(r)]);
  struct Need {
    size_t entry;
    SavedPiece piece;
    std::vector<int64_t> lo, len;
  };
  std::vector<Need> needs;
  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> targets(entries.size());
  for (size_t k = 0; k < entries.size(); ++k) {
    const at::Tensor& v = entries[k].value;
    std::vector<int64_t> off(static_cast<size_t>(v.dim()), 0), shape = v.sizes().vec();
    if (is_dtensor(v)) {
      DTensor d(v);
      std::tie(shape, off) = d.spec().local_shape_and_offset(*d.device_mesh().get_coordinate());
    }
    targets[k] = {off, shape};
    int64_t covered = 0, want = 1;
    for (int64_t s : shape) want *= s;
    for (const auto& rank_pieces : pieces)
      for (const auto& p : rank_pieces) {
        if (p.name != entries[k].name) continue;
        std::vector<int64_t> lo, len;
        if (!intersect(off, shape, p.offset, p.shape, lo, len)) continue;
        // Pieces of Replicate dims repeat on several ranks: take each region once.
        bool dup = false;
        for (const auto& n : needs)
          if (n.entry == k && n.lo == lo && n.len == len) dup = true;
        if (dup) continue;
        int64_t n = 1;
        for (int64_t x : len) n *= x;
        covered += n;
        needs.push_back({k, p, lo, len});
      }
    HP_CHECK_T(c10::ValueError, covered == want || want == 0, "load_sharded: the pieces saved for '", entries[k].name,
               "' cover ", covered, " of the ", want, " elements this rank needs (a rank file is missing or the ",
               "checkpoint was written with another world layout)");
  }
  // 3. Read everything needed before writing anything.
  std::map<int64_t, torch::serialize::InputArchive> archives;
  std::vector<at::Tensor> staged(entries.size());
  for (size_t k = 0; k < entries.size(); ++k) {
    const at::Tensor& v = entries[k].value;
    at::Tensor local = is_dtensor(v) ? DTensor(v).to_local() : v;
    staged[k] = at::empty_like(local);
  }
  for (const auto& n : needs) {
    if (!archives.count(n.piece.rank)) {
      const std::string path = rank_file(dir, n.piece.rank, ".pt");
      const int64_t size = file_size(path);
      if (size != pt_sizes[static_cast<size_t>(n.piece.rank)])
        corrupt(path, "it has " + std::to_string(size) + " bytes, " + std::to_string(pt_sizes[static_cast<size_t>(n.piece.rank)]) +
                          " were written");
      try {
        archives[n.piece.rank].load_from(path);
      } catch (const c10::Error& e) {
        corrupt(path, e.what_without_backtrace());
      }
    }
    at::Tensor saved;
    try {
      archives[n.piece.rank].read(n.piece.name, saved, /*is_buffer=*/true);
    } catch (const c10::Error& e) {
      corrupt(rank_file(dir, n.piece.rank, ".pt"), e.what_without_backtrace());
    }
    HP_CHECK_T(c10::ValueError, saved.sizes() == c10::IntArrayRef(n.piece.shape), "load_sharded: the piece of '",
               n.piece.name, "' in rank ", n.piece.rank, "'s file has shape ", saved.sizes(), " but its metadata says ",
               c10::IntArrayRef(n.piece.shape));
    const auto& [off, shape] = targets[n.entry];
    std::vector<int64_t> src_start(n.lo.size()), dst_start(n.lo.size());
    for (size_t d = 0; d < n.lo.size(); ++d) {
      src_start[d] = n.lo[d] - n.piece.offset[d];
      dst_start[d] = n.lo[d] - off[d];
    }
    box(staged[n.entry], dst_start, n.len).copy_(box(saved, src_start, n.len));
  }
  // 4. Write.
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < entries.size(); ++k) {
    const at::Tensor& v = entries[k].value;
    at::Tensor local = is_dtensor(v) ? DTensor(v).to_local() : v;
    local.copy_(staged[k]);
  }
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
