#!/bin/bash
# Measure the H200 step-cost profiles and check them on dsim's own steps, one process per model:
#   1. `python3 -m validator.gpu.profile` profiles the model (split-KV policy timed by the probe,
#      --split auto) and writes $OUT/profiles/h200-<model>.yaml and .raw.json;
#   2. dsim writes its DSpark step logs from the profile just measured
#      (benchmarks/make_replay_steplogs.py --profile, concurrency 1, 32, 256) into $OUT/steplogs;
#   3. the same process replays those logs right after (same model, same timer; dsim's predictions),
#      re-timing a few table points before each log (drift), into $OUT/results/replay-<model>.json.
# Runs from any directory on a machine with one GPU, torch and dsim's dependencies; the shipped
# profiles are not touched (to adopt them: the YAML files of $OUT/profiles into profiles/h200/, the .raw.json files and $OUT/steplogs into archive/h200/).
#   MODELS  models to profile (default: qwen3-8b llama-3.1-8b qwen3-32b; profiles/models/<m>.json)
#   OUT     output folder (default: /tmp/out); the log is $OUT/log.txt
#   EXTRA   extra profiler arguments, e.g. EXTRA=--dry-run runs the pipeline on the CPU (numbers
#           mean nothing; it checks the plumbing)
# The fresh-process replay of the committed step logs is scripts/replay_steplogs.sh.
set -o pipefail
cd "$(dirname "$0")/../../.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/profiles" "$OUT/steplogs" "$OUT/results"
LOG=$OUT/log.txt
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm \
  --format=csv,noheader | tee -a "$LOG"
for m in ${MODELS:-qwen3-8b llama-3.1-8b qwen3-32b}; do
  reps=5
  if [ "$m" = qwen3-32b ]; then reps=3; fi
  t0=$SECONDS
  python3 -m validator.gpu.profile --model "profiles/models/$m.json" --out "$OUT/profiles" \
    --reps "$reps" --split auto --log-predictions --recheck --replay-out "$OUT/results" \
    --steplog-cmd "python3 benchmarks/make_replay_steplogs.py --models {model} --profile {profile} --out $OUT/steplogs" \
    --replay "$OUT/steplogs/dspark-{model}-c1.jsonl" --replay "$OUT/steplogs/dspark-{model}-c32.jsonl" \
    --replay "$OUT/steplogs/dspark-{model}-c256.jsonl" $EXTRA >>"$LOG" 2>&1
  rc=$?
  grep -E "^\[$m\] (sweep|fit|replay)|split (tune|policy)" "$LOG" | tail -12 | cut -c1-300
  echo "== $m rc=$rc in $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || exit $rc
done
