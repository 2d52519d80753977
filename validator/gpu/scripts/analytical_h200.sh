#!/bin/bash
# The analytical H200 profiles from the measured ones, no GPU: the efficiency fit on the four
# measured profiles with its leave-one-model-out errors (profiles/analytical/h200-fit.json), the
# four analytical-<model>-h200x1 profiles written from it, and the leave-one-model-out replay
# check (scripts/analytical_lomo.py -> archive/analytical/h200-lomo-replay.json).
set -e -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
MODELS="llama-3.1-8b qwen3-8b qwen3-14b qwen3-32b"
pairs=""
for m in $MODELS; do pairs="$pairs --pair profiles/models/$m.json profiles/h200/h200-$m.yaml"; done
python3 -m dsim.profiling.analytical fit $pairs --out profiles/analytical/h200-fit.json >/dev/null
for m in $MODELS; do
  python3 -m dsim.profiling.analytical "profiles/models/$m.json" --hardware H200 --gpus 1 --bytes-per-param 2 \
    --fit profiles/analytical/h200-fit.json --out "profiles/analytical/analytical-$m-h200x1.yaml"
done
python3 validator/gpu/scripts/analytical_lomo.py
