"""The user's torch.nn module is the one source of truth: tied parameters stay one parameter, each
call sees the module as the user left it, and a call that fails on any rank raises on every rank
and leaves every rank's module as it was.

Run SPMD under torchrun or hprun with test_tensor_parallel.py. The references, in the same job:
one process (the same module run whole here), transformers (a tied Qwen3), and PyTorch's own
``torch.distributed.tensor.parallel`` where PyTorch defines the behaviour (the same steps on a
copy, compared field by field).
"""
import copy

import pytest
import torch
import torch.distributed as dist
import torch.distributed.tensor as torch_dt
import torch.distributed.tensor.parallel as torch_tp
import torch.nn as nn
import torch.nn.functional as F

import hyper_parallel as hp
from hyper_parallel import (ColwiseParallel, ParallelStyle, PrepareModuleOutput, Replicate, RowwiseParallel, SequenceParallel,
                            Shard, init_device_mesh, parallelize_module)

torch.set_num_threads(1)
hp.init_process_group()
TP = hp.get_world_size()
RANK = hp.get_rank()
MESH = init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))
if not dist.is_initialized():
    dist.init_process_group("gloo")
TORCH_MESH = torch.distributed.device_mesh.init_device_mesh("cpu", (TP,))


class Lib:
    """One framework's names, so that one scenario runs on ours and on PyTorch's."""

    def __init__(self, ours):
        self.ours = ours
        self.mesh = MESH if ours else TORCH_MESH
        self.parallelize_module = parallelize_module if ours else torch_tp.parallelize_module
        self.distribute_module = hp.distribute_module if ours else torch_dt.distribute_module
        self.distribute_tensor = hp.distribute_tensor if ours else torch_dt.distribute_tensor
        self.Colwise = ColwiseParallel if ours else torch_tp.ColwiseParallel
        self.Rowwise = RowwiseParallel if ours else torch_tp.RowwiseParallel
        self.PrepareModuleOutput = PrepareModuleOutput if ours else torch_tp.PrepareModuleOutput
        self.Shard = Shard if ours else torch_dt.Shard
        self.Replicate = Replicate if ours else torch_dt.Replicate
        self.DTensor = hp.DTensor if ours else torch_dt.DTensor

    def style(self, apply):
        """A user's ParallelStyle whose work is ``apply(lib, module, mesh)``: ours define
        ``apply`` (the seed's name), PyTorch's ``_apply``."""
        lib = self
        if self.ours:
            class UserStyle(ParallelStyle):
                def apply(self, module, mesh):
                    return apply(lib, module, mesh)
        else:
            class UserStyle(torch_tp.ParallelStyle):
                def _apply(self, module, mesh):
                    return apply(lib, module, mesh)
        return UserStyle()


OURS, TORCH = Lib(True), Lib(False)
BOTH = pytest.mark.parametrize("lib", [OURS, TORCH], ids=["hyper_parallel", "pytorch"])


def seeded(seed, make):
    torch.manual_seed(seed)
    return make()


def full(t):
    return t.full_tensor() if isinstance(t, (hp.DTensor, torch_dt.DTensor)) else t


class Three(nn.Module):
    """Three linears (a, b, c) and a buffer; c is optional in forward (a user may remove it)."""

    def __init__(self, dim=8, hidden=4 * 4):
        super().__init__()
        self.a = nn.Linear(dim, hidden)
        self.b = nn.Linear(hidden, dim)
        self.c = nn.Linear(dim, dim)
        self.register_buffer("scale", torch.full((dim,), 0.5))

    def forward(self, x):
        y = self.b(F.relu(self.a(x))) * self.scale
        return y if self.c is None else self.c(y)


def expect_one_process_output(m, ref, seed, dtype=torch.float32):
    x = seeded(seed, lambda: torch.randn(3, 8, dtype=dtype))
    torch.testing.assert_close(full(m(x)), ref(x))


