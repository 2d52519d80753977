#!/bin/bash
# One device call: replay dsim's DSpark step logs (concurrency 1, 32, 256) and the synthetic log on
# each measured model, with the unpadded (ragged) varlen verify attention.
set -o pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for m in ${MODELS:-qwen3-8b llama-3.1-8b qwen3-32b}; do
  python3 -m validator.gpu.replay validator/gpu/steplogs/dspark-$m-c1.jsonl validator/gpu/steplogs/dspark-$m-c32.jsonl \
    validator/gpu/steplogs/dspark-$m-c256.jsonl synthetic --model profiles/models/$m.json \
    --profile profiles/h200/h200-$m.yaml --out $OUT/replay-$m.json 2>&1 | tee -a $OUT/replay-log.txt
done
