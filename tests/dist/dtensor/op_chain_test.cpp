// Random op chains: the net under every change to the DTensor core. Each chain is a random
// program of 3-8 steps on 1-3 live tensors (pointwise, scalar and broadcasting ops, reductions,
// views, in-place ops on tensors and on views, matmul, softmax, cat/stack, redistribute), built
// from a fixed seed identically on every rank. Its inputs take random placements (Shard of any
// dim, Replicate, asymmetric Partial sum/avg/max) and shapes that give even, uneven and empty
// pieces. After every step every live tensor equals its plain twin in values, sizes, strides
// (on every dim of size > 1) and aliasing (which live tensors share data); at the end the
// gradients of the leaves equal the plain ones. A step the DTensor refuses must be refused on
// every rank (it is then left out, and counted); every verdict is agreed by all ranks.
#include "../../common/test_util.h"

#include <hyper_parallel/runtime/collectives.h>

#include <cstdlib>
#include <map>
#include <random>
#include <sstream>

using namespace hp_test;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_dist_dtensor_op_chain_test {
namespace {

using Rng = std::mt19937_64;

int64_t pick(Rng& rng, int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); }
bool coin(Rng& rng, double p = 0.5) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }

// A tensor of the chain: its plain twin and the DTensor.
struct Pair {
  at::Tensor plain, dist;
};

// Agreed over every rank: the number of ranks for which `mine` holds.
int64_t count_ranks(bool mine) {
  at::Tensor t = at::full({1}, mine ? 1 : 0, at::kLong);
  hp::all_reduce_(t, hp::ReduceOp::SUM, hp::world_group());
  return t.item<int64_t>();
}

std::vector<int64_t> random_shape(Rng& rng) {
  const int64_t nd = pick(rng, 1, 3);
  std::vector<int64_t> s;
  for (int64_t k = 0; k < nd; ++k) s.push_back(pick(rng, 1, 6));
  return s;
}

// A random placement of a tensor of `ndim` dims on each mesh dim.
hp::Placements random_placements(Rng& rng, const hp::DeviceMesh& mesh, int64_t ndim, bool allow_partial) {
  hp::Placements p;
  for (int64_t i = 0; i < mesh.ndim(); ++i) {
    const int64_t r = pick(rng, 0, 9);
    if (r < 5) p.push_back(hp::Shard(pick(rng, 0, ndim - 1)));
    else if (r < 7 || !allow_partial) p.push_back(hp::Replicate());
    else if (r == 7) p.push_back(hp::Partial(hp::ReduceOp::SUM));
    else if (r == 8) p.push_back(hp::Partial(hp::ReduceOp::AVG));
    else p.push_back(hp::Partial(hp::ReduceOp::MAX));
  }
  // max does not commute with sum/avg: a value Partial(max) on one mesh dim and Partial(sum) on
  // another depends on the order of the reductions. Such a tensor has no single meaning.
  int64_t npartial = 0;
  bool has_max = false;
  for (const auto& x : p) {
    npartial += x.is_partial();
    has_max = has_max || (x.is_partial() && x.reduce_op() == hp::ReduceOp::MAX);
  }
  if (has_max && npartial > 1)
    for (auto& x : p)
      if (x.is_partial() && x.reduce_op() == hp::ReduceOp::MAX) x = hp::Replicate();
  return p;
}

// `full` laid out by `placements`: the Shard pieces, and on each Partial mesh dim addends that
// reduce to the value (sum: integer weights summing to one; avg: offsets summing to zero; max:
// the value at coordinate 0, less elsewhere), so every reduction order gives it exactly.
at::Tensor make_dtensor(const at::Tensor& full, const hp::DeviceMesh& mesh, const hp::Placements& placements) {
  hp::Placements no_partial = placements;
  for (auto& p : no_partial)
    if (p.is_partial()) p = hp::Replicate();
  at::Tensor local = hp::DTensor(hp::distribute_tensor(full, mesh, no_partial, c10::nullopt)).to_local().clone();
  const auto coord = *mesh.get_coordinate();
  for (size_t i = 0; i < placements.size(); ++i) {
    if (!placements[i].is_partial()) continue;
    const int64_t c = coord[i], n = mesh.size(static_cast<int64_t>(i));
    switch (placements[i].reduce_op()) {
      case hp::ReduceOp::SUM: local = partial_piece(local, c, n); break;
      case hp::ReduceOp::AVG: local = local + (c == 0 ? 0.5 * (n - 1) : -0.5); break;
      default: local = local - (c == 0 ? 0.0 : 0.25 * c); break;  // MAX
    }
  }
  return hp::DTensor::from_local(local, mesh, placements, false, full.sizes()).detach();
}

