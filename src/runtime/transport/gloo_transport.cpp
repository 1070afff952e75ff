// The Gloo transport: CPU collectives through c10d's Gloo backend, for groups that span hosts
// (and for any group with HP_TRANSPORT=gloo). Gloo runs each collective on its own threads, so a
// call returns at once and its Completion waits. Gloo's gaps: it moves no bfloat16 or bool
// (reinterpreted here as a type of the same width when only copied), cannot add bfloat16, has no
// average and no reduce_scatter, and its max/min can drop a NaN; the front emulates the last four
// from the capabilities below.
//
// Every collective carries its owner (its CollectiveLabel; no label is one too), its kind and its
// size in the data it already exchanges: a 24-byte header on each block of an all_gather or an
// all-to-all, one-hot digits in an all_reduce. A broadcast or a scatter, whose data only the source
// sends, exchanges the headers first; the barrier is that exchange. So each collective is one Gloo
// collective whatever its label, no exchange is added to the all_gathers and reduce-scatters of
// FSDP or tensor parallelism, and ranks whose collectives of one kind and size differ in owner stop
// on every rank, each naming what every rank was in, before any result is used. Collectives Gloo
// cannot pair (another kind) are stopped through the store when they stall (wait_c10d_work);
// one kind at different sizes is stopped by Gloo itself, which ends the process when the byte counts
// of a transfer differ (HP_DEBUG_COLLECTIVES=1 compares the sizes first).
#include <hyper_parallel/runtime/errors.h>

#include <ATen/ATen.h>

#include <cstring>
#include <numeric>

#include <hyper_parallel/runtime/collective_label.h>

#include "../group_impl.h"
#include "../rank_list.h"

namespace hyper_parallel {
namespace {

at::Tensor as_wire(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kBFloat16: return t.view(at::kHalf);  // same width; only copied, never added
    case at::kBool: return t.view(at::kByte);
    case at::kComplexFloat:
    case at::kComplexDouble: return at::view_as_real(t);  // only copied here (the front adds parts)
    default: return t;
  }
}

// The copies into and out of the wire buffers write memory as the backend does: no autograd
// history, no version bump, whatever the caller's grad mode and the tensors' requires_grad.
using RawCopies = at::AutoDispatchBelowADInplaceOrView;

// The bytes of contiguous `t`, as a 1-D view.
at::Tensor bytes_of(const at::Tensor& t) { return t.reshape({-1}).view(at::kByte); }

// What every collective carries (the file comment says where): its
// owner (the CollectiveLabel's hash, 0 for none), its kind and its size.
struct Header {
  uint64_t label = 0, kind = 0, bytes = 0;
  bool operator==(const Header& o) const { return label == o.label && kind == o.kind && bytes == o.bytes; }
};
constexpr int64_t kHeaderBytes = static_cast<int64_t>(sizeof(Header));

enum Kind : uint64_t { kAllGather = 1, kAllReduce, kAllToAll, kAllToAllV, kBroadcast, kScatter, kBarrier };
const char* kind_name(uint64_t kind) {
  static const char* names[] = {"?", "all_gather", "all_reduce", "all_to_all", "all_to_all_single", "broadcast", "scatter", "barrier"};
  return names[(kind & 0xFF) < 8 ? (kind & 0xFF) : 0];
}

Header header_of(uint64_t kind, uint64_t bytes) { return {current_collective_label_hash(), kind, bytes}; }

void put(const at::Tensor& dst, const Header& h) { std::memcpy(dst.data_ptr(), &h, sizeof(Header)); }
Header get(const at::Tensor& src) {
  Header h;
  std::memcpy(&h, src.data_ptr(), sizeof(Header));
  return h;
}

// An all_reduce carries no header a reduction would keep: each rank writes a 56-bit digest of its
// header into its own slot of g slots of kDigitsPerSlot 7-bit digits, and the others write the
// op's identity there (0 for sum and max, 127 for min: every digit lies in [0, 127], exact in every
// dtype Gloo reduces, int8 included). After the reduction slot p holds rank p's digest.
constexpr int64_t kDigitsPerSlot = 8;
uint64_t digest_of(const Header& h) {
  uint64_t d = h.label * 0x9E3779B97F4A7C15ull ^ (h.kind << 48) ^ h.bytes;
  return (d ^ (d >> 29)) & ((uint64_t{1} << (7 * kDigitsPerSlot)) - 1);
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
    c.checks_labels = true;
    return c;
  }

