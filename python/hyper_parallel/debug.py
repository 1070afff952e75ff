"""CommDebugMode (PyTorch's torch.distributed.tensor.debug.CommDebugMode): counts the
collectives run in its ``with`` block; the counts stay readable after it."""
from . import _C


class CommDebugMode:
    def __init__(self):
        self._mode = _C._CommDebugMode()

    def __enter__(self):
        self._mode.enter()
        return self

    def __exit__(self, *exc):
        self._mode.exit()
        return False

    def get_total_counts(self):
        return self._mode.get_total_counts()

    def get_comm_counts(self):
        return self._mode.get_comm_counts()

    def summary(self):
        return self._mode.summary()


class ExplicitRedistribution:
    """Communication only where it is asked for by name (PyTorch's ExplicitRedistributionContext):
    in its ``with`` block, an op on DTensors that would need a collective to redistribute an input
    raises on every rank (``mode="raise"``) or warns (``mode="warn"``) before communicating;
    ``redistribute``, ``full_tensor``, the styles' hooks and loss parallelism are allowed."""

    def __init__(self, mode="raise"):
        self._mode = mode
        self._guard = None

    def __enter__(self):
        self._guard = _C._ExplicitRedistribution(self._mode)
        return self

    def __exit__(self, *exc):
        self._guard = None
        return False
