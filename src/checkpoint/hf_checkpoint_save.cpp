// save_hf_checkpoint: one layout computed alike on every rank; rank 0 creates the files (headers,
// space reserved) in a new directory; every rank writes its boxes through a shared mapping; rank 0
// swaps the new directory in. The ranks agree after each step.
#include <hyper_parallel/runtime/fault_injection.h>
#include <hyper_parallel/checkpoint/hf_checkpoint.h>
#include <hyper_parallel/checkpoint/safetensors.h>
#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/runtime/control.h>
#include <hyper_parallel/runtime/errors.h>
#include <hyper_parallel/runtime/process_group.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "checkpoint_files.h"
#include "checkpoint_layout.h"
#include "checkpoint_progress.h"
#include "hf_entries.h"

namespace hyper_parallel {

namespace {

namespace fs = std::filesystem;
namespace cf = checkpoint_files;
constexpr const char* kIndex = "model.safetensors.index.json";

struct PlannedTensor {
  size_t entry;
  std::string key;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // in the data buffer
  int64_t stack_index = -1;    // a stacked key's tensor: index `stack_index` of the value's dim 0
  // A tensor that several values share by row ranges: (entry, first row) of each; empty: `entry`'s alone.
  std::vector<std::pair<size_t, int64_t>> row_parts = {};
};

struct PlannedFile {
  std::string name;
  std::vector<PlannedTensor> tensors;
  std::string header;  // the 8-byte length and the padded JSON
  int64_t size = 0;
};

int64_t bytes_of(const PlannedTensor& t) {
  return c10::multiply_integers(t.shape) * static_cast<int64_t>(c10::elementSize(t.dtype));
}

// The files and every tensor's place in them: a function of the global shapes and dtypes alone,
// so every rank computes the same layout without exchanging it.
std::vector<PlannedFile> plan_files(const std::vector<hf_entries::Entry>& entries, const HFSaveOptions& options) {
  HP_CHECK_T(c10::ValueError, options.max_shard_size > 0, "hyper_parallel::save_hf_checkpoint: max_shard_size must be positive, got ",
             options.max_shard_size);
  std::vector<PlannedTensor> all;
  std::map<std::string, std::string> owner;
  std::map<std::string, size_t> shared;  // a row-ranged name -> its tensor in `all`
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    const std::string key = e.key();
    if (key.empty()) continue;  // the key map stores none of its names
    at::ScalarType dtype = e.value.scalar_type();
    if (options.dtype && at::isFloatingType(dtype)) dtype = *options.dtype;
    safetensors_dtype_name(dtype);  // throws for a dtype the format lacks
    const hf_entries::RowRange range = hf_entries::row_range(key);
    if (range.ranged) {
      HP_CHECK_T(c10::ValueError, range.dim == 0, "hyper_parallel::save_hf_checkpoint: ", e.fqn_list(), " maps to a range of dim ", range.dim,
                 " of '", range.name, "' ('", key, "'); a save writes row ranges (dim 0) only: give the key map's name for saving first ",
                 "(alternatives 'a|b' are written as 'a')");
      HP_CHECK_T(c10::ValueError, e.value.dim() >= 1 && e.value.size(0) == range.end - range.begin, "hyper_parallel::save_hf_checkpoint: ",
                 e.fqn_list(), " ", e.value.sizes(), " maps to rows ", range.begin, ":", range.end, " of '", range.name, "', which is ",
                 range.end - range.begin, " rows");
      auto [it, fresh] = shared.emplace(range.name, all.size());
      if (fresh) {
        HP_CHECK_T(c10::ValueError, !owner.count(range.name), "hyper_parallel::save_hf_checkpoint: ", owner[range.name], " and ", e.fqn_list(),
                   " both map to '", range.name, "' (distinct tensors under one name)");
        owner.emplace(range.name, e.fqn_list());
        all.push_back({i, range.name, dtype, e.value.sizes().vec()});
        all.back().shape[0] = 0;
      }
      PlannedTensor& t = all[it->second];
      HP_CHECK_T(c10::ValueError, t.dtype == dtype && c10::IntArrayRef(t.shape).slice(1) == e.value.sizes().slice(1),
                 "hyper_parallel::save_hf_checkpoint: the row ranges of '", range.name, "' differ in dtype or trailing dims: ",
                 owner[range.name], " and ", e.fqn_list(), " ", e.value.sizes());
      t.row_parts.emplace_back(i, range.begin);
      t.shape[0] = std::max(t.shape[0], range.end);
      continue;
    }
    auto [it, fresh] = owner.emplace(key, e.fqn_list());
    HP_CHECK_T(c10::ValueError, fresh, "hyper_parallel::save_hf_checkpoint: ", it->second, " and ", e.fqn_list(), " both map to '", key,
               "' (distinct tensors under one name)");
    if (!hf_entries::is_stacked(key)) {
      all.push_back({i, key, dtype, e.value.sizes().vec()});
      continue;
    }
    HP_CHECK_T(c10::ValueError, e.value.dim() >= 1, "hyper_parallel::save_hf_checkpoint: '", key, "' names one tensor per index of dim 0, but ",
               e.fqn_list(), " is a scalar");
    for (int64_t s = 0; s < e.value.size(0); ++s) {
      PlannedTensor t{i, hf_entries::stacked_key(key, s), dtype, e.value.sizes().slice(1).vec()};
      t.stack_index = s;
      all.push_back(std::move(t));
    }
  }
  // A shared tensor is written whole: its ranges must tile its rows.
  for (auto& [name, index] : shared) {
    PlannedTensor& t = all[index];
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (const auto& [entry, begin] : t.row_parts) ranges.emplace_back(begin, begin + entries[entry].value.size(0));
    const hf_entries::RowTiling tiling = hf_entries::row_tiling(ranges, t.shape[0]);
    HP_CHECK_T(c10::ValueError, tiling.tiled, "hyper_parallel::save_hf_checkpoint: the row ranges of '", name, "' (", tiling.listed,
               ") do not cover rows 0:", t.shape[0], " once each");
  }
  // Files filled in the model's order, as transformers splits a state dict.
  std::vector<std::vector<PlannedTensor>> groups(1);
  int64_t used = 0;
  for (auto& t : all) {
    if (used > 0 && used + bytes_of(t) > options.max_shard_size) {
      groups.emplace_back();
      used = 0;
    }
    used += bytes_of(t);
    groups.back().push_back(std::move(t));
  }
  std::vector<PlannedFile> files;
  const size_t n = groups.size();
  for (size_t g = 0; g < n; ++g) {
    PlannedFile f;
    char name[64];
    if (n == 1) std::snprintf(name, sizeof name, "model.safetensors");
    else std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", g + 1, n);
    f.name = name;
    f.tensors = std::move(groups[g]);
    // Wider elements first: every tensor then starts at a multiple of its element size (the
    // header is padded to 8), so the data can be viewed in place.
    std::stable_sort(f.tensors.begin(), f.tensors.end(),
                     [](const auto& a, const auto& b) { return c10::elementSize(a.dtype) > c10::elementSize(b.dtype); });
    nlohmann::json j = nlohmann::json::object();
    j["__metadata__"] = {{"format", "pt"}};
    int64_t at = 0;
    for (auto& t : f.tensors) {
      t.begin = at;
      t.end = at += bytes_of(t);
      j[t.key] = {{"dtype", safetensors_dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
    }
    std::string text = j.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    const uint64_t len = text.size();
    f.header.resize(8);
    for (int b = 0; b < 8; ++b) f.header[static_cast<size_t>(b)] = static_cast<char>((len >> (8 * b)) & 0xff);
    f.header += text;
    f.size = static_cast<int64_t>(f.header.size()) + at;
    files.push_back(std::move(f));
  }
  return files;
}

// Where the checkpoint directory is, and the new one beside it.
struct Target {
  fs::path dir, parent;
  std::string base;
};

Target target_of(const std::string& dir) {
  Target t;
  t.dir = fs::path(dir).lexically_normal();
  if (t.dir.filename().empty()) t.dir = t.dir.parent_path();
  t.base = t.dir.filename().string();
  HP_CHECK_T(c10::ValueError, !t.base.empty() && t.base != "." && t.base != "..", "hyper_parallel::save_hf_checkpoint: '", dir,
             "' does not name a directory to write (give its path, e.g. out/model)");
  t.parent = t.dir.has_parent_path() ? t.dir.parent_path() : fs::path(".");
  return t;
}

void create_in(const std::string& tmp, const std::vector<PlannedFile>& files);

// Rank 0, step 1: a fresh directory beside the target with every file created at its final size
// (space reserved, so a full disk fails here and not in the middle of the mapped writes) and its
// header written. Returns the new directory.
std::string create_files(const Target& t, const std::vector<PlannedFile>& files) {
  std::error_code ec;
  fs::create_directories(t.parent, ec);
  TORCH_CHECK(!ec, "hyper_parallel::save_hf_checkpoint: cannot create ", t.parent.string(), ": ", ec.message());
  if (fs::exists(t.dir, ec)) {
    HP_CHECK_T(c10::ValueError, fs::is_directory(t.dir, ec), "hyper_parallel::save_hf_checkpoint: ", t.dir.string(), " exists and is not a directory");
    for (const auto& e : fs::directory_iterator(t.dir))
      HP_CHECK_T(c10::ValueError, !e.is_directory(), "hyper_parallel::save_hf_checkpoint: ", t.dir.string(), " holds the directory ",
                 e.path().filename().string(), "; a checkpoint directory holds files only (it is replaced whole)");
  }
  // New directories that earlier saves left when they were killed.
  const std::string stale = t.base + ".hp-save-";
  for (const auto& e : fs::directory_iterator(t.parent))
    if (e.path().filename().string().rfind(stale, 0) == 0) cf::remove_tree(e.path().string());
  const std::string tmp = (t.parent / (stale + checkpoint_layout::hex(checkpoint_layout::random_id()))).string();
  TORCH_CHECK(fs::create_directory(tmp, ec) && !ec, "hyper_parallel::save_hf_checkpoint: cannot create ", tmp, ": ", ec.message());
  try {
    create_in(tmp, files);
  } catch (...) {
    cf::remove_tree(tmp);
    throw;
  }
  return tmp;
}

void create_in(const std::string& tmp, const std::vector<PlannedFile>& files) {
  for (const auto& f : files) {
    const std::string path = tmp + "/" + f.name;
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) cf::os_error("create", path, errno);
    const int rc = ::posix_fallocate(fd, 0, f.size);
    if (rc != 0) {
      ::close(fd);
      cf::os_error("reserve space for", path, rc);
    }
    const ssize_t w = ::pwrite(fd, f.header.data(), f.header.size(), 0);
    const int err = errno;
    ::close(fd);
    if (w != static_cast<ssize_t>(f.header.size())) cf::os_error("write the header of", path, w < 0 ? err : EIO);
  }
}

// Every rank, step 2: its boxes copied into the mapped files (cast on the way), then flushed.
int64_t write_boxes(const std::string& tmp, const std::vector<PlannedFile>& files, const std::vector<hf_entries::LocalBox>& boxes,
                    bool show_progress) {
  int64_t written = 0, total = 0;
  // The part of a box that one planned tensor holds: all of it, or one index of a stacked value
  // (empty when this rank's box does not reach that index).
  auto part_of = [&](const PlannedTensor& t) -> hf_entries::LocalBox {
    const auto& box = boxes[t.entry];
    if (t.stack_index < 0) return box;
    const int64_t j = t.stack_index - box.offset[0];
    if (j < 0 || j >= box.local.size(0)) return {at::Tensor(), {}, false};
    return {box.local.select(0, j), std::vector<int64_t>(box.offset.begin() + 1, box.offset.end()), box.writer};
  };
  // Every box one planned tensor receives: its part of one value, or one per row range, moved to
  // the range's rows.
  auto parts_of = [&](const PlannedTensor& t) {
    if (t.row_parts.empty()) return std::vector<hf_entries::LocalBox>{part_of(t)};
    std::vector<hf_entries::LocalBox> out;
    for (const auto& [entry, begin] : t.row_parts) {
      hf_entries::LocalBox box = boxes[entry];
      box.offset[0] += begin;
      out.push_back(std::move(box));
    }
    return out;
  };
  for (const auto& f : files)
    for (const auto& t : f.tensors)
      for (const auto& part : parts_of(t))
        if (part.writer) total += part.local.numel() * static_cast<int64_t>(c10::elementSize(t.dtype));
  checkpoint_progress::Progress progress("save_hf_checkpoint", total, static_cast<int64_t>(files.size()), show_progress);
  int64_t files_done = 0;
  for (const auto& f : files) {
    ++files_done;
    bool any = false;
    for (const auto& t : f.tensors)
      for (const auto& part : parts_of(t)) any |= part.writer && part.local.numel() > 0;
    if (!any) continue;
    const std::string path = tmp + "/" + f.name;
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) cf::os_error("open", path, errno);
    void* m = ::mmap(nullptr, static_cast<size_t>(f.size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      cf::os_error("map", path, err);
    }
    auto* data = static_cast<uint8_t*>(m) + f.header.size();
    std::string error;
    try {
      for (const auto& t : f.tensors)
        for (const auto& box : parts_of(t)) {
          if (!box.writer || box.local.numel() == 0) continue;
          at::Tensor dst = at::from_blob(data + t.begin, t.shape, at::TensorOptions().dtype(t.dtype));
          for (int64_t d = 0; d < box.local.dim(); ++d) dst = dst.narrow(d, box.offset[static_cast<size_t>(d)], box.local.size(d));
          dst.copy_(box.local);
          const int64_t bytes = box.local.numel() * static_cast<int64_t>(c10::elementSize(t.dtype));
          written += bytes;
          progress.add(bytes, files_done - 1);
        }
    } catch (const std::exception& e) {
      error = checkpoint_layout::message_of(e);
    }
    const int sync_rc = ::msync(m, static_cast<size_t>(f.size), MS_SYNC);
    const int sync_err = errno;
    ::munmap(m, static_cast<size_t>(f.size));
    const int fsync_rc = ::fsync(fd);
    const int fsync_err = errno;
    ::close(fd);
    TORCH_CHECK(error.empty(), "hyper_parallel::save_hf_checkpoint: writing ", path, ": ", error);
    if (sync_rc != 0) cf::os_error("flush", path, sync_err);
    if (fsync_rc != 0) cf::os_error("fsync", path, fsync_err);
  }
  return written;
}

bool is_weight_file(const std::string& name) {
  return name == kIndex || (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0);
}

// Rank 0, step 3: the index and the extra files, the old directory's other files linked in, then
// the new directory swapped with the old one in one rename.
void commit(const Target& t, const std::string& tmp, const std::vector<PlannedFile>& files, const HFSaveOptions& options,
            bool& swapped) {
  std::set<std::string> written;
  for (const auto& f : files) written.insert(f.name);
  if (files.size() > 1) {
    nlohmann::json j;
    int64_t total = 0;
    for (const auto& f : files)
      for (const auto& x : f.tensors) {
        j["weight_map"][x.key] = f.name;
        total += bytes_of(x);
      }
    j["metadata"] = {{"total_size", total}};
    cf::write_file(tmp + "/" + kIndex, j.dump(2) + "\n");
    written.insert(kIndex);
  }
  for (const auto& [name, text] : options.extra_files) {
    HP_CHECK_T(c10::ValueError, !name.empty() && name.find('/') == std::string::npos && name != "." && name != ".." && !written.count(name),
               "hyper_parallel::save_hf_checkpoint: extra file '", name, "' is not a file name, or names a file the checkpoint writes itself");
    cf::write_file(tmp + "/" + name, text);
    written.insert(name);
  }
  std::error_code ec;
  const bool exists = fs::exists(t.dir, ec);
  if (exists)
    for (const auto& e : fs::directory_iterator(t.dir)) {
      const std::string name = e.path().filename().string();
      if (written.count(name) || is_weight_file(name)) continue;  // replaced, or weights of the old checkpoint
      if (::link(e.path().c_str(), (tmp + "/" + name).c_str()) != 0) cf::os_error("carry over", e.path().string(), errno);
    }
  cf::sync_dir(tmp);
  if (exists) {
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, t.dir.c_str(), RENAME_EXCHANGE) != 0)
      cf::os_error("swap in the new checkpoint for", t.dir.string(), errno);
    cf::remove_tree(tmp);  // the old checkpoint, now under the temporary name
  } else if (::rename(tmp.c_str(), t.dir.c_str()) != 0) {
    cf::os_error("rename the new checkpoint to", t.dir.string(), errno);
  }
  swapped = true;
  cf::sync_dir(t.parent.string());
}

}  // namespace

