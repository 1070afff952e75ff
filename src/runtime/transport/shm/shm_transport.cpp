// The shared-memory transport's collectives: data through the per-rank buffers of the segment,
// one synchronisation per exchange.
#include "shm_transport.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "shm_reduce.h"
#include "../../split_agreement.h"

#include <ATen/core/Tensor.h>

namespace hyper_parallel {

void ShmTransport::all_reduce(void* data, int64_t numel, c10::ScalarType dtype, ReduceOp op) {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t es = c10::elementSize(dtype);
  const size_t per_step = buffer_bytes_ / es;
  const int64_t g = size();
  auto* out = static_cast<unsigned char*>(data);
  std::vector<const void*> in(static_cast<size_t>(g));
  begin(1 | static_cast<uint32_t>(dtype) << 8 | static_cast<uint32_t>(op) << 16, static_cast<uint64_t>(numel) * es);
  for (size_t done = 0; done < static_cast<size_t>(numel); done += per_step) {
    const size_t n = std::min(per_step, static_cast<size_t>(numel) - done);
    const uint64_t step = step_++;
    unsigned char* mine = out + done * es;
    std::memcpy(buffer(rank_, step), mine, n * es);
    sync("all_reduce");
    // This rank's own addend is read from its own buffer, hot in its cache: reading the copy in
    // shared memory, which the peers are reading at the same time, is slower.
    if (g == 2 || n * es <= 16384 || n < static_cast<size_t>(g)) {
      // Every rank reduces everything itself (one synchronisation). Two ranks always do: each
      // reads the peer's n elements once, as the two-phase scheme would, in one pass.
      for (int64_t p = 0; p < g; ++p) in[static_cast<size_t>(p)] = p == rank_ ? mine : buffer(p, step);
      shm::reduce(mine, in.data(), g, n, dtype, op);
      continue;
    }
    // Large, more than two ranks: each rank reduces its share into its own buffer, then everyone
    // copies the shares (each rank reads 2 (g - 1) / g of the data from its peers, not g - 1).
    auto share = [&](int64_t p) { return std::make_pair(n * static_cast<size_t>(p) / g, n * static_cast<size_t>(p + 1) / g); };
    const auto [lo, hi] = share(rank_);
    for (int64_t p = 0; p < g; ++p) in[static_cast<size_t>(p)] = (p == rank_ ? mine : buffer(p, step)) + lo * es;
    shm::reduce(buffer(rank_, step) + lo * es, in.data(), g, hi - lo, dtype, op);
    sync("all_reduce");
    for (int64_t p = 0; p < g; ++p) {
      const auto [a, b] = share(p);
      if (p != rank_) shm::copy_from_peer(mine + a * es, buffer(p, step) + a * es, (b - a) * es);
      else std::memcpy(mine + a * es, buffer(p, step) + a * es, (b - a) * es);
    }
  }
}

void ShmTransport::all_gather(const void* in, void* out, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  begin(2, bytes);
  const int64_t g = size();
  for (size_t done = 0; done < bytes; done += buffer_bytes_) {
    const size_t n = std::min(buffer_bytes_, bytes - done);
    const uint64_t step = step_++;
    const unsigned char* mine = static_cast<const unsigned char*>(in) + done;
    std::memcpy(buffer(rank_, step), mine, n);
    // This rank's own piece comes from its input (hot in its cache) while the peers catch up.
    std::memcpy(static_cast<unsigned char*>(out) + static_cast<size_t>(rank_) * bytes + done, mine, n);
    sync("all_gather");
    for (int64_t p = 0; p < g; ++p)
      if (p != rank_) shm::copy_from_peer(static_cast<unsigned char*>(out) + static_cast<size_t>(p) * bytes + done, buffer(p, step), n);
  }
}

// all_to_all (src < 0: every rank sends size() blocks and receives one from each) and scatter
// (only `src` sends; each rank receives its block): rounds of at most buffer/size() bytes a block.
void ShmTransport::exchange_blocks(const void* in, void* out, size_t block, int64_t src, const char* what) {
  std::lock_guard<std::mutex> lock(mutex_);
  begin(src < 0 ? 3 : 5 | static_cast<uint32_t>(src) << 8, block);
  const int64_t g = size();
  const size_t per = std::max<size_t>(1, buffer_bytes_ / static_cast<size_t>(g));
  for (size_t done = 0; done < block; done += per) {
    const size_t n = std::min(per, block - done);
    const uint64_t step = step_++;
    if (src < 0 || rank_ == src)
      for (int64_t j = 0; j < g; ++j)
        std::memcpy(buffer(rank_, step) + static_cast<size_t>(j) * n,
                    static_cast<const unsigned char*>(in) + static_cast<size_t>(j) * block + done, n);
    sync(what);
    for (int64_t p = src < 0 ? 0 : src; p < (src < 0 ? g : src + 1); ++p) {
      // A block this rank sends itself is read from its own input, not through shared memory.
      const unsigned char* from = p == rank_ ? static_cast<const unsigned char*>(in) + static_cast<size_t>(rank_) * block + done
                                             : buffer(p, step) + static_cast<size_t>(rank_) * n;
      shm::copy_from_peer(static_cast<unsigned char*>(out) + static_cast<size_t>(src < 0 ? p : 0) * block + done, from, n);
    }
  }
}

void ShmTransport::all_to_all(const void* in, void* out, size_t block) { exchange_blocks(in, out, block, -1, "all_to_all"); }

void ShmTransport::all_to_all_v(const void* in, void* out, const std::vector<size_t>& send, const std::vector<size_t>& recv,
                                size_t row_bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  begin(7, row_bytes);
  const int64_t g = size();
  const size_t ug = static_cast<size_t>(g);
  // Every rank publishes what it sends and expects; each checks all pairs, so all agree on the
  // verdict and on the number of rounds (the largest block over every pair).
  TORCH_INTERNAL_ASSERT(buffer_bytes_ >= 16 * ug, "the shared-memory buffers are too small for the sizes of an all_to_all");
  size_t largest = 0;
  {
    const uint64_t step = step_++;
    auto* sizes = reinterpret_cast<uint64_t*>(buffer(rank_, step));
    for (size_t j = 0; j < ug; ++j) {
      sizes[j] = send[j];
      sizes[ug + j] = recv[j];
    }
    sync("all_to_all");
    std::vector<uint64_t> all(2 * ug * ug);
    for (int64_t p = 0; p < g; ++p)
      std::memcpy(all.data() + 2 * ug * static_cast<size_t>(p), buffer(p, step), 2 * ug * sizeof(uint64_t));
    check_split_agreement(g, ranks_, [&](int64_t p, int64_t j) {
      return static_cast<int64_t>(all[2 * ug * static_cast<size_t>(p) + static_cast<size_t>(j)] / row_bytes);
    });
    largest = *std::max_element(all.begin(), all.end());
  }
  const size_t per = std::max<size_t>(1, buffer_bytes_ / ug);
  std::vector<size_t> send_at(ug, 0), recv_at(ug, 0);
  for (size_t j = 1; j < ug; ++j) {
    send_at[j] = send_at[j - 1] + send[j - 1];
    recv_at[j] = recv_at[j - 1] + recv[j - 1];
  }
  const auto* src = static_cast<const unsigned char*>(in);
  auto* dst = static_cast<unsigned char*>(out);
  for (size_t done = 0; done < largest; done += per) {
    const uint64_t step = step_++;
    for (size_t j = 0; j < ug; ++j)
      if (static_cast<int64_t>(j) != rank_ && send[j] > done)
        std::memcpy(buffer(rank_, step) + j * per, src + send_at[j] + done, std::min(per, send[j] - done));
    sync("all_to_all");
    for (size_t p = 0; p < ug; ++p) {
      if (recv[p] <= done) continue;
      const size_t n = std::min(per, recv[p] - done);
      // What this rank sends itself is read from its own input.
      if (static_cast<int64_t>(p) == rank_) std::memcpy(dst + recv_at[p] + done, src + send_at[p] + done, n);
      else shm::copy_from_peer(dst + recv_at[p] + done, buffer(static_cast<int64_t>(p), step) + static_cast<size_t>(rank_) * per, n);
    }
  }
}

void ShmTransport::broadcast(void* data, size_t bytes, int64_t src) {
  std::lock_guard<std::mutex> lock(mutex_);
  begin(4 | static_cast<uint32_t>(src) << 8, bytes);
  for (size_t done = 0; done < bytes; done += buffer_bytes_) {
    const size_t n = std::min(buffer_bytes_, bytes - done);
    const uint64_t step = step_++;
    if (rank_ == src) std::memcpy(buffer(rank_, step), static_cast<unsigned char*>(data) + done, n);
    sync("broadcast");
    if (rank_ != src) shm::copy_from_peer(static_cast<unsigned char*>(data) + done, buffer(src, step), n);
  }
}

void ShmTransport::scatter(const void* in, void* out, size_t block, int64_t src) {
  exchange_blocks(in, out, block, src, "scatter");
}

void ShmTransport::barrier_now() {
  std::lock_guard<std::mutex> lock(mutex_);
  begin(6, 0);
  ++step_;  // keeps the buffer alternation in step with the peers
  sync("barrier");
}

// The tensors are host memory: the front stages those of another device (and checks it here).
namespace {
void* host_data(const at::Tensor& t) {
  TORCH_INTERNAL_ASSERT(t.device().is_cpu() && t.is_contiguous(), "the shared-memory transport moves contiguous host memory");
  return t.data_ptr();
}
size_t nbytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }
}  // namespace

