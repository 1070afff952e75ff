"""init_device_mesh and DeviceMesh (PyTorch's torch.distributed.device_mesh)."""
from typing import Optional, Sequence

from . import _C
from ._runtime import init_process_group

DeviceMesh = _C.DeviceMesh


def init_device_mesh(device_type: str, mesh_shape: Sequence[int], *,
                     mesh_dim_names: Optional[Sequence[str]] = None) -> DeviceMesh:
    """A mesh over all ranks of the job, of shape ``mesh_shape`` (initialising the runtime first
    when nothing has). e.g. ``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))["tp"]``."""
    init_process_group(device_type)
    return _C._init_device_mesh(device_type, list(mesh_shape), list(mesh_dim_names or ()))
