"""The ParallelStyles (PyTorch's torch.distributed.tensor.parallel.style, plus the seed's
NoParallel and reduce_dtype). ParallelStyle is an abstract class a user subclasses in Python; the
built-in styles keep their settings as attributes, as PyTorch's do, and hand them to the C++
library's styles, which do the work, each time they are applied."""
from __future__ import annotations

import abc
from typing import Optional, Sequence, Union

import torch

from . import _C
from ._snapshot import all_or_nothing
from .placement_types import Placement, Replicate, Shard

Layouts = Union[Placement, None, Sequence[Optional[Placement]]]


class ParallelStyle(abc.ABC):
    """How one module is split. ``parallelize_module`` writes ``src_data_rank`` into the style,
    then calls ``apply(module, device_mesh)`` on the modules its plan names.

    Subclass it with ``apply`` (the seed's name) or ``_apply`` (PyTorch's): either one is enough,
    and each calls the other, so a style written for PyTorch runs unchanged.
    e.g. ``class Frozen(ParallelStyle): def apply(self, module, mesh): ...; return module``"""

    src_data_rank: Optional[int] = 0

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # A style written for PyTorch defines _apply (PyTorch's name) and not apply: its _apply is
        # its apply, whatever a base class's apply does.
        if "_apply" in cls.__dict__ and "apply" not in cls.__dict__:
            cls.apply = lambda self, module, device_mesh: self._apply(module, device_mesh)

    @abc.abstractmethod
    def apply(self, module: torch.nn.Module, device_mesh) -> torch.nn.Module:
        """Changes ``module`` in place (parameters, hooks) for the 1-D ``device_mesh``; returns it
        (or a module wrapping it)."""

    def _apply(self, module: torch.nn.Module, device_mesh) -> torch.nn.Module:
        """PyTorch's name for ``apply``."""
        return self.apply(module, device_mesh)


class _CppStyle(ParallelStyle):
    """A built-in style: its attributes are the settings; ``_cpp_style()`` makes the C++ style
    they describe for one use (so the attributes are the only copy, ``src_data_rank`` too)."""

    def __init__(self):
        self._cpp_style()  # a bad combination of settings is refused now, as PyTorch refuses it

    def _make_cpp(self):
        raise NotImplementedError

    def _cpp_style(self):
        s = self._make_cpp()
        s.src_data_rank = self.src_data_rank
        return s

    def apply(self, module: torch.nn.Module, device_mesh) -> torch.nn.Module:
        """This one style on ``module`` (what parallelize_module does for a plan entry; a Python
        style may call it on its submodules). A failure leaves the module as it was."""
        all_or_nothing(module, lambda: _C._apply_style(self._cpp_style(), module, device_mesh))
        return module

    # The built-in work under PyTorch's name too, so that a subclass's _apply may call super()._apply.
    _apply = apply

    def _overridden(self) -> bool:
        """Whether a subclass replaced apply or _apply: then parallelize_module runs it (Python)."""
        return type(self).apply is not _CppStyle.apply or type(self)._apply is not _CppStyle._apply

    def _fields(self):
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._fields())})"


def _one(p, default, where, name):
    if p is None:
        return default
    if not isinstance(p, Placement):
        raise TypeError(f"hyper_parallel.{where}: {name} must be a Placement (Shard, Replicate or Partial), got {type(p).__name__}")
    return p


def _layouts(v, where, name):
    """A Placement or None (one slot) or a sequence of them, as a tuple (PyTorch's attribute)."""
    if v is None or isinstance(v, Placement):
        return (v,)
    out = tuple(v)
    for p in out:
        if p is not None and not isinstance(p, Placement):
            raise TypeError(f"hyper_parallel.{where}: {name} must hold Placements or None, got {type(p).__name__}")
    return out


def _kwarg_layouts(v, where, name):
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise TypeError(f"hyper_parallel.{where}: {name} must be a dict of keyword name to Placement")
    return {k: _one(p, None, where, name) for k, p in v.items()}


class ColwiseParallel(_CppStyle):
    """Shards an ``nn.Linear`` on its output features (weight and bias ``Shard(0)``) or an
    ``nn.Embedding`` on its embedding dim (weight ``Shard(1)``).

    Keyword Args:
        input_layouts (Placement, optional): the layout of the module's input, made ``Replicate()``
            before the module runs (default ``Replicate()``).
        output_layouts (Placement, optional): the output's layout (default ``Shard(-1)``).
        use_local_output (bool): return this rank's piece as a plain tensor (default True).

    e.g. ``parallelize_module(m, tp_mesh, {"w1": ColwiseParallel()})``"""

    def __init__(self, *, input_layouts: Optional[Placement] = None, output_layouts: Optional[Placement] = None,
                 use_local_output: bool = True):
        self.input_layouts = (_one(input_layouts, Replicate(), "ColwiseParallel", "input_layouts"),)
        self.output_layouts = (_one(output_layouts, Shard(-1), "ColwiseParallel", "output_layouts"),)
        self.desired_input_layouts = (Replicate(),)
        self.use_local_output = use_local_output
        super().__init__()

    def _make_cpp(self):
        return _C._ColwiseParallel(self.input_layouts[0], self.output_layouts[0], self.use_local_output)

    def _fields(self):
        return [("input_layouts", self.input_layouts), ("output_layouts", self.output_layouts),
                ("use_local_output", self.use_local_output)]


