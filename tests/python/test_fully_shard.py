"""fully_shard from Python (PyTorch's FSDP2 names) and full model state dicts, against one process
in the same job: a torch.nn MLP, transformers' Qwen3 (tied and untied) and Qwen3.5, at dp = every
rank, at dp 2 x tp 2 and as HSDP (4 ranks), with torch.optim and clip_grad_norm_ unchanged.

Run SPMD under torchrun or hprun: every rank trains on its own slice of one batch, the reference
trains one process on the whole batch; the mean of the ranks' mean losses is the whole batch's.
"""
import copy
import dataclasses
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import hyper_parallel as hp
from hyper_parallel import (FSDPModule, MixedPrecisionPolicy, Replicate, Shard, StateDictOptions, fully_shard,
                            get_model_state_dict, init_device_mesh, parallelize_module, set_model_state_dict)

torch.set_num_threads(1)
hp.init_process_group()
WORLD = hp.get_world_size()
RANK = hp.get_rank()
DP = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("dp",))
if WORLD == 4:
    DP_TP = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    HSDP = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
if not dist.is_initialized():
    dist.init_process_group("gloo")
FOUR_RANKS = pytest.mark.skipif(WORLD != 4, reason="a 2 x 2 mesh needs 4 ranks")


def seeded(seed, make):
    torch.manual_seed(seed)
    return make()


def full(t):
    return t.full_tensor() if isinstance(t, hp.DTensor) else t


class Mlp(nn.Module):
    def __init__(self, dim=16, hidden=40):  # 40 rows: uneven pieces at 3 ranks, even at 2 and 4
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Stack(nn.Module):
    def __init__(self, n=3, dim=16):
        super().__init__()
        self.embed = nn.Linear(dim, dim, bias=False)
        self.blocks = nn.ModuleList(Mlp(dim) for _ in range(n))
        self.head = nn.Linear(dim, 5)

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


def my_rows(batch, dp_rank, dp_size):
    n = batch.shape[0] // dp_size
    return batch[dp_rank * n:(dp_rank + 1) * n]


def train(model, ref, batches, loss_fn, steps=3, clip=None, lr=1e-2, rtol=1e-5, atol=1e-6, dp_rank=RANK, dp_size=WORLD, dp_mesh=None):
    """``steps`` AdamW steps (foreach, as on a GPU) of ``model`` on this dp rank's rows and of
    ``ref`` on the whole batch, comparing the loss, then every parameter after the last step."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, foreach=True)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=lr, foreach=True)
    for step in range(steps):
        batch = batches(step)
        mine = tuple(my_rows(b, dp_rank, dp_size) for b in batch)
        loss = loss_fn(model, *mine)
        ref_loss = loss_fn(ref, *batch)
        loss.backward()
        ref_loss.backward()
        # The mean over dp of the ranks' mean losses (a Partial sum over dp, made whole) is the
        # whole batch's mean loss.
        mean = hp.DTensor.from_local(loss.detach().reshape(1), dp_mesh or DP, [hp.Partial()]).full_tensor()[0] / dp_size
        torch.testing.assert_close(mean, ref_loss.detach(), rtol=rtol, atol=atol, msg=lambda m: f"loss, step {step}: {m}")
        # Every gradient of the first step, relative to its own scale (after an optimizer step the
        # parameters differ by float noise, see below, and so do the next gradients).
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            if step == 0:
                torch.testing.assert_close(full(p.grad), q.grad, rtol=rtol * 10, atol=atol + 1e-4 * q.grad.abs().max().item(),
                                           msg=lambda m: f"{name}'s gradient, step {step}: {m}")
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=True)
            ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), clip, foreach=True)
            torch.testing.assert_close(full(norm), ref_norm, rtol=rtol, atol=atol, msg=f"grad norm, step {step}")
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    # Adam moves every element by up to lr a step whatever its gradient's size: an element whose
    # gradient is ~0 may move by a few percent of lr on float noise of the reduction order.
    for (name, p), (ref_name, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert name == ref_name
        torch.testing.assert_close(full(p.detach()), q.detach(), rtol=rtol * 20, atol=lr * 5e-2, msg=lambda m: f"{name}: {m}")



def mse(m, x, y):
    return F.mse_loss(m(x), y)


def local_mse(m, x, y):
    """The loss of this rank's rows of the batch (x, y)."""
    return mse(m, my_rows(x, RANK, WORLD), my_rows(y, RANK, WORLD))