// Whether the local data of DTensors `a` and `b` overlaps.
bool dist_shares(const at::Tensor& a, const at::Tensor& b) {
  return hp::DTensor(a).to_local().is_alias_of(hp::DTensor(b).to_local());
}

// The first difference between the live pairs, or "".
std::string compare(const std::vector<Pair>& live) {
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < live.size(); ++k) {
    const at::Tensor& p = live[k].plain;
    const at::Tensor& d = live[k].dist;
    std::ostringstream why;
    if (!hp::is_dtensor(d)) return c10::str("tensor ", k, " is not a DTensor");
    if (d.sizes() != p.sizes()) return c10::str("tensor ", k, ": sizes ", d.sizes(), " != plain ", p.sizes());
    if (d.scalar_type() != p.scalar_type()) return c10::str("tensor ", k, ": dtype ", d.scalar_type(), " != plain ", p.scalar_type());
    if (p.numel() > 0)
      for (int64_t i = 0; i < p.dim(); ++i)
        if (p.size(i) > 1 && d.stride(i) != p.stride(i))
          return c10::str("tensor ", k, ": strides ", d.strides(), " != plain ", p.strides(), " (sizes ", p.sizes(), ")");
    at::Tensor full = hp::DTensor(d).full_tensor();
    if (p.is_floating_point()) {
      if (!at::allclose(full.to(at::kDouble), p.to(at::kDouble), 1e-4, 1e-4, /*equal_nan=*/true))
        return c10::str("tensor ", k, ": values differ, max abs diff ",
                        (full.to(at::kDouble) - p.to(at::kDouble)).abs().max().item<double>(), "\nDTensor:\n", full, "\nplain:\n", p);
    } else if (!at::equal(full, p)) {
      return c10::str("tensor ", k, ": values differ\nDTensor:\n", full, "\nplain:\n", p);
    }
    for (size_t j = 0; j < k; ++j) {
      const bool ps = p.is_alias_of(live[j].plain), ds = dist_shares(d, live[j].dist);
      // A view that needed communication is a copy (and refuses writes): it may share less.
      const bool copy = hp::DTensor(d).is_copy_view() || hp::DTensor(live[j].dist).is_copy_view();
      if (ps != ds && !(ps && copy))
        return c10::str("tensors ", j, " and ", k, (ps ? " share data on plain tensors but not as DTensors"
                                                       : " share data as DTensors but not on plain tensors"));
    }
  }
  return "";
}

// One op of the menu, applied to the live tensors (of either kind) with parameters drawn once.
using Op = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

struct Step {
  std::string name;  // with its parameters, for the failure report
  std::string kind;  // for the refusal counts
  Op op;
  bool in_place = false;  // the result replaces tensor `target`
  size_t target = 0;
};

// Builds the chains' steps. `fresh` makes an extra operand (no gradient) of a shape, as a pair.
class Menu {
 public:
  Menu(Rng& rng, const hp::DeviceMesh& mesh, std::vector<Pair>& constants) : rng_(rng), mesh_(mesh), constants_(constants) {}

