// Pointwise ops (unary, binary with broadcasting, Scalar overloads, in-place and out= variants,
// activations and their backwards, the optimizer arithmetic).
#include "pointwise.h"

#include "../local_layout.h"

#include <hyper_parallel/runtime/collectives.h>

namespace hyper_parallel {
namespace ops {

std::vector<int64_t> broadcast_shape(const std::vector<const std::vector<int64_t>*>& shapes) {
  size_t nd = 0;
  for (auto* s : shapes) nd = std::max(nd, s->size());
  std::vector<int64_t> out(nd, 1);
  for (auto* s : shapes)
    for (size_t k = 0; k < s->size(); ++k) {
      int64_t& o = out[nd - s->size() + k];
      const int64_t v = (*s)[k];
      if (o == 1) o = v;
      else HP_CHECK_T(c10::ValueError, v == 1 || v == o, "hyper_parallel::dispatch: shapes do not broadcast");
    }
  return out;
}

namespace {

// The inputs against the broadcast output shape.
struct Broadcast {
  c10::ArrayRef<OpInfo::TensorInput> inputs;
  std::vector<int64_t> out_shape;
  int64_t out_nd;

  explicit Broadcast(const OpInfo& info) : inputs(info.inputs()) {
    std::vector<const std::vector<int64_t>*> shapes;
    for (const auto& in : inputs) shapes.push_back(&in.spec->shape);
    out_shape = broadcast_shape(shapes);
    out_nd = static_cast<int64_t>(out_shape.size());
  }
  // The output dim of input k's dim d (inputs align to the right).
  int64_t out_dim_of(size_t k, int64_t d) const { return d + (out_nd - static_cast<int64_t>(inputs[k].spec->shape.size())); }
  // Whether input k holds output dim `od` itself (not broadcast).
  bool holds(size_t k, int64_t od) const {
    const auto& s = inputs[k].spec->shape;
    const int64_t d = od - (out_nd - static_cast<int64_t>(s.size()));
    return d >= 0 && s[static_cast<size_t>(d)] == out_shape[static_cast<size_t>(od)];
  }
};

// Whether Partial operands on mesh dim i keep the result Partial for an op of `linearity`.
bool keeps_partial(const OpInfo& info, Linearity linearity, size_t i) {
  const auto& inputs = info.inputs();
  size_t npartial = 0, nsum = 0;
  for (const auto& in : inputs) {
    const Placement& p = in.spec->placements[i];
    if (p.is_partial()) { ++npartial; nsum += p.reduce_op() == ReduceOp::SUM; }
  }
  if (npartial == 0 || nsum != npartial) return false;
  const bool self_partial = inputs[0].arg == 0 && inputs[0].spec->placements[i].is_partial();
  switch (linearity) {
    case Linearity::Unary: return inputs.size() == 1;
    case Linearity::Additive: return npartial == inputs.size();
    case Linearity::Multiplicative: return npartial == 1;
    case Linearity::Numerator: return npartial == 1 && self_partial;
    case Linearity::MaskedFill: {
      if (npartial != 1 || !self_partial) return false;
      for (const auto& in : inputs)
        if (in.arg >= 2) return false;  // the fill value is a tensor operand
      return true;
    }
    case Linearity::None: return false;
  }
  return false;
}

// The output placement on each mesh dim: the written tensor's (in-place/out=); else a shard of
// an input that holds the dim (no communication for it); else Partial where the op is linear in
// the Partial operands; else Replicate.
Placements output_placements(const OpInfo& info, Linearity linearity, const Broadcast& b, int64_t written_input) {
  const auto& inputs = info.inputs();
  Placements out(static_cast<size_t>(info.mesh_ndim()));
  for (size_t i = 0; i < out.size(); ++i) {
    if (written_input >= 0) {
      const Placement& p = inputs[static_cast<size_t>(written_input)].spec->placements[i];
      out[i] = p.is_shard() ? Shard(b.out_dim_of(static_cast<size_t>(written_input), p.dim())) : p;
      continue;
    }
    out[i] = Replicate();
    bool chosen = false;
    for (size_t k = 0; k < inputs.size() && !chosen; ++k) {
      const Placement& p = inputs[k].spec->placements[i];
      chosen = p.is_shard() && b.holds(k, b.out_dim_of(k, p.dim()));
      if (chosen) out[i] = Shard(b.out_dim_of(k, p.dim()));
    }
    if (!chosen && keeps_partial(info, linearity, i)) out[i] = Partial();
  }
  return out;
}

// Scalar operands (Scalar arguments, 0-dim plain tensors) of an op that keeps a Partial(sum)
// result: every rank would add the scalar once, so only the ranks at coordinate 0 of every
// Partial mesh dim keep it; the others add zero (x + s = (x_0 + s) + x_1 + ...).
std::function<void(torch::jit::Stack&)> zero_scalars_off_coordinate_0(const OpInfo& info, Linearity linearity,
                                                                      const Placements& out) {
  // Only a sum counts the scalar once per rank; avg/max/min of x_r + s is the value plus s.
  bool keeps = true, partial_out = false;
  for (size_t i = 0; i < out.size(); ++i) {
    const bool sum = out[i].is_partial() && out[i].reduce_op() == ReduceOp::SUM;
    partial_out = partial_out || sum;
    if (sum && info.coordinate()[i] != 0) keeps = false;
  }
  if (!partial_out || keeps || (linearity != Linearity::Additive && linearity != Linearity::MaskedFill)) return nullptr;
  std::vector<size_t> scalar_operands;
  const auto& args = info.schema().arguments();
  for (size_t a = 0; a < args.size(); ++a) {
    if (args[a].name() == "alpha" || info.input_index(a) >= 0) continue;
    const auto kind = args[a].type()->kind();
    const c10::IValue& v = info.arg(a);
    if ((kind == c10::TypeKind::NumberType && v.isScalar()) ||
        (kind == c10::TypeKind::TensorType && v.isTensor() && v.toTensor().defined()))
      scalar_operands.push_back(a);
  }
  if (scalar_operands.empty()) return nullptr;
  return [scalar_operands](torch::jit::Stack& args) {
    for (size_t a : scalar_operands) {
      c10::IValue& v = args[a];
      if (v.isTensor()) {
        const at::Tensor& t = v.toTensor();
        at::Tensor z = at::zeros_like(t);
        z.unsafeGetTensorImpl()->set_wrapped_number(t.unsafeGetTensorImpl()->is_wrapped_number());
        v = z;
      } else if (v.isDouble()) {
        v = c10::IValue(0.0);
      } else if (v.isComplexDouble()) {
        v = c10::IValue(c10::complex<double>(0, 0));
      } else if (v.isBool()) {
        v = c10::IValue(false);
      } else {
        v = c10::IValue(int64_t{0});
      }
    }
  };
}

// What input k must be for output placements `out`.
Placements input_placements(const OpInfo& info, Linearity linearity, const Broadcast& b, const Placements& out, size_t k,
                            int64_t written_input) {
  const auto& in = *info.inputs()[k].spec;
  Placements want(out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].is_shard()) {
      want[i] = b.holds(k, out[i].dim()) ? Shard(out[i].dim() - (b.out_nd - in.ndim())) : Replicate();
    } else if (out[i].is_partial()) {
      // Reached with a Partial written tensor too (written exactly, see partial_write):
      // a sum stays exact only if every addend is Partial (a replicated addend becomes Partial
      // by zeros off coordinate 0) and factors are replicated; avg/max/min get every other
      // operand replicated.
      const bool carrier = written_input >= 0 ? static_cast<int64_t>(k) == written_input : in.placements[i].is_partial();
      if (out[i].reduce_op() != ReduceOp::SUM) want[i] = carrier ? out[i] : Replicate();
      else want[i] = linearity == Linearity::Additive || carrier ? Partial() : Replicate();
    } else {
      want[i] = Replicate();
    }
  }
  return want;
}

// The strides of a new result: a copy with a memory format (clone, _to_copy) keeps a dense
// input's strides under Preserve and is contiguous otherwise; other ops lay it out as
// TensorIterator does.
std::vector<int64_t> output_strides(const OpInfo& info, const std::vector<int64_t>& shape) {
  const auto& inputs = info.inputs();
  if (const c10::IValue* format = arg_named(info, "memory_format")) {
    const auto mf = format->isNone() ? at::MemoryFormat::Preserve : static_cast<at::MemoryFormat>(format->toInt());
    const DTensorSpec& in = *inputs[0].spec;
    if (mf == at::MemoryFormat::Preserve && is_dense(in.shape, in.stride)) return in.stride;
    if (mf == at::MemoryFormat::Preserve || mf == at::MemoryFormat::Contiguous) return contiguous_strides(shape);
    return at::empty(shape, at::TensorOptions().device(at::kMeta).memory_format(mf)).strides().vec();
  }
  std::vector<OperandLayout> operands;
  for (const auto& in : inputs) operands.push_back({&in.spec->shape, &in.spec->stride});
  return elementwise_strides(shape, operands);
}

// An op that writes a Partial tensor keeps its placements.
// - In place (PyTorch refuses it): exact without communication where the math allows (a sum or
//   an avg under a linear op, scalars counted once; avg/max/min under adding, filling or copying
//   a replicated value: every rank applies it). Otherwise the value is reduced first, in place on
//   every rank, the op applied to it, and on a sum's mesh dims the ranks off coordinate 0 zeroed:
//   the same placements, the exact value, and the tensor's views (which share its local data)
//   stay right too.
// - out=: the old value does not matter. Under avg/max/min every rank computing the whole value
//   is exact, and so is a sum of Partial addends; otherwise every rank computes the whole value
//   and the ranks off coordinate 0 of a sum's mesh dims zero it.
// Returns the handler's parameters (the written argument, whether to reduce it first, then its
// (mesh dim, reduce op) pairs); empty when the op is exact as it is.
std::vector<int64_t> partial_write(const OpInfo& info, Linearity linearity, int64_t written_input) {
  if (written_input < 0) return {};
  const DTensorSpec& self = *info.inputs()[static_cast<size_t>(written_input)].spec;
  const bool in_place = info.written_arg() == 0;
  bool exact = true;
  for (const auto& p : self.placements) {
    if (!p.is_partial()) continue;
    const ReduceOp op = p.reduce_op();
    if (!in_place) exact = exact && (op != ReduceOp::SUM || linearity == Linearity::Additive);
    else if (op == ReduceOp::SUM || op == ReduceOp::AVG) exact = exact && linearity != Linearity::None;
    else exact = exact && (linearity == Linearity::Additive || linearity == Linearity::MaskedFill);
  }
  if (exact) return {};
  std::vector<int64_t> params{info.written_arg(), in_place ? 1 : 0};
  for (size_t i = 0; i < self.placements.size(); ++i)
    if (self.placements[i].is_partial()) {
      params.push_back(static_cast<int64_t>(i));
      params.push_back(static_cast<int64_t>(self.placements[i].reduce_op()));
    }
  return params;
}

// The op handler of partial_write.
void write_partial(const c10::OperatorHandle& op, torch::jit::Stack* stack, const DeviceMesh& mesh,
                   const std::vector<int64_t>& params) {
  const size_t nargs = op.schema().arguments().size();
  at::Tensor written = (*stack)[stack->size() - nargs + static_cast<size_t>(params[0])].toTensor();
  const bool reduce_first = params[1] != 0;
  const auto coord = *mesh.get_coordinate();
  bool zero = false;
  for (size_t k = 2; k + 1 < params.size(); k += 2) {
    const auto reduce = static_cast<ReduceOp>(params[k + 1]);
    if (reduce_first) all_reduce_(written, reduce, mesh.get_group(params[k]));
    zero = zero || (reduce == ReduceOp::SUM && coord[static_cast<size_t>(params[k])] != 0);
  }
  op.callBoxed(stack);
  if (zero) written.zero_();
}

}  // namespace

