#!/bin/bash
# The busy steps timed in several fresh processes, interleaved with checking replays, on one GPU.
# A point's level varies from one process to the next (and its back-to-back reps alternate between
# two levels on the largest steps), so the fit takes each point's median over processes of each
# process's median of an odd rep count (refit --processes). Jobs run in the order given, each a
# fresh process under `timeout`, none past DEADLINE seconds (default 235); at the end every result
# is printed compactly (print_results.py), so the run's figures survive a lost file transfer.
#   JOBS  "busy:model:parts ..." (context_sweep.py --plan busy --parts parts -> $OUT/busy-<model>-p<k>.json,
#         k counting that model's busy processes) and "check:model:log,log" (replay of
#         DIR/<log>-<model>.jsonl -> $OUT/check-<model>[-<k>].json, the log's own predictions)
#   BUSY_REPS  context_sweep --reps (default 5: 5 timed replays up to the capture limit, 3 above)
#   REPS  replay reps (default 3; Qwen3-32B 2), WARM untimed replays (default 1)
#   T_BUSY, T_CHECK  per-job limits in seconds (default 55, 100)
#   DIR  the checking logs' folder (default archive/h200/steplogs-s1)
#   ANCHOR_TAGS  the sweep's tags re-timed as anchors in the busy runs (default table)
#   EXTRA  e.g. --dry-run (CPU, tiny model)
#   PRINT  print_results.py options for the closing print, e.g. --compact (one line per replayed log)
set -o pipefail
DEADLINE=${DEADLINE:-235}
RES=${OUT:-/tmp/out}
# shellcheck source=deadline_jobs.sh
source "$(dirname "$0")/deadline_jobs.sh"
DIR=${DIR:-archive/h200/steplogs-s1}
declare -A NB NC
for jb in $JOBS; do
  kind=${jb%%:*}; rest=${jb#*:}; m=${rest%%:*}; arg=${rest#*:}
  if [ "$kind" = busy ]; then
    NB[$m]=$((${NB[$m]:-0} + 1))
    job "${T_BUSY:-55}" python3 validator/gpu/scripts/context_sweep.py --plan busy --parts "$arg" \
      --model "profiles/models/$m.json" --profile "profiles/h200/h200-$m.yaml" \
      --out "$RES/busy-$m-p${NB[$m]}.json" --reps "${BUSY_REPS:-5}" --anchor-tags "${ANCHOR_TAGS:-table}" $EXTRA
  else
    NC[$m]=$((${NC[$m]:-0} + 1))
    sfx=; [ "${NC[$m]}" -gt 1 ] && sfx=-${NC[$m]}
    logs=()
    IFS=, read -r -a names <<<"$arg"
    for lg in "${names[@]}"; do
      case $lg in */*) logs+=("$lg") ;; *) logs+=("$DIR/$lg-$m.jsonl") ;; esac
    done
    reps=${REPS:-3}
    [ "$m" = qwen3-32b ] && reps=${REPS:-2}
    job "${T_CHECK:-100}" python3 -m validator.gpu.replay "${logs[@]}" \
      --model "profiles/models/$m.json" --profile "profiles/h200/h200-$m.yaml" --out "$RES/check-$m$sfx.json" \
      --reps "$reps" --warm "${WARM:-1}" $EXTRA
  fi
done
echo "total $((SECONDS - T0))s" | tee -a "$LOG"
timeout 20 python3 validator/gpu/scripts/print_results.py $PRINT "$RES"/busy-*.json "$RES"/check-*.json
