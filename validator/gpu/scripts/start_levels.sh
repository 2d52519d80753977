#!/bin/bash
# One machine start's level on a model's largest steps, for a fit pooled over machine starts: the
# busy-decode steps and the sweep's tail steps at the given sizes (anchors) timed in one fresh process
# (context_sweep.py --plan busy --parts decode), then the given step logs replayed in another (checks:
# never fitted). The level of 6-8K-token steps moves between machine starts by about the fidelity
# target, more than between processes of one start, so the refit takes one vote per start
# (refit --context "c1.json,c2.json+s1.json+s2.json", run_points). Each file records the start's
# GPU UUID and boot id. Run from the repository root on the device; files land in $OUT.
#   MODEL       default qwen3-14b
#   LABEL       the start's label in the file names (busy-<model>-<LABEL>.json, check-<model>-<LABEL>.json)
#   ANCHOR_TAGS the sweep's tags re-timed (default tail-mixed,tail-prefill), ANCHOR_N their sizes
#               (default 6144,8192)
#   BUSY_REPS   context_sweep --reps (default 7: 5 timed reps above the capture limit)
#   LOGS        step logs to replay after (comma-separated paths; default none), REPS replay reps
#               (default 3), WARM untimed ones (default 1)
#   CLOCKS      1 (default): sample SM clock, power and temperature every 200 ms into $OUT/clocks-<LABEL>.csv
#   DEADLINE    seconds for the whole run (default 200); EXTRA e.g. --dry-run
set -o pipefail
DEADLINE=${DEADLINE:-200}
RES=${OUT:-/tmp/out}
# shellcheck source=deadline_jobs.sh
source "$(dirname "$0")/deadline_jobs.sh"
m=${MODEL:-qwen3-14b}
L=${LABEL:?LABEL names this start}
SAMPLER=
if [ "${CLOCKS:-1}" = 1 ] && command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 200 \
    >"$RES/clocks-$L.csv" 2>&1 &
  SAMPLER=$!
fi
job "${T_BUSY:-90}" python3 validator/gpu/scripts/context_sweep.py --plan busy --parts decode \
  --model "profiles/models/$m.json" --profile "profiles/h200/h200-$m.yaml" --out "$RES/busy-$m-$L.json" \
  --reps "${BUSY_REPS:-7}" --anchor-tags "${ANCHOR_TAGS:-tail-mixed,tail-prefill}" --anchor-n "${ANCHOR_N:-6144,8192}" $EXTRA
if [ -n "${LOGS:-}" ]; then
  IFS=, read -r -a logs <<<"$LOGS"
  job "${T_CHECK:-100}" python3 -m validator.gpu.replay "${logs[@]}" \
    --model "profiles/models/$m.json" --profile "profiles/h200/h200-$m.yaml" --out "$RES/check-$m-$L.json" \
    --reps "${REPS:-3}" --warm "${WARM:-1}" $EXTRA
fi
[ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null
echo "total $((SECONDS - T0))s" | tee -a "$LOG"
timeout 20 python3 validator/gpu/scripts/print_results.py --compact "$RES"/busy-$m-$L.json "$RES"/check-$m-$L.json
