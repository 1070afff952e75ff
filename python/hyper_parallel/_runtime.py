"""Joining the job: under torchrun (its agent's store), after torch.distributed (its store), or
under hprun (our own rendezvous)."""
import torch.distributed as _dist

from . import _C


def init_process_group(device_type: str = "cpu") -> None:
    """Joins the job once (later calls do nothing). With torch.distributed initialised first, our
    keys live in its store; otherwise the environment torchrun or hprun set is read (under
    torchrun every rank joins the agent's store as a client). The collective timeout is
    HP_TIMEOUT_S seconds (300 by default)."""
    if _C._is_initialized():
        return
    if _dist.is_available() and _dist.is_initialized():
        store = _dist.distributed_c10d._get_default_store()
        _C._init_process_group_with_store(store, _dist.get_rank(), _dist.get_world_size(), device_type)
    else:
        _C._init_process_group(device_type)


def is_initialized() -> bool:
    """Whether this process has joined the job (init_process_group or init_device_mesh ran)."""
    return _C._is_initialized()


def get_rank() -> int:
    """This process's rank in the job."""
    return _C._get_rank()


def get_world_size() -> int:
    """The number of processes in the job."""
    return _C._get_world_size()


def barrier() -> None:
    """Waits until every rank of the job reaches it."""
    _C._barrier()


def destroy_process_group() -> None:
    """Leaves the job (every rank calls it): meshes and DTensors made before can no longer
    communicate. torch.distributed's own process group, if any, is left alone."""
    _C._destroy_process_group()
