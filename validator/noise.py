"""Run-to-run noise: the spread of each metric over repeated identical runs.

Identical runs of the CPU test server differed by 15-20% on a busy machine; an error below the
spread of the measurement it is compared with is no evidence of anything. ``spread`` is the
relative range over the runs, (max - min) / median, per metric, in the metric names `check` uses
(``tpot_ms.p50``, ``output_tok_s``, ``tokens_per_decode_step``, ``acceptance_length``, ...). One
name per quantity, vLLM's definitions:

- ``acceptance_length``: vLLM's, 1 + accepted tokens / drafts (per draft, as `vllm bench serve`
  and vLLM's spec-decode metrics report it);
- ``tokens_per_decode_step``: tokens a request gets per decode step, 1 + accepted tokens / decode
  steps (the server's ITL-histogram count: one sample per request per step), what throughput
  depends on and what dsim simulates (a proposer without a match, as n-gram, offers no draft in a
  step: then the two differ).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Sequence

QUANTS = ("mean", "p50", "p90", "p99")
LAT = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


def tokens_per_decode_step(stats: dict) -> float | None:
    """1 + accepted / decode steps from the server's counters (ITL count), else the client's chunks."""
    spec = stats.get("spec") or {}
    hist = (stats.get("server_histograms") or {}).get("vllm:inter_token_latency_seconds") or {}
    if spec.get("num_accepted_tokens") is not None and hist.get("count"):
        return 1.0 + spec["num_accepted_tokens"] / hist["count"]
    return stats.get("tokens_per_decode_step")


def metric_values(stats: dict) -> dict:
    """{metric name: value} of one measurement's stats, in `check`'s names."""
    out = {}
    for met in LAT:
        for q in QUANTS:
            v = stats.get(f"{met}_{q}")
            if v is not None:
                out[f"{met}.{q}"] = float(v)
    if stats.get("output_tok_s") is not None:
        out["output_tok_s"] = float(stats["output_tok_s"])
    t = tokens_per_decode_step(stats)
    if t is not None:
        out["tokens_per_decode_step"] = float(t)
    al = (stats.get("spec") or {}).get("acceptance_length")
    if al is not None:
        out["acceptance_length"] = float(al)
    return out


def spread(stats_list: Sequence[dict]) -> dict:
    """Per metric over the runs: values, median and the relative range (max - min) / median.
    Needs 2 or more runs with the metric; {} otherwise."""
    per: dict = {}
    for s in stats_list:
        for k, v in metric_values(s).items():
            per.setdefault(k, []).append(v)
    out = {}
    for k, vals in per.items():
        if len(vals) < 2:
            continue
        a = np.asarray(vals, dtype=float)
        med = float(np.median(a))
        out[k] = {
            "runs": len(vals),
            "values": [round(float(x), 4) for x in a],
            "median": round(med, 4),
            "relative_spread": round(float((a.max() - a.min()) / abs(med)), 4) if med else None,
        }
    return out


QUANTILES = 41  # the empirical dispersion is kept as this many quantiles


def tpot_dispersion(runs: Sequence) -> dict | None:
    """Per-request TPOT over its run's median TPOT, over the requests with per-token timing of each
    run (validator.measure.Measurement), as QUANTILES quantiles normalised to mean 1: how much
    identical requests of one run differ (step-time jitter, background load, where a request sat in
    the batch). None with fewer than 10 requests."""
    from validator import measure

    ratios: list = []
    for m in runs:
        tp = []
        for r in m.ok_requests:
            lat = measure.request_latencies(r)
            if lat and not lat["burst"] and lat["tpot"]:
                tp.append(lat["tpot"])
        if len(tp) >= 3:
            med = float(np.median(tp))
            ratios += [t / med for t in tp]
    if len(ratios) < 10:
        return None
    a = np.asarray(ratios) / float(np.mean(ratios))
    q = np.quantile(a, np.linspace(0.0, 1.0, QUANTILES))
    return {
        "quantiles": [round(float(x), 5) for x in q],
        "requests": len(ratios),
        "cv": round(float(np.std(a)), 5),
        "p99_over_p50": round(float(np.quantile(a, 0.99) / np.quantile(a, 0.5)), 5),
    }


def step_time_distribution(stats: dict) -> dict | None:
    """The engine's step-duration distribution from the server's ITL histogram (one sample per
    request per step): mean, bucket quantiles, each over the mean."""
    h = (stats.get("server_histograms") or {}).get("vllm:inter_token_latency_seconds") or {}
    mean = h.get("mean")
    if not mean:
        return None
    out = {"samples": h.get("count"), "mean_ms": round(mean * 1e3, 4)}
    for q in ("p50", "p90", "p99"):
        if h.get(q) is not None:
            out[f"{q}_over_mean"] = round(h[q] / mean, 4)
    return out


def apply_dispersion(req, dispersion: dict, seed: int = 0):
    """dsim's request table with each completed request's TPOT multiplied by a draw from the
    measured dispersion (its E2E moved with it: E2E = TTFT + TPOT (output - 1)); a new table.
    dsim prices every step from the cost table, so identical requests come out with one TPOT (p50 =
    p99) where the real server's jitter; the draws (mean 1) leave the means and throughput alone."""
    q = np.asarray(dispersion["quantiles"], dtype=float)
    out = req.copy()
    done = out["completed"].to_numpy() & np.isfinite(out["tpot_ms"].to_numpy())
    rng = np.random.default_rng(seed)
    f = np.interp(rng.random(int(done.sum())), np.linspace(0.0, 1.0, len(q)), q)
    tpot = out["tpot_ms"].to_numpy().copy()
    tpot[done] = tpot[done] * f
    e2e = out["e2e_ms"].to_numpy().copy()
    n = out["output_tokens"].to_numpy()
    e2e[done] = out["ttft_ms"].to_numpy()[done] + tpot[done] * np.maximum(n[done] - 1, 0)
    out["tpot_ms"], out["e2e_ms"] = tpot, e2e
    return out
