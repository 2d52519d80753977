"""Warnings on a simulation's result that a user should not take as a steady-state answer.

``result_warnings(requests, n_replicas, closed_loop)`` reads one simulation's request table
(dsim.engine.metrics.request_table) and returns a list of warnings, each a dict
``{"kind", "message", "value", "threshold"}``; ``sla_warnings(slos, n_completed)`` adds, for a
plan's SLA, the percentiles that rest on too few requests. dsim.sim puts the first into every
summary (``summary["warnings"]``), so ``simulate`` prints them, ``--json`` and summary.json carry
them, and plan / ab collect them per method (dsim.study.capacity.summarize_method).

The thresholds (docs/user/semantics.md, "Warnings on results") are stated here, each with why:

* replica imbalance: the busiest replica's routed work (prompt + output tokens) is at least
  IMBALANCE_RATIO x its fair share AND above it by at least IMBALANCE_SIGMAS standard
  deviations of a random split (a replica's sum of n / B requests drawn at random from the
  run's requests). The fair share divides the work among the B = min(R, ceil(L)) replicas the
  load could keep busy, L the mean number of requests in the system (Little's law): a light
  load or a closed loop of fewer users than replicas leaves replicas idle by necessity, not by
  the router. At 1.5x one replica carries half again its share: the fleet's capacity is then
  set by that replica, and a node count read off the run is off by up to a third. The noise
  term keeps a short run's chance unevenness from tripping it.
* queue growth: over the run's requests in arrival order, the least-squares slope of the queue
  delay over the arrival time is at least QUEUE_SLOPE (seconds of delay per second of trace)
  and the last quarter's median queue delay at least QUEUE_LAST_MS. A queue that grows at a
  steady slope is an arrival rate above the service rate (slope = rho - 1 for a backlog served
  at the service rate): its latencies grow with the trace's length and describe no steady
  state. 0.05 is 5% overload, or 3 s more delay per minute of trace; the 1 s floor keeps a
  queue of a few steps from counting. Closed-loop runs are not checked (their queue is bounded
  by the number of users).
* preemption / KV thrash: at least PREEMPTED_SHARE of the requests preempted at least once, or
  one request preempted THRASH_PREEMPTIONS times or more. vLLM recomputes a preempted request's
  whole context, so each preemption is a prefill paid twice and a TTFT / TPOT tail that a fleet
  with more KV cache would not have; vLLM itself warns on any preemption. 5% is the point where
  the recomputation is a visible share of the prefill work; a request preempted 3 times is the
  cache thrashing, not a one-off.
* rejected: any request over max_model_len, refused at arrival as vLLM's server refuses it
  (``rejected``; the figures then describe the rest of the trace).
* few requests finished: fewer requests completed than arrived (latency figures cover only those
  that finished); and, for an SLA percentile pNN, fewer than TAIL_REQUESTS completed requests
  beyond it (n x (1 - NN / 100) < 10): the percentile is then one of the last few requests, and
  a run this short can meet the SLA by chance.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

IMBALANCE_RATIO = 1.5
IMBALANCE_SIGMAS = 4.0
QUEUE_SLOPE = 0.05
QUEUE_LAST_MS = 1000.0
QUEUE_MIN_REQUESTS = 20  # fewer: no slope worth fitting
PREEMPTED_SHARE = 0.05
THRASH_PREEMPTIONS = 3
TAIL_REQUESTS = 10


def _warning(kind: str, message: str, value: float, threshold: float) -> dict:
    return {"kind": kind, "message": message, "value": round(float(value), 4), "threshold": threshold}


def mean_in_system(arrival_s: np.ndarray, e2e_ms: np.ndarray) -> float:
    """Little's law: the mean number of requests in the system over the run, the sum of the
    requests' times in it over the span from the first arrival to the last finish (a request that
    never finished counts until the last finish)."""
    a = np.asarray(arrival_s, dtype=np.float64)
    e = np.asarray(e2e_ms, dtype=np.float64) / 1e3
    ok = np.isfinite(a)
    a, e = a[ok], e[ok]
    if len(a) == 0:
        return 0.0
    fin = a + e
    end = float(np.nanmax(fin)) if np.isfinite(fin).any() else float(a.max())
    fin = np.where(np.isfinite(fin), fin, end)
    span = end - float(a.min())
    return float((fin - a).sum() / span) if span > 0 else float(len(a))


def replica_imbalance(
    replica: np.ndarray, work: np.ndarray, n_replicas: int, in_system: float | None = None
) -> dict | None:
    """The busiest replica's work over its fair share, when it is both IMBALANCE_RATIO or more and
    IMBALANCE_SIGMAS random-split standard deviations above it; else None. The fair share divides
    the work among the replicas the load could keep busy: min(R, ceil(in_system)) for a mean of
    `in_system` requests in the system (a closed loop of 2 users keeps 2 replicas busy at most;
    None: all R)."""
    busy = n_replicas if in_system is None else min(n_replicas, max(1, math.ceil(in_system - 1e-9)))
    if busy < 2 or len(work) == 0:
        return None
    per = np.bincount(np.asarray(replica, dtype=np.int64), weights=np.asarray(work, dtype=np.float64),
                      minlength=n_replicas)  # fmt: skip
    fair = float(per.sum()) / busy
    if fair <= 0:
        return None
    top = int(np.argmax(per))
    ratio = float(per[top]) / fair
    # a replica's sum of n / busy requests drawn at random from these: sd = sqrt(n / busy) x sd(work)
    noise = math.sqrt(len(work) / busy) * float(np.std(work))
    if ratio < IMBALANCE_RATIO or per[top] - fair < IMBALANCE_SIGMAS * noise:
        return None
    share = float(per[top]) / float(per.sum())
    return _warning(
        "replica_imbalance",
        f"replica {top} of {n_replicas} holds {share:.0%} of the routed work (prompt + output tokens), "
        f"{ratio:.2f}x its fair share over the {busy} replicas the load could keep busy (warning at "
        f"{IMBALANCE_RATIO}x): the fleet's capacity is set by that replica; try another --router",
        ratio,
        IMBALANCE_RATIO,
    )


def queue_growth(arrival_s: np.ndarray, queue_ms: np.ndarray) -> dict | None:
    """A queue delay rising over the run at QUEUE_SLOPE or more (seconds per second of trace) with
    the last quarter's median at QUEUE_LAST_MS or more; else None. Requests never admitted count
    as queued until the run's end."""
    a = np.asarray(arrival_s, dtype=np.float64)
    q = np.asarray(queue_ms, dtype=np.float64)
    ok = np.isfinite(a)
    a, q = a[ok], q[ok]
    if len(a) < QUEUE_MIN_REQUESTS or not np.ptp(a) > 0:
        return None
    order = np.argsort(a, kind="stable")
    a, q = a[order], q[order]
    end_ms = float(np.nanmax(a * 1e3 + np.nan_to_num(q, nan=0.0)))
    q = np.where(np.isnan(q), end_ms - a * 1e3, q)  # (never admitted: queued at least until the end)
    slope = float(np.polyfit(a, q / 1e3, 1)[0])
    last = float(np.median(q[len(q) - len(q) // 4 :]))
    if slope < QUEUE_SLOPE or last < QUEUE_LAST_MS:
        return None
    return _warning(
        "queue_growth",
        f"the waiting queue grows over the whole run: queue delay rises {slope:.2f} s per s of trace "
        f"(warning at {QUEUE_SLOPE}), median {last / 1e3:.1f} s in the last quarter of arrivals; arrivals "
        "outpace the fleet, so latencies grow with the trace's length and describe no steady state",
        slope,
        QUEUE_SLOPE,
    )


def preemption(preemptions: np.ndarray) -> dict | None:
    """Heavy preemption (PREEMPTED_SHARE of the requests or more preempted) or KV thrash (one request
    preempted THRASH_PREEMPTIONS times or more); else None."""
    p = np.asarray(preemptions, dtype=np.int64)
    if len(p) == 0 or not p.any():
        return None
    share = float((p > 0).mean())
    worst = int(p.max())
    if share >= PREEMPTED_SHARE:
        return _warning(
            "preemption",
            f"{share:.1%} of the requests were preempted at least once (warning at {PREEMPTED_SHARE:.0%}; "
            f"{int(p.sum())} preemptions): each recomputes its context, so latency tails reflect a KV cache too "
            "small for this load",
            share,
            PREEMPTED_SHARE,
        )
    if worst >= THRASH_PREEMPTIONS:
        return _warning(
            "kv_thrash",
            f"a request was preempted {worst} times (warning at {THRASH_PREEMPTIONS}): the KV cache thrashes",
            worst,
            THRASH_PREEMPTIONS,
        )
    return None


def incomplete(n_completed: int, n_total: int) -> dict | None:
    if n_total <= 0 or n_completed >= n_total:
        return None
    share = n_completed / n_total
    return _warning(
        "few_finished",
        f"only {n_completed} of {n_total} requests finished ({share:.1%}): latency figures cover those alone",
        share,
        1.0,
    )


def rejected(n_rejected: int, n_accepted: int, max_model_len: int | None) -> dict | None:
    """Requests the server refused at arrival (prompt + output over max_model_len, as vLLM's
    server refuses them): any at all, since the figures then describe the rest of the trace."""
    if n_rejected <= 0:
        return None
    share = n_rejected / (n_rejected + n_accepted)
    return _warning(
        "rejected_over_max_model_len",
        f"{n_rejected} request{'s' if n_rejected != 1 else ''} ({share:.1%}) rejected at arrival: prompt + output over max_model_len "
        f"{max_model_len} (as vLLM rejects them); the figures cover the other {n_accepted}",
        share,
        0.0,
    )


def result_warnings(req: pd.DataFrame, n_replicas: int, closed_loop: bool = False) -> list[dict]:
    """Every warning on one simulation's request table (dsim.engine.metrics.request_table)."""
    done = req["completed"].to_numpy()
    out = [
        replica_imbalance(
            req["replica"].to_numpy(),
            req["prompt_tokens"].to_numpy() + req["output_tokens"].to_numpy(),
            n_replicas,
            mean_in_system(req["arrival_s"].to_numpy(), req["e2e_ms"].to_numpy()),
        ),
        None if closed_loop else queue_growth(req["arrival_s"].to_numpy(), req["queue_ms"].to_numpy()),
        preemption(req["preemptions"].to_numpy()),
        incomplete(int(done.sum()), len(req)),
    ]
    return [w for w in out if w is not None]


def sla_warnings(slos: Iterable, n_completed: int) -> list[dict]:
    """For each SLA percentile term (a dsim.study.sla.SLO with a pct), a warning when fewer than
    TAIL_REQUESTS of the n_completed requests lie beyond it."""
    out = []
    for s in slos:
        if getattr(s, "pct", None) is None:
            continue
        beyond = n_completed * (1.0 - s.pct / 100.0)
        if beyond < TAIL_REQUESTS:
            out.append(
                _warning(
                    "few_finished",
                    f"{s.describe()} rests on {n_completed} finished requests, {beyond:.1f} beyond the percentile "
                    f"(warning under {TAIL_REQUESTS}): a run this short can meet the SLA by chance; use more "
                    "requests",
                    beyond,
                    TAIL_REQUESTS,
                )
            )
    return out


def format_warnings(warnings: Iterable[dict], prefix: str = "warning  : ") -> list[str]:
    """Printed lines, one per warning (wrapped as dsim's other printed fields)."""
    from dsim.outputs import field_lines

    lines: list[str] = []
    for w in warnings:
        lines += field_lines(prefix, w["message"])
    return lines
