// load_hf_checkpoint: every file validated and every key checked, the ranks agree, then each rank
// copies its boxes straight from the mappings into its local shards.
#include <hyper_parallel/checkpoint/hf_checkpoint.h>
#include <hyper_parallel/checkpoint/safetensors.h>
#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/runtime/errors.h>
#include <hyper_parallel/runtime/process_group.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <set>

#include "checkpoint_files.h"
#include "checkpoint_layout.h"
#include "checkpoint_progress.h"
#include "hf_entries.h"

namespace hyper_parallel {

namespace {

namespace fs = std::filesystem;
constexpr int64_t kMaxIndexBytes = int64_t{64} << 20;
constexpr size_t kMaxListed = 8;  // names listed in one error before "and N more"

[[noreturn]] void bad_index(const std::string& path, const std::string& why) {
  HP_CHECK_T(c10::ValueError, false, "hyper_parallel::load_hf_checkpoint: index ", path, ": ", why);
}

// The checkpoint's files, opened and validated, and where each tensor lives.
struct Checkpoint {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, const SafetensorsFile*> where;
};

Checkpoint open_checkpoint(const std::string& path) {
  Checkpoint ck;
  std::error_code ec;
  const std::string index = path + "/model.safetensors.index.json";
  if (fs::is_directory(path, ec) && fs::exists(index, ec)) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(checkpoint_files::read_file(index, kMaxIndexBytes, "load_hf_checkpoint"));
    } catch (const nlohmann::json::parse_error& e) {
      bad_index(index, std::string("not valid JSON (") + e.what() + ")");
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      bad_index(index, "it has no \"weight_map\" object");
    std::map<std::string, std::string> weight_map;
    std::map<std::string, const SafetensorsFile*> by_file;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) bad_index(index, "the file of '" + it.key() + "' is not a string");
      const std::string file = it.value().get<std::string>();
      // A file name, never a path: an index must not reach outside its directory.
      if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
        bad_index(index, "'" + it.key() + "' is in '" + file + "', which is not a file name in the checkpoint's directory");
      weight_map[it.key()] = file;
      if (!by_file.count(file)) {
        ck.files.push_back(std::make_unique<SafetensorsFile>(path + "/" + file));
        by_file[file] = ck.files.back().get();
      }
    }
    for (const auto& [name, file] : weight_map) {
      const SafetensorsFile* f = by_file[file];
      if (!f->find(name)) bad_index(index, "it puts '" + name + "' in " + file + ", which holds no such tensor");
      ck.where[name] = f;
    }
    for (const auto& [file, f] : by_file)
      for (const auto& t : f->tensors())
        if (!weight_map.count(t.name) || weight_map[t.name] != file)
          bad_index(index, file + " holds '" + t.name + "', which the index does not place there");
  } else {
    const std::string file = fs::is_directory(path, ec) ? path + "/model.safetensors" : path;
    HP_CHECK_T(c10::ValueError, fs::exists(file, ec), "hyper_parallel::load_hf_checkpoint: ", path,
               " is neither a .safetensors file nor a directory holding model.safetensors or model.safetensors.index.json");
    ck.files.push_back(std::make_unique<SafetensorsFile>(file));
    for (const auto& t : ck.files.back()->tensors()) ck.where[t.name] = ck.files.back().get();
  }
  return ck;
}

std::string listed(const std::vector<std::string>& names) { return join_listed(names, kMaxListed); }

bool same_kind(at::ScalarType a, at::ScalarType b) {
  if (a == b) return true;
  return at::isFloatingType(a) && at::isFloatingType(b);
}

// One parameter to load: where its bytes are.
struct Load {
  at::Tensor value;
  std::string key;
  const SafetensorsFile* file;
  int64_t begin;              // of the tensor's bytes in the file
  hf_entries::LocalBox box;   // what this rank holds of it
};

