// The device-agnostic front of the collectives: arguments, CommDebugMode, uneven pieces, block
// layouts, staging across devices and the emulations a transport's capabilities call for.
#include <hyper_parallel/runtime/agreement.h>
#include <hyper_parallel/runtime/chunking.h>
#include <hyper_parallel/runtime/collective_label.h>
#include <hyper_parallel/runtime/collectives.h>
#include <hyper_parallel/runtime/comm_debug_mode.h>
#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <limits>
#include <memory>
#include <numeric>

#include "group_impl.h"
#include "reduction_emulation.h"
#include "split_agreement.h"
#include "staging.h"

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

// Integer averages are refused (PyTorch's Gloo rejects them; NCCL floors): no rounding
// convention is silently chosen for the caller.
void check_reduce_dtype(ReduceOp op, at::ScalarType t, const char* what) {
  HP_CHECK_T(c10::TypeError, op != ReduceOp::AVG || at::isFloatingType(t) || at::isComplexType(t),
             "hyper_parallel::", what, ": ReduceOp avg is defined for floating-point tensors only, got ",
             t, "; reduce with sum and divide as your integer semantics require");
}

// HP_DEBUG_COLLECTIVES=1 (as PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL): before each collective
// the ranks compare what they are about to do (one small all_gather), so a mismatch raises on
// every rank instead of aborting inside a backend or hanging. The shared-memory transport checks
// this always, for free, at its first synchronisation.
// `describe` builds the description only then: formatting sizes costs more than a small collective.
bool debug_collectives() {
  static const bool on = [] {
    const char* v = std::getenv("HP_DEBUG_COLLECTIVES");
    return v != nullptr && *v != '\0' && std::string(v) != "0";
  }();
  return on;
}
// Labels (CollectiveLabel) are compared by the host transports themselves, with every collective
// (checks_labels); a device transport only names them when a collective fails.
template <class Describe>
void fingerprint(const Group& g, const Describe& describe) {
  if (g.size() <= 1 || !debug_collectives()) return;
  const std::string& label = current_collective_label();
  check_agreement(g, "collective", label.empty() ? describe() : describe() + " for " + label);
}

std::string without_dim(at::IntArrayRef sizes, int64_t dim) {
  std::vector<int64_t> v = sizes.vec();
  v[static_cast<size_t>(dim)] = -1;
  return c10::str(c10::IntArrayRef(v));
}



// A meta tensor in a fake world: the collective's result is only a shape. In a real world meta
// tensors are refused like any tensor the transport cannot move: a rank that passes one while
// its peers pass real tensors would leave them waiting.
bool shapes_only(const at::Tensor& t, const Group& g) {
  return t.is_meta() && transport_of(g).capabilities().simulated;
}

int64_t padded_numel_of(at::IntArrayRef sizes, int64_t dim, int64_t padded) {
  int64_t n = padded;
  for (size_t k = 0; k < sizes.size(); ++k)
    if (static_cast<int64_t>(k) != dim) n *= sizes[k];
  return n;
}

}  // namespace

Work Work::completed(at::Tensor result) {
  Work w;
  w.result_ = std::move(result);
  return w;
}

Work::Work(Work&& o) noexcept : finish_(std::move(o.finish_)), result_(std::move(o.result_)) { o.finish_ = nullptr; }

Work& Work::operator=(Work&& o) noexcept {
  if (this != &o) {
    complete_unwaited("replaced");
    finish_ = std::move(o.finish_);
    result_ = std::move(o.result_);
    o.finish_ = nullptr;
  }
  return *this;
}

Work::~Work() { complete_unwaited("destroyed"); }

void Work::complete_unwaited(const char* event) noexcept {
  if (!finish_) return;
  try {
    wait();
  } catch (const std::exception& e) {
    TORCH_WARN("hyper_parallel: a collective ", event, " before it was waited for failed: ", e.what());
  }
}

at::Tensor Work::wait() {
  if (finish_) {
    auto f = std::move(finish_);
    finish_ = nullptr;
    result_ = f();
  }
  return result_;
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return "sum";
    case ReduceOp::AVG: return "avg";
    case ReduceOp::MAX: return "max";
    case ReduceOp::MIN: return "min";
  }
  return "?";
}

