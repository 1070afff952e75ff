// The shared-memory transport's reduction kernels and peer copies.
#include "shm_reduce.h"

#include <hyper_parallel/runtime/errors.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace hyper_parallel {
namespace shm {
namespace {

// How an element is stored and accumulated: most types as themselves; 16-bit floats in fp32.
template <class T, class A = T>
struct Plain {
  using Stored = T;
  using Acc = A;
  static A load(T v) { return static_cast<A>(v); }
  static T store(A a) { return static_cast<T>(a); }
};
// bfloat16 as its bits, converted with shifts so that the loops vectorise (through c10::BFloat16
// they stay scalar); rounding to nearest even and NaN as c10::BFloat16(float) does, bit for bit.
struct BFloat16Bits {
  using Stored = uint16_t;
  using Acc = float;
  static float load(uint16_t b) {
    const uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  static uint16_t store(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return f != f ? uint16_t{0x7FC0} : static_cast<uint16_t>((u + ((u >> 16) & 1) + 0x7FFFu) >> 16);
  }
};

void prefetch(const void* p, size_t bytes) {
#if defined(__SSE__)
  for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(static_cast<const char*>(p) + o, _MM_HINT_T0);
#endif
}

// Inlined into reduce() below, so that each of its target clones compiles them for its CPU.
#define HP_ALWAYS_INLINE inline __attribute__((always_inline))

// Reduced in rank order: `out` may be one of the inputs (the caller's own data is read from its
// buffer, not from shared memory). 16-bit floats accumulate in fp32 and are rounded once.
template <class E, class Op>
HP_ALWAYS_INLINE void reduce_blocked(typename E::Stored* out, const typename E::Stored* const* in, int64_t g, size_t n, Op op) {
  using T = typename E::Stored;
  using A = typename E::Acc;
  if (g == 2) {
    // One pass, in chunks that each ask for the next one's lines first (a loop that spends more
    // instructions per byte, as bf16's conversions do, otherwise keeps too few cache lines in
    // flight). `out` may be x0 or x1, but only element for element (never shifted), which ivdep
    // promises the vectoriser; without it GCC checks for overlap and runs the scalar loop.
    constexpr size_t kChunk = 2048 / sizeof(T);
    for (size_t b = 0; b < n; b += kChunk) {
      const size_t m = std::min(kChunk, n - b);
      if (b + kChunk < n)
        for (int64_t p = 0; p < 2; ++p) prefetch(in[p] + b + kChunk, std::min(kChunk, n - b - kChunk) * sizeof(T));
      const T* x0 = in[0] + b;
      const T* x1 = in[1] + b;
      T* o = out + b;
#pragma GCC ivdep
      for (size_t i = 0; i < m; ++i) o[i] = E::store(op(E::load(x0[i]), E::load(x1[i])));
    }
    return;
  }
  // More ranks: blocks through a local accumulator, which lets the compiler vectorise.
  constexpr size_t kBlock = 512;
  A acc[kBlock];
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t m = std::min(kBlock, n - b);
    // The loops below pause between the inputs' streams: ask for the next block's lines now,
    // or every block waits for the peers' cache lines anew.
    if (b + kBlock < n)
      for (int64_t p = 0; p < g; ++p) prefetch(in[p] + b + kBlock, std::min(kBlock, n - b - kBlock) * sizeof(T));
    const T* __restrict x0 = in[0] + b;
    for (size_t i = 0; i < m; ++i) acc[i] = E::load(x0[i]);
    for (int64_t p = 1; p < g; ++p) {
      const T* __restrict x = in[p] + b;
      for (size_t i = 0; i < m; ++i) acc[i] = op(acc[i], E::load(x[i]));
    }
    T* __restrict o = out + b;
    for (size_t i = 0; i < m; ++i) o[i] = E::store(acc[i]);
  }
}

template <class E>
HP_ALWAYS_INLINE void reduce_typed(void* out, const void* const* in, int64_t g, size_t n, ReduceOp op) {
  using T = typename E::Stored;
  using A = typename E::Acc;
  auto o = static_cast<T*>(out);
  auto i = reinterpret_cast<const T* const*>(in);
  auto run = [&](auto f) { reduce_blocked<E>(o, i, g, n, f); };
  switch (op) {
    case ReduceOp::SUM:
    case ReduceOp::AVG:
      run([](A a, A b) { return static_cast<A>(a + b); });
      break;
    case ReduceOp::MAX:  // a NaN wins, as in torch.maximum
      run([](A a, A b) { return a != a ? a : b != b ? b : (b > a ? b : a); });
      break;
    case ReduceOp::MIN:
      run([](A a, A b) { return a != a ? a : b != b ? b : (b < a ? b : a); });
      break;
  }
}

}  // namespace

// The reductions are compiled for the baseline and for AVX2/AVX-512, chosen at load time by the
// CPU: fp32 is bound by the peers' bytes, but converting bf16 is bound by instructions (twice as
// fast with AVX2). Not under AddressSanitizer: its runtime starts after ifunc resolvers run.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("default", "avx2", "arch=skylake-avx512")))
#endif
void reduce(void* out, const void* const* in, int64_t g, size_t n, c10::ScalarType t, ReduceOp op) {
  switch (t) {
    case c10::ScalarType::Float: return reduce_typed<Plain<float>>(out, in, g, n, op);
    case c10::ScalarType::Double: return reduce_typed<Plain<double>>(out, in, g, n, op);
    case c10::ScalarType::Half: return reduce_typed<Plain<c10::Half, float>>(out, in, g, n, op);
    case c10::ScalarType::BFloat16: return reduce_typed<BFloat16Bits>(out, in, g, n, op);
    case c10::ScalarType::Int: return reduce_typed<Plain<int32_t>>(out, in, g, n, op);
    case c10::ScalarType::Long: return reduce_typed<Plain<int64_t>>(out, in, g, n, op);
    case c10::ScalarType::Short: return reduce_typed<Plain<int16_t>>(out, in, g, n, op);
    case c10::ScalarType::Char: return reduce_typed<Plain<int8_t>>(out, in, g, n, op);
    case c10::ScalarType::Byte: return reduce_typed<Plain<uint8_t>>(out, in, g, n, op);
    default:
      HP_CHECK_T(c10::TypeError, false, "hyper_parallel::all_reduce: the shared-memory all_reduce has no reduction for ", t);
  }
}

// Copies bytes another core has just written. Reading them is the cost of every collective here;
// prefetching 2 KiB ahead keeps more cache-line transfers in flight than the hardware prefetcher
// alone (measured: a 256 KiB all_gather 11% faster than memcpy on a 2-core VM).
void copy_from_peer(void* dst, const void* src, size_t n) {
#if defined(__SSE2__)
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  constexpr size_t kAhead = 2048;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    if (i + kAhead < n) _mm_prefetch(reinterpret_cast<const char*>(s + i + kAhead), _MM_HINT_T0);
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  if (i < n) std::memcpy(d + i, s + i, n - i);
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace shm
}  // namespace hyper_parallel
