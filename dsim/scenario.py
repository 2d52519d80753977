"""What a command runs: the workload (a trace, sliced and re-timed) and the speculative-decoding
method specs, built from plain values. Library code shared by the command line (dsim.cli,
dsim.plan_cli), the benchmarks and the tests; bad values raise InputError naming the option."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from dsim.errors import InputError

if TYPE_CHECKING:  # imported where used: the command line starts without pandas and simpy
    from dsim.engine import EngineConfig
    from dsim.sim import SpecConfig
    from dsim.workload import Workload

METHODS = ("none", "mtp", "eagle3", "block", "dspark")


def disaggregation(
    disaggregated: bool, remote_prefill_ms: float = 0.0, remote_prefill_ms_per_ktok: float = 0.0
) -> dict:
    """The EngineConfig fields of --disaggregated and its delays (dsim.engine.EngineConfig.kv_role):
    {} for a colocated engine. A delay without --disaggregated, or a negative or non-finite one,
    is an InputError."""
    for v, what in (
        (remote_prefill_ms, "--remote-prefill-ms"),
        (remote_prefill_ms_per_ktok, "--remote-prefill-ms-per-ktok"),
    ):
        if not (math.isfinite(v) and v >= 0):
            raise InputError(f"{what}: must be a finite number of ms >= 0, got {v}")
        if v and not disaggregated:
            raise InputError(f"{what}: applies only with --disaggregated")
    if not disaggregated:
        return {}
    return {
        "kv_role": "kv_consumer",
        "remote_prefill_ms": float(remote_prefill_ms),
        "remote_prefill_ms_per_ktok": float(remote_prefill_ms_per_ktok),
    }


def disaggregation_note(remote_prefill_ms: float, remote_prefill_ms_per_ktok: float) -> str:
    """The printed assumption of a disaggregated run (one wording for simulate, plan, sweep, ab)."""
    return (
        "decode instances of a prefill/decode-disaggregated deployment (kv_role kv_consumer): prompts' KV "
        "arrives computed, each request's first step computes its last prompt token; assumed prefill + "
        f"transfer delay {remote_prefill_ms:g} ms + {remote_prefill_ms_per_ktok:g} ms per 1000 prompt "
        "tokens, counted in TTFT"
    )


def engine_config(
    disaggregated: bool, remote_prefill_ms: float = 0.0, remote_prefill_ms_per_ktok: float = 0.0
) -> EngineConfig | None:
    """The EngineConfig of plan / sweep / ab: vLLM's defaults, disaggregated as asked; None for
    the default engine (so that every point runs with the callers' default)."""
    fields = disaggregation(disaggregated, remote_prefill_ms, remote_prefill_ms_per_ktok)
    if not fields:
        return None
    from dsim.engine import EngineConfig

    return EngineConfig(**fields)


def build_workload(
    trace: str = "default",
    fmt: str = "auto",
    requests: int | None = None,
    window: str | None = None,
    rate: float | None = None,
    rate_scale: float | None = None,
    concurrency: int | None = None,
    mix: str | None = None,
    seed: int = 0,
) -> Workload:
    """The workload a command runs: a trace (or 'default'), sliced and re-timed as asked.

    requests: the first N requests; window: 'START:END' in seconds; rate: Poisson arrivals re-drawn
    at this many requests per second (seeded); rate_scale: the trace's arrival rate scaled;
    concurrency: a closed loop of this many users (arrivals all at 0); mix: a workload-class mix
    for traces without classes."""
    if requests is not None and requests < 1:
        raise InputError(f"--requests: must be >= 1, got {requests}")
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise InputError(f"--rate: must be a finite number > 0, got {rate}")
    if seed < 0:
        raise InputError(f"--seed: must be >= 0, got {seed}")
    if concurrency is not None and concurrency < 1:
        raise InputError(f"--concurrency: must be >= 1, got {concurrency}")
    win = None
    if window:
        try:
            a, b = (float(x) for x in window.split(":"))
        except ValueError:
            raise InputError(f"--window: expected START:END in seconds, got {window!r}") from None
        win = (a, b)
    import numpy as np

    from dsim.workload import MAX_SPAN_S, load_workload

    w = load_workload(trace, fmt, mix=mix, seed=seed, n=requests, window=win, rate_scale=rate_scale)
    if rate is not None:
        rng = np.random.default_rng([seed, 7])
        gaps = rng.exponential(1.0 / rate, len(w.arrival_s))
        gaps[0] = 0.0
        if np.cumsum(gaps)[-1] > MAX_SPAN_S:
            raise InputError(f"--rate: {rate:g} req/s spreads {len(gaps)} requests over more than {MAX_SPAN_S:g} s")
        w = dataclasses.replace(
            w,
            arrival_s=np.cumsum(gaps),
            source=w.source + f"; arrivals re-drawn Poisson at {rate:g} req/s (seed {seed})",
        )
    if concurrency is not None:
        w = dataclasses.replace(
            w,
            closed_loop_concurrency=int(concurrency),
            arrival_s=np.zeros(len(w.arrival_s)),
            source=w.source + f"; closed loop, {concurrency} users",
        )
    return w


def spec_config(
    method: str,
    k: int | None,
    adaptive: bool | None,
    policy: str,
    verify_mode: str,
    acceptance: str | None,
    head: str,
    head_auc: float,
) -> SpecConfig:
    """The spec config of `dsim simulate`'s options; adaptive defaults to on for a method with a
    confidence head (DSpark)."""
    from dsim.sim import SpecConfig

    if adaptive is None:
        from dsim.spec import make_method

        adaptive = make_method(method).has_head  # a confidence head verifies adaptively by default
    return SpecConfig(
        method=method,
        k=k,
        adaptive=adaptive,
        policy=policy,
        verify_mode=verify_mode,
        acceptance=acceptance,
        head=head,
        head_auc=head_auc,
    )


def method_spec(token: str, **common: Any) -> SpecConfig:
    """A method token of --methods (or of the flag ``what``): none, mtp, mtpK (K drafts), eagle3,
    block, dspark (adaptive), dspark-fixed, dsparkK / dsparkK-fixed (a block of K, e.g. dspark5:
    the DSpark paper's production gamma = 5); common: the other SpecConfig fields."""
    import re

    what = common.pop("what", "--methods")
    from dsim.sim import SpecConfig

    t = token.strip().lower()
    k = None
    adaptive = False
    if t.startswith("mtp") and t[3:].isdigit():
        t, k = "mtp", int(t[3:])
    m = re.fullmatch(r"dspark(\d+)(-fixed|-adaptive)?", t)
    if m:
        t, k = "dspark" + (m.group(2) or ""), int(m.group(1))
    if k is not None and k < 1:
        raise InputError(f"{what}: {token!r}: the number of drafts must be >= 1")
    if t in ("dspark", "dspark-adaptive"):
        t, adaptive = "dspark", True
    elif t == "dspark-fixed":
        t = "dspark"
    if t not in METHODS:
        raise InputError(
            f"{what}: unknown method {token!r} (none, mtp, mtpK, eagle3, block, dspark, dspark-fixed, dsparkK, "
            "dsparkK-fixed)"
        )
    return SpecConfig(method=t, k=k, adaptive=adaptive, **common)