Work all_gather_async(const at::Tensor& local, int64_t dim, const Group& group, c10::optional<int64_t> full_size) {
  check_group(group, "all_gather");
  const NormalTensors normal;
  dim = wrap_dim(dim, local.dim(), "all_gather");
  const int64_t g = group.size();
  const int64_t n = full_size ? *full_size : local.size(dim) * g;
  CommDebugMode::record("all_gather", nbytes(local), group, padded_numel_of(local.sizes(), dim, n) * local.element_size());
  fingerprint(group, [&] {
    return c10::str("all_gather dim ", dim, " full_size ", full_size ? *full_size : -1, " ", local.scalar_type(), " ",
                    without_dim(local.sizes(), dim));
  });
  const int64_t padded = (n + g - 1) / g;
  const int64_t mine = chunk_size(n, g, group.rank());
  HP_CHECK_T(c10::ValueError, local.size(dim) == mine, "hyper_parallel::all_gather: rank ",
             group.rank(), " holds ", local.size(dim), " elements along dim ", dim,
             " but torch.chunk of ", n, " over ", g, " ranks gives it ", mine);
  if (g == 1) return Work::completed(local.clone());
  if (shapes_only(local, group)) return Work::completed(at::empty(with_size(local.sizes(), dim, n), local.options()));
  // Nothing to move (every piece is empty on every rank: n == 0 or another dim is 0).
  if (padded_numel_of(local.sizes(), dim, padded) == 0)
    return Work::completed(at::empty(with_size(local.sizes(), dim, n), local.options()));
  Transport& tr = transport_of(group);
  at::Tensor input = on_transport(local, tr, "all_gather").contiguous();
  if (mine != padded) {
    at::Tensor p = at::zeros(with_size(input.sizes(), dim, padded), input.options());
    if (mine > 0) p.narrow(dim, 0, mine).copy_(input);
    input = p;
  }
  auto shape = input.sizes().vec();
  shape.insert(shape.begin(), g);
  at::Tensor blocks = at::empty(shape, input.options());
  Completion done = tr.all_gather(input, blocks);
  const c10::Device device = local.device();
  return Work([=] {
    const NormalTensors normal;
    if (done) done();
    // Even pieces along dim 0: the blocks are the result, laid out as it is.
    at::Tensor out = dim == 0 && padded * g == n ? blocks.view(with_size(input.sizes(), 0, n))
                                                 : concat_blocks(blocks, dim, chunk_sizes(n, g));
    return back_to(out, device);
  });
}

at::Tensor all_gather(const at::Tensor& local, int64_t dim, const Group& group, c10::optional<int64_t> full_size) {
  return all_gather_async(local, dim, group, full_size).wait();
}

