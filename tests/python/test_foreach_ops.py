"""torch's foreach ops on lists of hyper_parallel DTensors: what torch.optim runs with foreach=True
and what clip_grad_norm_ runs, against the same optimizer or call on whole tensors in this process.

A pointwise foreach op whose elements are each laid out alike runs torch's own kernel once over the
local pieces; any other list runs each element's own op, matched by schema; a list refused
anywhere is left as it was. Run SPMD, e.g.
``torchrun --standalone --nproc-per-node 2 -m pytest tests/python/test_foreach_ops.py``.
"""
import pytest
import torch
import torch.nn as nn

import hyper_parallel as hp
from hyper_parallel import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh

torch.set_num_threads(1)
hp.init_process_group()
TP = hp.get_world_size()
RANK = hp.get_rank()
MESH = init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))

# A Colwise + Rowwise MLP's parameters, and an uneven one (10 rows over 4 ranks).
LAYOUT = [((8 * TP, 16), [Shard(0)]), ((8 * TP,), [Shard(0)]), ((16, 8 * TP), [Shard(1)]), ((16,), [Replicate()]),
          ((10, 3), [Shard(0)])]


def whole(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) for shape, _ in LAYOUT]


def distributed_params(seed):
    params = []
    for t, g, (_, pl) in zip(whole(seed), whole(seed + 1), LAYOUT):
        p = nn.Parameter(distribute_tensor(t, MESH, pl))
        p.grad = distribute_tensor(g, MESH, pl)
        params.append(p)
    return params


def plain_params(seed):
    params = []
    for t, g in zip(whole(seed), whole(seed + 1)):
        p = nn.Parameter(t.clone())
        p.grad = g.clone()
        params.append(p)
    return params


OPTIMIZERS = {
    "SGD": lambda ps, **kw: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01, **kw),
    "Adam": lambda ps, **kw: torch.optim.Adam(ps, lr=0.01, **kw),
    "AdamW": lambda ps, **kw: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, amsgrad=True, **kw),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_with_foreach_equals_one_process_bit_for_bit(name):
    ours, ref, per_op = distributed_params(1), plain_params(1), distributed_params(1)
    opt = OPTIMIZERS[name](ours, foreach=True)
    opt_ref = OPTIMIZERS[name](ref, foreach=True)
    opt_per_op = OPTIMIZERS[name](per_op, foreach=False)  # one op per tensor: each op's own rule
    for _ in range(3):
        opt.step()
        opt_ref.step()
        opt_per_op.step()
    for p, r, q in zip(ours, ref, per_op):
        assert p.placements == q.placements
        assert torch.equal(p.full_tensor(), r), name
        assert torch.equal(p.full_tensor(), q.full_tensor()), name
    for p, r in zip(ours, ref):
        for key, value in opt.state[p].items():
            if isinstance(value, DTensor):
                assert value.placements == p.placements, key
                assert torch.equal(value.full_tensor(), opt_ref.state[r][key]), key


def test_clip_grad_norm_with_foreach_equals_one_process():
    ours, ref = distributed_params(3), plain_params(3)
    total = torch.nn.utils.clip_grad_norm_(ours, max_norm=0.5, foreach=True)
    total_ref = torch.nn.utils.clip_grad_norm_(ref, max_norm=0.5, foreach=True)
    assert torch.allclose(total.full_tensor() if isinstance(total, DTensor) else total, total_ref, rtol=1e-6)
    for p, r in zip(ours, ref):
        assert torch.allclose(p.grad.full_tensor(), r.grad, rtol=1e-6, atol=1e-7)


def partial_of(t):
    # Rank 0 holds t, the others zeros: a Partial(sum) whose value is t.
    return DTensor.from_local(t.clone() if RANK == 0 else torch.zeros_like(t), MESH, [Partial()])


def test_lists_laid_out_otherwise_run_each_element_matched_by_schema():
    g = torch.Generator().manual_seed(5)
    a, b, c = (torch.rand(4 * TP, 3, generator=g) + 0.5 for _ in range(3))
    # A Partial element: pow is not linear, so the element is reduced first.
    mixed = [partial_of(a), distribute_tensor(b, MESH, [Shard(0)])]
    for got, want in zip(torch._foreach_pow(mixed, 3.0), [a.pow(3.0), b.pow(3.0)]):  # _foreach_pow.Scalar
        assert torch.allclose(got.full_tensor(), want)
    for got, want in zip(torch._foreach_pow(2.0, mixed), [torch.pow(2.0, a), torch.pow(2.0, b)]):  # .ScalarAndTensor
        assert torch.allclose(got.full_tensor(), want)
    # In place, self Shard(0) and the others replicated: each element redistributes its own
    # operands. One value per element from a tensor (addcmul_.Tensor).
    selfs = [distribute_tensor(a, MESH, [Shard(0)]), distribute_tensor(b, MESH, [Shard(0)])]
    ones = [distribute_tensor(c, MESH, [Replicate()]), distribute_tensor(a, MESH, [Replicate()])]
    twos = [distribute_tensor(b, MESH, [Replicate()]), distribute_tensor(c, MESH, [Replicate()])]
    torch._foreach_addcmul_(selfs, ones, twos, torch.tensor([0.5, -2.0]))
    assert torch.allclose(selfs[0].full_tensor(), a + 0.5 * c * b)
    assert torch.allclose(selfs[1].full_tensor(), b - 2.0 * a * c)
    assert [s.placements for s in selfs] == [(Shard(0),), (Shard(0),)]


def test_a_refused_list_is_left_as_it_was():
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(4 * TP, 3, generator=g), torch.randn(4, 3, generator=g)
    d = distribute_tensor(x, MESH, [Shard(0)])
    plain = y.clone()  # a parameter this rank keeps whole, outside the parallel plan
    scale = distribute_tensor(torch.tensor(0.5), MESH, [Replicate()])  # as clip_grad_norm_'s coefficient
    with pytest.raises(Exception) as refused:
        torch._foreach_mul_([d, plain], scale)
    assert "DTensor" in str(refused.value)
    assert torch.equal(d.full_tensor(), x)
    assert torch.equal(plain, y)
    # The same list of DTensors alone is scaled (one kernel over the local pieces).
    torch._foreach_mul_([d], scale)
    assert torch.equal(d.full_tensor(), x * 0.5)


def test_reductions_and_out_overloads_are_not_taken_for_pointwise():
    g = torch.Generator().manual_seed(9)
    a = torch.randn(4 * TP, 3, generator=g)
    d = distribute_tensor(a, MESH, [Shard(0)])
    # _foreach_norm reduces each tensor: the per-element path, a norm of the whole tensor.
    (norm,) = torch._foreach_norm([d], 2)
    assert torch.allclose(norm.full_tensor() if isinstance(norm, DTensor) else norm, a.norm())
    # powsum (torch >= 2.13) is a reduction too: never one kernel over the local pieces.
    if hasattr(torch.ops.aten, "_foreach_powsum"):
        try:
            (got,) = torch._foreach_powsum([d], 2)
        except NotImplementedError as e:
            assert "_foreach_powsum" in str(e)
        else:
            assert torch.allclose(got.full_tensor() if isinstance(got, DTensor) else got, a.pow(2).sum())
    out = [distribute_tensor(torch.zeros(()), MESH, [Replicate()])]
    with pytest.raises(NotImplementedError, match="out= overload"):
        torch.ops.aten._foreach_norm.Scalar_out([d], 2, None, out=out)
