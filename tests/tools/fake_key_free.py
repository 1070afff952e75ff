"""The dispatch key our DTensor borrows (`Fake`, src/dtensor/dtensor_impl.h) must stay free in a
process that imports torch: torch 2.15 documents it for a C++ FakeTensor mode but registers no
kernel or fallback there. Fails, naming the op and the registration, the day a torch does."""
import sys

import torch

ops = ["aten::add.Tensor", "aten::mm", "aten::_to_copy", "aten::clone", "aten::empty.memory_format"]
taken = []
for op in ops:
    for line in torch._C._dispatch_dump_table(op).splitlines():
        if line.startswith("Fake:"):
            taken.append(f"{op}: {line}")
if taken:
    print(f"torch {torch.__version__} has something at the dispatch key Fake, which hyper_parallel's DTensor uses:")
    print("\n".join(taken))
    sys.exit(1)
print(f"torch {torch.__version__}: nothing registered at the dispatch key Fake for {', '.join(ops)}")
