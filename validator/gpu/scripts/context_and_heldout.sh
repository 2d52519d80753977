#!/bin/bash
# The context sweep and the held-out replays behind the H200 profiles' attention terms, one fresh
# process per job:
#   1. scripts/context_sweep.py: unequal decode contexts and long cached prefixes (plan.context_sweep_plan)
#      plus table anchors -> $RES/ctx-<model>.json (the fitting set of the attention terms);
#   2. python3 -m validator.gpu.replay over archive/h200/steplogs/<case>-<model>.jsonl (Mooncake
#      conversation with prefix caching c16/c96, Azure conv c64 / code c8; dsim's step logs, never
#      fitted) -> $RES/heldout-<model>.json (the checking set; re-predicted offline by
#      validator.gpu.refit --repredict);
#   3. scripts/executor_check.py on Llama-3.1-8B (eager vs compiled dense path, kernels per layer).
# Jobs run in priority order under `timeout`, none past DEADLINE seconds (the device's command
# limit); after each, everything so far is packed into $OUT/results.tgz (the device returns at most
# 8 files), so a run cut short keeps what it measured.
#   MODELS  in order (default: llama-3.1-8b qwen3-14b qwen3-8b qwen3-32b)
#   CASES   held-out logs (default: mooncake-c16 mooncake-c96 azure-conv-c64 azure-code-c8)
#   PROFILE_MODEL  profile this model first with validator.gpu.profile (its default-c1/c32/c256 logs
#           are replayed too), e.g. qwen3-14b   EXEC  1 runs the executor check after EXEC_AFTER (qwen3-8b)
#   DEADLINE seconds (default 560)   EXTRA  e.g. --dry-run
set -o pipefail
DEADLINE=${DEADLINE:-560}
# shellcheck source=deadline_jobs.sh
source "$(dirname "$0")/deadline_jobs.sh"
mkdir -p "$RES/profiles"
SPLIT="continuous:fill=2,balance=2"
HELDOUT="mooncake-c16 mooncake-c96 azure-conv-c64 azure-code-c8"
measure() {  # model: context sweep, then the held-out replays (and the default logs where given)
  local m=$1 cases=$2 reps=3 tc=${CTX_T:-70} tr=${REPLAY_T:-110}
  local prof=profiles/h200/h200-$m.yaml
  [ -f "$RES/profiles/h200-$m.yaml" ] && prof=$RES/profiles/h200-$m.yaml
  case $m in
    qwen3-14b) tc=${CTX_T14:-90}; tr=${REPLAY_T14:-170} ;;
    qwen3-32b) reps=2; tc=${CTX_T32:-140}; tr=${REPLAY_T32:-200} ;;
  esac
  job "$tc" python3 validator/gpu/scripts/context_sweep.py --model "profiles/models/$m.json" --profile "$prof" \
    --out "$RES/ctx-$m.json" --reps "$reps" $EXTRA
  local logs=""
  for c in $cases; do logs="$logs archive/h200/steplogs/$c-$m.jsonl"; done
  job "$tr" python3 -m validator.gpu.replay $logs --model "profiles/models/$m.json" --profile "$prof" \
    --out "$RES/heldout-$m.json" --reps "$reps" --warm 1 $EXTRA
}
for m in ${MODELS:-llama-3.1-8b qwen3-14b qwen3-8b qwen3-32b}; do
  if [ "$m" = "$PROFILE_MODEL" ]; then
    job "${PROFILE_T:-170}" python3 -m validator.gpu.profile --model "profiles/models/$m.json" --out "$RES/profiles" \
      --reps 3 --split "$SPLIT" --no-attn-bench $EXTRA
    measure "$m" "${CASES:-$HELDOUT} default-c1 default-c32 default-c256"
  else
    measure "$m" "${CASES:-$HELDOUT}"
  fi
  if [ "$m" = "${EXEC_AFTER:-qwen3-8b}" ] && [ "${EXEC:-1}" = 1 ]; then
    job "${EXEC_T:-100}" python3 validator/gpu/scripts/executor_check.py --model profiles/models/llama-3.1-8b.json \
      --out "$RES/executor-llama-3.1-8b.json" $EXTRA
  fi
done
ls -la "$RES" "$RES/profiles" | tee -a "$LOG"
echo "total $((SECONDS - T0))s" | tee -a "$LOG"
