// Matrix products: mm, addmm, bmm (what Linear and matmul decompose into on libtorch 1.13).
#include "rule_utils.h"

namespace hyper_parallel {
namespace ops {
namespace {

struct Choice {
  Placement a, b, out;
};

// One mesh dim of A[..., m, k] @ B[..., k, n] (`batched`: a leading batch dim on both). Keeps
// whatever sharding the inputs already have where the algebra allows: rows of A -> rows of the
// result, columns of B -> columns, the contracted dim on both -> Partial(sum).
Choice choose(const Placement& pa, const Placement& pb, bool batched) {
  const int64_t o = batched ? 1 : 0;
  const int64_t m = o, ka = o + 1, kb = o, n = o + 1;
  if (batched && (pa.is_shard(0) || pb.is_shard(0))) return {Shard(0), Shard(0), Shard(0)};
  if (pa.is_shard(m)) return {pa, Replicate(), Shard(m)};
  if (pb.is_shard(n)) return {Replicate(), pb, Shard(o + 1)};
  if (pa.is_shard(ka) || pb.is_shard(kb)) return {Shard(ka), Shard(kb), Partial()};
  const bool a_sum = pa.is_partial() && pa.reduce_op() == ReduceOp::SUM;
  const bool b_sum = pb.is_partial() && pb.reduce_op() == ReduceOp::SUM;
  if (a_sum && !pb.is_partial()) return {pa, Replicate(), Partial()};
  if (b_sum && !pa.is_partial()) return {Replicate(), pb, Partial()};
  if (a_sum && b_sum) return {Replicate(), pb, Partial()};  // reduce one factor only
  return {Replicate(), Replicate(), Replicate()};
}

OpSharding product(const OpInfo& info, size_t a_arg, size_t b_arg, bool batched, int64_t self_arg) {
  const DTensorSpec* a = info.spec(a_arg);
  const DTensorSpec* b = info.spec(b_arg);
  HP_CHECK_T(c10::ValueError, a && b, "hyper_parallel::dispatch: ", info.describe(),
             " needs both matrix operands to be DTensors");
  const size_t nmesh = static_cast<size_t>(info.mesh_ndim());
  Placements pa(nmesh), pb(nmesh), out(nmesh);
  for (size_t i = 0; i < nmesh; ++i) {
    Choice c = choose(a->placements[i], b->placements[i], batched);
    pa[i] = c.a;
    pb[i] = c.b;
    out[i] = c.out;
  }
  OpSharding s;
  s.input_placements.resize(info.inputs().size());
  for (size_t k = 0; k < info.inputs().size(); ++k) {
    const auto& in = info.inputs()[k];
    if (in.arg == a_arg) s.input_placements[k] = pa;
    else if (in.arg == b_arg) s.input_placements[k] = pb;
    else if (static_cast<int64_t>(in.arg) == self_arg) {
      // The added term (addmm's self) broadcasts against the [m, n] result.
      const auto& shape = in.spec->shape;
      const int64_t nd = static_cast<int64_t>(shape.size());
      const int64_t m = a->shape[a->shape.size() - 2], n = b->shape.back();
      const std::vector<int64_t> res = batched ? std::vector<int64_t>{a->shape[0], m, n}
                                               : std::vector<int64_t>{m, n};
      const int64_t out_nd = static_cast<int64_t>(res.size());
      Placements want(nmesh);
      for (size_t i = 0; i < nmesh; ++i) {
        if (out[i].is_partial()) {
          want[i] = Partial();  // added once: Replicate -> Partial keeps it on coordinate 0 only
        } else if (out[i].is_shard()) {
          const int64_t d = out[i].dim() - (out_nd - nd);
          const bool holds = d >= 0 && shape[static_cast<size_t>(d)] == res[static_cast<size_t>(out[i].dim())];
          want[i] = holds ? Shard(d) : Replicate();
        } else {
          want[i] = Replicate();
        }
      }
      s.input_placements[k] = want;
    } else {
      s.input_placements[k] = replicate(info);
    }
  }
  s.output_placements = {out};
  return s;
}

// A product with one Partial(sum) factor and a factor that is not Partial stays Partial(sum)
// (it is linear in each factor); anything else is computed replicated.
Placement one_partial_factor(const Placement& pa, const Placement& pb, Placement& a, Placement& b) {
  const bool a_sum = pa.is_partial() && pa.reduce_op() == ReduceOp::SUM;
  const bool b_sum = pb.is_partial() && pb.reduce_op() == ReduceOp::SUM;
  if (a_sum && !pb.is_partial()) { a = pa; b = Replicate(); return Partial(); }
  if (b_sum && !pa.is_partial()) { a = Replicate(); b = pb; return Partial(); }
  a = b = Replicate();
  return Replicate();
}

// Vector products, sharded as the matrix ones (what matmul with a 1-D operand and dot reach).
// dot(a[k], b[k]): the contracted dim sharded on both -> Partial(sum).
Placement dot_choice(const Placement& pa, const Placement& pb, Placement& a, Placement& b) {
  if (pa.is_shard() || pb.is_shard()) { a = b = Shard(0); return Partial(); }
  return one_partial_factor(pa, pb, a, b);
}

// mv(m[n, k], v[k]): rows of m -> the result's dim 0; k sharded on both -> Partial(sum).
Placement mv_choice(const Placement& pm, const Placement& pv, Placement& m, Placement& v) {
  if (pm.is_shard(0)) { m = pm; v = Replicate(); return Shard(0); }
  if (pm.is_shard(1) || pv.is_shard(0)) { m = Shard(1); v = Shard(0); return Partial(); }
  return one_partial_factor(pm, pv, m, v);
}

// outer(a[n], b[m]): a's shards -> dim 0, b's -> dim 1.
Placement outer_choice(const Placement& pa, const Placement& pb, Placement& a, Placement& b) {
  if (pa.is_shard()) { a = pa; b = Replicate(); return Shard(0); }
  if (pb.is_shard()) { a = Replicate(); b = pb; return Shard(1); }
  return one_partial_factor(pa, pb, a, b);
}

using VectorChoice = Placement (*)(const Placement&, const Placement&, Placement&, Placement&);

// The shapes are given: these ops have no meta kernel in C++.
OpSharding vector_product(const OpInfo& info, VectorChoice choice, int64_t kind) {
  const DTensorSpec* a = info.spec(0);
  const DTensorSpec* b = info.spec(1);
  HP_CHECK_T(c10::ValueError, a && b, "hyper_parallel::dispatch: ", info.describe(), " needs both operands to be DTensors");
  const size_t nmesh = static_cast<size_t>(info.mesh_ndim());
  Placements pa(nmesh), pb(nmesh), out(nmesh);
  for (size_t i = 0; i < nmesh; ++i) out[i] = choice(a->placements[i], b->placements[i], pa[i], pb[i]);
  HP_CHECK_T(c10::ValueError, kind != 0 || a->shape == b->shape, "hyper_parallel::dispatch: ", info.describe(),
             ": the vectors have different sizes");
  OpSharding s;
  s.input_placements = {pa, pb};
  s.output_placements = {out};
  if (kind == 0) s.output_shapes = {{}};
  else if (kind == 1) s.output_shapes = {{a->shape[0]}};
  else s.output_shapes = {{a->shape[0], b->shape[0]}};
  return s;
}

struct MatmulRegistrar {
  MatmulRegistrar() {
    register_sharding_rule("aten::mm", [](const OpInfo& i) { return product(i, 0, 1, false, -1); });
    register_sharding_rule("aten::addmm", [](const OpInfo& i) { return product(i, 1, 2, false, 0); });
    register_sharding_rule("aten::bmm", [](const OpInfo& i) { return product(i, 0, 1, true, -1); });
    register_sharding_rule("aten::baddbmm", [](const OpInfo& i) { return product(i, 1, 2, true, 0); });
    for (const char* n : {"aten::dot", "aten::vdot"})
      register_sharding_rule(n, [](const OpInfo& i) { return vector_product(i, dot_choice, 0); });
    register_sharding_rule("aten::mv", [](const OpInfo& i) { return vector_product(i, mv_choice, 1); });
    for (const char* n : {"aten::outer", "aten::ger"})
      register_sharding_rule(n, [](const OpInfo& i) { return vector_product(i, outer_choice, 2); });
  }
} matmul_registrar;

}  // namespace
}  // namespace ops
}  // namespace hyper_parallel
