#include <hyper_parallel/runtime/agreement.h>
#include <hyper_parallel/runtime/c10d_interop.h>
#include <hyper_parallel/runtime/chunking.h>
#include <hyper_parallel/runtime/collectives.h>
#include <hyper_parallel/runtime/comm_debug_mode.h>
#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <limits>

#include "shm_transport.h"

namespace hyper_parallel {
namespace {

int64_t nbytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }


void check_group(const Group& g, const char* what) {
  TORCH_CHECK(g.defined(), "hyper_parallel::", what, ": the group is undefined");
}

// Shape of `t` with dimension `dim` set to `size`.
std::vector<int64_t> with_size(at::IntArrayRef shape, int64_t dim, int64_t size) {
  std::vector<int64_t> s = shape.vec();
  s[static_cast<size_t>(dim)] = size;
  return s;
}

// Stacks the torch.chunk pieces of `t` along `dim` into [g, padded piece] (zero padded), the
// layout that alltoall_base and scatter exchange.
at::Tensor stack_pieces(const at::Tensor& t, int64_t dim, int64_t g) {
  const int64_t n = t.size(dim);
  if (n % g == 0) {
    std::vector<int64_t> split = t.sizes().vec();
    split[static_cast<size_t>(dim)] = n / g;
    split.insert(split.begin() + dim, g);
    return t.reshape(split).movedim(dim, 0).contiguous();
  }
  const int64_t padded = (n + g - 1) / g;
  auto shape = with_size(t.sizes(), dim, padded);
  shape.insert(shape.begin(), g);
  at::Tensor out = at::zeros(shape, t.options());
  for (int64_t j = 0; j < g; ++j) {
    const int64_t sz = chunk_size(n, g, j);
    if (sz > 0) out[j].narrow(dim, 0, sz).copy_(t.narrow(dim, chunk_offset(n, g, j), sz));
  }
  return out;
}

// Concatenates the g blocks of `blocks` ([g, padded piece]) along `dim`, keeping `sizes[j]` of
// block j (the inverse of stack_pieces).
at::Tensor concat_blocks(const at::Tensor& blocks, int64_t dim, const std::vector<int64_t>& sizes) {
  const int64_t g = blocks.size(0);
  const int64_t padded = blocks.size(dim + 1);
  bool even = true;
  for (int64_t s : sizes) even = even && s == padded;
  if (even) {
    if (dim == 0) return blocks.reshape(with_size(blocks.sizes().slice(1), 0, g * padded));
    return blocks.movedim(0, dim).reshape(with_size(blocks.sizes().slice(1), dim, g * padded));
  }
  std::vector<at::Tensor> parts;
  parts.reserve(static_cast<size_t>(g));
  for (int64_t j = 0; j < g; ++j) parts.push_back(blocks[j].narrow(dim, 0, sizes[static_cast<size_t>(j)]));
  return at::cat(parts, dim);
}

// Gloo moves only float/double/half and the integer types. Collectives that only move bytes
// send other dtypes reinterpreted as a supported type of the same width.
at::ScalarType wire_type(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return at::kHalf;  // same width; only copied, never added
    case at::kBool: return at::kByte;
    default: return t;
  }
}
at::Tensor as_wire(const at::Tensor& t) {
  const auto w = wire_type(t.scalar_type());
  return w == t.scalar_type() ? t : t.view(w);
}

// Integer averages are refused (PyTorch's Gloo rejects them; NCCL floors): no rounding
// convention is silently chosen for the caller.
void check_reduce_dtype(ReduceOp op, at::ScalarType t, const char* what) {
  HP_CHECK_T(c10::TypeError, op != ReduceOp::AVG || at::isFloatingType(t) || at::isComplexType(t),
             "hyper_parallel::", what, ": ReduceOp avg is defined for floating-point tensors only, got ",
             t, "; reduce with sum and divide as your integer semantics require");
}

// Booleans reduce as logical or (sum, max) / logical and (min), on bytes.
ReduceOp bool_op(ReduceOp op) { return op == ReduceOp::MIN ? ReduceOp::MIN : ReduceOp::MAX; }

// Tensors handed to the backend are written on its own threads, outside the caller's
// c10::InferenceMode: they must be normal tensors, not inference tensors.
struct NormalTensors {
  c10::InferenceMode guard{false};
};

