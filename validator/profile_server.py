"""Measure a step-cost profile of a live server: a concurrency sweep at fixed lengths.

Each level C replays max(4, 2C) requests (or --requests) of fixed input/output length in a closed
loop of C. Step times come from the server's own histograms over the level (mean ITL: one sample
per request per step; mean prefill time: the step that ran a prompt), so a CPU-starved client does
not bias them, each at the mean composition of the steps it sampled, rebuilt from the client's
chunk times (steps.server_points: closed-loop requests start in waves that share steps; with a
deterministic drafter, separate points for the steps whose decodes drafted and those whose did
not). The terms of stepfit.fit_cost (per-step overhead, per token in dsim's coordinate n = prompt
tokens + decodes x (1 + drafts verified), per request, per prompt, per context token, the prompt
token's discount) are fitted over all levels; when every term is identified the fit is the
profile (fitted_profile.linear_profile), else the forward table runs through the measured decode points
(fitted_profile.measured_profile). The profile (provenance kind "measured", server version, model, flags,
date) is one dsim.cost.load_profile reads. Predict only within (or near) the swept batch sizes.
"""

from __future__ import annotations

import datetime as _dt
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from dsim.cost import load_profile, save_profile
from dsim.errors import InputError
from validator import driver, measure, stepfit, traces
from validator.fitted_profile import linear_profile, measured_profile
from validator.launch import settle
from validator.steps import server_points

if TYPE_CHECKING:
    from collections.abc import Iterable

    from dsim.cost import Profile


def parse_shape(text: str) -> tuple[int, int, int]:
    """``INPUT:OUTPUT[@C]`` -> (input tokens, output tokens, concurrency; default 1)."""
    try:
        shape, _, c = str(text).partition("@")
        i, o = shape.split(":")
        v = (int(i), int(o), int(c) if c else 1)
    except ValueError:
        raise InputError(f"--shape: INPUT:OUTPUT[@CONCURRENCY], e.g. 256:16 or 256:128@4; got {text!r}") from None
    if min(v) < 1:
        raise InputError(f"--shape: lengths and concurrency must be >= 1, got {text!r}")
    return v