  Step draw(const std::vector<Pair>& live) {
    const size_t a = static_cast<size_t>(pick(rng_, 0, static_cast<int64_t>(live.size()) - 1));
    const at::Tensor& x = live[a].plain;
    const int64_t nd = x.dim();
    const int64_t d = nd == 0 ? 0 : pick(rng_, 0, nd - 1);
    auto same_shape_partner = [&]() -> int64_t {
      std::vector<size_t> c;
      for (size_t k = 0; k < live.size(); ++k)
        if (live[k].plain.sizes() == x.sizes() && live[k].plain.scalar_type() == x.scalar_type()) c.push_back(k);
      return static_cast<int64_t>(c[static_cast<size_t>(pick(rng_, 0, static_cast<int64_t>(c.size()) - 1))]);
    };
    const double c = std::vector<double>{0.5, 2.0, -1.5, 3.0}[static_cast<size_t>(pick(rng_, 0, 3))];
    using V = const std::vector<at::Tensor>&;
    const bool fp = x.is_floating_point();
    for (;;) {
      switch (pick(rng_, 0, 23)) {
        case 0: {
          const int64_t u = pick(rng_, 0, 5);
          const char* names[] = {"neg", "exp", "relu", "sigmoid", "abs", "tanh"};
          return {c10::str(names[u], "(t", a, ")"), names[u], [a, u](V t) {
                    const at::Tensor& y = t[a];
                    switch (u) {
                      case 0: return y.neg();
                      case 1: return y.tanh().exp();
                      case 2: return y.relu();
                      case 3: return y.sigmoid();
                      case 4: return y.abs();
                      default: return y.tanh();
                    }
                  }};
        }
        case 1: {
          const int64_t u = pick(rng_, 0, 3);
          const char* names[] = {"t * c", "t + c", "c - t", "t / c"};
          return {c10::str(names[u], " (t", a, ", c=", c, ")"), names[u], [a, u, c](V t) {
                    switch (u) {
                      case 0: return t[a] * c;
                      case 1: return t[a] + c;
                      case 2: return c - t[a];
                      default: return t[a] / c;
                    }
                  }};
        }
        case 2: {
          if (!fp) break;
          const size_t b = static_cast<size_t>(same_shape_partner());
          const int64_t u = pick(rng_, 0, 3);
          const char* names[] = {"add", "sub", "mul", "maximum"};
          return {c10::str(names[u], "(t", a, ", t", b, ")"), names[u], [a, b, u](V t) {
                    switch (u) {
                      case 0: return t[a] + t[b];
                      case 1: return t[a] - t[b];
                      case 2: return t[a] * t[b];
                      default: return at::maximum(t[a], t[b]);
                    }
                  }};
        }
        case 3: {  // broadcasting with a row of the last dim
          if (nd == 0 || !fp) break;
          const size_t k = fresh({x.size(-1)});
          return {c10::str("t", a, " * row", k), "broadcast mul", [a, k, this](V t) {
                    return t[a] * (hp::is_dtensor(t[a]) ? constants_[k].dist : constants_[k].plain);
                  }};
        }
        case 4: {
          if (nd == 0 || !fp) break;
          const bool keep = coin(rng_);
          const int64_t u = pick(rng_, 0, 2);
          const char* names[] = {"sum", "mean", "amax"};
          return {c10::str(names[u], "(t", a, ", dim=", d, ", keepdim=", keep, ")"), names[u], [a, d, keep, u](V t) {
                    switch (u) {
                      case 0: return t[a].sum(d, keep);
                      case 1: return t[a].mean(d, keep);
                      default: return t[a].amax(d, keep);
                    }
                  }};
        }
        case 5:
          if (!fp) break;
          return {c10::str("sum(t", a, ")"), "sum all", [a](V t) { return t[a].sum(); }};
        case 6: {
          if (nd < 2) break;
          int64_t e = pick(rng_, 0, nd - 2);
          if (e >= d) ++e;
          return {c10::str("transpose(t", a, ", ", d, ", ", e, ")"), "transpose", [a, d, e](V t) { return t[a].transpose(d, e); }};
        }
        case 7: {
          if (nd == 0 || x.size(d) == 0) break;
          const int64_t start = pick(rng_, 0, x.size(d) - 1), len = pick(rng_, 1, x.size(d) - start);
          return {c10::str("narrow(t", a, ", ", d, ", ", start, ", ", len, ")"), "narrow",
                  [a, d, start, len](V t) { return t[a].narrow(d, start, len); }};
        }
        case 8: {
          if (nd < 2 || x.size(d) == 0) break;
          const int64_t i = pick(rng_, 0, x.size(d) - 1);
          return {c10::str("select(t", a, ", ", d, ", ", i, ")"), "select", [a, d, i](V t) { return t[a].select(d, i); }};
        }
        case 9: {
          if (nd == 0) break;
          const int64_t u = pick(rng_, 0, 3);
          if (u == 0) return {c10::str("reshape(t", a, ", -1)"), "reshape", [a](V t) { return t[a].reshape(-1); }};
          if (u == 1) return {c10::str("flatten(t", a, ")"), "flatten", [a](V t) { return t[a].flatten(); }};
          if (u == 2 && nd >= 2) {
            std::vector<int64_t> s = x.sizes().vec();
            s[0] *= s[1];
            s.erase(s.begin() + 1);
            return {c10::str("reshape(t", a, ", ", c10::IntArrayRef(s), ")"), "reshape merge", [a, s](V t) { return t[a].reshape(s); }};
          }
          if (x.size(0) % 2 == 0 && x.size(0) > 0) {
            std::vector<int64_t> s = x.sizes().vec();
            s[0] /= 2;
            s.insert(s.begin(), 2);
            return {c10::str("reshape(t", a, ", ", c10::IntArrayRef(s), ")"), "reshape split", [a, s](V t) { return t[a].reshape(s); }};
          }
          return {c10::str("view(t", a, ", -1)"), "view", [a](V t) { return t[a].view(-1); }};
        }
        case 10: {
          if (nd >= 3) break;
          const int64_t e = pick(rng_, 0, nd);
          return {c10::str("unsqueeze(t", a, ", ", e, ")"), "unsqueeze", [a, e](V t) { return t[a].unsqueeze(e); }};
        }
        case 11:
          return {c10::str("contiguous(t", a, ")"), "contiguous", [a](V t) { return t[a].contiguous(); }};
        case 12: {
          if (!fp) break;
          const int64_t u = pick(rng_, 0, 4);
          const char* names[] = {"add_", "mul_", "relu_", "zero_", "fill_"};
          Step s{c10::str(names[u], "(t", a, ", c=", c, ")"), names[u], [a, u, c](V t) {
                   at::Tensor y = t[a];
                   switch (u) {
                     case 0: return y.add_(c);
                     case 1: return y.mul_(c);
                     case 2: return y.relu_();
                     case 3: return y.zero_();
                     default: return y.fill_(c);
                   }
                 }};
          s.in_place = true;
          s.target = a;
          return s;
        }
        case 13: {
          if (!fp) break;
          const size_t b = static_cast<size_t>(same_shape_partner());
          const int64_t u = pick(rng_, 0, 2);
          const char* names[] = {"add_ tensor", "mul_ tensor", "copy_"};
          Step s{c10::str(names[u], "(t", a, ", t", b, ")"), names[u], [a, b, u](V t) {
                   at::Tensor y = t[a];
                   switch (u) {
                     case 0: return y.add_(t[b]);
                     case 1: return y.mul_(t[b]);
                     default: return y.copy_(t[b] * 2);
                   }
                 }};
          s.in_place = true;
          s.target = a;
          return s;
        }
        case 14: {
          if (!fp || nd == 0 || nd > 2) break;
          const int64_t n = pick(rng_, 1, 4);
          const int64_t u = pick(rng_, 0, 1);
          const size_t k = u == 0 ? fresh({x.size(-1), n}) : fresh({x.size(-1)});
          return {c10::str("matmul(t", a, ", const", k, ")"), nd == 1 ? (u == 0 ? "matmul 1-D @ 2-D" : "dot") : (u == 0 ? "mm" : "mv"),
                  [a, k, this](V t) { return at::matmul(t[a], hp::is_dtensor(t[a]) ? constants_[k].dist : constants_[k].plain); }};
        }
        case 15:
          if (!fp || nd != 2) break;
          return {c10::str("matmul(t", a, ", t", a, ".t())"), "mm self", [a](V t) { return at::matmul(t[a], t[a].t()); }};
        case 16: {
          if (!fp || nd == 0) break;
          const bool log = coin(rng_);
          return {c10::str(log ? "log_softmax(t" : "softmax(t", a, ", ", d, ")"), log ? "log_softmax" : "softmax",
                  [a, d, log](V t) { return log ? t[a].log_softmax(d) : t[a].softmax(d); }};
        }
        case 17: {
          if (nd == 0) break;
          const size_t b = static_cast<size_t>(same_shape_partner());
          return {c10::str("cat(t", a, ", t", b, ", ", d, ")"), "cat", [a, b, d](V t) { return at::cat({t[a], t[b]}, d); }};
        }
        case 18: {
          if (!fp) break;
          const int64_t e = pick(rng_, 0, nd);
          return {c10::str("stack(t", a, ", t", a, " * 2, ", e, ")"), "stack", [a, e](V t) { return at::stack({t[a], t[a] * 2}, e); }};
        }
        case 19: case 20: {
          const hp::Placements p = random_placements(rng_, mesh_, std::max<int64_t>(nd, 1), false);
          if (nd == 0) break;
          // To the same placements it is the tensor itself; otherwise a new tensor, laid out as
          // clone() lays it out.
          const bool same = hp::DTensor(live[a].dist).placements() == p;
          return {c10::str("redistribute(t", a, ", ", hp::to_string(p), ")"), "redistribute", [a, p, same](V t) {
                    if (same) return t[a];
                    if (!hp::is_dtensor(t[a])) return t[a].clone();
                    return static_cast<at::Tensor>(hp::DTensor(t[a]).redistribute(p));
                  }};
        }
        case 21: {  // in place through a view
          if (!fp || nd == 0 || x.size(d) < 2) break;
          Step s{c10::str("narrow(t", a, ", ", d, ", 0, 1).mul_(", c, ")"), "in-place on a view", [a, d, c](V t) {
                   t[a].narrow(d, 0, 1).mul_(c);
                   return t[a];
                 }};
          s.in_place = true;
          s.target = a;
          return s;
        }
        case 22: {  // in place on a transposed view
          if (!fp || nd < 2) break;
          Step s{c10::str("t", a, ".transpose(0, 1).add_(", c, ")"), "in-place on a transpose", [a, c](V t) {
                   t[a].transpose(0, 1).add_(c);
                   return t[a];
                 }};
          s.in_place = true;
          s.target = a;
          return s;
        }
        case 23: {  // in-place view ops: new sizes and strides for the same tensor
          const int64_t u = pick(rng_, 0, 2);
          if (u == 0 && nd < 2) break;
          if (u == 2 && (nd == 0 || x.size(d) != 1)) break;
          const int64_t e = pick(rng_, 0, nd);
          Step s{c10::str(u == 0 ? "t_(t" : u == 1 ? "unsqueeze_(t" : "squeeze_(t", a, ")"), u == 0 ? "transpose_" : u == 1 ? "unsqueeze_" : "squeeze_",
                 [a, u, d, e](V t) {
                   at::Tensor y = t[a];
                   if (u == 0) return y.transpose_(0, 1);
                   if (u == 1) return y.unsqueeze_(e);
                   return y.squeeze_(d);
                 }};
          s.in_place = true;
          s.target = a;
          return s;
        }
      }
    }
  }

