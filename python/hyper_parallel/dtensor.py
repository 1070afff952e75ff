"""Our DTensors in Python: plain torch.Tensor objects (their ops run in C++), told apart by
``isinstance(t, hyper_parallel.DTensor)``, with PyTorch DTensor's methods patched onto
torch.Tensor (a clear error on other tensors), a repr that never communicates, and pickling
refused by name."""
from __future__ import annotations

import copy

from typing import Optional, Sequence

import torch

from . import _C
from .placement_types import Replicate, as_list


class _DTensorMeta(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, torch.Tensor) and _C._is_dtensor(obj)

    def __subclasscheck__(cls, sub):
        return sub is cls


class DTensor(metaclass=_DTensorMeta):
    """``isinstance(t, DTensor)`` is true exactly for hyper_parallel's DTensors (which are
    torch.Tensor objects). ``DTensor.from_local`` builds one from each rank's piece."""

    @staticmethod
    def from_local(local_tensor: torch.Tensor, device_mesh=None, placements=None, *, run_check: bool = False,
                   shape: Optional[Sequence[int]] = None, stride: Optional[Sequence[int]] = None) -> torch.Tensor:
        """PyTorch's DTensor.from_local: each rank's piece; the mesh of an enclosing ``with mesh:``
        when none is given, Replicate on every mesh dim when no placements are."""
        if device_mesh is None:
            device_mesh = _C._current_mesh()
        if device_mesh is None:
            raise ValueError("hyper_parallel.DTensor.from_local: device_mesh is required (init_device_mesh(...)), or call "
                             "it inside `with mesh:`")
        if placements is None:
            placements = [Replicate()] * device_mesh.ndim
        return _C._from_local(local_tensor, device_mesh, as_list(placements, "DTensor.from_local"), run_check,
                              None if shape is None else list(shape), None if stride is None else list(stride))


def distribute_tensor(tensor: torch.Tensor, device_mesh=None, placements=None, *,
                      src_data_rank: Optional[int] = 0) -> torch.Tensor:
    """Splits or replicates a whole tensor over ``device_mesh`` (Replicate on every mesh dim when
    ``placements`` is None); ``src_data_rank`` as PyTorch's (None: no communication)."""
    if device_mesh is None:
        device_mesh = _C._current_mesh()  # the mesh of an enclosing `with mesh:`, as PyTorch's
    if device_mesh is None:
        raise ValueError("hyper_parallel.distribute_tensor: device_mesh is required (init_device_mesh(...)), or call it "
                         "inside `with mesh:`")
    if placements is None:
        placements = [Replicate()] * device_mesh.ndim
    return _C._distribute_tensor(tensor, device_mesh, as_list(placements, "distribute_tensor"), src_data_rank)


# ---- PyTorch DTensor's methods on torch.Tensor

def _not_a_dtensor(what):
    return AttributeError(f"hyper_parallel: '{what}' is defined for hyper_parallel DTensors; this tensor is a plain "
                          "torch.Tensor")


def _placements(self):
    if not _C._is_dtensor(self):
        raise _not_a_dtensor("placements")
    return _C._placements(self)


def _device_mesh(self):
    if not _C._is_dtensor(self):
        raise _not_a_dtensor("device_mesh")
    return _C._device_mesh(self)


def _to_local(self, *, grad_placements=None):
    return _C._to_local(self, None if grad_placements is None else as_list(grad_placements, "DTensor.to_local"))


def _full_tensor(self, *, grad_placements=None):
    if grad_placements is None:
        return _C._full_tensor(self)
    # PyTorch's: the gradient arrives laid out as grad_placements say, then flows back through the
    # gather (e.g. Partial: reduce-scattered to a Shard input).
    return _redistribute(self, None, [Replicate()] * _device_mesh(self).ndim).to_local(grad_placements=grad_placements)


def _redistribute(self, device_mesh=None, placements=None, *, async_op=False, forward_dtype=None, backward_dtype=None):
    if placements is None:
        raise ValueError("hyper_parallel.DTensor.redistribute: placements are required")
    # forward_dtype/backward_dtype as PyTorch's: the forward collective runs in forward_dtype (the
    # result keeps it), the backward one in backward_dtype, the gradient returns in this dtype.
    out = _C._redistribute(self, device_mesh, as_list(placements, "DTensor.redistribute"), forward_dtype, backward_dtype)
    # A new tensor sharing the data, as PyTorch's (requires_grad_ on it must not reach `self`).
    return self.detach() if out is self else out


_plain_repr = torch.Tensor.__repr__
_plain_reduce_ex = torch.Tensor.__reduce_ex__
_plain_deepcopy = torch.Tensor.__deepcopy__


def _repr(self, *args, **kwargs):
    # The spec and this rank's shape: printing on one rank must never wait for the others.
    if _C._is_dtensor(self):
        return _C._describe(self)
    return _plain_repr(self, *args, **kwargs)


def _reduce_ex(self, protocol):
    if _C._is_dtensor(self):
        raise TypeError("hyper_parallel: a DTensor cannot be pickled or saved with torch.save (it has no storage, "
                        "only this rank's piece); gather the whole model on rank 0 with "
                        "sd = hyper_parallel.get_model_state_dict(model, options=hyper_parallel.StateDictOptions("
                        "full_state_dict=True, cpu_offload=True)) on every rank, then on rank 0 torch.save(sd, path) or "
                        "model.save_pretrained(dir, state_dict=sd); one tensor with "
                        "torch.save(t.full_tensor()); from C++, the sharded checkpoints (save_sharded, save_train_state, "
                        "save_hf_checkpoint)")
    return _plain_reduce_ex(self, protocol)


def _copy(self):
    # copy.copy of a DTensor as PyTorch's: a leaf sharing the local data, with requires_grad kept
    # (pickling, which copy.copy would use otherwise, is refused).
    if not _C._is_dtensor(self) or type(self) is not torch.Tensor:
        return copy._reconstruct(self, None, *self.__reduce_ex__(4))  # what copy.copy does without __copy__
    out = self.detach()
    out.requires_grad_(self.requires_grad)
    return out


def _deepcopy(self, memo):
    if not _C._is_dtensor(self) or type(self) is not torch.Tensor:
        return _plain_deepcopy(self, memo)  # nn.Parameter has its own, which clones
    if id(self) in memo:
        return memo[id(self)]
    with torch.no_grad():
        out = self.clone()
    out.requires_grad_(self.requires_grad)
    memo[id(self)] = out
    return out


_plain_parameter_deepcopy = torch.nn.Parameter.__deepcopy__


def _parameter_deepcopy(self, memo):
    # The copy of a distributed parameter reduces its gradient to its placements as the original
    # does (distribute_module's gradient hook, which torch's copy does not carry).
    fresh = id(self) not in memo
    out = _plain_parameter_deepcopy(self, memo)
    if fresh and _C._is_dtensor(self) and out.requires_grad:
        _C._reduce_gradient_to_placements(out)
    return out


torch.nn.Parameter.__deepcopy__ = _parameter_deepcopy
torch.Tensor.placements = property(_placements)
torch.Tensor.device_mesh = property(_device_mesh)
torch.Tensor.to_local = _to_local
torch.Tensor.full_tensor = _full_tensor
torch.Tensor.redistribute = _redistribute
torch.Tensor.__repr__ = _repr
torch.Tensor.__reduce_ex__ = _reduce_ex
torch.Tensor.__deepcopy__ = _deepcopy
torch.Tensor.__copy__ = _copy
