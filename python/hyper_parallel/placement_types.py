"""Shard, Replicate and Partial (PyTorch's torch.distributed.tensor placement types): Python
subclasses of the C++ classes, so that the library's placements cross to and from C++ as they
are, and compare, hash and print as PyTorch's."""
from ._C import Placement, _Partial, _Replicate, _Shard


class Shard(_Shard):
    """The tensor is split along ``dim`` over a mesh dimension (torch.chunk's pieces).
    e.g. ``Shard(0)``; ``Shard(1) == Shard(1)``, ``Shard(0).is_shard(0)``."""


class Replicate(_Replicate):
    """Every rank of the mesh dimension holds the whole tensor. e.g. ``Replicate()``."""


class Partial(_Partial):
    """Every rank holds an addend (or a max, min, ...) of the value; ``reduce_op`` ("sum",
    "avg", "max" or "min") combines them. e.g. ``Partial()``, ``Partial("max")``."""


def as_list(placements, where):
    """A sequence of placements as a list, refusing anything else by name."""
    if isinstance(placements, Placement):
        return [placements]
    out = list(placements)
    for p in out:
        if not isinstance(p, Placement):
            raise TypeError(f"hyper_parallel.{where}: placements must be Shard, Replicate or Partial, got {type(p).__name__}")
    return out
