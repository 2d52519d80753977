#!/bin/bash
# One device call: profile the models with the ragged split-KV executor (steps above the capture limit
# captured unpadded) and replay dsim's DSpark step logs (concurrency 1, 32, 256) on each, predicted
# from the profile just measured. Outputs under $OUT: log.txt, h200-<model>.yaml, h200-<model>.raw.json
# (points, fit, replay rows). MODELS overrides the model list (order: largest last).
set -o pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader | tee "$OUT/log.txt"
args=()
for m in ${MODELS:-qwen3-8b llama-3.1-8b qwen3-32b}; do args+=(--model "profiles/models/$m.json"); done
for c in 1 32 256; do args+=(--replay "validator/gpu/steplogs/dspark-{model}-c$c.jsonl"); done
python3 -m validator.gpu.profile "${args[@]}" --out "$OUT" $EXTRA 2>&1 | tee -a "$OUT/log.txt"
