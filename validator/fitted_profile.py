"""dsim profiles of a CPU server from a step-cost fit (validator.stepfit.fit_cost): linear in the
tokens (linear_profile), or a forward table through the measured decode points (measured_profile),
the per-request work in the emulating method's draft table; zero_block_draft gives a profile without
one a free 'block' table.
"""

from __future__ import annotations

import datetime as _dt
from typing import TYPE_CHECKING

import numpy as np

from dsim.cost import Profile, Table, profile_from_dict
from validator.stepfit import SPEC_TERM

if TYPE_CHECKING:
    pass


GRID = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
# draft tables are read as a staircase (next profiled size at or above): every request count
REQ_GRID = list(range(1, 257)) + [512, 1024, 2048, 4096, 8192]


def linear_profile(
    name: str,
    kind: str,
    fit: dict,
    provenance: dict,
    kv_cache_gib: float = 1.0,
    kv_bytes_per_token: float = 1024.0,
    extra: dict | None = None,
) -> Profile:
    """A CPU profile: no CUDA graphs (capture_sizes [1]); forward(n) = ms_per_token x n; the
    per-request CPU work of speculation (ngram proposal, rejection sampling) goes to the draft
    table of the emulating method (block) keyed by sampling requests, with the speculative
    machinery's per-step cost (SPEC_TERM) as its constant; cpu_overhead_ms per step."""
    t, d = fit["ms_per_token"], fit["ms_per_request"]
    spec = float(fit.get(SPEC_TERM) or 0.0)  # per step of a speculative server: in the draft table
    return _cpu_profile(
        name,
        kind,
        provenance,
        kv_cache_gib,
        kv_bytes_per_token,
        float(fit["cpu_overhead_ms"]),
        GRID,
        [t * n for n in GRID],
        REQ_GRID,
        [spec + d * n for n in REQ_GRID],
        extra,
        kv_ms_per_ktok=float(fit.get("kv_ms_per_ktok") or 0.0),
        prefill_ms_per_chunk=float(fit.get("ms_per_prefill") or 0.0),
        prefill_discount_ms_per_ktok=float(fit.get("prefill_discount_ms_per_ktok") or 0.0),
    )


def _cpu_profile(
    name,
    kind,
    provenance,
    kv_cache_gib,
    kv_bytes_per_token,
    cpu_overhead_ms,
    tokens,
    ms,
    draft_requests,
    draft_ms,
    extra,
    kv_ms_per_ktok: float = 0.0,
    prefill_ms_per_chunk: float = 0.0,
    prefill_discount_ms_per_ktok: float = 0.0,
) -> Profile:
    """A profile of a CPU server (no CUDA graphs: capture_sizes [1]), its provenance completed with
    dsim's required fields, and the emulating method's draft table."""
    known = ("hardware", "model", "engine", "engine_version", "date", "method")
    d_ = {
        "name": name,
        "provenance": {
            "kind": kind,
            "hardware": provenance.get("hardware", "unknown"),
            "gpus_per_replica": 1,
            "model": provenance.get("model", "unknown"),
            "engine": provenance.get("engine", "vllm"),
            "engine_version": provenance.get("engine_version"),
            "date": provenance.get("date") or _dt.date.today().isoformat(),
            "method": provenance.get("method", ""),
            **{k: v for k, v in provenance.items() if k not in known},
        },
        "memory": {"kv_cache_gib": float(kv_cache_gib), "kv_bytes_per_token": float(kv_bytes_per_token)},
        "cpu_overhead_ms": round(float(cpu_overhead_ms), 5),
        "capture_sizes": [1],
        "forward": {"tokens": list(tokens), "ms": [round(float(v), 5) for v in ms]},
        "kv_ms_per_ktok": round(float(kv_ms_per_ktok), 6),
        "draft": {"block": {"requests": list(draft_requests), "ms": [round(float(v), 5) for v in draft_ms]}},
    }
    if prefill_ms_per_chunk or prefill_discount_ms_per_ktok:
        d_["prefill_terms"] = {
            "ms_per_chunk": round(float(prefill_ms_per_chunk), 5),
            "discount_ms_per_ktok": round(float(prefill_discount_ms_per_ktok), 5),
        }
    if extra:
        d_.update(extra)
    return profile_from_dict(d_, f"<{name}>")


