#!/bin/bash
# Sourced by the deadline-bounded GPU runs (context_and_heldout.sh, grid_and_check.sh): works from
# the repository root with it on PYTHONPATH; $OUT (returned files), $RES (results, packed into
# $OUT/results.tgz unless RES is OUT) and $DEADLINE (seconds; the caller sets its own default first) get defaults;
# the GPU's name, driver and clock go to the run log $OUT/log.txt; and job() runs one step.
cd "$(dirname "${BASH_SOURCE[0]}")/../../.." || exit 2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}
RES=${RES:-/tmp/res}
DEADLINE=${DEADLINE:-520}
mkdir -p "$OUT" "$RES"
LOG=$OUT/log.txt
T0=$SECONDS
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee -a "$LOG"
# job SECONDS CMD...: runs CMD under timeout, never past DEADLINE seconds from the start (skipped when
# less than 20 s are left), then packs everything measured so far into $OUT/results.tgz (the device
# returns few files; a run cut short keeps what it measured)
job() {
  local t=$1; shift
  local left=$((DEADLINE - (SECONDS - T0)))
  if [ "$left" -lt 20 ]; then echo "== skipped (deadline): $*" | cut -c1-200 | tee -a "$LOG"; return; fi
  [ "$t" -gt "$left" ] && t=$left
  echo "== [$((SECONDS - T0))s, limit ${t}s] $*" | cut -c1-220 | tee -a "$LOG"
  timeout "$t" "$@" >>"$LOG" 2>&1
  echo "   rc=$? at $((SECONDS - T0))s" | tee -a "$LOG"
  [ "$RES" -ef "$OUT" ] || tar czf "$OUT/results.tgz" -C "$RES" .
}
