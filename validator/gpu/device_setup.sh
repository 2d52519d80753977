#!/bin/bash
# Sourced by the device-call scripts (run_h200_*.sh): the environment, the staging folders under
# $STAGE (set STAGE_DIRS before sourcing), $OUT/bundle.tar rebuilt every 20 s and on exit (partial
# results come back even if a call is cut short), the simpy wheel dsim needs on the device (.whl/,
# installed into /tmp/site), the GPU line in $OUT/log.txt, and `profile_replay`, the pipeline of
# calls 8 and 10. EXTRA=--dry-run runs the python steps on the CPU.
set -o pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
ST=${STAGE:-/tmp/stage}
LOG=$OUT/log.txt
mkdir -p "$OUT"
for d in ${STAGE_DIRS:-}; do mkdir -p "$ST/$d"; done
bundle() { tar -cf "$OUT/bundle.tar" -C "$ST" . ; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >>"$LOG" 2>&1 || { echo "simpy install failed"; exit 1; }
(while sleep 20; do bundle; done) &
BUNDLER=$!
trap 'kill $BUNDLER 2>/dev/null; bundle' EXIT
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader | tee -a "$LOG"
# dsim at HEAD for the step logs: `git archive HEAD dsim profiles traces benchmarks pyproject.toml`
# unpacked into .dsimhead (carried with the call, like .whl).
DSIM_DIR=$(pwd)/.dsimhead

# profile_replay MODEL DEST REPS SECONDS: ONE process profiles MODEL (folded executor, continuous
# split-KV timed by the probe) into DEST/profiles, has dsim write its DSpark step logs from the
# profile just saved into DEST/steplogs, and replays them right after in the same process
# (DEST/results; dsim's own predictions; the sweep's small points re-timed before each log).
profile_replay() {
  local m=$1 dest=$2 reps=$3 limit=$4
  timeout "$limit" python3 -m validator.gpu.profile --model "profiles/models/$m.json" --out "$dest/profiles" \
    --reps "$reps" --split auto --log-predictions --recheck --replay-out "$dest/results" \
    --steplog-cmd "cp {profile} $DSIM_DIR/profiles/h200/ && cd $DSIM_DIR && PYTHONPATH=/tmp/site python3 benchmarks/make_replay_steplogs.py --models {model} --out $dest/steplogs" \
    --replay "$dest/steplogs/dspark-{model}-c1.jsonl" --replay "$dest/steplogs/dspark-{model}-c32.jsonl" \
    --replay "$dest/steplogs/dspark-{model}-c256.jsonl" $EXTRA >>"$LOG" 2>&1
}