class RowwiseParallel(_CppStyle):
    """Shards an ``nn.Linear`` on its input features (weight ``Shard(1)``, bias ``Replicate()``)
    or an ``nn.Embedding`` on its vocabulary (weight ``Shard(0)``, looked up with a mask so that
    the partial sums are exact).

    Keyword Args:
        input_layouts (Placement, optional): the input's layout (default ``Shard(-1)``; an
            embedding looks up replicated ids: give ``Replicate()``).
        output_layouts (Placement, optional): the output's layout: ``Replicate()`` (default,
            an all-reduce) or ``Shard(d)`` (a reduce-scatter).
        use_local_output (bool): return this rank's piece as a plain tensor (default True).
        reduce_dtype (torch.dtype, optional): reduce the partial sums in this dtype (the seed's).

    e.g. ``parallelize_module(m, tp_mesh, {"w2": RowwiseParallel()})``"""

    def __init__(self, *, input_layouts: Optional[Placement] = None, output_layouts: Optional[Placement] = None,
                 use_local_output: bool = True, reduce_dtype: Optional[torch.dtype] = None):
        self.input_layouts = (_one(input_layouts, Shard(-1), "RowwiseParallel", "input_layouts"),)
        self.output_layouts = (_one(output_layouts, Replicate(), "RowwiseParallel", "output_layouts"),)
        self.desired_input_layouts = (Shard(-1),)  # Replicate() for an embedding, when applied
        self.use_local_output = use_local_output
        self.reduce_dtype = reduce_dtype
        super().__init__()

    def _make_cpp(self):
        return _C._RowwiseParallel(self.input_layouts[0], self.output_layouts[0], self.use_local_output, self.reduce_dtype)

    def _fields(self):
        fields = [("input_layouts", self.input_layouts), ("output_layouts", self.output_layouts),
                  ("use_local_output", self.use_local_output)]
        return fields + ([("reduce_dtype", self.reduce_dtype)] if self.reduce_dtype is not None else [])


class SequenceParallel(_CppStyle):
    """For norms, dropout and other modules that work on any piece of the sequence: parameters
    replicated, a plain input taken as ``Shard(sequence_dim)`` (a DTensor input is kept).

    Keyword Args:
        sequence_dim (int): the input's sequence dimension (default 1).
        use_local_output (bool): return this rank's piece as a plain tensor (default False).

    e.g. ``parallelize_module(m, tp_mesh, {"norm": SequenceParallel()})``"""

    def __init__(self, *, sequence_dim: int = 1, use_local_output: bool = False):
        self.sequence_sharding = (Shard(sequence_dim),)
        self.use_local_output = use_local_output
        super().__init__()

    @property
    def sequence_dim(self) -> int:
        return self.sequence_sharding[0].dim

    def _make_cpp(self):
        return _C._SequenceParallel(self.sequence_dim, self.use_local_output)

    def _fields(self):
        return [("sequence_dim", self.sequence_dim), ("use_local_output", self.use_local_output)]


class NoParallel(_CppStyle):
    """Keeps every parameter whole (``Replicate()``) for modules that must not be split (routers,
    norms without sequence parallelism); the input is laid out by ``input_layout`` and made
    ``desired_input_layout``, the output laid out by ``output_layout`` (the seed's style).

    e.g. ``parallelize_module(m, tp_mesh, {"router": NoParallel()})``"""

    def __init__(self, *, input_layout: Optional[Placement] = None, desired_input_layout: Optional[Placement] = None,
                 output_layout: Optional[Placement] = None, use_local_output: bool = True):
        w = "NoParallel"
        self.input_layout = _one(input_layout, Replicate(), w, "input_layout")
        self.desired_input_layout = _one(desired_input_layout, Replicate(), w, "desired_input_layout")
        self.output_layout = _one(output_layout, Replicate(), w, "output_layout")
        self.use_local_output = use_local_output
        super().__init__()

    def _make_cpp(self):
        return _C._NoParallel(self.input_layout, self.desired_input_layout, self.output_layout, self.use_local_output)

    def _fields(self):
        return [("input_layout", self.input_layout), ("desired_input_layout", self.desired_input_layout),
                ("output_layout", self.output_layout), ("use_local_output", self.use_local_output)]