Work all_reduce_async(at::Tensor& tensor, ReduceOp op, const Group& group) {
  check_group(group, "all_reduce");
  check_reduce_dtype(op, tensor.scalar_type(), "all_reduce");
  if (at::isComplexType(tensor.scalar_type())) {
    // A complex sum or mean is the real and imaginary parts' (every transport reduces reals).
    HP_CHECK_T(c10::TypeError, op == ReduceOp::SUM || op == ReduceOp::AVG, "hyper_parallel::all_reduce: ReduceOp ",
               reduce_op_name(op), " is not defined for complex tensors (", tensor.scalar_type(), ")");
    at::Tensor real = at::view_as_real(tensor);
    auto work = std::make_shared<Work>(all_reduce_async(real, op, group));
    at::Tensor result = tensor;
    return Work([work, result] {
      work->wait();
      return result;
    });
  }
  CommDebugMode::record("all_reduce", nbytes(tensor), group, nbytes(tensor));
  fingerprint(group, [&] { return c10::str("all_reduce ", reduce_op_name(op), " ", tensor.scalar_type(), " ", tensor.sizes()); });
  if (group.size() == 1 || tensor.numel() == 0 || shapes_only(tensor, group)) return Work::completed(tensor);
  Transport& tr = transport_of(group);
  // The common small call (a TP layer's activations, a loss, a norm): a contiguous normal tensor
  // on the transport's device, in a dtype and op the transport reduces itself, goes to the
  // transport as it is, without the staging copy and the completion closures below (shared memory
  // and NCCL reduce it in place; Gloo copies it next to its label's digits).
  check_device(tensor, tr, "all_reduce");
  if (tensor.device().type() == tr.device_type() && tensor.is_contiguous() && !tensor.is_inference() &&
      reduces_natively(tr.capabilities(), tensor.scalar_type(), op)) {
    Completion done;
    {
      // As on the staged path: what the backend makes of the tensor is not made in the caller's
      // InferenceMode (the guard costs a few thread-local writes, so only when that mode is on).
      c10::optional<NormalTensors> normal;
      if (c10::InferenceMode::is_enabled()) normal.emplace();
      done = tr.all_reduce(tensor, op);
    }
    if (!done) return Work::completed(tensor);
    return Work([done = std::move(done), tensor]() mutable {
      done();
      return tensor;
    });
  }
  // Every buffer is in logical (row-major) order, whatever the caller's layout: ranks with
  // different strides must still add matching elements.
  std::function<at::Tensor()> finish;
  {
    const NormalTensors normal;
    at::Tensor buf = on_transport(tensor, tr, "all_reduce");
    if (!buf.is_contiguous() || buf.is_inference()) buf = at::empty(buf.sizes(), buf.options()).copy_(buf);
    finish = reduce_on(tr, buf, op, false, group.size());
  }
  at::Tensor target = tensor;
  return Work([finish = std::move(finish), target]() mutable {
    const at::Tensor out = finish();
    if (out.data_ptr() != target.data_ptr() || !target.is_contiguous()) target.copy_(out.view(target.sizes()));
    return target;
  });
}

at::Tensor& all_reduce_(at::Tensor& tensor, ReduceOp op, const Group& group) {
  all_reduce_async(tensor, op, group).wait();
  return tensor;
}

at::Tensor all_reduce(const at::Tensor& tensor, ReduceOp op, const Group& group) {
  at::Tensor out = tensor.clone(at::MemoryFormat::Contiguous);
  return all_reduce_(out, op, group);
}

Work reduce_scatter_async(const at::Tensor& input, ReduceOp op, int64_t dim, const Group& group) {
  check_group(group, "reduce_scatter");
  const NormalTensors normal;
  check_reduce_dtype(op, input.scalar_type(), "reduce_scatter");
  dim = wrap_dim(dim, input.dim(), "reduce_scatter");
  const int64_t g = group.size();
  CommDebugMode::record("reduce_scatter", nbytes(input), group, nbytes(input));
  fingerprint(group, [&] { return c10::str("reduce_scatter ", reduce_op_name(op), " dim ", dim, " ", input.scalar_type(), " ", input.sizes()); });
  if (g == 1) return Work::completed(input.clone());
  const int64_t mine = chunk_size(input.size(dim), g, group.rank());
  if (input.numel() == 0 || shapes_only(input, group))
    return Work::completed(at::empty(with_size(input.sizes(), dim, mine), input.options()));
  Transport& tr = transport_of(group);
  const at::Tensor send = stack_pieces(on_transport(input, tr, "reduce_scatter"), dim, g);  // [g, padded piece]
  std::function<at::Tensor()> finish = reduce_on(tr, send, op, true, g);
  const auto piece = send.sizes().slice(1).vec();
  const c10::Device device = input.device();
  return Work([=] {
    const NormalTensors normal;
    const at::Tensor reduced = finish().view(piece);
    return back_to(mine == reduced.size(dim) ? reduced : reduced.narrow(dim, 0, mine).contiguous(), device);
  });
}