OpSharding pointwise_sharding(const OpInfo& info, Linearity linearity) {
  const Broadcast b(info);
  const int64_t written = info.written_arg();
  const int64_t written_input = written >= 0 ? info.input_index(static_cast<size_t>(written)) : -1;
  const Placements out = output_placements(info, linearity, b, written_input);
  OpSharding s;
  s.handler_params = partial_write(info, linearity, written_input);
  if (!s.handler_params.empty()) {
    // The op computes the whole value: the other operands are replicated there.
    Placements as_replicated = out;
    for (auto& p : as_replicated)
      if (p.is_partial()) p = Replicate();
    for (size_t k = 0; k < info.inputs().size(); ++k)
      s.input_placements.push_back(static_cast<int64_t>(k) == written_input
                                       ? info.inputs()[k].spec->placements
                                       : input_placements(info, linearity, b, as_replicated, k, -1));
    s.handler = "hp::write_partial";
    if (s.handler_params[1] != 0)
      s.implicit_communication = info.input_name(static_cast<size_t>(written_input)) + " " +
                                 short_string(info.inputs()[static_cast<size_t>(written_input)].spec->placements) +
                                 " -> R: all_reduce before the in-place op";
  } else {
    s.adjust_args = zero_scalars_off_coordinate_0(info, linearity, out);
    for (size_t k = 0; k < info.inputs().size(); ++k)
      s.input_placements.push_back(input_placements(info, linearity, b, out, k, written_input));
  }
  s.output_placements.assign(info.schema().returns().size(), out);
  // The broadcast shape and TensorIterator's strides, not a meta run: many pointwise ops (relu,
  // _to_copy, where) have no meta kernel in C++.
  s.output_shapes.assign(info.schema().returns().size(), b.out_shape);
  s.output_strides.assign(info.schema().returns().size(), output_strides(info, b.out_shape));
  return s;
}

