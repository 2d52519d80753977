"""Offline check (no GPU): which step-cost terms would fix the busy-step error of the replay?

Refits each H200 profile's measured sweep points as F(n) + slope x kv + extra terms and re-predicts
the replay rows of calls 10 (in-process) and 11 (fresh process) on the step logs they replayed
(archived in validator/gpu/call10-11/; the analysis behind the prefill terms, see NOTES.md):
- "+dec": a x decode tokens (tokens of requests with a window of at most 8; the table, context and
  hetero points are all decode);
- "+dec+pre": also beta x sum over prefill chunks of q (c + q / 2) / 1e6 (a chunk's causal
  attention: q new tokens over c cached ones), fitted without and with the single-chunk
  tail-prefill points (not fitted by the call-10 model).
Prints median |error| % per concurrency for the committed predictions and each refit (the refit
uses one F per swept n and interpolates between them, so "refit" alone differs a little from the
committed staircase at 32). See NOTES.md.

    python3 -m validator.gpu.decode_term_lead
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from validator.gpu import plan as P
from validator.gpu.refit import point_terms

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("llama-3.1-8b", "qwen3-8b", "qwen3-32b")
ARCHIVE = ROOT / "validator" / "gpu" / "call10-11"


def fit(points: list[dict], terms: tuple[str, ...]):
    """Weighted least squares as plan.fit_step_model (one F per n, slope-only context groups),
    without its pinning of negative terms: the variants as the NOTES table reports them."""
    ns = sorted({int(p["n"]) for p in points if p["tag"] not in P.SLOPE_ONLY})
    gs = sorted({(int(p["n"]), int(p["R"]), int(p["s"])) for p in points if p["tag"] in P.SLOPE_ONLY})
    base = len(ns) + len(gs)
    A = np.zeros((len(points), base + 1 + len(terms)))
    for r, p in enumerate(points):
        g = (int(p["n"]), int(p["R"]), int(p["s"])) if p["tag"] in P.SLOPE_ONLY else None
        A[r, ns.index(int(p["n"])) if g is None else len(ns) + gs.index(g)] = 1.0
        A[r, base] = p["kv"] / 1000.0
        for j, t in enumerate(terms):
            A[r, base + 1 + j] = p[t] / (1000.0 if t == "dec" else 1.0)
    y = np.array([p["ms"] for p in points])
    coef, *_ = np.linalg.lstsq(A / y[:, None], np.ones(len(y)), rcond=None)   # relative weights
    return dict(ns=np.array(ns), F=coef[:len(ns)], slope=coef[base],
                coef=dict(zip(terms, coef[base + 1:])))


def predict(model, row, log_step) -> float:
    ns, F = model["ns"], model["F"]
    n = row["n_pad"]
    f = F[np.searchsorted(ns, n)] if n in ns else float(np.interp(n, ns, F))
    dec, pre = P.step_terms(log_step["q"], log_step["ctx"])
    c = model["coef"]
    return f + model["slope"] * row["kv"] / 1000.0 + c.get("dec", 0.0) * dec / 1000.0 + c.get("pre", 0.0) * pre


def main():
    for m in MODELS:
        pts = json.loads((ROOT / f"profiles/h200/h200-{m}.raw.json").read_text())["points"]
        point_terms(pts)          # (the committed raw files carry them; older ones get them here)
        fitted = [p for p in pts if p["tag"] not in ("hetero", "tail-prefill")]     # call 10's fitted set
        with_prefill = fitted + [p for p in pts if p["tag"] == "tail-prefill"]
        models = {"refit": fit(fitted, ()), "+dec": fit(fitted, ("dec",)),
                  "+dec+pre": fit(fitted, ("dec", "pre")),
                  "+dec+pre (tail-prefill fitted)": fit(with_prefill, ("dec", "pre"))}
        print(f"{m}: " + "; ".join(f"{k}: " + ", ".join(f"{t} {v:.3g}" for t, v in mo["coef"].items())
                                   for k, mo in models.items() if mo["coef"]))
        for kind in ("replay", "standalone-replay"):
            d = json.loads((ARCHIVE / "results" / f"{kind}-{m}.json").read_text())
            for name, v in d["logs"].items():
                rows = v["rows"] if isinstance(v, dict) else v
                logs = {r["step"]: r for r in map(json.loads, open(ARCHIVE / "steplogs" / Path(name).name))}
                meas = np.array([r["measured_ms"] for r in rows])

                def med(pred):
                    return float(np.median(np.abs(np.asarray(pred) - meas) / meas * 100))
                cells = [f"committed {med([r['predicted_ms'] for r in rows]):.2f}"]
                cells += [f"{k} {med([predict(mo, r, logs[r['step']]) for r in rows]):.2f}" for k, mo in models.items()]
                print(f"  {kind:17s} c={rows[0]['concurrency']:<3}: " + " | ".join(cells))


if __name__ == "__main__":
    main()
