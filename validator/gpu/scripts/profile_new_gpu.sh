#!/bin/bash
# The profiling recipe on a GPU without a profile (docs/user/gpu-profiling.md, "The profiling recipe"), one
# model, deadline-bounded, every result packed into $OUT/results.tgz as it comes:
#   1. python3 -m validator.gpu.profile (split-KV settings timed by the probe): the profile sweep, the
#      drafter tables, the context, request-grid and busy sweeps and the fit with the per-request
#      attention terms -> $RES/profiles/<gpu>-<model>.yaml, .raw.json and context/{ctx,grid,busy}-<model>.json
#      (<gpu> from the device name: h100, h200, ...);
#   2. python3 -m validator.gpu.replay in a fresh process: held-out dsim step logs (never fitted) ->
#      $RES/heldout-<model>.json; the rows are predicted from the new profile offline
#      (python3 -m validator.gpu.refit --repredict REPLAY PROFILE OUT).
#   MODEL      profiles/models/<MODEL>.json (default llama-3.1-8b)
#   LOGS       step logs to replay (default: the model's held-out logs under archive/h200/steplogs and
#              the second checking set archive/h200/steplogs-s1)
#   PROFILE_T  the profiler's limit in seconds (default 400)   DEADLINE  seconds (default 560)
#   CLOCKS     1 (default): SM clock, power and temperature every 500 ms into $RES/clocks.csv
#   EXTRA      extra arguments of both steps, e.g. EXTRA=--dry-run (CPU, tiny model: the plumbing only)
set -o pipefail
DEADLINE=${DEADLINE:-560}
# shellcheck source=deadline_jobs.sh
source "$(dirname "$0")/deadline_jobs.sh"
M=${MODEL:-llama-3.1-8b}
if [ -z "$LOGS" ]; then
  for c in mooncake-c16 mooncake-c96 azure-conv-c64 azure-code-c8; do LOGS="$LOGS archive/h200/steplogs/$c-$M.jsonl"; done
  for c in mooncake-c16 mooncake-c96 azure-conv-c32 azure-conv-c64 azure-conv-c128 azure-code-c8 default-c1 default-c32 default-c256; do
    LOGS="$LOGS archive/h200/steplogs-s1/$c-$M.jsonl"
  done
fi
SAMPLER=
if [ "${CLOCKS:-1}" = 1 ] && command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu --format=csv -lms 500 \
    >"$RES/clocks.csv" 2>&1 &
  SAMPLER=$!
fi
job "${PROFILE_T:-400}" python3 -m validator.gpu.profile --model "profiles/models/$M.json" --out "$RES/profiles" \
  --reps 5 --split auto $EXTRA
existing=""
for f in $LOGS; do [ -f "$f" ] && existing="$existing $f"; done
# shellcheck disable=SC2086
job "${REPLAY_T:-600}" python3 -m validator.gpu.replay $existing --model "profiles/models/$M.json" \
  --out "$RES/heldout-$M.json" --reps 3 --warm 1 $EXTRA
[ -n "$SAMPLER" ] && kill "$SAMPLER"
ls -laR "$RES" | tee -a "$LOG"
echo "total $((SECONDS - T0))s" | tee -a "$LOG"
[ "$RES" -ef "$OUT" ] || tar czf "$OUT/results.tgz" -C "$RES" .
