#!/bin/bash
# The GPU run behind the comparison of AIConfigurator's silicon tables with a GPU measured here
# (docs/results/h100-2026-12-06.md for the H100), deadline-bounded, results packed into $OUT/results.tgz as they come:
#   1. python3 -m validator.gpu.moe_ops price: bf16 GEMM records (profiles/kernels/dense-gemm-ops.json: the
#      dense models' five GEMMs at 1-8192 tokens, then a third of the DeepSeek bf16 records of
#      h200-torch.json) timed with torch (cuBLAS) -> $RES/<gpu>-torch-dense.json;
#   2. scripts/attention_check.py: one layer's attention on the executor's paths -> $RES/attention-<model>.json
#      (AIC's FA3 rows joined on the CPU: attention_check.py --compare FILE --system <aic system>);
#   3. scripts/executor_check.py: whole steps, eager / compiled / varlen / packed, kernels per layer
#      -> $RES/executor-<model>.json;
#   4. python3 -m validator.gpu.replay in a fresh process: $LOGS (step logs dsim wrote from the profile
#      measured here) -> $RES/replay-<model>.json.
#   MODEL (default llama-3.1-8b)  PREFIX (default h100)  GEMM_S (price budget, default 150)  DEADLINE (default 540)
set -o pipefail
DEADLINE=${DEADLINE:-540}
# shellcheck source=deadline_jobs.sh
source "$(dirname "$0")/deadline_jobs.sh"
M=${MODEL:-llama-3.1-8b}
P=${PREFIX:-h100}
SAMPLER=
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu --format=csv -lms 500 \
    >"$RES/clocks.csv" 2>&1 &
  SAMPLER=$!
fi
if [ -n "$LOGS" ]; then
  # shellcheck disable=SC2086
  job "${REPLAY_T:-300}" python3 -m validator.gpu.replay $LOGS --model "profiles/models/$M.json" \
    --out "$RES/replay-$M.json" --reps 3 --warm 1 $EXTRA
fi
job "${GEMM_T:-200}" python3 -m validator.gpu.moe_ops price --ops profiles/kernels/dense-gemm-ops.json \
  --out "$RES/$P-torch-dense.json" --name "$P-torch-dense" --budget-s "${GEMM_S:-150}" --keep-order $EXTRA
job "${ATTN_T:-90}" python3 validator/gpu/scripts/attention_check.py --model "profiles/models/$M.json" \
  --out "$RES/attention-$M.json" $EXTRA
job "${EXEC_T:-120}" python3 validator/gpu/scripts/executor_check.py --model "profiles/models/$M.json" \
  --out "$RES/executor-$M.json" $EXTRA
[ -n "$SAMPLER" ] && kill "$SAMPLER"
echo "total $((SECONDS - T0))s" | tee -a "$LOG"
[ "$RES" -ef "$OUT" ] || tar czf "$OUT/results.tgz" -C "$RES" .
