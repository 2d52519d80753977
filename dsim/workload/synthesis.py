"""Synthetic workloads (``synthesize``: arrivals, prompt and output lengths from stated
distributions or a trace's, a class mix; every choice recorded in ``source``) and the embedded
default workload, traces/default.jsonl (``DEFAULT_SPEC``, ``make_default``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from dsim.errors import InputError
from dsim.workload.public_traces import repo_root
from dsim.workload.readers import load_workload, save_workload
from dsim.workload.table import DEFAULT_MIX, Workload, assign_classes, parse_mix

# --------------------------------------------------------------------------------------------
# Synthetic workloads
# --------------------------------------------------------------------------------------------


def _parse_len_spec(spec: str, what: str):
    s = str(spec).strip()
    kind, _, arg = s.partition(":")
    kind = kind.strip().lower()
    if kind == "fixed":
        try:
            v = float(arg)
        except ValueError:
            raise InputError(f"{what}: bad spec {spec!r} (expected fixed:N)") from None
        if v < 1 or v != int(v):
            raise InputError(f"{what}: fixed length must be an integer >= 1, got {arg!r}")
        return ("fixed", int(v))
    if kind == "lognormal":
        try:
            mean, sigma = (float(x) for x in arg.split(","))
        except ValueError:
            raise InputError(f"{what}: bad spec {spec!r} (expected lognormal:MEAN,SIGMA)") from None
        if not (mean >= 1 and math.isfinite(mean)) or not (0 <= sigma <= 5):
            raise InputError(f"{what}: lognormal needs MEAN >= 1 and 0 <= SIGMA <= 5, got {arg!r}")
        return ("lognormal", mean, sigma)
    if kind == "trace":
        if not arg.strip():
            raise InputError(f"{what}: bad spec {spec!r} (expected trace:NAME_OR_PATH)")
        return ("trace", arg.strip())
    raise InputError(f"{what}: unknown length spec {spec!r} (fixed:N, lognormal:MEAN,SIGMA, trace:NAME_OR_PATH)")


def _draw_lengths(spec, n: int, rng: np.random.Generator) -> np.ndarray:
    if spec[0] == "fixed":
        return np.full(n, spec[1], dtype=np.int64)
    _, mean, sigma = spec
    mu = math.log(mean) - sigma * sigma / 2.0  # MEAN is the mean of the lengths, SIGMA of their log
    x = rng.lognormal(mu, sigma, size=n)
    return np.maximum(np.rint(x), 1).astype(np.int64)


def synthesize(
    n_requests: int | None = None,
    duration_s: float | None = None,
    *,
    rate: float | None = None,
    arrival: str = "poisson",
    burstiness_cv: float | None = None,
    concurrency: int | None = None,
    prompt_len: str = "lognormal:1100,0.6",
    output_len: str = "lognormal:210,0.8",
    mix: Any = None,
    seed: int = 0,
) -> Workload:
    """Generate a workload.

    Open loop: ``rate`` requests/s with ``arrival`` "poisson" (exponential gaps) or "gamma"
    (gamma gaps with coefficient of variation ``burstiness_cv``); give ``n_requests`` or
    ``duration_s`` (arrivals in [0, duration)). Closed loop: ``concurrency`` C users and
    ``n_requests`` (no rate); arrival_s are all 0.
    Length specs: "fixed:N"; "lognormal:MEAN,SIGMA" (MEAN = arithmetic mean in tokens, SIGMA =
    standard deviation of ln(length); rounded, clipped to >= 1); "trace:NAME_OR_PATH" (resampled
    from a trace; when prompt_len and output_len name the same trace the pair is resampled
    jointly). mix: class mix (default DEFAULT_MIX), always flagged assumed.
    """
    ss = np.random.SeedSequence(int(seed))
    r_arr, r_len, r_trace = (np.random.default_rng(s) for s in ss.spawn(3))
    arrival = str(arrival).lower()
    if arrival not in ("poisson", "gamma"):
        raise InputError(f"synthesize: arrival must be 'poisson' or 'gamma', got {arrival!r}")
    if n_requests is not None and (isinstance(n_requests, bool) or int(n_requests) != n_requests or n_requests < 1):
        raise InputError(f"synthesize: n_requests must be an integer >= 1, got {n_requests!r}")
    desc = []
    if concurrency is not None:
        if isinstance(concurrency, bool) or int(concurrency) != concurrency or concurrency < 1:
            raise InputError(f"synthesize: concurrency must be an integer >= 1, got {concurrency!r}")
        if rate is not None or duration_s is not None:
            raise InputError("synthesize: closed loop (concurrency) takes n_requests, not rate or duration")
        if n_requests is None:
            raise InputError("synthesize: closed loop needs n_requests")
        n = int(n_requests)
        arr = np.zeros(n, np.float64)
        desc.append(f"closed loop concurrency={int(concurrency)}, n={n}")
    else:
        if rate is None or not (float(rate) > 0 and math.isfinite(float(rate))):
            raise InputError(f"synthesize: open loop needs rate > 0 requests/s, got {rate!r}")
        if (n_requests is None) == (duration_s is None):
            raise InputError("synthesize: give exactly one of n_requests or duration_s")
        rate = float(rate)
        if arrival == "poisson":
            if burstiness_cv is not None and abs(float(burstiness_cv) - 1.0) > 1e-12:
                raise InputError("synthesize: poisson arrivals have CV 1; use arrival='gamma' for burstiness_cv")
            shape = 1.0
        else:
            cv = 1.0 if burstiness_cv is None else float(burstiness_cv)
            if not (0.05 <= cv <= 20):
                raise InputError(f"synthesize: burstiness_cv must be in [0.05, 20], got {cv!r}")
            shape = 1.0 / (cv * cv)

        def gaps(k: int) -> np.ndarray:
            if arrival == "poisson":
                return r_arr.exponential(1.0 / rate, size=k)
            return r_arr.gamma(shape, 1.0 / (rate * shape), size=k)

        if n_requests is not None:
            n = int(n_requests)
            arr = np.concatenate([[0.0], np.cumsum(gaps(n - 1))])
            desc.append(f"{arrival} rate={rate:g}/s, n={n}")
        else:
            d = float(duration_s)
            if not (d > 0 and math.isfinite(d)):
                raise InputError(f"synthesize: duration_s must be > 0, got {duration_s!r}")
            k = int(rate * d * 1.2 + 10 * math.sqrt(rate * d / shape) + 10)
            g = np.concatenate([[0.0], np.cumsum(gaps(k))])
            while g[-1] < d:
                g = np.concatenate([g, g[-1] + np.cumsum(gaps(k))])
            arr = g[g < d]
            n = len(arr)
            desc.append(f"{arrival} rate={rate:g}/s, duration={d:g}s (n={n})")
        if arrival == "gamma":
            desc.append(f"cv={1.0 if burstiness_cv is None else float(burstiness_cv):g}")
    ps = _parse_len_spec(prompt_len, "prompt_len")
    os_ = _parse_len_spec(output_len, "output_len")
    if ps[0] == "trace" or os_[0] == "trace":
        cache = {}

        def tr(name: str) -> Workload:
            if name not in cache:
                cache[name] = load_workload(name)
            return cache[name]

        if ps[0] == "trace" and os_[0] == "trace" and ps[1] == os_[1]:
            t = tr(ps[1])
            idx = r_trace.integers(0, len(t), size=n)
            prompt, output = t.prompt_tokens[idx].copy(), t.output_tokens[idx].copy()
        else:
            prompt = (
                tr(ps[1]).prompt_tokens[r_trace.integers(0, len(tr(ps[1])), size=n)].copy()
                if ps[0] == "trace"
                else None
            )
            output = (
                tr(os_[1]).output_tokens[r_trace.integers(0, len(tr(os_[1])), size=n)].copy()
                if os_[0] == "trace"
                else None
            )
            if prompt is None:
                prompt = _draw_lengths(ps, n, r_len)
            if output is None:
                output = _draw_lengths(os_, n, r_len)
    else:
        prompt = _draw_lengths(ps, n, r_len)
        output = _draw_lengths(os_, n, r_len)
    desc.append(f"prompt_len={prompt_len}, output_len={output_len}, seed={seed}")
    m = parse_mix(mix if mix is not None else DEFAULT_MIX)
    w = Workload(
        arrival_s=arr.astype(np.float64),
        prompt_tokens=prompt.astype(np.int64),
        output_tokens=output.astype(np.int64),
        cls=np.zeros(n, np.int16),
        class_names=("chat",),
        session_id=np.full(n, -1, np.int64),
        prefix_hashes=None,
        closed_loop_concurrency=None if concurrency is None else int(concurrency),
        source="synthetic: " + ", ".join(desc),
        class_mix_assumed=True,
        trace_name="synthetic",
    )
    return assign_classes(w, m, seed)


# --------------------------------------------------------------------------------------------
# The embedded default workload
# --------------------------------------------------------------------------------------------

#: Exactly how traces/default.jsonl was made (tests regenerate it and compare bytes).
DEFAULT_SPEC = dict(
    n_requests=600,
    rate=6.0,
    arrival="poisson",
    prompt_len="lognormal:1100,0.6",
    output_len="lognormal:210,0.8",
    mix="math=0.3,code=0.2,chat=0.5",
    seed=20250101,
)


def make_default(path: str | Path | None = None) -> Path:
    """Regenerate traces/default.jsonl: ``python -c "from dsim.workload import make_default; make_default()"``."""
    w = synthesize(**DEFAULT_SPEC)
    return save_workload(w, path or (repo_root() / "traces" / "default.jsonl"), "native-jsonl")