def expect_gradients(model, ref, where=""):
    """Every gradient of the sharded ``model`` equals one process's (``ref`` on the whole batch)."""
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(full(p.grad), q.grad, rtol=1e-5, atol=1e-6, msg=f"{name}{where}")


def stack_batches(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(4 * 2, 16, generator=g), torch.randn(4 * 2, 5, generator=g)


def shard_stack(model, mesh, **kwargs):
    for b in model.blocks:
        fully_shard(b, mesh=mesh, **kwargs)
    return fully_shard(model, mesh=mesh, **kwargs)


def test_a_sharded_torch_nn_stack_trains_with_adamw_and_clip_grad_norm_as_one_process():
    model = shard_stack(seeded(0, Stack), DP)
    ref = seeded(0, Stack)
    assert isinstance(model, FSDPModule) and isinstance(model.blocks[0], FSDPModule) and isinstance(model, Stack)
    assert type(model).__name__ == "FSDPStack"
    assert model.blocks[0].up.weight.placements == (Shard(0),) and model.blocks[0].up.weight.device_mesh == DP
    assert isinstance(model.blocks[0].up.weight, nn.Parameter)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in ref.named_parameters()]
    train(model, ref, stack_batches, mse, clip=0.5)


def test_the_same_steps_under_pytorchs_own_fully_shard_give_the_same_shards_and_losses():
    from torch.distributed.fsdp import fully_shard as torch_fully_shard
    torch_mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (WORLD,))
    ours, theirs = shard_stack(seeded(0, Stack), DP), seeded(0, Stack)
    for b in theirs.blocks:
        torch_fully_shard(b, mesh=torch_mesh)
    torch_fully_shard(theirs, mesh=torch_mesh)
    assert type(theirs).__name__ == type(ours).__name__
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=True) for m in (ours, theirs)]
    for step in range(3):
        x, y = (my_rows(b, RANK, WORLD) for b in stack_batches(step))
        losses = []
        for m, opt in zip((ours, theirs), opts):
            loss = mse(m, x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[0], losses[1], rtol=1e-6, atol=1e-7, msg=f"step {step}")
    # The same sharding (torch.chunk's rows per rank), so the same local pieces.
    for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert p.placements == tuple(Shard(pl.dim) for pl in q.placements), name
        torch.testing.assert_close(p.to_local(), q.to_local(), rtol=1e-5, atol=1e-6, msg=name)


@dataclasses.dataclass
class BlockOutput:
    hidden: torch.Tensor
    extra: dict


class OutputsBlock(nn.Module):
    """A block whose output is a dataclass holding a dict (as transformers' outputs hold tensors)."""

    def __init__(self):
        super().__init__()
        self.mlp = Mlp()

    def forward(self, x):
        h = self.mlp(x)
        return BlockOutput(hidden=h, extra={"scaled": 0.5 * h})


class OutputsModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(OutputsBlock() for _ in range(2))
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        for b in self.blocks:
            out = b(x)
            x = x + out.hidden + out.extra["scaled"]
        return self.head(x)


def test_blocks_returning_dataclasses_and_dicts_are_gathered_again_for_backward_and_equal_one_process():
    model, ref = seeded(0, OutputsModel), seeded(0, OutputsModel)
    shard_stack(model, DP)  # resharded after forward: backward must gather them again
    x, y = stack_batches(0)
    local_mse(model, x, y).backward()
    mse(ref, x, y).backward()
    expect_gradients(model, ref)


