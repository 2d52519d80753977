#!/bin/bash
# Replay V4-Flash shard step logs in one fresh process, results written after every step (one GPU, torch +
# Triton; run from the repository root).
#   LOGS   step logs, in the order to run (default: the seed-1 logs, c32 and long first)
#   LONG_STEPS  steps of the long-context log to run (default 10)
#   OUT    output folder (default /tmp/out)
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
P=profiles/kernels/h200-torch-checks/steplogs/${PREFIX:-dspark-v4f-s1}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null | tee -a "$OUT/log.txt"
TUNE='{"attn": {"block_n": 32, "block_dv": 512, "num_warps": 8, "num_stages": 1}, "indexer": {"block_n": 128, "tq": 8, "num_warps": 8}}'
# the long log's first LONG_STEPS steps: a trimmed copy (the replay runs every step of a file it is given)
head -n "${LONG_STEPS:-10}" $P-long.jsonl > $P-longcut.jsonl
timeout ${BUDGET_S:-480} python3 -m validator.gpu.moe_shard replay ${LOGS:-$P-c32.jsonl $P-longcut.jsonl $P-c256.jsonl $P-c1.jsonl} \
  --model deepseek-v4-flash --topology dp8-ep8 --tune "$TUNE" --out "$OUT/replay-deepseek-v4-flash-dp8-ep8-s1.json" $EXTRA 2>&1 \
  | tee -a "$OUT/log.txt" | grep -v '^{' | cut -c1-300
