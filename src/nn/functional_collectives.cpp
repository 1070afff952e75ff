#include <hyper_parallel/nn/functional_collectives.h>

#include <hyper_parallel/runtime/collectives.h>

#include <torch/csrc/autograd/custom_function.h>

namespace hyper_parallel {
namespace nn {
namespace functional {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Splits and groups live in the context's saved data as IValues; the group as its rank list.
Group group_of(AutogradContext* ctx) { return new_group(ctx->saved_data["ranks"].toIntVector()); }

struct AllToAllSingle : torch::autograd::Function<AllToAllSingle> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, std::vector<int64_t> out_splits,
                            std::vector<int64_t> in_splits, const Group& group) {
    ctx->saved_data["out"] = out_splits;
    ctx->saved_data["in"] = in_splits;
    ctx->saved_data["ranks"] = group.ranks();
    return all_to_all_single(input, out_splits, in_splits, group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor g = grads[0].contiguous();
    return {all_to_all_single(g, ctx->saved_data["in"].toIntVector(), ctx->saved_data["out"].toIntVector(), group_of(ctx)),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// mode 0: sum forward, sum backward; 1: sum forward, identity backward; 2: identity forward, sum backward.
template <int Mode>
struct GroupSum : torch::autograd::Function<GroupSum<Mode>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const Group& group) {
    ctx->saved_data["ranks"] = group.ranks();
    if (Mode == 2) return input.view_as(input);
    return all_reduce(input, ReduceOp::SUM, group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (Mode == 1) return {grads[0], at::Tensor()};
    return {all_reduce(grads[0], ReduceOp::SUM, group_of(ctx)), at::Tensor()};
  }
};

}  // namespace

at::Tensor all_to_all_single_autograd(const at::Tensor& input, const std::vector<int64_t>& output_split_sizes,
                                      const std::vector<int64_t>& input_split_sizes, const Group& group) {
  return AllToAllSingle::apply(input, output_split_sizes, input_split_sizes, group);
}

at::Tensor all_reduce_sum_autograd(const at::Tensor& input, const Group& group) { return GroupSum<0>::apply(input, group); }
at::Tensor reduce_from_group(const at::Tensor& input, const Group& group) { return GroupSum<1>::apply(input, group); }
at::Tensor copy_to_group(const at::Tensor& input, const Group& group) { return GroupSum<2>::apply(input, group); }

}  // namespace functional
}  // namespace nn
}  // namespace hyper_parallel
