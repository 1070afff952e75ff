#include <hyper_parallel/models/plan.h>

#include <hyper_parallel/hyper_parallel.h>

#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <sstream>

#include <hyper_parallel/models/qwen3/parallelize.h>
#include <hyper_parallel/models/qwen3_5/parallelize.h>

namespace hp = hyper_parallel;
namespace hnn = hyper_parallel::nn;

namespace hyper_parallel {
namespace models {
namespace {

int64_t bytes_of(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// Tears down the fake world however planning ends.
struct FakeWorld {
  FakeWorld(int64_t size, int64_t rank, const std::string& device_type) {
    hp::InitOptions o;
    o.device_type = device_type;
    hp::init_fake_process_group(size, rank, o);
  }
  ~FakeWorld() { hp::destroy_process_group(); }
};

}  // namespace

std::vector<std::pair<std::string, int64_t>> mesh_from_degrees(int64_t world, int64_t dp_replicate, int64_t dp) {
  hp::ParallelDims d;
  d.dp_replicate = dp_replicate;
  d.dp_shard = dp;
  d = hp::ParallelDims::with_tp_rest(world, d);
  std::vector<std::pair<std::string, int64_t>> out;
  if (d.dp_replicate > 1) out.emplace_back("dp_replicate", d.dp_replicate);
  if (d.dp_shard > 1 || d.dp_replicate > 1) out.emplace_back("dp", d.dp_shard);
  if (d.tp > 1 || out.empty()) out.emplace_back("tp", d.tp);
  return out;
}

std::vector<std::pair<std::string, int64_t>> parse_mesh(const std::string& text) {
  std::vector<std::pair<std::string, int64_t>> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t eq = item.find('=');
    HP_CHECK_T(c10::ValueError, eq != std::string::npos && eq > 0 && eq + 1 < item.size(), "hyper_parallel::models::parse_mesh: --mesh '", text,
               "': each dimension is name=size, e.g. dp=16,tp=8");
    size_t used = 0;
    int64_t n = 0;
    try {
      n = std::stoll(item.substr(eq + 1), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    HP_CHECK_T(c10::ValueError, used == item.size() - eq - 1 && n > 0, "hyper_parallel::models::parse_mesh: --mesh '", text, "': the size of '",
               item.substr(0, eq), "' must be a positive integer");
    out.emplace_back(item.substr(0, eq), n);
  }
  HP_CHECK_T(c10::ValueError, !out.empty(), "hyper_parallel::models::parse_mesh: --mesh is empty; e.g. dp=16,tp=8");
  return out;
}

namespace {

// The mesh of `options` after checking its dimensions; `world` receives its size.
struct MeshShape {
  std::vector<int64_t> shape;
  std::vector<std::string> names;
  int64_t world = 1, tp = 1, dp = 1, dp_replicate = 1, ep = 1, pp = 1, cp = 1;
  std::string dp_name = "dp";
  std::string cp_mode, linear_cp_mode;
  // The dimension FSDP (and the experts' FSDP) shards over: dp, or "dp_cp" with context parallelism.
  std::string data_name() const { return cp > 1 ? "dp_cp" : dp_name; }
};

// `what`: the function's name below hyper_parallel:: ("models::plan_training").
MeshShape mesh_shape_of(const PlanOptions& options, const char* what) {
  HP_CHECK_T(c10::ValueError, options.batch > 0 && options.seq > 0, "hyper_parallel::", what, ": batch ", options.batch, " and seq ",
             options.seq, " must be positive");
  HP_CHECK_T(c10::ValueError, options.optimizer_dtype == at::kFloat || options.optimizer_dtype == at::kBFloat16, "hyper_parallel::",
             what, ": the optimizer state is float32 or bfloat16, got ", options.optimizer_dtype);
  MeshShape m;
  // The canonical order; dp_shard is dp; ep borrows its ranks from the data ranks (it holds
  // different tokens), so it sits between dp and tp.
  const std::vector<std::string> order{"pp", "dp_replicate", "dp", "cp", "ep", "tp"};
  size_t last = 0;
  for (const auto& [given, size] : options.mesh) {
    const std::string name = given == "dp_shard" ? "dp" : given;
    const auto at = std::find(order.begin(), order.end(), name);
    HP_CHECK_T(c10::ValueError, at != order.end(), "hyper_parallel::", what, ": mesh dimension '", given,
               "': the demo's plan shards over 'pp' (pipeline stages), 'dp_replicate' (HSDP), 'dp' or 'dp_shard' (fully_shard), 'cp' (context parallelism), 'ep' (experts, MoE models) and 'tp' (tensor parallelism) only");
    const size_t index = static_cast<size_t>(at - order.begin()) + 1;
    HP_CHECK_T(c10::ValueError, index > last, "hyper_parallel::", what, ": mesh dimension '", given,
               "' is repeated or out of the canonical order pp, dp_replicate, dp, cp, ep, tp");
    last = index;
    (name == "tp" ? m.tp : name == "dp" ? m.dp : name == "ep" ? m.ep : name == "pp" ? m.pp : name == "cp" ? m.cp : m.dp_replicate) = size;
    if (name == "dp") m.dp_name = given;
    m.shape.push_back(size);
    m.names.push_back(given);
    m.world *= size;
  }
  HP_CHECK_T(c10::ValueError, !m.shape.empty(), "hyper_parallel::", what, ": the mesh is empty");
  HP_CHECK_T(c10::ValueError, m.dp_replicate == 1 || options.mesh.size() > 1, "hyper_parallel::", what,
             ": HSDP replicates a sharded group: a dp_replicate dimension needs a dp one");
  HP_CHECK_T(c10::ValueError, !options.mixed_precision || m.dp * m.dp_replicate * m.ep > 1, "hyper_parallel::", what,
             ": mixed precision is fully_shard's (MixedPrecisionPolicy): it needs a dp dimension larger than 1");
  if (m.pp > 1) {
    const hp::ScheduleKind kind = hp::schedule_kind(options.schedule);
    HP_CHECK_T(c10::ValueError, kind != hp::ScheduleKind::Interleaved1F1B, "hyper_parallel::", what,
               ": interleaved_1f1b (virtual stages) is not planned yet; plan gpipe or 1f1b");
    HP_CHECK_T(c10::ValueError, options.microbatches >= 1 && options.batch % options.microbatches == 0, "hyper_parallel::", what, ": batch ",
               options.batch, " does not split into ", options.microbatches, " microbatches");
    if (options.qwen3_5) qwen3_5::pipeline_stage_span(*options.qwen3_5, 0, m.pp);  // enough layers, untied
    else qwen3::pipeline_stage_span(options.config, 0, m.pp);
  }
  const bool moe = options.qwen3_5 ? options.qwen3_5->is_moe() : options.config.is_moe();
  if (m.cp > 1) {
    HP_CHECK_T(c10::ValueError, m.dp_replicate == 1, "hyper_parallel::", what,
               ": context parallelism with HSDP is not planned yet (plan dp, cp and tp, with pp and ep if wanted)");
    // Qwen3's attention is load-balanced head-tail; Qwen3.5's Gated DeltaNet reads the sequence
    // in order, so its shards are contiguous.
    const int64_t parts = options.qwen3_5 ? m.cp : 2 * m.cp;
    HP_CHECK_T(c10::ValueError, options.seq % parts == 0, "hyper_parallel::", what, ": a sequence of ", options.seq,
               " positions cannot be split over cp = ", m.cp, options.qwen3_5 ? " (" : " with load_balance (2·cp = ", parts, " equal parts)");
    const int64_t num_heads = options.qwen3_5 ? options.qwen3_5->num_heads : options.config.num_heads;
    HP_CHECK_T(c10::ValueError, num_heads % m.tp == 0, "hyper_parallel::", what, ": tp = ", m.tp, " does not divide the ", num_heads,
               " query heads");
    const int64_t heads = num_heads / m.tp;
    m.cp_mode = options.cp_mode == "auto" ? (heads % m.cp == 0 ? "ulysses" : "allgather_kv") : options.cp_mode;
    HP_CHECK_T(c10::ValueError, m.cp_mode == "ulysses" || m.cp_mode == "allgather_kv" || m.cp_mode == "ring", "hyper_parallel::", what,
               ": cp_mode must be auto, ulysses, allgather_kv or ring, got \"", options.cp_mode, "\"");
    HP_CHECK_T(c10::ValueError, m.cp_mode != "ulysses" || heads % m.cp == 0, "hyper_parallel::", what, ": ulysses splits the ", heads,
               " query heads of a tp rank over cp = ", m.cp, ", which does not divide them; plan allgather_kv or ring");
    if (options.qwen3_5) {
      // The Gated DeltaNet: ulysses when cp divides the key and value heads a tp rank holds,
      // else the state summaries gathered.
      const qwen3_5::Config& c = *options.qwen3_5;
      const bool splits = c.linear_num_key_heads % (m.tp * m.cp) == 0 && c.linear_num_value_heads % (m.tp * m.cp) == 0;
      m.linear_cp_mode = options.linear_cp_mode == "auto" ? (splits ? "ulysses" : "all_gather") : options.linear_cp_mode;
      HP_CHECK_T(c10::ValueError, m.linear_cp_mode == "ulysses" || m.linear_cp_mode == "all_gather" || m.linear_cp_mode == "p2p",
                 "hyper_parallel::", what, ": linear_cp_mode must be auto, ulysses, all_gather or p2p, got \"", options.linear_cp_mode, "\"");
      HP_CHECK_T(c10::ValueError, m.linear_cp_mode != "ulysses" || splits, "hyper_parallel::", what, ": ulysses splits the ",
                 c.linear_num_key_heads / m.tp, " key heads and ", c.linear_num_value_heads / m.tp, " value heads of a tp rank over cp = ", m.cp,
                 ", which does not divide them; plan all_gather or p2p");
      HP_CHECK_T(c10::ValueError, options.seq / m.cp >= c.linear_conv_kernel_dim - 1, "hyper_parallel::", what, ": ", options.seq / m.cp,
                 " positions per cp rank are fewer than the Gated DeltaNet's convolution halo (", c.linear_conv_kernel_dim - 1, ")");
    }
    // fully_shard over dp x cp: one mesh dimension of both (the cp groups come from unflattening it).
    const auto cp_at = std::find(m.names.begin(), m.names.end(), "cp");
    const size_t i = static_cast<size_t>(cp_at - m.names.begin());
    const auto dp_at = std::find(m.names.begin(), m.names.end(), m.dp_name);
    if (dp_at != m.names.end()) {
      m.shape.erase(m.shape.begin() + static_cast<std::ptrdiff_t>(i));
      m.names.erase(m.names.begin() + static_cast<std::ptrdiff_t>(i));
      const size_t d = static_cast<size_t>(dp_at - m.names.begin());
      m.shape[d] *= m.cp;
      m.names[d] = "dp_cp";
    } else {
      m.names[i] = "dp_cp";
    }
  }
  if (m.ep > 1) {
    HP_CHECK_T(c10::ValueError, moe, "hyper_parallel::", what, ": an 'ep' dimension needs a mixture-of-experts config (num_experts > 0)");
    HP_CHECK_T(c10::ValueError, m.dp_replicate == 1, "hyper_parallel::", what, ": 'ep' with 'dp_replicate' is not planned yet (use dp and ep)");
    HP_CHECK_T(c10::ValueError, options.qwen3_5 || !options.sequence_parallel || m.tp == 1, "hyper_parallel::", what,
               ": sequence parallelism with Qwen3-MoE layers is not supported (their blocks take the replicated stream)");
    // The experts are fully_shard-ed over dp (dp x cp): the mesh always has one (of size 1 when
    // not given).
    if (m.dp == 1 && m.cp == 1) {
      const auto at = std::find(m.names.begin(), m.names.end(), "ep");
      const size_t i = static_cast<size_t>(at - m.names.begin());
      m.names.insert(m.names.begin() + static_cast<std::ptrdiff_t>(i), "dp");
      m.shape.insert(m.shape.begin() + static_cast<std::ptrdiff_t>(i), 1);
    }
  }
  return m;
}

at::ScalarType config_dtype(const PlanOptions& o) { return o.qwen3_5 ? o.qwen3_5->dtype : o.config.dtype; }

// One family's model of the plan (this rank's pipeline stage), laid out by the demo's plan up to
// fully_shard over the data ranks, which run_step applies to `layers` and `root` alike.
struct Built {
  std::shared_ptr<torch::nn::Module> root;
  std::vector<std::shared_ptr<torch::nn::Module>> layers;
  bool embedding = true, head = true;
  int64_t vocab_size = 0, hidden_size = 0;
  hp::DeviceMesh cp_mesh;
  std::function<at::Tensor(const at::Tensor&, const hnn::Kwargs&)> forward;
};

template <class Holder>
void describe(Built& b, Holder model) {
  b.root = model.ptr();
  for (const auto& layer : *model->layers) b.layers.push_back(layer);
  b.embedding = static_cast<bool>(model->embed_tokens);
  b.head = static_cast<bool>(model->lm_head);
  b.forward = [model](const at::Tensor& x, const hnn::Kwargs& kw) mutable { return kw.empty() ? model(x) : model(x, kw); };
}

// The routed experts fully_shard-ed over the data ranks that hold the same experts (dp, or dp x
// cp), their gradients' sum divided by every data rank (dp x cp x ep); the rest is sharded over
// all of those by run_step.
template <class Layer, class Model>
void shard_experts(Model& model, const PlanOptions& options, const MeshShape& m, const hp::DeviceMesh& mesh) {
  hp::FullyShardOptions eo;
  if (options.mixed_precision) eo.mp_policy = {*options.mixed_precision, at::kFloat, c10::nullopt, true};
  eo.gradient_divide_factor = static_cast<double>(m.dp * m.cp * m.ep);
  for (const auto& layer : *model.layers)
    if (auto moe = layer->template as<Layer>()->moe) hp::fully_shard(*moe->experts, mesh[m.data_name()], eo);
}

Built build_qwen3(const PlanOptions& options, const MeshShape& m, const hp::DeviceMesh& mesh, const std::string& device, at::ScalarType dtype) {
  using namespace hyper_parallel::qwen3;
  CausalLM model{nullptr};
  {
    const hnn::ParameterScope scope(at::TensorOptions().device(device).dtype(dtype));
    if (device != "meta") hp::manual_seed(0);  // the same weights on every rank of a real run
    model = CausalLM(options.config, m.pp > 1 ? pipeline_stage_span(options.config, mesh.get_local_rank(0), m.pp) : StageSpan{});
  }
  hp::apply_activation_checkpointing(*model, options.activation_checkpointing);
  if (m.tp > 1) parallelize_qwen3_tp(*model, mesh["tp"], options.sequence_parallel, options.loss_parallel);
  Built b;
  if (m.ep > 1) {
    // Experts over ep (with tp: ExpertTensorParallel), fully_shard-ed over dp with the sum over
    // every data rank divided by their number; the rest over dp x ep (HSDP: replicated over dp).
    parallelize_qwen3_experts(*model, m.tp > 1 ? mesh[{"ep", "tp"}] : mesh["ep"]);
    shard_experts<DecoderLayerImpl>(*model, options, m, mesh);
  }
  if (m.cp > 1) {
    b.cp_mesh = mesh["dp_cp"].unflatten(0, {m.dp, m.cp}, {"dp", "cp"})["cp"];
    parallelize_qwen3_cp(*model, b.cp_mesh, m.cp_mode, /*load_balance=*/true);
  }
  describe(b, model);
  b.vocab_size = options.config.vocab_size;
  b.hidden_size = options.config.hidden_size;
  return b;
}

Built build_qwen3_5(const PlanOptions& options, const MeshShape& m, const hp::DeviceMesh& mesh, const std::string& device, at::ScalarType dtype) {
  using namespace hyper_parallel::qwen3_5;
  const Config& c = *options.qwen3_5;
  CausalLM model{nullptr};
  {
    const hnn::ParameterScope scope(at::TensorOptions().device(device).dtype(dtype));
    if (device != "meta") hp::manual_seed(0);
    model = CausalLM(c, m.pp > 1 ? pipeline_stage_span(c, mesh.get_local_rank(0), m.pp) : StageSpan{});
  }
  hp::apply_activation_checkpointing(*model, options.activation_checkpointing);
  if (m.tp > 1) parallelize_qwen3_5_tp(*model, mesh["tp"], options.sequence_parallel, options.loss_parallel);
  Built b;
  if (m.ep > 1) {
    // Routed experts over ep (with tp: ExpertTensorParallel on [ep, tp]), tokens by all-to-all.
    parallelize_qwen3_5_experts(*model, m.tp > 1 ? mesh[{"ep", "tp"}] : mesh["ep"]);
    shard_experts<DecoderLayerImpl>(*model, options, m, mesh);
  } else if (c.is_moe() && m.tp > 1) {
    // Every tp rank holds the same tokens: the experts over the tp ranks, their outputs summed.
    parallelize_qwen3_5_experts(*model, mesh["tp"], /*tensor_parallel=*/c.num_experts % m.tp != 0, "all_reduce");
  }
  if (m.cp > 1) {
    b.cp_mesh = mesh["dp_cp"].unflatten(0, {m.dp, m.cp}, {"dp", "cp"})["cp"];
    parallelize_qwen3_5_cp(*model, b.cp_mesh, m.linear_cp_mode, m.cp_mode);
  }
  describe(b, model);
  b.vocab_size = c.vocab_size;
  b.hidden_size = c.hidden_size;
  return b;
}

// One training step of the demo's plan in the current world, with tensors on `device` ("meta":
// shapes only; "cpu": real values), measured.
PlanReport run_step(const PlanOptions& options, const MeshShape& m, const std::string& device) {
  const auto start = std::chrono::steady_clock::now();
  const hp::DeviceMesh mesh = hp::init_device_mesh(options.device_type, m.shape, m.names);
  // With mixed precision the sharded parameters are the float32 master; fully_shard gathers
  // them in the compute dtype.
  const at::ScalarType param_dtype = options.mixed_precision ? at::kFloat : config_dtype(options);
  Built model = options.qwen3_5 ? build_qwen3_5(options, m, mesh, device, param_dtype) : build_qwen3(options, m, mesh, device, param_dtype);
  const hp::DeviceMesh& cp_mesh = model.cp_mesh;
  hp::FullyShardOptions o;
  if (options.mixed_precision) o.mp_policy = {*options.mixed_precision, at::kFloat, c10::nullopt, true};
  if (m.cp > 1 || m.dp * m.dp_replicate * m.ep > 1) {
    // The data ranks: dp x cp (one "dp_cp" dimension) with context parallelism, dp (HSDP:
    // dp_replicate x dp), or dp x ep with experts.
    const hp::DeviceMesh data = m.ep > 1 ? mesh[{m.data_name(), "ep"}]
                                : m.cp > 1 ? mesh["dp_cp"]
                                : m.dp_replicate > 1 ? mesh[{"dp_replicate", m.dp_name}] : mesh[m.dp_name];
    for (const auto& layer : model.layers) hp::fully_shard(*layer, data, o);
    // The logits in float32 for the loss; a stage without the head hands on the compute dtype.
    if (options.mixed_precision && model.head) o.mp_policy.output_dtype = at::kFloat;
    hp::fully_shard(*model.root, data, o);
  }
  model.root->train();

  PlanReport r;
  r.options = options;
  r.world_size = m.world;
  r.measured = device != "meta";
  r.cp = m.cp;
  r.cp_mode = m.cp_mode;
  r.linear_cp_mode = m.linear_cp_mode;
  const std::vector<at::Tensor> params = hp::unique_parameters(*model.root);  // tied weights count once
  int64_t elements = 0;
  for (const at::Tensor& p : params) {
    const at::Tensor l = hp::local_tensor(p);
    r.param_bytes += bytes_of(l);
    if (hp::is_dtensor(p)) {
      const auto& names = hp::DTensor(p).device_mesh().mesh_dim_names();
      if (std::find(names.begin(), names.end(), "kv_replica") != names.end()) r.kv_replica_bytes += bytes_of(l);
    }
    elements += l.numel();
  }
  r.optimizer_bytes = 2 * elements * static_cast<int64_t>(c10::elementSize(options.optimizer_dtype));

  // A pipeline stage runs one microbatch: its input is the token ids (the first stage) or the
  // previous stage's hidden states (sequence-sharded over tp with sequence parallelism).
  const int64_t m_count = m.pp > 1 ? options.microbatches : 1, rows = options.batch / m_count;
  const auto ids_options = at::TensorOptions().dtype(at::kLong).device(device);
  // With context parallelism each rank holds seq / cp positions (their positions drive rotary).
  const int64_t local_seq = options.seq / m.cp;
  const at::Tensor ids = device == "meta" ? at::empty({rows, local_seq}, ids_options)
                                          : at::randint(model.vocab_size, {rows, local_seq}, ids_options);
  hnn::Kwargs positions;
  if (m.cp > 1)
    positions.emplace_back("position_ids",
                           hp::context_parallel_positions(options.seq, cp_mesh, /*load_balance=*/!options.qwen3_5).unsqueeze(0).to(device));
  if (options.qwen3_5) {
    const qwen3_5::Config& c = *options.qwen3_5;
    int64_t linear_layers = 0;
    for (const auto& layer : model.layers) linear_layers += static_cast<qwen3_5::DecoderLayerImpl&>(*layer).linear_attn ? 1 : 0;
    r.gdn_state_bytes = linear_layers * rows * (c.linear_num_value_heads / m.tp) * c.linear_key_head_dim * c.linear_value_head_dim * 4;
  }
  at::Tensor input = ids;
  if (!model.embedding) {
    const at::ScalarType act = options.mixed_precision ? *options.mixed_precision : config_dtype(options);
    const bool sharded = options.sequence_parallel && m.tp > 1;
    const at::Tensor local = at::randn({rows, sharded ? local_seq / m.tp : local_seq, model.hidden_size},
                                       at::TensorOptions().dtype(act).device(device));
    input = sharded ? hp::DTensor::from_local(local, mesh["tp"], {hp::Shard(1)}) : local;
    input.requires_grad_(true);
    r.p2p_bytes_per_microbatch = bytes_of(local);
  }
  hp::CommDebugMode comm;
  int64_t transient = 0, peak = 0;
  {
    hp::MemoryTracker mem(device);
    const at::Tensor out = model.forward(input, positions);
    r.microbatch_saved_bytes = mem.live_bytes();
    if (model.head) {
      qwen3::causal_lm_loss(out, ids).backward();
    } else {
      r.p2p_bytes_per_microbatch = bytes_of(hp::local_tensor(out));
      torch::autograd::backward({out}, {at::ones_like(out)});
    }
    transient = mem.transient_peak_bytes();
    peak = mem.peak_bytes();
  }
  if (m.pp > 1) {
    const hp::ScheduleKind kind = hp::schedule_kind(options.schedule);
    r.stage = mesh.get_local_rank(0);
    r.num_stages = m.pp;
    r.microbatches_in_flight = kind == hp::ScheduleKind::GPipe ? m_count : std::min(m_count, m.pp - r.stage);
    r.bubble_fraction = hp::bubble_fraction(kind, m.pp, m_count);
    // The other microbatches in flight keep what one leaves saved after its forward.
    transient += (r.microbatches_in_flight - 1) * r.microbatch_saved_bytes;
    peak += (r.microbatches_in_flight - 1) * r.microbatch_saved_bytes;
  }
  for (const at::Tensor& p : params) {
    const at::Tensor g = p.grad();
    if (g.defined()) r.grad_bytes += bytes_of(hp::local_tensor(g));
  }
  r.activation_peak_bytes = transient;
  r.step_peak_bytes = r.param_bytes + r.optimizer_bytes + peak;

  // Each group's collectives under the mesh dimension it is.
  std::map<std::vector<int64_t>, std::string> dim_of;
  for (int64_t d = 0; d < mesh.ndim(); ++d) dim_of[mesh.get_group(d).ranks()] = m.names[static_cast<size_t>(d)];
  if (m.cp > 1) dim_of[cp_mesh.get_group(0).ranks()] = "cp";
  // Replicated KV heads: their gradients summed over the replicas of a head.
  for (const at::Tensor& p : params)
    if (hp::is_dtensor(p)) {
      const hp::DeviceMesh& pm = hp::DTensor(p).device_mesh();
      const auto& names = pm.mesh_dim_names();
      const auto at = std::find(names.begin(), names.end(), "kv_replica");
      if (at != names.end()) dim_of[pm.get_group(at - names.begin()).ranks()] = "kv_replica";
    }
  for (const auto& [ranks, phases] : comm.get_comm_group_stats()) {
    const auto it = dim_of.find(ranks);
    const std::string dim = it != dim_of.end()                               ? it->second
                            : ranks.size() == static_cast<size_t>(m.world) ? std::string("world")
                                                                             : c10::str("group of ", ranks.size());
    for (const char* phase : {"forward", "backward"}) {
      const auto p = phases.find(phase);
      if (p == phases.end()) continue;
      for (const auto& [kind, st] : p->second) {
        // Per microbatch, except FSDP's gradient reduction over the data dimensions, which the
        // step's last backward does once (tensor parallelism's reduce-scatters run every microbatch).
        const bool data_dim = dim == m.dp_name || dim == "dp_replicate" || dim == "dp_cp";
        const bool once = std::string(phase) == "backward" && data_dim && (kind == "reduce_scatter" || kind == "all_reduce");
        const int64_t times = once ? 1 : m_count;
        r.comm.push_back({dim, kind, phase, st.count * times, st.bytes * times, st.full_bytes * times});
      }
    }
  }
  if (m.pp > 1) {
    // Activations forward to the next stage, their gradients back: one transfer per microbatch each.
    const int64_t b = r.p2p_bytes_per_microbatch, n = m_count;
    if (r.stage + 1 < m.pp) {
      r.comm.push_back({"pp", "send", "forward", n, n * b, n * b});
      r.comm.push_back({"pp", "recv", "backward", n, n * b, n * b});
    }
    if (r.stage > 0) {
      r.comm.push_back({"pp", "recv", "forward", n, n * b, n * b});
      r.comm.push_back({"pp", "send", "backward", n, n * b, n * b});
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace

PlanReport plan_training(const PlanOptions& options) {
  HP_CHECK_T(c10::ValueError, !hp::is_initialized(), "hyper_parallel::models::plan_training: a process group exists already; the plan ",
             "runs in a fake world of its own");
  const MeshShape m = mesh_shape_of(options, "models::plan_training");
  const FakeWorld fake(m.world, options.rank, options.device_type);
  return run_step(options, m, "meta");
}

PlanReport measure_training(const PlanOptions& options) {
  const MeshShape m = mesh_shape_of(options, "models::measure_training");
  HP_CHECK_T(c10::ValueError, hp::is_initialized() && !hp::is_fake_world() && hp::get_world_size() == m.world,
             "hyper_parallel::models::measure_training: it runs in a real job of ", m.world, " ranks (init_process_group under hprun)");
  PlanOptions o = options;
  o.rank = hp::get_rank();
  return run_step(o, m, "cpu");
}

}  // namespace models
}  // namespace hyper_parallel
