#pragma once
// Planning a training job of either model family on one machine: this process plays one rank of a
// fake world (hyper_parallel::init_fake_process_group) and runs the demo's plan on the meta device
// (parallelize_qwen3_tp or parallelize_qwen3_5_tp, fully_shard over dp, one forward and backward),
// measuring what that rank would hold and send.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <hyper_parallel/models/qwen3/model.h>
#include <hyper_parallel/models/qwen3_5/model.h>
#include <hyper_parallel/nn/activation_checkpoint.h>

namespace hyper_parallel {
namespace models {

struct PlanOptions {
  /// The Qwen3 (or Qwen3-MoE) model planned ...
  qwen3::Config config;
  /// ... unless this Qwen3.5 (or Qwen3.5-MoE) model is given: Gated DeltaNet and gated attention
  /// layers under parallelize_qwen3_5_tp (tp, sequence parallelism, KV heads replicated beyond
  /// their count), fully_shard (dp, HSDP), pipeline stages, context parallelism
  /// (parallelize_qwen3_5_cp: contiguous shards), the routed experts over ep
  /// (parallelize_qwen3_5_experts), activation checkpointing and mixed precision.
  c10::optional<qwen3_5::Config> qwen3_5;
  /// Mesh dimensions, outermost first, in the canonical order (mesh/parallel_dims.h), named "pp"
  /// (pipeline stages), "dp_replicate" (HSDP replicas), "dp" or "dp_shard" (fully_shard), "ep"
  /// (experts) and "tp" (the TP plan), e.g.
  /// {{"dp", 16}, {"tp", 8}}; their product is the world size.
  std::vector<std::pair<std::string, int64_t>> mesh;
  /// fully_shard's MixedPrecisionPolicy: gathers and compute in this dtype (e.g. bfloat16),
  /// reduction in float32, parameters (the master), gradients and optimizer state in float32.
  /// Needs a dp dimension.
  c10::optional<at::ScalarType> mixed_precision;
  /// Activation checkpointing of the decoder layers.
  hyper_parallel::ActivationCheckpointPolicy activation_checkpointing = hyper_parallel::ActivationCheckpointPolicy::none();
  bool sequence_parallel = false;
  /// lm_head's logits kept sharded over the vocabulary into the loss (no whole logits gathered).
  bool loss_parallel = false;
  int64_t batch = 1;    ///< sequences per data-parallel rank in one step
  int64_t seq = 4096;   ///< tokens per sequence
  /// Adam's two moments per parameter element, in this dtype (float32 or bfloat16).
  at::ScalarType optimizer_dtype = at::kFloat;
  /// With a "pp" mesh dimension (outermost): the schedule ("gpipe" or "1f1b") and how many
  /// microbatches `batch` splits into. This rank's stage is its pp coordinate; the report is per
  /// stage (its layers' parameters, its activations of the microbatches in flight, its transfers).
  std::string schedule = "1f1b";
  int64_t microbatches = 1;
  /// With a "cp" mesh dimension (context parallelism: each rank holds seq / cp positions of
  /// every sequence, head-tail load-balanced): the attention algorithm, "ulysses",
  /// "allgather_kv", "ring", or "auto": ulysses when cp divides the query heads a tp rank holds
  /// (key heads replicated up to cp when fewer), else allgather_kv. fully_shard then shards over
  /// dp x cp (torchtitan's dp_shard_cp), one mesh dimension "dp_cp".
  std::string cp_mode = "auto";
  /// Qwen3.5 under cp: LinearAttentionContextParallel's mode for the Gated DeltaNet layers,
  /// "ulysses", "all_gather", "p2p", or "auto": ulysses when cp divides the key and value heads a tp
  /// rank holds, else all_gather.
  std::string linear_cp_mode = "auto";
  int64_t rank = 0;             ///< which rank of the world this process plays
  std::string device_type = "cuda";  ///< what the job runs on (names only: nothing is allocated)
};

/// Collectives of one kind on one mesh dimension in one phase of the step.
struct CommEntry {
  std::string mesh_dim;    ///< "tp", "dp", or the group's ranks when it is no mesh dimension
  std::string collective;  ///< "all_reduce", "all_gather", "reduce_scatter", ...
  std::string phase;       ///< "forward" or "backward"
  int64_t count = 0;
  int64_t bytes = 0;       ///< what this rank contributes (each collective's input)
  int64_t full_bytes = 0;  ///< the whole tensors assembled or reduced (nccl-tests' size)
};

/// What one rank holds and sends in one training step, all in bytes per rank.
struct PlanReport {
  PlanOptions options;
  int64_t world_size = 0;
  int64_t param_bytes = 0;      ///< this rank's parameter shards
  /// The part of param_bytes that other tensor-parallel ranks hold too: KV heads replicated when
  /// tp > num_key_value_heads (their weights' mesh has a "kv_replica" dimension).
  int64_t kv_replica_bytes = 0;
  int64_t grad_bytes = 0;       ///< their gradients after backward, as measured
  int64_t optimizer_bytes = 0;  ///< Adam: 2 moments per local element in optimizer_dtype
  /// The peak, over one forward and backward, of the bytes of local tensors allocated during
  /// the step and freed again before it ends: saved activations, temporaries, gathered FSDP
  /// parameters, communication buffers (hyper_parallel::MemoryTracker on the meta device).
  int64_t activation_peak_bytes = 0;
  /// Everything this rank holds at the step's worst moment: parameters, optimizer state, and
  /// the step's peak of live allocations (activations plus the gradients made by then).
  int64_t step_peak_bytes = 0;
  /// Pipeline (a "pp" mesh dimension): this rank's stage of num_stages, the microbatches whose
  /// activations it holds at once (GPipe: m, 1F1B: min(m, p - stage)), the activation bytes one
  /// microbatch leaves saved after its forward, the bytes of one activation transfer to the next
  /// stage (the gradient coming back is as large), and the schedule's bubble (p - 1) / (m + p - 1).
  int64_t stage = 0, num_stages = 1, microbatches_in_flight = 1;
  int64_t microbatch_saved_bytes = 0, p2p_bytes_per_microbatch = 0;
  double bubble_fraction = 0;
  /// Context parallelism: its degree and the attention algorithm used (cp_mode resolved), and for
  /// Qwen3.5 the Gated DeltaNet's (linear_cp_mode resolved).
  int64_t cp = 1;
  std::string cp_mode, linear_cp_mode;
  /// Qwen3.5: the recurrent state this rank's Gated DeltaNet layers carry per microbatch
  /// (rows · nv/tp · dk · dv float32 per layer), the analytic count the comm entries' cp bytes
  /// follow from.
  int64_t gdn_state_bytes = 0;
  /// Collectives per step. With microbatches, one microbatch's forward and backward collectives
  /// are counted m times, FSDP's gradient reduction (reduce_scatter, HSDP's all_reduce) once.
  std::vector<CommEntry> comm;
  double seconds = 0;     ///< wall time of the planning (or the measured run) itself
  bool measured = false;  ///< a real run on CPU tensors (measure_training), not a plan

