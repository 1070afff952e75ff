#pragma once
// Reading an HF config.json's fields with checks (internal to the models library): every family's
// config_from_json refuses a missing key or a value of the wrong type by name, the same way.
#include <hyper_parallel/runtime/errors.h>

#include <ATen/core/ATen_fwd.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Optional.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace hyper_parallel {
namespace models {

struct HFConfigReader {
  const nlohmann::json& j;
  const std::string& origin;  // the file, for messages
  const char* function;       // e.g. "qwen3::config_from_json", for messages
  [[noreturn]] void fail(const std::string& why) const {
    HP_CHECK_T(c10::ValueError, false, "hyper_parallel::", function, ": ", origin, ": ", why);
  }
  bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }
  int64_t integer(const char* key, int64_t lo) const {
    if (!has(key)) fail(std::string("'") + key + "' is missing");
    if (!j[key].is_number_integer() || j[key].get<int64_t>() < lo)
      fail(std::string("'") + key + "' must be an integer >= " + std::to_string(lo) + ", got " + j[key].dump());
    return j[key].get<int64_t>();
  }
  double number(const nlohmann::json& v, const char* key) const {
    if (!v.is_number() || !(v.get<double>() > 0)) fail(std::string("'") + key + "' must be a positive number, got " + v.dump());
    return v.get<double>();
  }
  bool boolean(const char* key) const {
    if (!j[key].is_boolean()) fail(std::string("'") + key + "' must be true or false");
    return j[key].get<bool>();
  }
  // An id or a list of ids (transformers accepts both for eos_token_id).
  std::vector<int64_t> ids(const char* key) const {
    std::vector<int64_t> out;
    if (!has(key)) return out;
    const nlohmann::json& v = j[key];
    if (v.is_number_integer()) return {v.get<int64_t>()};
    if (!v.is_array()) fail(std::string("'") + key + "' must be an integer or a list of integers, got " + v.dump());
    for (const auto& x : v) {
      if (!x.is_number_integer()) fail(std::string("'") + key + "' must be an integer or a list of integers, got " + v.dump());
      out.push_back(x.get<int64_t>());
    }
    return out;
  }
  // eos_token_id (an id or a list), bos_token_id and pad_token_id (the first of a list), when given.
  void token_ids(std::vector<int64_t>& eos, c10::optional<int64_t>& bos, c10::optional<int64_t>& pad) const {
    eos = ids("eos_token_id");
    const auto b = ids("bos_token_id"), p = ids("pad_token_id");
    if (!b.empty()) bos = b[0];
    if (!p.empty()) pad = p[0];
  }
  // "dtype" (transformers 5) or "torch_dtype" (older): float32, bfloat16 or float16.
  at::ScalarType dtype() const {
    for (const char* key : {"dtype", "torch_dtype"}) {
      if (!has(key)) continue;
      if (!j[key].is_string()) fail(std::string("'") + key + "' must be a string, got " + j[key].dump());
      const std::string name = j[key].get<std::string>();
      if (name == "float32") return at::kFloat;
      if (name == "bfloat16") return at::kBFloat16;
      if (name == "float16") return at::kHalf;
      fail(std::string("'") + key + "' is '" + name + "'; supported: float32, bfloat16, float16");
    }
    return at::kFloat;
  }
};

/// `text` parsed as a JSON object, or a ValueError naming `function` and `origin`.
inline nlohmann::json parse_config(const std::string& text, const std::string& origin, const char* function) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    HP_CHECK_T(c10::ValueError, false, "hyper_parallel::", function, ": ", origin, ": not valid JSON (", e.what(), ")");
  }
  HP_CHECK_T(c10::ValueError, j.is_object(), "hyper_parallel::", function, ": ", origin, ": not a JSON object");
  return j;
}

/// The name config.json gives `t` ("float32" for anything but bfloat16 and float16).
inline const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default: return "float32";
  }
}

/// Writes eos_token_id (an id, or a list of several), bos_token_id and pad_token_id when known.
inline void write_token_ids(nlohmann::json& j, const std::vector<int64_t>& eos, const c10::optional<int64_t>& bos,
                            const c10::optional<int64_t>& pad) {
  if (eos.size() == 1) j["eos_token_id"] = eos[0];
  else if (!eos.empty()) j["eos_token_id"] = eos;
  if (bos) j["bos_token_id"] = *bos;
  if (pad) j["pad_token_id"] = *pad;
}

/// The text of config.json at `path`, or a ValueError naming `function` and the path.
inline std::string read_config_text(const std::string& path, const char* function) {
  std::ifstream in(path);
  HP_CHECK_T(c10::ValueError, in.good(), "hyper_parallel::", function, ": cannot read ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace models
}  // namespace hyper_parallel
