#!/bin/bash
# The packed attention path (StepMeta impl 'packed', validator/gpu/packed_attention.py) against the
# executor's others on the GPU: one layer's attention (attention_check.py: Llama-3.1-8B and
# Qwen3-14B, KV groups of 4 and 5 query heads; decode, verify windows and prefill chunks, each with
# its error against the varlen path on the same inputs) and whole steps (executor_check.py,
# Llama-3.1-8B). Run from the repository root on the device; files land in $OUT.
#   DEADLINE seconds for the whole run (default 420); T_ATTN, T_EXEC per job
set -o pipefail
DEADLINE=${DEADLINE:-420}
RES=${OUT:-/tmp/out}
# shellcheck source=deadline_jobs.sh
source "$(dirname "$0")/deadline_jobs.sh"
for m in llama-3.1-8b qwen3-14b; do
  job "${T_ATTN:-100}" python3 validator/gpu/scripts/attention_check.py --model "profiles/models/$m.json" \
    --out "$RES/attention-$m.json"
done
job "${T_EXEC:-200}" python3 validator/gpu/scripts/executor_check.py --model profiles/models/llama-3.1-8b.json \
  --out "$RES/executor-llama-3.1-8b.json"
echo "total $((SECONDS - T0))s" | tee -a "$LOG"
grep -h '"impl"\|packed \|varlen \|compiled \|eager ' "$LOG" | cut -c1-160 | tail -60