def zero_block_draft(p: Profile) -> Profile:
    """The profile with a zero-cost draft table for 'block' (ngram emulation), if it has none."""
    import dataclasses

    if "block" in p.draft:
        return p
    draft = dict(p.draft)
    draft["block"] = Table(np.array([1.0, 2.0]), np.array([0.0, 0.0]))
    return dataclasses.replace(p, draft=draft)


def measured_profile(
    name: str,
    points: list[dict],
    fit: dict,
    provenance: dict,
    k: int,
    kv_cache_gib: float = 1.0,
    kv_bytes_per_token: float = 1024.0,
    extra: dict | None = None,
) -> Profile:
    """A CPU profile whose forward table runs through the measured decode points.

    Step time is not linear in the batch on CPU (it flattens as Python overhead is shared), so a
    global fit misses between and beyond its points; here forward(n) at n = B (1 + K) is the
    measured decode step minus cpu_overhead_ms, linear between points, last slope beyond (dsim's
    rule above the capture limit, capture_sizes [1]). Below the first point the fitted per-token
    slope goes down to n = 1. A prefill point is kept only where it extends the table upwards.
    What the fit identified apart from the tokens comes out of the points first: the per-request
    work goes to the emulating method's draft table (``d`` x sampling requests), the context term
    to ``kv_ms_per_ktok``; terms the fit could not identify stay 0, their work stays in the points
    (so the table is right at the swept compositions and wrong away from them, as warned).
    """
    c = float(fit["cpu_overhead_ms"])
    d = float(fit.get("ms_per_request") or 0.0)
    e = float(fit.get("ms_per_prefill") or 0.0)
    kv = float(fit.get("kv_ms_per_ktok") or 0.0) / 1000.0
    disc = float(fit.get("prefill_discount_ms_per_ktok") or 0.0) / 1000.0
    sp = float(fit.get(SPEC_TERM) or 0.0)
    dec = sorted((p for p in points if p["kind"].startswith("decode")), key=lambda p: p["n"])
    if not dec:
        raise ValueError("no decode points")
    c = min(c, 0.9 * min(p["step_ms"] for p in dec))

    def own(p: dict) -> float:
        # the point's forward part, its tokens priced as decode tokens: step minus overhead,
        # requests, prompts and context, plus what its prompt tokens cost less
        return max(
            p["step_ms"]
            - c
            - d * p["b"]
            - e * (p.get("prefills") or 0.0)
            - kv * p.get("kv", 0.0)
            - sp * (p.get("spec") or 0.0)
            + disc * (p.get("prompt_tokens") or 0.0),
            0.0,
        )

    acc: dict = {}
    for p in dec:
        acc.setdefault(max(int(round(p["n"])), 1), []).append(own(p))
    table = {n: float(np.mean(v)) for n, v in acc.items()}
    for p in sorted(points, key=lambda p: p["n"]):
        n = int(round(p["n"]))
        if p["kind"] == "prefill" and n > max(table) and own(p) >= table[max(table)]:
            table[n] = own(p)
    xs = sorted(table)
    slope = fit["ms_per_token"] + (0.0 if d else fit["ms_per_request"] / (1 + k))
    if xs[0] > 1:
        table[1] = max(table[xs[0]] - slope * (xs[0] - 1), 0.0)
    xs = sorted(table)
    ms = np.maximum.accumulate([table[x] for x in xs])
    # dsim prices a prompt token as the table's token minus the discount: the discount can be at
    # most what the table charges a token, at every size and past its end (dsim.cost checks both)
    cap = min(float(np.min(ms / np.asarray(xs, float))), (ms[-1] - ms[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0)
    if disc > cap:
        fit.setdefault("warnings", []).append(
            f"prefill_discount_ms_per_ktok: {disc * 1000:.4g} held at {max(cap, 0.0) * 1000:.4g}, what the "
            "forward table charges a token at its cheapest"
        )
        disc = max(0.999 * cap, 0.0)  # (below it after the rounding of the profile file)
    return _cpu_profile(
        name,
        "measured",
        provenance,
        kv_cache_gib,
        kv_bytes_per_token,
        c,
        xs,
        ms,
        REQ_GRID,
        [sp + d * r for r in REQ_GRID],
        extra,
        kv_ms_per_ktok=kv * 1000.0,
        prefill_ms_per_chunk=e,
        prefill_discount_ms_per_ktok=disc * 1000.0,
    )