def test_a_frozen_parameter_gets_no_gradient_and_the_rest_train_as_one_process():
    model, ref = seeded(0, Stack), seeded(0, Stack)
    for m in (model, ref):
        m.blocks[1].up.weight.requires_grad_(False)
    shard_stack(model, DP)
    assert not model.blocks[1].up.weight.requires_grad
    x, y = stack_batches(0)
    local_mse(model, x, y).backward()
    mse(ref, x, y).backward()
    assert model.blocks[1].up.weight.grad is None and ref.blocks[1].up.weight.grad is None
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        if q.grad is not None:
            torch.testing.assert_close(full(p.grad), q.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_gradient_accumulation_without_sync_reduces_once_and_equals_one_process():
    model, ref = shard_stack(seeded(0, Stack), DP), seeded(0, Stack)
    batches = [stack_batches(s) for s in range(2)]
    for micro, (x, y) in enumerate(batches):
        model.set_requires_gradient_sync(micro == len(batches) - 1)
        with hp.CommDebugMode() as comm:
            (local_mse(model, x, y) / len(batches)).backward()
        reduce_scatters = comm.get_comm_counts()[torch.ops.c10d_functional.reduce_scatter_tensor]
        # One reduction per group (3 blocks and the root), on the synchronised microbatch only.
        assert reduce_scatters == (4 if micro == len(batches) - 1 else 0), (micro, reduce_scatters)
        if micro == 0:
            assert all(p.grad is None for p in model.parameters())
        (mse(ref, x, y) / len(batches)).backward()
    expect_gradients(model, ref)


def test_set_is_last_backward_as_pytorch_loops_call_it_changes_no_value_and_every_backward_completes_its_gradients():
    model, ref = shard_stack(seeded(0, Stack), DP), seeded(0, Stack)
    batches = [stack_batches(s) for s in range(3)]
    for micro, (x, y) in enumerate(batches):
        model.set_is_last_backward(micro == len(batches) - 1)
        (local_mse(model, x, y) / len(batches)).backward()
        (mse(ref, x, y) / len(batches)).backward()
        # As PyTorch's: the gradients are in .grad when the backward returns, whatever the flag.
        expect_gradients(model, ref, where=f", microbatch {micro}")
    with pytest.raises(TypeError, match="set_is_last_backward"):
        model.set_is_last_backward("no")


def test_unshard_and_reshard_by_hand_and_keeping_parameters_after_backward_give_one_process_values():
    model, ref = shard_stack(seeded(0, Stack), DP), seeded(0, Stack)
    x, _ = stack_batches(0)
    handle = model.blocks[0].unshard(async_op=True)
    handle.wait()
    model.blocks[1].unshard()
    # As FSDP2: the gathered parameters are in the module, whole, until reshard().
    assert not isinstance(model.blocks[1].up.weight, hp.DTensor) and isinstance(model.blocks[1].up.weight, nn.Parameter)
    assert torch.equal(model.blocks[1].up.weight, ref.blocks[1].up.weight)
    model.blocks[1].reshard()
    assert model.blocks[1].up.weight.placements == (Shard(0),)
    model.blocks[1].unshard()
    with torch.no_grad():
        torch.testing.assert_close(model(my_rows(x, RANK, WORLD)), my_rows(ref(x), RANK, WORLD))
    for b in model.blocks:
        b.reshard()
    model.set_reshard_after_backward(False)
    mse(model, my_rows(x, RANK, WORLD), torch.zeros(8 // WORLD, 5)).backward()
    mse(ref, x, torch.zeros(8, 5)).backward()
    model.set_reshard_after_backward(True)
    expect_gradients(model, ref)


def test_bf16_compute_with_fp32_reduction_matches_one_process_within_bf16_rounding():
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model, ref = shard_stack(seeded(0, Stack), DP, mp_policy=mp), seeded(0, Stack)
    x, y = stack_batches(0)
    out = model(my_rows(x, RANK, WORLD))
    assert out.dtype == torch.bfloat16  # computed in bf16; the parameters stay fp32
    assert model.blocks[0].up.weight.dtype == torch.float32
    F.mse_loss(out.float(), my_rows(y, RANK, WORLD)).backward()
    mse(ref, x, y).backward()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert p.grad.dtype == torch.float32
        torch.testing.assert_close(full(p.grad), q.grad, rtol=5e-2, atol=2e-2, msg=name)
    # output_dtype casts the root's output back.
    model2 = fully_shard(seeded(0, Stack), mesh=DP, mp_policy=MixedPrecisionPolicy(torch.bfloat16, torch.float32, torch.float32))
    assert model2(my_rows(x, RANK, WORLD)).dtype == torch.float32


def test_what_fully_shard_does_not_support_is_refused_by_name_and_changes_nothing():
    model = seeded(0, Stack)
    before = {n: p for n, p in model.named_parameters()}
    cases = [
        (dict(shard_placement_fn=lambda p: Shard(1)), NotImplementedError, "shard_placement_fn"),
        (dict(offload_policy=hp.CPUOffloadPolicy()), NotImplementedError, "CPUOffloadPolicy"),
        (dict(reshard_after_forward=2), NotImplementedError, "reshard_after_forward"),
    ]
    for kwargs, error, name in cases:
        with pytest.raises(error, match=name):
            fully_shard(model, mesh=DP, **kwargs)
    with pytest.raises(NotImplementedError, match="several modules"):
        fully_shard([model.blocks[0], model.blocks[1]], mesh=DP)
    assert type(model) is Stack and {n: p for n, p in model.named_parameters()} == before
    assert not model._forward_pre_hooks and not model.blocks[0]._forward_pre_hooks
    fully_shard(model.blocks[0], mesh=DP)
    with pytest.raises(ValueError, match="already applied"):
        fully_shard(model.blocks[0], mesh=DP)


def test_a_model_converted_to_float64_after_fully_shard_gathers_and_computes_in_float64_as_one_process():
    model, ref = shard_stack(seeded(0, Stack), DP), seeded(0, Stack)
    model.to(torch.float64)
    ref.to(torch.float64)
    assert model.blocks[0].up.weight.dtype == torch.float64 and model.blocks[0].up.weight.placements == (Shard(0),)
    x, y = (b.double() for b in stack_batches(0))
    out = model(my_rows(x, RANK, WORLD))
    assert out.dtype == torch.float64
    F.mse_loss(out, my_rows(y, RANK, WORLD)).backward()
    mse(ref, x, y).backward()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert p.grad.dtype == torch.float64
        torch.testing.assert_close(full(p.grad), q.grad, rtol=1e-10, atol=1e-12, msg=name)


def test_a_parameter_replaced_after_fully_shard_is_refused_by_name_at_the_next_forward():
    model = shard_stack(seeded(0, Stack), DP)
    model.head.bias = nn.Parameter(torch.full((5,), 100.0))
    x, _ = stack_batches(0)
    with pytest.raises(RuntimeError, match="'head.bias' was replaced"):
        model(my_rows(x, RANK, WORLD))
    assert float(model.head.bias[0]) == 100.0  # the user's parameter is left where it was put


def test_an_inner_calls_ignored_parameter_stays_out_of_the_outer_call_as_in_fsdp2():
    model = seeded(0, Stack)
    fully_shard(model.blocks[0], mesh=DP, ignored_params={model.blocks[0].up.bias})
    fully_shard(model, mesh=DP)
    assert not isinstance(model.blocks[0].up.bias, hp.DTensor)
    assert model.blocks[0].up.weight.placements == (Shard(0),) and model.head.weight.placements == (Shard(0),)


def test_pytorchs_device_mesh_and_deepcopy_are_refused_by_name():
    model = seeded(0, Stack)
    with pytest.raises(TypeError, match="init_device_mesh"):
        fully_shard(model, mesh=torch.distributed.device_mesh.init_device_mesh("cpu", (WORLD,)))
    assert type(model) is Stack
    fully_shard(model, mesh=DP)
    with pytest.raises(TypeError, match="deep-copied"):
        copy.deepcopy(model)


# ---- transformers' models

def tiny_qwen3(tie):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    config = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, max_position_embeddings=64, tie_word_embeddings=tie,
                         attn_implementation="eager")
    return Qwen3ForCausalLM(config)


def tiny_qwen3_5():
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    config = Qwen3_5TextConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
                               linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4,
                               max_position_embeddings=64, layer_types=["linear_attention", "full_attention"],
                               tie_word_embeddings=False, attn_implementation="eager")
    return Qwen3_5ForCausalLM(config)


def token_batches(step):
    g = torch.Generator().manual_seed(200 + step)
    return (torch.randint(0, 64, (4, 12), generator=g),)


def lm_loss(m, ids):
    return m(ids, labels=ids).loss


def shard_layers(model, mesh, **kwargs):
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, **kwargs)
    return fully_shard(model, mesh=mesh, **kwargs)


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_transformers_qwen3_under_fully_shard_trains_as_one_process(tie):
    model, ref = seeded(0, lambda: tiny_qwen3(tie)), seeded(0, lambda: tiny_qwen3(tie))
    shard_layers(model, DP)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tie
    train(model, ref, token_batches, lm_loss, clip=1.0)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tie


