"""init_device_mesh and DeviceMesh (PyTorch's torch.distributed.device_mesh)."""
from typing import Optional, Sequence

from . import _C
from ._runtime import get_world_size, init_process_group

DeviceMesh = _C.DeviceMesh


def init_device_mesh(device_type: str, mesh_shape: Sequence[int], *,
                     mesh_dim_names: Optional[Sequence[str]] = None) -> DeviceMesh:
    """A mesh over all ranks of the job, of shape ``mesh_shape`` (initialising the runtime first
    when nothing has). e.g. ``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))["tp"]``."""
    init_process_group(device_type)
    return _C._init_device_mesh(device_type, list(mesh_shape), list(mesh_dim_names or ()))


_WORLD_MESHES = {}


def world_mesh(device_type: str) -> DeviceMesh:
    """The 1-D mesh of every rank for ``device_type``, made once per process (fully_shard's
    default mesh, the one full state dicts are broadcast over)."""
    if device_type not in _WORLD_MESHES:
        _WORLD_MESHES[device_type] = init_device_mesh(device_type, (get_world_size(),))
    return _WORLD_MESHES[device_type]