namespace {

ShardingRule rule(Linearity l) {
  return [l](const OpInfo& info) { return pointwise_sharding(info, l); };
}

// A cast commutes with the sum of a Partial value between floating types: widening is exact, and
// narrowing rounds each addend once, an error of the order of reducing in the narrow type itself
// (what a reduction of the cast value would do). To integer or bool types each rank's addend
// would be truncated on its own: the value is reduced first.
OpSharding to_copy_rule(const OpInfo& info) {
  const DTensorSpec& in = info.input_spec(0);
  const c10::IValue* dtype = arg_named(info, "dtype");
  const at::ScalarType target = dtype != nullptr && !dtype->isNone() ? static_cast<at::ScalarType>(dtype->toInt()) : in.dtype;
  const bool linear = is_float_like(in.dtype) && is_float_like(target);
  return pointwise_sharding(info, linear ? Linearity::Unary : Linearity::None);
}

// div with a rounding mode (floor/trunc) is not linear in its numerator.
OpSharding div_rule(const OpInfo& info) {
  const c10::IValue* mode = arg_named(info, "rounding_mode");
  return pointwise_sharding(info, mode != nullptr && !mode->isNone() ? Linearity::None : Linearity::Numerator);
}

// Ops with no linearity to exploit: a Partial input is reduced first.
const char* kNonLinear[] = {
    "aten::abs", "aten::acos", "aten::asin", "aten::atan", "aten::ceil", "aten::cos", "aten::cosh",
    "aten::erf", "aten::exp", "aten::expm1", "aten::floor", "aten::log", "aten::log1p", "aten::log2",
    "aten::reciprocal", "aten::round", "aten::rsqrt", "aten::sigmoid", "aten::sign", "aten::sin",
    "aten::sinh", "aten::sqrt", "aten::tan", "aten::tanh", "aten::trunc", "aten::relu", "aten::relu_",
    "aten::gelu", "aten::gelu_", "aten::silu", "aten::silu_", "aten::pow", "aten::pow_",
    "aten::clamp", "aten::clamp_", "aten::clamp_min", "aten::clamp_min_", "aten::clamp_max",
    "aten::clamp_max_", "aten::threshold", "aten::threshold_backward", "aten::gelu_backward",
    "aten::silu_backward", "aten::sigmoid_backward", "aten::tanh_backward", "aten::hardtanh",
    "aten::hardtanh_backward", "aten::leaky_relu", "aten::leaky_relu_backward", "aten::elu",
    "aten::softplus", "aten::mish", "aten::addcmul", "aten::addcmul_", "aten::addcdiv",
    "aten::addcdiv_", "aten::lerp", "aten::lerp_", "aten::maximum", "aten::minimum",
    "aten::max.other", "aten::min.other", "aten::eq", "aten::ne", "aten::lt", "aten::le",
    "aten::gt", "aten::ge", "aten::eq_", "aten::ne_", "aten::logical_and", "aten::logical_or",
    "aten::logical_not", "aten::logical_xor", "aten::isnan", "aten::isinf", "aten::isfinite",
    "aten::isneginf", "aten::isposinf", "aten::bitwise_and", "aten::bitwise_or",
    "aten::bitwise_not", "aten::where",
    "aten::native_dropout_backward", "aten::rsub", "aten::sgn", "aten::signbit",
    "aten::nan_to_num", "aten::fmod", "aten::remainder", "aten::atan2", "aten::square",
    "aten::logical_and_", "aten::logical_or_", "aten::logical_not_", "aten::elu_backward",
    "aten::softplus_backward", "aten::mish_backward", "aten::sgn_", "aten::bitwise_xor"};
const char* kNonLinearInPlace[] = {
    "aten::abs_", "aten::acos_", "aten::asin_", "aten::atan_", "aten::ceil_", "aten::cos_", "aten::cosh_",
    "aten::erf_", "aten::exp_", "aten::expm1_", "aten::floor_", "aten::log_", "aten::log1p_", "aten::log2_",
    "aten::reciprocal_", "aten::round_", "aten::rsqrt_", "aten::sigmoid_", "aten::sign_", "aten::sin_",
    "aten::sinh_", "aten::sqrt_", "aten::tan_", "aten::tanh_", "aten::trunc_", "aten::hardtanh_",
    "aten::leaky_relu_", "aten::elu_", "aten::square_", "aten::fmod_", "aten::remainder_", "aten::atan2_",
    "aten::threshold_", "aten::nan_to_num_", "aten::bitwise_and_", "aten::bitwise_or_", "aten::bitwise_xor_",
    "aten::bitwise_not_", "aten::lt_", "aten::le_", "aten::gt_", "aten::ge_", "aten::mish_"};
// Linear in each operand when all operands are Partial(sum): x + y, x - y.
const char* kAdditive[] = {"aten::add", "aten::add_", "aten::sub", "aten::sub_"};
// Linear in one Partial operand when the others are replicated: x * c.
const char* kMultiplicative[] = {"aten::mul", "aten::mul_"};
// One input, linear: -x, copies, conversions.
const char* kUnaryLinear[] = {"aten::neg", "aten::neg_", "aten::clone",
                              "aten::positive", "aten::real", "aten::conj_physical"};

struct PointwiseRegistrar {
  PointwiseRegistrar() {
    register_op_handler("hp::write_partial", write_partial);
    for (auto n : kNonLinear) register_sharding_rule(n, rule(Linearity::None));
    // In-place forms of unary non-linear ops (where this libtorch has them).
    for (auto n : kNonLinearInPlace) {
      // Under any of its overloads (bitwise_and_ has only .Tensor and .Scalar).
      auto& d = c10::Dispatcher::singleton();
      const bool found = d.findOp(c10::OperatorName(n, "")).has_value() || d.findOp(c10::OperatorName(n, "Tensor")).has_value() ||
                         d.findOp(c10::OperatorName(n, "Scalar")).has_value();
      if (found) register_sharding_rule(n, rule(Linearity::None));
    }
    for (auto n : kAdditive) register_sharding_rule(n, rule(Linearity::Additive));
    for (auto n : kMultiplicative) register_sharding_rule(n, rule(Linearity::Multiplicative));
    // Linear in the numerator: x / c.
    for (auto n : {"aten::div", "aten::div_"}) register_sharding_rule(n, div_rule);
    register_sharding_rule("aten::_to_copy", to_copy_rule);
    for (auto n : {"aten::masked_fill", "aten::masked_fill_"}) register_sharding_rule(n, rule(Linearity::MaskedFill));
    for (auto n : kUnaryLinear) register_sharding_rule(n, rule(Linearity::Unary));
  }
} pointwise_registrar;

}  // namespace
}  // namespace ops
}  // namespace hyper_parallel
