"""Print the results of a GPU run compactly (one line per point or replayed step), so a run's figures
survive a lost file transfer: busy/context sweep files (scripts/context_sweep.py) as
`P <file> <i> <tag> n=<tokens> R=<requests> <rep>/<rep>/...` and replay files (validator.gpu.replay)
as `S <file> <log> <summary>` then `R <file> <log> <step> n=<tokens> <rep>/<rep>/... pred=<ms>`.
`read_printed` parses such lines back (the reps of each point or step, in order).

    python3 validator/gpu/scripts/print_results.py FILE.json [FILE.json ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _reps(xs: list[float]) -> str:
    return "/".join(f"{x:.2f}" for x in xs)


def lines(path: Path) -> list[str]:
    """The compact lines of one result file."""
    d = json.loads(path.read_text())
    out = []
    if "points" in d:
        for i, p in enumerate(d["points"]):
            out.append(f"P {path.name} {i} {p['tag']} n={p['n_real']} R={p['R']} {_reps(p.get('reps') or [p['ms']])}")
    for log, res in (d.get("logs") or {}).items():
        name = Path(log).name
        out.append(f"S {path.name} {name} {json.dumps(res.get('summary', {}).get('all', {}), separators=(',', ':'))}")
        for r in res.get("rows", []):
            out.append(
                f"R {path.name} {name} {r['step']} n={r['n']} {_reps(r.get('reps_ms') or [r['measured_ms']])}"
                f" pred={r['predicted_ms']:.2f}"
            )
    return out


def read_printed(text: str) -> dict[str, list[tuple[str, int, list[float]]]]:
    """{file: [(tag or log name, tokens, reps), ...]} from printed lines (other lines ignored)."""
    out: dict[str, list[tuple[str, int, list[float]]]] = {}
    for ln in text.splitlines():
        f = ln.split()
        if len(f) >= 6 and f[0] == "P":
            out.setdefault(f[1], []).append((f[3], int(f[4][2:]), [float(x) for x in f[6].split("/")]))
        elif len(f) >= 6 and f[0] == "R":
            out.setdefault(f[1], []).append((f[2], int(f[4][2:]), [float(x) for x in f[5].split("/")]))
    return out


def main(argv: list[str] | None = None) -> int:
    for a in argv if argv is not None else sys.argv[1:]:
        p = Path(a)
        if not p.is_file():
            continue
        try:
            print("\n".join(lines(p)), flush=True)
        except (ValueError, KeyError) as e:  # a file cut mid-write: say so, print the rest
            print(f"X {p.name} unreadable: {e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
