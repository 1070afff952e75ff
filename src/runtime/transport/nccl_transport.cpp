// The NCCL transport: CUDA collectives through c10d's NCCL backend, natively (all_gather into one
// tensor, reduce_scatter, average, bf16). A collective is queued on NCCL's stream and its
// Completion orders the caller's current stream after it: nothing here waits on the host.
//
// NCCL's wait() therefore returns before a missing peer could be noticed, and NCCL's own watchdog
// would abort the job without saying who is missing. So every collective is also handed to a
// watcher thread of this transport that polls its completion; one still running after the job's
// timeout is reported with the members that never arrived (through the store, as the host
// transports report them), and the process exits. NCCL's own timeout is set later than ours
// (c10d_backends.cpp), so ours speaks first.
#include <hyper_parallel/runtime/collective_label.h>
#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>

#include "../group_impl.h"

namespace hyper_parallel {
namespace {

// Polls the collectives in flight on one group, oldest first.
class Watcher {
 public:
  Watcher(Group::Impl& g, std::chrono::milliseconds timeout) : g_(g), timeout_(timeout) {}
  ~Watcher() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  void watch(const char* what, uint64_t seq, c10::intrusive_ptr<c10d::Work> work, std::string label) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    inflight_.push_back({what, seq, std::chrono::steady_clock::now(), std::move(work), std::move(label)});
    cv_.notify_all();
  }

 private:
  struct Entry {
    const char* what;
    uint64_t seq;
    std::chrono::steady_clock::time_point issued;
    c10::intrusive_ptr<c10d::Work> work;
    std::string label;
  };

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      while (!inflight_.empty() && inflight_.front().work->isCompleted()) inflight_.pop_front();
      if (inflight_.empty()) {
        cv_.wait(lock, [this] { return stop_ || !inflight_.empty(); });
        continue;
      }
      const Entry& e = inflight_.front();
      if (std::chrono::steady_clock::now() - e.issued > timeout_) {
        const std::string report = failed_collective_report(
            g_, e.what, e.seq, "the collective did not complete within " + std::to_string(timeout_.count() / 1000.0) + " s", e.label);
        std::fprintf(stderr, "%s\n", report.c_str());
        std::fflush(stderr);
        // The caller's stream is blocked behind the collective and cannot be unblocked: as NCCL's
        // watchdog would, end the process, but after saying who is missing.
        std::_Exit(EXIT_FAILURE);
      }
      cv_.wait_for(lock, std::chrono::milliseconds(100));
    }
  }

  Group::Impl& g_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Entry> inflight_;
  bool stop_ = false;
  std::thread thread_;
};

class NcclTransport final : public Transport {
 public:
  NcclTransport(Group::Impl& g, std::chrono::milliseconds timeout) : g_(g), watcher_(g, timeout) {}
  const char* name() const override { return "nccl"; }
  c10::DeviceType device_type() const override { return c10::DeviceType::CUDA; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities c;
    c.reduce_scatter = true;
    c.average = true;
    c.reduce_16bit = true;
    c.asynchronous = true;
    c.point_to_point = true;
    // NaN in max/min: not relied upon (NaN flags travel along, as for Gloo).
    return c;
  }

  Completion all_gather(const at::Tensor& in, const at::Tensor& out) override {
    at::Tensor flat_out = out.view({-1}), flat_in = in.view({-1});
    return issue("all_gather", g_.pg->_allgather_base(flat_out, flat_in));
  }

  Completion all_reduce(const at::Tensor& buf, ReduceOp op) override {
    std::vector<at::Tensor> ts{buf};
    c10d::AllreduceOptions opts;
    opts.reduceOp = to_c10d(op);
    return issue("all_reduce", g_.pg->allreduce(ts, opts));
  }

  Completion reduce_scatter(const at::Tensor& in, const at::Tensor& out, ReduceOp op) override {
    at::Tensor flat_out = out.view({-1}), flat_in = in.view({-1});
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = to_c10d(op);
    return issue("reduce_scatter", g_.pg->_reduce_scatter_base(flat_out, flat_in, opts));
  }

  Completion all_to_all(const at::Tensor& in, const at::Tensor& out) override {
    std::vector<int64_t> splits;
    at::Tensor flat_out = out.view({-1}), flat_in = in.view({-1});
    return issue("all_to_all", g_.pg->alltoall_base(flat_out, flat_in, splits, splits));
  }

  Completion all_to_all_v(const at::Tensor& in, const at::Tensor& out, const std::vector<int64_t>& in_splits,
                          const std::vector<int64_t>& out_splits) override {
    std::vector<int64_t> ins = in_splits, outs = out_splits;  // rows of dim 0
    at::Tensor wire_in = in, wire_out = out;
    return issue("all_to_all", g_.pg->alltoall_base(wire_out, wire_in, outs, ins));
  }

  Completion broadcast(const at::Tensor& buf, int64_t src) override {
    std::vector<at::Tensor> ts{buf};
    c10d::BroadcastOptions opts;
    opts.rootRank = src;
    return issue("broadcast", g_.pg->broadcast(ts, opts));
  }

  Completion scatter(const at::Tensor& in, const at::Tensor& out, int64_t src) override {
    std::vector<at::Tensor> outputs{out.view({-1})};
    std::vector<std::vector<at::Tensor>> inputs;
    if (g_.rank == src) inputs = as_row_list(in, static_cast<int64_t>(g_.ranks.size()));
    c10d::ScatterOptions opts;
    opts.rootRank = src;
    return issue("scatter", g_.pg->scatter(outputs, inputs, opts));
  }

  Completion barrier() override { return issue("barrier", g_.pg->barrier()); }

  // One coalesced group call (ncclGroupStart/End): a send on a stream waits for its recv, so two
  // ranks that each send first would otherwise block each other's streams.
  std::vector<Completion> peer_transfers(const std::vector<PeerTransfer>& ops) override {
    g_.pg->startCoalescing(c10::DeviceType::CUDA);
    for (const PeerTransfer& op : ops) {
      std::vector<at::Tensor> ts{op.buf};
      if (op.send) g_.pg->send(ts, static_cast<int>(op.peer), static_cast<int>(op.match));
      else g_.pg->recv(ts, static_cast<int>(op.peer), static_cast<int>(op.match));
    }
    c10::intrusive_ptr<c10d::Work> work = g_.pg->endCoalescing(c10::DeviceType::CUDA);
    std::vector<Completion> done;
    Group::Impl* g = &g_;
    for (const PeerTransfer& op : ops) {
      const char* what = op.send ? "send" : "recv";
      done.push_back([g, what, peer = op.peer, tag = op.tag, work, keep = op.buf] { wait_peer_work(*g, what, peer, tag, work); });
    }
    return done;
  }

 private:
  Completion issue(const char* what, c10::intrusive_ptr<c10d::Work> work) {
    const uint64_t seq = ++g_.seq;
    std::string label = current_collective_label();
    watcher_.watch(what, seq, work, label);
    Group::Impl* g = &g_;
    return [g, what, seq, work = std::move(work), label = std::move(label)] { wait_c10d_work(*g, what, seq, work, label); };
  }
  Group::Impl& g_;
  Watcher watcher_;
};

}  // namespace

std::unique_ptr<Transport> make_nccl_transport(Group::Impl& g, std::chrono::milliseconds timeout) {
  return std::make_unique<NcclTransport>(g, timeout);
}

}  // namespace hyper_parallel