  Completion all_gather(const at::Tensor& in, const at::Tensor& out) override {
    const int64_t g = size(), n = in.numel() * static_cast<int64_t>(in.element_size());
    const Header mine = header_of(kAllGather, static_cast<uint64_t>(n));
    const RawCopies raw;
    const at::Tensor wire_in = at::empty({kHeaderBytes + n}, at::kByte);
    put(wire_in, mine);
    wire_in.narrow(0, kHeaderBytes, n).copy_(bytes_of(in));
    const at::Tensor wire_out = at::empty({g, kHeaderBytes + n}, at::kByte);
    std::vector<std::vector<at::Tensor>> outputs = as_row_list(wire_out, g);
    std::vector<at::Tensor> inputs{wire_in};
    return completion("all_gather", g_.pg->allgather(outputs, inputs), mine, [g, n, wire_out, out](const Checker& check) {
      check([&](int64_t p) { return get(wire_out[p]); });
      const RawCopies raw;
      bytes_of(out).view({g, n}).copy_(wire_out.narrow(1, kHeaderBytes, n));
    });
  }

  Completion all_reduce(const at::Tensor& buf, ReduceOp op) override {
    TORCH_INTERNAL_ASSERT(buf.scalar_type() != at::kBFloat16, "Gloo cannot add bfloat16; the front widens it");
    TORCH_INTERNAL_ASSERT(op != ReduceOp::AVG, "Gloo does not average; the front sums and divides");
    const int64_t g = size(), n = buf.numel();
    const at::Tensor data = as_wire(buf);
    const Header mine = header_of(kAllReduce | static_cast<uint64_t>(op) << 8, static_cast<uint64_t>(n));
    const RawCopies raw;
    const at::Tensor wire = at::empty({n + g * kDigitsPerSlot}, data.options());
    wire.narrow(0, 0, n).copy_(data.reshape({-1}));
    std::vector<int64_t> slots(static_cast<size_t>(g * kDigitsPerSlot), op == ReduceOp::MIN ? 127 : 0);
    const uint64_t d = digest_of(mine);
    for (int64_t k = 0; k < kDigitsPerSlot; ++k)
      slots[static_cast<size_t>(rank() * kDigitsPerSlot + k)] = static_cast<int64_t>((d >> (7 * k)) & 0x7F);
    wire.narrow(0, n, g * kDigitsPerSlot).copy_(at::tensor(slots, at::kLong));
    std::vector<at::Tensor> ts{wire};
    c10d::AllreduceOptions opts;
    opts.reduceOp = to_c10d(op);
    return completion("all_reduce", g_.pg->allreduce(ts, opts), mine, [g, n, wire, data](const Checker& check) {
      const at::Tensor digits = wire.narrow(0, n, g * kDigitsPerSlot).to(at::kLong).view({g, kDigitsPerSlot});
      const int64_t* p = digits.data_ptr<int64_t>();
      check.digests([&](int64_t r) {
        uint64_t v = 0;
        for (int64_t k = 0; k < kDigitsPerSlot; ++k) v |= static_cast<uint64_t>(p[r * kDigitsPerSlot + k] & 0x7F) << (7 * k);
        return v;
      });
      const RawCopies raw;
      data.view({-1}).copy_(wire.narrow(0, 0, n));
    });
  }

  Completion all_to_all(const at::Tensor& in, const at::Tensor& out) override {
    const int64_t g = size(), n = in.numel() * static_cast<int64_t>(in.element_size()) / g;  // bytes per block
    const Header mine = header_of(kAllToAll, static_cast<uint64_t>(n));
    const RawCopies raw;
    const at::Tensor wire_in = at::empty({g, kHeaderBytes + n}, at::kByte);
    for (int64_t j = 0; j < g; ++j) put(wire_in[j], mine);
    wire_in.narrow(1, kHeaderBytes, n).copy_(bytes_of(in).view({g, n}));
    const at::Tensor wire_out = at::empty({g, kHeaderBytes + n}, at::kByte);
    std::vector<int64_t> splits;  // empty: equal splits along dim 0
    at::Tensor flat_out = wire_out.view({-1}), flat_in = wire_in.view({-1});
    return completion("all_to_all", g_.pg->alltoall_base(flat_out, flat_in, splits, splits), mine,
                      [g, n, wire_out, wire_in, out](const Checker& check) {
                        check([&](int64_t p) { return get(wire_out[p]); });
                        const RawCopies raw;
                        bytes_of(out).view({g, n}).copy_(wire_out.narrow(1, kHeaderBytes, n));
                      });
  }

