"""The process harness of PyTorch's DTensor tests, SPMD under torchrun.

PyTorch's DTensorTestBase spawns world_size processes per test and initialises a process group in
each; here torchrun starts the processes once and run.py runs every test on every rank in step. The
test bodies, models and expected values are PyTorch's: this module gives them the names they import
from torch.testing._internal (DTensorTestBase, with_comms, the models), with only what a process
harness has to change. Whether `hyper_parallel` is ours or PyTorch's (the control) is decided by
run.py before anything imports it.
"""
import enum
import functools
import types

import torch
import torch.distributed as dist
from torch.testing._internal import common_utils
from torch.testing._internal.common_distributed import run_subtests as _run_subtests
from torch.testing._internal.distributed._tensor import common_dtensor as _pt

import hyper_parallel

# PyTorch's models: plain torch.nn modules, the reference of every test that uses them.
MLPModule = _pt.MLPModule
MLPStacked = _pt.MLPStacked
RMSNormPython = _pt.RMSNormPython
ModelArgs = _pt.ModelArgs
map_local_tensor_for_rank = _pt.map_local_tensor_for_rank
NUM_DEVICES = 4
# False in the control run (PyTorch's DTensor under hyper_parallel's name): the few assertions that
# README.md lists as divergences check our behaviour on our side and PyTorch's in the control.
IS_HYPER_PARALLEL = hasattr(hyper_parallel, "_C")
# A class attribute of PyTorch's newer test classes (torch 2.11 has no such enum).
HardwareClassification = getattr(common_utils, "HardwareClassification", None) or enum.Enum(
    "HardwareClassification", "ACCELERATOR CPU")
parametrize = common_utils.parametrize


def _with_names_from_hyper_parallel(fn):
    """`fn` (PyTorch's code, unchanged) with the DTensor names it reads taken from hyper_parallel."""
    names = dict(fn.__globals__)
    for name in hyper_parallel.__all__ if hasattr(hyper_parallel, "__all__") else dir(hyper_parallel):
        if name in names:
            names[name] = getattr(hyper_parallel, name)
    return types.FunctionType(fn.__code__, names, fn.__name__, fn.__defaults__, fn.__closure__)


class Transformer(_pt.Transformer):
    """PyTorch's test Transformer; its `parallelize` (PyTorch's plan, line for line) applies
    hyper_parallel's styles."""
    parallelize = staticmethod(_with_names_from_hyper_parallel(_pt.Transformer.parallelize))


class DTensorTestBase(common_utils.TestCase):
    """PyTorch's DTensorTestBase without its process spawning: the process is one rank of the
    torchrun job, and run.py runs a class only in a job of its world_size."""

    @property
    def world_size(self) -> int:
        return NUM_DEVICES

    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def device_type(self) -> str:
        return "cpu"

    @property
    def backend(self) -> str:
        return "gloo"

    @property
    def is_local_tensor_enabled(self) -> bool:
        return False

    def build_device_mesh(self):
        return hyper_parallel.init_device_mesh(self.device_type, (self.world_size,))

    def init_manual_seed_for_rank(self) -> None:
        torch.manual_seed(self.rank)

    def run_subtests(self, *args, **kwargs):
        return _run_subtests(self, *args, **kwargs)

    def setUp(self) -> None:
        super().setUp()
        # PyTorch's spawned process seeds torch before each test (common_utils.set_rng_seed).
        common_utils.set_rng_seed()


def with_comms(eager_init=False, backend=None):
    """PyTorch's with_comms: the job's process group stays up between tests (run.py joins it and
    gives hyper_parallel a fresh runtime per test), so the wrapper only runs the test."""
    def decorator(func):
        @functools.wraps(func)
        def wrapper(self, *args, **kwargs):
            return func(self, *args, **kwargs)
        return wrapper

    return decorator(eager_init) if callable(eager_init) else decorator


# GPU-only decorators of PyTorch's tests: here every test runs on CPU.
def skip_unless_torch_gpu(fn):
    return fn


def skip_if_lt_x_gpu(n):
    return lambda fn: fn


def skipXPUIf(condition, reason):
    return lambda fn: fn


def instantiate_parametrized_tests(cls):
    """PyTorch's, tolerating the None that create_local_tensor_test_class gives here."""
    return None if cls is None else common_utils.instantiate_parametrized_tests(cls)


def instantiate_device_type_tests(cls, scope, **kwargs):
    """The class runs as it is on CPU (its @parametrize expanded): PyTorch's version would make
    one class per available device type."""
    common_utils.instantiate_parametrized_tests(cls)


def create_local_tensor_test_class(cls, *args, **kwargs):
    """PyTorch's LocalTensor variants simulate every rank in one process, through PyTorch's own
    DTensor internals; they are not ported (run.py records them as not ported)."""
    return None
