"""Re-predict measured shard replays with another profile, without a GPU.

A shard replay (``python3 -m validator.gpu.moe_shard replay``) records, for every step of a dsim
step log, the measured per-GPU step time. The shapes stay what they were; only the prediction
changes when the composer or its kernel table changes. This prices each logged step with a
profile (CostModel.step_ms of its tokens and KV, prefill_ms of its prompt chunks and context_ms
of its decode/verify requests, as the engine does) and reports |predicted - measured| / measured per log (median, p90, signed mean) and per step.

Each row also counts the ratio-128 (hca) blocks its decode/verify requests complete
(``hca_blocks``: the multiples of 128 in (ctx, ctx + q] per request), and each log splits its
decode-only steps by whether they complete any (``decode_only``: steps and median signed error of
each): the shard executor pools a completed block into the compressed cache in that step, work
the kernel table's equal-request records (whose contexts complete none) leave out.

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
from dsim.models import load_model
from validator.gpu.plan import PREFILL_MIN_Q

HCA_RATIO = 128  # DeepSeek-V4's heavily compressed attention: one compressed entry per 128 tokens


def completed_blocks(q: list[int], ctx: list[int], ratio: int = HCA_RATIO) -> int:
    """Blocks of ``ratio`` tokens the requests complete in a step: request r writes positions
    ctx_r .. ctx_r + q_r - 1, completing the blocks whose last position is among them."""
    return sum((c + n) // ratio - c // ratio for n, c in zip(q, ctx))


def repredict(profile: str, replay: dict, steplog_dir: Path) -> dict:
    prof = load_profile(profile)
    cost = CostModel(prof)
    # only a model with heavily compressed layers has blocks to pool (V3's MLA has none)
    hca = HCA_RATIO in load_model(str(prof.provenance["model"])).compress_ratios
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
                    hca_blocks=completed_blocks([q for q, _ in dec], [c for _, c in dec]) if hca else 0,
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
            decode_only=_by_blocks(rows),
            rows=rows,
        )
    return out


def _by_blocks(rows: list[dict]) -> dict:
    """The decode-only steps (no prompt tokens) split by whether their requests complete an hca
    block: steps and median signed error of each (None where there are none)."""
    out = {}
    for key, some in (("no_block", False), ("blocks", True)):
        e = [r["error_pct"] for r in rows if not r["prompt_tokens"] and (r["hca_blocks"] > 0) == some]
        out[key] = dict(steps=len(e), median_signed_pct=round(float(np.median(e)), 2) if e else None)
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
