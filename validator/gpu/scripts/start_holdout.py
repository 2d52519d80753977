"""Leave one machine start out: for each start that timed a model's busy steps and replayed
checking logs (scripts/start_levels.sh: context/busy-<model>-start<k>.json and
replay/start<k>-<model>.json; or a replay of the busy-decode step log beside checking logs,
replay/<label>-<model>.json), refit the profile with that start's steps left out of the pooled
busy and tail points (validator.gpu.refit_points.stored_context, as refit --stored-context builds them), and
predict that start's checking replays from that profile. A start's replays are then judged by a profile that never saw
that GPU's level: the check the pooled fit can be trusted on. No GPU.

    python3 validator/gpu/scripts/start_holdout.py [--model qwen3-14b] [--json OUT.json]

Printed per start and log: median / p90 absolute error, % (target 3 / 6), the held-out profile's
and the shipped profile's (fitted on every start).
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
H200 = ROOT / "archive" / "h200"  # the stored sweeps and replays (archive/MANIFEST.md)
PROFILES = ROOT / "profiles" / "h200"


def summaries(replay: Path, profile: Path) -> dict[str, dict]:
    from validator.gpu import refit as RF

    return {k: v["summary"]["all"] for k, v in RF.repredict(replay, profile).items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3-14b")
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    from validator.gpu import refit as RF
    from validator.gpu.refit_points import busy_log, stored_context, voting_replays

    m = a.model
    starts = (
        sorted(
            (re.search(r"start(\d+)", f).group(0) for f in glob.glob(str(H200 / "replay" / f"start[0-9]*-{m}.json"))),  # type: ignore[union-attr]
            key=lambda s: int(s[5:]),
        )
        + [f.stem[: -len(f"-{m}")] for f in voting_replays(H200, m)]
    )
    shipped = PROFILES / f"h200-{m}.yaml"
    out: dict[str, dict] = {}
    for s in starts:
        replay = H200 / "replay" / f"{s}-{m}.json"
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(shipped, Path(tmp) / shipped.name)
            shutil.copy(H200 / f"h200-{m}.raw.json", Path(tmp) / f"h200-{m}.raw.json")
            ctx = [x for c in stored_context(H200, m, leave_out=s) for x in ("--context", c)]
            if RF.main([str(Path(tmp) / f"h200-{m}.raw.json"), *ctx, "--in-place"]) != 0:
                return 2
            held = summaries(replay, Path(tmp) / f"h200-{m}.yaml")
        full = summaries(replay, shipped)
        # (a voting replay's own busy steps are fitted data, not a check)
        out[s] = {
            log: dict(held_out=held[log], shipped=full[log]) for log in held if log != Path(busy_log(H200, m)).name
        }
        for log, r in out[s].items():
            h, f = r["held_out"], r["shipped"]
            print(
                f"{m} {s} {log}: held out {h['median_abs_pct']:.2f} / {h['p90_abs_pct']:.2f} %, "
                f"shipped {f['median_abs_pct']:.2f} / {f['p90_abs_pct']:.2f} %"
            )
    if a.json:
        from dsim.outputs import write_file  # (dsim is on sys.path by now)

        write_file(a.json, json.dumps(dict(model=m, starts=out), indent=1), "output")
    return 0


if __name__ == "__main__":
    sys.exit(main())
