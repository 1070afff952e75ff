// HP_FAULT (fault_injection.h): parsed once, then a lookup per marked point.
#include <hyper_parallel/runtime/fault_injection.h>

#include <hyper_parallel/runtime/errors.h>
#include <hyper_parallel/runtime/process_group.h>

#include <csignal>
#include <cstdlib>
#include <sstream>
#include <vector>

namespace hyper_parallel {
namespace {

struct Fault {
  int64_t rank, step, restart;  // step -1: any
  std::string phase;
};

int64_t whole(const std::string& s, const std::string& spec) {
  size_t used = 0;
  int64_t v = -1;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  HP_CHECK_T(c10::ValueError, used == s.size() && !s.empty() && v >= 0, "hyper_parallel::fault_point: HP_FAULT='", spec, "': '", s,
             "' is not a whole number >= 0 (expected <rank>:<phase>[:<step>[:<restart>]],...)");
  return v;
}

std::vector<Fault> parse(const std::string& spec) {
  static const char* phases[] = {"forward",       "backward",     "optimizer_step", "mid_write",
                                 "mid_save",      "before_commit", "hf_mid_write",  "hf_before_swap"};
  std::vector<Fault> out;
  std::stringstream items(spec);
  std::string item;
  while (std::getline(items, item, ',')) {
    std::vector<std::string> f;
    std::stringstream parts(item);
    std::string part;
    while (std::getline(parts, part, ':')) f.push_back(part);
    HP_CHECK_T(c10::ValueError, f.size() >= 2 && f.size() <= 4, "hyper_parallel::fault_point: HP_FAULT='", spec, "': '", item,
               "' is not <rank>:<phase>[:<step>[:<restart>]]");
    bool known = false;
    for (const char* p : phases) known = known || f[1] == p;
    HP_CHECK_T(c10::ValueError, known, "hyper_parallel::fault_point: HP_FAULT='", spec, "': unknown phase '", f[1],
               "' (forward, backward, optimizer_step, mid_write, mid_save, before_commit, hf_mid_write, hf_before_swap)");
    out.push_back({whole(f[0], spec), f.size() >= 3 ? whole(f[2], spec) : -1, f.size() == 4 ? whole(f[3], spec) : 0, f[1]});
  }
  return out;
}

}  // namespace

void fault_point(const char* phase, int64_t step) {
  static const char* spec = std::getenv("HP_FAULT");
  if (spec == nullptr || *spec == '\0') return;
  static const std::vector<Fault> faults = parse(spec);
  static const int64_t restart = [] {
    const char* r = std::getenv("HPRUN_RESTART_COUNT");
    return r == nullptr ? int64_t{0} : std::atoll(r);
  }();
  const int64_t rank = is_initialized() ? get_rank() : 0;
  for (const Fault& f : faults)
    if (f.rank == rank && (f.step < 0 || f.step == step) && f.restart == restart && f.phase == phase) ::raise(SIGKILL);
}

}  // namespace hyper_parallel
