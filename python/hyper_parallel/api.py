"""parallelize_module (PyTorch's torch.distributed.tensor.parallel.parallelize_module): the C++
engine resolves the plan's FQN globs, validates the whole plan on every rank, then applies the
styles to the torch.nn module through the platform seam."""
from . import _C
from .style import ParallelStyle, _CppStyle


def _cpp_or_python(style, where):
    if not isinstance(style, ParallelStyle):
        raise TypeError(f"hyper_parallel.parallelize_module: {where} must be a ParallelStyle, got {type(style).__name__}")
    return style._cpp if isinstance(style, _CppStyle) else style


def parallelize_module(module, device_mesh=None, parallelize_plan=None, *, src_data_rank=0):
    """Applies ``parallelize_plan`` (a ParallelStyle, or a dict of FQN glob to ParallelStyle) to
    ``module`` over the 1-D ``device_mesh`` (or the mesh of an enclosing ``with mesh:``); returns
    the module. A failure on any rank leaves the module unchanged on every rank."""
    if parallelize_plan is None:
        plan = None
    elif isinstance(parallelize_plan, dict):
        plan = []
        for path, style in parallelize_plan.items():
            if not isinstance(path, str):
                raise TypeError(f"hyper_parallel.parallelize_module: plan keys must be module paths (str), got {type(path).__name__}")
            plan.append((path, _cpp_or_python(style, f"the plan value for '{path}'")))
        for style in parallelize_plan.values():
            style.src_data_rank = src_data_rank
    else:
        plan = _cpp_or_python(parallelize_plan, "parallelize_plan")
        parallelize_plan.src_data_rank = src_data_rank
    _C._parallelize_module(module, device_mesh, plan, src_data_rank)
    return module
