"""PyTorch's own API under hyper_parallel's name, for the control run of the ported tests
(run.py --control puts this directory first on sys.path): the same test files, the same lines
`from hyper_parallel import ...`, PyTorch's implementation behind them."""
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import (DTensor, Partial, Placement, Replicate, Shard, distribute_module,
                                      distribute_tensor)
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.experimental import implicit_replication
from torch.distributed.tensor.parallel import (ColwiseParallel, ParallelStyle, PrepareModuleInput,
                                               PrepareModuleInputOutput, PrepareModuleOutput, RowwiseParallel,
                                               SequenceParallel, loss_parallel, parallelize_module)
