#include <hyper_parallel/models/hf_model_type.h>

#include "hf_config_reader.h"

#include <filesystem>

namespace hyper_parallel {
namespace models {

std::string hf_model_type(const std::string& where) {
  const std::string path = std::filesystem::is_directory(where) ? where + "/config.json" : where;
  const nlohmann::json j = parse_config(read_config_text(path, "models::hf_model_type"), path, "models::hf_model_type");
  HP_CHECK_T(c10::ValueError, j.contains("model_type") && j["model_type"].is_string(), "hyper_parallel::models::hf_model_type: ", path,
             ": 'model_type' is missing or not a string");
  return j["model_type"].get<std::string>();
}

}  // namespace models
}  // namespace hyper_parallel
