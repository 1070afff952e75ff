// Random ops on DTensors: each rank draws only its own piece from the counter-based generator
// (dtensor/philox_draw.h), so every element's value is the same whatever the mesh and placements.
// dropout on the CPU decomposes into bernoulli_; native_dropout (CUDA's fused path) and the
// *_like factories are drawn the same way.
#include "rule_utils.h"

#include "../philox_draw.h"

namespace hyper_parallel {
namespace ops {
namespace {

enum class Op { Uniform, Normal, BernoulliFloat, BernoulliTensor, Bernoulli, BernoulliP, Exponential, Random, RandomFrom, RandomTo,
                NativeDropout, RandLike, RandnLike };

bool in_place(Op op) { return op != Op::Bernoulli && op != Op::BernoulliP && op != Op::NativeDropout && op != Op::RandLike && op != Op::RandnLike; }

// The range random_ draws from when `to` is not given: as torch, up to 2^digits for floating
// types (every integer there is exact) and the dtype's maximum for integral ones.
uint64_t default_random_end(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return (1ull << 53) + 1;
    case at::kFloat: return (1ull << 24) + 1;
    case at::kHalf: return (1ull << 11) + 1;
    case at::kBFloat16: return (1ull << 8) + 1;
    case at::kBool: return 2;
    case at::kByte: return 256;
    case at::kChar: return 128;
    case at::kShort: return 1ull << 15;
    case at::kInt: return 1ull << 31;
    default: return 1ull << 63;
  }
}

// The draw of one call from its local arguments (`args`, as the schema orders them).
DrawParams params_of(Op op, const torch::jit::Stack& args, const at::Tensor& self) {
  DrawParams p;
  const char* name = "";
  auto floating = [&](const char* n) {
    HP_CHECK_T(c10::TypeError, at::isFloatingType(self.scalar_type()), "hyper_parallel::dispatch: ", n,
               " needs a floating-point tensor, got ", self.scalar_type());
  };
  switch (op) {
    case Op::Uniform:
      name = "aten::uniform_";
      floating(name);
      p.kind = DrawParams::Kind::Uniform;
      p.a = args[1].toDouble();
      p.b = args[2].toDouble();
      HP_CHECK_T(c10::ValueError, p.a <= p.b, "hyper_parallel::dispatch: aten::uniform_ expects from <= to, got from=", p.a,
                 " to=", p.b);
      break;
    case Op::Normal:
    case Op::RandnLike:
      p.kind = DrawParams::Kind::Normal;
      if (op == Op::Normal) {
        floating("aten::normal_");
        p.a = args[1].toDouble();
        p.b = args[2].toDouble();
        HP_CHECK_T(c10::ValueError, p.b >= 0.0, "hyper_parallel::dispatch: aten::normal_ expects std >= 0.0, got std=", p.b);
      }
      break;
    case Op::RandLike:
      p.kind = DrawParams::Kind::Uniform;
      break;
    case Op::BernoulliFloat:
    case Op::BernoulliP:
    case Op::NativeDropout:
      p.kind = DrawParams::Kind::Bernoulli;
      p.a = args[1].toDouble();
      HP_CHECK_T(c10::ValueError, p.a >= 0.0 && p.a <= 1.0, "hyper_parallel::dispatch: aten::",
                 (op == Op::NativeDropout ? "native_dropout expects a dropout probability" : "bernoulli expects p"),
                 " in [0, 1], got ", p.a);
      if (op == Op::NativeDropout) p.a = 1.0 - p.a;  // the probability of keeping an element
      break;
    case Op::BernoulliTensor:
    case Op::Bernoulli:
      p.kind = DrawParams::Kind::UniformForBernoulli;
      break;
    case Op::Exponential:
      floating("aten::exponential_");
      p.kind = DrawParams::Kind::Exponential;
      p.a = args[1].toDouble();
      HP_CHECK_T(c10::ValueError, p.a > 0.0, "hyper_parallel::dispatch: aten::exponential_ expects lambd > 0.0, got ", p.a);
      break;
    case Op::Random:
    case Op::RandomFrom:
    case Op::RandomTo: {
      p.kind = DrawParams::Kind::RandomInt;
      int64_t from = 0;
      uint64_t end = default_random_end(self.scalar_type());
      bool bounded = false;
      if (op == Op::RandomFrom) {
        from = args[1].toInt();
        if (!args[2].isNone()) {
          HP_CHECK_T(c10::ValueError, from < args[2].toInt(), "hyper_parallel::dispatch: aten::random_ expects from < to, got from=",
                     from, " to=", args[2].toInt());
          p.range = static_cast<uint64_t>(args[2].toInt()) - static_cast<uint64_t>(from);
          bounded = true;
        }
      } else if (op == Op::RandomTo) {
        HP_CHECK_T(c10::ValueError, args[1].toInt() > 0, "hyper_parallel::dispatch: aten::random_ expects to > 0, got ", args[1].toInt());
        p.range = static_cast<uint64_t>(args[1].toInt());
        bounded = true;
      }
      if (!bounded) p.range = end - static_cast<uint64_t>(from);
      p.from = from;
      break;
    }
  }
  return p;
}

// The local op, this rank's piece of one key's draw: a handler, since the first draw on a DTensor
// after a seeding compares the ranks' keys over the mesh. Its params: the op, the number of dims,
// the global shape, the piece's offset.
void draw_handler(const c10::OperatorHandle& h, torch::jit::Stack* stack, const DeviceMesh& mesh, const std::vector<int64_t>& params) {
    const Op op = static_cast<Op>(params.at(0));
    const size_t nd = static_cast<size_t>(params.at(1));
    const std::vector<int64_t> shape(params.begin() + 2, params.begin() + 2 + static_cast<std::ptrdiff_t>(nd));
    const std::vector<int64_t> offset(params.begin() + 2 + static_cast<std::ptrdiff_t>(nd), params.end());
    const torch::jit::Stack args = pop_args(h, stack);
    const at::Tensor self = args[0].toTensor();
    const DrawParams p = params_of(op, args, self);
    const auto& name = h.operator_name();
    const uint64_t call = next_random_key(mesh, "dispatch: " + name.name + (name.overload_name.empty() ? "" : "." + name.overload_name));    switch (op) {
      case Op::BernoulliTensor: {
        at::Tensor u = at::empty(self.sizes(), self.options().dtype(at::kDouble));
        philox_draw(u, shape, offset, p, call);
        self.copy_(u.lt(args[1].toTensor()));
        stack->emplace_back(self);
        return;
      }
      case Op::Bernoulli: {
        at::Tensor u = at::empty(self.sizes(), self.options().dtype(at::kDouble));
        philox_draw(u, shape, offset, p, call);
        stack->emplace_back(u.lt(self).to(self.scalar_type()));
        return;
      }
      case Op::BernoulliP: {
        at::Tensor out = at::empty_like(self, at::MemoryFormat::Contiguous);
        philox_draw(out, shape, offset, p, call);
        stack->emplace_back(out);
        return;
      }
      case Op::NativeDropout: {
        const bool train = args[2].isNone() || args[2].toBool();
        if (!train) {
          stack->emplace_back(self.clone());
          stack->emplace_back(at::ones_like(self, self.options().dtype(at::kBool)));
          return;
        }
        at::Tensor mask = at::empty(self.sizes(), self.options().dtype(at::kBool));
        philox_draw(mask, shape, offset, p, call);
        const double scale = p.a == 0.0 ? 0.0 : 1.0 / p.a;
        stack->emplace_back(self * mask * scale);
        stack->emplace_back(mask);
        return;
      }
      case Op::RandLike:
      case Op::RandnLike: {
        c10::TensorOptions o = self.options();
        if (!args[1].isNone()) o = o.dtype(args[1].toScalarType());
        if (!args[3].isNone()) o = o.device(args[3].toDevice());
        at::Tensor out = at::empty(self.sizes(), o);
        philox_draw(out, shape, offset, p, call);
        stack->emplace_back(out);
        return;
      }
      default:
        philox_draw(self, shape, offset, p, call);
        stack->emplace_back(self);
        return;
    }
}

OpSharding random_rule(const OpInfo& info, Op op) {
  const DTensorSpec& self = info.input_spec(0);
  const auto& args = info.schema().arguments();
  for (size_t i = 0; i < args.size(); ++i)
    HP_CHECK_T(c10::NotImplementedError, args[i].name() != "generator" || info.arg(i).isNone(), "hyper_parallel::dispatch: ",
               info.describe(), ": a random op on a DTensor draws from hyper_parallel's layout-independent generator "
               "(keyed by torch's default CPU generator) and cannot take a torch::Generator");
  HP_CHECK_T(c10::ValueError, !in_place(op) || !self.has_partial(), "hyper_parallel::dispatch: ", info.describe(),
             ": cannot fill a Partial DTensor with random values");
  const Placements x = in_place(op) ? self.placements : without_partial(self.placements);
  OpSharding s;
  for (const auto& in : info.inputs()) {
    if (in.arg == 0) {
      s.input_placements.push_back(x);
      continue;
    }
    // bernoulli_(p: Tensor): the probabilities are read element by element with self's layout.
    HP_CHECK_T(c10::NotImplementedError, in.spec->shape == self.shape || in.spec->ndim() == 0, "hyper_parallel::dispatch: ",
               info.describe(), ": the probabilities must have self's shape (or be 0-dim)");
    s.input_placements.push_back(in.spec->shape == self.shape ? x : replicate(info));
  }
  if (op == Op::NativeDropout) s.output_placements = {x, x};
  else s.output_placements = {x};
  if (!in_place(op)) s.output_shapes = std::vector<std::vector<int64_t>>(s.output_placements.size(), self.shape);
  s.handler = "hp::random_draw";
  s.handler_params = {static_cast<int64_t>(op), static_cast<int64_t>(self.shape.size())};
  s.handler_params.insert(s.handler_params.end(), self.shape.begin(), self.shape.end());
  const auto offset = compute_local_shape_and_offset(self.shape, info.mesh_shape(), info.coordinate(), x).second;
  s.handler_params.insert(s.handler_params.end(), offset.begin(), offset.end());
  return s;
}

struct RandomRegistrar {
  RandomRegistrar() {
    register_op_handler("hp::random_draw", draw_handler);
    const std::pair<const char*, Op> ops[] = {
        {"aten::uniform_", Op::Uniform},          {"aten::normal_", Op::Normal},
        {"aten::bernoulli_.float", Op::BernoulliFloat}, {"aten::bernoulli_.Tensor", Op::BernoulliTensor},
        {"aten::bernoulli", Op::Bernoulli},        {"aten::bernoulli.p", Op::BernoulliP},
        {"aten::exponential_", Op::Exponential},   {"aten::random_", Op::Random},
        {"aten::random_.from", Op::RandomFrom},    {"aten::random_.to", Op::RandomTo},
        {"aten::native_dropout", Op::NativeDropout}, {"aten::rand_like", Op::RandLike},
        {"aten::randn_like", Op::RandnLike}};
    for (const auto& [name, op] : ops) {
      const Op o = op;
      // A rule named without an overload also answers the overloads that have no rule of their
      // own (bernoulli.Tensor, random_.out, ...): those are refused, not drawn as another op.
      const std::string full = name, overload = full.find('.') == std::string::npos ? "" : full.substr(full.find('.') + 1);
      register_sharding_rule(name, [o, overload](const OpInfo& info) {
        HP_CHECK_T(c10::NotImplementedError, info.schema().overload_name() == overload, "hyper_parallel::dispatch: no sharding rule for ",
                   info.describe(), "; register one with hyper_parallel::register_sharding_rule");
        return random_rule(info, o);
      });
    }
  }
} random_registrar;

}  // namespace
}  // namespace ops
}  // namespace hyper_parallel