def test_transformers_qwen3_5_under_fully_shard_trains_as_one_process():
    model, ref = seeded(0, tiny_qwen3_5), seeded(0, tiny_qwen3_5)
    shard_layers(model, DP)
    train(model, ref, token_batches, lm_loss, rtol=2e-5, atol=2e-6)


def test_transformers_qwen3_with_bf16_compute_and_fp32_reduction_matches_one_process_within_bf16_rounding():
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model, ref = seeded(0, lambda: tiny_qwen3(False)), seeded(0, lambda: tiny_qwen3(False))
    shard_layers(model, DP, mp_policy=mp)
    ids = token_batches(0)[0]
    loss = lm_loss(model, my_rows(ids, RANK, WORLD))
    loss.backward()
    ref_loss = lm_loss(ref, ids)
    ref_loss.backward()
    mean = hp.DTensor.from_local(loss.detach().float().reshape(1), DP, [hp.Partial()]).full_tensor()[0] / WORLD
    torch.testing.assert_close(mean, ref_loss.detach(), rtol=2e-2, atol=2e-2)  # bf16 keeps 8 bits of mantissa
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32, name
        # Within bf16 rounding of the gradient's own scale.
        torch.testing.assert_close(full(p.grad), q.grad, rtol=5e-2, atol=3e-2 * q.grad.abs().max().item(),
                                   msg=lambda m: f"{name}: {m}")


