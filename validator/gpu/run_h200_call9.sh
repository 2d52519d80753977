#!/bin/bash
# One device call (call 9): (1) the issue's own check on the committed artifacts: for each model a fresh
# `python3 -m validator.gpu.replay` process replays the committed dsim step logs (validator/gpu/steplogs,
# predictions = dsim's own, written with the committed profiles) on the committed executor, split
# from the profile's provenance; (2) if time is left, the whole call-8 pipeline again for REPEAT (default
# llama-3.1-8b) into a separate folder (run-to-run spread of the figures; not committed as profiles).
# Results are bundled into $OUT/bundle.tar after each stage; the log is $OUT/log.txt.
# EXTRA=--dry-run runs it on the CPU. BUDGET: seconds the whole command may take.
BUDGET=${BUDGET:-540}
STAGE_DIRS="standalone repeat/profiles repeat/steplogs repeat/results"
source "$(dirname "$0")/device_setup.sh"
SL=validator/gpu/steplogs
for m in ${MODELS:-qwen3-8b llama-3.1-8b qwen3-32b}; do
  t0=$SECONDS
  timeout $((BUDGET - SECONDS - 3)) python3 -m validator.gpu.replay "$SL/dspark-$m-c1.jsonl" "$SL/dspark-$m-c32.jsonl" \
    "$SL/dspark-$m-c256.jsonl" --model "profiles/models/$m.json" --profile "profiles/h200/h200-$m.yaml" \
    --out "$ST/standalone/replay-$m.json" --reps 5 --warm 2 $EXTRA 2>&1 | tee -a "$LOG" | cut -c1-300
  bundle
  echo "== standalone $m in $((SECONDS - t0)) s (total $SECONDS s)"
done
m=${REPEAT:-llama-3.1-8b}
left=$((BUDGET - SECONDS))
if [ $left -lt ${NEED_REPEAT:-110} ]; then echo "== skip repeat $m: $left s left" | tee -a "$LOG"; exit 0; fi
t0=$SECONDS
profile_replay "$m" "$ST/repeat" 5 $((left - 3))
rc=$?
grep -E "^\[$m\] (sweep|fit|replay)|split tune scores|recheck" "$LOG" | tail -12 | cut -c1-330
echo "== repeat $m rc=$rc in $((SECONDS - t0)) s (total $SECONDS s)"
