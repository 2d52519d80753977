#!/bin/bash
# Replay the committed DSpark step logs (archive/h200/steplogs, dsim's predictions from the shipped
# profiles) on the GPU executor, one fresh `python3 -m validator.gpu.replay` process per model, the
# split-KV policy read from the profile's provenance: the check behind archive/h200/replay/.
# Run from the repository root on a machine with one GPU and torch.
#   MODELS  models (default: qwen3-8b llama-3.1-8b qwen3-32b)
#   OUT     output folder (default: /tmp/out): replay-<model>.json, log.txt
#   EXTRA   extra replay arguments, e.g. EXTRA=--dry-run (CPU, a few small steps)
set -o pipefail
cd "$(dirname "$0")/../../.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
SL=archive/h200/steplogs
for m in ${MODELS:-qwen3-8b llama-3.1-8b qwen3-32b}; do
  python3 -m validator.gpu.replay "$SL/dspark-$m-c1.jsonl" "$SL/dspark-$m-c32.jsonl" "$SL/dspark-$m-c256.jsonl" \
    --model "profiles/models/$m.json" --profile "profiles/h200/h200-$m.yaml" \
    --out "$OUT/replay-$m.json" --reps 5 --warm 2 $EXTRA 2>&1 | tee -a "$OUT/log.txt" | cut -c1-300
  [ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
done
