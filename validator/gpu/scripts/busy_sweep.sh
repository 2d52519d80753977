#!/bin/bash
# The GPU run behind the busy-step points (plan.busy_plan), one fresh process per model: 4-8K-token
# steps whose 256 decode requests run 1024-2048 tokens ("decode") and short prompt chunks beside 32
# or 128 decode requests ("short"), one request verifying 1-8 tokens at 256-8192 contexts ("one"), plus the table anchors (drift against the sweep run). Each
# model's points go to $OUT/busy-<model>.json, rewritten after every point, so a run cut short
# keeps what it measured; jobs run under `timeout`, none past DEADLINE seconds (default 195).
#   MODELS "model:parts ..." in order (default: qwen3-14b:decode,short qwen3-32b:short
#          qwen3-8b:short,one llama-3.1-8b:one)
#   ANCHOR_TAGS the sweep's step tags re-timed as anchors (default table,tail-decode; add
#          tail-mixed,tail-prefill for 8192-token ones)
#   REPLAYS "model:log ..." after that model's points, replay archive/h200/steplogs/<log>-<model>.jsonl in a
#          fresh process -> $OUT/replay-<log>-<model>.json (checking data, never fitted)
#   EXTRA e.g. --dry-run
set -o pipefail
DEADLINE=${DEADLINE:-195}
RES=${OUT:-/tmp/out}
# shellcheck source=deadline_jobs.sh
source "$(dirname "$0")/deadline_jobs.sh"
for mp in ${MODELS:-qwen3-14b:decode,short qwen3-32b:short qwen3-8b:short,one llama-3.1-8b:one}; do
  m=${mp%%:*}; parts=${mp#*:}; reps=3; t=${BUSY_T:-45}
  case $m in
    qwen3-14b) t=${BUSY_T14:-75} ;;
    qwen3-32b) reps=2; t=${BUSY_T32:-80} ;;
  esac
  job "$t" python3 validator/gpu/scripts/context_sweep.py --plan busy --parts "$parts" \
    --model "profiles/models/$m.json" --profile "profiles/h200/h200-$m.yaml" --out "$RES/busy-$m.json" \
    --reps "$reps" --anchor-tags "${ANCHOR_TAGS:-table,tail-decode}" $EXTRA
  for ml in $REPLAYS; do
    [ "${ml%%:*}" = "$m" ] || continue
    lg=${ml#*:}
    job "${REPLAY_T:-60}" python3 -m validator.gpu.replay "archive/h200/steplogs/$lg-$m.jsonl" \
      --model "profiles/models/$m.json" --profile "profiles/h200/h200-$m.yaml" --out "$RES/replay-$lg-$m.json" \
      --reps "$reps" --warm 1 $EXTRA
  done
done
ls -la "$RES" | tee -a "$LOG"
echo "total $((SECONDS - T0))s" | tee -a "$LOG"
