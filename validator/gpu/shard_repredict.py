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

``fit-pool`` fits a profile's ``block_pool`` term (dsim.cost, profile format 5) on a replay of the
pool design set (``python3 -m validator.gpu.moe_steplogs --design pool``: decode-only steps in sets
that differ only in the blocks their requests complete):

    python3 -m validator.gpu.shard_repredict fit-pool PROFILE REPLAY.json DESIGN.jsonl --out POOL.json

Per compression ratio of the profile's model, a step pays ms_per_step when its requests complete a
block and ms_per_block per block; each set of the design has its own level (its KV, batch and q). The
fit is a least-absolute-deviations regression (scipy linprog; coefficients >= 0), so that one step
timed in a fresh process's fast first seconds moves it little. A ratio whose blocks the profile's
per-request records already complete from some q on (``priced_from_q``: ratio 4 at q >= 4) is fitted
and applied only on steps whose requests all have fewer query tokens; ``dsim profile compose
profile ... --block-pool POOL.json`` writes the term into a profile.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from dsim.cost import CostModel, load_profile, priced_from_q
from dsim.errors import InputError, plain
from dsim.outputs import write_file
from dsim.profiling.models import load_model
from validator.gpu.plan import PREFILL_MIN_Q

HCA_RATIO = 128  # DeepSeek-V4's heavily compressed attention: one compressed entry per 128 tokens


def completed_blocks(q: list[int], ctx: list[int], ratio: int = HCA_RATIO) -> int:
    """Blocks of ``ratio`` tokens the requests complete in a step: request r writes positions
    ctx_r .. ctx_r + q_r - 1, completing the blocks whose last position is among them."""
    return sum((c + n) // ratio - c // ratio for n, c in zip(q, ctx))


def read_steps(path: Path) -> dict[int, dict]:
    """A step log's steps by their ``step`` number (one JSON object a line)."""
    from dsim.schema import read_json_lines

    steps = {}
    for ln, st in read_json_lines(path, max_bytes=1 << 30):
        k = st.get("step")
        if not isinstance(k, int) or isinstance(k, bool):
            raise InputError(f"{path}:{ln}: step: expected the step's number, got {plain(k)}")
        steps[k] = st
    return steps


def repredict(profile: str, replay: dict, steplog_dir: Path) -> dict:
    prof = load_profile(profile)
    cost = CostModel(prof)
    # only a model with heavily compressed layers has blocks to pool (V3's MLA has none)
    hca = HCA_RATIO in load_model(str(prof.provenance["model"])).compress_ratios
    out = {}
    for name, v in replay["logs"].items():
        steps = read_steps(steplog_dir / Path(name).name)
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


def fit_block_pool(profile: str, replay: dict, design: Path) -> dict:
    """The block_pool term from a replay of the pool design set (module doc): the kinds (ratio,
    layers, ms_per_step, ms_per_block, priced_from_q), the steps fitted and their residuals."""
    from scipy.optimize import linprog

    prof = load_profile(profile)
    ra = prof.request_attention
    if ra is None:
        raise InputError(f"{profile}: no per-request attention table (format 3 or later)")
    ratios = [r for r in load_model(str(prof.provenance["model"])).compress_ratios]
    kinds = [(r, ratios.count(r), priced_from_q(r, ra.q, ra.ctx)) for r in sorted(set(ratios), reverse=True) if r]
    if not kinds:
        raise InputError(f"{profile}: the model has no compressed attention (no blocks to pool)")
    steps = read_steps(design)
    if any("shape" not in st for st in steps.values()):
        raise InputError(f"{design}: a step without 'shape' (not a pool design set)")
    hit = [v for k, v in replay["logs"].items() if Path(k).name == design.name]
    if not hit:
        raise InputError(f"replay: no log named {design.name}")
    rows = [r for r in hit[0]["rows"] if r["step"] in steps]
    if not rows:
        raise InputError(f"replay: {design.name} has no replayed steps")
    sets = sorted({steps[r["step"]]["shape"].split("-")[0] for r in rows})
    feats, t, names = [], [], []
    for r in rows:
        st = steps[r["step"]]
        q, c = [int(x) for x in st["q"]], [int(x) for x in st["ctx"]]
        f = []
        for ratio, _, from_q in kinds:
            b = completed_blocks(q, c, ratio)
            on = from_q == 0 or max(q) < from_q
            f += [1.0 if (b and on) else 0.0, float(b) if on else 0.0]
        feats.append(f + [1.0 if st["shape"].split("-")[0] == s else 0.0 for s in sets])
        t.append(float(r["measured_ms"]))
        names.append(st["shape"])
    X, y = np.array(feats), np.array(t)
    n, m = X.shape
    # min sum(u + v) s.t. X w + u - v = y, u, v >= 0; the kinds' coefficients >= 0, set levels free
    cost = np.concatenate([np.zeros(m), np.ones(2 * n)])
    A = np.hstack([X, np.eye(n), -np.eye(n)])
    bounds = [(0, None)] * (2 * len(kinds)) + [(None, None)] * len(sets) + [(0, None)] * (2 * n)
    res = linprog(cost, A_eq=A, b_eq=y, bounds=bounds, method="highs")
    if not res.success:
        raise InputError(f"fit-pool: the regression failed ({res.message})")
    w = res.x[:m]
    resid = y - X @ w
    return dict(
        profile=profile,
        design=str(design),
        kinds=[
            dict(
                ratio=int(ratio),
                layers=int(layers),
                ms_per_step=round(float(w[2 * i]), 4),
                ms_per_block=round(float(w[2 * i + 1]), 5),
                priced_from_q=int(from_q),
            )
            for i, (ratio, layers, from_q) in enumerate(kinds)
        ],
        steps=[
            dict(shape=nm, measured_ms=round(float(v), 3), residual_ms=round(float(e), 3))
            for nm, v, e in zip(names, y, resid)
        ],
    )


def _by_blocks(rows: list[dict]) -> dict:
    """The decode-only steps (no prompt tokens) split by whether their requests complete an hca
    block: steps and median signed error of each (None where there are none)."""
    out = {}
    for key, some in (("no_block", False), ("blocks", True)):
        e = [r["error_pct"] for r in rows if not r["prompt_tokens"] and (r["hca_blocks"] > 0) == some]
        out[key] = dict(steps=len(e), median_signed_pct=round(float(np.median(e)), 2) if e else None)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    fit = argv[:1] == ["fit-pool"]
    prog = "python3 -m validator.gpu.shard_repredict" + (" fit-pool" if fit else "")
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    ap.add_argument("profile")
    ap.add_argument("replay")
    ap.add_argument("design" if fit else "steplogs")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv[1:] if fit else argv)
    try:
        replay = json.loads(Path(a.replay).read_text())
        if fit:
            res = dict(fit_block_pool(a.profile, replay, Path(a.design)), replay=a.replay)
        else:
            res = dict(profile=a.profile, replay=a.replay, logs=repredict(a.profile, replay, Path(a.steplogs)))
    except (InputError, OSError, KeyError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = json.dumps(res, indent=1)
    if a.out:
        write_file(a.out, text + "\n", "output")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
