"""Step logs (torch-free): a generated log, reading dsim's step logs, and the error summary of a
replay's predicted vs measured steps.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dsim.errors import InputError
from validator.gpu.plan import PREFILL_MIN_Q, median


def synthetic_steplog(
    seed: int = 0,
    concurrencies: Sequence[int] = (1, 32, 256),
    steps_each: int = 30,
    prefill_steps: int = 6,
    ctx_lo: int = 500,
    ctx_hi: int = 8000,
) -> list[dict]:
    """Realistic decode/verify batches: per request 1..8 query tokens (speculative verify windows,
    weighted towards small windows), contexts uniform in [ctx_lo, ctx_hi]; plus prefill chunks
    (alone and mixed with decodes, chunked-prefill style). predicted_ms left None."""
    rng = random.Random(seed)
    out = []
    i = 0
    for c in concurrencies:
        for _ in range(steps_each):
            q = [rng.choice([1, 2, 2, 3, 3, 4, 4, 5, 6, 7, 8]) for _ in range(c)]
            ctx = [rng.randint(ctx_lo, ctx_hi) for _ in range(c)]
            out.append({"step": i, "q": q, "ctx": ctx, "predicted_ms": None, "concurrency": c})
            i += 1
    for k in range(prefill_steps):
        chunk = [512, 2048, 4096][k % 3]
        ctx0 = [0, 2048][(k // 3) % 2]
        ndec = [0, 16][k % 2]
        q = [rng.randint(1, 8) for _ in range(ndec)] + [chunk]
        ctx = [rng.randint(ctx_lo, ctx_hi) for _ in range(ndec)] + [ctx0]
        out.append({"step": i, "q": q, "ctx": ctx, "predicted_ms": None, "concurrency": "prefill"})
        i += 1
    return out


MAX_STEPLOG_BYTES = 1 << 30


def read_steplog(path: str | Path) -> list[dict]:
    """A step log's steps (one JSON object a line with lists ``q`` and ``ctx`` of token counts),
    bounded in size, records and nesting; InputError naming file and line for anything else."""
    from dsim.schema import read_json_lines

    steps = []
    for ln, d in read_json_lines(path, "step log", max_bytes=MAX_STEPLOG_BYTES):
        q, ctx = d.get("q"), d.get("ctx")
        if not (isinstance(q, list) and isinstance(ctx, list) and q and len(q) == len(ctx)):
            raise InputError(f"{path}:{ln}: q and ctx must be non-empty lists of equal length")
        if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= 1 << 40 for x in q + ctx):
            raise InputError(f"{path}:{ln}: q and ctx must hold token counts (integers >= 0)")
        steps.append(d)
    return steps


def error_summary(rows: list[dict], key: str = "concurrency") -> dict:
    """Median and p90 absolute % error of predicted vs measured, per group and overall."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        if r.get("predicted_ms") is None or not r.get("measured_ms"):
            continue
        e = abs(r["predicted_ms"] - r["measured_ms"]) / r["measured_ms"] * 100
        groups.setdefault(str(r.get(key, "all")), []).append(e)
        groups.setdefault("all", []).append(e)
    return {
        g: dict(steps=len(v), median_abs_pct=round(median(v), 3), p90_abs_pct=round(float(np.percentile(v, 90)), 3))
        for g, v in groups.items()
    }


def concurrency_of(step: dict) -> int | str:
    c = step.get("concurrency")
    if c is not None:
        return c
    if max(step["q"]) >= PREFILL_MIN_Q:
        return "prefill"
    return len(step["q"])
