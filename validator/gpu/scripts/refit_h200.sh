#!/bin/bash
# The fit behind the measured H200 profiles, no GPU: each model's profile is refitted from its
# sweep (h200-<model>.raw.json) and its context, request-grid and busy-step sweeps
# (profiles/h200/context/{ctx,grid}-<model>.json and busy-<model>-p<k>.json, the busy steps timed in
# several processes of one machine start and busy-<model>-start<k>.json in further starts, and the
# stored replays of steplogs/busy-decode-<model>.jsonl in others; or else busy-<model>.json; those
# present), then every stored replay of it
# (profiles/h200/replay/{replay,heldout,check,repeat-*-,s<k>*-,start<k>-}<model>.json) is predicted again from the new
# profile into <replay>.repredicted.json (the replays are checking data: never fitted).
#   MODELS (default: llama-3.1-8b qwen3-8b qwen3-14b qwen3-32b)
set -e -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
H=profiles/h200
for m in ${MODELS:-llama-3.1-8b qwen3-8b qwen3-14b qwen3-32b}; do
  ctx=""
  for k in ctx grid; do [ -f "$H/context/$k-$m.json" ] && ctx="$ctx --context $H/context/$k-$m.json"; done
  # the busy steps: timed in several fresh processes where they were (busy-<model>-p<k>.json, one
  # sweep, each point the median over processes), else the one busy run
  procs=$(ls "$H"/context/busy-"$m"-p[0-9]*.json 2>/dev/null | paste -sd, - || true)
  # and the same steps timed in further machine starts (busy-<model>-start<k>.json, one vote each)
  for f in "$H"/context/busy-"$m"-start[0-9]*.json; do [ -f "$f" ] && procs="$procs+$f"; done
  # and replays of the busy-decode steps written as a step log (steplogs/busy-decode-<model>.jsonl)
  # in other starts: one vote each, on the steps a sweep run timed
  log="$H/steplogs/busy-decode-$m.jsonl"
  for f in "$H"/replay/*-"$m".json; do
    [ -n "$procs" ] && grep -q "\"$log\"" "$f" && procs="$procs+$f#$log"
  done
  procs=${procs#+}
  if [ -n "$procs" ]; then ctx="$ctx --context $procs"
  elif [ -f "$H/context/busy-$m.json" ]; then ctx="$ctx --context $H/context/busy-$m.json"; fi
  python3 -m validator.gpu.refit "$H/h200-$m.raw.json" $ctx
  rep=""
  for k in replay heldout check; do
    [ -f "$H/replay/$k-$m.json" ] && rep="$rep --repredict $H/replay/$k-$m.json $H/h200-$m.yaml $H/replay/$k-$m.repredicted.json"
  done
  for f in "$H"/replay/repeat-*-"$m".json "$H"/replay/s[0-9]*-"$m".json "$H"/replay/start[0-9]*-"$m".json; do
    [ -f "$f" ] && rep="$rep --repredict $f $H/h200-$m.yaml ${f%.json}.repredicted.json"
  done
  python3 -m validator.gpu.refit $rep
done
