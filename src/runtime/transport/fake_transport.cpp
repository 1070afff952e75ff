// The transport of a fake world (init_fake_process_group): no peers, no communication. Each
// collective gives what it would if every rank of the group held exactly this rank's tensors,
// so shapes, dtypes and devices are those of a real run and the values are documented ones.
#include <ATen/ATen.h>

#include <hyper_parallel/runtime/errors.h>

#include "../group_impl.h"

namespace hyper_parallel {
namespace {

class FakeTransport final : public Transport {
 public:
  FakeTransport(int64_t rank, int64_t size, c10::DeviceType device) : rank_(rank), size_(size), device_(device) {}
  const char* name() const override { return "fake"; }
  c10::DeviceType device_type() const override { return device_; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities c;
    c.reduce_scatter = c.average = c.reduce_16bit = c.nan_max_min = true;
    c.simulated = true;
    c.checks_labels = true;  // no peers to disagree with
    c.point_to_point = true;
    return c;
  }

  Completion all_gather(const at::Tensor& in, const at::Tensor& out) override {
    out.view({size_, -1}).copy_(in.reshape({1, -1}).expand({size_, in.numel()}));
    return {};
  }
  Completion all_reduce(const at::Tensor& buf, ReduceOp op) override {
    if (op == ReduceOp::SUM) buf.mul_(size_);  // the sum of `size` equal tensors
    return {};
  }
  Completion reduce_scatter(const at::Tensor& in, const at::Tensor& out, ReduceOp op) override {
    const at::Tensor block = in.view({size_, -1})[rank_];
    out.view({-1}).copy_(block);
    if (op == ReduceOp::SUM) out.mul_(size_);
    return {};
  }
  Completion all_to_all(const at::Tensor& in, const at::Tensor& out) override {
    // Block j of the result is block `rank` of rank j's input, which is this rank's own.
    const at::Tensor block = in.view({size_, -1})[rank_];
    out.view({size_, -1}).copy_(block.unsqueeze(0).expand({size_, block.numel()}));
    return {};
  }
  Completion all_to_all_v(const at::Tensor& in, const at::Tensor& out, const std::vector<int64_t>& in_splits,
                          const std::vector<int64_t>& out_splits) override {
    // Every rank p sends this rank what this rank sends itself: in_splits[rank] rows.
    int64_t offset = 0;
    for (int64_t j = 0; j < rank_; ++j) offset += in_splits[static_cast<size_t>(j)];
    const int64_t mine = in_splits[static_cast<size_t>(rank_)];
    int64_t at_row = 0;
    for (int64_t p = 0; p < size_; ++p) {
      const int64_t n = out_splits[static_cast<size_t>(p)];
      HP_CHECK_T(c10::ValueError, n == mine, "hyper_parallel::all_to_all_single: in a fake world every rank is taken to hold this rank's ",
                  "tensors, so it receives from each rank the ", mine, " rows it sends itself; output_split_sizes[", p, "] is ", n);
      if (n > 0) out.narrow(0, at_row, n).copy_(in.narrow(0, offset, n));
      at_row += n;
    }
    return {};
  }
  Completion broadcast(const at::Tensor&, int64_t) override { return {}; }
  Completion scatter(const at::Tensor& in, const at::Tensor& out, int64_t) override {
    out.view({-1}).copy_(in.view({size_, -1})[rank_]);
    return {};
  }
  Completion barrier() override { return {}; }
  // No peer sends anything: a recv leaves its buffer as it is (its shape is what matters to a plan).
  std::vector<Completion> peer_transfers(const std::vector<PeerTransfer>& ops) override {
    return std::vector<Completion>(ops.size());
  }

 private:
  int64_t rank_, size_;
  c10::DeviceType device_;
};

}  // namespace

std::unique_ptr<Transport> make_fake_transport(Group::Impl& g) {
  return std::make_unique<FakeTransport>(g.rank, static_cast<int64_t>(g.ranks.size()), c10::Device(g.device_type).type());
}

}  // namespace hyper_parallel
