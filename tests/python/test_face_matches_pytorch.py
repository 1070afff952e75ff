"""The face shaped like PyTorch's, tested side by side with PyTorch's own classes in one job:
placements and meshes compare, hash and print as PyTorch's, ``with mesh:``, the styles'
attributes and repr, a custom style written for PyTorch (``_apply``) running unchanged,
non-tensor arguments passing the hooks as the same objects, and saving a parallelized
transformers model through the way the error names.

Run SPMD under torchrun or hprun with test_tensor_parallel.py.
"""
import copy
import pathlib
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.distributed.tensor as torch_dt
import torch.distributed.tensor.parallel as torch_tp
import torch.nn as nn

import hyper_parallel as hp

torch.set_num_threads(1)
hp.init_process_group()
TP = hp.get_world_size()
if not dist.is_initialized():
    dist.init_process_group("gloo")


def test_equal_meshes_are_one_set_member_as_in_pytorch():
    ours = [hp.init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",)) for _ in range(2)]
    theirs = [torch.distributed.device_mesh.init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",)) for _ in range(2)]
    for a, b in (ours, theirs):
        assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert (ours[0].ndim, ours[0].shape, ours[0].mesh_dim_names, ours[0].size(), ours[0].get_local_rank()) == \
           (theirs[0].ndim, tuple(theirs[0].shape), theirs[0].mesh_dim_names, theirs[0].size(), theirs[0].get_local_rank())


def test_with_mesh_nests_and_is_the_default_mesh_inside():
    mesh = hp.init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))
    m = nn.Linear(4, 2 * TP)
    with mesh as entered:
        assert entered == mesh
        with mesh:
            pass
        hp.parallelize_module(m, parallelize_plan=hp.ColwiseParallel())
    assert m.weight.placements == (hp.Shard(0),)
    with pytest.raises(RuntimeError, match="no device_mesh given"):
        hp.parallelize_module(nn.Linear(4, 2 * TP), parallelize_plan=hp.ColwiseParallel())


def side_by_side():
    """(ours, PyTorch's) for each style, built with the same arguments."""
    return [
        (hp.ColwiseParallel(), torch_tp.ColwiseParallel()),
        (hp.ColwiseParallel(input_layouts=hp.Shard(1), output_layouts=hp.Replicate(), use_local_output=False),
         torch_tp.ColwiseParallel(input_layouts=torch_dt.Shard(1), output_layouts=torch_dt.Replicate(), use_local_output=False)),
        (hp.RowwiseParallel(output_layouts=hp.Shard(1)), torch_tp.RowwiseParallel(output_layouts=torch_dt.Shard(1))),
        (hp.SequenceParallel(sequence_dim=2), torch_tp.SequenceParallel(sequence_dim=2)),
        (hp.PrepareModuleInput(input_layouts=(hp.Shard(0), None), desired_input_layouts=(hp.Replicate(), None)),
         torch_tp.PrepareModuleInput(input_layouts=(torch_dt.Shard(0), None), desired_input_layouts=(torch_dt.Replicate(), None))),
        (hp.PrepareModuleOutput(output_layouts=hp.Replicate(), desired_output_layouts=hp.Shard(1)),
         torch_tp.PrepareModuleOutput(output_layouts=torch_dt.Replicate(), desired_output_layouts=torch_dt.Shard(1))),
    ]


@pytest.mark.parametrize("index", range(6))
def test_a_styles_settings_are_its_attributes_and_its_repr_as_in_pytorch(index):
    ours, theirs = side_by_side()[index]
    assert repr(ours) == repr(theirs)
    for name in ("input_layouts", "output_layouts", "desired_input_layouts", "desired_output_layouts", "use_local_output",
                 "sequence_sharding", "input_kwarg_layouts", "desired_input_kwarg_layouts"):
        if hasattr(theirs, name):
            assert repr(getattr(ours, name)) == repr(getattr(theirs, name)), name


def test_a_changed_attribute_is_what_the_style_applies():
    mesh = hp.init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))
    style = hp.ColwiseParallel()
    style.use_local_output = False
    m = hp.parallelize_module(nn.Linear(4, 2 * TP), mesh, style)
    assert isinstance(m(torch.randn(3, 4)), hp.DTensor)


