"""Offline check (no GPU): would a per-decode-token term in the step-cost model fix the busy-step
error of the replay? Refits each committed H200 profile's sweep (its fitted points only) as
F(n) + slope x kv + a x decode_tokens and re-predicts the committed replay rows (in-process and
fresh-process) with n - prefill_tokens decode tokens. Prints median |error| % per concurrency:
committed predictions, the refit without the term, the refit with it. See NOTES.md.

    python3 -m validator.gpu.decode_term_lead
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from validator.gpu import plan as P

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("llama-3.1-8b", "qwen3-8b", "qwen3-32b")


def decode_tokens(points: list[dict]) -> None:
    """Set p['n_dec'] from the sweep's seeded shapes (tails); table/context/hetero steps are all decode."""
    shapes = P.sweep_plan(kv_budget_tokens=10**9)
    key = {(s.tag, s.n, s.requests): s for s in shapes if s.tag in ("tail-mixed", "tail-decode")}
    for p in points:
        if p["tag"] in ("tail-mixed", "tail-decode"):
            s = key[(p["tag"], p["n_real"], p["R"])]
            p["n_dec"] = sum(q for q, c in zip(s.q, s.ctx) if c > 0)
        else:
            p["n_dec"] = 0 if p["tag"] == "tail-prefill" else p["n_real"]


def fit(points: list[dict], with_dec: bool):
    """Weighted least squares as plan.fit_step_model (one F per n, slope-only context groups)."""
    ns = sorted({int(p["n"]) for p in points if p["tag"] not in P.SLOPE_ONLY})
    gs = sorted({(int(p["n"]), int(p["R"]), int(p["s"])) for p in points if p["tag"] in P.SLOPE_ONLY})
    A = np.zeros((len(points), len(ns) + len(gs) + 1 + with_dec))
    for r, p in enumerate(points):
        g = (int(p["n"]), int(p["R"]), int(p["s"])) if p["tag"] in P.SLOPE_ONLY else None
        A[r, ns.index(int(p["n"])) if g is None else len(ns) + gs.index(g)] = 1.0
        A[r, len(ns) + len(gs)] = p["kv"] / 1000.0
        if with_dec:
            A[r, -1] = p["n_dec"] / 1000.0
    y = np.array([p["ms"] for p in points])
    w = 1.0 / y
    coef, *_ = np.linalg.lstsq(A * w[:, None], y * w, rcond=None)
    return np.array(ns), coef[:len(ns)], coef[len(ns) + len(gs)], (coef[-1] if with_dec else 0.0)


def predict(model, row) -> float:
    ns, F, slope, a = model
    n = row["n_pad"]
    f = F[np.searchsorted(ns, n)] if n in ns else float(np.interp(n, ns, F))
    return f + slope * row["kv"] / 1000.0 + a * (row["n"] - row["prefill_tokens"]) / 1000.0


def main():
    for m in MODELS:
        raw = json.loads((ROOT / f"profiles/h200/h200-{m}.raw.json").read_text())
        pts = raw["points"]
        decode_tokens(pts)
        fitted = [p for p in pts if p.get("fit", True)]
        base, dec = fit(fitted, False), fit(fitted, True)
        for kind in ("replay", "standalone-replay"):
            d = json.loads((ROOT / f"validator/gpu/results/{kind}-{m}.json").read_text())
            cells = []
            for v in d["logs"].values():
                rows = v["rows"] if isinstance(v, dict) else v
                meas = np.array([r["measured_ms"] for r in rows])

                def med(pred):
                    return float(np.median(np.abs(np.asarray(pred) - meas) / meas * 100))
                cells.append(f"c={rows[0]['concurrency']}: {med([r['predicted_ms'] for r in rows]):.2f} / "
                             f"{med([predict(base, r) for r in rows]):.2f} / {med([predict(dec, r) for r in rows]):.2f}")
            print(f"{m} {kind:17s} committed / refit / +decode term: " + "  ".join(cells)
                  + f"  (a = {dec[3]:.2f} ms per 1000 decode tokens)")


if __name__ == "__main__":
    main()
