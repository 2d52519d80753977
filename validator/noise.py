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