def module_state(m):
    """Everything a call may change, by identity: each module's parameters, buffers, children,
    requires_grad, hooks and attributes."""
    out = {}
    for name, sub in m.named_modules(remove_duplicate=False):
        out[name] = (
            type(sub),
            {k: (id(p), None if p is None else p.requires_grad) for k, p in sub._parameters.items()},
            {k: id(b) for k, b in sub._buffers.items()},
            {k: id(c) for k, c in sub._modules.items()},
            tuple(sorted((k, len(v)) for k, v in vars(sub).items() if k.startswith("_") and k.endswith("hooks") and isinstance(v, dict))),
            tuple(sorted(vars(sub))),
        )
    return out


# ---- 1. tied parameters

def tiny_qwen3(tie):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    config = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, head_dim=8, max_position_embeddings=64, tie_word_embeddings=tie,
                         attn_implementation="eager")
    return Qwen3ForCausalLM(config).eval()


def qwen3_plan(lm_head=None, embed=True):
    """transformers' Qwen3 tp plan in our styles, with the embedding split on the vocabulary as
    transformers' embedding_rowwise does: that is Rowwise with replicated ids;
    replicated_with_grad_allreduce (the per-head norms) SequenceParallel on the heads' dim with a
    local output; lm_head's colwise_gather_output Colwise with a Replicate output."""
    plan = {}
    if embed:
        plan["model.embed_tokens"] = RowwiseParallel(input_layouts=Replicate())
    for p in ("q_proj", "k_proj", "v_proj"):
        plan[f"model.layers.*.self_attn.{p}"] = ColwiseParallel()
    for p in ("q_norm", "k_norm"):
        plan[f"model.layers.*.self_attn.{p}"] = SequenceParallel(sequence_dim=2, use_local_output=True)
    plan["model.layers.*.self_attn.o_proj"] = RowwiseParallel()
    for p in ("gate_proj", "up_proj"):
        plan[f"model.layers.*.mlp.{p}"] = ColwiseParallel()
    plan["model.layers.*.mlp.down_proj"] = RowwiseParallel()
    plan["lm_head"] = lm_head if lm_head is not None else ColwiseParallel(output_layouts=Replicate())
    return plan


