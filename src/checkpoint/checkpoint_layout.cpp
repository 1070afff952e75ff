// The on-disk layout of a sharded checkpoint (see checkpoint_layout.h).
#include "checkpoint_layout.h"

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/nn/module.h>
#include <hyper_parallel/runtime/control.h>
#include <hyper_parallel/runtime/errors.h>
#include <hyper_parallel/runtime/process_group.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <random>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace hyper_parallel {
namespace checkpoint_layout {

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

uint64_t random_id() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
         static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
}

std::string gen_dir(const std::string& dir, int64_t seq) { return dir + "/gen_" + std::to_string(seq); }
std::string rank_file(const std::string& gdir, int64_t r, const char* ext) {
  return gdir + "/rank_" + std::to_string(r) + ext;
}

std::vector<int64_t> global_shape_of(const Entry& e) { return e.global_shape.empty() ? e.value.sizes().vec() : e.global_shape; }

std::string tensor_line_of(const Entry& e) {
  return "tensor " + e.name + " " + std::to_string(static_cast<int64_t>(e.value.scalar_type())) + " " + join(global_shape_of(e)) + "\n";
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> local_box_of(const Entry& e) {
  if (!e.global_shape.empty()) return {e.value.sizes().vec(), e.offset};
  if (!is_dtensor(e.value)) return {e.value.sizes().vec(), std::vector<int64_t>(static_cast<size_t>(e.value.dim()), 0)};
  const DTensor d(e.value);
  return d.spec().local_shape_and_offset(*d.device_mesh().get_coordinate());
}

Piece piece_of(const Entry& e) {
  const at::Tensor& value = e.value;
  if (!e.global_shape.empty()) return {value.detach(), e.offset};
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

Latest read_latest(const std::string& dir) {
  const std::string path = dir + "/LATEST";
  if (cf::file_size(path) < 0) {
    HP_CHECK_T(c10::ValueError, cf::file_size(dir + "/metadata") < 0, "hyper_parallel::load_sharded: ", dir,
               " holds a checkpoint in an older format (no LATEST); save it again with this version");
    HP_CHECK_T(c10::ValueError, false, "hyper_parallel::load_sharded: ", dir, " holds no committed checkpoint (", path,
               " is missing: no save into it has finished)");
  }
  const std::string text = cf::read_file(path, 4096);
  HP_CHECK_T(c10::ValueError, text.rfind(std::string(kMagicV2) + "\n", 0) != 0, "hyper_parallel::load_sharded: ", dir,
             " holds a checkpoint in the v2 format of an earlier hyper_parallel (shards in torch archives); load it with that ",
             "version and save it again with this one");
  cf::Lines l(path, text, kMagic);
  Latest out;
  out.seq = l.integer(l.find("generation"), 1, "generation", 1, std::numeric_limits<int64_t>::max());
  out.id = parse_id(l);
  out.world_size = l.integer(l.find("world_size"), 1, "world_size", 1, kMaxWorld);
  return out;
}

void write_latest(const std::string& dir, const Latest& latest) {
  cf::replace_file(dir + "/LATEST", cf::seal(std::string(kMagic) + "\ngeneration " + std::to_string(latest.seq) + "\nid " +
                                             hex(latest.id) + "\nworld_size " + std::to_string(latest.world_size) + "\n"));
}

Latest generation_record(const std::string& dir, int64_t seq) {
  const std::string path = gen_dir(dir, seq) + "/metadata";
  HP_CHECK_T(c10::ValueError, cf::file_size(path) >= 0, "hyper_parallel::load_train_state: ", path,
             " is missing: generation ", seq, " was never committed, or files were removed");
  cf::Lines l(path, cf::read_file(path, kMaxMetaBytes), kMagic);
  Latest out;
  out.seq = seq;
  out.id = parse_id(l);
  out.world_size = l.integer(l.find("world_size"), 1, "world_size", 1, kMaxWorld);
  return out;
}

void set_aside_damaged(const std::string& dir, int64_t seq) {
  const std::string from = gen_dir(dir, seq);
  std::error_code ec;
  if (!std::filesystem::exists(from, ec)) return;
  std::string to = from + ".damaged";
  for (int k = 2; std::filesystem::exists(to, ec); ++k) to = from + ".damaged." + std::to_string(k);
  // Another rank on the same file system may have renamed it first: only a failure that leaves
  // the generation in place is one.
  if (::rename(from.c_str(), to.c_str()) != 0 && std::filesystem::exists(from, ec))
    cf::os_error("set aside the damaged generation", from, errno);
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

void check_id(const cf::Lines& l, uint64_t id, const std::string& path) {
  const uint64_t got = parse_id(l);
  HP_CHECK_T(c10::ValueError, got == id, "hyper_parallel::load_sharded: ", path, " belongs to checkpoint ", hex(got), ", not to ",
             hex(id), " (the committed one): files of different saves are mixed");
}

namespace {
// A "tensor <name> <dtype> <shape>" line.
std::pair<std::string, TensorMeta> tensor_line(const cf::Lines& l, size_t i) {
  TensorMeta t;
  std::string name = l.token(i, 1, "tensor name");
  t.dtype = l.integer(i, 2, "tensor dtype", 0, static_cast<int64_t>(at::ScalarType::NumOptions) - 1);
  t.shape = l.integers(i, 3, "tensor shape", 0, kMaxExtent, kMaxDims);
  return {std::move(name), std::move(t)};
}
}  // namespace

Metadata read_metadata(const std::string& gdir, const Latest& latest) {
  const std::string path = gdir + "/metadata";
  cf::Lines l(path, cf::read_file(path, kMaxMetaBytes), kMagic);
  check_id(l, latest.id, path);
  Metadata m;
  m.world_size = l.integer(l.find("world_size"), 1, "world_size", 1, kMaxWorld);
  if (m.world_size != latest.world_size) l.fail("its world_size differs from LATEST's");
  for (size_t i = 1; i < l.size(); ++i) {
    if (l.line(i).empty() || l.line(i)[0] != "tensor") continue;
    auto [name, t] = tensor_line(l, i);
    if (!m.tensors.emplace(name, std::move(t)).second) l.fail("tensor '" + name + "' appears twice");
  }
  return m;
}

RankMeta read_rank_meta(const std::string& gdir, int64_t r, const Latest& latest, Metadata& meta) {
  const std::string path = rank_file(gdir, r, ".meta");
  HP_CHECK_T(c10::ValueError, cf::file_size(path) >= 0, "hyper_parallel::load_sharded: ", path, " is missing: rank ", r,
             " of the job that wrote the checkpoint did not finish, or files were removed");
  cf::Lines l(path, cf::read_file(path, kMaxMetaBytes), kMagic);
  check_id(l, latest.id, path);
  if (l.integer(l.find("rank"), 1, "rank", 0, kMaxWorld) != r) l.fail("it names another rank");
  RankMeta out;
  out.bin_bytes = l.integer(l.find("bytes"), 1, "bytes", 0, std::numeric_limits<int64_t>::max());
  for (size_t i = 1; i < l.size(); ++i) {
    if (l.line(i).empty() || l.line(i)[0] != "tensor") continue;
    const auto [name, t] = tensor_line(l, i);
    auto [it, fresh] = meta.tensors.emplace(name, t);
    if (!fresh && (it->second.shape != t.shape || it->second.dtype != t.dtype))
      l.fail("tensor '" + name + "' has another shape or dtype than the metadata gives it");
  }
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
    p.byte_offset = l.integer(i, 5, "piece byte offset", 0, out.bin_bytes);
    if (p.byte_offset % kPieceAlign != 0) l.fail("piece '" + p.name + "' starts at a byte offset that is not aligned");
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

// Every rank's verdict on a step, agreed with one small control exchange: nobody commits or loads
// alone. On failure every rank raises, naming the failed ranks and the first one's reason.
namespace {
// A rank's reason that already names the function ("hyper_parallel::save_sharded: ...") is not
// prefixed with it twice.
std::string without_prefix(const std::string& message, const char* what) {
  const std::string prefix = std::string("hyper_parallel::") + what + ": ";
  return message.rfind(prefix, 0) == 0 ? message.substr(prefix.size()) : message;
}
}  // namespace

Verdicts gather_verdicts(bool distributed, int64_t code, const std::string& my_message) {
  if (distributed) return hyper_parallel::gather_verdicts(world_group(), code, my_message);
  Verdicts v;
  v.codes = {code};
  if (code != 0) {
    v.first = 0;
    v.message = my_message;
  }
  return v;
}

void agree(bool distributed, const std::string& my_error_in, const char* what, const std::string& tail) {
  const std::string my_error = without_prefix(my_error_in, what);
  if (!distributed) {
    TORCH_CHECK(my_error.empty(), "hyper_parallel::", what, ": ", my_error, tail);
    return;
  }
  const Verdicts v = gather_verdicts(true, my_error.empty() ? 0 : 1, my_error);
  if (v.first < 0) return;
  std::vector<int64_t> bad;
  for (size_t r = 0; r < v.codes.size(); ++r)
    if (v.codes[r] != 0) bad.push_back(static_cast<int64_t>(r));
  TORCH_CHECK(false, "hyper_parallel::", what, ": rank(s) ", c10::IntArrayRef(bad), " failed; rank ", bad[0], ": ", v.message, tail);
}

std::string message_of(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

}  // namespace checkpoint_layout
}  // namespace hyper_parallel
