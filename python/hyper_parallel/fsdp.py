"""fully_shard (PyTorch's FSDP2, ``torch.distributed.fsdp.fully_shard``) over the C++ library's
parameter groups: the same sharding, gathers and reductions as the C++ fully_shard, with a
torch.nn module's parameters swapped in its own forward hooks.

    from hyper_parallel import fully_shard, init_device_mesh
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], plan)          # optional: TP first
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, List, Optional, Tuple, Union

import torch
import torch.nn as nn
from torch.utils._pytree import tree_map

from . import _C
from ._snapshot import all_or_nothing
from .api import _guard_load_state_dict
from .device_mesh import DeviceMesh, world_mesh

_STATE = "_hp_fully_shard_state"


@dataclasses.dataclass(frozen=True)
class MixedPrecisionPolicy:
    """PyTorch's MixedPrecisionPolicy: the sharded parameters keep their dtype (and so does the
    optimizer's state); gathers, forward and backward run in ``param_dtype``, gradients are
    reduced in ``reduce_dtype`` (default: ``param_dtype``), floating-point outputs are cast to
    ``output_dtype``, and floating-point inputs to ``param_dtype`` when ``cast_forward_inputs``."""
    param_dtype: Optional[torch.dtype] = None
    reduce_dtype: Optional[torch.dtype] = None
    output_dtype: Optional[torch.dtype] = None
    cast_forward_inputs: bool = True


@dataclasses.dataclass
class OffloadPolicy:
    """PyTorch's OffloadPolicy: no offloading (the only policy supported)."""


@dataclasses.dataclass
class CPUOffloadPolicy(OffloadPolicy):
    """PyTorch's CPUOffloadPolicy; refused by fully_shard (parameters stay on their device)."""
    pin_memory: bool = True


class _State:
    """One fully_shard call: its C++ group, the slots (owner module, name) of each parameter (a
    tied one has several) and the sharded parameters the slots hold outside forward."""

    def __init__(self, group, slots: List[List[Tuple[nn.Module, str]]], params: List[nn.Parameter], fqns: List[str], mp_policy):
        self.group = group
        self.slots = slots
        self.params = params
        self.fqns = fqns
        self.mp_policy = mp_policy
        self.shows_unsharded = False  # unshard() put the gathered parameters in the slots
        self.in_forward = False  # the slots hold the forward's compute tensors

    def install(self, tensors):
        for slots, t in zip(self.slots, tensors):
            for owner, name in slots:
                owner._parameters[name] = t

    def check_slots(self):
        # A parameter replaced since fully_shard would be silently put back by the next
        # post-forward: refused by name instead (PyTorch's FSDP2 fails on it too).
        for slots, p, fqn in zip(self.slots, self.params, self.fqns):
            for owner, name in slots:
                if owner._parameters.get(name) is not p:
                    raise RuntimeError(f"hyper_parallel.fully_shard: parameter '{fqn}' was replaced or removed after fully_shard; "
                                       "change parameters before fully_shard, or load new values into the sharded ones "
                                       "(set_model_state_dict, or copy_ under torch.no_grad())")


def _state(module: nn.Module) -> Optional[_State]:
    return module.__dict__.get(_STATE)


def _cast(tree, dtype):
    return tree_map(lambda x: x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype else x, tree)


def _pre_forward(module, args, kwargs):
    state = _state(module)
    if not state.shows_unsharded:
        state.check_slots()
    if state.group.claim_root():
        # The root's first forward names each group under it by its path (FSDP2's lazy init):
        # a rank in another group's collective is then told which module's group it was.
        for name, sub in module.named_modules():
            inner = _state(sub)
            if inner is not None and inner is not state:
                inner.group.set_fqn(name)
    state.install(state.group.pre_forward())
    state.in_forward = True
    mp = state.mp_policy
    if mp.cast_forward_inputs and mp.param_dtype is not None:
        return _cast((args, kwargs), mp.param_dtype)
    return None


