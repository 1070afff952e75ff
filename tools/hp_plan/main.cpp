// hp_plan: plans a Qwen3, Qwen3-MoE or Qwen3.5 training job of any size on this machine (the
// config's model_type decides). It plays one rank of a fake
// world, runs the demo's plan (TP over "tp", fully_shard over "dp") on the meta device, and prints
// what that rank holds and sends in one step.
//
//   hp_plan --config config.json --mesh dp=16,tp=8 [--sp] [--loss-parallel] [--batch B] [--seq S] [--json]
//           [--schedule gpipe|1f1b] [--microbatches M]   with a pp dimension, e.g. --mesh pp=8,dp=16,tp=8
//           [--cp-mode auto|ulysses|allgather_kv|ring]     with a cp dimension, e.g. --mesh dp=8,cp=4,tp=8 --seq 32768
//           [--linear-cp-mode auto|ulysses|all_gather|p2p] Qwen3.5's Gated DeltaNet under cp
//           [--rank R] [--optimizer-dtype float32|bfloat16] [--device cuda|cpu]
//           [--mixed-precision none|bf16] [--activation-checkpointing none|selective|full|full:N]
//   hp_plan --config config.json --world 128 --dp 16 [--dp-replicate 2] ...   tp takes the rest
//   hprun --nproc-per-node N hp_plan --measure ...   the same step run for real on CPU tensors
//                                                    (rank 0 prints what it measured)
#include <hyper_parallel/runtime/program.h>
#include <hyper_parallel/runtime/errors.h>
#include <hyper_parallel/runtime/process_group.h>

#include <ATen/Parallel.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include <hyper_parallel/models/hf_model_type.h>
#include <hyper_parallel/models/plan.h>
#include <hyper_parallel/models/qwen3/config.h>
#include <hyper_parallel/models/qwen3_5/config.h>

namespace qwen3 = hyper_parallel::qwen3;
namespace models = hyper_parallel::models;

namespace {

[[noreturn]] void usage(const std::string& why, bool help = false) {
  std::fprintf(help ? stdout : stderr,
               "hp_plan: %s\n"
               "usage: hp_plan --config config.json --mesh [pp=8,]dp=16,tp=8 [--sp] [--loss-parallel] [--batch B] [--seq S] [--json]\n"
               "               [--schedule gpipe|1f1b] [--microbatches M] (with pp: the batch per dp rank splits into M)\n"
               "               [--cp-mode auto|ulysses|allgather_kv|ring] (with cp: the attention algorithm)\n"
               "               [--linear-cp-mode auto|ulysses|all_gather|p2p] (Qwen3.5 with cp: the Gated DeltaNet's)\n"
               "               [--rank R] [--optimizer-dtype float32|bfloat16] [--device cuda|cpu]\n"
               "               [--mixed-precision none|bf16] [--activation-checkpointing none|selective|full|full:N]\n"
               "       hp_plan --config config.json --world N --dp N [--dp-replicate N] ... (tp takes the rest of the world)\n"
               "       hprun --nproc-per-node N hp_plan --measure ... (the step run for real, on the CPU)\n",
               why.c_str());
  std::exit(help ? 0 : 2);
}

int64_t positive(const std::string& flag, const std::string& v) {
  size_t used = 0;
  long long n = 0;
  try {
    n = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size() || n < 0) usage(flag + " takes a non-negative integer, got '" + v + "'");
  return n;
}

}  // namespace

int run(int argc, char** argv) {
  models::PlanOptions o;
  std::string config, mesh;
  int64_t world = 0, dp = 1, dp_replicate = 1;
  bool json = false, measure = false;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(f + " needs a value");
      return argv[++i];
    };
    if (f == "--config") config = value();
    else if (f == "--mesh") mesh = value();
    else if (f == "--sp") o.sequence_parallel = true;
    else if (f == "--loss-parallel") o.loss_parallel = true;
    else if (f == "--batch") o.batch = positive(f, value());
    else if (f == "--seq") o.seq = positive(f, value());
    else if (f == "--rank") o.rank = positive(f, value());
    else if (f == "--json") json = true;
    else if (f == "--schedule") o.schedule = value();
    else if (f == "--microbatches") o.microbatches = positive(f, value());
    else if (f == "--cp-mode") o.cp_mode = value();
    else if (f == "--linear-cp-mode") o.linear_cp_mode = value();
    else if (f == "--measure") measure = true;
    else if (f == "--device") o.device_type = value();
    else if (f == "--world") world = positive(f, value());
    else if (f == "--dp") dp = positive(f, value());
    else if (f == "--dp-replicate") dp_replicate = positive(f, value());
    else if (f == "--mixed-precision") {
      const std::string v = value();
      if (v != "none" && v != "bf16") usage("--mixed-precision is none or bf16, got '" + v + "'");
      if (v == "bf16") o.mixed_precision = at::kBFloat16;
    } else if (f == "--activation-checkpointing") o.activation_checkpointing = hyper_parallel::ActivationCheckpointPolicy::parse(value());
    else if (f == "--optimizer-dtype") {
      const std::string v = value();
      if (v != "float32" && v != "bfloat16") usage("--optimizer-dtype is float32 or bfloat16, got '" + v + "'");
      o.optimizer_dtype = v == "bfloat16" ? at::kBFloat16 : at::kFloat;
    } else if (f == "--help" || f == "-h") usage("plans one training step of a Qwen3, Qwen3-MoE or Qwen3.5 model on a mesh", /*help=*/true);
    else usage("unknown argument '" + f + "'");
  }
  if (config.empty()) usage("--config is required");
  if (mesh.empty() == (world == 0)) usage("give the mesh either as --mesh or as --world (with --dp, --dp-replicate)");
  // A plan that fails raises the error the real job would, and run_program prints it.
  // Without a readable model_type the config is read as Qwen3's, whose reader names what is wrong.
  std::string type;
  try {
    type = models::hf_model_type(config);
  } catch (const c10::ValueError&) {
  }
  if (models::is_qwen3_5_type(type)) o.qwen3_5 = hyper_parallel::qwen3_5::load_config(config);
  else o.config = qwen3::load_config(config);
  o.mesh = mesh.empty() ? models::mesh_from_degrees(world, dp_replicate, dp) : models::parse_mesh(mesh);
  if (measure) {
    at::set_num_threads(1);
    hyper_parallel::init_process_group();
    o.device_type = "cpu";
    const models::PlanReport r = models::measure_training(o);
    if (hyper_parallel::get_rank() == 0) std::cout << (json ? r.to_json() + "\n" : r.to_table());
    hyper_parallel::destroy_process_group();
    return 0;
  }
  const models::PlanReport r = models::plan_training(o);
  std::cout << (json ? r.to_json() + "\n" : r.to_table());
  return 0;
}

int main(int argc, char** argv) {
  return hyper_parallel::run_program([&] { return run(argc, argv); });
}