// HP_DEBUG_COLLECTIVES=1 (as PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL): before each collective
// the ranks compare what they are about to do (one small all_gather), so a mismatch raises on
// every rank instead of aborting inside Gloo or hanging. The shared-memory transport checks this
// always, for free, at its first synchronisation.
// `describe` builds the description only then: formatting sizes costs more than a small collective.
template <class Describe>
void fingerprint(const Group& g, const Describe& describe) {
  static const bool on = [] {
    const char* v = std::getenv("HP_DEBUG_COLLECTIVES");
    return v != nullptr && *v != '\0' && std::string(v) != "0";
  }();
  if (on && g.size() > 1) check_agreement(g, "collective", describe());
}

std::string without_dim(at::IntArrayRef sizes, int64_t dim) {
  std::vector<int64_t> v = sizes.vec();
  v[static_cast<size_t>(dim)] = -1;
  return c10::str(c10::IntArrayRef(v));
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM:
    case ReduceOp::AVG:  // Gloo has no AVG: sum, then divide
      return c10d::ReduceOp::SUM;
    case ReduceOp::MAX:
      return c10d::ReduceOp::MAX;
    case ReduceOp::MIN:
      return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

void gloo_all_reduce(at::Tensor& buf, ReduceOp op, const Group& group) {
  std::vector<at::Tensor> ts{buf};
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(op);
  wait_collective(group, "all_reduce", c10d_group(group)->allreduce(ts, opts));
}

// Gloo's max/min compare with `<` and keep one operand, so a NaN on one rank can vanish from the
// result (silently, depending on the order). NaN must win, as in torch.maximum and the
// shared-memory transport: each rank appends a flag per element (1 for max, -1 for min, where
// it holds a NaN), reduced by the same call, and the flagged elements become NaN.
void gloo_max_min_keeping_nan(at::Tensor& buf, ReduceOp op, const Group& group) {
  const at::Tensor flat = buf.reshape({-1});
  at::Tensor flags = flat.isnan().to(buf.scalar_type());
  if (op == ReduceOp::MIN) flags.neg_();
  at::Tensor both = at::cat({flat, flags});
  gloo_all_reduce(both, op, group);
  const int64_t n = flat.numel();
  at::Tensor values = both.narrow(0, 0, n);
  values.masked_fill_(both.narrow(0, n, n).ne(0), std::numeric_limits<double>::quiet_NaN());
  buf.copy_(values.view(buf.sizes()));
}

}  // namespace

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return "sum";
    case ReduceOp::AVG: return "avg";
    case ReduceOp::MAX: return "max";
    case ReduceOp::MIN: return "min";
  }
  return "?";
}

at::Tensor all_gather(const at::Tensor& local, int64_t dim, const Group& group,
                      c10::optional<int64_t> full_size) {
  check_group(group, "all_gather");
  const NormalTensors normal;
  dim = wrap_dim(dim, local.dim(), "all_gather");
  const int64_t g = group.size();
  CommDebugMode::record("all_gather", nbytes(local));
  fingerprint(group, [&] {
    return c10::str("all_gather dim ", dim, " full_size ", full_size ? *full_size : -1, " ", local.scalar_type(), " ",
                    without_dim(local.sizes(), dim));
  });
  const int64_t n = full_size ? *full_size : local.size(dim) * g;
  const int64_t padded = (n + g - 1) / g;
  const int64_t mine = chunk_size(n, g, group.rank());
  HP_CHECK_T(c10::ValueError, local.size(dim) == mine, "hyper_parallel::all_gather: rank ",
             group.rank(), " holds ", local.size(dim), " elements along dim ", dim,
             " but torch.chunk of ", n, " over ", g, " ranks gives it ", mine);
  if (g == 1) return local.clone();
  // Nothing to move (every piece is empty on every rank: n == 0 or another dim is 0); Gloo
  // divides by the element count and would crash.
  int64_t padded_numel = padded;
  for (int64_t k = 0; k < local.dim(); ++k) if (k != dim) padded_numel *= local.size(k);
  if (padded_numel == 0)
    return at::empty(with_size(local.sizes(), dim, n), local.options());
  at::Tensor input = local.contiguous();
  if (mine != padded) {
    at::Tensor p = at::zeros(with_size(local.sizes(), dim, padded), local.options());
    if (mine > 0) p.narrow(dim, 0, mine).copy_(local);
    input = p;
  }
  ShmTransport* shm = shm_transport_of(group);
  if (shm != nullptr && dim == 0 && padded * g == n) {
    // Even pieces along dim 0: the blocks are the result, laid out as it is; no reshape.
    at::Tensor out = at::empty(with_size(input.sizes(), 0, n), input.options());
    shm->all_gather(input.data_ptr(), out.data_ptr(), static_cast<size_t>(nbytes(input)));
    return out;
  }
  auto shape = input.sizes().vec();
  shape.insert(shape.begin(), g);
  at::Tensor blocks = at::empty(shape, input.options());
  if (shm != nullptr) {
    shm->all_gather(input.data_ptr(), blocks.data_ptr(), static_cast<size_t>(nbytes(input)));
    return concat_blocks(blocks, dim, chunk_sizes(n, g));
  }
  at::Tensor wire_blocks = as_wire(blocks);
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int64_t j = 0; j < g; ++j) outputs[0].push_back(wire_blocks[j]);
  std::vector<at::Tensor> inputs{as_wire(input)};
  wait_collective(group, "all_gather", c10d_group(group)->allgather(outputs, inputs));
  return concat_blocks(blocks, dim, chunk_sizes(n, g));
}