def profile_from_measurements(
    files_by_level: dict,
    name: str | None = None,
    hardware: str = "unknown",
    server_flags: str | None = None,
    kv_cache_gib: float = 1.0,
    kv_bytes_per_token: float = 1024.0,
    input_len: int | None = None,
    output_len: int | None = None,
    pinned: dict | None = None,
    front_end_files: list | None = None,
) -> Profile:
    """The measured profile from closed-loop runs already made, {level: [files...]} (runs of one
    level are pooled; a level is a concurrency, or any label such as "c1 256:16" for a point of
    another shape): e.g. levels measured interleaved with the runs to predict. ``front_end_files``:
    runs that are points of the front end only (calibrate.front_end_fit), e.g. the same model's
    server without speculation at loads of its own."""
    concurrencies = sorted(files_by_level, key=lambda c: (isinstance(c, str), str(c) if isinstance(c, str) else c))
    ms = [measure.pool([measure.read(f) for f in files_by_level[c]], where="profile") for c in concurrencies]
    files = [f for c in concurrencies for f in files_by_level[c]]
    server = ms[0].header.get("server")
    h0 = ms[0].header
    k = (h0.get("spec") or {}).get("k") or 0
    pts = []
    for m, c in zip(ms, concurrencies):
        for p in server_points(m, k):
            pts.append(dict(p, level=c))
    if not pts:
        raise InputError(f"{server}: no step times measured (no /metrics histograms and no chunks)")
    # repeats of every level (interleaved rounds): each round's points apart, so that a term no
    # larger than the run-to-run noise is told from a measured one (stepfit.fit_cost)
    n_rounds = min(len(files_by_level[c]) for c in concurrencies)
    rounds = None
    if n_rounds >= stepfit.MIN_ROUNDS:
        rounds = [
            [p for c in concurrencies for p in server_points(measure.read(files_by_level[c][r]), k)]
            for r in range(n_rounds)
        ]
    fit = stepfit.fit_cost(pts, rounds=rounds, pinned=pinned)
    if share := overhead_share(fit, pts):
        fit["overhead_share"] = share
    for p, r in zip(pts, fit["residuals"]):
        p["fit_ms"] = p["step_ms"] * (1 + r) if r is not None else None
        p["fit_residual"] = r
    name = name or f"measured-{h0.get('model')}"
    prov = {
        "hardware": hardware,
        "model": h0.get("model"),
        "engine": "vllm",
        "engine_version": h0.get("server_version"),
        "date": _dt.date.today().isoformat(),
        "method": (
            f"validator profile-server: closed-loop concurrency sweep {concurrencies}, "
            f"input {input_len}, output {output_len} tokens; step times from server ITL and "
            f"prefill histograms; NNLS fit cpu + per-token + per-request + per-prompt + per-context-token "
            "- per-prompt-token discount"
            + (f" (not identified, left 0: {', '.join(fit['not_identified'])})" if fit["not_identified"] else "")
        ),
        "server": server,
        "server_flags": server_flags,
        "spec_k": k,
    }
    from validator.calibrate import front_end_fit, front_end_points, overhead_table, request_overheads

    ovh = request_overheads(ms)
    table = overhead_table(ms)
    # each run of the sweep is one point of the front end against the load
    fe = front_end_fit(front_end_points([measure.read(f) for f in files + list(front_end_files or [])]))
    extra = {
        "validator": {
            "request_overhead_ms": round(ovh["e2e"], 4),
            "first_token_overhead_ms": round(ovh["first_token"], 4),
            "overhead_streams": round(ovh["streams"], 4),
            "request_overhead_per_stream_ms": round(ovh["e2e_per_stream"], 4),
            "first_token_overhead_per_stream_ms": round(ovh["first_token_per_stream"], 4),
            **({"overhead_table": table} if table else {}),
            **({"front_end": fe} if fe else {}),
            "fit": fit,
            "spec_k": k,
            "spec_emulation": "block" if k else "none",
            "points": [{kk: (round(v, 4) if isinstance(v, float) else v) for kk, v in p.items()} for p in pts],
            "levels": files,
        }
    }
    if fit["determined"]:
        # every term identified: the fit itself is the profile (its residuals are in the points)
        prov["method"] = f"{prov['method']}; profile = the fit (linear)"
        prof = linear_profile(
            name, "measured", fit, prov, kv_cache_gib=kv_cache_gib, kv_bytes_per_token=kv_bytes_per_token, extra=extra
        )
    else:
        prof = measured_profile(
            name, pts, fit, prov, k, kv_cache_gib=kv_cache_gib, kv_bytes_per_token=kv_bytes_per_token, extra=extra
        )
    return prof


# Rounds by default: each term's interval is the noise of the call's rounds. Six did not make
# identical calls agree better on the overhead than three (2-core VM: 7 of 10 pairs with three,
# 9 and 4 of 10 in two sets of five calls with six, at twice the time): the level it carries
# moves between calls by more than within one.
ROUNDS = 3


def overhead_share(fit: dict, points: list[dict]) -> dict | None:
    """The overhead as a share of the sweep's mean measured step (its points' plain mean), with its
    interval likewise: the step's split without the machine's level, which moves the overhead and
    the rest together. Identical calls share their points' compositions, so their shares compare
    where their overheads do not: five calls on a 2-core VM whose speed moved 20-45% between runs
    agreed on it in 9-10 pairs of 10 (seven sets), on the overhead itself in 4-10. None without an
    interval."""
    iv = (fit.get("intervals") or {}).get("cpu_overhead_ms")
    steps = [p["step_ms"] for p in points if p.get("step_ms")]
    if not iv or not steps:
        return None
    mean = float(sum(steps) / len(steps))
    return {
        "value": round(fit["cpu_overhead_ms"] / mean, 4),
        "low": round(iv["low"] / mean, 4),
        "high": round(iv["high"] / mean, 4),
        "mean_step_ms": round(mean, 4),
    }