class PrepareModuleInput(_CppStyle):
    """Converts a module's inputs at its boundary; its parameters are untouched. Slot ``i`` of
    ``input_layouts`` is the layout of positional input ``i`` (``None``: it passes through),
    ``desired_input_layouts[i]`` what forward gets; the kwarg dicts do the same for named inputs.

    e.g. ``PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None))``"""

    def __init__(self, *, input_layouts: Layouts = None, desired_input_layouts: Layouts = None,
                 input_kwarg_layouts: Optional[dict] = None, desired_input_kwarg_layouts: Optional[dict] = None,
                 use_local_output: bool = False):
        w = "PrepareModuleInput"
        self.input_layouts = None if input_layouts is None else _layouts(input_layouts, w, "input_layouts")
        self.desired_input_layouts = (None if desired_input_layouts is None
                                      else _layouts(desired_input_layouts, w, "desired_input_layouts"))
        self.use_local_output = use_local_output
        self.with_kwargs = input_kwarg_layouts is not None
        self.input_kwarg_layouts = _kwarg_layouts(input_kwarg_layouts, w, "input_kwarg_layouts")
        self.desired_input_kwarg_layouts = _kwarg_layouts(desired_input_kwarg_layouts, w, "desired_input_kwarg_layouts")
        super().__init__()

    def _make_cpp(self):
        return _C._PrepareModuleInput(
            None if self.input_layouts is None else list(self.input_layouts),
            None if self.desired_input_layouts is None else list(self.desired_input_layouts),
            self.input_kwarg_layouts or None, self.desired_input_kwarg_layouts or None, self.use_local_output)

    def _fields(self):
        return [("input_layouts", self.input_layouts), ("desired_input_layouts", self.desired_input_layouts),
                ("input_kwarg_layouts", self.input_kwarg_layouts),
                ("desired_input_kwarg_layouts", self.desired_input_kwarg_layouts), ("use_local_output", self.use_local_output)]


class PrepareModuleOutput(_CppStyle):
    """Converts a module's outputs (one tensor, or a tuple whose ``None`` slots pass through)
    from ``output_layouts`` to ``desired_output_layouts``, reducing a ``Partial`` in
    ``reduce_dtype`` when given (the seed's).

    e.g. ``PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1))``"""

    def __init__(self, *, output_layouts: Layouts, desired_output_layouts: Layouts, use_local_output: bool = True,
                 reduce_dtype: Optional[torch.dtype] = None):
        w = "PrepareModuleOutput"
        self.output_layouts = _layouts(output_layouts, w, "output_layouts")
        self.desired_output_layouts = _layouts(desired_output_layouts, w, "desired_output_layouts")
        self.use_local_output = use_local_output
        self.reduce_dtype = reduce_dtype
        super().__init__()

    def _make_cpp(self):
        return _C._PrepareModuleOutput(list(self.output_layouts), list(self.desired_output_layouts), self.use_local_output,
                                       self.reduce_dtype)

    def _fields(self):
        fields = [("output_layouts", self.output_layouts), ("desired_output_layouts", self.desired_output_layouts),
                  ("use_local_output", self.use_local_output)]
        return fields + ([("reduce_dtype", self.reduce_dtype)] if self.reduce_dtype is not None else [])


class PrepareModuleInputOutput(_CppStyle):
    """PrepareModuleInput and PrepareModuleOutput on one module (``prepare_module_input``,
    ``prepare_module_output``); ``use_local_input`` is the input side's ``use_local_output``."""

    def __init__(self, *, input_layouts: Layouts = None, desired_input_layouts: Layouts = None,
                 input_kwarg_layouts: Optional[dict] = None, desired_input_kwarg_layouts: Optional[dict] = None,
                 use_local_input: bool = False, output_layouts: Layouts, desired_output_layouts: Layouts,
                 use_local_output: bool = True, reduce_dtype: Optional[torch.dtype] = None):
        self.prepare_module_input = PrepareModuleInput(
            input_layouts=input_layouts, desired_input_layouts=desired_input_layouts,
            input_kwarg_layouts=input_kwarg_layouts, desired_input_kwarg_layouts=desired_input_kwarg_layouts,
            use_local_output=use_local_input)
        self.prepare_module_output = PrepareModuleOutput(
            output_layouts=output_layouts, desired_output_layouts=desired_output_layouts,
            use_local_output=use_local_output, reduce_dtype=reduce_dtype)
        super().__init__()

    def _make_cpp(self):
        i, o = self.prepare_module_input, self.prepare_module_output
        return _C._PrepareModuleInputOutput(
            None if i.input_layouts is None else list(i.input_layouts),
            None if i.desired_input_layouts is None else list(i.desired_input_layouts),
            list(o.output_layouts), list(o.desired_output_layouts),
            i.input_kwarg_layouts or None, i.desired_input_kwarg_layouts or None,
            i.use_local_output, o.use_local_output, o.reduce_dtype)

    def _fields(self):
        i, o = self.prepare_module_input, self.prepare_module_output
        return [("input_layouts", i.input_layouts), ("desired_input_layouts", i.desired_input_layouts),
                ("input_kwarg_layouts", i.input_kwarg_layouts), ("desired_input_kwarg_layouts", i.desired_input_kwarg_layouts),
                ("use_local_input", i.use_local_output), ("output_layouts", o.output_layouts),
                ("desired_output_layouts", o.desired_output_layouts), ("use_local_output", o.use_local_output)]
