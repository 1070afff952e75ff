"""hyper_parallel's runtime beside torch.distributed in one job, in the order
HP_TEST_ORDER names: "torch_first" (ours joins torch's store under a hyper_parallel/ prefix) or
"ours_first" (under torchrun both join the agent's store; under hprun torch's env:// rank 0 shares
our store's server, which is multi-tenant). Run under torchrun and hprun. Both then
communicate, and their results equal the sums computed here."""
import os

import torch
import torch.distributed as dist

import hyper_parallel as hp

torch.set_num_threads(1)
ORDER = os.environ.get("HP_TEST_ORDER", "torch_first")


def test_both_runtimes_work_in_either_order():
    if ORDER == "torch_first":
        dist.init_process_group("gloo")
        hp.init_process_group()
    else:
        hp.init_process_group()
        dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    assert (hp.get_world_size(), hp.get_rank()) == (world, rank)
    mesh = hp.init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    partial = hp.DTensor.from_local(torch.full((3,), float(rank + 1)), mesh, [hp.Partial()])
    torch.testing.assert_close(partial.full_tensor(), torch.full((3,), world * (world + 1) / 2))
    t = torch.full((2,), float(rank))
    dist.all_reduce(t)
    torch.testing.assert_close(t, torch.full((2,), world * (world - 1) / 2))
    dist.barrier()
    dist.destroy_process_group()