  Completion all_to_all_v(const at::Tensor& in, const at::Tensor& out, const std::vector<int64_t>& in_splits,
                          const std::vector<int64_t>& out_splits) override {
    const int64_t g = size();
    const int64_t rb = in.size(1) * static_cast<int64_t>(in.element_size());  // bytes per row
    const Header mine = header_of(kAllToAllV, static_cast<uint64_t>(rb));
    const RawCopies raw;
    std::vector<int64_t> ins(static_cast<size_t>(g)), outs(static_cast<size_t>(g));
    for (size_t j = 0; j < ins.size(); ++j) {
      ins[j] = kHeaderBytes + in_splits[j] * rb;
      outs[j] = kHeaderBytes + out_splits[j] * rb;
    }
    const at::Tensor src = in.numel() > 0 ? bytes_of(in) : at::empty({0}, at::kByte);
    at::Tensor wire_in = at::empty({std::accumulate(ins.begin(), ins.end(), int64_t{0})}, at::kByte);
    at::Tensor wire_out = at::empty({std::accumulate(outs.begin(), outs.end(), int64_t{0})}, at::kByte);
    for (int64_t j = 0, at_in = 0, at_src = 0; j < g; ++j) {
      const int64_t body = ins[static_cast<size_t>(j)] - kHeaderBytes;
      put(wire_in.narrow(0, at_in, kHeaderBytes), mine);
      if (body > 0) wire_in.narrow(0, at_in + kHeaderBytes, body).copy_(src.narrow(0, at_src, body));
      at_in += ins[static_cast<size_t>(j)];
      at_src += body;
    }
    return completion("all_to_all_single", g_.pg->alltoall_base(wire_out, wire_in, outs, ins), mine,
                      [g, outs, wire_out, wire_in, out](const Checker& check) {
                        std::vector<int64_t> at(static_cast<size_t>(g) + 1, 0);
                        for (size_t p = 0; p < outs.size(); ++p) at[p + 1] = at[p] + outs[p];
                        check([&](int64_t p) { return get(wire_out.narrow(0, at[static_cast<size_t>(p)], kHeaderBytes)); });
                        const RawCopies raw;
                        const at::Tensor dst = out.numel() > 0 ? bytes_of(out) : at::empty({0}, at::kByte);
                        for (int64_t p = 0, at_dst = 0; p < g; ++p) {
                          const int64_t body = outs[static_cast<size_t>(p)] - kHeaderBytes;
                          if (body > 0) dst.narrow(0, at_dst, body).copy_(wire_out.narrow(0, at[static_cast<size_t>(p)] + kHeaderBytes, body));
                          at_dst += body;
                        }
                      });
  }

  // Only the source sends a broadcast's or a scatter's data, so the others could not tell its
  // header from theirs: the headers are exchanged first (24 bytes each; not on the FSDP or TP paths).
  Completion broadcast(const at::Tensor& buf, int64_t src) override {
    agree(header_of(kBroadcast | static_cast<uint64_t>(src) << 8, static_cast<uint64_t>(buf.numel() * static_cast<int64_t>(buf.element_size()))));
    std::vector<at::Tensor> ts{as_wire(buf)};
    c10d::BroadcastOptions opts;
    opts.rootRank = src;
    return completion("broadcast", g_.pg->broadcast(ts, opts), {buf});
  }

  Completion scatter(const at::Tensor& in, const at::Tensor& out, int64_t src) override {
    agree(header_of(kScatter | static_cast<uint64_t>(src) << 8, static_cast<uint64_t>(out.numel() * static_cast<int64_t>(out.element_size()))));
    std::vector<at::Tensor> outputs{as_wire(out).view({-1})};
    std::vector<std::vector<at::Tensor>> inputs;
    if (g_.rank == src) inputs = as_row_list(as_wire(in), static_cast<int64_t>(g_.ranks.size()));
    c10d::ScatterOptions opts;
    opts.rootRank = src;
    return completion("scatter", g_.pg->scatter(outputs, inputs, opts), {in, out});
  }