def _tensors_in(obj, out):
    """Every tensor in a module's output: inside tuples, lists, dicts (transformers' ModelOutput
    is one) and dataclasses. Backward gathers a resharded module's parameters again when these
    tensors' gradients arrive, so none may be missed."""
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _tensors_in(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _tensors_in(x, out)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            _tensors_in(getattr(obj, f.name, None), out)
    return out


def _post_forward(module, args, kwargs, output):
    # Also after a forward that raised (output None: an always_call hook): the slots get the
    # sharded parameters back when the forward had put compute tensors there (a pre-hook that
    # refused a replaced parameter leaves the user's slots as they are).
    state = _state(module)
    if state.in_forward:
        state.install(state.params)
        state.in_forward = False
        state.shows_unsharded = False
    state.group.post_forward(None if output is None else _tensors_in(output, []))
    if output is not None and state.mp_policy.output_dtype is not None:
        return _cast(output, state.mp_policy.output_dtype)
    return None


def _show_unsharded(state):
    # The gathered parameters (a gather in flight completed) in the slots, as FSDP2's unshard()
    # leaves them (plain, or TP DTensors), as Parameters sharing the gathered storage, until
    # reshard() or the next forward.
    state.install([nn.Parameter(t, requires_grad=p.requires_grad) for t, p in zip(state.group.unsharded_parameters(), state.params)])
    state.shows_unsharded = True


class UnshardHandle:
    """What ``FSDPModule.unshard(async_op=True)`` returns: ``wait()`` completes the gather and
    puts the gathered parameters in the module."""

    def __init__(self, state):
        self._state = state

    def wait(self) -> None:
        if self._state is not None:
            _show_unsharded(self._state)
            self._state = None


class FSDPModule:
    """The base fully_shard adds to a module's class (``FSDP<Class>``), as PyTorch's does:
    ``isinstance(m, FSDPModule)`` tells which modules were sharded."""

    def unshard(self, async_op: bool = False) -> Optional[UnshardHandle]:
        """Gathers this module's parameters now and puts them in its slots (read them whole, e.g.
        ``module.weight``), until ``reshard()`` or the end of its next forward; with ``async_op``
        starts the gather and returns a handle whose ``wait()`` completes it."""
        state = _state(self)
        state.group.unshard(async_op)
        if async_op:
            return UnshardHandle(state)
        _show_unsharded(state)
        return None

    def reshard(self) -> None:
        """Frees this module's gathered parameters and puts the sharded ones back in its slots
        (its next forward gathers them again)."""
        state = _state(self)
        state.install(state.params)
        state.shows_unsharded = False
        state.group.reshard()

    def set_requires_gradient_sync(self, requires_gradient_sync: bool, *, recurse: bool = True) -> None:
        """Whether the next backward passes reduce the gradients (False: each backward adds its
        gradients unreduced, and the first backward with True reduces them all at once: gradient
        accumulation at one reduction)."""
        for m in self._fsdp_modules(recurse):
            _state(m).group.set_requires_gradient_sync(bool(requires_gradient_sync))

    def set_reshard_after_backward(self, reshard_after_backward: bool, *, recurse: bool = True) -> None:
        """Whether backward frees the gathered parameters when done with them (True by default).
        False keeps them for the next forward, saving its gather during gradient accumulation; set
        it back to True for the last microbatch before an optimizer step."""
        for m in self._fsdp_modules(recurse):
            _state(m).group.set_reshard_after_backward(bool(reshard_after_backward))

    def set_is_last_backward(self, is_last_backward: bool) -> None:
        """PyTorch's: whether the next backward is the last before an optimizer step. There
        False only skips waiting on the GPU's reduce-scatter stream at the end of the backward;
        the gradients are the same either way. Here every backward completes its reductions at its
        end (there is no separate stream to skip a wait on), so the flag is taken, kept on the
        module as ``is_last_backward``, and changes no value: PyTorch's training loops run as
        they are."""
        if not isinstance(is_last_backward, bool):
            raise TypeError(f"hyper_parallel.FSDPModule.set_is_last_backward: expected a bool, got {type(is_last_backward).__name__}")
        self.__dict__["is_last_backward"] = is_last_backward

    def __deepcopy__(self, memo):
        raise TypeError(f"hyper_parallel.fully_shard: a fully_shard module ({type(self).__name__}) cannot be deep-copied (its "
                        "parameter groups are not copyable); copy the model before fully_shard, or save its state dict "
                        "(get_model_state_dict) and load it into a new one")

    def set_modules_to_forward_prefetch(self, modules: List["FSDPModule"]) -> None:
        """When this module's forward starts, also start gathering ``modules``' parameters."""
        groups = []
        for m in modules:
            if _state(m) is None:
                raise ValueError(f"hyper_parallel.FSDPModule.set_modules_to_forward_prefetch: a {type(m).__name__} is not "
                                 "a fully_shard module")
            groups.append(_state(m).group)
        _state(self).group.set_modules_to_forward_prefetch(groups)

    def _fsdp_modules(self, recurse):
        return [m for m in (self.modules() if recurse else [self]) if _state(m) is not None]


_FSDP_CLASSES = {}


def _fsdp_class(cls):
    if issubclass(cls, FSDPModule):
        return cls
    new = _FSDP_CLASSES.get(cls)
    if new is None:
        new = type(f"FSDP{cls.__name__}", (FSDPModule, cls), {"__module__": cls.__module__})
        _FSDP_CLASSES[cls] = new
    return new


def fully_shard(module: Union[nn.Module, List[nn.Module]], *, mesh: Optional[DeviceMesh] = None,
                reshard_after_forward: Optional[Union[bool, int]] = None, shard_placement_fn=None,
                mp_policy: MixedPrecisionPolicy = MixedPrecisionPolicy(), offload_policy: OffloadPolicy = OffloadPolicy(),
                ignored_params: Optional[Iterable[nn.Parameter]] = None) -> nn.Module:
    """PyTorch's fully_shard: shards the parameters of ``module`` that no earlier call on a
    submodule took over, as one group, over ``mesh`` (1-D; 2-D (replicate, shard) for HSDP;
    default: every rank) and makes its class ``FSDP<Class>`` (an FSDPModule). The group is
    gathered before its forward and its gradients reduce-scattered (averaged) in backward into the
    sharded parameters' ``.grad``, so ``torch.optim`` and ``clip_grad_norm_`` work unchanged.
    Apply it per block, then at the root. After ``parallelize_module(model, mesh["tp"], ...)``,
    pass ``mesh["dp"]`` of the same mesh: each TP parameter is sharded over dp on the first dim its
    TP placement leaves whole. Returns the module. A tied parameter stays one parameter.
    Refused by name, changing nothing: ``shard_placement_fn``, ``CPUOffloadPolicy``, an int
    ``reshard_after_forward``, several modules in one call."""
    if isinstance(module, (list, tuple)):
        if len(module) != 1:
            raise NotImplementedError("hyper_parallel.fully_shard: one call shards one module; several modules in one group "
                                      f"(got {len(module)}) are not supported: call fully_shard on each, or on their parent")
        module = module[0]
    if not isinstance(module, nn.Module):
        raise TypeError(f"hyper_parallel.fully_shard: module must be a torch.nn.Module, got {type(module).__name__}")
    if shard_placement_fn is not None:
        raise NotImplementedError("hyper_parallel.fully_shard: shard_placement_fn is not supported: each parameter is sharded "
                                  "on the first dim its TP placement leaves whole (dim 0 without TP)")
    if type(offload_policy).__name__ == "CPUOffloadPolicy":
        raise NotImplementedError("hyper_parallel.fully_shard: CPUOffloadPolicy is not supported: the sharded parameters "
                                  "stay on their device; pass OffloadPolicy() (the default)")
    if reshard_after_forward is not None and not isinstance(reshard_after_forward, bool):
        raise NotImplementedError("hyper_parallel.fully_shard: reshard_after_forward must be True, False or None; resharding to "
                                  f"a smaller world (an int, got {reshard_after_forward!r}) is not supported")
    if _state(module) is not None:
        raise ValueError(f"hyper_parallel.fully_shard: fully_shard was already applied to this {type(module).__name__}")
    if mesh is None:
        mesh = world_mesh(next((p.device.type for p in module.parameters()), "cpu"))
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"hyper_parallel.fully_shard: mesh must be a hyper_parallel DeviceMesh (hyper_parallel.init_device_mesh), "
                        f"got a {type(mesh).__module__}.{type(mesh).__name__}")
    ignored = {id(p) for p in (ignored_params or ())}
    # A module an inner call sharded is that call's, its whole subtree (its ignored parameters
    # too), as in FSDP2; so is every parameter it took over (a tie reached from outside).
    owners = []
    stack = [("", module)]
    while stack:
        prefix, m = stack.pop()
        inner = _state(m) if m is not module else None
        if inner is not None:
            ignored.update(id(p) for p in inner.params)
            continue
        owners.append((prefix, m))
        stack.extend(reversed([(f"{prefix}.{n}" if prefix else n, c) for n, c in m.named_children()]))
    seen_modules = set()
    originals, fqns, slots, index = [], [], [], {}
    for prefix, owner in owners:
        if id(owner) in seen_modules:
            continue
        seen_modules.add(id(owner))
        for name, p in owner._parameters.items():
            if p is None or id(p) in ignored:
                continue
            if id(p) in index:  # tied: one parameter in several slots
                slots[index[id(p)]].append((owner, name))
                continue
            index[id(p)] = len(originals)
            originals.append(p)
            fqns.append(f"{prefix}.{name}" if prefix else name)
            slots.append([(owner, name)])
    # Plans and shards every parameter, or raises changing nothing.
    group = _C._FullyShardGroup(originals, fqns, mesh, mp_policy.param_dtype, mp_policy.reduce_dtype,
                                True if reshard_after_forward is None else reshard_after_forward, None)
    params = group.sharded_parameters()
    mp = MixedPrecisionPolicy(mp_policy.param_dtype, mp_policy.reduce_dtype, mp_policy.output_dtype,
                              mp_policy.cast_forward_inputs)

    def install():
        state = _State(group, slots, params, fqns, mp)
        state.install(params)
        module.__dict__[_STATE] = state
        module.register_forward_pre_hook(_pre_forward, prepend=True, with_kwargs=True)
        module.register_forward_hook(_post_forward, with_kwargs=True, always_call=True)
        module.__class__ = _fsdp_class(type(module))

    all_or_nothing(module, install)
    # load_state_dict of whole tensors is refused, naming set_model_state_dict (as after parallelize_module).
    _guard_load_state_dict(module)
    return module
