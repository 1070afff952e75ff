// reduce_on: a reduction on a transport, with the emulations its capabilities call for.
#include "reduction_emulation.h"

#include <ATen/ATen.h>

#include <limits>

namespace hyper_parallel {
namespace {
// Booleans reduce as logical or (sum, max) / logical and (min), on bytes.
ReduceOp bool_op(ReduceOp op) { return op == ReduceOp::MIN ? ReduceOp::MIN : ReduceOp::MAX; }

struct Emulations {
  bool widen;   // 16-bit floats the transport cannot add (or average): in fp32, rounded once
  bool divide;  // an average as a sum, then a division here
  bool flags;   // max/min whose NaN could vanish: a flag per element travels along
};

// `dtype` as it goes on the wire (bool already as bytes); `on_wire`: the transport reduces.
Emulations emulations(const TransportCapabilities& caps, at::ScalarType dtype, ReduceOp op, bool on_wire) {
  const bool is_16bit = dtype == at::kBFloat16 || dtype == at::kHalf;
  Emulations e{};
  e.widen = on_wire && is_16bit && (!caps.reduce_16bit || (op == ReduceOp::AVG && !caps.average));
  // Averaged by a division here when the transport does not average, or does not reduce at all.
  e.divide = op == ReduceOp::AVG && (!caps.average || !on_wire);
  const ReduceOp wire_op = e.divide ? ReduceOp::SUM : op;
  e.flags = on_wire && (wire_op == ReduceOp::MAX || wire_op == ReduceOp::MIN) &&
            at::isFloatingType(e.widen ? at::kFloat : dtype) && !caps.nan_max_min;
  return e;
}
}  // namespace

bool reduces_natively(const TransportCapabilities& caps, at::ScalarType dtype, ReduceOp op) {
  if (dtype == at::kBool) return false;
  const Emulations e = emulations(caps, dtype, op, true);
  return !e.widen && !e.divide && !e.flags;
}

std::function<at::Tensor()> reduce_on(Transport& tr, const at::Tensor& in, ReduceOp op, bool scatter, int64_t g) {
  const at::ScalarType dtype = in.scalar_type();
  const TransportCapabilities caps = tr.capabilities();
  const bool is_bool = dtype == at::kBool;
  at::Tensor buf = is_bool ? in.view(at::kByte) : in;
  if (is_bool) op = bool_op(op);
  const bool on_wire = !scatter || caps.reduce_scatter;  // the transport itself reduces
  const Emulations e = emulations(caps, dtype, op, on_wire);
  const bool widen = e.widen, divide = e.divide, flags = e.flags;
  if (widen) buf = buf.to(at::kFloat);
  const ReduceOp wire_op = divide ? ReduceOp::SUM : op;
  const int64_t rows = scatter ? g : 1;
  const int64_t m = buf.numel() / rows;
  if (flags) {
    const at::Tensor r = buf.view({rows, m});
    at::Tensor f = r.isnan().to(buf.scalar_type());
    if (wire_op == ReduceOp::MIN) f.neg_();
    buf = at::cat({r, f}, 1);  // [rows, 2m]: a block is its values, then its flags
  }
  at::Tensor out;
  Completion done;
  if (!scatter) {
    done = tr.all_reduce(buf, wire_op);
    out = buf;
  } else if (caps.reduce_scatter) {
    out = at::empty({buf.numel() / g}, buf.options());
    done = tr.reduce_scatter(buf, out, wire_op);
  } else {
    out = at::empty_like(buf);
    done = tr.all_to_all(buf, out);
  }
  return [=]() mutable {
    const NormalTensors normal;
    if (done) done();
    if (scatter && !caps.reduce_scatter) {
      const at::Tensor recv = out.view({g, m});
      switch (wire_op) {
        // Summed in the buffer's dtype (torch.sum would promote integers to int64); bf16/fp16
        // accumulate in fp32 inside the kernel and round once.
        case ReduceOp::SUM:
        case ReduceOp::AVG:  // not reached: an average is a sum here (`divide`)
          out = recv.sum(0, false, recv.scalar_type());
          break;
        case ReduceOp::MAX: out = std::get<0>(recv.max(0)); break;
        case ReduceOp::MIN: out = std::get<0>(recv.min(0)); break;
      }
    }
    if (flags) {
      const at::Tensor both = out.view({2, m});
      out = both[0].masked_fill(both[1].ne(0), std::numeric_limits<double>::quiet_NaN());
    }
    if (divide) out = out.div_(g);
    if (widen) out = out.to(dtype);
    if (is_bool) out = out.view(at::kBool);
    return out.view({-1});
  };
}


}  // namespace hyper_parallel
