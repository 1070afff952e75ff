"""CommDebugMode (PyTorch's torch.distributed.tensor.debug.CommDebugMode): counts the
collectives run in its ``with`` block; the counts stay readable after it."""
import collections
import functools

import torch

from . import _C


@functools.lru_cache(maxsize=None)
def _pytorch_keys() -> dict:
    """The library's name for each kind of collective -> the key PyTorch's CommDebugMode counts it
    under (the functional collective op a PyTorch user indexes get_comm_counts() with)."""
    import torch.distributed._functional_collectives  # noqa: F401 - registers torch.ops.c10d_functional
    return {
        "all_reduce": torch.ops.c10d_functional.all_reduce,
        "all_gather": torch.ops.c10d_functional.all_gather_into_tensor,
        "reduce_scatter": torch.ops.c10d_functional.reduce_scatter_tensor,
        "all_to_all": torch.ops.c10d_functional.all_to_all_single,
        "broadcast": torch.ops.c10d_functional.broadcast,
        "scatter": torch.ops.c10d.scatter_,
        "barrier": torch.ops.c10d.barrier,
    }


class CommDebugMode:
    """e.g. ``with CommDebugMode() as comm: y = model(x)`` then ``comm.get_total_counts()``."""

    def __init__(self):
        self._mode = _C._CommDebugMode()

    def __enter__(self):
        self._mode.enter()
        return self

    def __exit__(self, *exc):
        self._mode.exit()
        return False

    def get_total_counts(self) -> int:
        """How many collectives ran in the block (or so far, inside it)."""
        return self._mode.get_total_counts()

    def get_comm_counts(self) -> "collections.defaultdict[object, int]":
        """The collectives counted, keyed as PyTorch's CommDebugMode keys them (a kind never run
        reads 0), e.g. ``comm.get_comm_counts()[torch.ops.c10d_functional.all_reduce]``."""
        counts = collections.defaultdict(int)
        keys = _pytorch_keys()
        for kind, n in self._mode.get_comm_counts().items():
            counts[keys.get(kind, kind)] += n
        return counts

    @property
    def comm_counts(self) -> "collections.defaultdict[object, int]":
        """get_comm_counts(), as PyTorch's attribute."""
        return self.get_comm_counts()

    def summary(self) -> str:
        """Each kind of collective with its count and bytes, e.g. "all_reduce: 2 (8.0 KiB)"."""
        return self._mode.summary()


class ExplicitRedistribution:
    """Communication only where it is asked for by name (PyTorch's ExplicitRedistributionContext):
    in its ``with`` block, an op on DTensors that would need a collective to redistribute an input
    raises on every rank (``mode="raise"``) or warns (``mode="warn"``) before communicating;
    ``redistribute``, ``full_tensor``, the styles' hooks and loss parallelism are allowed."""

    def __init__(self, mode: str = "raise"):
        self._mode = mode
        self._guard = None

    def __enter__(self):
        self._guard = _C._ExplicitRedistribution(self._mode)
        return self

    def __exit__(self, *exc):
        self._guard = None
        return False
