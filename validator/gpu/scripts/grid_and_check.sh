#!/bin/bash
# The GPU run behind the request-count terms and their check, one fresh process per job:
#   1. scripts/context_sweep.py --plan grid: plan.request_grid_plan (request counts at fixed token
#      counts, busy steps with 8-128 decode requests) -> $RES/grid-<model>.json (fitted);
#   2. python3 -m validator.gpu.replay over archive/h200/steplogs/<case>-<model>.jsonl for CHECK
#      (Azure conv at c32 / c128: logs made after the terms were designed, never fitted) and, for the
#      models in HELDOUT_MODELS, the held-out Mooncake / Azure logs -> $RES/check-<model>.json;
#   3. scripts/attention_check.py on Llama-3.1-8B (one layer's attention, split vs one-call varlen).
# Jobs run in order under `timeout`, none past DEADLINE seconds; after each, everything so far is
# packed into $OUT/results.tgz, so a run cut short keeps what it measured.
#   MODELS (default: llama-3.1-8b qwen3-8b qwen3-14b qwen3-32b)   DEADLINE (default 520)   EXTRA e.g. --dry-run
set -o pipefail
DEADLINE=${DEADLINE:-520}
# shellcheck source=deadline_jobs.sh
source "$(dirname "$0")/deadline_jobs.sh"
CHECK=${CHECK:-"azure-conv-c32 azure-conv-c128"}
HELDOUT_MODELS=${HELDOUT_MODELS:-qwen3-32b}
HELDOUT="mooncake-c16 mooncake-c96 azure-conv-c64 azure-code-c8"
for m in ${MODELS:-llama-3.1-8b qwen3-8b qwen3-14b qwen3-32b}; do
  reps=3; tg=${GRID_T:-60}; tr=${REPLAY_T:-70}
  cases=$CHECK
  case " $HELDOUT_MODELS " in *" $m "*) cases="$CHECK $HELDOUT" ;; esac
  case $m in
    qwen3-14b) tg=80; tr=90 ;;
    qwen3-32b) reps=2; tg=90; tr=260 ;;
  esac
  prof=profiles/h200/h200-$m.yaml
  job "$tg" python3 validator/gpu/scripts/context_sweep.py --plan grid --model "profiles/models/$m.json" \
    --profile "$prof" --out "$RES/grid-$m.json" --reps "$reps" $EXTRA
  logs=""
  for c in $cases; do logs="$logs archive/h200/steplogs/$c-$m.jsonl"; done
  job "$tr" python3 -m validator.gpu.replay $logs --model "profiles/models/$m.json" --profile "$prof" \
    --out "$RES/check-$m.json" --reps "$reps" --warm 1 $EXTRA
  if [ "$m" = "${ATTN_AFTER:-qwen3-14b}" ]; then
    job "${ATTN_T:-45}" python3 validator/gpu/scripts/attention_check.py --model profiles/models/llama-3.1-8b.json \
      --out "$RES/attention-llama-3.1-8b.json" $EXTRA
  fi
done
ls -la "$RES" | tee -a "$LOG"
echo "total $((SECONDS - T0))s" | tee -a "$LOG"