at::Tensor& all_reduce_(at::Tensor& tensor, ReduceOp op, const Group& group) {
  check_group(group, "all_reduce");
  check_reduce_dtype(op, tensor.scalar_type(), "all_reduce");
  CommDebugMode::record("all_reduce", nbytes(tensor));
  fingerprint(group, [&] { return c10::str("all_reduce ", reduce_op_name(op), " ", tensor.scalar_type(), " ", tensor.sizes()); });
  if (group.size() == 1 || tensor.numel() == 0) return tensor;
  const bool is_bool = tensor.scalar_type() == at::kBool;
  ShmTransport* shm = shm_transport_of(group);
  // Gloo cannot add bfloat16: reduce in float32 (exact for the sum of two bf16 values, and
  // rounded once at the end otherwise). The shared-memory transport accumulates bf16 in float32
  // itself and rounds once, the same bits, moving half the bytes (not for avg: the division must
  // happen before that one rounding). Every buffer is in logical (row-major) order, whatever the
  // caller's layout: ranks with different strides must still add matching elements.
  at::Tensor buf;
  {
    const NormalTensors normal;
    if (is_bool) buf = tensor.contiguous().view(at::kByte);
    else if (tensor.scalar_type() == at::kBFloat16 && (shm == nullptr || op == ReduceOp::AVG))
      buf = at::empty(tensor.sizes(), tensor.options().dtype(at::kFloat)).copy_(tensor);
    else buf = tensor.is_contiguous() && !tensor.is_inference() ? tensor : tensor.contiguous();
    if (buf.is_inference()) buf = at::empty_like(buf).copy_(buf);
  }
  // Neither transport averages: sum, then divide below.
  const ReduceOp wire_op = is_bool ? bool_op(op) : op == ReduceOp::AVG ? ReduceOp::SUM : op;
  if (shm != nullptr) {
    shm->all_reduce(buf.data_ptr(), buf.numel(), buf.scalar_type(), wire_op);
  } else if ((wire_op == ReduceOp::MAX || wire_op == ReduceOp::MIN) && at::isFloatingType(buf.scalar_type())) {
    gloo_max_min_keeping_nan(buf, wire_op, group);
  } else {
    gloo_all_reduce(buf, wire_op, group);
  }
  if (op == ReduceOp::AVG) buf.div_(group.size());
  if (is_bool) buf = buf.view(at::kBool);
  if (!buf.is_same(tensor)) tensor.copy_(buf);
  return tensor;
}

at::Tensor all_reduce(const at::Tensor& tensor, ReduceOp op, const Group& group) {
  at::Tensor out = tensor.clone(at::MemoryFormat::Contiguous);
  return all_reduce_(out, op, group);
}

