#!/bin/bash
# The GPU run behind the measured H200 profiles' drafter tables (MTP, EAGLE-3, block, DSpark) at the
# drafter capture sizes (plan.DRAFT_REQUESTS: 1, 2, 4, 8-256 by 8, 272-512 by 16): one fresh
# `python3 -m validator.gpu.profile --draft-only` process per model and pass, each appending its run
# to $OUT/drafts-<model>.json, rewritten after every size (a process cut short keeps what it timed).
# Pass 1 times every model once, DSpark first; passes 2.. time them again in new processes (the
# merge takes each size's median over the processes: a level moves between processes by more than
# its reps spread within one). Jobs run under `timeout`, none past DEADLINE seconds; each process
# also stops starting sizes 6 s before its limit (--stop-at). Merge what comes back (no GPU) with
#   python3 -m validator.gpu.refit --drafts DIR/drafts-<model>.json ...
#   MODELS  in order (default: llama-3.1-8b qwen3-8b qwen3-14b qwen3-32b; profiles/models/<m>.json)
#   PASSES  processes per model (default 3)   REPS  timed replays per size (default 5)
#   T_8B / T_14B / T_32B  per-process limits in seconds (default 75 / 90 / 105)
#   DEADLINE seconds for the whole run (default 400)
#   CLOCKS  1 (default): sample the SM and memory clocks, power, temperature and clock event reasons
#           every 200 ms into $OUT/clocks.csv (gpu_samples.py's format), and log the performance
#           state after every job
#   EXTRA   e.g. --dry-run (the CPU, a tiny model: checks the plumbing, its numbers mean nothing)
# Files under $OUT: drafts-<model>.json (one per model), log.txt, clocks.csv.
set -o pipefail
DEADLINE=${DEADLINE:-400}
RES=${OUT:-/tmp/out}
# shellcheck source=deadline_jobs.sh
source "$(dirname "$0")/deadline_jobs.sh"
export DSIM_GPU_JOB="bash validator/gpu/scripts/draft_tables.sh (PASSES=${PASSES:-3} REPS=${REPS:-5} DEADLINE=$DEADLINE)"
SAMPLER=
if [ "${CLOCKS:-1}" = 1 ] && command -v nvidia-smi >/dev/null; then
  Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active
  nvidia-smi --query-gpu=$Q --format=csv,noheader >/dev/null 2>&1 || Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu
  nvidia-smi --query-gpu=$Q --format=csv,noheader,nounits -lms 200 >"$OUT/clocks.csv" 2>/dev/null &
  SAMPLER=$!
fi
for p in $(seq 1 "${PASSES:-3}"); do
  for m in ${MODELS:-llama-3.1-8b qwen3-8b qwen3-14b qwen3-32b}; do
    case $m in
      qwen3-14b) t=${T_14B:-90} ;;
      qwen3-32b) t=${T_32B:-105} ;;
      *) t=${T_8B:-75} ;;
    esac
    left=$((DEADLINE - (SECONDS - T0)))
    [ "$t" -gt "$left" ] && t=$left
    echo "== pass $p $m" | tee -a "$LOG"
    job "$t" python3 -m validator.gpu.profile --draft-only --model "profiles/models/$m.json" --out "$OUT" \
      --reps "${REPS:-5}" --split continuous:fill=2,balance=2 --stop-at $(($(date +%s) + t - 6)) $EXTRA
    [ -n "$SAMPLER" ] && timeout 10 nvidia-smi -q -d PERFORMANCE 2>&1 | grep -v '^$' | head -30 >>"$LOG"
  done
done
[ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null
grep -E "^\[|^== |rc=|stopped" "$LOG" | cut -c1-200
ls -la "$OUT" | tee -a "$LOG"
echo "total $((SECONDS - T0))s" | tee -a "$LOG"
