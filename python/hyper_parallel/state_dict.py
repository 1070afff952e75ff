"""Model state dicts of parallelized and fully_shard models, with PyTorch's names and semantics
(``torch.distributed.checkpoint.state_dict``): sharded (DTensors, as ``model.state_dict()``), or
full, gathered one tensor at a time, on every rank or on rank 0 only (``cpu_offload``); and back,
from full tensors every rank has or that rank 0 broadcasts (``broadcast_from_rank0``).

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if get_rank() == 0:
        model.save_pretrained(path, state_dict=sd)   # transformers
"""
from __future__ import annotations

import dataclasses
import pickle
from typing import Any, Dict, Mapping, Optional

import torch
import torch.nn as nn

from . import _C
from ._runtime import get_rank
from .device_mesh import DeviceMesh, world_mesh
from .placement_types import Replicate


@dataclasses.dataclass
class StateDictOptions:
    """PyTorch's StateDictOptions, the fields for a model's state dict.

    ``full_state_dict``: whole tensors (gathered) instead of DTensors. ``cpu_offload``: the full
    tensors on rank 0 only, on the CPU (the other ranks get an empty dict). ``ignore_frozen_params``:
    leave out parameters that do not require grad. ``strict``: loading refuses missing or unexpected
    keys. ``broadcast_from_rank0``: loading takes rank 0's full state dict (the others may pass an
    empty one)."""
    full_state_dict: bool = False
    cpu_offload: bool = False
    ignore_frozen_params: bool = False
    strict: bool = True
    broadcast_from_rank0: bool = False


def _frozen_names(model: nn.Module):
    return {k for k, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}


def get_model_state_dict(model: nn.Module, *, options: Optional[StateDictOptions] = None) -> Dict[str, Any]:
    """PyTorch's get_model_state_dict: ``model.state_dict()`` (DTensors for distributed tensors);
    with ``full_state_dict`` each DTensor gathered whole, one at a time (a collective: call it on
    every rank), a tied tensor gathered once; with ``cpu_offload`` too, kept on rank 0 only, on
    the CPU, so no other rank ever holds more than the tensor being gathered."""
    options = options or StateDictOptions()
    sd = model.state_dict()
    if options.ignore_frozen_params:
        frozen = _frozen_names(model)
        sd = {k: v for k, v in sd.items() if k not in frozen}
    if not options.full_state_dict:
        return sd
    keep = not options.cpu_offload or get_rank() == 0
    # state_dict() detaches each entry: a tied parameter is known by its Parameter object.
    params = dict(model.named_parameters(remove_duplicate=False))
    out, gathered = {}, {}
    for k, v in sd.items():
        if _C._is_dtensor(v):
            key = id(params.get(k, v))
            if key not in gathered:
                full = v.full_tensor()
                gathered[key] = None if not keep else full.cpu() if options.cpu_offload else full
            v = gathered[key]
        elif options.cpu_offload and isinstance(v, torch.Tensor):
            v = v.cpu()
        if keep:
            out[k] = v
    return out


def set_model_state_dict(model: nn.Module, model_state_dict: Mapping[str, Any], *,
                         options: Optional[StateDictOptions] = None):
    """PyTorch's set_model_state_dict: loads ``model_state_dict`` into ``model``; returns what
    ``load_state_dict`` returns. With ``full_state_dict`` its plain tensors are whole ones (one
    process's), each cut to its DTensor's placements here (no communication); with
    ``broadcast_from_rank0`` too, rank 0's are broadcast one at a time and the other ranks' dicts
    are ignored (a collective: call it on every rank). A tied parameter may be given under one of
    its names (as transformers saves a tied model)."""
    options = options or StateDictOptions()
    if options.broadcast_from_rank0 and not options.full_state_dict:
        raise ValueError("hyper_parallel.set_model_state_dict: full_state_dict must be True when broadcast_from_rank0 is True")
    targets = dict(model.named_parameters(remove_duplicate=False))
    targets.update(dict(model.named_buffers(remove_duplicate=False)))
    if options.broadcast_from_rank0:
        model_state_dict = _broadcast_from_rank0(model_state_dict, targets)
    model_state_dict = _with_tied_names(model, model_state_dict)
    converted = {}
    for k, v in model_state_dict.items():
        t = targets.get(k)
        if (options.full_state_dict and t is not None and _C._is_dtensor(t) and isinstance(v, torch.Tensor)
                and not _C._is_dtensor(v)):
            v = _C._distribute_tensor(v.detach().to(device=t.device, dtype=t.dtype), t.device_mesh, list(_C._placements(t)), None)
        converted[k] = v
    return model.load_state_dict(converted, strict=options.strict)


def _with_tied_names(model, state_dict):
    """``state_dict`` with each tied parameter's missing names filled from a name it has (a
    transformers checkpoint of a tied model holds the embedding alone)."""
    names = {}
    for k, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(k)
    missing = {}
    for ks in names.values():
        present = next((k for k in ks if k in state_dict), None)
        if present is not None:
            missing.update({k: state_dict[present] for k in ks if k not in state_dict})
    return {**state_dict, **missing} if missing else state_dict


def _broadcast_from_rank0(state_dict, targets):
    mesh = world_mesh(next((t.device.type for t in targets.values()), "cpu"))
    # What rank 0 has: its keys, shapes and dtypes, broadcast as bytes.
    if get_rank() == 0:
        meta = pickle.dumps([(k, tuple(v.shape), v.dtype) for k, v in state_dict.items() if isinstance(v, torch.Tensor)])
        size = torch.tensor([len(meta)], dtype=torch.int64)
    else:
        size = torch.zeros(1, dtype=torch.int64)
    size = _broadcast(size, mesh)
    data = torch.frombuffer(bytearray(meta), dtype=torch.uint8) if get_rank() == 0 else torch.empty(int(size), dtype=torch.uint8)
    entries = pickle.loads(_broadcast(data, mesh).numpy().tobytes())
    out = {}
    for k, shape, dtype in entries:
        t = targets.get(k)
        device_of = t.device if t is not None else torch.device("cpu")
        v = state_dict[k].detach().to(device_of) if get_rank() == 0 else torch.empty(shape, dtype=dtype, device=device_of)
        out[k] = _broadcast(v, mesh)
    return out


def _broadcast(t: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    return _C._distribute_tensor(t.contiguous(), mesh, [Replicate()], 0).to_local()