at::Tensor reduce_scatter(const at::Tensor& input, ReduceOp op, int64_t dim, const Group& group) {
  check_group(group, "reduce_scatter");
  const NormalTensors normal;
  check_reduce_dtype(op, input.scalar_type(), "reduce_scatter");
  dim = wrap_dim(dim, input.dim(), "reduce_scatter");
  const int64_t g = group.size();
  CommDebugMode::record("reduce_scatter", nbytes(input));
  fingerprint(group, [&] { return c10::str("reduce_scatter ", reduce_op_name(op), " dim ", dim, " ", input.scalar_type(), " ", input.sizes()); });
  if (g == 1) return input.clone();
  const int64_t mine = chunk_size(input.size(dim), g, group.rank());
  if (input.numel() == 0) return at::empty(with_size(input.sizes(), dim, mine), input.options());
  at::Tensor send = stack_pieces(input, dim, g);
  at::Tensor recv = at::empty_like(send);
  at::Tensor wire_send = as_wire(send), wire_recv = as_wire(recv);
  std::vector<int64_t> splits;  // empty: equal splits along dim 0
  if (ShmTransport* shm = shm_transport_of(group))
    shm->all_to_all(send.data_ptr(), recv.data_ptr(), static_cast<size_t>(nbytes(send) / g));
  else
    wait_collective(group, "reduce_scatter", c10d_group(group)->alltoall_base(wire_recv, wire_send, splits, splits));
  at::Tensor reduced;
  const auto dtype = recv.scalar_type();
  const ReduceOp rop = dtype == at::kBool ? bool_op(op) : op;
  switch (rop) {
    // Summed in the input's dtype (torch.sum would promote integers to int64); bf16/fp16
    // accumulate in fp32 inside the kernel and round once.
    case ReduceOp::SUM: reduced = recv.sum(0, false, dtype); break;
    case ReduceOp::AVG: reduced = recv.sum(0, false, dtype).div_(g); break;
    case ReduceOp::MAX: reduced = std::get<0>(recv.max(0)); break;
    case ReduceOp::MIN: reduced = std::get<0>(recv.min(0)); break;
  }
  return mine == reduced.size(dim) ? reduced : reduced.narrow(dim, 0, mine).contiguous();
}

at::Tensor all_to_all(const at::Tensor& local, int64_t split_dim, int64_t concat_dim,
                      const Group& group, c10::optional<int64_t> concat_full_size) {
  check_group(group, "all_to_all");
  const NormalTensors normal;
  split_dim = wrap_dim(split_dim, local.dim(), "all_to_all");
  concat_dim = wrap_dim(concat_dim, local.dim(), "all_to_all");
  HP_CHECK_T(c10::ValueError, split_dim != concat_dim,
             "hyper_parallel::all_to_all: split_dim and concat_dim must differ");
  const int64_t g = group.size();
  CommDebugMode::record("all_to_all", nbytes(local));
  fingerprint(group, [&] {
    return c10::str("all_to_all split ", split_dim, " concat ", concat_dim, " ", local.scalar_type(), " ",
                    without_dim(local.sizes(), concat_dim));
  });
  if (g == 1) return local.clone();
  const int64_t cn = concat_full_size ? *concat_full_size : local.size(concat_dim) * g;
  const int64_t cpad = (cn + g - 1) / g;
  HP_CHECK_T(c10::ValueError, local.size(concat_dim) == chunk_size(cn, g, group.rank()),
             "hyper_parallel::all_to_all: rank ", group.rank(), " holds ", local.size(concat_dim),
             " elements along concat dim ", concat_dim, " but torch.chunk of ", cn, " over ", g,
             " ranks gives it ", chunk_size(cn, g, group.rank()));
  int64_t padded_numel = cpad;
  for (int64_t k = 0; k < local.dim(); ++k) if (k != concat_dim) padded_numel *= local.size(k);
  if (padded_numel == 0) {
    // Nothing moves on any rank (the empty dim is the same everywhere, or concat is empty).
    auto shape = with_size(local.sizes(), concat_dim, cn);
    shape[static_cast<size_t>(split_dim)] = chunk_size(local.size(split_dim), g, group.rank());
    return at::empty(shape, local.options());
  }
  at::Tensor src = local;
  if (local.size(concat_dim) != cpad) {  // uneven: pad every peer's piece to the same shape
    src = at::zeros(with_size(local.sizes(), concat_dim, cpad), local.options());
    if (local.size(concat_dim) > 0) src.narrow(concat_dim, 0, local.size(concat_dim)).copy_(local);
  }
  at::Tensor send = stack_pieces(src, split_dim, g);
  at::Tensor recv = at::empty_like(send);
  at::Tensor wire_send = as_wire(send), wire_recv = as_wire(recv);
  std::vector<int64_t> splits;
  if (ShmTransport* shm = shm_transport_of(group))
    shm->all_to_all(send.data_ptr(), recv.data_ptr(), static_cast<size_t>(nbytes(send) / g));
  else
    wait_collective(group, "all_to_all", c10d_group(group)->alltoall_base(wire_recv, wire_send, splits, splits));
  const int64_t my_split = chunk_size(local.size(split_dim), g, group.rank());
  if (my_split != recv.size(split_dim + 1)) recv = recv.narrow(split_dim + 1, 0, my_split);
  return concat_blocks(recv, concat_dim, chunk_sizes(cn, g)).contiguous();
}

