"""The ParallelStyles (PyTorch's torch.distributed.tensor.parallel.style, plus the seed's
NoParallel and reduce_dtype). ParallelStyle is an abstract class whose ``apply`` a subclass
writes in Python; the built-in styles hold the C++ library's styles, which do the work."""
import abc

from . import _C
from ._snapshot import all_or_nothing
from .placement_types import Placement, Replicate, Shard


class ParallelStyle(abc.ABC):
    """How one module is split. ``parallelize_module`` calls ``apply(module, device_mesh)`` on the
    modules its plan names, after writing ``src_data_rank`` into the style."""

    src_data_rank = 0

    @abc.abstractmethod
    def apply(self, module, device_mesh):
        """Changes ``module`` in place (parameters, hooks) for the 1-D ``device_mesh``; returns it."""


class _CppStyle(ParallelStyle):
    _cpp = None

    def apply(self, module, device_mesh):
        """This one style on ``module`` (what parallelize_module calls for a plan entry; a Python
        style may call it on its submodules). A failure leaves the module as it was."""
        all_or_nothing(module, lambda: _C._apply_style(self._cpp, module, device_mesh))
        return module

    @property
    def src_data_rank(self):
        return self._cpp.src_data_rank

    @src_data_rank.setter
    def src_data_rank(self, rank):
        self._cpp.src_data_rank = rank

    def __repr__(self):
        return self._cpp.describe()


def _one(p, default, where, name):
    if p is None:
        return default
    if not isinstance(p, Placement):
        raise TypeError(f"hyper_parallel.{where}: {name} must be a Placement (Shard, Replicate or Partial), got {type(p).__name__}")
    return p


def _layouts(v, where, name):
    """A Placement or None (one slot) or a sequence of them, as the C++ styles' list."""
    if v is None or isinstance(v, Placement):
        return [v]
    out = list(v)
    for p in out:
        if p is not None and not isinstance(p, Placement):
            raise TypeError(f"hyper_parallel.{where}: {name} must hold Placements or None, got {type(p).__name__}")
    return out


def _kwarg_layouts(v, where, name):
    if v is None:
        return None
    if not isinstance(v, dict):
        raise TypeError(f"hyper_parallel.{where}: {name} must be a dict of keyword name to Placement")
    return {k: _one(p, None, where, name) for k, p in v.items()}


class ColwiseParallel(_CppStyle):
    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output=True):
        self._cpp = _C._ColwiseParallel(_one(input_layouts, Replicate(), "ColwiseParallel", "input_layouts"),
                                        _one(output_layouts, Shard(-1), "ColwiseParallel", "output_layouts"),
                                        use_local_output)


class RowwiseParallel(_CppStyle):
    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output=True, reduce_dtype=None):
        self._cpp = _C._RowwiseParallel(_one(input_layouts, Shard(-1), "RowwiseParallel", "input_layouts"),
                                        _one(output_layouts, Replicate(), "RowwiseParallel", "output_layouts"),
                                        use_local_output, reduce_dtype)


class SequenceParallel(_CppStyle):
    def __init__(self, *, sequence_dim=1, use_local_output=False):
        self._cpp = _C._SequenceParallel(sequence_dim, use_local_output)


class NoParallel(_CppStyle):
    def __init__(self, *, input_layout=None, desired_input_layout=None, output_layout=None, use_local_output=True):
        w = "NoParallel"
        self._cpp = _C._NoParallel(_one(input_layout, Replicate(), w, "input_layout"),
                                   _one(desired_input_layout, Replicate(), w, "desired_input_layout"),
                                   _one(output_layout, Replicate(), w, "output_layout"), use_local_output)


class PrepareModuleInput(_CppStyle):
    def __init__(self, *, input_layouts=None, desired_input_layouts=None, input_kwarg_layouts=None,
                 desired_input_kwarg_layouts=None, use_local_output=False):
        w = "PrepareModuleInput"
        self._cpp = _C._PrepareModuleInput(
            None if input_layouts is None else _layouts(input_layouts, w, "input_layouts"),
            None if desired_input_layouts is None else _layouts(desired_input_layouts, w, "desired_input_layouts"),
            _kwarg_layouts(input_kwarg_layouts, w, "input_kwarg_layouts"),
            _kwarg_layouts(desired_input_kwarg_layouts, w, "desired_input_kwarg_layouts"), use_local_output)


class PrepareModuleOutput(_CppStyle):
    def __init__(self, *, output_layouts, desired_output_layouts, use_local_output=True, reduce_dtype=None):
        w = "PrepareModuleOutput"
        self._cpp = _C._PrepareModuleOutput(_layouts(output_layouts, w, "output_layouts"),
                                            _layouts(desired_output_layouts, w, "desired_output_layouts"),
                                            use_local_output, reduce_dtype)


class PrepareModuleInputOutput(_CppStyle):
    def __init__(self, *, input_layouts=None, desired_input_layouts=None, input_kwarg_layouts=None,
                 desired_input_kwarg_layouts=None, use_local_input=False, output_layouts, desired_output_layouts,
                 use_local_output=True, reduce_dtype=None):
        w = "PrepareModuleInputOutput"
        self._cpp = _C._PrepareModuleInputOutput(
            None if input_layouts is None else _layouts(input_layouts, w, "input_layouts"),
            None if desired_input_layouts is None else _layouts(desired_input_layouts, w, "desired_input_layouts"),
            _layouts(output_layouts, w, "output_layouts"), _layouts(desired_output_layouts, w, "desired_output_layouts"),
            _kwarg_layouts(input_kwarg_layouts, w, "input_kwarg_layouts"),
            _kwarg_layouts(desired_input_kwarg_layouts, w, "desired_input_kwarg_layouts"),
            use_local_input, use_local_output, reduce_dtype)
