// The device-agnostic front of point-to-point transfers: arguments, CommDebugMode, staging
// across devices; the group's peer transport moves the bytes.
#include <hyper_parallel/runtime/comm_debug_mode.h>
#include <hyper_parallel/runtime/errors.h>
#include <hyper_parallel/runtime/point_to_point.h>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "group_impl.h"
#include "staging.h"

namespace hyper_parallel {
namespace {

const char* name_of(P2POp::Kind k) { return k == P2POp::Kind::isend ? "send" : "recv"; }

void check_op(const P2POp& op, const Group& group) {
  const char* what = name_of(op.kind);
  HP_CHECK_T(c10::ValueError, op.group.defined(), "hyper_parallel::", what, ": the group is undefined");
  HP_CHECK_T(c10::ValueError, op.group == group, "hyper_parallel::batch_isend_irecv: every operation of a batch must be on one group ",
             "(ranks [", c10::IntArrayRef(group.ranks()), "]), got one on ranks [", c10::IntArrayRef(op.group.ranks()), "]");
  HP_CHECK_T(c10::ValueError, op.peer >= 0 && op.peer < group.size(), "hyper_parallel::", what, ": peer ", op.peer,
             " is not a rank of a group of size ", group.size(), " (peers are ranks within the group)");
  HP_CHECK_T(c10::ValueError, op.peer != group.rank(), "hyper_parallel::", what, ": group rank ", op.peer,
             " is this rank itself; a rank cannot ", what, " to itself");
  HP_CHECK_T(c10::ValueError, op.tag >= 0 && op.tag <= std::numeric_limits<int32_t>::max(), "hyper_parallel::", what,
             ": tag must be in [0, 2^31), got ", op.tag);
  HP_CHECK_T(c10::ValueError, op.tensor.defined(), "hyper_parallel::", what, ": the tensor is undefined");
}

}  // namespace

std::vector<Work> batch_isend_irecv(const std::vector<P2POp>& ops) {
  HP_CHECK_T(c10::ValueError, !ops.empty(), "hyper_parallel::batch_isend_irecv: the list of operations is empty");
  const Group group = ops.front().group;
  for (const P2POp& op : ops) check_op(op, group);
  const bool simulated = transport_of(group).capabilities().simulated;
  Transport& tr = peer_transport_of(group);
  std::vector<PeerTransfer> transfers;
  std::vector<size_t> issued(ops.size(), SIZE_MAX);  // op -> its transfer, SIZE_MAX: nothing to move
  std::vector<at::Tensor> wires(ops.size());
  {
    const c10::InferenceMode off(false);
    for (size_t i = 0; i < ops.size(); ++i) {
      const P2POp& op = ops[i];
      const at::Tensor& t = op.tensor;
      const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
      const char* what = name_of(op.kind);
      CommDebugMode::record(what, bytes, group, bytes);
      // A fake world's meta tensor is a shape only; a real world refuses it as the collectives do.
      if (t.is_meta() && simulated) continue;
      check_device(t, tr, what);
      if (t.numel() == 0) continue;
      // What the transport moves: contiguous, on its device. A recv into anything else lands in a
      // staging buffer that wait() copies back.
      const bool send = op.kind == P2POp::Kind::isend;
      at::Tensor wire = send ? on_transport(t, tr, what).contiguous().detach()
                             : t.device().type() == tr.device_type() && t.is_contiguous()
                                   ? t
                                   : at::empty(t.sizes(), t.options().device(tr.device_type()));
      wires[i] = wire;
      issued[i] = transfers.size();
      // Matched on tag, bytes and dtype: a recv of another size or dtype does not match (and
      // fails at the timeout, naming the peer) instead of taking a message it would misread.
      const uint64_t mixed = static_cast<uint64_t>(op.tag) * 0x9E3779B1ull + static_cast<uint64_t>(bytes) * 0x85EBCA77ull +
                             static_cast<uint64_t>(t.scalar_type());
      transfers.push_back({send, wire, op.peer, op.tag, static_cast<int64_t>(mixed & 0x7FFFFFFFull)});
    }
  }
  std::vector<Completion> done = transfers.empty() ? std::vector<Completion>() : tr.peer_transfers(transfers);
  std::vector<Work> works;
  works.reserve(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    if (issued[i] == SIZE_MAX) {
      works.push_back(Work::completed(ops[i].tensor));
      continue;
    }
    works.emplace_back([finish = std::move(done[issued[i]]), wire = wires[i], target = ops[i].tensor,
                        recv = ops[i].kind == P2POp::Kind::irecv]() mutable {
      if (finish) finish();
      if (recv && !wire.is_same(target)) {
        const c10::InferenceMode off(false);
        at::Tensor t = target;
        t.detach().copy_(wire);
      }
      return target;
    });
  }
  return works;
}

Work isend(const at::Tensor& tensor, int64_t dst, const Group& group, int64_t tag) {
  auto works = batch_isend_irecv({P2POp::isend(tensor, dst, group, tag)});
  return std::move(works.front());
}

Work irecv(const at::Tensor& tensor, int64_t src, const Group& group, int64_t tag) {
  auto works = batch_isend_irecv({P2POp::irecv(tensor, src, group, tag)});
  return std::move(works.front());
}

void send(const at::Tensor& tensor, int64_t dst, const Group& group, int64_t tag) { isend(tensor, dst, group, tag).wait(); }

at::Tensor& recv(at::Tensor& tensor, int64_t src, const Group& group, int64_t tag) {
  irecv(tensor, src, group, tag).wait();
  return tensor;
}

}  // namespace hyper_parallel
