"""init_device_mesh and DeviceMesh (PyTorch's torch.distributed.device_mesh)."""
import threading

from . import _C
from ._runtime import init_process_group

DeviceMesh = _C.DeviceMesh

_scopes = threading.local()


def _enter(mesh):
    stack = getattr(_scopes, "stack", None)
    if stack is None:
        stack = _scopes.stack = []
    stack.append(_C._MeshScope(mesh))
    return mesh


def _exit(mesh, *exc):
    _scopes.stack.pop()
    return False


# `with mesh:` makes it the mesh parallelize_module uses when given none.
DeviceMesh.__enter__ = _enter
DeviceMesh.__exit__ = _exit


def init_device_mesh(device_type, mesh_shape, *, mesh_dim_names=None):
    """A mesh over all ranks of the job, of shape ``mesh_shape`` (initialising the runtime first
    when nothing has). e.g. ``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))["tp"]``."""
    init_process_group(device_type)
    return _C._init_device_mesh(device_type, list(mesh_shape), list(mesh_dim_names or ()))