def profile_server(
    server: str,
    out: str | Path,
    concurrencies: Iterable[int],
    input_len: int,
    output_len: int,
    requests_per_level: int = 0,
    model: str | None = None,
    hardware: str = "unknown",
    server_flags: str | None = None,
    name: str | None = None,
    keep_dir: str | Path | None = None,
    kv_cache_gib: float = 1.0,
    kv_bytes_per_token: float = 1024.0,
    progress: bool = False,
    shapes: Iterable[tuple] = (),
    cpus: list | None = None,
    nice: int | None = -10,
    rounds: int = ROUNDS,
    warmup_rounds: int = 1,
    pinned: dict | None = None,
) -> Profile:
    """Sweep the concurrencies at input_len / output_len and each extra shape (input, output,
    concurrency), the client pinned to ``cpus``, in ``rounds`` interleaved rounds (every point
    once per round, the order rotated from round to round, so that all points see the same drift
    of the machine) after ``warmup_rounds`` rounds that are run and discarded (a fresh server's
    first runs were 1.7x slower than later ones), then probes until the server is steady
    (launch.settle; recorded as the profile's ``validator.warmup``). Rounds make each term's confidence interval and
    the test that sets a term inside the run-to-run noise to 0 (stepfit.fit_cost); one round has
    neither. ``pinned`` {term: value}: terms held at those values (stepfit.fit_cost). Writes the
    profile to ``out``."""
    concurrencies = sorted(set(int(c) for c in concurrencies))
    if not concurrencies or concurrencies[0] < 1:
        raise InputError("--concurrency: give levels >= 1")
    if rounds < 1 or warmup_rounds < 0:
        raise InputError(f"--rounds: must be >= 1 and --warmup-rounds >= 0, got {rounds} and {warmup_rounds}")
    work = Path(keep_dir) if keep_dir else Path(tempfile.mkdtemp(prefix="dsim-profile-"))
    work.mkdir(parents=True, exist_ok=True)
    levels: dict = {}
    runs: list[tuple] = [(c, input_len, output_len, c) for c in concurrencies]
    runs += [(f"c{c} {i}:{o}", i, o, c) for i, o, c in shapes]
    seq = 0
    warm: dict = {}
    for r in range(-warmup_rounds, rounds):
        if r == 0 and warmup_rounds:
            # then probes until the server is steady (launch.settle), at the largest concurrency
            t0 = time.monotonic()
            probes, steady = settle(server, max(c for *_, c in runs), input_len, output_len, cpus=cpus, nice=nice)
            warm = {
                "rounds": warmup_rounds,
                "probe_step_ms": [round(x, 4) for x in probes],
                "steady": steady,
                "probe_s": round(time.monotonic() - t0, 1),
            }
        shift = r % len(runs)
        for label, inp, outp, c in runs[shift:] + runs[:shift]:
            n = max(requests_per_level or 0, 2 * c, 4)
            opts = driver.RunOptions(
                server=server,
                model=model,
                concurrency=c,
                progress=progress,
                cpus=cpus,
                nice=nice,
                extra_header={
                    "server_flags": server_flags,
                    "profile_level": label,
                    "profile_round": r + 1 if r >= 0 else None,
                    "profile_sequence": seq,
                },
            )
            stem = f"level-c{c}" if label == c else f"shape-c{c}-{inp}x{outp}"
            path = work / (f"warmup{-r}-{stem}.jsonl" if r < 0 else f"{stem}-r{r + 1}.jsonl")
            seq += 1
            driver.run(traces.fixed(n, inp, outp), opts, path)
            m = measure.read(path)
            if not m.ok_requests:
                raise InputError(f"{server}: no request completed at {label} ({m.stats().get('failure_reasons')})")
            if r >= 0:
                levels.setdefault(label, []).append(str(path))
            elif not keep_dir:
                path.unlink()
    prof = profile_from_measurements(
        levels,
        name=name,
        hardware=hardware,
        server_flags=server_flags,
        kv_cache_gib=kv_cache_gib,
        kv_bytes_per_token=kv_bytes_per_token,
        input_len=input_len,
        output_len=output_len,
        pinned=pinned,
    )
    if warm:
        prof.extra["validator"]["warmup"] = warm
    return _save(prof, out)


def _save(prof, out):
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_profile(prof, out, "--out")
    return load_profile(str(out))
