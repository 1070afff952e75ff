// from_pretrained's memory and speed on a Qwen3 HF checkpoint, per rank: one JSON line per rank.
//   hprun --nproc-per-node 2 qwen3_load_bench DIR [--dtype bfloat16|float32] [--generate N]
// In order, in one fresh process per rank:
// 1. the checkpoint's files read once (a warm page cache, as a second load finds it);
// 2. from_pretrained with this process's anonymous memory (RssAnon) before, after and its
//    sampled peak, and the largest resident share of the checkpoint's own mappings;
// 3. with --generate N, N greedy tokens of a fixed prompt (bench/load_bench.sh compares them
//    across tensor-parallel sizes); then the model is freed (one model per rank at a time);
// 4. timed without the sampler (its reads of /proc/self/smaps take CPU from 2-core machines):
//    the floor, allocating this rank's shards and preading the same slices (each local box in its
//    longest contiguous runs, every shard kept until the end), and from_pretrained again, each
//    twice, alternating; the faster of each.
#include <ATen/ATen.h>

#include <hyper_parallel/hyper_parallel.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <hyper_parallel/models/qwen3/config.h>
#include <hyper_parallel/models/qwen3/generate.h>
#include <hyper_parallel/models/qwen3/pretrained.h>

namespace qwen3 = hyper_parallel::qwen3;
namespace hp = hyper_parallel;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<std::string> safetensors_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

void read_whole(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  std::vector<char> buf(size_t{8} << 20);
  while (::read(fd, buf.data(), buf.size()) > 0) {
  }
  ::close(fd);
}

// The floor: this rank's boxes allocated and pread from the files, in the longest contiguous runs.
double floor_seconds(qwen3::CausalLMImpl& model, const std::vector<std::string>& files, int64_t& bytes) {
  struct Where {
    std::string path;
    const hp::SafetensorsTensorInfo* info;
    int64_t data_start;
  };
  std::vector<std::unique_ptr<hp::SafetensorsFile>> open;
  std::map<std::string, Where> where;
  for (const auto& f : files) {
    open.push_back(std::make_unique<hp::SafetensorsFile>(f));
    uint64_t n = 0;
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (::pread(fd, &n, 8, 0) != 8) n = 0;
    ::close(fd);
    for (const auto& t : open.back()->tensors()) where[t.name] = {f, &t, static_cast<int64_t>(8 + n)};
  }
  const auto start = Clock::now();
  bytes = 0;
  std::map<std::string, int> fds;
  std::set<const c10::TensorImpl*> seen;
  // Every shard stays allocated until the end, as a loaded model's: no page is reused.
  std::vector<at::Tensor> kept;
  for (const auto& p : model.named_parameters()) {
    if (!seen.insert(p.value().unsafeGetTensorImpl()).second) continue;
    const std::string key = qwen3::hf_key(p.key());
    if (!where.count(key)) continue;
    const Where& w = where.at(key);
    std::vector<int64_t> shape = w.info->shape, len = shape, off(shape.size(), 0);
    if (hp::is_dtensor(p.value())) {
      const hp::DTensor d(p.value());
      std::tie(len, off) = d.spec().local_shape_and_offset(*d.device_mesh().get_coordinate());
    }
    const int64_t es = static_cast<int64_t>(c10::elementSize(w.info->dtype));
    at::Tensor out = at::empty(len, at::TensorOptions().dtype(w.info->dtype));
    kept.push_back(out);
    if (out.numel() == 0) continue;
    if (!fds.count(w.path)) fds[w.path] = ::open(w.path.c_str(), O_RDONLY | O_CLOEXEC);
    const int fd = fds[w.path];
    // Dims from k on are whole in the box: one run covers len[k-1] * (their product) elements.
    size_t k = shape.size();
    int64_t run = 1;
    while (k > 0 && len[k - 1] == shape[k - 1]) run *= shape[--k];
    if (k > 0) run *= len[--k];
    std::vector<int64_t> stride(shape.size(), 1);
    for (size_t d = shape.size() - 1; d-- > 0;) stride[d] = stride[d + 1] * shape[d + 1];
    std::vector<int64_t> idx(k, 0);
    auto* dst = static_cast<char*>(out.data_ptr());
    while (true) {
      int64_t elem = off.empty() ? 0 : off[k] * stride[k];
      for (size_t d = 0; d < k; ++d) elem += (off[d] + idx[d]) * stride[d];
      const ssize_t got = ::pread(fd, dst, static_cast<size_t>(run * es), w.data_start + w.info->begin + elem * es);
      if (got != run * es) throw std::runtime_error("pread failed on " + w.path);
      dst += run * es;
      bytes += run * es;
      size_t d = k;
      while (d > 0 && ++idx[d - 1] == len[d - 1]) idx[--d] = 0;
      if (d == 0) break;
    }
  }
  for (const auto& [path, fd] : fds) ::close(fd);
  const double s = seconds_since(start);
  kept.clear();
  return s;
}

