#!/bin/bash
# One device call, per model (qwen3-8b, llama-3.1-8b, qwen3-32b; MODELS overrides): profile it with the
# ragged split-KV executor, regenerate dsim's DSpark step logs with that profile (benchmarks/
# make_replay_steplogs.py, run from .dsimhead: `git archive HEAD dsim profiles traces benchmarks
# pyproject.toml`, simpy from .whl; carry both), and replay them (predictions: dsim's own, in the logs).
# Everything is bundled into $OUT/bundle.tar after each stage (profiles/, steplogs/, results/); the
# log is $OUT/log.txt. EXTRA=--dry-run runs it on the CPU.
STAGE_DIRS="profiles steplogs results"
source "$(dirname "$0")/device_setup.sh"
for m in ${MODELS:-qwen3-8b llama-3.1-8b qwen3-32b}; do
  t0=$SECONDS
  python3 -m validator.gpu.profile --model "profiles/models/$m.json" --out "$ST/profiles" $EXTRA >>"$LOG" 2>&1 \
    || { echo "profile $m failed"; tail -20 "$LOG"; bundle; exit 1; }
  grep -E "^\[$m\] (sweep|fit)|hetero vs uniform" "$LOG" | tail -4 | cut -c1-400
  cp "$ST/profiles/h200-$m.yaml" .dsimhead/profiles/h200/ || exit 1
  (cd .dsimhead && PYTHONPATH=/tmp/site python3 benchmarks/make_replay_steplogs.py --models "$m" --out "$ST/steplogs") \
    >>"$LOG" 2>&1 || { echo "steplogs $m failed"; tail -20 "$LOG"; bundle; exit 1; }
  bundle
  python3 -m validator.gpu.replay "$ST/steplogs/dspark-$m-c1.jsonl" "$ST/steplogs/dspark-$m-c32.jsonl" \
    "$ST/steplogs/dspark-$m-c256.jsonl" --model "profiles/models/$m.json" --profile "$ST/profiles/h200-$m.yaml" \
    --out "$ST/results/replay-$m.json" --reps 3 --warm 1 $EXTRA 2>&1 | tee -a "$LOG" | cut -c1-300
  bundle
  echo "== $m done in $((SECONDS - t0)) s"
done