at::Tensor& broadcast_(at::Tensor& tensor, int64_t src, const Group& group) {
  check_group(group, "broadcast");
  HP_CHECK_T(c10::ValueError, src >= 0 && src < group.size(), "hyper_parallel::broadcast: src ",
             src, " is not a rank of a group of size ", group.size());
  CommDebugMode::record("broadcast", nbytes(tensor));
  fingerprint(group, [&] { return c10::str("broadcast src ", src, " ", tensor.scalar_type(), " ", tensor.sizes()); });
  if (group.size() == 1 || tensor.numel() == 0) return tensor;
  at::Tensor buf;
  {
    const NormalTensors normal;
    buf = tensor.is_contiguous() && !tensor.is_inference() ? tensor : at::empty(tensor.sizes(), tensor.options()).copy_(tensor);
  }
  if (ShmTransport* shm = shm_transport_of(group)) {
    shm->broadcast(buf.data_ptr(), static_cast<size_t>(nbytes(buf)), src);
  } else {
    std::vector<at::Tensor> ts{as_wire(buf)};
    c10d::BroadcastOptions opts;
    opts.rootRank = src;
    wait_collective(group, "broadcast", c10d_group(group)->broadcast(ts, opts));
  }
  if (!buf.is_same(tensor)) tensor.copy_(buf);
  return tensor;
}

at::Tensor scatter(const at::Tensor& full, int64_t dim, int64_t src, const Group& group) {
  check_group(group, "scatter");
  const NormalTensors normal;
  dim = wrap_dim(dim, full.dim(), "scatter");
  HP_CHECK_T(c10::ValueError, src >= 0 && src < group.size(), "hyper_parallel::scatter: src ",
             src, " is not a rank of a group of size ", group.size());
  const int64_t g = group.size();
  const int64_t n = full.size(dim);
  const int64_t mine = chunk_size(n, g, group.rank());
  CommDebugMode::record("scatter", group.rank() == src ? nbytes(full) : 0);
  fingerprint(group, [&] { return c10::str("scatter dim ", dim, " src ", src, " ", full.scalar_type(), " ", full.sizes()); });
  if (g == 1) return full.clone();
  if (full.numel() == 0) return at::empty(with_size(full.sizes(), dim, mine), full.options());
  at::Tensor out = at::empty(with_size(full.sizes(), dim, (n + g - 1) / g), full.options());
  if (ShmTransport* shm = shm_transport_of(group)) {
    at::Tensor stacked = group.rank() == src ? stack_pieces(full, dim, g) : at::Tensor();
    shm->scatter(stacked.defined() ? stacked.data_ptr() : nullptr, out.data_ptr(), static_cast<size_t>(nbytes(out)), src);
    return mine == out.size(dim) ? out : out.narrow(dim, 0, mine).contiguous();
  }
  std::vector<at::Tensor> outputs{as_wire(out)};
  std::vector<std::vector<at::Tensor>> inputs;
  at::Tensor pieces;
  if (group.rank() == src) {
    pieces = stack_pieces(full, dim, g);
    inputs.emplace_back();
    for (int64_t j = 0; j < g; ++j) inputs[0].push_back(as_wire(pieces[j]));
  }
  c10d::ScatterOptions opts;
  opts.rootRank = src;
  wait_collective(group, "scatter", c10d_group(group)->scatter(outputs, inputs, opts));
  return mine == out.size(dim) ? out : out.narrow(dim, 0, mine).contiguous();
}

void barrier(const Group& group) {
  check_group(group, "barrier");
  CommDebugMode::record("barrier", 0);
  fingerprint(group, [] { return std::string("barrier"); });
  if (group.size() == 1) return;
  if (ShmTransport* shm = shm_transport_of(group)) shm->barrier();
  else wait_collective(group, "barrier", c10d_group(group)->barrier());
}

}  // namespace hyper_parallel