HFSaveReport save_hf_checkpoint(torch::nn::Module& model, const std::string& dir, const HFSaveOptions& options) {
  require_real_world("save_hf_checkpoint", "the values every rank holds, which a fake world only simulates");
  const auto entries = hf_entries::entries_of(model, options.key_map);
  // A model of plain tensors belongs to the calling rank alone: it saves it by itself.
  const bool distributed = is_initialized() && hf_entries::holds_dtensor(entries);
  const int64_t rank = distributed ? get_rank() : 0;
  std::string err, tmp;
  std::vector<PlannedFile> files;
  Target target;
  try {
    target = target_of(dir);
    files = plan_files(entries, options);
    if (rank == 0) tmp = create_files(target, files);
  } catch (const std::exception& e) {
    err = checkpoint_layout::message_of(e);
  }
  // Only rank 0 ever removes the new directory, and only while it is not committed.
  bool committed = false;
  struct Cleanup {
    const std::string& tmp;
    const bool& committed;
    ~Cleanup() {
      if (!tmp.empty() && !committed) cf::remove_tree(tmp);
    }
  } cleanup{tmp, committed};
  const std::string tail = "; " + dir + " is unchanged";
  checkpoint_layout::agree(distributed, err, "save_hf_checkpoint", tail);
  const std::string shared_tmp = distributed ? control_broadcast_string(world_group(), tmp, 0) : tmp;

  // Every rank takes its boxes (a Partial one is reduced here, collectively, in the same order).
  std::vector<hf_entries::LocalBox> boxes;
  for (const auto& e : entries) {
    boxes.push_back(hf_entries::local_box(e.value));
    if (!is_dtensor(e.value) && rank != 0) boxes.back().writer = false;  // every rank holds it whole: rank 0 writes it
  }
  HFSaveReport report;
  try {
    report.bytes_written = write_boxes(shared_tmp, files, boxes, options.progress && (!distributed || get_rank() == 0));
    fault_point("hf_mid_write");
  } catch (const std::exception& e) {
    err = checkpoint_layout::message_of(e);
  }
  checkpoint_layout::agree(distributed, err, "save_hf_checkpoint", tail);
  // Every rank's boxes are written and agreed; nothing is swapped in. A rank killed here stops the
  // swap, which rank 0 makes only after this second agreement.
  fault_point("hf_before_swap");
  checkpoint_layout::agree(distributed, "", "save_hf_checkpoint", tail);
  if (rank == 0) {
    try {
      commit(target, tmp, files, options, committed);
    } catch (const std::exception& e) {
      err = checkpoint_layout::message_of(e);
    }
  }
  checkpoint_layout::agree(distributed, err, "save_hf_checkpoint", committed ? "" : tail);
  for (const auto& f : files) report.files.push_back((target.dir / f.name).string());
  return report;
}

}  // namespace hyper_parallel
