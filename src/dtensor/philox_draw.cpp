#include "philox_draw.h"

#include <hyper_parallel/dtensor/random.h>
#include <hyper_parallel/mesh/device_mesh.h>
#include <hyper_parallel/runtime/agreement.h>
#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>

#include <ATen/CPUGeneratorImpl.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <cmath>
#include <limits>

namespace hyper_parallel {
namespace {

struct Block {
  uint32_t v[4];
};

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// Philox4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", 2011).
inline Block philox(uint64_t counter_lo, uint64_t counter_hi, uint64_t key) {
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(0xD2511F53u, c0, hi0, lo0);
    mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Block{{c0, c1, c2, c3}};
}

constexpr double kTwoPi = 6.283185307179586476925286766559;
inline double u24(uint32_t x) { return static_cast<double>(x >> 8) * (1.0 / 16777216.0); }
inline double u32(uint32_t x) { return static_cast<double>(x) * (1.0 / 4294967296.0); }
inline double u53(uint32_t hi, uint32_t lo) {
  const uint64_t bits = ((static_cast<uint64_t>(hi) << 32) | lo) >> 11;
  return static_cast<double>(bits) * (1.0 / 9007199254740992.0);
}

// 32-bit lanes each element uses.
int lanes_of(const DrawParams& p, at::ScalarType dtype) {
  switch (p.kind) {
    case DrawParams::Kind::Uniform: return dtype == at::kDouble ? 2 : 1;
    case DrawParams::Kind::Bernoulli:
    case DrawParams::Kind::UniformForBernoulli: return 1;
    case DrawParams::Kind::Normal:
    case DrawParams::Kind::Exponential:
    case DrawParams::Kind::RandomInt: return 2;
  }
  return 1;
}

// The value of one element from its lanes.
template <class T>
inline T value_of(const DrawParams& p, const uint32_t* l, bool wide) {
  switch (p.kind) {
    case DrawParams::Kind::Uniform: return static_cast<T>(p.a + (wide ? u53(l[0], l[1]) : u24(l[0])) * (p.b - p.a));
    case DrawParams::Kind::Bernoulli: return static_cast<T>(u32(l[0]) < p.a ? 1 : 0);
    case DrawParams::Kind::UniformForBernoulli: return static_cast<T>(u32(l[0]));
    case DrawParams::Kind::Normal: {
      const double r = std::sqrt(-2.0 * std::log1p(-u32(l[0])));
      return static_cast<T>(p.a + p.b * r * std::cos(kTwoPi * u32(l[1])));
    }
    case DrawParams::Kind::Exponential: return static_cast<T>(-std::log1p(-u53(l[0], l[1])) / p.a);
    case DrawParams::Kind::RandomInt: {
      const uint64_t bits = (static_cast<uint64_t>(l[0]) << 32) | l[1];
      return static_cast<T>(static_cast<uint64_t>(p.from) + (p.range == 0 ? bits : bits % p.range));
    }
  }
  return T(0);
}

// Fills contiguous `data` (the piece's elements in row-major order).
template <class T>
void fill(T* data, const std::vector<int64_t>& local, const std::vector<int64_t>& global, const std::vector<int64_t>& offset,
          const DrawParams& p, int lanes, bool wide, uint64_t call, uint64_t seed) {
  const size_t nd = local.size();
  int64_t n = 1;
  for (int64_t s : local) n *= s;
  if (n == 0) return;
  const uint64_t per_block = static_cast<uint64_t>(4 / lanes);
  // Row-major strides of the global shape: an element's index does not depend on memory layout.
  std::vector<int64_t> gstride(nd, 1);
  for (size_t d = nd; d-- > 1;) gstride[d - 1] = gstride[d] * global[d];
  const int64_t inner = nd == 0 ? 1 : local[nd - 1];
  std::vector<int64_t> idx(nd, 0);
  uint64_t cached = std::numeric_limits<uint64_t>::max();
  Block b{};
  for (int64_t row = 0, pos = 0; pos < n; ++row, pos += inner) {
    int64_t g = 0;
    for (size_t d = 0; d < nd; ++d) g += (offset[d] + idx[d]) * gstride[d];
    for (int64_t j = 0; j < inner; ++j) {
      const uint64_t e = static_cast<uint64_t>(g + j);
      const uint64_t block = e / per_block;
      if (block != cached) {
        b = philox(block, call, seed);
        cached = block;
      }
      data[pos + j] = value_of<T>(p, &b.v[(e % per_block) * static_cast<uint64_t>(lanes)], wide);
    }
    // The next row: carry through the outer dims.
    for (size_t d = nd - 1; d-- > 0;) {
      if (++idx[d] < local[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace

namespace {

// hyper_parallel::manual_seed calls so far, and the seeding the last key agreement saw: a draw on
// a DTensor compares the ranks' keys once after each seeding (a change of torch's seed counts).
std::atomic<uint64_t> g_seedings{0};
std::mutex g_checked_mutex;
uint64_t g_checked_seedings = ~uint64_t{0}, g_checked_torch_seed = 0;

}  // namespace

uint64_t next_random_key() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return at::check_generator<at::CPUGeneratorImpl>(gen)->random64();
}

uint64_t next_random_key(const DeviceMesh& mesh, const std::string& what) {
  const uint64_t key = next_random_key();
  if (mesh.size() <= 1) return key;
  {
    const uint64_t seedings = g_seedings.load(), torch_seed = random_seed();
    std::lock_guard<std::mutex> lock(g_checked_mutex);
    if (seedings == g_checked_seedings && torch_seed == g_checked_torch_seed) return key;
    g_checked_seedings = seedings;
    g_checked_torch_seed = torch_seed;
  }
  try {
    for (int64_t d = 0; d < mesh.ndim(); ++d)
      check_agreement(mesh.get_group(d), what, c10::str("random key ", key, " (the first random op on a DTensor after a seeding ",
                                                         "draws one key for every rank of its mesh: call torch.manual_seed(s) with ",
                                                         "the same s on every rank of ", mesh.to_string(),
                                                         " before random ops on DTensors; ranks outside it may seed otherwise)"));
  } catch (...) {
    // Every rank raised: each compares again at its next draw, whatever it seeds in between (a
    // rank reseeding with the seed it already had would not count as a seeding).
    std::lock_guard<std::mutex> lock(g_checked_mutex);
    g_checked_seedings = ~uint64_t{0};
    throw;
  }
  return key;
}

uint64_t random_seed() { return at::detail::getDefaultCPUGenerator().current_seed(); }

void philox_draw(const at::Tensor& out, const std::vector<int64_t>& global_shape, const std::vector<int64_t>& offset,
                 const DrawParams& params, uint64_t key) {
  const auto local = out.sizes().vec();
  TORCH_INTERNAL_ASSERT(local.size() == global_shape.size() && offset.size() == global_shape.size());
  const uint64_t call = 0, seed = key;
  const int lanes = lanes_of(params, out.scalar_type());
  const bool wide = lanes == 2;
  const bool integral = params.kind == DrawParams::Kind::RandomInt || !at::isFloatingType(out.scalar_type());
  // Written in place when the layout allows, else through a contiguous buffer.
  if (out.is_contiguous() && out.device().is_cpu() && (out.scalar_type() == at::kFloat || out.scalar_type() == at::kDouble)) {
    if (out.scalar_type() == at::kFloat) fill(out.data_ptr<float>(), local, global_shape, offset, params, lanes, wide, call, seed);
    else fill(out.data_ptr<double>(), local, global_shape, offset, params, lanes, wide, call, seed);
    return;
  }
  at::Tensor buf = at::empty(local, at::TensorOptions().dtype(integral ? at::kLong : at::kDouble));
  if (integral) fill(buf.data_ptr<int64_t>(), local, global_shape, offset, params, lanes, wide, call, seed);
  else fill(buf.data_ptr<double>(), local, global_shape, offset, params, lanes, wide, call, seed);
  out.copy_(buf);
}

void manual_seed(uint64_t seed) {
  at::manual_seed(seed);
  g_seedings.fetch_add(1);
}

uint64_t initial_seed() { return random_seed(); }

}  // namespace hyper_parallel