// Everything checked on this rank; every problem found goes into one message.
std::vector<Load> plan_loads(const std::vector<hf_entries::Entry>& entries, const Checkpoint& ck, const HFLoadOptions& options,
                             int64_t& ignored) {
  std::vector<Load> loads;
  std::vector<std::string> missing, mismatched;
  std::set<std::string> claimed;
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> claimed_rows;  // ranges of shared tensors
  std::map<std::string, std::set<int64_t>> claimed_dims;                          // the dims they range over
  for (const auto& e : entries) {
    const int64_t stack = e.value.dim() > 0 ? e.value.size(0) : 0;
    for (const auto& k : e.keys) {
      if (k.empty()) continue;
      if (hf_entries::is_stacked(k))
        for (int64_t i = 0; i < stack; ++i) claimed.insert(hf_entries::stacked_key(k, i));
      else if (const auto r = hf_entries::row_range(k); r.ranged) {
        claimed_rows[r.name].emplace_back(r.begin, r.end);
        claimed_dims[r.name].insert(r.dim);
      }
      else
        claimed.insert(k);
    }
    const std::string* found = nullptr;
    for (const auto& k : e.keys)
      if (!k.empty() && ck.where.count(hf_entries::is_stacked(k) ? hf_entries::stacked_key(k, 0) : hf_entries::row_range(k).name)) {
        found = &k;
        break;
      }
    if (found && hf_entries::is_stacked(*found)) {
      // One checkpoint tensor per index of dim 0: each must exist with the value's other dims; this
      // rank reads the indices of its box only.
      const at::IntArrayRef inner = e.value.sizes().slice(1);
      bool complete = true;
      for (int64_t i = 0; i < stack; ++i) {
        const std::string key = hf_entries::stacked_key(*found, i);
        auto it = ck.where.find(key);
        if (it == ck.where.end()) {
          missing.push_back("'" + key + "' (for " + e.fqn_list() + ", index " + std::to_string(i) + " of " + std::to_string(stack) + ")");
          complete = false;
          continue;
        }
        const SafetensorsTensorInfo& t = *it->second->find(key);
        if (c10::IntArrayRef(t.shape) != inner || !same_kind(t.dtype, e.value.scalar_type())) {
          mismatched.push_back("'" + key + "' in " + it->second->path() + " is " + t.dtype_name + " " + c10::str(c10::IntArrayRef(t.shape)) +
                               ", index " + std::to_string(i) + " of " + e.fqn_list() + " is " + c10::toString(e.value.scalar_type()) + " " +
                               c10::str(inner));
          complete = false;
        }
      }
      if (!complete) continue;
      const hf_entries::LocalBox box = hf_entries::local_box(e.value);
      const int64_t first = box.offset.empty() ? 0 : box.offset[0];
      for (int64_t j = 0; j < box.local.size(0); ++j) {
        const std::string key = hf_entries::stacked_key(*found, first + j);
        const SafetensorsFile* f = ck.where.at(key);
        hf_entries::LocalBox slice{box.local.select(0, j), std::vector<int64_t>(box.offset.begin() + 1, box.offset.end()), box.writer};
        loads.push_back({e.value, key, f, f->find(key)->begin, slice});
      }
      continue;
    }
    if (!found) {
      std::string names;
      for (const auto& k : e.keys)
        if (!k.empty()) names += (names.empty() ? "'" : " or '") + k + "'";
      if (names.empty()) names = "a name";  // the key map stores none of its names
      missing.push_back(names + (e.keys == e.fqns ? "" : " (for " + e.fqn_list() + ")"));
      continue;
    }
    const hf_entries::RowRange range = hf_entries::row_range(*found);
    const SafetensorsFile* f = ck.where.at(range.name);
    const SafetensorsTensorInfo& t = *f->find(range.name);
    HP_CHECK_T(c10::ValueError, !is_dtensor(e.value) || !DTensor(e.value).spec().has_partial(), "hyper_parallel::load_hf_checkpoint: ",
               e.fqn_list(), " is a Partial DTensor, which has no values of its own to load into");
    // A range: the value is [begin, end) of the checkpoint tensor's dim `d`, whose other dims it shares.
    const int64_t d = range.dim;
    std::vector<int64_t> want = e.value.sizes().vec();
    const bool has_dim = static_cast<int64_t>(want.size()) > d;
    if (range.ranged && has_dim) want[static_cast<size_t>(d)] = static_cast<int64_t>(t.shape.size()) > d ? t.shape[static_cast<size_t>(d)] : -1;
    const bool rows_fit =
        !range.ranged || (has_dim && range.end <= want[static_cast<size_t>(d)] && range.end - range.begin == e.value.size(d));
    if (c10::IntArrayRef(t.shape) != c10::IntArrayRef(want) || !rows_fit || !same_kind(t.dtype, e.value.scalar_type()))
      mismatched.push_back("'" + range.name + "' in " + f->path() + " is " + t.dtype_name + " " + c10::str(c10::IntArrayRef(t.shape)) +
                           ", " + e.fqn_list() +
                           (range.ranged ? std::string(d == 0 ? " (its rows " : " (its range of dim " + std::to_string(d) + ", ") +
                                               std::to_string(range.begin) + ":" + std::to_string(range.end) + ")"
                                         : "") +
                           " is " + c10::toString(e.value.scalar_type()) + " " + c10::str(e.value.sizes()));
    hf_entries::LocalBox box = hf_entries::local_box(e.value);
    if (range.ranged && has_dim) box.offset[static_cast<size_t>(d)] += range.begin;
    loads.push_back({e.value, range.name, f, t.begin, box});
  }
  // Rows of a shared tensor that no parameter takes would be dropped silently, and rows two
  // parameters take would load twice: the ranges of each name must tile its rows.
  std::vector<std::string> untiled;
  for (auto& [name, ranges] : claimed_rows) {
    auto it = ck.where.find(name);
    if (it == ck.where.end()) continue;  // reported as missing
    const auto& shape = it->second->find(name)->shape;
    const std::set<int64_t>& dims = claimed_dims[name];
    if (dims.size() != 1) {
      untiled.push_back("'" + name + "' (the parameters take ranges of " + std::to_string(dims.size()) + " different dims)");
      continue;
    }
    const int64_t d = *dims.begin();
    const int64_t rows = static_cast<int64_t>(shape.size()) > d ? shape[static_cast<size_t>(d)] : 0;
    const hf_entries::RowTiling tiling = hf_entries::row_tiling(ranges, rows);
    if (tiling.tiled && static_cast<int64_t>(shape.size()) > d) claimed.insert(name);
    else
      untiled.push_back("'" + name + "' (" + std::to_string(rows) + (d == 0 ? " rows" : " along dim " + std::to_string(d)) +
                        "; the parameters take " + tiling.listed + ")");
  }
  std::vector<std::regex> ignore;
  for (const auto& pattern : options.ignore) {
    try {
      ignore.emplace_back(pattern, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      HP_CHECK_T(c10::ValueError, false, "hyper_parallel::load_hf_checkpoint: the ignore pattern '", pattern, "' is not a regular expression (",
                 e.what(), ")");
    }
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, f] : ck.where) {
    if (claimed.count(name)) continue;
    if (std::any_of(ignore.begin(), ignore.end(), [&](const std::regex& r) { return std::regex_search(name, r); })) ++ignored;
    else if (options.strict) unexpected.push_back("'" + name + "'");
  }
  std::string why;
  if (!missing.empty()) why += "the checkpoint lacks " + listed(missing) + "; ";
  if (!mismatched.empty()) why += "shapes or dtypes differ: " + listed(mismatched) + "; ";
  if (!unexpected.empty())
    why += "no parameter takes " + listed(unexpected) + " (map it with key_map, or set strict=false to skip it); ";
  if (!untiled.empty()) why += "row ranges do not cover each row once: " + listed(untiled) + "; ";
  HP_CHECK_T(c10::ValueError, why.empty(), "hyper_parallel::load_hf_checkpoint: ", why.substr(0, why.size() - 2));
  return loads;
}

}  // namespace