def test_tied_qwen3_embedding_stays_one_parameter_and_trains_as_transformers_in_one_process():
    model = seeded(0, lambda: tiny_qwen3(tie=True))
    ref = seeded(0, lambda: tiny_qwen3(tie=True))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    parallelize_module(model, MESH, qwen3_plan())
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.lm_head.weight.placements == (Shard(0),)
    assert len(list(model.parameters())) == len(list(ref.parameters()))
    ids = seeded(1, lambda: torch.randint(0, 64, (2, 8)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for step in range(3):
        for o in (opt, ref_opt):
            o.zero_grad()
        loss = model(ids, labels=ids).loss
        ref_loss = ref(ids, labels=ids).loss
        loss.backward()
        ref_loss.backward()
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6, msg=f"step {step}")
        if step == 0:
            # Both uses' gradients (the lookup and the projection) in the one parameter.
            torch.testing.assert_close(model.model.embed_tokens.weight.grad.full_tensor(), ref.model.embed_tokens.weight.grad,
                                       rtol=1e-5, atol=1e-6)
        opt.step()
        ref_opt.step()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(full(p.detach()), q.detach(), rtol=1e-4, atol=1e-5, msg=name)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_a_tie_given_different_placements_is_refused_naming_both_owners_and_changes_nothing():
    model = seeded(0, lambda: tiny_qwen3(tie=True))
    before = module_state(model)
    with pytest.raises(ValueError) as e:
        parallelize_module(model, MESH, qwen3_plan(lm_head=RowwiseParallel()))
    msg = str(e.value)
    assert "'model.embed_tokens.weight'" in msg and "'lm_head.weight'" in msg and "Shard(dim=1)" in msg, msg
    assert module_state(model) == before
    assert not any(isinstance(p, hp.DTensor) for p in model.parameters())
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_a_tie_with_one_owner_outside_the_plan_is_left_with_a_warning_as_pytorch_leaves_it():
    """PyTorch's own examples distribute the embedding and its tied output projection in separate
    calls and tie them again afterwards; the owner no style lays out keeps the full tensor."""
    ours = seeded(0, lambda: tiny_qwen3(tie=True))
    theirs = copy.deepcopy(ours)
    plan = {k: v for k, v in qwen3_plan().items() if k != "lm_head"}
    with pytest.warns(UserWarning, match="no longer tied"):
        parallelize_module(ours, MESH, plan)
    torch_tp.parallelize_module(theirs.model.embed_tokens, TORCH_MESH, torch_tp.RowwiseParallel(input_layouts=torch_dt.Replicate()))
    for model, dtensor in ((ours, hp.DTensor), (theirs, torch_dt.DTensor)):
        assert isinstance(model.model.embed_tokens.weight, dtensor)
        assert model.lm_head.weight is not model.model.embed_tokens.weight
        assert not isinstance(model.lm_head.weight, dtensor)
    torch.testing.assert_close(ours.lm_head.weight, theirs.lm_head.weight, rtol=0, atol=0)
    # Tied again as PyTorch's examples do, once the head is laid out the same way.
    parallelize_module(ours.lm_head, MESH, ColwiseParallel(output_layouts=Replicate()))
    ours.lm_head.weight = ours.model.embed_tokens.weight
    ids = torch.arange(8).reshape(1, 8) % 64
    ref = seeded(0, lambda: tiny_qwen3(tie=True))
    torch.testing.assert_close(ours(ids).logits, ref(ids).logits, rtol=1e-5, atol=1e-5)


class TiedLm(nn.Module):
    def __init__(self, vocab=4 * 4, dim=6):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(self.embed(ids))


def test_meta_init_then_to_empty_and_a_full_state_dict_keeps_the_tie():
    ref = seeded(2, TiedLm)
    with torch.device("meta"):
        model = TiedLm()
    assert model.head.weight is model.embed.weight
    parallelize_module(model, MESH, {"embed": RowwiseParallel(input_layouts=Replicate()),
                                     "head": ColwiseParallel(output_layouts=Replicate())})
    model.to_empty(device="cpu")
    hp.set_model_state_dict(model, ref.state_dict(), options=hp.StateDictOptions(full_state_dict=True))
    assert model.head.weight is model.embed.weight
    ids = torch.tensor([[0, 3, 15, 7]])
    torch.testing.assert_close(model(ids), ref(ids))
    assert hp.get_model_state_dict(model, options=hp.StateDictOptions(full_state_dict=True)).keys() == ref.state_dict().keys()


# ---- 2. nothing kept between calls: each call sees the module as the user left it

@BOTH
def test_requires_grad_stays_as_the_user_left_it_between_calls(lib):
    m = seeded(3, Three)
    m.c.bias.requires_grad_(False)
    lib.parallelize_module(m, lib.mesh, {"a": lib.Colwise()})
    # Between the calls: a frozen parameter in a planned module, a trainable one where a frozen
    # one was (in a module outside the plan), a frozen one in place in a parallelized module.
    m.b.weight = nn.Parameter(m.b.weight.detach().clone(), requires_grad=False)
    m.c.bias = nn.Parameter(m.c.bias.detach().clone())
    m.a.bias.requires_grad_(False)
    lib.parallelize_module(m, lib.mesh, {"b": lib.Rowwise()})
    got = {name: p.requires_grad for name, p in m.named_parameters()}
    assert got == {"a.weight": True, "a.bias": False, "b.weight": False, "b.bias": True, "c.weight": True, "c.bias": True}
    assert isinstance(m.b.weight, lib.DTensor)


def freeze_as_replicated(lib, module, mesh):
    module.weight = nn.Parameter(lib.distribute_tensor(module.weight.detach(), mesh, [lib.Replicate()]), requires_grad=False)
    return module


@BOTH
def test_a_frozen_dtensor_a_python_style_or_partition_fn_installs_stays_frozen(lib):
    m = seeded(3, Three)
    lib.parallelize_module(m, lib.mesh, {"a": lib.style(freeze_as_replicated), "b": lib.Rowwise()})
    assert isinstance(m.a.weight, lib.DTensor) and not m.a.weight.requires_grad
    m2 = seeded(3, Three)
    lib.distribute_module(m2.c, lib.mesh, lambda name, sub, mesh: freeze_as_replicated(lib, sub, mesh) if name == "" else None)
    assert isinstance(m2.c.weight, lib.DTensor) and not m2.c.weight.requires_grad
    assert isinstance(m2.c.bias, lib.DTensor) and m2.c.bias.requires_grad


@BOTH
def test_a_bias_removed_between_calls_stays_removed_and_the_output_equals_one_process(lib):
    m, ref = seeded(4, Three), seeded(4, Three)
    lib.parallelize_module(m, lib.mesh, {"a": lib.Colwise()})
    m.c.bias = None
    ref.c.bias = None
    del m.b.bias
    m.b.register_parameter("bias", None)
    ref.b.bias = None
    lib.parallelize_module(m, lib.mesh, {"b": lib.Rowwise()})
    assert m.c.bias is None and m.b.bias is None
    expect_one_process_output(m, ref, 5)


@BOTH
def test_a_removed_submodule_named_by_a_plan_warns_and_the_other_entries_apply(lib):
    m, ref = seeded(6, Three), seeded(6, Three)
    lib.parallelize_module(m, lib.mesh, {"a": lib.Colwise()})
    m.c = None
    ref.c = None
    with pytest.warns(UserWarning, match="'c'"):
        lib.parallelize_module(m, lib.mesh, {"c": lib.Colwise(), "b": lib.Rowwise()})
    assert m.c is None and m.b.weight.placements == (lib.Shard(1),)
    expect_one_process_output(m, ref, 7)


@BOTH
def test_a_replaced_submodule_is_parallelized_by_the_next_call(lib):
    m, ref = seeded(8, Three), seeded(8, Three)
    lib.parallelize_module(m, lib.mesh, {"a": lib.Colwise(), "b": lib.Rowwise()})
    m.b = seeded(9, lambda: nn.Linear(16, 8))
    ref.b = seeded(9, lambda: nn.Linear(16, 8))
    lib.parallelize_module(m, lib.mesh, {"b": lib.Rowwise()})
    assert m.b.weight.placements == (lib.Shard(1),)
    expect_one_process_output(m, ref, 10)


@BOTH
def test_a_module_converted_to_float64_between_calls_is_parallelized_as_it_is_now(lib):
    m, ref = seeded(11, Three), seeded(11, Three)
    lib.parallelize_module(m, lib.mesh, {"a": lib.Colwise()})
    m.double()
    ref.double()
    lib.parallelize_module(m, lib.mesh, {"b": lib.Rowwise()})
    assert m.scale.dtype == torch.float64 and m.b.weight.dtype == torch.float64
    expect_one_process_output(m, ref, 12, torch.float64)


# ---- 3. a failure on any rank raises on every rank and leaves every rank's module as it was

def failing_style(ranks):
    class Failing(ParallelStyle):
        """Changes the module (a parameter, a hook, an attribute), then raises on `ranks`."""

        def apply(self, module, mesh):
            module.weight = nn.Parameter(module.weight.detach() * 2, requires_grad=False)
            module.register_forward_hook(lambda *args: None)
            module.touched = True
            if RANK in ranks:
                raise ValueError(f"style failed on rank {RANK}")
            return module
    return Failing()


@pytest.mark.parametrize("ranks", ["all", "one"])
def test_a_failing_python_style_raises_on_every_rank_and_leaves_every_module_as_it_was(ranks):
    failing = set(range(TP)) if ranks == "all" else {TP - 1}
    m, ref = seeded(13, Three), seeded(13, Three)
    before = module_state(m)
    # A built-in style before it (its changes are undone) and one after it (no rank may reach its
    # scatter while another has failed).
    with pytest.raises(Exception) as e:
        parallelize_module(m, MESH, {"c": ColwiseParallel(), "a": failing_style(failing), "b": RowwiseParallel()})
    if RANK in failing:
        assert isinstance(e.value, ValueError) and f"style failed on rank {RANK}" in str(e.value)
    else:
        assert isinstance(e.value, RuntimeError), repr(e.value)
        assert f"failed on rank {TP - 1}" in str(e.value) and "'a'" in str(e.value), str(e.value)
    assert module_state(m) == before
    assert not hasattr(m.a, "touched") and not isinstance(m.c.weight, hp.DTensor)
    # The corrected plan then works, and equals one process.
    parallelize_module(m, MESH, {"c": ColwiseParallel(output_layouts=Replicate()), "a": ColwiseParallel(), "b": RowwiseParallel()})
    expect_one_process_output(m, ref, 14)


@pytest.mark.parametrize("ranks", ["all", "one"])
def test_a_failing_partition_fn_raises_on_every_rank_and_leaves_the_module_as_it_was(ranks):
    failing = set(range(TP)) if ranks == "all" else {0}
    m = seeded(15, Three)
    before = module_state(m)

    def partition_fn(name, sub, mesh):
        if name == "a":
            sub.weight = nn.Parameter(hp.distribute_tensor(sub.weight.detach(), mesh, [Shard(0)]))
        if name == "b" and RANK in failing:
            raise KeyError("partition_fn failed")

    with pytest.raises(Exception) as e:
        hp.distribute_module(m, MESH, partition_fn)
    if RANK in failing:
        assert isinstance(e.value, KeyError)
    else:
        assert isinstance(e.value, RuntimeError) and "failed on rank 0" in str(e.value) and "partition_fn" in str(e.value), str(e.value)
    assert module_state(m) == before
    hp.distribute_module(m, MESH, lambda name, sub, mesh: None)
    assert m.a.weight.placements == (Replicate(),)


# ---- 4. PyTorch's contract: what the root style returns, hooks in call order, copies

@BOTH
def test_parallelize_module_returns_what_the_root_style_returned(lib):
    class Wrapper(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)

    m = Three()
    out = lib.parallelize_module(m, lib.mesh, lib.style(lambda lib_, module, mesh: Wrapper(module)))
    assert isinstance(out, Wrapper) and out.inner is m


@BOTH
def test_a_user_hook_between_two_calls_sees_what_the_first_style_made(lib):
    m, ref = seeded(16, Three), seeded(16, Three)
    lib.parallelize_module(m, lib.mesh, {"a": lib.Colwise(use_local_output=False)})
    seen = []
    m.a.register_forward_hook(lambda mod, args, out: seen.append((isinstance(out, lib.DTensor), tuple(out.placements))))
    lib.parallelize_module(m, lib.mesh, {"a": lib.PrepareModuleOutput(output_layouts=lib.Shard(-1),
                                                                      desired_output_layouts=lib.Shard(-1))})
    lib.parallelize_module(m, lib.mesh, {"b": lib.Rowwise()})
    expect_one_process_output(m, ref, 17)
    assert seen == [(True, (lib.Shard(1),))]


def sequence_parallel_norm():
    norm = seeded(18, lambda: nn.LayerNorm(8))
    parallelize_module(norm, MESH, SequenceParallel())
    return norm


def expect_replicate_gradient_equal_to_one_process(norm):
    ref = seeded(18, lambda: nn.LayerNorm(8))
    with torch.no_grad():
        ref.weight.copy_(norm.weight.full_tensor())
        ref.bias.copy_(norm.bias.full_tensor())
    x = seeded(19, lambda: torch.randn(2, 2 * TP, 8))
    norm(x.chunk(TP, 1)[RANK]).full_tensor().pow(2).sum().backward()
    ref(x).pow(2).sum().backward()
    assert norm.weight.grad.placements == (Replicate(),)
    torch.testing.assert_close(norm.weight.grad.to_local(), ref.weight.grad)


@pytest.mark.parametrize("how", ["original", "deepcopy", "to_empty", "load_state_dict_assign"])
def test_copies_keep_the_reduction_of_a_replicated_parameters_gradient(how):
    norm = sequence_parallel_norm()
    if how == "deepcopy":
        norm = copy.deepcopy(norm)
    elif how == "to_empty":
        sd = {k: v.detach().clone() for k, v in norm.state_dict().items()}
        norm.to_empty(device="cpu")
        norm.load_state_dict(sd)
    elif how == "load_state_dict_assign":
        sd = {k: v.detach().clone() for k, v in norm.state_dict().items()}
        norm.load_state_dict(sd, assign=True)
    expect_replicate_gradient_equal_to_one_process(norm)
