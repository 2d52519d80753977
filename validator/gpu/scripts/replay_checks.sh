#!/bin/bash
# Replay a checking set of dsim step logs (made by make_heldout_steplogs.py from the shipped H200
# profiles, never fitted) on the GPU executor: one fresh `python3 -m validator.gpu.replay` process per
# model, its logs in the order given, the log's own prediction compared (the profile the log was made
# with), every step written as it is timed. Jobs run under `timeout`, none past DEADLINE seconds.
# Run from the repository root on a machine with one GPU and torch.
#   CHECKS   "model:log,log ..." in order (log: the case name, e.g. default-c256, or a path with a
#            '/', e.g. a design set written as a step log), default: the
#            two compositions the first set missed on (Qwen3-14B default c256, Qwen3-32B Azure conv
#            c128), Mooncake on the 8B models, then small logs of other workloads
#   DIR      the step logs' folder (default archive/h200/steplogs-s1): DIR/<log>-<model>.jsonl
#   REPS     timed replays per step (default 3; Qwen3-32B 2; R_<n>: the n-th job's), WARM untimed
#            ones (default 1)
#   T_<n>    the n-th job's limit in seconds (default 60)
#   OUT      output folder (default /tmp/out): check-<model>.json per model, log.txt
#   EXTRA    extra replay arguments, e.g. EXTRA=--dry-run (CPU, a few small steps)
#   CLOCKS   1: sample the GPU's SM clock, power and temperature every 200 ms into $OUT/clocks.csv
#            for the run (rows carry their start/end times to match), and log its performance
#            state (clock event reasons) after every job
set -o pipefail
DEADLINE=${DEADLINE:-195}
RES=${OUT:-/tmp/out}
# shellcheck source=deadline_jobs.sh
source "$(dirname "$0")/deadline_jobs.sh"
DIR=${DIR:-archive/h200/steplogs-s1}
SAMPLER=
if [ "${CLOCKS:-0}" = 1 ] && command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 200 \
    >"$OUT/clocks.csv" 2>&1 &
  SAMPLER=$!
fi
i=0
for ml in ${CHECKS:-qwen3-14b:default-c256,default-c1,azure-code-c8 qwen3-32b:azure-conv-c128,default-c1,azure-code-c8 llama-3.1-8b:mooncake-c96,default-c32,azure-code-c8 qwen3-8b:mooncake-c16,default-c32,azure-conv-c32}; do
  i=$((i + 1))
  m=${ml%%:*}
  logs=()
  IFS=, read -r -a names <<<"${ml#*:}"
  for lg in "${names[@]}"; do
    case $lg in */*) logs+=("$lg") ;; *) logs+=("$DIR/$lg-$m.jsonl") ;; esac
  done
  reps=${REPS:-3}
  [ "$m" = qwen3-32b ] && reps=${REPS:-2}
  rv=R_$i
  reps=${!rv:-$reps}
  lim=T_$i
  job "${!lim:-60}" python3 -m validator.gpu.replay "${logs[@]}" \
    --model "profiles/models/$m.json" --profile "profiles/h200/h200-$m.yaml" --out "$RES/check-$m.json" \
    --reps "$reps" --warm "${WARM:-1}" $EXTRA
  [ -n "$SAMPLER" ] && timeout 10 nvidia-smi -q -d PERFORMANCE 2>&1 | grep -v '^$' | head -30 >>"$LOG"
done
[ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null
ls -la "$RES" | tee -a "$LOG"
echo "total $((SECONDS - T0))s" | tee -a "$LOG"