def test_a_style_written_for_pytorch_with_apply_underscore_runs_unchanged():
    mesh = hp.init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))

    class ShardWeightOnly(hp.ParallelStyle):  # PyTorch's pattern: only _apply
        def _apply(self, module, device_mesh):
            module.weight = nn.Parameter(hp.distribute_tensor(module.weight.detach(), device_mesh, [hp.Shard(0)]))
            return module

    torch.manual_seed(0)
    m, ref = nn.Linear(4, 2 * TP), nn.Linear(4, 2 * TP)
    ref.load_state_dict(m.state_dict())
    hp.parallelize_module(m, mesh, ShardWeightOnly())
    assert m.weight.placements == (hp.Shard(0),)
    torch.testing.assert_close(m.weight.full_tensor(), ref.weight)
    with pytest.raises(TypeError):
        hp.ParallelStyle()  # still abstract


def test_saving_a_parallelized_model_names_the_way_out_and_that_way_gives_one_process_weights():
    from transformers import Qwen3Config, Qwen3ForCausalLM
    # A folder of this rank's own (pytest's tmp_path is shared by the ranks, which race to clean it).
    with tempfile.TemporaryDirectory() as d:
        save_and_reload(pathlib.Path(d), Qwen3Config, Qwen3ForCausalLM)


def save_and_reload(tmp_path, Qwen3Config, Qwen3ForCausalLM):
    config = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=4, head_dim=8, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    mesh = hp.init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))
    hp.parallelize_module(model, mesh, {"model.layers.*.mlp.gate_proj": hp.ColwiseParallel(),
                                        "model.layers.*.mlp.up_proj": hp.ColwiseParallel(),
                                        "model.layers.*.mlp.down_proj": hp.RowwiseParallel()})
    with pytest.raises(Exception) as e:
        model.save_pretrained(tmp_path / "direct")
    assert "hyper_parallel" in str(e.value) and "get_model_state_dict" in str(e.value), str(e.value)
    sd = hp.get_model_state_dict(model, options=hp.StateDictOptions(full_state_dict=True, cpu_offload=True))
    if hp.get_rank() != 0:
        assert sd == {}  # rank 0 only
        return
    model.save_pretrained(tmp_path / "full", state_dict=sd)
    loaded = Qwen3ForCausalLM.from_pretrained(tmp_path / "full").state_dict()
    assert loaded.keys() == ref.keys()
    for k, v in ref.items():
        assert torch.equal(loaded[k], v), k


PLACEMENTS = [(lambda m: m.Shard(1)), (lambda m: m.Shard(0)), (lambda m: m.Replicate()), (lambda m: m.Partial()),
              (lambda m: m.Partial("max"))]


@pytest.mark.parametrize("make", range(len(PLACEMENTS)))
def test_placements_compare_hash_and_print_as_pytorchs(make):
    ours, theirs = PLACEMENTS[make](hp), PLACEMENTS[make](torch_dt)
    assert repr(ours) == repr(theirs)
    for query in (lambda p: p.is_shard(), lambda p: p.is_shard(1), lambda p: p.is_replicate(), lambda p: p.is_partial()):
        assert query(ours) == query(theirs)
    others = [PLACEMENTS[i](hp) for i in range(len(PLACEMENTS))]
    their_others = [PLACEMENTS[i](torch_dt) for i in range(len(PLACEMENTS))]
    assert [ours == o for o in others] == [theirs == o for o in their_others]
    assert hash(ours) == hash(PLACEMENTS[make](hp)) and len({ours, PLACEMENTS[make](hp)}) == 1
    assert isinstance(ours, hp.Placement)
    if ours.is_shard():
        assert ours.dim == theirs.dim
    if ours.is_partial():
        assert ours.reduce_op == theirs.reduce_op


def test_a_dtensors_placements_are_the_python_classes():
    mesh = hp.init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))
    t = hp.distribute_tensor(torch.randn(2 * TP, 3), mesh, [hp.Shard(0)])
    assert type(t.placements[0]) is hp.Shard and t.placements == (hp.Shard(0),)
    p = hp.DTensor.from_local(torch.ones(2), mesh, [hp.Partial("max")])
    assert type(p.placements[0]) is hp.Partial and p.placements[0].reduce_op == "max"
    with pytest.raises(ValueError, match="reduce_op"):
        hp.Partial("mean")


