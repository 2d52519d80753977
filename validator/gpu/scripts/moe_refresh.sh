#!/bin/bash
# Price the op records a kernel table lacks, then replay the V4-Flash shard step logs and measure its
# layer check records, each in a fresh process (one GPU, torch + Triton; run from the repository root).
#   OPS    op records to price (e.g. those of `dsim profile compose required-ops` the table has no answer for)
#   STAGE  price+replay (default) or layers
#   OUT    output folder (default /tmp/out)
#   SL     step-log folder (default archive/kernels/h200-torch-checks/steplogs), PREFIX their prefix (dspark-v4f)
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
SL=${SL:-archive/kernels/h200-torch-checks/steplogs}
P=$SL/${PREFIX:-dspark-v4f}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null | tee -a "$OUT/log.txt"
TUNE='{"attn": {"block_n": 32, "block_dv": 512, "num_warps": 8, "num_stages": 1}, "indexer": {"block_n": 128, "tq": 8, "num_warps": 8}}'
if [ "${STAGE:-price+replay}" = price+replay ]; then
  timeout 150 python3 -m validator.gpu.moe_ops price --ops "$OPS" --out "$OUT/h200-torch-add.json" --budget-s 90 $EXTRA 2>&1 \
    | tee -a "$OUT/log.txt" | cut -c1-400
  TUNE=$(python3 -c "import json,sys; print(json.dumps(json.load(open('$OUT/h200-torch-add.json'))['provenance']['gpu'].get('tune') or json.loads(sys.argv[1])))" "$TUNE")
  timeout 400 python3 -m validator.gpu.moe_shard replay $P-c1.jsonl $P-c32.jsonl $P-c256.jsonl $P-long.jsonl --model deepseek-v4-flash --topology dp8-ep8 \
    --tune "$TUNE" --out "$OUT/replay-deepseek-v4-flash-dp8-ep8.json" $EXTRA 2>&1 | tee -a "$OUT/log.txt" | grep -v '^{' | cut -c1-300
else
  timeout 150 python3 -m validator.gpu.moe_shard layers --model deepseek-v4-flash --topology dp8-ep8 --tune "$TUNE" \
    --out "$OUT/layers-deepseek-v4-flash-dp8-ep8.json" $EXTRA 2>&1 | tee -a "$OUT/log.txt" | tail -n 2 | cut -c1-300
fi