at::Tensor reduce_scatter(const at::Tensor& input, ReduceOp op, int64_t dim, const Group& group) {
  return reduce_scatter_async(input, op, dim, group).wait();
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
  CommDebugMode::record("all_to_all", nbytes(local), group, nbytes(local));
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
  if (padded_numel_of(local.sizes(), concat_dim, cpad) == 0 || shapes_only(local, group)) {
    // Nothing moves on any rank (the empty dim is the same everywhere, or concat is empty), or
    // a meta tensor in a fake world, whose result is only a shape.
    auto shape = with_size(local.sizes(), concat_dim, cn);
    shape[static_cast<size_t>(split_dim)] = chunk_size(local.size(split_dim), g, group.rank());
    return at::empty(shape, local.options());
  }
  Transport& tr = transport_of(group);
  at::Tensor src = on_transport(local, tr, "all_to_all");
  if (src.size(concat_dim) != cpad) {  // uneven: pad every peer's piece to the same shape
    at::Tensor p = at::zeros(with_size(src.sizes(), concat_dim, cpad), src.options());
    if (src.size(concat_dim) > 0) p.narrow(concat_dim, 0, src.size(concat_dim)).copy_(src);
    src = p;
  }
  at::Tensor send = stack_pieces(src, split_dim, g);
  at::Tensor recv = at::empty_like(send);
  if (Completion done = tr.all_to_all(send, recv)) done();
  const int64_t my_split = chunk_size(local.size(split_dim), g, group.rank());
  if (my_split != recv.size(split_dim + 1)) recv = recv.narrow(split_dim + 1, 0, my_split);
  return back_to(concat_blocks(recv, concat_dim, chunk_sizes(cn, g)).contiguous(), local.device());
}

namespace {
// Checks one split list of all_to_all_single; an empty list becomes equal splits of `rows`.
std::vector<int64_t> checked_splits(const std::vector<int64_t>& splits, int64_t rows, int64_t g, const char* which) {
  if (splits.empty()) {
    HP_CHECK_T(c10::ValueError, rows % g == 0, "hyper_parallel::all_to_all_single: without ", which, " dim 0 (", rows,
               ") must divide evenly over the group's ", g, " ranks");
    return std::vector<int64_t>(static_cast<size_t>(g), rows / g);
  }
  HP_CHECK_T(c10::ValueError, static_cast<int64_t>(splits.size()) == g, "hyper_parallel::all_to_all_single: ", which, " has ",
             splits.size(), " entries for a group of ", g, " ranks");
  for (int64_t s : splits)
    HP_CHECK_T(c10::ValueError, s >= 0, "hyper_parallel::all_to_all_single: ", which, " holds a negative size (", c10::IntArrayRef(splits), ")");
  return splits;
}
int64_t sum_of(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }
}  // namespace

Work all_to_all_single_async(const at::Tensor& input, const std::vector<int64_t>& output_split_sizes,
                             const std::vector<int64_t>& input_split_sizes, const Group& group) {
  check_group(group, "all_to_all_single");
  const NormalTensors normal;
  HP_CHECK_T(c10::ValueError, input.dim() >= 1, "hyper_parallel::all_to_all_single: the input needs a dim 0 to split, got a scalar");
  const int64_t g = group.size();
  const std::vector<int64_t> in_splits = checked_splits(input_split_sizes, input.size(0), g, "input_split_sizes");
  HP_CHECK_T(c10::ValueError, sum_of(in_splits) == input.size(0), "hyper_parallel::all_to_all_single: input_split_sizes ",
             c10::IntArrayRef(in_splits), " add up to ", sum_of(in_splits), " rows, but the input has ", input.size(0));
  // Without output sizes every rank receives as much as it sends (equal splits everywhere).
  const std::vector<int64_t> out_splits = checked_splits(output_split_sizes, input.size(0), g, "output_split_sizes");
  auto out_shape = input.sizes().vec();
  out_shape[0] = sum_of(out_splits);
  CommDebugMode::record("all_to_all", nbytes(input), group, nbytes(input));
  fingerprint(group, [&] {
    return c10::str("all_to_all_single ", input.scalar_type(), " ", without_dim(input.sizes(), 0));
  });
  if (g == 1) {
    HP_CHECK_T(c10::ValueError, out_splits[0] == in_splits[0], "hyper_parallel::all_to_all_single: a group of one rank receives the ",
               in_splits[0], " rows it sends, not ", out_splits[0]);
    return Work::completed(input.clone(at::MemoryFormat::Contiguous));
  }
  const int64_t row = padded_numel_of(input.sizes(), 0, 1);
  if (row == 0 || shapes_only(input, group)) return Work::completed(at::empty(out_shape, input.options()));
  Transport& tr = transport_of(group);
  if (debug_collectives() && !tr.capabilities().simulated && tr.device_type() == c10::DeviceType::CPU) {
    // Every rank sees every rank's sizes, so a disagreement raises on all of them alike.
    std::vector<int64_t> mine = in_splits;
    mine.insert(mine.end(), out_splits.begin(), out_splits.end());
    const at::Tensor all = all_gather(at::tensor(mine, at::kLong).unsqueeze(0), 0, group).contiguous();
    const int64_t* a = all.data_ptr<int64_t>();
    check_split_agreement(g, group.ranks(), [&](int64_t p, int64_t j) { return a[p * 2 * g + j]; });
  }
  const at::Tensor send = on_transport(input, tr, "all_to_all_single").contiguous().view({input.size(0), row});
  const auto options = input.options().device(tr.device_type() == input.device().type() ? input.device() : c10::Device(tr.device_type()));
  const at::Tensor recv = at::empty({out_shape[0], row}, options);
  Completion done = tr.all_to_all_v(send, recv, in_splits, out_splits);
  const c10::Device device = input.device();
  return Work([=] {
    const NormalTensors normal;
    if (done) done();
    return back_to(recv.view(out_shape), device);
  });
}

