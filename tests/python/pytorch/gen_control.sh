#!/usr/bin/env bash
# Writes control/torch-<major.minor>.json: the verdict of every ported test run on PyTorch's own
# DTensor (the control), at PyTorch's world sizes (4, and 8 for the mesh tests), for the torch of
# the Python that runs it. Run it once per torch version and check the file in.
#   tests/python/pytorch/gen_control.sh [python]   (default: .venv/bin/python)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="${1:-$here/../../../.venv/bin/python}"
minor="$("$py" -c 'import torch; print(".".join(torch.__version__.split("+")[0].split(".")[:2]))')"
out="$here/control/torch-$minor.json"
rm -f "$out"
for np in 4 8; do
  OMP_NUM_THREADS=1 "$py" -m torch.distributed.run --standalone --nproc-per-node "$np" "$here/run.py" --control --write "$out"
done
echo "wrote $out"
