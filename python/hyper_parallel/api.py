"""parallelize_module, distribute_module and loss_parallel (PyTorch's), and the guard that sends a
full (unsharded) state dict through set_model_state_dict. parallelize_module: the C++
engine resolves the plan's FQN globs, validates the whole plan on every rank, then applies the
styles to the torch.nn module through the platform seam."""
from __future__ import annotations

import contextlib
import weakref
from typing import Callable, Dict, Iterator, Optional, Union

import torch

from . import _C
from ._snapshot import all_or_nothing
from .style import ParallelStyle, _CppStyle


def _check_style(style, where):
    if not isinstance(style, ParallelStyle):
        raise TypeError(f"hyper_parallel.parallelize_module: {where} must be a ParallelStyle, got {type(style).__name__}")


def _cpp_or_python(style):
    # A subclass of a built-in style that overrides apply or _apply runs as written (PyTorch calls
    # the override too); an unchanged built-in style goes to the C++ engine as it is.
    return style._cpp_style() if isinstance(style, _CppStyle) and not style._overridden() else style


def parallelize_module(module: torch.nn.Module, device_mesh=None,
                       parallelize_plan: Union[ParallelStyle, Dict[str, ParallelStyle], None] = None, *,
                       src_data_rank: Optional[int] = 0) -> torch.nn.Module:
    """Applies ``parallelize_plan`` (a ParallelStyle, or a dict of FQN glob to ParallelStyle) to
    ``module`` over the 1-D ``device_mesh`` (or the mesh of an enclosing ``with mesh:``); returns
    the module, or what a single style's ``apply`` returned. Nothing is kept between calls: each
    call sees the module as it is. A parameter tied between modules (an output projection sharing
    the embedding's weight) stays one parameter when its owners' styles give it the same
    placements, and is refused otherwise. A failure on any rank raises on every rank and leaves
    the module as it was on every rank."""
    if parallelize_plan is None:
        plan = None
    elif isinstance(parallelize_plan, dict):
        plan = []
        for path, style in parallelize_plan.items():
            if not isinstance(path, str):
                raise TypeError(f"hyper_parallel.parallelize_module: plan keys must be module paths (str), got {type(path).__name__}")
            _check_style(style, f"the plan value for '{path}'")
        for path, style in parallelize_plan.items():
            style.src_data_rank = src_data_rank
            plan.append((path, _cpp_or_python(style)))
    else:
        _check_style(parallelize_plan, "parallelize_plan")
        parallelize_plan.src_data_rank = src_data_rank
        plan = _cpp_or_python(parallelize_plan)
    result = all_or_nothing(module, lambda: _C._parallelize_module(module, device_mesh, plan, src_data_rank))
    _guard_load_state_dict(module)
    return result


# ---- state dicts

_guarded = weakref.WeakSet()
_before_load = weakref.WeakKeyDictionary()


def _before_loading(module, state_dict, prefix, *_):
    # module.load_state_dict would copy a whole tensor into a DTensor parameter's shard: refused,
    # naming the helper that distributes it first.
    for name, t in list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False)):
        v = state_dict.get(prefix + name)
        if v is not None and _C._is_dtensor(t) and isinstance(v, torch.Tensor) and not _C._is_dtensor(v):
            raise RuntimeError(
                f"hyper_parallel: load_state_dict got a plain tensor for '{prefix + name}', which is a DTensor "
                f"({t.placements}) in this parallelized module; load a full (unsharded) state dict with "
                "hyper_parallel.set_model_state_dict(module, state_dict, options=StateDictOptions(full_state_dict=True)), "
                "or a state dict of DTensors (module.state_dict())")
    _before_load[module] = dict(module.named_parameters(remove_duplicate=False))


def _after_loading(module, incompatible_keys):
    # load_state_dict(assign=True) puts new parameter objects in: each one that replaced a
    # distributed parameter reduces its gradient to its placements as the old one did.
    before = _before_load.pop(module, {})
    armed = set()
    for name, p in module.named_parameters(remove_duplicate=False):
        old = before.get(name)
        if (old is not None and p is not old and id(p) not in armed and _C._is_dtensor(p) and _C._is_dtensor(old)
                and old.requires_grad and p.requires_grad):
            _C._reduce_gradient_to_placements(p)
            armed.add(id(p))


def _guard_load_state_dict(module):
    if module not in _guarded:
        module.register_load_state_dict_pre_hook(_before_loading)
        module.register_load_state_dict_post_hook(_after_loading)
        _guarded.add(module)


def distribute_module(module: torch.nn.Module, device_mesh=None, partition_fn: Optional[Callable] = None,
                      input_fn: Optional[Callable] = None, output_fn: Optional[Callable] = None, *,
                      src_data_rank: Optional[int] = 0) -> torch.nn.Module:
    """PyTorch's distribute_module, run by the C++ one: ``partition_fn(name, submodule, mesh)`` on
    every submodule, then every parameter and buffer not yet a DTensor becomes a Replicate one,
    then ``input_fn(module, inputs, mesh)`` and ``output_fn(module, outputs, mesh)`` become its
    forward hooks. A module is distributed once (RuntimeError on the second call). A failure on any
    rank (a ``partition_fn`` raising on one) raises on every rank and leaves the module as it was."""
    if device_mesh is None:
        device_mesh = _C._current_mesh()  # the mesh of an enclosing `with mesh:`, as PyTorch's
    if device_mesh is None:
        raise ValueError("hyper_parallel.distribute_module: device_mesh is required, or call it inside `with mesh:`")
    all_or_nothing(module, lambda: _C._distribute_module(module, device_mesh, partition_fn, input_fn, output_fn, src_data_rank))
    return module


@contextlib.contextmanager
def implicit_replication() -> Iterator[None]:
    """PyTorch's implicit_replication (torch.distributed.tensor.experimental): inside it, a plain
    tensor mixed with DTensors in an op is taken as a Replicate DTensor: the same on every rank,
    which is the caller's promise. Outside it such an op is refused."""
    guard = _C._ImplicitReplication()
    try:
        yield
    finally:
        del guard


@contextlib.contextmanager
def loss_parallel() -> Iterator[None]:
    """PyTorch's loss_parallel: cross_entropy / nll_loss on logits sharded on the class dim
    (Shard(-1), e.g. a ColwiseParallel lm_head with use_local_output=False) with plain targets.
    Inside it the loss ops take their plain targets and class weights as replicated (the same
    on every rank), as PyTorch's do; any other op mixing a per-rank plain tensor with a DTensor is
    still refused. The parallel loss itself needs no context here: a class-sharded input is
    always reduced exactly once."""
    guard = _C._LossParallel()
    try:
        yield
    finally:
        del guard