int run(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: qwen3_load_bench DIR [--dtype bfloat16|float32] [--generate N]\n");
    return 2;
  }
  const std::string dir = argv[1];
  at::ScalarType dtype = at::kBFloat16;
  int64_t generate = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string f = argv[i], v = argv[i + 1];
    if (f == "--dtype") dtype = v == "float32" ? at::kFloat : at::kBFloat16;
    else if (f == "--generate") generate = std::stoll(v);
  }
  hp::init_process_group();
  const int64_t world = hp::get_world_size();
  c10::optional<hp::DeviceMesh> tp;
  if (world > 1) tp = hp::init_device_mesh("cpu", {world}, {"tp"});
  const auto files = safetensors_files(dir);
  int64_t largest = 0;
  for (const auto& f : files) {
    read_whole(f);
    largest = std::max<int64_t>(largest, static_cast<int64_t>(fs::file_size(f)));
  }
  const std::string prefix = fs::canonical(dir).string() + "/";
  const int64_t before = hp::resident_anonymous_bytes();
  qwen3::Pretrained loaded;
  double load_s = 0;
  int64_t peak = 0, mapped = 0;
  {
    hp::MemoryPeakSampler sampler(prefix);
    loaded = qwen3::from_pretrained(dir, tp, dtype, "cpu", /*progress=*/hp::get_rank() == 0);
    sampler.stop();
    peak = sampler.peak_anonymous_bytes();
    mapped = sampler.peak_file_resident_bytes();
  }
  const int64_t after = hp::resident_anonymous_bytes();
  peak = std::max(peak, after);
  const int64_t local = loaded.load.local_bytes;
  std::string tokens;
  if (generate > 0) {
    std::vector<int64_t> prompt;
    for (int64_t i = 0; i < 16; ++i) prompt.push_back(1000 + 37 * i);
    qwen3::GenerationConfig g;
    g.max_new_tokens = generate;
    const auto out = qwen3::generate(*loaded.model, {prompt}, g);
    for (size_t i = 0; i < out.tokens[0].size(); ++i) tokens += (i ? "," : "") + std::to_string(out.tokens[0][i]);
  }
  // One model at a time from here (a 4B model twice per rank would push the page cache out):
  // the floor's slices come from the same plan on a meta model.
  const qwen3::Config config = loaded.model->config;
  loaded = qwen3::Pretrained{};
  qwen3::CausalLM meta = qwen3::build_meta_model(config, tp, dtype);
  int64_t floor_bytes = 0;
  std::vector<double> floors, loads;
  for (int rep = 0; rep < 2; ++rep) {
    floors.push_back(floor_seconds(*meta, files, floor_bytes));
    const auto t0 = Clock::now();
    qwen3::from_pretrained(dir, tp, dtype, "cpu", /*progress=*/false);
    loads.push_back(seconds_since(t0));
  }
  const double floor_s = std::min(floors[0], floors[1]);
  load_s = std::min(loads[0], loads[1]);
  const double mib = 1 << 20;
  const double load_gbps = static_cast<double>(local) / 1e9 / load_s, floor_gbps = static_cast<double>(floor_bytes) / 1e9 / floor_s;
  std::printf(
      "{\"name\": \"qwen3_load\", \"dir\": \"%s\", \"tp\": %lld, \"rank\": %lld, \"local_shard_mib\": %.1f, "
      "\"rss_anon_peak_growth_mib\": %.1f, \"peak_bound_mib\": %.1f, \"rss_anon_after_growth_mib\": %.1f, \"after_bound_mib\": %.1f, "
      "\"checkpoint_resident_peak_mib\": %.1f, \"largest_file_mib\": %.1f, \"mappings_left\": %lld, \"load_s\": %.3f, "
      "\"load_gbps\": %.2f, \"floor_gbps\": %.2f, \"ratio_to_floor\": %.2f, \"tokens\": [%s]}\n",
      dir.c_str(), static_cast<long long>(world), static_cast<long long>(hp::get_rank()), local / mib, (peak - before) / mib,
      (1.03 * static_cast<double>(local) + 128 * mib) / mib, (after - before) / mib, (static_cast<double>(local) + 64 * mib) / mib,
      mapped / mib, largest / mib, static_cast<long long>(hp::file_mappings(prefix).mappings), load_s, load_gbps, floor_gbps,
      load_gbps / floor_gbps, tokens.c_str());
  std::fflush(stdout);
  hp::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return hp::run_program([&] { return run(argc, argv); }); }
