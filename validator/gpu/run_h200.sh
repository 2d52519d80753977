#!/bin/bash
# One device call: optional smoke (SMOKE=1: 2 layers, quick sweep), then the full-depth profiles + synthetic replay.
set -o pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
if [ -n "$SMOKE" ]; then
python3 -m validator.gpu.profile --model profiles/models/llama-3.1-8b.json --out /tmp/smoke \
  --quick --layers 2 --replay synthetic --no-attn-bench 2>&1 | tail -5 || exit 1
fi
python3 -m validator.gpu.profile --model profiles/models/llama-3.1-8b.json \
  --model profiles/models/qwen3-8b.json --model profiles/models/qwen3-32b.json \
  --out $OUT --replay synthetic 2>&1 | tee $OUT/log.txt
