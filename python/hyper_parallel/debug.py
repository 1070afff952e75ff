"""CommDebugMode (PyTorch's torch.distributed.tensor.debug.CommDebugMode): counts the
collectives run in its ``with`` block; the counts stay readable after it."""
from . import _C


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

    def get_comm_counts(self) -> dict:
        """The collectives counted, by the library's name for each kind (e.g. "all_reduce")."""
        return self._mode.get_comm_counts()

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
