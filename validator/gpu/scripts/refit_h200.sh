#!/bin/bash
# The fit behind the measured H200 profiles, no GPU: each model's profile is refitted from its
# sweep (h200-<model>.raw.json) and its stored context, request-grid and busy-step sweeps
# (refit --stored-context: validator.gpu.refit_points.stored_context), then every stored replay of it
# (archive/h200/replay/{replay,heldout,check,repeat-*-,s<k>*-,start<k>-}<model>.json) is predicted again from the new
# profile into <replay>.repredicted.json (the replays are checking data: never fitted).
#   MODELS (default: llama-3.1-8b qwen3-8b qwen3-14b qwen3-32b)
set -e -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
H=archive/h200      # the sweeps and replays (archive/MANIFEST.md)
Y=profiles/h200     # the profiles the refit writes (profile_files.yaml_of)
for m in ${MODELS:-llama-3.1-8b qwen3-8b qwen3-14b qwen3-32b}; do
  # its stored sweeps (refit_points.stored_context: ctx, grid and the busy steps pooled over machine starts)
  python3 -m validator.gpu.refit "$H/h200-$m.raw.json" --stored-context --in-place
  rep=""
  for k in replay heldout check; do
    [ -f "$H/replay/$k-$m.json" ] && rep="$rep --repredict $H/replay/$k-$m.json $Y/h200-$m.yaml $H/replay/$k-$m.repredicted.json"
  done
  for f in "$H"/replay/repeat-*-"$m".json "$H"/replay/s[0-9]*-"$m".json "$H"/replay/start[0-9]*-"$m".json; do
    [ -f "$f" ] && rep="$rep --repredict $f $Y/h200-$m.yaml ${f%.json}.repredicted.json"
  done
  python3 -m validator.gpu.refit $rep
done
