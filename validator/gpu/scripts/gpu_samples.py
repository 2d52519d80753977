"""The GPU's clock, power and temperature while each replayed step was timed, one line per step.

A shard replay (`python3 -m validator.gpu.moe_shard replay`) stamps every row with the time its timing
ended (`end_unix_s`) and its timed replays (`reps_ms`); `nvidia-smi --query-gpu=... -lms N` samples the
GPU meanwhile (validator/gpu/scripts/replay_fresh.sh with SMI_MS=N). This sets the samples inside each
step's timed replays (the warm-up replays before them included, as the GPU's state going in) against
its measured time, so a step that ran slower at a lower clock or under a power cap says so:

    python3 validator/gpu/scripts/gpu_samples.py SAMPLES.csv REPLAY.json [...]

prints `G <log> <step> ms=<measured> sm=<SM MHz> mem=<memory MHz> w=<W> t=<deg C> r=<throttle
reasons, OR-ed> n=<samples>` per step (medians of its samples) and `GS <log> ...` once per log (the
medians over its steps). The samples' timestamps are the GPU host's local time, as nvidia-smi writes them.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
import time
from pathlib import Path

FIELDS = ("timestamp", "clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "clocks_throttle_reasons.active")


def _num(x: str) -> float | None:
    x = x.strip().split(" ")[0]
    try:
        return float(int(x, 16)) if x.startswith("0x") else float(x)
    except ValueError:
        return None


def read_samples(path: Path) -> list[tuple[float, list[float | None]]]:
    """(unix s, [sm MHz, mem MHz, W, deg C, reasons]) per sample line; unreadable lines skipped."""
    out = []
    for row in csv.reader(path.read_text().splitlines()):
        if len(row) < 2:
            continue
        stamp = row[0].strip()
        try:
            whole, _, frac = stamp.partition(".")
            t = time.mktime(time.strptime(whole, "%Y/%m/%d %H:%M:%S")) + float("0." + (frac or "0"))
        except ValueError:
            continue
        out.append((t, [_num(v) for v in row[1:]]))
    return out


def _med(xs: list[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return statistics.median(v) if v else None


def _fmt(x: float | None, spec: str = ".0f") -> str:
    return "-" if x is None else format(x, spec)


def step_lines(samples: list[tuple[float, list[float | None]]], replay: dict, warm: int = 2) -> list[str]:
    lines = []
    for log, res in (replay.get("logs") or {}).items():
        name = Path(log).name
        per_step = []
        for r in res.get("rows", []):
            reps = r.get("reps_ms") or [r["measured_ms"]]
            end = r.get("end_unix_s")
            if end is None:
                continue
            start = end - (len(reps) + warm) * max(reps) / 1e3 - 0.05
            inside = [v for t, v in samples if start <= t <= end + 0.05]
            cols = [_med([v[i] if i < len(v) else None for v in inside]) for i in range(5)]
            per_step.append(cols)
            reasons = [v[4] for v in inside if len(v) > 4 and v[4] is not None]
            mask = 0
            for x in reasons:
                mask |= int(x)
            lines.append(
                f"G {name} {r['step']} ms={r['measured_ms']:.3f} sm={_fmt(cols[0])} mem={_fmt(cols[1])}"
                f" w={_fmt(cols[2])} t={_fmt(cols[3])} r={hex(mask)} n={len(inside)}"
            )
        if per_step:
            med = [_med([c[i] for c in per_step]) for i in range(4)]
            lines.append(
                f"GS {name} steps={len(per_step)} sm={_fmt(med[0])} mem={_fmt(med[1])} w={_fmt(med[2])} t={_fmt(med[3])}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2:
        print("usage: gpu_samples.py SAMPLES.csv REPLAY.json [...]", file=sys.stderr)
        return 2
    src = Path(argv[0])
    if not src.is_file():
        print(f"error: {src}: no such file", file=sys.stderr)
        return 2
    samples = read_samples(src)
    for f in argv[1:]:
        try:
            replay = json.loads(Path(f).read_text())
        except (OSError, json.JSONDecodeError) as e:
            print(f"error: {f}: {e}", file=sys.stderr)
            return 2
        for ln in step_lines(samples, replay):
            print(ln)
    return 0


if __name__ == "__main__":
    sys.exit(main())
