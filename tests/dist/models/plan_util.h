#pragma once
// What the planner's tests share: paths from CTest's environment, running a command, and the
// same step run for real (hp_plan --measure under hprun) with rank 0's JSON report.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

namespace plan_util {

// Paths from CTest's environment (tests/CMakeLists.txt).
inline std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : v;
}
inline std::string repo_file(const std::string& rel) { return env("HP_SOURCE_DIR") + "/" + rel; }

inline std::string run(const std::string& command) {
  std::string out;
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen((command + " 2>&1").c_str(), "r"), pclose);
  if (!p) return "popen failed";
  std::array<char, 4096> buf;
  while (size_t n = std::fread(buf.data(), 1, buf.size(), p.get())) out.append(buf.data(), n);
  return out;
}

// The same step run for real: hp_plan --measure in a job of `nproc` ranks; rank 0's JSON.
inline std::string real_run(const std::string& config, const std::string& mesh, int nproc, bool sp, int64_t batch, int64_t seq,
                            const std::string& extra = "") {
  return run(env("HPRUN_BIN") + " --nproc-per-node " + std::to_string(nproc) + " " + env("HP_PLAN_BIN") +
             " --measure --json --config " + config + " --mesh " + mesh + (sp ? " --sp" : "") + " --batch " +
             std::to_string(batch) + " --seq " + std::to_string(seq) + " " + extra);
}

// hprun prefixes each line with its rank; rank 0 prints the JSON. False when there is none.
inline bool rank0_json(const std::string& out, nlohmann::json& parsed) {
  std::string json;
  for (size_t at = 0; at < out.size();) {
    const size_t end = std::min(out.find('\n', at), out.size());
    const std::string line = out.substr(at, end - at);
    if (line.rfind("[rank0]: ", 0) == 0) json += line.substr(9) + "\n";
    at = end + 1;
  }
  try {
    parsed = nlohmann::json::parse(json);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

}  // namespace plan_util
