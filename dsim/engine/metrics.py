"""Metrics with vLLM's conventions (docs/user/semantics.md §6).

Per request: TTFT = first token - arrival; TPOT = (E2E - TTFT) / (output tokens - 1);
E2E = finish - arrival; queue time = first scheduled - arrival; ITL = the gaps between a request's
streamed chunks (one chunk per engine step per request under speculative decoding).
ITL samples are kept run-length coded (value, count): inside a decode stretch every request of a
step gets the same gap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numba
import numpy as np
import pandas as pd

from dsim.kernel_cache import ensure_fresh

if TYPE_CHECKING:
    from dsim.engine.shared import Requests

ensure_fresh()  # (numba's cache does not see edits to the modules a kernel calls)

PCTS = (50, 90, 99)


def weighted_percentile(values: Any, weights: Any, pct: float) -> Any:
    """The pct-th percentile of values each repeated weights times (the lower value at a boundary,
    as for the run-length coded ITL samples); None when empty."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) == 0:
        return None
    w = np.asarray(weights, dtype=np.float64)
    return float(_weighted_values(v, w, (pct,))[0])


# Weights that sum exactly in float64 (non-negative whole numbers, total below 2**53, as the ITL
# samples' counts are): every partial sum is exact, whatever the order of summation.
_EXACT_SUM = float(2**53)


def _weighted_values(v: np.ndarray, w: np.ndarray, pcts: Sequence[float]) -> list:
    """For each pct: the value at the first position where the cumulative weight, in v's sorted
    order, reaches pct / 100 of the total (the last value if it never does). That is the smallest
    x with sum(w[v <= x]) >= pct / 100 x total, which with exactly summing weights a linear-time
    selection finds without sorting (the same value: ties and the order of summation cannot move
    it); other weights take the sort."""
    if len(v) > 1 and w.min() >= 0 and np.array_equal(np.floor(w), w):
        total = float(w.sum())
        if total < _EXACT_SUM:
            return _select_weighted(v, w, np.array([p / 100 * total for p in pcts]))
    order = np.argsort(v, kind="stable")
    vs, cw = v[order], np.cumsum(w[order])
    return [vs[min(np.searchsorted(cw, p / 100 * cw[-1], side="left"), len(vs) - 1)] for p in pcts]


