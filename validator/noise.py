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


# ---- the host's load and drift within a measurement campaign ---------------------------------------

# A run is flagged when the host's 1-minute load average moved by more than this many runnable
# tasks per CPU between its start and its end: on the 2-core test host a change of one busy
# process per core moved p50 TPOT by 10-35% (validator/README.md, "Noise, gates and names").
LOAD_CHANGE_PER_CPU = 0.5


def host_load() -> dict | None:
    """The host's load now: the 1-, 5- and 15-minute load averages (/proc/loadavg), the CPUs
    this process may run on, and this process's CPU time (s; for the client's CPU share over a
    run). None where /proc/loadavg cannot be read."""
    import os
    import time

    try:
        with open("/proc/loadavg") as f:
            la = [float(x) for x in f.read().split()[:3]]
    except (OSError, ValueError):
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {"loadavg": la, "cpus": int(os.cpu_count() or cpus), "cpu_s": time.process_time(), "wall_s": time.time()}


def load_change(before: dict | None, after: dict | None) -> dict | None:
    """What changed on the host over a run (host_load at its start and end): the 1-minute load
    averages, the change per CPU, the client's CPU time over the wall time (its share of a core:
    a client starved of CPU time stamps chunks late) and ``changed``: the load moved by more
    than LOAD_CHANGE_PER_CPU runnable tasks per CPU. None without both."""
    if not before or not after:
        return None
    cpus = max(int(after.get("cpus") or before.get("cpus") or 1), 1)
    a, b = before["loadavg"][0], after["loadavg"][0]
    wall = after["wall_s"] - before["wall_s"]
    per = (b - a) / cpus
    return {
        "loadavg_1m": [round(a, 2), round(b, 2)],
        "change_per_cpu": round(per, 3),
        "client_cpu_share": round((after["cpu_s"] - before["cpu_s"]) / wall, 3) if wall > 0 else None,
        "changed": bool(abs(per) > LOAD_CHANGE_PER_CPU),
    }


def load_flags(ms) -> list[str]:
    """One line for every measurement whose host load changed during the run (load_change)."""
    out = []
    for m in ms:
        lc = (m.summary or {}).get("host_load")
        if lc and lc.get("changed"):
            out.append(
                f"{m.path}: the host's load changed during the run (1-minute load average {lc['loadavg_1m'][0]:g} -> "
                f"{lc['loadavg_1m'][1]:g}, {lc['change_per_cpu']:+.2f} per CPU): its figures hold that change"
            )
    return out


# other work's part of the engine CPUs' busy time above which a run is named (validator.hostcpu):
# on the CPU test server at eight requests, a campaign whose C=8 runs had other work on the
# engine's CPU missed p50 TPOT by 10-16%, one without it by 4-6% (docs/results)
INTERFERENCE_SHARE = 0.05


def interference_flags(ms) -> list[str]:
    """One line for every measurement during which other work took more than INTERFERENCE_SHARE
    of the server's engine CPUs' busy time, and one where it took that much of its API server's
    CPUs besides the measuring client (hostcpu.interference)."""
    out = []
    for m in ms:
        it = (m.summary or {}).get("interference")
        if it and it.get("others_share", 0.0) > INTERFERENCE_SHARE:
            out.append(
                f"{m.path}: other work took {it['others_share']:.0%} of the server's engine CPUs "
                f"{it['engine_cpus']} ({it['others_s']:g} of {it['busy_s']:g} busy s"
                + (f", {it['client_s']:g} s of it the measuring client" if it.get("client_s") else "")
                + "): its step times hold that, a profile measured without it does not"
            )
        fr = (it or {}).get("front")
        if fr and fr.get("others_share", 0.0) > INTERFERENCE_SHARE:
            out.append(
                f"{m.path}: other work (besides the measuring client) took {fr['others_share']:.0%} of the API "
                f"server's CPUs {fr['cpus']}: its front-end times (TTFT, the way back of a closed loop) hold that"
            )
    return out


DRIFT_METRICS = ("tpot_ms.p50", "output_tok_s")


def drift(before: dict, after: dict, repeats: Sequence[dict]) -> dict:
    """A control point measured at a campaign's start and its end (stats of each, metric_values
    names) against the spread of that point's repeats within the campaign (``repeats``: stats
    of the other runs of the same load and shape): for each of DRIFT_METRICS the relative change
    (after - before) / before, the repeats' spread, and ``drifted`` when the change is larger than
    that spread (the machine's speed moved by more than the campaign's noise: its cases were
    measured on two machines). ``drifted`` overall when any metric did."""
    vb, va = metric_values(before), metric_values(after)
    sp = spread(list(repeats))  # (the control's own two runs left out: they would widen it to the change)
    out: dict = {"metrics": {}}
    for met in DRIFT_METRICS:
        if met not in vb or met not in va or not vb[met]:
            continue
        ch = (va[met] - vb[met]) / vb[met]
        s = (sp.get(met) or {}).get("relative_spread")
        out["metrics"][met] = {
            "before": round(vb[met], 4),
            "after": round(va[met], 4),
            "change": round(ch, 4),
            "spread": s,
            "drifted": bool(s is not None and abs(ch) > s),
        }
    out["drifted"] = any(v["drifted"] for v in out["metrics"].values())
    return out