 private:
  size_t fresh(std::vector<int64_t> shape) {
    at::Tensor v = random(shape, static_cast<uint64_t>(pick(rng_, 0, 1 << 30)));
    hp::Placements p = random_placements(rng_, mesh_, static_cast<int64_t>(shape.size()), false);
    constants_.push_back({v, make_dtensor(v, mesh_, p)});
    return constants_.size() - 1;
  }

  Rng& rng_;
  const hp::DeviceMesh& mesh_;
  std::vector<Pair>& constants_;
};

// Runs `op` into `out`; its error message, or "".
std::string attempt(const Op& op, const std::vector<at::Tensor>& args, at::Tensor& out) {
  try {
    out = op(args);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

struct Summary {
  int64_t chains = 0, steps = 0, backward_checked = 0;
  std::map<std::string, int64_t> refused, backward_refused;
};

// Runs chain `seed` on `mesh`; "" when it matched plain tensors everywhere.
std::string run_chain(uint64_t seed, const hp::DeviceMesh& mesh, Summary& summary) {
  Rng rng(seed);
  std::vector<Pair> constants;
  Menu menu(rng, mesh, constants);
  std::vector<Pair> leaves, live;
  const int64_t nlive = pick(rng, 1, 3);
  std::vector<int64_t> shape = random_shape(rng);
  std::ostringstream program;
  for (int64_t k = 0; k < nlive; ++k) {
    if (k > 0 && coin(rng, 0.4)) shape = random_shape(rng);  // mostly one shape: binary ops need partners
    at::Tensor v = random(shape, seed * 7 + static_cast<uint64_t>(k));
    const hp::Placements p = random_placements(rng, mesh, static_cast<int64_t>(shape.size()), true);
    program << "t" << k << " = " << c10::IntArrayRef(shape) << " " << hp::to_string(p) << "\n";
    Pair leaf{v.clone().requires_grad_(true), make_dtensor(v, mesh, p)};
    leaf.dist.set_requires_grad(true);
    leaves.push_back(leaf);
    live.push_back({leaf.plain.clone(), leaf.dist.clone()});
  }
  auto fail = [&](const std::string& why) { return c10::str("chain ", seed, ":\n", program.str(), "-> ", why); };
  if (std::string why = compare(live); !why.empty()) return fail(why);
  const int64_t nsteps = pick(rng, 3, 8);
  for (int64_t i = 0; i < nsteps; ++i) {
    Step step = menu.draw(live);
    std::vector<at::Tensor> d, p;
    for (const auto& t : live) {
      d.push_back(t.dist);
      p.push_back(t.plain);
    }
    at::Tensor dres, pres;
    const std::string derr = attempt(step.op, d, dres);
    const int64_t refusing = count_ranks(!derr.empty());
    if (refusing > 0 && refusing < hp::get_world_size())
      return fail(c10::str(step.name, " raised on ", refusing, " of ", hp::get_world_size(), " ranks only: ",
                           derr.empty() ? "(not this one)" : derr.substr(0, 400)));
    if (refusing > 0) {
      ++summary.refused[step.kind];
      if (std::getenv("HP_OP_CHAINS_VERBOSE") != nullptr && hp::get_rank() == 0)
        std::printf("refused: %s: %s\n", step.name.c_str(), derr.substr(0, 300).c_str());
      continue;  // refused on every rank, before changing anything: the plain twin skips it too
    }
    const std::string perr = attempt(step.op, p, pres);
    if (!perr.empty()) return fail(c10::str(step.name, ": the DTensor accepted what plain tensors refuse: ", perr.substr(0, 400)));
    program << step.name;
    ++summary.steps;
    if (!step.in_place) {
      live.push_back({pres, dres});
      if (live.size() > 3) live.erase(live.begin() + pick(rng, 0, 2));
    } else {
      // A view that needed communication is a copy: after a write into its base it is stale
      // (as in PyTorch; catching stale reads is the explicit-communication work). Leave it.
      const at::Tensor written = live[step.target].plain;
      for (size_t k = live.size(); k-- > 0;)
        if (k != step.target && hp::DTensor(live[k].dist).is_copy_view() && live[k].plain.is_alias_of(written)) {
          program << "(t" << k << " is a stale copy view now: left)\n";
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
          if (k < step.target) --step.target;
        }
    }
    program << "   -> live:";
    for (const auto& t : live) program << " " << t.plain.sizes() << (hp::DTensor(t.dist).is_copy_view() ? "(copy view)" : "");
    program << "\n";
    if (std::string why = compare(live); !why.empty()) return fail(why);
  }
  // Gradients: through sum(t * w) over the live floating tensors.
  auto backward = [&](bool dist) -> std::string {
    try {
      at::Tensor loss;
      for (size_t k = 0; k < live.size(); ++k) {
        const at::Tensor& t = dist ? live[k].dist : live[k].plain;
        if (!t.requires_grad()) continue;
        const at::Tensor full = dist ? hp::DTensor(t).full_tensor() : t;
        at::Tensor term = (full * values(full.sizes(), static_cast<int64_t>(k))).sum();
        loss = loss.defined() ? loss + term : term;
      }
      if (loss.defined()) loss.backward();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  const std::string derr = backward(true), perr = backward(false);
  const int64_t refusing = count_ranks(!derr.empty());
  if (refusing > 0 && refusing < hp::get_world_size())
    return fail(c10::str("backward raised on ", refusing, " of ", hp::get_world_size(), " ranks only: ",
                         derr.empty() ? "(not this one)" : derr.substr(0, 400)));
  if (!perr.empty() && derr.empty()) return fail(c10::str("backward: the DTensor accepted what plain tensors refuse: ", perr.substr(0, 400)));
  if (!derr.empty()) {
    // Refused on every rank with an error (libtorch's own, when plain refuses too).
    ++summary.backward_refused[perr.empty() ? derr.substr(0, 120) : "(plain refuses too)"];
    return "";
  }
  for (size_t k = 0; k < leaves.size(); ++k) {
    const at::Tensor gp = leaves[k].plain.grad(), gd = leaves[k].dist.grad();
    if (gp.defined() != gd.defined())
      return fail(c10::str("leaf t", k, ": gradient ", gd.defined() ? "defined" : "undefined", " but plain's is not"));
    if (!gp.defined()) continue;
    at::Tensor full = hp::is_dtensor(gd) ? hp::DTensor(gd).full_tensor() : gd;
    if (!at::allclose(full.to(at::kDouble), gp.to(at::kDouble), 1e-4, 1e-4))
      return fail(c10::str("leaf t", k, ": gradient differs, max abs diff ", (full - gp).abs().max().item<double>(),
                           "\nDTensor:\n", full, "\nplain:\n", gp));
  }
  ++summary.backward_checked;
  return "";
}

// HP_OP_CHAINS overrides the number of chains (e.g. for a long soak).
int64_t chain_count(int64_t dflt) {
  if (std::getenv("HP_OP_CHAIN_SEED") != nullptr) return 1;
  const char* env = std::getenv("HP_OP_CHAINS");
  return env != nullptr ? std::atoll(env) : dflt;
}

void run_chains(const hp::DeviceMesh& mesh, int64_t n, uint64_t first_seed) {
  Summary summary;
  for (int64_t i = 0; i < n; ++i) {
    const char* only = std::getenv("HP_OP_CHAIN_SEED");  // one chain, to debug it
    const uint64_t seed = only != nullptr ? std::strtoull(only, nullptr, 10) : first_seed + static_cast<uint64_t>(i);
    std::string why;
    try {
      why = run_chain(seed, mesh, summary);
    } catch (const std::exception& e) {
      why = c10::str("chain ", seed, ": the harness caught ", e.what());
    }
    const bool failed = count_ranks(!why.empty()) > 0;
    ASSERT_FALSE(failed) << (why.empty() ? "another rank found a difference" : why);
    ++summary.chains;
  }
  if (hp::get_rank() != 0) return;
  std::ostringstream os;
  os << summary.chains << " chains, " << summary.steps << " steps, gradients checked in " << summary.backward_checked
     << " chains on " << mesh.to_string() << "\n  refused steps (every rank, clear error):";
  for (const auto& [k, v] : summary.refused) os << " " << k << "=" << v;
  os << "\n  refused backwards:";
  for (const auto& [k, v] : summary.backward_refused) os << "\n    " << v << "x " << k;
  std::printf("%s\n", os.str().c_str());
}

}  // namespace

TEST(OpChainDist, RandomChainsMatchPlainTensors1D) {
  run_chains(world_mesh(), chain_count(2000), 1000);
}

TEST(OpChain2x2Dist, RandomChainsMatchPlainTensors2x2) {
  if (hp::get_world_size() != 4) GTEST_SKIP();
  run_chains(hp::init_device_mesh("cpu", {2, 2}, {"dp", "tp"}), chain_count(2000), 500000);
}

}  // namespace t_dist_dtensor_op_chain_test
