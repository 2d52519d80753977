#!/bin/bash
# One device call (calls 8 and 10), per model (qwen3-8b, llama-3.1-8b, then qwen3-32b if time is left; MODELS
# overrides): ONE process profiles the model with the folded executor with the continuous split (split policy
# timed by the probe), has dsim write its DSpark step logs from the profile just saved (--steplog-cmd:
# dsim at HEAD from .dsimhead, `git archive HEAD dsim profiles traces benchmarks pyproject.toml`, simpy
# from .whl; carry both), and replays them in the same process right after (same model, same timer
# for steps <= the capture limit; dsim's own predictions), re-timing the sweep's n <= 8 points before
# each log (drift). Since call 8 the forward table is measured on dsim-shaped steps (plan.sweep_plan). Results are bundled into $OUT/bundle.tar after each stage (profiles/, steplogs/,
# results/); the log is $OUT/log.txt. EXTRA=--dry-run runs it on the CPU. BUDGET: seconds the whole
# command may take; a model is skipped when less is left than it needs (NEED_8B / NEED_32B).
BUDGET=${BUDGET:-535}
STAGE_DIRS="profiles steplogs results"
source "$(dirname "$0")/device_setup.sh"
for m in ${MODELS:-qwen3-8b llama-3.1-8b qwen3-32b}; do
  need=${NEED_8B:-110}; reps=5
  if [ "$m" = qwen3-32b ]; then need=${NEED_32B:-200}; reps=3; fi
  left=$((BUDGET - SECONDS))
  if [ $left -lt $need ]; then echo "== skip $m: $left s left, needs ~$need s" | tee -a "$LOG"; continue; fi
  t0=$SECONDS
  profile_replay "$m" "$ST" $reps $((left - 3))
  rc=$?
  grep -E "^\[$m\] (sweep|fit|replay)|split (tune|policy)|recheck|hetero vs uniform|attention R=" "$LOG" | tail -22 | cut -c1-330
  bundle
  echo "== $m rc=$rc in $((SECONDS - t0)) s (total $SECONDS s)"
done
