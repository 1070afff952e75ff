// The Gloo transport: CPU collectives through c10d's Gloo backend, for groups that span hosts
// (and for any group with HP_TRANSPORT=gloo). Gloo runs each collective on its own threads, so a
// call returns at once and its Completion waits. Gloo's gaps: it moves no bfloat16 or bool
// (reinterpreted here as a type of the same width when only copied), cannot add bfloat16, has no
// average and no reduce_scatter, and its max/min can drop a NaN; the front emulates the last four
// from the capabilities below.
#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>

#include <hyper_parallel/runtime/collective_label.h>

#include "../group_impl.h"

namespace hyper_parallel {
namespace {

at::Tensor as_wire(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kBFloat16: return t.view(at::kHalf);  // same width; only copied, never added
    case at::kBool: return t.view(at::kByte);
    default: return t;
  }
}

class GlooTransport final : public Transport {
 public:
  explicit GlooTransport(Group::Impl& g) : g_(g) {}
  const char* name() const override { return "gloo"; }
  c10::DeviceType device_type() const override { return c10::DeviceType::CPU; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities c;
    c.asynchronous = true;
    c.point_to_point = true;
    return c;
  }

  Completion all_gather(const at::Tensor& in, const at::Tensor& out) override {
    std::vector<std::vector<at::Tensor>> outputs = as_row_list(as_wire(out), static_cast<int64_t>(g_.ranks.size()));
    std::vector<at::Tensor> inputs{as_wire(in).view({-1})};
    return completion("all_gather", g_.pg->allgather(outputs, inputs), {in, out});
  }

  Completion all_reduce(const at::Tensor& buf, ReduceOp op) override {
    TORCH_INTERNAL_ASSERT(buf.scalar_type() != at::kBFloat16, "Gloo cannot add bfloat16; the front widens it");
    TORCH_INTERNAL_ASSERT(op != ReduceOp::AVG, "Gloo does not average; the front sums and divides");
    std::vector<at::Tensor> ts{buf};
    c10d::AllreduceOptions opts;
    opts.reduceOp = to_c10d(op);
    return completion("all_reduce", g_.pg->allreduce(ts, opts), {buf});
  }

  Completion all_to_all(const at::Tensor& in, const at::Tensor& out) override {
    std::vector<int64_t> splits;  // empty: equal splits along dim 0
    at::Tensor wire_in = as_wire(in).view({-1}), wire_out = as_wire(out).view({-1});
    return completion("all_to_all", g_.pg->alltoall_base(wire_out, wire_in, splits, splits), {in, out});
  }

  Completion all_to_all_v(const at::Tensor& in, const at::Tensor& out, const std::vector<int64_t>& in_splits,
                          const std::vector<int64_t>& out_splits) override {
    std::vector<int64_t> ins = in_splits, outs = out_splits;  // rows of dim 0
    at::Tensor wire_in = as_wire(in), wire_out = as_wire(out);
    return completion("all_to_all", g_.pg->alltoall_base(wire_out, wire_in, outs, ins), {in, out});
  }

  Completion broadcast(const at::Tensor& buf, int64_t src) override {
    std::vector<at::Tensor> ts{as_wire(buf)};
    c10d::BroadcastOptions opts;
    opts.rootRank = src;
    return completion("broadcast", g_.pg->broadcast(ts, opts), {buf});
  }

  Completion scatter(const at::Tensor& in, const at::Tensor& out, int64_t src) override {
    std::vector<at::Tensor> outputs{as_wire(out).view({-1})};
    std::vector<std::vector<at::Tensor>> inputs;
    if (g_.rank == src) inputs = as_row_list(as_wire(in), static_cast<int64_t>(g_.ranks.size()));
    c10d::ScatterOptions opts;
    opts.rootRank = src;
    return completion("scatter", g_.pg->scatter(outputs, inputs, opts), {in, out});
  }

  Completion barrier() override { return completion("barrier", g_.pg->barrier(), {}); }

  // Gloo's send and recv run on its own threads (a send completes once its recv is posted): each
  // transfer is issued at once and waited for in its Completion, in any order.
  std::vector<Completion> peer_transfers(const std::vector<PeerTransfer>& ops) override {
    std::vector<Completion> done;
    done.reserve(ops.size());
    for (const PeerTransfer& op : ops) {
      std::vector<at::Tensor> ts{as_wire(op.buf)};
      const int peer = static_cast<int>(op.peer), match = static_cast<int>(op.match);
      const int64_t tag = op.tag;
      auto work = op.send ? g_.pg->send(ts, peer, match) : g_.pg->recv(ts, peer, match);
      Group::Impl* g = &g_;
      const char* what = op.send ? "send" : "recv";
      done.push_back([g, what, peer, tag, work = std::move(work), keep = op.buf] { wait_peer_work(*g, what, peer, tag, work); });
    }
    return done;
  }

 private:
  // The buffers stay alive (captured) until the collective is waited for.
  Completion completion(const char* what, c10::intrusive_ptr<c10d::Work> work, std::vector<at::Tensor> keep) {
    Group::Impl* g = &g_;
    const uint64_t seq = ++g_.seq;
    return [g, what, seq, work = std::move(work), keep = std::move(keep), label = current_collective_label()] {
      wait_c10d_work(*g, what, seq, work, label);
    };
  }
  Group::Impl& g_;
};

}  // namespace

std::unique_ptr<Transport> make_gloo_transport(Group::Impl& g) { return std::make_unique<GlooTransport>(g); }

}  // namespace hyper_parallel
