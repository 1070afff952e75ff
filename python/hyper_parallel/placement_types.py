"""Shard, Replicate and Partial (PyTorch's torch.distributed.tensor placement types)."""
from ._C import Placement


class Shard(Placement):
    """The tensor is split along ``dim`` over a mesh dimension (torch.chunk's pieces)."""

    def __init__(self, dim):
        super().__init__("shard", dim)

    @property
    def dim(self):
        return self._dim


class Replicate(Placement):
    """Every rank of the mesh dimension holds the whole tensor."""

    def __init__(self):
        super().__init__("replicate")


class Partial(Placement):
    """Every rank holds an addend (or a max, min, ...) of the value: ``reduce_op`` combines them."""

    def __init__(self, reduce_op="sum"):
        super().__init__("partial", 0, reduce_op)

    @property
    def reduce_op(self):
        return self._reduce_op


def from_cpp(p):
    """The Python placement of a C++ one (what C++ functions return)."""
    if p._kind == "shard":
        return Shard(p._dim)
    if p._kind == "partial":
        return Partial(p._reduce_op)
    return Replicate()


def as_list(placements, where):
    """A sequence of placements as a list, refusing anything else by name."""
    if isinstance(placements, Placement):
        return [placements]
    out = list(placements)
    for p in out:
        if not isinstance(p, Placement):
            raise TypeError(f"hyper_parallel.{where}: placements must be Shard, Replicate or Partial, got {type(p).__name__}")
    return out