  // An all_gather completes on no rank before every rank has entered it: the exchange of the
  // headers is the barrier.
  Completion barrier() override {
    agree(header_of(kBarrier, 0));
    return {};
  }

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
  int64_t size() const { return static_cast<int64_t>(g_.ranks.size()); }
  int64_t rank() const { return g_.rank; }

  // Compares every rank's header with this rank's, once the collective is done: on a difference
  // every rank raises, naming what each rank was in (exchanged through the store: the group's
  // collectives no longer pair).
  class Checker {
   public:
    Checker(Group::Impl& g, const char* what, uint64_t seq, const Header& mine, std::string label)
        : g_(g), what_(what), seq_(seq), mine_(mine), label_(std::move(label)) {}
    template <class HeaderOf>
    void operator()(const HeaderOf& header_of_rank) const {
      for (int64_t p = 0; p < static_cast<int64_t>(g_.ranks.size()); ++p)
        if (!(header_of_rank(p) == mine_)) fail();
    }
    template <class DigestOf>
    void digests(const DigestOf& digest_of_rank) const {
      const uint64_t mine = digest_of(mine_);
      for (int64_t p = 0; p < static_cast<int64_t>(g_.ranks.size()); ++p)
        if (digest_of_rank(p) != mine) fail();
    }

   private:
    [[noreturn]] void fail() const {
      const uint64_t kind = mine_.kind & 0xFF;
      std::string mine = c10::str(kind_name(kind), " #", seq_);
      if (kind != kBarrier) mine += c10::str(" of ", mine_.bytes, kind == kAllReduce ? " elements" : kind == kAllToAllV ? " bytes a row" : " bytes");
      mine += label_.empty() ? std::string(", unlabelled") : " for " + label_;
      const std::vector<std::string> each = collective_descriptions(g_, seq_, mine);
      std::string who;
      for (size_t r = 0; r < each.size(); ++r) who += c10::str(r ? "; rank " : "rank ", g_.ranks[r], ": ", each[r]);
      TORCH_CHECK(false, "hyper_parallel::", what_, ": the Gloo transport on the group of ranks [", join_ranks(g_.ranks),
                  "]: the ranks called collectives of different owners, kinds or sizes (", who,
                  "); every rank must issue the same collectives in the same order. No rank used another's data: every "
                  "collective carries its label, kind and size, compared before its result is used");
    }
    Group::Impl& g_;
    const char* what_;
    uint64_t seq_;
    Header mine_;
    std::string label_;
  };

  // Exchanges only the headers, at once (a broadcast's or scatter's check, and the barrier).
  void agree(const Header& mine) {
    const int64_t g = size();
    const at::Tensor wire_in = at::empty({kHeaderBytes}, at::kByte);
    put(wire_in, mine);
    const at::Tensor wire_out = at::empty({g, kHeaderBytes}, at::kByte);
    std::vector<std::vector<at::Tensor>> outputs = as_row_list(wire_out, g);
    std::vector<at::Tensor> inputs{wire_in};
    const char* what = kind_name(mine.kind & 0xFF);
    completion(what, g_.pg->allgather(outputs, inputs), mine, [wire_out](const Checker& check) {
      check([&](int64_t p) { return get(wire_out[p]); });
    })();
  }

  // The buffers stay alive (captured) until the collective is waited for.
  Completion completion(const char* what, c10::intrusive_ptr<c10d::Work> work, std::vector<at::Tensor> keep) {
    Group::Impl* g = &g_;
    const uint64_t seq = ++g_.seq;
    return [g, what, seq, work = std::move(work), keep = std::move(keep), label = current_collective_label()] {
      wait_c10d_work(*g, what, seq, work, label, true);
    };
  }
  // The same, then `finish` compares the headers (through the Checker it is given) and moves the
  // data out of the wire buffers it captured.
  template <class Finish>
  Completion completion(const char* what, c10::intrusive_ptr<c10d::Work> work, const Header& mine, Finish finish) {
    Group::Impl* g = &g_;
    const uint64_t seq = ++g_.seq;
    return [g, what, seq, mine, work = std::move(work), finish = std::move(finish), label = current_collective_label()] {
      wait_c10d_work(*g, what, seq, work, label, true);
      finish(Checker(*g, what, seq, mine, label));
    };
  }
  Group::Impl& g_;
};

}  // namespace

std::unique_ptr<Transport> make_gloo_transport(Group::Impl& g) { return std::make_unique<GlooTransport>(g); }

}  // namespace hyper_parallel
