#!/bin/bash
# One device call (call 9): (1) the issue's own check on the committed artifacts: for each model a fresh
# `python3 -m validator.gpu.replay` process replays the committed dsim step logs (validator/gpu/steplogs,
# predictions = dsim's own, written with the committed profiles) on the committed executor, split
# from the profile's provenance; (2) if time is left, the whole call-8 pipeline again for REPEAT (default
# llama-3.1-8b) into a separate folder (run-to-run spread of the figures; not committed as profiles).
# Results are bundled into $OUT/bundle.tar after each stage; the log is $OUT/log.txt.
# EXTRA=--dry-run runs it on the CPU. BUDGET: seconds the whole command may take.
set -o pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
ST=${STAGE:-/tmp/stage}
LOG=$OUT/log.txt
BUDGET=${BUDGET:-540}
mkdir -p "$OUT" "$ST/standalone" "$ST/repeat/profiles" "$ST/repeat/steplogs" "$ST/repeat/results"
bundle() { tar -cf "$OUT/bundle.tar" -C "$ST" . ; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >>"$LOG" 2>&1 || { echo "simpy install failed"; exit 1; }
(while sleep 20; do bundle; done) &
BUNDLER=$!
trap 'kill $BUNDLER 2>/dev/null; bundle' EXIT
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader | tee -a "$LOG"
SL=validator/gpu/steplogs
for m in ${MODELS:-qwen3-8b llama-3.1-8b qwen3-32b}; do
  t0=$SECONDS
  timeout $((BUDGET - SECONDS - 3)) python3 -m validator.gpu.replay "$SL/dspark-$m-c1.jsonl" "$SL/dspark-$m-c32.jsonl" \
    "$SL/dspark-$m-c256.jsonl" --model "profiles/models/$m.json" --profile "profiles/h200/h200-$m.yaml" \
    --out "$ST/standalone/replay-$m.json" --reps 5 --warm 2 $EXTRA 2>&1 | tee -a "$LOG" | cut -c1-300
  bundle
  echo "== standalone $m in $((SECONDS - t0)) s (total $SECONDS s)"
done
DSIM_DIR=$(pwd)/.dsimhead
m=${REPEAT:-llama-3.1-8b}
left=$((BUDGET - SECONDS))
if [ $left -lt ${NEED_REPEAT:-110} ]; then echo "== skip repeat $m: $left s left" | tee -a "$LOG"; exit 0; fi
t0=$SECONDS
timeout $((left - 3)) python3 -m validator.gpu.profile --model "profiles/models/$m.json" --out "$ST/repeat/profiles" \
  --reps 5 --split auto --log-predictions --recheck --replay-out "$ST/repeat/results" \
  --steplog-cmd "cp {profile} $DSIM_DIR/profiles/h200/ && cd $DSIM_DIR && PYTHONPATH=/tmp/site python3 benchmarks/make_replay_steplogs.py --models {model} --out $ST/repeat/steplogs" \
  --replay "$ST/repeat/steplogs/dspark-{model}-c1.jsonl" --replay "$ST/repeat/steplogs/dspark-{model}-c32.jsonl" \
  --replay "$ST/repeat/steplogs/dspark-{model}-c256.jsonl" $EXTRA >>"$LOG" 2>&1
rc=$?
grep -E "^\[$m\] (sweep|fit|replay)|split tune scores|recheck" "$LOG" | tail -12 | cut -c1-330
echo "== repeat $m rc=$rc in $((SECONDS - t0)) s (total $SECONDS s)"