class TakesAnything(nn.Module):
    """A linear whose forward takes and returns Python objects beside the tensor."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 2 * TP)
        self.seen = None

    def forward(self, x, spec, *, options):
        self.seen = (spec, options)
        return self.proj(x), spec


def test_non_tensor_inputs_and_outputs_reach_the_module_and_hooks_as_the_same_objects():
    mesh = hp.init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))
    m = TakesAnything()
    # Prepare the first input (the hook rebuilds the arguments) and the output tuple (a None
    # layout passes the second item through).
    hp.parallelize_module(m, mesh, hp.PrepareModuleInputOutput(
        input_layouts=(hp.Replicate(), None), desired_input_layouts=(hp.Replicate(), None), use_local_input=True,
        output_layouts=(hp.Replicate(), None), desired_output_layouts=(hp.Replicate(), None)))
    hooked = []
    m.register_forward_hook(lambda mod, args, out: hooked.append((args[1], out[1])))
    spec = (1, [2, 3], 10 ** 30, 0.5)  # a tuple, a list, an int beyond 64 bits, a float
    options = {"mode": "fast", "depth": 2.5}
    y, back = m(torch.randn(3, 4), spec, options=options)
    assert m.seen[0] is spec and m.seen[1] is options
    assert back is spec and hooked[0][0] is spec and hooked[0][1] is spec
    assert isinstance(y, torch.Tensor) and not isinstance(y, hp.DTensor)


def test_a_layout_given_for_a_non_tensor_is_refused_by_name():
    mesh = hp.init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))
    m = TakesAnything()
    hp.parallelize_module(m, mesh, hp.PrepareModuleInput(input_layouts=(hp.Replicate(), hp.Shard(0)),
                                                         desired_input_layouts=(hp.Replicate(), hp.Replicate())))
    with pytest.raises(AssertionError, match="input 1 .* is not a tensor"):
        m(torch.randn(3, 4), (1, 2), options={})


def libs():
    ours = hp.init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))
    theirs = torch.distributed.device_mesh.init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))
    return [(hp, hp, ours), (torch_tp, torch_dt, theirs)]


def test_a_subclass_of_a_built_in_style_runs_its_override_as_in_pytorch():
    for tp_lib, dt_lib, mesh in libs():
        calls = []

        class MyColwise(tp_lib.ColwiseParallel):  # PyTorch's pattern: override _apply
            def _apply(self, module, device_mesh):
                calls.append("_apply")
                return super()._apply(module, device_mesh)

        torch.manual_seed(0)
        m, ref = nn.Linear(4, 2 * TP), nn.Linear(4, 2 * TP)
        ref.load_state_dict(m.state_dict())
        tp_lib.parallelize_module(m, mesh, MyColwise(output_layouts=dt_lib.Replicate()))
        assert calls == ["_apply"], tp_lib.__name__
        assert m.weight.placements == (dt_lib.Shard(0),)
        x = torch.randn(3, 4)
        torch.testing.assert_close(m(x), ref(x))
    calls = []

    class Seeded(hp.RowwiseParallel):  # the seed's pattern: override apply
        def apply(self, module, device_mesh):
            calls.append("apply")
            return super().apply(module, device_mesh)

    hp.parallelize_module(nn.Sequential(nn.Linear(2 * TP, 3)), libs()[0][2], {"0": Seeded()})
    assert calls == ["apply"]


def test_distribute_module_functions_get_the_deepcopy_they_run_for_as_in_pytorch():
    for tp_lib, dt_lib, mesh in libs():
        seen = []
        m = nn.Sequential(nn.ReLU())
        distribute = hp.distribute_module if tp_lib is hp else torch_dt.distribute_module
        distribute(m, mesh, None, lambda mod, inputs, mesh_: seen.append(mod))
        copied = copy.deepcopy(m)
        copied(torch.randn(2, 2))
        assert seen[-1] is copied, tp_lib.__name__
        m(torch.randn(2, 2))
        assert seen[-1] is m, tp_lib.__name__


def test_with_mesh_is_the_default_mesh_of_distribute_tensor_as_in_pytorch():
    for tp_lib, dt_lib, mesh in libs():
        with mesh:
            t = dt_lib.distribute_tensor(torch.arange(4.0 * TP), placements=[dt_lib.Shard(0)])
        assert t.placements == (dt_lib.Shard(0),) and t.to_local().shape == (4,)


@pytest.mark.skipif(TP != 4, reason="a dp2 x tp2 mesh needs 4 ranks")
def test_dropout_masks_agree_within_each_tp_group_and_differ_across_dp_groups_seeded_differently():
    """PyTorch asks for one seed on every rank of a DTensor's mesh; the key check covers only that
    mesh, so data-parallel groups seeded differently draw different masks."""
    mesh = hp.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp = mesh.get_local_rank("dp")
    torch.manual_seed(1000 + dp)  # alike within each tp group, different across dp
    x = hp.distribute_tensor(torch.ones(8, 8), mesh["tp"], [hp.Replicate()], src_data_rank=None)
    mask = torch.nn.functional.dropout(x, 0.5).full_tensor()
    every = [torch.empty_like(mask) for _ in range(TP)]
    dist.all_gather(every, mask)
    for r in range(TP):
        assert torch.equal(every[r], mask) == (r // 2 == dp), (r, dp)
    assert (mask == 0).any() and (mask != 0).any()


def test_copy_copy_of_a_dtensor_shares_its_local_data_as_in_pytorch():
    ours_mesh = hp.init_device_mesh("cpu", (TP,))
    theirs_mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (TP,))
    x = torch.randn(2 * TP, 3)
    for lib, mesh in ((hp, ours_mesh), (torch_dt, theirs_mesh)):
        d = lib.distribute_tensor(x, mesh, [lib.Shard(0)]).requires_grad_()
        c = copy.copy(d)
        assert isinstance(c, lib.DTensor) and c.is_leaf and c.requires_grad
        assert c.placements == d.placements
        assert c.to_local().data_ptr() == d.to_local().data_ptr()
    plain = torch.randn(3)
    assert torch.equal(copy.copy(plain), plain)


def test_redistribute_to_the_same_placements_is_a_new_tensor_sharing_the_data_as_in_pytorch():
    ours_mesh = hp.init_device_mesh("cpu", (TP,))
    theirs_mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (TP,))
    for lib, mesh in ((hp, ours_mesh), (torch_dt, theirs_mesh)):
        x = lib.distribute_tensor(torch.ones(2 * TP, 3), mesh, [lib.Shard(0)])
        y = x.redistribute(mesh, [lib.Shard(0)])
        assert y is not x and y.to_local().data_ptr() == x.to_local().data_ptr()
        y.requires_grad_()
        assert not x.requires_grad


class OffsetEmbedding(nn.Embedding):
    """OPT's learned positional embedding: the ids move before the lookup."""

    def forward(self, ids):
        return super().forward(ids + 2)