HFLoadReport load_hf_checkpoint(torch::nn::Module& model, const std::string& path, const HFLoadOptions& options) {
  require_real_world("load_hf_checkpoint", "real files and the values other ranks hold");
  const auto entries = hf_entries::entries_of(model, options.key_map);
  Checkpoint ck;
  std::vector<Load> loads;
  std::string err;
  int64_t ignored = 0;
  try {
    ck = open_checkpoint(path);
    loads = plan_loads(entries, ck, options, ignored);
  } catch (const std::exception& e) {
    err = checkpoint_layout::message_of(e);
  }
  // All or nothing: every rank learns whether every rank can load before anyone writes. After
  // this, the copies read bytes that the validated headers put inside the files.
  try {
    // A model without DTensors belongs to this rank alone (e.g. a one-process reference inside a
    // job): its load is local.
    checkpoint_layout::agree(is_initialized() && hf_entries::holds_dtensor(entries), err, "load_hf_checkpoint", "; no rank loaded anything");
  } catch (const c10::Error& e) {
    HP_CHECK_T(c10::ValueError, false, e.what_without_backtrace());
  }
  HFLoadReport report;
  report.ignored = ignored;
  for (const auto& f : ck.files) report.files.push_back(f->path());
  // File by file, each in the order of its bytes: reads run forward through the page cache.
  std::map<const SafetensorsFile*, size_t> file_index;
  for (const auto& f : ck.files) file_index.emplace(f.get(), file_index.size());
  std::sort(loads.begin(), loads.end(), [&](const Load& a, const Load& b) {
    const size_t fa = file_index.at(a.file), fb = file_index.at(b.file);
    return fa != fb ? fa < fb : a.begin < b.begin;
  });
  int64_t total = 0;
  for (const Load& l : loads) total += l.box.local.numel() * static_cast<int64_t>(l.box.local.element_size());
  checkpoint_progress::Progress progress("load_hf_checkpoint", total, static_cast<int64_t>(ck.files.size()),
                                         options.progress && (!is_initialized() || get_rank() == 0));
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < loads.size(); ++k) {
    Load& l = loads[k];
    hf_entries::LocalBox& box = l.box;
    report.bytes_read += l.file->read_box(l.key, box.offset, box.local);
    const int64_t bytes = box.local.numel() * static_cast<int64_t>(box.local.element_size());
    report.local_bytes += bytes;
    ++report.tensors;
    const bool file_done = k + 1 == loads.size() || loads[k + 1].file != l.file;
    progress.add(bytes, static_cast<int64_t>(file_index.at(l.file)) + (file_done ? 1 : 0));
  }
  return report;
}

}  // namespace hyper_parallel
