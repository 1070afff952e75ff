#include <hyper_parallel/context_parallel/context_parallel.h>

#include <ATen/ATen.h>

#include <hyper_parallel/dtensor/dtensor.h>
#include <hyper_parallel/nn/attention.h>
#include <hyper_parallel/nn/clip_grad.h>
#include <hyper_parallel/runtime/collectives.h>
#include <hyper_parallel/runtime/errors.h>

#include <map>
#include <numeric>
#include <tuple>

#include "context_parallel_record.h"
#include "ring_attention.h"
#include "sequence_shard_input.h"

namespace hyper_parallel {
namespace {

namespace F = hyper_parallel::nn::functional;

void check_mode(const std::string& mode, const char* where) {
  HP_CHECK_T(c10::ValueError, mode == "ulysses" || mode == "allgather_kv" || mode == "ring", "hyper_parallel::ContextParallel::",
             where, ": mode must be \"ulysses\", \"allgather_kv\" or \"ring\", got \"", mode, "\"");
}

void check_cp_mesh(const DeviceMesh& mesh, const char* fn) {
  HP_CHECK_T(c10::ValueError, mesh.defined() && mesh.ndim() == 1, "hyper_parallel::", fn, ": needs a 1-D cp mesh, got ",
             mesh.defined() ? mesh.short_string() : std::string("an undefined mesh"));
}

// A sequence of n positions splits into cp shards, of two equal chunks each with load_balance.
void check_splits(int64_t n, int64_t cp, bool load_balance, const char* fn) {
  const int64_t parts = load_balance ? 2 * cp : cp;
  HP_CHECK_T(c10::ValueError, n >= 0 && n % parts == 0, "hyper_parallel::", fn, ": a sequence of ", n,
             " positions cannot be split over cp = ", cp, load_balance ? " with load_balance (2·cp = " : " (", parts,
             " equal parts); pad it to a multiple of ", parts);
}

// The sequence dim of `t` (negative counts from the end) and its length, checked against cp.
int64_t seq_length(const at::Tensor& t, int64_t& seq_dim, int64_t cp, bool load_balance, const char* fn) {
  HP_CHECK_T(c10::IndexError, seq_dim >= -t.dim() && seq_dim < t.dim(), "hyper_parallel::", fn, ": seq_dim ", seq_dim,
             " is out of range for a tensor of shape ", t.sizes());
  if (seq_dim < 0) seq_dim += t.dim();
  check_splits(t.size(seq_dim), cp, load_balance, fn);
  return t.size(seq_dim);
}

// A query, key or value as the wrapper gets it: a plain shard, or a DTensor Shard(2) on the cp mesh.
at::Tensor local_input(const c10::IValue& v, const DeviceMesh& mesh, const char* name) {
  return context_parallel::sequence_shard_input(v, mesh, 2, "ContextParallel", name);
}

// Ulysses: [B, H, s, D] sequence shards -> [B, H/cp, s·cp, D] head shards, and back.
at::Tensor seq_to_heads(const at::Tensor& x, const DeviceMesh& mesh) {
  return DTensor::from_local(x, mesh, {Shard(2)}).redistribute(mesh, {Shard(1)}).to_local();
}
at::Tensor heads_to_seq(const at::Tensor& x, const DeviceMesh& mesh) {
  return DTensor::from_local(x, mesh, {Shard(1)}).redistribute(mesh, {Shard(2)}).to_local();
}

c10::IValue context_parallel_forward(const ContextParallel& style, const DeviceMesh& mesh, nn::Module& module,
                                     const std::vector<c10::IValue>& args, const nn::Kwargs& kwargs) {
  auto& sdpa = static_cast<nn::ScaledDotProductAttentionImpl&>(module);
  HP_CHECK_T(c10::ValueError, args.size() == 3 && kwargs.empty(), "hyper_parallel::ContextParallel::forward: takes query, key and ",
             "value only; an explicit attention mask cannot follow the sequence across ranks (use the module's is_causal)");
  const at::Tensor q = local_input(args[0], mesh, "query"), k = local_input(args[1], mesh, "key"),
                   v = local_input(args[2], mesh, "value");
  HP_CHECK_T(c10::ValueError, q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.sizes() == v.sizes() && q.size(2) == k.size(2) &&
                                  q.size(0) == k.size(0) && q.size(3) == k.size(3) && k.size(1) > 0 && q.size(1) % k.size(1) == 0,
             "hyper_parallel::ContextParallel::forward: needs self-attention shards [B, H, s, D], [B, Hk, s, D], [B, Hk, s, D] ",
             "with Hk dividing H, got query ", q.sizes(), ", key ", k.sizes(), ", value ", v.sizes());
  const int64_t cp = mesh.size(), rank = mesh.get_local_rank(0), s = q.size(2);
  const bool lb = style.load_balance(), causal = sdpa.options.is_causal();
  HP_CHECK_T(c10::ValueError, !lb || s % 2 == 0, "hyper_parallel::ContextParallel::forward: load_balance needs an even number of ",
             "positions per rank (two chunks), got ", s, "; shard the sequence with context_parallel_shard");
  const c10::optional<double> scale = sdpa.options.scale();
  at::Tensor out;
  if (style.mode() == "ring") {
    out = context_parallel::ring_attention(q, k, v, mesh.get_group(0), causal, lb, scale);
  } else {
    // Positions of the whole sequence in the order the shards concatenate (permuted when load-balanced).
    const auto long_opts = q.options().dtype(at::kLong);
    const at::Tensor all_positions =
        lb ? head_tail_indices(s * cp, cp).to(q.device()) : at::arange(s * cp, long_opts);
    if (style.mode() == "ulysses") {
      const int64_t heads = q.size(1), kv_heads = k.size(1);
      HP_CHECK_T(c10::ValueError, heads % cp == 0, "hyper_parallel::ContextParallel::forward: ulysses splits the ", heads,
                 " query heads this rank holds over cp = ", cp, ", which does not divide them; use mode \"allgather_kv\" or \"ring\"");
      // Fewer key heads than cp (or a count cp does not divide): each is repeated so that every
      // rank gets whole groups; the copies' gradients sum back in backward.
      const int64_t repeat = cp / std::gcd(kv_heads, cp);
      at::Tensor kk = k, vv = v;
      if (repeat > 1) {
        HP_CHECK_T(c10::ValueError, (heads / kv_heads) % repeat == 0, "hyper_parallel::ContextParallel::forward: ulysses cannot ",
                   "spread ", kv_heads, " key heads serving ", heads, " query heads over cp = ", cp);
        kk = k.repeat_interleave(repeat, 1);
        vv = v.repeat_interleave(repeat, 1);
      }
      const at::Tensor mask = causal ? F::causal_mask(all_positions, all_positions) : at::Tensor();
      out = heads_to_seq(F::scaled_dot_product_attention(seq_to_heads(q, mesh), seq_to_heads(kk, mesh), seq_to_heads(vv, mesh),
                                                         mask, scale),
                         mesh);
    } else {  // allgather_kv
      // The gathered keys' gradient is a partial sum (every rank's queries used them): it is
      // reduce-scattered back to the shards.
      const auto gather = [&](const at::Tensor& x) {
        return DTensor::from_local(x, mesh, {Shard(2)}).redistribute(mesh, {Replicate()}).to_local(Placements{Partial()});
      };
      const at::Tensor positions = context_parallel::shard_positions(s, cp, rank, lb, long_opts);
      const at::Tensor mask = causal ? F::causal_mask(positions, all_positions) : at::Tensor();
      out = F::scaled_dot_product_attention(q, gather(k), gather(v), mask, scale);
    }
  }
  if (style.use_local_output()) return out;
  return static_cast<const at::Tensor&>(DTensor::from_local(out, mesh, {Shard(2)}));
}

}  // namespace

ContextParallel::ContextParallel(std::string mode, bool load_balance, bool use_local_output)
    : mode_(std::move(mode)), load_balance_(load_balance), use_local_output_(use_local_output) {
  check_mode(mode_, "ContextParallel");
}

ContextParallel& ContextParallel::mode(std::string m) {
  check_mode(m, "mode");
  mode_ = std::move(m);
  return *this;
}

void ContextParallel::validate(torch::nn::Module& module, const std::string& fqn, const DeviceMesh& mesh) const {
  const std::string label = fqn.empty() ? module.name() : fqn;
  auto* sdpa = dynamic_cast<nn::ScaledDotProductAttentionImpl*>(&module);
  HP_CHECK_T(c10::TypeError, sdpa != nullptr, "hyper_parallel::ContextParallel::validate: '", label,
             "' is not a ScaledDotProductAttention module (", module.name(), "); apply it to the attention an attention layer calls");
  check_cp_mesh(mesh, "ContextParallel::validate");
  HP_CHECK_T(c10::ValueError, sdpa->forward_wrapper() == nullptr, "hyper_parallel::ContextParallel::validate: '", label,
             "' already runs through a forward wrapper (context parallelism or activation checkpointing applied to it); ",
             "apply activation checkpointing to the layer around it");
  HP_CHECK_T(c10::ValueError, sdpa->options.dropout_p() == 0.0, "hyper_parallel::ContextParallel::validate: '", label,
             "' has attention dropout ", sdpa->options.dropout_p(), ", which context parallelism does not draw; set it to 0");
  HP_CHECK_T(c10::ValueError, !load_balance_ || sdpa->options.is_causal(), "hyper_parallel::ContextParallel::validate: '", label,
             "' is not causal; load_balance only evens out causal attention");
}

torch::nn::Module& ContextParallel::apply(torch::nn::Module& module, const DeviceMesh& mesh) {
  validate(module, "", mesh);
  auto& sdpa = static_cast<nn::ScaledDotProductAttentionImpl&>(module);
  const ContextParallel style = *this;
  sdpa.set_forward_wrapper([style, mesh](nn::Module& m, const std::vector<c10::IValue>& args, const nn::Kwargs& kwargs,
                                         const nn::ForwardFn&) { return context_parallel_forward(style, mesh, m, args, kwargs); });
  record_context_parallel(module, mesh);
  return module;
}

c10::optional<DeviceMesh> context_parallel_mesh(const torch::nn::Module& module) {
  if (const auto* m = dynamic_cast<const nn::Module*>(&module))
    if (const auto* r = m->find_state<ContextParallelRecord>(); r != nullptr && r->mesh) return r->mesh;
  for (const auto& child : module.children())
    if (auto found = context_parallel_mesh(*child)) return found;
  return c10::nullopt;
}

at::Tensor head_tail_indices(int64_t seq_len, int64_t cp, bool restore) {
  HP_CHECK_T(c10::ValueError, cp >= 1 && seq_len >= 0 && seq_len % (2 * cp) == 0, "hyper_parallel::head_tail_indices: a sequence of ",
             seq_len, " positions cannot be split into 2·cp = ", 2 * cp, " equal chunks");
  const int64_t c = seq_len / (2 * cp);
  const auto opts = at::TensorOptions().dtype(at::kLong);
  std::vector<at::Tensor> parts;
  for (int64_t r = 0; r < cp; ++r) {
    parts.push_back(at::arange(r * c, (r + 1) * c, opts));
    parts.push_back(at::arange((2 * cp - 1 - r) * c, (2 * cp - r) * c, opts));
  }
  at::Tensor indices = parts.empty() ? at::empty({0}, opts) : at::cat(parts);
  return restore ? at::argsort(indices) : indices;
}

at::Tensor context_parallel_shard(const at::Tensor& tensor, const DeviceMesh& cp_mesh, int64_t seq_dim, bool load_balance) {
  check_cp_mesh(cp_mesh, "context_parallel_shard");
  HP_CHECK_T(c10::TypeError, !is_dtensor(tensor), "hyper_parallel::context_parallel_shard: takes the whole (plain) tensor on every rank");
  const int64_t cp = cp_mesh.size(), rank = cp_mesh.get_local_rank(0);
  const int64_t n = seq_length(tensor, seq_dim, cp, load_balance, "context_parallel_shard");
  const at::Tensor permuted = load_balance ? tensor.index_select(seq_dim, head_tail_indices(n, cp).to(tensor.device())) : tensor;
  return permuted.narrow(seq_dim, rank * (n / cp), n / cp).contiguous();
}

at::Tensor context_parallel_unshard(const at::Tensor& shard, const DeviceMesh& cp_mesh, int64_t seq_dim, bool load_balance) {
  check_cp_mesh(cp_mesh, "context_parallel_unshard");
  const at::Tensor local = local_tensor(shard);
  HP_CHECK_T(c10::IndexError, seq_dim >= -local.dim() && seq_dim < local.dim(), "hyper_parallel::context_parallel_unshard: seq_dim ",
             seq_dim, " is out of range for a shard of shape ", local.sizes());
  if (seq_dim < 0) seq_dim += local.dim();
  const int64_t cp = cp_mesh.size();
  HP_CHECK_T(c10::ValueError, !load_balance || local.size(seq_dim) % 2 == 0, "hyper_parallel::context_parallel_unshard: a ",
             "load-balanced shard holds two equal chunks, got ", local.size(seq_dim), " positions");
  const at::Tensor whole = all_gather(local.contiguous(), seq_dim, cp_mesh.get_group(0));
  if (!load_balance) return whole;
  return whole.index_select(seq_dim, head_tail_indices(whole.size(seq_dim), cp, /*restore=*/true).to(whole.device()));
}

at::Tensor context_parallel_positions(int64_t seq_len, const DeviceMesh& cp_mesh, bool load_balance) {
  check_cp_mesh(cp_mesh, "context_parallel_positions");
  const int64_t cp = cp_mesh.size();
  check_splits(seq_len, cp, load_balance, "context_parallel_positions");
  return context_parallel::shard_positions(seq_len / cp, cp, cp_mesh.get_local_rank(0), load_balance,
                                           at::TensorOptions().dtype(at::kLong));
}

CausalBehavior is_causal_behavior(int64_t rank, int64_t world_size, int64_t i, bool is_causal, bool load_balance) {
  if (!is_causal) return CausalBehavior::not_is_causal;
  if (i == 0) return CausalBehavior::is_causal;
  const int64_t source = ((rank - i) % world_size + world_size) % world_size;
  return source < rank || load_balance ? CausalBehavior::not_is_causal : CausalBehavior::skip;
}

void all_reduce_gradients(torch::nn::Module& module, const DeviceMesh& cp_mesh, double bucket_cap_mb) {
  check_cp_mesh(cp_mesh, "all_reduce_gradients");
  HP_CHECK_T(c10::ValueError, bucket_cap_mb > 0, "hyper_parallel::all_reduce_gradients: bucket_cap_mb must be positive, got ",
             bucket_cap_mb);
  const auto cap_bytes = static_cast<int64_t>(bucket_cap_mb * 1024 * 1024);
  const Group& group = cp_mesh.get_group(0);
  const double inv = 1.0 / static_cast<double>(group.size());
  at::NoGradGuard no_grad;
  // Buckets of same-dtype, same-device gradients in parameter order, as DDP packs them: a
  // collective's fixed cost is paid once per bucket instead of once per parameter (a Qwen3 layer
  // has eleven); each element is still the sum over the ranks, scaled by 1/cp.
  struct Bucket {
    std::vector<at::Tensor> grads;
    int64_t bytes = 0;
  };
  std::vector<Bucket> buckets;
  std::map<std::tuple<at::ScalarType, at::DeviceType, at::DeviceIndex>, size_t> open;  // the bucket each kind fills now
  for (const at::Tensor& p : unique_parameters(module)) {
    if (!p.grad().defined()) continue;
    at::Tensor g = local_tensor(p.grad());
    const int64_t bytes = g.numel() * static_cast<int64_t>(g.element_size());
    const auto kind = std::make_tuple(g.scalar_type(), g.device().type(), g.device().index());
    auto it = open.find(kind);
    if (it == open.end() || buckets[it->second].bytes + bytes > cap_bytes) {
      it = open.insert_or_assign(kind, buckets.size()).first;
      buckets.emplace_back();
    }
    buckets[it->second].grads.push_back(std::move(g));
    buckets[it->second].bytes += bytes;
  }
  for (Bucket& b : buckets) {
    std::vector<at::Tensor> flat_views;
    flat_views.reserve(b.grads.size());
    for (const at::Tensor& g : b.grads) flat_views.push_back(g.reshape({-1}));
    at::Tensor flat = at::cat(flat_views);
    all_reduce_(flat, ReduceOp::SUM, group);
    flat.mul_(inv);
    int64_t offset = 0;
    for (at::Tensor& g : b.grads) {
      g.copy_(flat.narrow(0, offset, g.numel()).view(g.sizes()));
      offset += g.numel();
    }
  }
}

}  // namespace hyper_parallel
