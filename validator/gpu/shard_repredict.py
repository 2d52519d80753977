"""Re-predict measured shard replays with another profile, without a GPU.

A shard replay (``python3 -m validator.gpu.moe_shard replay``) records, for every step of a dsim
step log, the measured per-GPU step time. The shapes stay what they were; only the prediction
changes when the composer or its kernel table changes. This prices each logged step with a
profile (CostModel.step_ms of its tokens and KV, prefill_ms of its prompt chunks and context_ms
of its decode/verify requests, as the engine does) and reports |predicted - measured| / measured per log (median, p90, signed mean) and per step.

    python3 -m validator.gpu.shard_repredict PROFILE REPLAY.json STEPLOG_DIR [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from dsim.cost import CostModel, load_profile
from dsim.errors import InputError
from validator.gpu.plan import PREFILL_MIN_Q


def repredict(profile: str, replay: dict, steplog_dir: Path) -> dict:
    cost = CostModel(load_profile(profile))
    out = {}
    for name, v in replay["logs"].items():
        path = steplog_dir / Path(name).name
        steps = {}
        for ln, line in enumerate(path.read_text().splitlines(), 1):
            try:
                st = json.loads(line)
            except json.JSONDecodeError:
                raise InputError(f"{path}:{ln}: not JSON") from None
            steps[st["step"]] = st
        signed, rows = [], []
        for r in v["rows"]:
            st = steps[r["step"]]
            n = int(sum(st["q"]))
            kv = int(sum(st["ctx"])) + n
            chunks = [(q, c) for q, c in zip(st["q"], st["ctx"]) if q >= PREFILL_MIN_Q]
            dec = [(q, c) for q, c in zip(st["q"], st["ctx"]) if q < PREFILL_MIN_Q]
            pred = float(cost.step_ms(n, kv)) + float(cost.prefill_ms(chunks))
            if dec:  # the decode/verify requests' own attention (profile format 2/3), as the engine adds it
                pred += float(cost.context_ms([q for q, _ in dec], [c for _, c in dec], chunks))
            signed.append((pred - r["measured_ms"]) / r["measured_ms"] * 100)
            rows.append(
                dict(
                    step=r["step"],
                    tokens=n,
                    prompt_tokens=int(sum(q for q, _ in chunks)),
                    measured_ms=round(float(r["measured_ms"]), 3),
                    predicted_ms=round(pred, 3),
                    error_pct=round(signed[-1], 2),
                )
            )
        if not signed:
            raise InputError(f"{name}: no replayed steps")
        e = np.abs(signed)
        out[Path(name).name] = dict(
            steps=len(signed),
            median_abs_pct=round(float(np.median(e)), 2),
            p90_abs_pct=round(float(np.percentile(e, 90)), 2),
            signed_mean_pct=round(float(np.mean(signed)), 2),
            rows=rows,
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m validator.gpu.shard_repredict", description=__doc__.split("\n")[0])
    ap.add_argument("profile")
    ap.add_argument("replay")
    ap.add_argument("steplogs")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    try:
        res = dict(
            profile=a.profile,
            replay=a.replay,
            logs=repredict(a.profile, json.loads(Path(a.replay).read_text()), Path(a.steplogs)),
        )
    except (InputError, OSError, KeyError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = json.dumps(res, indent=1)
    if a.out:
        Path(a.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