at::Tensor all_to_all_single(const at::Tensor& input, const std::vector<int64_t>& output_split_sizes,
                             const std::vector<int64_t>& input_split_sizes, const Group& group) {
  return all_to_all_single_async(input, output_split_sizes, input_split_sizes, group).wait();
}

at::Tensor& broadcast_(at::Tensor& tensor, int64_t src, const Group& group) {
  check_group(group, "broadcast");
  HP_CHECK_T(c10::ValueError, src >= 0 && src < group.size(), "hyper_parallel::broadcast: src ",
             src, " is not a rank of a group of size ", group.size());
  CommDebugMode::record("broadcast", nbytes(tensor), group, nbytes(tensor));
  fingerprint(group, [&] { return c10::str("broadcast src ", src, " ", tensor.scalar_type(), " ", tensor.sizes()); });
  if (group.size() == 1 || tensor.numel() == 0 || shapes_only(tensor, group)) return tensor;
  Transport& tr = transport_of(group);
  at::Tensor buf;
  {
    const NormalTensors normal;
    buf = on_transport(tensor, tr, "broadcast");
    buf = buf.is_contiguous() && !buf.is_inference() ? buf : at::empty(buf.sizes(), buf.options()).copy_(buf);
  }
  if (Completion done = tr.broadcast(buf, src)) done();
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
  CommDebugMode::record("scatter", group.rank() == src ? nbytes(full) : 0, group, nbytes(full));
  fingerprint(group, [&] { return c10::str("scatter dim ", dim, " src ", src, " ", full.scalar_type(), " ", full.sizes()); });
  if (g == 1) return full.clone();
  if (full.numel() == 0 || shapes_only(full, group)) return at::empty(with_size(full.sizes(), dim, mine), full.options());
  Transport& tr = transport_of(group);
  check_device(full, tr, "scatter");  // on every rank, not only where it is read
  const bool source = group.rank() == src || tr.capabilities().simulated;
  const at::Tensor staged = source ? on_transport(full, tr, "scatter") : at::Tensor();
  const auto options = full.options().device(tr.device_type() == full.device().type() ? full.device() : c10::Device(tr.device_type()));
  at::Tensor out = at::empty(with_size(full.sizes(), dim, (n + g - 1) / g), options);
  const at::Tensor stacked = staged.defined() ? stack_pieces(staged, dim, g) : at::Tensor();
  if (Completion done = tr.scatter(stacked, out, src)) done();
  return back_to(mine == out.size(dim) ? out : out.narrow(dim, 0, mine).contiguous(), full.device());
}

void barrier(const Group& group) {
  check_group(group, "barrier");
  CommDebugMode::record("barrier", 0, group, 0);
  fingerprint(group, [] { return std::string("barrier"); });
  if (group.size() == 1) return;
  if (Completion done = transport_of(group).barrier()) done();
}

}  // namespace hyper_parallel