MODELS = {"qwen3_tied": lambda: tiny_qwen3(True), "qwen3_untied": lambda: tiny_qwen3(False), "qwen3_5": tiny_qwen3_5}


@FOUR_RANKS
@pytest.mark.parametrize("name", list(MODELS))
def test_transformers_models_at_dp2_x_tp2_with_their_own_tp_plan_train_as_one_process(name):
    model, ref = seeded(0, MODELS[name]), seeded(0, MODELS[name])
    tie = model.lm_head.weight is model.model.embed_tokens.weight
    parallelize_module(model, DP_TP["tp"], hp.plan_from_transformers(model))
    shard_layers(model, DP_TP["dp"])
    w = model.model.layers[0].mlp.gate_proj.weight
    assert w.device_mesh == DP_TP and w.placements == (Shard(1), Shard(0))  # dp on the dim TP leaves whole
    assert model.model.norm.weight.device_mesh == DP_TP  # a plain parameter: on the same mesh, replicated over tp
    assert model.model.norm.weight.placements == (Shard(0), Replicate())
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tie
    dp_rank = DP_TP.get_local_rank("dp")
    train(model, ref, token_batches, lm_loss, clip=1.0, dp_rank=dp_rank, dp_size=2, dp_mesh=DP_TP["dp"])


