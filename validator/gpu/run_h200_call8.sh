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
set -o pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
ST=${STAGE:-/tmp/stage}
LOG=$OUT/log.txt
BUDGET=${BUDGET:-535}
mkdir -p "$OUT" "$ST/profiles" "$ST/steplogs" "$ST/results"
bundle() { tar -cf "$OUT/bundle.tar" -C "$ST" . ; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >>"$LOG" 2>&1 || { echo "simpy install failed"; exit 1; }
(while sleep 20; do bundle; done) &     # partial results come back even if the call is cut short
BUNDLER=$!
trap 'kill $BUNDLER 2>/dev/null; bundle' EXIT
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader | tee -a "$LOG"
DSIM_DIR=$(pwd)/.dsimhead
for m in ${MODELS:-qwen3-8b llama-3.1-8b qwen3-32b}; do
  need=${NEED_8B:-110}; reps=5
  if [ "$m" = qwen3-32b ]; then need=${NEED_32B:-200}; reps=3; fi
  left=$((BUDGET - SECONDS))
  if [ $left -lt $need ]; then echo "== skip $m: $left s left, needs ~$need s" | tee -a "$LOG"; continue; fi
  t0=$SECONDS
  timeout $((left - 3)) python3 -m validator.gpu.profile --model "profiles/models/$m.json" --out "$ST/profiles" \
    --reps $reps --split auto --log-predictions --recheck --replay-out "$ST/results" \
    --steplog-cmd "cp {profile} $DSIM_DIR/profiles/h200/ && cd $DSIM_DIR && PYTHONPATH=/tmp/site python3 benchmarks/make_replay_steplogs.py --models {model} --out $ST/steplogs" \
    --replay "$ST/steplogs/dspark-{model}-c1.jsonl" --replay "$ST/steplogs/dspark-{model}-c32.jsonl" \
    --replay "$ST/steplogs/dspark-{model}-c256.jsonl" $EXTRA >>"$LOG" 2>&1
  rc=$?
  grep -E "^\[$m\] (sweep|fit|replay)|split (tune|policy)|recheck|hetero vs uniform|attention R=" "$LOG" | tail -22 | cut -c1-330
  bundle
  echo "== $m rc=$rc in $((SECONDS - t0)) s (total $SECONDS s)"
done