@numba.njit(cache=True, nogil=True)
def _select_weighted(v, w, targets):  # pragma: no cover - compiled
    """Per target t: the smallest x in v with sum(w[v <= x]) >= t, else max(v) (quickselect with
    a three-way partition; v NaN-free, w exactly summing)."""
    n = len(v)
    out = np.empty(len(targets))
    a = np.empty(n)
    b = np.empty(n)
    for q in range(len(targets)):
        t = targets[q]
        for m in range(n):  # (element by element: a slice assignment compiles its shape error's message)
            a[m] = v[m]
            b[m] = w[m]
        lo, hi = 0, n
        below = 0.0  # the weight of the values below a[lo:hi]
        while True:
            x, y, z = a[lo], a[(lo + hi) // 2], a[hi - 1]
            pivot = max(min(x, y), min(max(x, y), z))
            # a[lo:i] < pivot, a[i:j] == pivot, a[k:hi] > pivot
            i, j, k = lo, lo, hi
            while j < k:
                if a[j] < pivot:
                    a[i], a[j] = a[j], a[i]
                    b[i], b[j] = b[j], b[i]
                    i += 1
                    j += 1
                elif a[j] > pivot:
                    k -= 1
                    a[j], a[k] = a[k], a[j]
                    b[j], b[k] = b[k], b[j]
                else:
                    j += 1
            w_less = 0.0
            for m in range(lo, i):
                w_less += b[m]
            w_eq = 0.0
            for m in range(i, j):
                w_eq += b[m]
            if i > lo and below + w_less >= t:
                hi = i
            elif below + w_less + w_eq >= t or j == hi:
                out[q] = pivot
                break
            else:
                below += w_less + w_eq
                lo = j
    return out


def dist(values: Any, weights: Any = None) -> dict:
    """{mean, p50, p90, p99} of values (weighted when weights are given); NaN-free input."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    if weights is None:
        out = {"mean": float(v.mean())}
        # (one call: the same order statistics and interpolation as one call per percentile)
        out.update({f"p{p}": float(x) for p, x in zip(PCTS, np.percentile(v, PCTS))})
    else:
        w = np.asarray(weights, dtype=np.float64)
        out = {"mean": float((v * w).sum() / w.sum())}
        for p, x in zip(PCTS, _weighted_values(v, w, PCTS)):
            out[f"p{p}"] = float(x)
    return {k: round(x, 4) for k, x in out.items()}


def request_table(reqs: Requests, class_names: Sequence[str]) -> pd.DataFrame:
    done = ~np.isnan(reqs.finish)
    ttft = (reqs.first_token - reqs.arrival) * 1e3
    e2e = (reqs.finish - reqs.arrival) * 1e3
    out = reqs.output
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (e2e - ttft) / np.maximum(out - 1, 1), np.nan)
        itl_mean = np.where(reqs.emits > 0, (reqs.finish - reqs.first_token) * 1e3 / np.maximum(reqs.emits, 1), np.nan)
    return pd.DataFrame(
        {
            "request": np.arange(reqs.n),
            "replica": reqs.replica,
            "class": np.asarray(class_names)[reqs.cls],
            "arrival_s": reqs.arrival,
            "prompt_tokens": reqs.prompt,
            "output_tokens": out,
            "cached_tokens": np.asarray(reqs.cached_tokens, dtype=np.int64),
            "queue_ms": (np.asarray(reqs.admit, dtype=np.float64) - reqs.arrival) * 1e3,
            "ttft_ms": ttft,
            "tpot_ms": tpot,
            "e2e_ms": e2e,
            "itl_mean_ms": itl_mean,
            "itl_max_ms": np.where(reqs.emits > 0, reqs.itl_max, np.nan),
            "chunks": reqs.emits + done,
            "preemptions": np.asarray(reqs.preemptions, dtype=np.int64),
            "completed": done,
        }
    )


def goodput(req: pd.DataFrame, slo: dict | None, duration_s: float) -> float | None:
    """Completed requests per second meeting every per-request SLO in `slo` ({'ttft_ms': x, ...})."""
    if not slo or duration_s <= 0:
        return None
    ok = req["completed"].to_numpy().copy()
    for key, limit in slo.items():
        col = req[key].to_numpy()
        ok &= np.nan_to_num(col, nan=0.0) <= limit
    return float(ok.sum() / duration_s)


def summarize(req: pd.DataFrame, itl_pairs: Any, n_gpus: int, slo: dict | None = None) -> dict:
    mask = req["completed"].to_numpy()

    def done(col: str) -> np.ndarray:  # (the completed requests' column, in table order)
        return req[col].to_numpy()[mask]

    n_done = int(mask.sum())
    sim_time = float(np.nanmax(req["arrival_s"].to_numpy() + req["e2e_ms"].to_numpy() / 1e3)) if n_done else 0.0
    out_tokens = int(done("output_tokens").sum())
    tpot = done("tpot_ms")
    tpot = tpot[~np.isnan(tpot)]
    if len(itl_pairs):
        arr = np.asarray(itl_pairs, dtype=np.float64)
        itl = dist(arr[:, 0], arr[:, 1])
    else:
        itl = dist([])
    thr = out_tokens / sim_time if sim_time > 0 else 0.0
    return {
        "requests_completed": n_done,
        "requests_total": int(len(req)),
        "sim_time_s": round(sim_time, 6),
        "output_tokens": out_tokens,
        "output_tok_s": round(thr, 4),
        "output_tok_s_per_gpu": round(thr / n_gpus, 4),
        "output_tok_s_per_user": round(float(np.mean(1000.0 / tpot)), 4) if len(tpot) else None,
        "request_throughput": round(n_done / sim_time, 6) if sim_time > 0 else 0.0,
        "ttft_ms": dist(done("ttft_ms")),
        "tpot_ms": dist(tpot),
        "itl_ms": itl,
        "e2e_ms": dist(done("e2e_ms")),
        "queue_ms": dist(done("queue_ms")),
        "preemptions": int(req["preemptions"].sum()),
        "goodput_req_s": goodput(req, slo, sim_time),
    }
