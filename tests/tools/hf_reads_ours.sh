#!/usr/bin/env bash
# transformers' from_pretrained loads every checkpoint that save_hf_checkpoint wrote in the
# models_hf_np* tests; its logits must equal transformers' logits of the checkpoint we loaded.
set -u
PY=$1 SCRIPT=$2 REF=$3 OURS=$4
"$PY" -c "import transformers" 2>/dev/null || { echo "SKIPPED: transformers is not installed"; exit 77; }
dirs=("$OURS"/np*_*)
[ -d "${dirs[0]}" ] || { echo "FAIL: no checkpoints of ours under $OURS"; exit 1; }
exec "$PY" "$SCRIPT" check "$REF" "${dirs[@]}"
