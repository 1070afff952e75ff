#pragma once
// Deprecated: the planner serves every model family now (models/plan.h). These names stay for one
// release.
#include <hyper_parallel/models/plan.h>

namespace hyper_parallel {
namespace qwen3 {

using PlanOptions = hyper_parallel::models::PlanOptions;
using PlanReport = hyper_parallel::models::PlanReport;
using CommEntry = hyper_parallel::models::CommEntry;
using hyper_parallel::models::measure_training;
using hyper_parallel::models::mesh_from_degrees;
using hyper_parallel::models::parse_mesh;
using hyper_parallel::models::plan_training;

}  // namespace qwen3
}  // namespace hyper_parallel