TransportCapabilities ShmTransport::capabilities() const {
  TransportCapabilities c;
  c.reduce_16bit = true;
  c.nan_max_min = true;
  c.checks_labels = true;
  return c;
}

Completion ShmTransport::all_gather(const at::Tensor& in, const at::Tensor& out) {
  all_gather(host_data(in), host_data(out), nbytes(in));
  return {};
}

Completion ShmTransport::all_reduce(const at::Tensor& buf, ReduceOp op) {
  TORCH_INTERNAL_ASSERT(op != ReduceOp::AVG, "the shared-memory transport does not average");
  all_reduce(host_data(buf), buf.numel(), buf.scalar_type(), op);
  return {};
}

Completion ShmTransport::all_to_all(const at::Tensor& in, const at::Tensor& out) {
  all_to_all(host_data(in), host_data(out), nbytes(in) / static_cast<size_t>(size()));
  return {};
}

Completion ShmTransport::all_to_all_v(const at::Tensor& in, const at::Tensor& out, const std::vector<int64_t>& in_splits,
                                      const std::vector<int64_t>& out_splits) {
  const size_t row = static_cast<size_t>(in.size(1)) * in.element_size();
  std::vector<size_t> send(in_splits.size()), recv(out_splits.size());
  for (size_t j = 0; j < send.size(); ++j) {
    send[j] = static_cast<size_t>(in_splits[j]) * row;
    recv[j] = static_cast<size_t>(out_splits[j]) * row;
  }
  TORCH_INTERNAL_ASSERT(in.device().is_cpu() && in.is_contiguous() && out.device().is_cpu() && out.is_contiguous(),
                        "the shared-memory transport moves contiguous host memory");
  all_to_all_v(in.data_ptr(), out.data_ptr(), send, recv, row);
  return {};
}

Completion ShmTransport::broadcast(const at::Tensor& buf, int64_t src) {
  broadcast(host_data(buf), nbytes(buf), src);
  return {};
}

Completion ShmTransport::scatter(const at::Tensor& in, const at::Tensor& out, int64_t src) {
  scatter(in.defined() ? host_data(in) : nullptr, host_data(out), nbytes(out), src);
  return {};
}

Completion ShmTransport::barrier() {
  barrier_now();
  return {};
}

}  // namespace hyper_parallel
