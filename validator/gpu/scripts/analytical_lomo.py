"""Leave-one-model-out check of the analytical H200 profiles on measured step replays.

    python3 validator/gpu/scripts/analytical_lomo.py [--fit profiles/analytical/h200-fit.json] [--out FILE]

For each model of the fit file's leave_one_out (efficiencies fitted on the other measured models),
the analytical profile of that model is built from those efficiencies and the model's measured
replays (archive/h200/replay/heldout-, replay-, check- and s1*-<model>.json: GPU times of dsim
step logs; the busy steps replayed beside them are left out) are predicted from it (shapes from their step logs): median / p90 |error| per log and
over all steps. The held-out model's own measurements are used for checking only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> None:
    from dsim.cost import CostModel
    from dsim.profiling.analytical import analytical_profile, load_fit
    from validator.gpu import plan as P
    from validator.gpu.fit import predicted_step_ms
    from validator.gpu.profile_files import write_text_atomic
    from validator.gpu.steplog import read_steplog

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fit", default=str(ROOT / "profiles" / "analytical" / "h200-fit.json"))
    ap.add_argument("--out", default=str(ROOT / "archive" / "analytical" / "h200-lomo-replay.json"))
    a = ap.parse_args(argv)
    fit = json.loads(Path(a.fit).read_text())
    eff0, _ = load_fit(a.fit)
    out = {}
    for model, rec in fit["leave_one_out"].items():
        eff = dataclasses.replace(eff0, **rec["fitted"], source=f"fitted on {', '.join(rec['trained_on'])}")
        cost = CostModel(analytical_profile(ROOT / "profiles" / "models" / f"{model}.json", eff=eff))
        logs, every = {}, []
        rdir = ROOT / "archive" / "h200" / "replay"
        names = [f"heldout-{model}.json", f"replay-{model}.json", f"check-{model}.json"]
        names += sorted(f.name for f in rdir.glob(f"s1*-{model}.json"))
        for name in names:
            path = rdir / name
            if not path.exists():
                continue
            for src, res in json.loads(path.read_text())["logs"].items():
                if Path(src).name.startswith("busy-"):  # a profile's own fitting steps, not a dsim step log
                    continue
                steps = read_steplog(ROOT / src)
                e = [
                    abs(predicted_step_ms(cost, P.StepShape(tuple(s["q"]), tuple(s["ctx"]))) / r["measured_ms"] - 1)
                    * 100
                    for s, r in zip(steps, res["rows"])
                ]
                every += e
                logs[f"{Path(src).parent.name}/{Path(src).name}"] = dict(
                    steps=len(e),
                    median_abs_pct=round(float(np.median(e)), 2),
                    p90_abs_pct=round(float(np.percentile(e, 90)), 2),
                )
        out[model] = dict(
            trained_on=rec["trained_on"],
            forward_median_abs_pct=round(rec["held_out"]["forward_median_abs_pct"], 2),
            replay_all=dict(
                steps=len(every),
                median_abs_pct=round(float(np.median(every)), 2),
                p90_abs_pct=round(float(np.percentile(every, 90)), 2),
            ),
            logs=logs,
        )
        print(model, json.dumps(out[model]["replay_all"]), "forward", out[model]["forward_median_abs_pct"])
    write_text_atomic(a.out, json.dumps(dict(fit=Path(a.fit).name, models=out), indent=1))


if __name__ == "__main__":
    main()