@FOUR_RANKS
def test_hsdp_on_a_replicate_x_shard_mesh_trains_as_one_process():
    model, ref = seeded(0, Stack), seeded(0, Stack)
    shard_stack(model, HSDP)
    assert model.blocks[0].up.weight.placements == (Replicate(), Shard(0))
    train(model, ref, stack_batches, mse, clip=0.5)


# ---- full state dicts

def test_a_full_state_dict_is_gathered_on_rank_0_only_and_loads_back_broadcast_from_rank_0():
    model = shard_stack(seeded(0, Stack), DP)
    ref = seeded(0, Stack)
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if RANK == 0:
        assert sd.keys() == ref.state_dict().keys()
        for k, v in ref.state_dict().items():
            assert not isinstance(sd[k], hp.DTensor) and torch.equal(sd[k], v), k
    else:
        assert sd == {}
    # Every rank's full copy without cpu_offload; the sharded one by default.
    everywhere = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    assert all(torch.equal(everywhere[k], v) for k, v in ref.state_dict().items())
    assert isinstance(get_model_state_dict(model)["blocks.0.up.weight"], hp.DTensor)
    with pytest.raises(RuntimeError, match="set_model_state_dict"):
        model.load_state_dict(ref.state_dict())  # whole tensors into shards: refused, naming the way in
    # Loading: only rank 0 has the weights (another model's); every rank gets its pieces.
    other = seeded(7, Stack)
    set_model_state_dict(model, other.state_dict() if RANK == 0 else {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    assert model.blocks[0].up.weight.placements == (Shard(0),)
    x, _ = stack_batches(0)
    with torch.no_grad():
        torch.testing.assert_close(model(my_rows(x, RANK, WORLD)), my_rows(other(x), RANK, WORLD))
    with pytest.raises(ValueError, match="full_state_dict must be True"):  # PyTorch's check, on every rank
        set_model_state_dict(model, {}, options=StateDictOptions(broadcast_from_rank0=True))


def test_a_trained_sharded_qwen3_saved_by_rank_0_loads_in_transformers_with_the_same_logits():
    from transformers import Qwen3ForCausalLM
    model, ref = seeded(0, lambda: tiny_qwen3(True)), seeded(0, lambda: tiny_qwen3(True))
    shard_layers(model, DP)
    train(model, ref, token_batches, lm_loss, steps=1)
    with pytest.raises(Exception, match="get_model_state_dict"):
        with tempfile.TemporaryDirectory() as d:
            model.save_pretrained(d)
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    ids = token_batches(9)[0]
    with torch.no_grad():
        logits = model(ids).logits
    if RANK == 0:
        assert sd["lm_head.weight"] is sd["model.embed_tokens.weight"]  # a tie is gathered once
        with tempfile.TemporaryDirectory() as d:
            model.save_pretrained(d, state_dict=sd)
            loaded = Qwen3ForCausalLM.from_pretrained(d, attn_implementation="eager")
            with torch.no_grad():
                torch.testing.assert_close(loaded(ids).logits, logits, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(loaded(ids).logits, ref(ids).logits, rtol=1e-4, atol=1e-5)
            assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
            from safetensors.torch import load_file
            saved = load_file(f"{d}/model.safetensors")  # the tied model's file holds the embedding alone
    else:
        saved = {}
    assert "lm_head.weight" not in saved
    # That file, broadcast from rank 0, loads into a new sharded model with the tie named once.
    fresh = shard_layers(seeded(5, lambda: tiny_qwen3(True)), DP)
    set_model_state_dict(fresh, saved, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    with torch.no_grad():
        torch.testing.assert_close(fresh(ids).logits, logits, rtol=1e-5, atol=1e-5)
