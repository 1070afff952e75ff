"""hyper_parallel for Python: the seed's tensor-parallel API, fully_shard (FSDP2) and model state
dicts over hyper_parallel's C++ DTensor.

    from hyper_parallel import (ColwiseParallel, RowwiseParallel, fully_shard, init_device_mesh,
                                parallelize_module)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])

A DTensor is a plain ``torch.Tensor`` whose ops run in C++ (``isinstance(t, hyper_parallel.DTensor)``
tells them apart); the styles are the C++ library's, applied to ``torch.nn`` modules.
"""
import torch as _torch

from ._build_info import TORCH_VERSION as _BUILT_FOR


def _minor(version):
    return tuple(version.split("+")[0].split(".")[:2])


# _C is compiled against one torch minor (it reaches torch's C++ internals): refuse another one by
# name before loading it, rather than fail on a missing symbol.
if _minor(_torch.__version__) != _minor(_BUILT_FOR):
    raise ImportError(
        f"hyper_parallel: this build of hyper_parallel._C was compiled against torch {_BUILT_FOR}, but torch "
        f"{_torch.__version__} is imported; rebuild it against this torch (scripts/setup.sh, or "
        "pip install --no-build-isolation . in this environment)")

from . import _C  # noqa: E402
from .placement_types import Partial, Placement, Replicate, Shard  # noqa: E402
from .device_mesh import DeviceMesh, init_device_mesh  # noqa: E402
from .dtensor import DTensor, distribute_tensor  # noqa: E402
from .style import (ColwiseParallel, NoParallel, ParallelStyle, PrepareModuleInput,  # noqa: E402
                    PrepareModuleInputOutput, PrepareModuleOutput, RowwiseParallel, SequenceParallel)
from .api import distribute_module, implicit_replication, loss_parallel, parallelize_module  # noqa: E402
from .fsdp import (CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, UnshardHandle,  # noqa: E402
                   fully_shard)
from .state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict  # noqa: E402
from .transformers_plan import plan_from_transformers  # noqa: E402
from .debug import CommDebugMode, ExplicitRedistribution  # noqa: E402
from ._runtime import (barrier, destroy_process_group, get_rank, get_world_size, init_process_group,  # noqa: E402
                       is_initialized)

__all__ = [
    "CPUOffloadPolicy", "ColwiseParallel", "CommDebugMode", "DTensor", "DeviceMesh", "ExplicitRedistribution", "FSDPModule",
    "MixedPrecisionPolicy", "NoParallel", "OffloadPolicy", "ParallelStyle", "Partial",
    "Placement", "PrepareModuleInput", "PrepareModuleInputOutput", "PrepareModuleOutput", "Replicate",
    "RowwiseParallel", "SequenceParallel", "Shard", "StateDictOptions", "UnshardHandle", "barrier", "destroy_process_group",
    "distribute_module", "distribute_tensor", "fully_shard", "get_model_state_dict", "get_rank", "get_world_size",
    "implicit_replication", "init_device_mesh", "init_process_group", "is_initialized", "loss_parallel",
    "parallelize_module", "plan_from_transformers", "set_model_state_dict",
]
