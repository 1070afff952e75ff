#pragma once
// hyper_parallel: PyTorch-style declarative tensor parallelism for libtorch.
// The umbrella header: everything a user needs, e.g.
//   hp::init_process_group();
//   auto tp = hp::init_device_mesh("cpu", {2}, {"tp"});
//   auto w = hp::distribute_tensor(weight, tp, {hp::Shard(0)});
#include <hyper_parallel/runtime/chunking.h>
#include <hyper_parallel/runtime/collectives.h>
#include <hyper_parallel/runtime/point_to_point.h>
#include <hyper_parallel/runtime/comm_debug_mode.h>
#include <hyper_parallel/runtime/control.h>
#include <hyper_parallel/runtime/device_checks.h>
#include <hyper_parallel/runtime/errors.h>
#include <hyper_parallel/runtime/launch_env.h>
#include <hyper_parallel/runtime/memory_tracker.h>
#include <hyper_parallel/runtime/process_group.h>
#include <hyper_parallel/runtime/process_memory.h>
#include <hyper_parallel/runtime/program.h>
#include <hyper_parallel/mesh/device_mesh.h>
#include <hyper_parallel/mesh/parallel_dims.h>
#include <hyper_parallel/dtensor/placement.h>
#include <hyper_parallel/dtensor/dtensor_spec.h>
#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/dtensor/explicit_redistribution.h>
#include <hyper_parallel/dtensor/random.h>
#include <hyper_parallel/dtensor/redistribute_plan.h>
#include <hyper_parallel/dtensor/sharding_rule.h>
#include <hyper_parallel/nn/module.h>
#include <hyper_parallel/nn/layers.h>
#include <hyper_parallel/nn/init_parameters.h>
#include <hyper_parallel/nn/clip_grad.h>
#include <hyper_parallel/nn/activation_checkpoint.h>
#include <hyper_parallel/nn/functional_collectives.h>
#include <hyper_parallel/nn/moe.h>
#include <hyper_parallel/nn/attention.h>
#include <hyper_parallel/platform/platform.h>
#include <hyper_parallel/tensor_parallel/distribute_module.h>
#include <hyper_parallel/tensor_parallel/style.h>
#include <hyper_parallel/tensor_parallel/api.h>
#include <hyper_parallel/expert_parallel/expert_parallel.h>
#include <hyper_parallel/context_parallel/context_parallel.h>
#include <hyper_parallel/pipelining/schedule_order.h>
#include <hyper_parallel/pipelining/stage.h>
#include <hyper_parallel/pipelining/schedules.h>
#include <hyper_parallel/fsdp/fully_shard.h>
#include <hyper_parallel/checkpoint/sharded_checkpoint.h>
#include <hyper_parallel/checkpoint/hf_checkpoint.h>
#include <hyper_parallel/checkpoint/safetensors.h>