  /// A table for people.
  std::string to_table() const;
  /// One JSON object: param_bytes, grad_bytes, optimizer_bytes, activation_peak_bytes,
  /// step_peak_bytes, comm [{mesh_dim, collective, phase, count, bytes, full_bytes}], and the options.
  std::string to_json() const;

 private:
  std::string optimizer_dtype_row() const;
};

/// Plans one training step of `options` as rank `options.rank` of a fake world of the mesh's
/// size: initialises that world (refused when a process group exists already), builds the
/// model on the meta device in config.dtype, applies the demo's plan, runs forward, the loss and
/// backward on meta token ids [batch, seq], and tears the world down again. A plan the real run
/// would refuse (indivisible dims, heads that do not divide tp) raises the same error here.
/// e.g. `auto r = models::plan_training(o); std::cout << r.to_table();`
PlanReport plan_training(const PlanOptions& options);

/// The same step run for real, on CPU tensors, in the current job (init_process_group, as many
/// ranks as the mesh holds; options.device_type must be the job's): the parameters, gradients
/// and communication it measures, and its activation peak counted by a MemoryTracker on the
/// CPU allocator. What plan_training estimates is checked against this.
PlanReport measure_training(const PlanOptions& options);

/// The flags' rule (mesh/parallel_dims.h): dp_replicate x dp x tp with tp = world / (dp_replicate
/// x dp), dimensions of size 1 left out (c10::ValueError when it does not divide).
std::vector<std::pair<std::string, int64_t>> mesh_from_degrees(int64_t world, int64_t dp_replicate, int64_t dp);

/// "dp=8,cp=4,tp=8" as PlanOptions::mesh (c10::ValueError for anything else).
std::vector<std::pair<std::string, int64_t>> parse_mesh(const std::string& text);

}  // namespace models
}  // namespace hyper_parallel
