#include <hyper_parallel/checkpoint/sharded_checkpoint.h>
#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/nn/module.h>
#include <hyper_parallel/runtime/errors.h>
#include <hyper_parallel/runtime/collectives.h>
#include <hyper_parallel/runtime/process_group.h>

#include <ATen/ATen.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <sstream>

#include "checkpoint_files.h"

namespace hyper_parallel {
namespace {

namespace cf = checkpoint_files;

constexpr const char* kMagic = "hyper_parallel sharded checkpoint v2";
constexpr int64_t kMaxWorld = int64_t{1} << 20;
constexpr int64_t kMaxDims = 64;
constexpr int64_t kMaxExtent = int64_t{1} << 48;
constexpr int64_t kMaxMetaBytes = int64_t{256} << 20;

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

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string gen_dir(const std::string& dir, int64_t seq) { return dir + "/gen_" + std::to_string(seq); }
std::string rank_file(const std::string& gdir, int64_t r, const char* ext) {
  return gdir + "/rank_" + std::to_string(r) + ext;
}

uint32_t tensor_crc(const at::Tensor& t) {
  at::Tensor c = t.contiguous().cpu();
  return cf::crc32(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
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

uint64_t parse_id(const cf::Lines& l) {
  const std::string& id = l.token(l.find("id"), 1, "id");
  char* end = nullptr;
  const uint64_t v = std::strtoull(id.c_str(), &end, 16);
  if (id.size() != 16 || *end != '\0') l.fail("'id' is '" + id + "', not 16 hex digits");
  return v;
}

// The committed generation: LATEST names it.
struct Latest {
  int64_t seq = 0;
  uint64_t id = 0;
  int64_t world_size = 0;
};

Latest read_latest(const std::string& dir) {
  const std::string path = dir + "/LATEST";
  if (cf::file_size(path) < 0) {
    HP_CHECK_T(c10::ValueError, cf::file_size(dir + "/metadata") < 0, "load_sharded: ", dir,
               " holds a checkpoint in an older format (no LATEST); save it again with this version");
    HP_CHECK_T(c10::ValueError, false, "load_sharded: ", dir, " holds no committed checkpoint (", path,
               " is missing: no save into it has finished)");
  }
  cf::Lines l(path, cf::read_file(path, 4096), kMagic);
  Latest out;
  out.seq = l.integer(l.find("generation"), 1, "generation", 1, std::numeric_limits<int64_t>::max());
  out.id = parse_id(l);
  out.world_size = l.integer(l.find("world_size"), 1, "world_size", 1, kMaxWorld);
  return out;
}

int64_t committed_seq(const std::string& dir) {
  try {
    return read_latest(dir).seq;
  } catch (const c10::Error&) {
    return 0;
  }
}

// Generation numbers of the gen_<n> directories in `dir`.
std::vector<int64_t> generations(const std::string& dir) {
  std::vector<int64_t> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("gen_", 0) != 0) continue;
    char* end = nullptr;
    const long long v = std::strtoll(name.c_str() + 4, &end, 10);
    if (*end == '\0' && v > 0) out.push_back(v);
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct SavedPiece {
  std::string name;
  int64_t rank;
  std::vector<int64_t> offset, shape;
  uint32_t crc;
};

struct TensorMeta {
  std::vector<int64_t> shape;
  int64_t dtype;
};

struct Metadata {
  int64_t world_size = 0;
  std::map<std::string, TensorMeta> tensors;
};

void check_id(const cf::Lines& l, uint64_t id, const std::string& path) {
  const uint64_t got = parse_id(l);
  HP_CHECK_T(c10::ValueError, got == id, "load_sharded: ", path, " belongs to checkpoint ", hex(got), ", not to ",
             hex(id), " (the committed one): files of different saves are mixed");
}

Metadata read_metadata(const std::string& gdir, const Latest& latest) {
  const std::string path = gdir + "/metadata";
  cf::Lines l(path, cf::read_file(path, kMaxMetaBytes), kMagic);
  check_id(l, latest.id, path);
  Metadata m;
  m.world_size = l.integer(l.find("world_size"), 1, "world_size", 1, kMaxWorld);
  if (m.world_size != latest.world_size) l.fail("its world_size differs from LATEST's");
  for (size_t i = 1; i < l.size(); ++i) {
    if (l.line(i).empty() || l.line(i)[0] != "tensor") continue;
    TensorMeta t;
    const std::string& name = l.token(i, 1, "tensor name");
    t.dtype = l.integer(i, 2, "tensor dtype", 0, static_cast<int64_t>(at::ScalarType::NumOptions) - 1);
    t.shape = l.integers(i, 3, "tensor shape", 0, kMaxExtent, kMaxDims);
    if (!m.tensors.emplace(name, std::move(t)).second) l.fail("tensor '" + name + "' appears twice");
  }
  return m;
}

struct RankMeta {
  std::vector<SavedPiece> pieces;
  int64_t pt_bytes = 0;
  uint32_t pt_crc = 0;
};

RankMeta read_rank_meta(const std::string& gdir, int64_t r, const Latest& latest, const Metadata& meta) {
  const std::string path = rank_file(gdir, r, ".meta");
  HP_CHECK_T(c10::ValueError, cf::file_size(path) >= 0, "load_sharded: ", path, " is missing: rank ", r,
             " of the job that wrote the checkpoint did not finish, or files were removed");
  cf::Lines l(path, cf::read_file(path, kMaxMetaBytes), kMagic);
  check_id(l, latest.id, path);
  if (l.integer(l.find("rank"), 1, "rank", 0, kMaxWorld) != r) l.fail("it names another rank");
  RankMeta out;
  const size_t b = l.find("bytes");
  out.pt_bytes = l.integer(b, 1, "bytes", 0, std::numeric_limits<int64_t>::max());
  out.pt_crc = static_cast<uint32_t>(l.integer(b, 2, "pt crc", 0, 0xFFFFFFFFll));
  for (size_t i = 1; i < l.size(); ++i) {
    if (l.line(i).empty() || l.line(i)[0] != "piece") continue;
    SavedPiece p;
    p.name = l.token(i, 1, "piece name");
    auto it = meta.tensors.find(p.name);
    if (it == meta.tensors.end()) l.fail("piece '" + p.name + "' names no tensor of the metadata");
    const auto& shape = it->second.shape;
    p.rank = r;
    p.offset = l.integers(i, 2, "piece offset", 0, kMaxExtent, kMaxDims);
    p.shape = l.integers(i, 3, "piece shape", 0, kMaxExtent, kMaxDims);
    p.crc = static_cast<uint32_t>(l.integer(i, 4, "piece crc", 0, 0xFFFFFFFFll));
    if (p.offset.size() != shape.size() || p.shape.size() != shape.size())
      l.fail("piece '" + p.name + "' has a box of another rank than its tensor's " + std::to_string(shape.size()));
    for (size_t d = 0; d < shape.size(); ++d)
      if (p.offset[d] + p.shape[d] > shape[d]) l.fail("piece '" + p.name + "' lies outside its tensor");
    out.pieces.push_back(std::move(p));
  }
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

// A deliberate crash for the fault tests: HP_CHECKPOINT_FAULT=<point>:<rank> kills that rank there.
void fault_point(const char* point, int64_t rank) {
  static const char* spec = std::getenv("HP_CHECKPOINT_FAULT");
  if (spec == nullptr) return;
  const std::string want = std::string(point) + ":" + std::to_string(rank);
  if (want == spec) ::raise(SIGKILL);
}

// Every rank's verdict on a step, agreed with one small all_reduce: nobody commits or loads
// alone. On failure every rank raises, naming the failed ranks and the first one's reason.
void agree(bool distributed, const std::string& my_error, const char* what, const std::string& tail) {
  if (!distributed) {
    TORCH_CHECK(my_error.empty(), what, ": ", my_error, tail);
    return;
  }
  const Group g = world_group();
  const at::Device dev(g.device_type());
  at::Tensor failed = at::zeros({g.size()}, at::kLong);
  failed[g.rank()] = my_error.empty() ? 0 : 1;
  failed = failed.to(dev);
  all_reduce_(failed, ReduceOp::SUM, g);
  failed = failed.cpu();
  std::vector<int64_t> bad;
  for (int64_t r = 0; r < g.size(); ++r)
    if (failed[r].item<int64_t>() != 0) bad.push_back(r);
  if (bad.empty()) return;
  // The first failed rank's message reaches everyone (truncated to 2 KiB).
  constexpr int64_t kMsg = 2048;
  at::Tensor msg = at::zeros({kMsg}, at::kByte);
  if (g.rank() == bad[0]) std::memcpy(msg.data_ptr(), my_error.data(), std::min<size_t>(my_error.size(), kMsg - 1));
  msg = msg.to(dev);
  broadcast_(msg, bad[0], g);
  msg = msg.cpu();
  const std::string first(static_cast<const char*>(msg.data_ptr()));
  TORCH_CHECK(false, what, ": rank(s) ", c10::IntArrayRef(bad), " failed; rank ", bad[0], ": ", first, tail);
}

std::string message_of(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

}  // namespace

std::string checkpoint_generation_dir(const std::string& dir) { return gen_dir(dir, read_latest(dir).seq); }

void save_sharded(torch::nn::Module& model, const std::string& dir, const SaveOptions& options) {
  HP_CHECK_T(c10::ValueError, options.keep >= 1, "save_sharded: keep must be at least 1, got ", options.keep);
  const auto entries = entries_of(model);
  bool has_dtensors = false;
  for (const auto& e : entries) has_dtensors = has_dtensors || is_dtensor(e.value);
  const bool distributed = is_initialized();
  // A model without DTensors is the same on every rank: rank 0 writes a 1-rank checkpoint.
  const int64_t rank = distributed ? get_rank() : 0;
  const int64_t world = distributed && has_dtensors ? get_world_size() : 1;

  // 1. Rank 0 opens a new generation beside the committed one and tells everyone its number and id.
  std::string err;
  int64_t seq = 0;
  uint64_t id = 0;
  if (rank == 0) {
    try {
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      TORCH_CHECK(!ec, "cannot create ", dir, ": ", ec.message());
      const int64_t committed = committed_seq(dir);
      // Leftovers of saves that never committed are not checkpoints: clear them.
      for (int64_t g : generations(dir))
        if (g > committed) cf::remove_tree(gen_dir(dir, g));
      const auto gens = generations(dir);
      seq = std::max(committed, gens.empty() ? int64_t{0} : gens.back()) + 1;
      std::random_device rd;
      id = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
           static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
      TORCH_CHECK(std::filesystem::create_directory(gen_dir(dir, seq), ec) && !ec, "cannot create ",
                  gen_dir(dir, seq), ": ", ec.message());
    } catch (const std::exception& e) {
      err = message_of(e);
    }
  }
  const std::string unchanged = "; the checkpoint in " + dir + " is unchanged";
  agree(distributed, err, "save_sharded", unchanged);
  if (distributed) {
    at::Tensor hdr = at::tensor({seq, static_cast<int64_t>(id)}, at::kLong).to(at::Device(world_group().device_type()));
    broadcast_(hdr, 0, world_group());
    hdr = hdr.cpu();
    seq = hdr[0].item<int64_t>();
    id = static_cast<uint64_t>(hdr[1].item<int64_t>());
  }
  const std::string gdir = gen_dir(dir, seq);

  // 2. Every rank writes its pieces (Partial values are reduced first: a collective every rank
  // joins before anything can fail), with checksums; the .meta file last.
  std::vector<Piece> pieces;
  pieces.reserve(entries.size());
  for (const auto& e : entries) pieces.push_back(piece_of(e.value));
  if (rank < world) {
    try {
      torch::serialize::OutputArchive archive;
      std::string meta = std::string(kMagic) + "\nid " + hex(id) + "\nrank " + std::to_string(rank) + "\n";
      for (size_t k = 0; k < entries.size(); ++k) {
        const at::Tensor data = pieces[k].data.contiguous();
        archive.write(entries[k].name, data, /*is_buffer=*/true);
        meta += "piece " + entries[k].name + " " + join(pieces[k].offset) + " " + join(data.sizes()) + " " +
                std::to_string(tensor_crc(data)) + "\n";
      }
      std::ostringstream bytes;  // serialised in memory: the file writes below are all checked
      archive.save_to(bytes);
      const std::string pt = bytes.str();
      cf::write_file(rank_file(gdir, rank, ".pt"), pt);
      fault_point("after_pt", rank);
      meta += "bytes " + std::to_string(pt.size()) + " " + std::to_string(cf::crc32(pt.data(), pt.size())) + "\n";
      cf::write_file(rank_file(gdir, rank, ".meta"), cf::seal(meta));
    } catch (const std::exception& e) {
      err = message_of(e);
    }
  }
  fault_point("before_agree", rank);
  const auto cleanup = [&] {
    if (rank == 0) cf::remove_tree(gdir);
  };
  try {
    agree(distributed, err, "save_sharded", unchanged);
  } catch (...) {
    cleanup();
    throw;
  }

  // 3. Rank 0 commits: the metadata, then LATEST replaced atomically. Until that rename the
  // previous generation is the checkpoint; after it, this one.
  if (rank == 0) {
    try {
      std::string meta = std::string(kMagic) + "\nid " + hex(id) + "\nworld_size " + std::to_string(world) + "\n";
      for (const auto& e : entries)
        meta += "tensor " + e.name + " " + std::to_string(static_cast<int64_t>(e.value.scalar_type())) + " " +
                join(e.value.sizes()) + "\n";
      cf::write_file(gdir + "/metadata", cf::seal(meta));
      cf::sync_dir(gdir);
      fault_point("before_commit", rank);
      cf::replace_file(dir + "/LATEST", cf::seal(std::string(kMagic) + "\ngeneration " + std::to_string(seq) +
                                                  "\nid " + hex(id) + "\nworld_size " + std::to_string(world) + "\n"));
    } catch (const std::exception& e) {
      err = message_of(e);
      cleanup();
    }
  }
  agree(distributed, err, "save_sharded", unchanged);

  // 4. Prune: keep the newest `keep` committed generations (best effort: a failure here loses
  // nothing).
  if (rank == 0) {
    const auto gens = generations(dir);
    for (size_t i = 0; i + static_cast<size_t>(options.keep) < gens.size(); ++i)
      if (gens[i] < seq) cf::remove_tree(gen_dir(dir, gens[i]));
  }
  if (distributed) barrier(world_group());  // the checkpoint is committed when save returns
}

void load_sharded(torch::nn::Module& model, const std::string& dir) {
  const auto entries = entries_of(model);
  const bool distributed = is_initialized();
  std::vector<at::Tensor> staged(entries.size());
  std::string err;
  try {
    const Latest latest = read_latest(dir);
    const std::string gdir = gen_dir(dir, latest.seq);
    const Metadata meta = read_metadata(gdir, latest);
    // 1. Keys, shapes and dtypes.
    for (const auto& e : entries) {
      auto it = meta.tensors.find(e.name);
      HP_CHECK_T(c10::ValueError, it != meta.tensors.end(), "load_sharded: the checkpoint in ", dir, " has no '", e.name,
                 "' (it holds ", meta.tensors.size(), " tensors; is it from another model?)");
      HP_CHECK_T(c10::ValueError, it->second.shape == e.value.sizes().vec(), "load_sharded: '", e.name, "' has shape ",
                 c10::IntArrayRef(it->second.shape), " in the checkpoint but ", e.value.sizes(), " in the model");
      HP_CHECK_T(c10::ValueError, it->second.dtype == static_cast<int64_t>(e.value.scalar_type()), "load_sharded: '",
                 e.name, "' has dtype ", static_cast<at::ScalarType>(it->second.dtype), " in the checkpoint but ",
                 e.value.scalar_type(), " in the model");
    }
    // 2. The saved pieces, and which of them this rank's shards need.
    std::vector<RankMeta> ranks;
    ranks.reserve(static_cast<size_t>(meta.world_size));
    for (int64_t r = 0; r < meta.world_size; ++r) ranks.push_back(read_rank_meta(gdir, r, latest, meta));
    struct Need {
      size_t entry;
      const SavedPiece* piece;
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
      for (const auto& rm : ranks)
        for (const auto& p : rm.pieces) {
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
          needs.push_back({k, &p, lo, len});
        }
      HP_CHECK_T(c10::ValueError, covered == want || want == 0, "load_sharded: the pieces saved for '", entries[k].name,
                 "' cover ", covered, " of the ", want, " elements this rank needs (the checkpoint's pieces overlap ",
                 "or leave gaps: corrupt)");
    }
    // 3. Read and verify everything needed before writing anything.
    std::map<int64_t, torch::serialize::InputArchive> archives;
    for (size_t k = 0; k < entries.size(); ++k) {
      const at::Tensor& v = entries[k].value;
      at::Tensor local = is_dtensor(v) ? DTensor(v).to_local() : v;
      staged[k] = at::empty_like(local, at::MemoryFormat::Contiguous);
    }
    for (const auto& n : needs) {
      const int64_t r = n.piece->rank;
      const std::string path = rank_file(gdir, r, ".pt");
      auto corrupt = [&](const std::string& why) { cf::corrupt_file(path, why); };
      if (!archives.count(r)) {
        const RankMeta& rm = ranks[static_cast<size_t>(r)];
        const int64_t size = cf::file_size(path);
        if (size != rm.pt_bytes)
          corrupt("it has " + std::to_string(size) + " bytes, " + std::to_string(rm.pt_bytes) + " were written");
        const std::string bytes = cf::read_file(path, rm.pt_bytes);
        if (cf::crc32(bytes.data(), bytes.size()) != rm.pt_crc) corrupt("its crc does not match (flipped bytes)");
        try {
          archives[r].load_from(bytes.data(), bytes.size());
        } catch (const c10::Error& e) {
          corrupt(e.what_without_backtrace());
        }
      }
      at::Tensor saved;
      try {
        archives[r].read(n.piece->name, saved, /*is_buffer=*/true);
      } catch (const c10::Error& e) {
        corrupt(e.what_without_backtrace());
      }
      if (saved.sizes() != c10::IntArrayRef(n.piece->shape) ||
          saved.scalar_type() != static_cast<at::ScalarType>(meta.tensors.at(n.piece->name).dtype))
        corrupt("the piece of '" + n.piece->name + "' has shape " + c10::str(saved.sizes()) + " where its metadata says " +
                c10::str(c10::IntArrayRef(n.piece->shape)));
      if (tensor_crc(saved) != n.piece->crc) corrupt("the crc of the piece of '" + n.piece->name + "' does not match");
      const auto& [off, shape] = targets[n.entry];
      std::vector<int64_t> src_start(n.lo.size()), dst_start(n.lo.size());
      for (size_t d = 0; d < n.lo.size(); ++d) {
        src_start[d] = n.lo[d] - n.piece->offset[d];
        dst_start[d] = n.lo[d] - off[d];
      }
      box(staged[n.entry], dst_start, n.len).copy_(box(saved, src_start, n.len));
    }
  } catch (const std::exception& e) {
    err = message_of(e);
  }
  // 4. All or nothing: every rank learns whether every rank could load, before anyone writes.
  try {
    agree(distributed, err, "load_sharded", "; no rank loaded anything");
  } catch (const c10::Error& e) {
    HP_CHECK_T(c10::ValueError, false, e.what_without_backtrace());
  }
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
