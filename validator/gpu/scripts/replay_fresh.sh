#!/bin/bash
# Replay V4-Flash shard step logs in one fresh process, results written after every step (one GPU, torch +
# Triton; run from the repository root). Optionally first price the mHC and routed-expert records of the
# 512-2,048-token segment the kernel table is sparse in (a separate process, its own output file).
#   PREFIX      step-log prefix (default dspark-v4f-s2: the checking logs)
#   LOGS        step logs, in the order to run (default: PREFIX's c32, long (cut), c256, c1)
#   LONG_STEPS  steps of the long-context log to run (default 10)
#   TAIL_OPS    1: price the segment's records first (default 0)
#   BUDGET_S    replay time limit (default 420)
#   SMI_MS      > 0: sample the GPU's clocks, power and temperature every SMI_MS ms meanwhile (smi.csv) and
#               print them per replayed step (scripts/gpu_samples.py); default 0
#   OUT         output folder (default /tmp/out)
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
PREFIX=${PREFIX:-dspark-v4f-s2}
P=archive/kernels/h200-torch-checks/steplogs/$PREFIX
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null | tee -a "$OUT/log.txt"
TUNE='{"attn": {"block_n": 32, "block_dv": 512, "num_warps": 8, "num_stages": 1}, "indexer": {"block_n": 128, "tq": 8, "num_warps": 8}}'
if [ "${TAIL_OPS:-0}" = 1 ]; then
  python3 -c "
import json
t = list(range(544, 1024, 32)) + list(range(1088, 2049, 64))
ops = [dict(op='mhc', tokens=n, hidden=4096, hc_mult=4) for n in t]
ops += [dict(op='moe', dtype='fp8', tokens=8 * n, hidden=4096, inter=2048, topk=6, experts=256, ep=8) for n in t]
json.dump(ops, open('/tmp/tail-ops.json', 'w'))"
  timeout 120 python3 -m validator.gpu.moe_ops price --ops /tmp/tail-ops.json --out "$OUT/h200-torch-tail.json" \
    --budget-s 60 $EXTRA 2>&1 | tee -a "$OUT/log.txt" | cut -c1-300
fi
# the long log's first LONG_STEPS steps: a trimmed copy (the replay runs every step of a file it is given)
[ -f $P-long.jsonl ] && head -n "${LONG_STEPS:-10}" $P-long.jsonl > $P-longcut.jsonl
SMI_PID=
if [ "${SMI_MS:-0}" -gt 0 ]; then
  Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active
  nvidia-smi --query-gpu=$Q --format=csv,noheader >/dev/null 2>&1 || Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu
  nvidia-smi --query-gpu=$Q --format=csv,noheader,nounits -lms "$SMI_MS" > "$OUT/smi.csv" 2>/dev/null &
  SMI_PID=$!
fi
REPLAY="$OUT/replay-deepseek-v4-flash-dp8-ep8-${PREFIX#dspark-v4f-}.json"
timeout ${BUDGET_S:-420} python3 -m validator.gpu.moe_shard replay ${LOGS:-$P-c32.jsonl $P-longcut.jsonl $P-c256.jsonl $P-c1.jsonl} \
  --model deepseek-v4-flash --topology dp8-ep8 --tune "$TUNE" --out "$REPLAY" $EXTRA 2>&1 \
  | tee -a "$OUT/log.txt" | grep --line-buffered -v '^{' | cut -c1-300
if [ -n "$SMI_PID" ]; then
  kill "$SMI_PID" 2>/dev/null
  [ -f "$REPLAY" ] && python3 validator/gpu/scripts/gpu_samples.py "$OUT/smi.csv" "$REPLAY" | tee -a "$OUT/log.txt"
fi
