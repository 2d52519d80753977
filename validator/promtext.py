"""Prometheus text-format parsing and before/after deltas for a vLLM server's /metrics.

``parse(text) -> {name: {labels_key: value}}`` tolerates malformed lines and garbage samples (NaN,
infinite, negative counters): they are dropped and counted in ``problems``, never raised. ``delta(before, after)`` gives counter/histogram increments.
``spec_stats(delta)`` and ``histogram_stats(delta, name)`` interpret vLLM's metrics (docs/user/semantics.md §6):

- ``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
  ``..._num_accepted_tokens_total``, ``..._num_accepted_tokens_per_pos_total{position=i}``;
- histograms ``_bucket``/``_sum``/``_count``; gauges such as ``vllm:num_requests_running``.
"""

from __future__ import annotations

import math
import re

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?\s*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

SPEC_PREFIX = "vllm:spec_decode_"
# Labels that identify the server, not the series: dropped so deltas line up across scrapes.
_DROP_LABELS = {"engine", "model_name"}


class Parsed(dict):
    """name -> {label tuple -> float}; ``problems`` counts unparsable lines."""

    problems: int = 0


def parse(text: str) -> Parsed:
    out = Parsed()
    out.problems = 0
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            out.problems += 1
            continue
        name, _, labels, value = m.group(1), m.group(2), m.group(3), m.group(4)
        try:
            v = float(value)
        except ValueError:
            out.problems += 1
            continue
        # a NaN or infinite sample, or a counter below zero, is garbage from the server: dropped
        # (counted) so that deltas and rates stay numbers
        if not math.isfinite(v) or (v < 0 and name.endswith(("_total", "_bucket", "_sum", "_count"))):
            out.problems += 1
            continue
        key = tuple(sorted((k, val) for k, val in _LABEL.findall(labels or "") if k not in _DROP_LABELS))
        series = out.setdefault(name, {})
        series[key] = series.get(key, 0.0) + v  # sum over dropped labels (several engines)
    return out


def value(p: dict, name: str, **labels) -> float | None:
    series = p.get(name)
    if not series:
        return None
    want = set(labels.items())
    vals = [v for k, v in series.items() if want <= set(k)]
    return sum(vals) if vals else None


def delta(before: dict, after: dict) -> dict:
    """after - before for counters and histograms (``_total``, ``_bucket``, ``_sum``, ``_count``).

    A counter that went down (server restarted) is taken from zero: the after value.
    """
    out = {}
    for name, series in after.items():
        if not (
            name.endswith("_total") or name.endswith("_bucket") or name.endswith("_sum") or name.endswith("_count")
        ):
            continue
        b = before.get(name, {})
        d = {}
        for k, v in series.items():
            prev = b.get(k, 0.0)
            d[k] = v - prev if v >= prev else v
        out[name] = d
    return out


def spec_stats(d: dict) -> dict | None:
    """Spec-decode counters from a delta: drafts, draft tokens, accepted, per-position accepted."""
    drafts = value(d, SPEC_PREFIX + "num_drafts_total")
    if drafts is None:
        return None
    draft_tokens = value(d, SPEC_PREFIX + "num_draft_tokens_total") or 0.0
    accepted = value(d, SPEC_PREFIX + "num_accepted_tokens_total") or 0.0
    per_pos = {}
    for k, v in (d.get(SPEC_PREFIX + "num_accepted_tokens_per_pos_total") or {}).items():
        pos = dict(k).get("position")
        if pos is not None and pos.isdigit():
            per_pos[int(pos)] = per_pos.get(int(pos), 0.0) + v
    k_max = (max(per_pos) + 1) if per_pos else 0
    per_pos_list = [per_pos.get(i, 0.0) for i in range(k_max)]
    out = {
        "num_drafts": drafts,
        "num_draft_tokens": draft_tokens,
        "num_accepted_tokens": accepted,
        "accepted_per_pos": per_pos_list,
        "k": k_max,
    }
    if drafts > 0:
        out["acceptance_length"] = 1.0 + accepted / drafts
        out["acceptance_rate"] = accepted / draft_tokens if draft_tokens else None
        out["per_pos_rate"] = [a / drafts for a in per_pos_list]
        out["mean_draft_tokens"] = draft_tokens / drafts
    return out


def histogram_stats(d: dict, name: str) -> dict | None:
    """count, mean and bucket quantiles (p50/p90/p99, linear within a bucket) of a histogram delta."""
    count = value(d, name + "_count")
    total = value(d, name + "_sum")
    if not count:
        return None
    buckets = {}
    for k, v in (d.get(name + "_bucket") or {}).items():
        le = dict(k).get("le")
        if le is None:
            continue
        try:
            ub = math.inf if le in ("+Inf", "Inf", "inf") else float(le)
        except ValueError:
            continue
        buckets[ub] = buckets.get(ub, 0.0) + v
    out = {"count": count, "sum": total, "mean": (total / count) if total is not None else None}
    edges = sorted(buckets)
    for q, label in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
        target, lo, prev_c = q * count, 0.0, 0.0
        for ub in edges:
            c = buckets[ub]
            if c >= target:
                if math.isinf(ub):
                    out[label] = lo
                else:
                    frac = (target - prev_c) / (c - prev_c) if c > prev_c else 1.0
                    out[label] = lo + (ub - lo) * frac
                break
            lo, prev_c = (ub if not math.isinf(ub) else lo), c
    return out


def gauges(p: dict) -> dict:
    """The run-time gauges worth sampling during a run."""
    out = {}
    for key, name in (
        ("running", "vllm:num_requests_running"),
        ("waiting", "vllm:num_requests_waiting"),
        ("kv_cache_usage", "vllm:kv_cache_usage_perc"),
    ):
        v = value(p, name)
        if v is not None:
            out[key] = v
    if "waiting" not in out:
        v = value(p, "vllm:num_requests_waiting_by_reason")
        if v is not None:
            out["waiting"] = v
    return out


def to_jsonable(p: dict) -> dict:
    """{name: [[{labels}, value], ...]} for storage."""
    return {name: [[dict(k), v] for k, v in series.items()] for name, series in p.items()}


def from_jsonable(j: dict) -> dict:
    out = {}
    for name, rows in (j or {}).items():
        out[name] = {tuple(sorted(lbl.items())): float(v) for lbl, v in rows}
    return out


HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:iteration_tokens_total",
)


def interesting(d: dict) -> dict:
    """Keep the vllm: series (drop python/process noise) for storage."""
    return {k: v for k, v in d.items() if k.startswith("vllm:")}