@pytest.mark.parametrize("options", [dict(padding_idx=3), dict(scale_grad_by_freq=True), dict(offset=True)],
                         ids=["padding_idx", "scale_grad_by_freq", "ids_moved_by_the_module"])
def test_a_vocabulary_sharded_embedding_gets_pytorchs_gradient_in_its_own_rows(options):
    # Qwen3's vocabulary, a small width: each rank's gradient is its rows (Shard(0)), equal to
    # PyTorch's RowwiseParallel's and to one process's, the padding row none, ids counted over the
    # batch.
    vocab, dim = 151936, 8
    torch.manual_seed(0)
    offset = options.pop("offset", False)
    base = (OffsetEmbedding if offset else nn.Embedding)(vocab, dim, **options)
    ids = torch.randint(vocab - 2, (2, 6))
    ids[0, :3] = 3  # the padding row, and one id three times
    ours, theirs, whole = copy.deepcopy(base), copy.deepcopy(base), copy.deepcopy(base)
    hp.parallelize_module(ours, hp.init_device_mesh("cpu", (TP,)), hp.RowwiseParallel(input_layouts=hp.Replicate()))
    torch_tp.parallelize_module(theirs, torch.distributed.device_mesh.init_device_mesh("cpu", (TP,)),
                                torch_tp.RowwiseParallel(input_layouts=torch_dt.Replicate()))
    w = torch.randn(2, 6, dim)
    for m in (ours, theirs, whole):
        (m(ids) * w).sum().backward()
    g = ours.weight.grad
    rows = len(torch.arange(vocab).chunk(TP)[hp.get_rank()])
    assert g.placements == (hp.Shard(0),) and tuple(g.to_local().shape) == (rows, dim)
    # PyTorch's backward makes the whole vocabulary's gradient on every rank (Replicate, all-reduced
    # whole); ours makes this rank's rows.
    assert tuple(theirs.weight.grad.to_local().shape) == (vocab, dim), theirs.weight.grad.placements
    assert torch.allclose(g.full_tensor(), theirs.weight.grad.full_tensor())
    assert torch.allclose(g.full_tensor(), whole.weight.grad)
