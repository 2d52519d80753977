#!/bin/bash
# One device call, per model (qwen3-8b, llama-3.1-8b, qwen3-32b; MODELS overrides): profile it with the
# ragged split-KV executor, regenerate dsim's DSpark step logs with that profile (benchmarks/
# make_replay_steplogs.py, run from .dsimhead: `git archive HEAD dsim profiles traces benchmarks
# pyproject.toml`, simpy from .whl; carry both), and replay them (predictions: dsim's own, in the logs).
# Everything is bundled into $OUT/bundle.tar after each stage (profiles/, steplogs/, results/); the
# log is $OUT/log.txt. EXTRA=--dry-run runs it on the CPU.
set -o pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
ST=${STAGE:-/tmp/stage}
LOG=$OUT/log.txt
mkdir -p "$OUT" "$ST/profiles" "$ST/steplogs" "$ST/results"
bundle() { tar -cf "$OUT/bundle.tar" -C "$ST" . ; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >>"$LOG" 2>&1 || { echo "simpy install failed"; exit 1; }
(while sleep 20; do bundle; done) &     # partial results come back even if the call is cut short
BUNDLER=$!
trap 'kill $BUNDLER 2>/dev/null; bundle' EXIT
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader | tee -a "$LOG"
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
