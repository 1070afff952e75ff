#!/usr/bin/env bash
# Runs the training demo (its own exit status: the parallel run's losses against one process's,
# and its tp and one-process generations), then has transformers load the checkpoint it saved and
# generate greedily from the same prompt ids: the tokens must be the demo's.
#   demo_vs_transformers.sh PYTHON SAVE_DIR HPRUN ARGS...   (ARGS: hprun's and the demo's)
set -u
PY=$1 SAVE=$2
shift 2
out=$("$@" --save "$SAVE" 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAIL: the demo exited with $rc"; exit 1; }
prompt=$(echo "$out" | sed -n 's/.*prompt ids: //p' | tail -1)
ours=$(echo "$out" | sed -n 's/.*generated ids: //p' | tail -1)
[ -n "$prompt" ] && [ -n "$ours" ] || { echo "FAIL: the demo printed no ids"; exit 1; }
"$PY" -c "import transformers" 2>/dev/null || { echo "SKIPPED: transformers is not installed"; exit 77; }
OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 "$PY" - "$SAVE" "$prompt" "$ours" <<'PYEOF'
import sys
import torch
from transformers import AutoModelForCausalLM
d, prompt, ours = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], [int(t) for t in sys.argv[3].split(",")]
model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
with torch.no_grad():
    out = model.generate(torch.tensor([prompt]), max_new_tokens=len(ours), min_new_tokens=len(ours), do_sample=False,
                         eos_token_id=None, pad_token_id=0)
theirs = out[0, len(prompt):].tolist()
print(f"transformers ({type(model).__name__}) generated {theirs}; the demo {ours}")
sys.exit(0 if theirs == ours else 1)
PYEOF
