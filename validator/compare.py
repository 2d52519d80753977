"""Predicted (dsim) vs measured (real server) for the same workload at the same load.

The measured run's requests (prompt length, output length; arrival times for rate/trace runs, or
the closed-loop concurrency) become a dsim Workload; dsim simulates it with the given profile and
acceptance. A speculative server is simulated with the method ``block`` with K = the server's
number of speculative tokens; its draft cost is the profile's ``draft.block`` table (the per-request
CPU work of ngram proposal and rejection sampling, fitted by profile-server/calibrate; zero when the
profile has none). The front-end time of one request (``validator.request_overhead_ms`` /
``first_token_overhead_ms`` of a measured or calibrated profile, at one stream in flight: its
``overhead_table`` at 1 when it was measured at several loads) is added to each request's E2E /
TTFT, in closed and open loops alike: the overhead measured at higher loads holds the wait for the
running step (vLLM's queue time starts when the engine core takes a request in, between steps),
which dsim's engine simulates itself. In a closed loop that time is also simulated as the way back
from a completion to the engine, with the successors of one step's completions arriving in turn
(the real server's partial waves). An open loop's requests arrive when the client sent them.
Closed-loop throughput is scaled by (E2E + simulated way back) / (E2E + overhead).
Rows
``server.*`` compare the server's own histogram means with dsim before those overheads (TTFT and
E2E as the engine's own part, queue + prefill [+ decode]: calibrate.engine_times): the
engine-side error, free of HTTP and client noise (reported, not gated).

Errors are (predicted - measured) / measured. Which metrics gate the verdict is stated in the
report and configurable (``gates``: {metric: tolerance}); by default the fidelity targets,
``DEFAULT_GATES``: p50 TPOT and output tok/s within 10%, p99 TPOT and p99 E2E within 20%, mean
TTFT within 15%. Every other row is reported, not gated. When the measurement is several runs of
one load (repeats, pooled), each metric's run-to-run spread (validator.noise.spread: relative
range over the runs) is measured too, and a gated error is judged against the larger of its
tolerance and that spread: an error inside the noise of the measurement is not a failure. The
verdict is ``pass`` when every gated metric is within its allowance.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from dsim.cost import load_profile
from dsim.errors import InputError
from validator import measure, noise, prefix, serverconf, traces
from validator.fitted_profile import zero_block_draft

if TYPE_CHECKING:
    from dsim.cost import Profile

QUANTS = ("mean", "p50", "p90", "p99")
LAT = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
CPU_MAX_NUM_SEQS = 128  # vLLM's CPU defaults (docs/user/semantics.md §7)
CPU_MAX_BATCHED_TOKENS = 2048


# The fidelity targets (calibrate on one load and shape, predict others): metric -> tolerance.
DEFAULT_GATES = {
    "tpot_ms.p50": 0.10,
    "output_tok_s": 0.10,
    "tpot_ms.p99": 0.20,
    "e2e_ms.p99": 0.20,
    "ttft_ms.mean": 0.15,
}


def metric_names() -> list[str]:
    """Every row name `check` reports (what --gate accepts)."""
    names = [f"{m}.{q}" for m in LAT for q in QUANTS] + ["output_tok_s", "tokens_per_decode_step", "acceptance_length"]
    return names + [f"server.{m}.mean" for m in LAT]


def parse_gates(specs: list[str] | None, tolerance: float | None = None) -> dict:
    """``--gate METRIC[=TOL]`` options -> {metric: tolerance}. No --gate: DEFAULT_GATES (all at
    ``tolerance`` when given). A metric without =TOL takes ``tolerance``, else its default, else
    0.10. ``--gate none``: nothing gates."""
    if not specs:
        return {m: (tolerance if tolerance is not None else t) for m, t in DEFAULT_GATES.items()}
    names = set(metric_names())
    out: dict = {}
    for spec in specs:
        for part in str(spec).split(","):
            part = part.strip()
            if not part:
                continue
            if part == "none":
                continue
            name, _, tol = part.partition("=")
            name = name.strip()
            if name not in names:
                raise InputError(f"--gate: unknown metric {name!r} (one of: {', '.join(sorted(names))})")
            if tol:
                try:
                    t = float(tol)
                except ValueError:
                    raise InputError(f"--gate: {name}: tolerance must be a number, got {tol!r}") from None
                if not (np.isfinite(t) and t >= 0):
                    raise InputError(f"--gate: {name}: tolerance must be a finite number >= 0, got {tol!r}")
            else:
                t = tolerance if tolerance is not None else DEFAULT_GATES.get(name, 0.10)
            out[name] = t
    return out


def workload_from(m: measure.Measurement) -> tuple:
    ok = m.ok_requests
    reqs = ok if ok else m.requests
    if not reqs:
        raise InputError(f"{m.path}: no requests to simulate")
    load = m.header.get("load") or {}
    conc = load.get("concurrency") if load.get("mode") == "concurrency" else None
    # Open loop: a request reaches the server when the client sent it (send_s), which is also
    # where its measured TTFT and E2E start; the scheduled arrival (arrival_s) is earlier when the
    # client fell behind its schedule (3-4 ms on average in the Poisson runs here, 34 ms for one).
    reqs = sorted(reqs, key=lambda r: (_sent_at(r), r["i"]))
    arr = np.array([0.0 if conc else _sent_at(r) for r in reqs])
    arr = arr - arr.min()
    pin = np.array([max(int(r.get("prompt_tokens") or 1), 1) for r in reqs], dtype=np.int64)
    pout = np.array([max(int(r.get("output_tokens") or r.get("max_tokens") or 1), 1) for r in reqs], dtype=np.int64)
    plan = traces.Plan(arr, pin, pout, f"measured:{m.path}")
    # pooled closed-loop runs: each began with its users' whole first wave, and so does each
    # simulated run (one simulated loop over six pooled runs had a sixth of their first waves)
    runs = np.array([int(r.get("run") or 0) for r in reqs])
    starts = tuple(int(i) + 1 for i in np.flatnonzero(np.diff(runs))) if conc else ()
    return traces.to_workload(plan, conc, starts), conc


def _sent_at(r: dict) -> float:
    """When the client sent the request (s from the run start): send_s, else its scheduled arrival."""
    t = r.get("send_s")
    return float(t if t is not None else (r.get("arrival_s") or 0.0))


def simulate_measurement(
    m: measure.Measurement,
    profile: str | Profile,
    acceptance: str | None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    seed: int = 0,
    dispersion: bool = True,
    draft_script: bool = True,
    cost_scale: float = 1.0,
) -> dict:
    """dsim's prediction for the measured workload. A deterministic drafter with a measured draft
    script (``draft_script``) runs it in dsim's engine (EngineConfig.draft_script: each decode step
    drafts and accepts what the real one did at that step); otherwise the acceptance file's
    output-position table adapts its curve to the workload's output length, and a deterministic
    drafter is simulated without acceptance noise. A closed loop's way back to the engine is
    simulated (SimConfig.closed_loop_gap_ms / closed_loop_send_gap_ms, from the profile's front-end
    time at one request and measured send gap), and the profile's measured TPOT dispersion
    (``dispersion``) gives the requests their jitter; ``_notes`` says which applied.
    ``cost_scale`` prices every step that much higher (per-step overhead included: the whole step,
    as calibrate's one scale does), for the sensitivity of each metric to the step cost."""
    from dsim.sim import EngineConfig, SimConfig, SpecConfig, simulate

    prof = load_profile(profile) if isinstance(profile, str) else profile
    if cost_scale != 1.0:
        prof = dataclasses.replace(prof, cpu_overhead_ms=prof.cpu_overhead_ms * cost_scale)
    w, conc = workload_from(m)
    doc = None
    if acceptance:
        from dsim.schema import read_document

        try:
            doc = read_document(acceptance)[0] if acceptance.endswith((".yaml", ".yml")) else None
        except InputError:
            doc = None  # load_acceptance below names what is wrong with it
    k, spec_how = speculation(m, acceptance, doc if isinstance(doc, dict) else None)
    notes: list = []
    assumed = [f"engine: {_engine_line(m.header)}", f"speculation: {spec_how}"]
    mach = ((prof.extra or {}).get("validator") or {}).get("spec_machinery") or {}
    if mach.get("separated") is False:
        assumed.append(
            "step cost: the profile's overhead was calibrated with speculation on and holds its machinery's "
            "per-step cost" + (" (paid here without speculation)" if not k else "")
        )
    elif mach.get("separated") and not k:
        assumed.append("step cost: the speculative machinery's per-step cost (the draft table's) not paid")
    script = None
    if k:
        prof = zero_block_draft(prof)
        acc_arg = acceptance or "const:0.6"
        assumed.append(
            f"acceptance: {acceptance}"
            if acceptance
            else "acceptance: 0.6 per position (assumed: no --acceptance given)"
        )
        sigma: dict[str, Any] = {}
        if isinstance(doc, dict):
            if not (doc.get("deterministic") and doc.get("draft_script") and draft_script):
                acc_arg = _acceptance_for(doc, w, acc_arg, notes)  # (a script replaces the draws)
            if doc.get("deterministic"):
                # identical requests did identical things on the server: no per-request or
                # per-step acceptance noise (validator.acceptance)
                sigma = {"sigma_request": 0.0, "sigma_step": 0.0}
                if doc.get("draft_script") and draft_script:
                    # ... and the measured step-by-step drafts replace the draws
                    script = tuple(tuple(int(x) for x in e) for e in doc["draft_script"])
                    notes.append(f"deterministic drafting: the measured draft script ({len(script)} decode steps)")
                else:
                    notes.append("deterministic drafting: sigma_request = sigma_step = 0")
        spec = SpecConfig(method="block", k=int(k), acceptance=acc_arg, **sigma)
    else:
        spec = SpecConfig(method="none")
    # the server's prefix cache (validator.prefix): the validator's prompts share one token
    # sequence, so a prompt's full blocks are served from cache once the server has seen them
    pfx = prefix.simulation(m, w.prompt_tokens)
    if pfx is not None:
        w = dataclasses.replace(w, prefix_hashes=pfx.hashes, prefix_block_tokens=pfx.block_tokens)
        notes.append(pfx.note)
        assumed.append(pfx.note)
    else:
        assumed.append(f"prefix cache: off ({prefix.config(m.header).source})")
    eng = m.header.get("engine") or {}
    seqs, seqs_how = _setting(max_num_seqs, eng, "max_num_seqs", CPU_MAX_NUM_SEQS)
    batched, batched_how = _setting(max_num_batched_tokens, eng, "max_num_batched_tokens", CPU_MAX_BATCHED_TOKENS)
    assumed += [f"max_num_seqs: {seqs} ({seqs_how})", f"max_num_batched_tokens: {batched} ({batched_how})"]
    ecfg = EngineConfig(
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        async_scheduling=False,
        draft_script=script,
        enable_prefix_caching=pfx is not None,
        prefix_cache_warm=pfx.warm if pfx is not None else (),
    )
    cfg = SimConfig(
        workload=w,
        profile=prof,
        nodes=1,
        gpus_per_node=prof.gpus_per_replica,
        router="least_outstanding",
        engine=ecfg,
        spec=spec,
        seed=seed,
        cost_scale=float(cost_scale),
    )
    v = (prof.extra or {}).get("validator") or {}
    closed_gap = None
    fe = front_end_of(v, speculative=bool(k), open_loop=not conc)
    if fe is not None:
        # the front end as dsim simulates it (dsim.sim.FrontEnd): its time grows with the requests
        # in flight, and a closed loop's way back to the engine is its E2E part at the loop's load
        gap = arrival_gap_of(v, speculative=bool(k)) if conc else 0.0
        cfg = dataclasses.replace(cfg, front_end=fe, closed_loop_send_gap_ms=gap)
        assumed.append(
            f"front end: TTFT +{fe.ttft_ms:.2f} ms +{fe.ttft_ms_per_request:.3f} ms per other request in flight, "
            f"E2E +{fe.e2e_ms:.2f} ms +{fe.e2e_ms_per_request:.3f} ms ({v['front_end'].get('per_request_from')}"
            + (
                f"; the {'speculative' if k else 'plain'} server's intercepts and slopes"
                if v["front_end"].get("by_speculation")
                else ""
            )
            + (
                f"; the open loop's own line: {line['from']}"
                if not conc and (line := _open_line(v["front_end"], bool(k)))
                else ""
            )
            + ")"
        )
        if conc:
            assumed.append(
                f"closed loop: a wave's successors reach the engine {gap:.2f} ms apart around the front end's way back"
                + (
                    " (the API server's way-in queue per request ahead)"
                    if _fe_gap(v, bool(k)) is not None
                    else " (the client's send gap: the profile has no way-in queue per request)"
                )
            )
    elif conc:
        # The closed loop's way back to the engine, simulated: a completion's successor reaches the
        # engine the front-end time of one request later (client E2E - engine E2E with one request
        # in flight: the API server's queueing behind other streams is not in it), and the
        # successors of one step's completions arrive in turn, the measured send gap apart: the
        # engine starts the first prompt alone and the rest join the next step (the partial waves
        # of the real server), and it idles between the waves as the real one does.
        over_c, _ = _overheads(v, 1.0)
        closed_gap = over_c
        cfg = dataclasses.replace(
            cfg,
            closed_loop_gap_ms=over_c,
            closed_loop_send_gap_ms=float(v.get("closed_loop_send_gap_ms") or 0.0),
        )
        if over_c or v.get("closed_loop_send_gap_ms"):
            notes.append(
                f"closed loop: successors reach the engine {over_c:.1f} ms after a completion, "
                f"{float(v.get('closed_loop_send_gap_ms') or 0.0):.3f} ms apart"
            )
    res = simulate(cfg)
    s = dict(res.summary)
    from dsim.engine.metrics import dist

    if v.get("tpot_dispersion") and dispersion:
        # step-time variability: each request's TPOT drawn from the measured dispersion
        req = noise.apply_dispersion(res.requests, v["tpot_dispersion"], seed)
        done = req[req["completed"]]
        s["tpot_ms"], s["e2e_ms"] = dist(done["tpot_ms"].dropna()), dist(done["e2e_ms"])
        if fe is not None:
            own = res.requests[res.requests["completed"]]
            s["client_e2e_ms"] = dist(done["e2e_ms"].to_numpy() + (own["client_e2e_ms"] - own["e2e_ms"]).to_numpy())
        notes.append("TPOT per request drawn from the measured dispersion (validator.noise.apply_dispersion)")
    if pfx is not None:
        rq = res.requests
        s["prefix_cache_hit_rate"] = float(rq["cached_tokens"].sum() / max(rq["prompt_tokens"].sum(), 1))
    s["_engine"] = {k: s.get(k) for k in LAT + ("output_tok_s",)}
    s["_notes"] = notes
    if fe is not None:
        # what the client sees: the engine's times plus the simulated front end's
        s["ttft_ms"], s["e2e_ms"] = s["client_ttft_ms"], s["client_e2e_ms"]
        s["request_overhead_ms_added"] = {
            "e2e": float(fe.e2e_at(s["front_end"]["mean_requests"] or 1.0)),
            "ttft": float(fe.ttft_at(s["front_end"]["mean_requests"] or 1.0)),
        }
        return _finish(s, k, doc, script, w, assumed)
    # The front-end time of one request, in a closed loop and in an open one. The overhead
    # measured at higher loads (client minus engine time) grows with the load because it holds
    # the wait for the running step (vLLM's queue time starts when the engine core takes the
    # request in, between steps: 0 here at every load). dsim's engine holds that wait itself: a
    # simulated request that arrives during a step joins the next one, whether it arrived in a
    # closed loop's wave or at a Poisson instant. Adding the overhead measured at the predicted
    # concurrency counted the wait twice (open loop, measured here: client minus engine TTFT
    # 19-31 ms at 3-5 streams, the closed loop's table 39-43 ms there, one stream 8-11 ms).
    over, over_ft = _overheads(v, 1.0)
    if over or over_ft:
        for key, o in (("ttft_ms", over_ft), ("e2e_ms", over)):
            if isinstance(s.get(key), dict):
                s[key] = {q: (x + o if isinstance(x, (int, float)) else x) for q, x in s[key].items()}
        e2e = (res.summary.get("e2e_ms") or {}).get("mean")
        if conc and e2e:
            # a user's cycle is the client's E2E: what the simulated loop does not hold yet
            g = closed_gap or 0.0
            s["output_tok_s"] = s["output_tok_s"] * (e2e + g) / (e2e + max(over, g))
        s["request_overhead_ms_added"] = {"e2e": over, "ttft": over_ft}
    return _finish(s, k, doc, script, w, assumed)


def front_end_of(v: dict, speculative: bool | None = None, open_loop: bool = False):
    """dsim's FrontEnd from a profile's ``validator.front_end`` (calibrate.front_end_fit), None
    without one (a profile made before it, or of a server without latency histograms: the
    one-request overhead is added instead). Where it was fitted on a speculative and a plain
    server (``by_speculation``), the intercepts and slopes of the server ``speculative`` says;
    for an ``open_loop``, the open loop's own line where the profile has one of that server."""
    from dsim.sim import FrontEnd

    f = v.get("front_end")
    if not f:
        return None
    own = _own_fit(f, speculative)
    if open_loop and (line := _open_line(f, speculative)):
        own = line
    return FrontEnd(
        ttft_ms=float(own.get("ttft_ms", f["ttft_ms"])),
        ttft_ms_per_request=float(own.get("ttft_ms_per_request", f["ttft_ms_per_request"])),
        e2e_ms=float(own.get("e2e_ms", f["e2e_ms"])),
        e2e_ms_per_request=float(own.get("e2e_ms_per_request", f["e2e_ms_per_request"])),
    )


def _open_line(f: dict, speculative: bool | None) -> dict | None:
    """The front end fit's open-loop line (calibrate._open_loop_line) where it is of the server
    ``speculative`` says (any, for None); None without one."""
    line = f.get("open_loop")
    return line if line and (speculative is None or line["speculative"] == speculative) else None


def _own_fit(f: dict, speculative: bool | None) -> dict:
    """The front end fit's parts of the server ``speculative`` says ({} where it was fitted on one)."""
    config = "" if speculative is None else ("speculative" if speculative else "none")
    return (f.get("by_speculation") or {}).get(config, {})


def _fe_gap(v: dict, speculative: bool) -> float | None:
    f = v.get("front_end") or {}
    g = _own_fit(f, speculative).get("arrival_gap_ms", f.get("arrival_gap_ms"))
    return None if g is None else float(g)


def arrival_gap_of(v: dict, speculative: bool) -> float:
    """How far apart a closed-loop wave's successors reach the engine with the profile's front end
    (calibrate.arrival_gap_ms, the server ``speculative`` says); a profile fitted before it, or
    without loads whose waves tell it: the client's measured send gap."""
    g = _fe_gap(v, speculative)
    return g if g is not None else float(v.get("closed_loop_send_gap_ms") or 0.0)


def _finish(s: dict, k: int, doc, script, w, assumed: list) -> dict:
    s["_spec_k"] = k
    s["_drafted_fraction"] = doc.get("drafted_fraction") if isinstance(doc, dict) else None
    if script is not None:
        # the simulated workload's own drafted fraction (the calibration's holds for its own
        # output lengths only: a longer output drafts in a larger share of its steps)
        s["_drafted_fraction"] = script_drafted_fraction(script, w.output_tokens)
    s["_assumed"] = assumed
    return s


def speculation(m: measure.Measurement, acceptance: str | None, doc: dict | None) -> tuple[int, str]:
    """(K to simulate, a line saying what was assumed and why). An ``acceptance`` for a measurement
    that ran without speculative decoding, or one calibrated at another K or with another
    method, is refused (InputError): it would simulate drafts the server never made."""
    mk, method, how = serverconf.speculation_of(m)
    dk = int(doc["k"]) if isinstance(doc, dict) and doc.get("k") else None
    dm = doc.get("method") if isinstance(doc, dict) else None
    if acceptance and mk == 0:
        raise InputError(
            f"--acceptance {acceptance}: {m.path} ran without speculative decoding ({how}); check it without --acceptance"
        )
    if dk is not None and mk and dk != mk:
        raise InputError(f"--acceptance {acceptance}: calibrated at K = {dk}, but {m.path} ran K = {mk} ({how})")
    if dm and method and dm != method:
        raise InputError(f"--acceptance {acceptance}: calibrated on method {dm}, but {m.path} ran {method}")
    k = mk if mk is not None else (dk or 0)
    if not k:
        return 0, f"none ({how})"
    src = how if mk is not None else f"the acceptance file ({acceptance})"
    return k, (f"{method or 'method not recorded'}, K = {k} ({src}); simulated as dsim's block drafter with K = {k}")


def script_drafted_fraction(script: tuple, output_tokens) -> float | None:
    """The share of decode steps that verified drafts when every request follows ``script``
    (drafts verified, accepted per decode step; the last entry repeating) to its output length:
    the first token comes from the prefill step, each decode step gives 1 + its accepted drafts."""
    drafted = steps = 0
    sc = [(int(a), int(b)) for a, b in script]
    if not sc:
        return None
    for n in np.asarray(output_tokens, dtype=np.int64):
        left, j = int(n) - 1, 0
        while left > 0:
            v, a = sc[min(j, len(sc) - 1)]
            steps += 1
            drafted += v > 0
            left -= 1 + a
            j += 1
    return drafted / steps if steps else None


def _setting(given, eng: dict, key: str, default: int) -> tuple[int, str]:
    """A scheduler setting for the simulation and where it came from: the option, the header
    (the server's answer or its flags), else vLLM's CPU default (assumed)."""
    if given:
        return int(given), f"--{key.replace('_', '-')}"
    if eng.get(key):
        src = (eng.get("source") or {}).get(key)
        return int(eng[key]), f"from the {'server' if src == 'server' else 'server flags' if src else 'header'}"
    return default, "vLLM's CPU default: assumed, the measurement does not say"


def _engine_line(header: dict) -> str:
    eng = header.get("engine") or {}
    kind = eng.get("kind") or "not known"
    ver = eng.get("version") or header.get("server_version")
    extra = "; ".join(serverconf.describe({k: v for k, v in eng.items() if k == "conflicts"}))
    return f"{kind}" + (f" {ver}" if ver else "") + (f" ({extra})" if extra else "")


def _overheads(v: dict, streams: float) -> tuple[float, float]:
    """(E2E, TTFT) front-end time per request of a profile's ``validator`` block at ``streams``
    requests in flight: interpolated in its overhead_table (measured at several loads, ends held),
    else per stream, else its single values."""
    over = float(v.get("request_overhead_ms") or 0.0)
    over_ft = float(v.get("first_token_overhead_ms", over) or 0.0)
    table = v.get("overhead_table")
    if table and len(table.get("streams") or []) >= 2:
        over = float(np.interp(streams, table["streams"], table["e2e_ms"]))
        over_ft = float(np.interp(streams, table["streams"], table["first_token_ms"]))
    elif v.get("request_overhead_per_stream_ms") is not None:
        # front-end delay grows with the concurrent streams (one API-server process serves them)
        over = float(v["request_overhead_per_stream_ms"]) * max(streams, 1.0)
        over_ft = float(v.get("first_token_overhead_per_stream_ms") or 0.0) * max(streams, 1.0)
    return over, over_ft


def _acceptance_for(doc: dict, w, acc_arg: str, notes: list) -> str:
    """The calibrated curve adapted to the workload's mean output length (its output-position
    table, validator.acceptance.curve_for_output); ``acc_arg`` unchanged without a table."""
    from validator import acceptance as A

    table, cal_len = doc.get("by_output_position"), doc.get("calibrated_output_tokens")
    curve = ((doc.get("classes") or {}).get("default")) or None
    if not (table and cal_len and curve):
        return acc_arg
    target = float(np.mean(w.output_tokens))
    new = A.curve_for_output(curve, table, cal_len, target)
    if abs(target - cal_len) > 0.5:
        notes.append(f"acceptance curve for output {target:.0f} tokens (calibrated at {cal_len:.0f}): {new}")
    return "default=" + ",".join(f"{x:.6f}" for x in new)


def _err(pred, meas):
    if pred is None or meas is None or not np.isfinite(meas) or meas == 0:
        return None
    return (pred - meas) / meas


def _judge(rows: list[dict], gates: dict, spread: dict) -> None:
    """Each row: its tolerance (gated rows only), the measured spread, the allowance max(both), ok."""
    for r in rows:
        t = gates.get(r["metric"])
        sp = (spread.get(r["metric"]) or {}).get("relative_spread")
        r["tolerance"] = t
        r["spread"] = sp
        r["allowed"] = None if t is None else max(t, sp or 0.0)
        r["ok"] = None if t is None or r["error"] is None else abs(r["error"]) <= r["allowed"]


def compare(meas_stats: dict, pred: dict, gates: dict | None = None, spread: dict | None = None) -> list[dict]:
    """Rows predicted vs measured; ``gates`` {metric: tolerance} (default DEFAULT_GATES), ``spread``
    the measured run-to-run spread per metric (validator.noise.spread)."""
    gates = DEFAULT_GATES if gates is None else gates
    rows = []
    for met in LAT:
        pd_ = pred.get(met) or {}
        for q in QUANTS:
            mv = meas_stats.get(f"{met}_{q}")
            pv = pd_.get(q) if isinstance(pd_, dict) else None
            rows.append({"metric": f"{met}.{q}", "measured": mv, "predicted": pv, "error": _err(pv, mv)})
    mv, pv = meas_stats.get("output_tok_s"), pred.get("output_tok_s")
    rows.append({"metric": "output_tok_s", "measured": mv, "predicted": pv, "error": _err(pv, mv)})
    # engine-side: the server's own histograms (means) vs dsim without the front-end overheads;
    # TTFT and E2E as the engine's own part (queue + prefill [+ decode]: calibrate.engine_times),
    # the server's TTFT/E2E histograms also hold the API server's time before the engine
    from validator.calibrate import engine_times

    h = meas_stats.get("server_histograms") or {}
    eng = pred.get("_engine") or {}
    own = engine_times(meas_stats)
    for met, name in (
        ("ttft_ms", "vllm:time_to_first_token_seconds"),
        ("tpot_ms", "vllm:request_time_per_output_token_seconds"),
        ("itl_ms", "vllm:inter_token_latency_seconds"),
        ("e2e_ms", "vllm:e2e_request_latency_seconds"),
    ):
        mv = (h.get(name) or {}).get("mean")
        pv = (eng.get(met) or {}).get("mean") if isinstance(eng.get(met), dict) else None
        if mv is None or pv is None:
            continue
        mv *= 1e3
        note = "engine side: server histogram mean vs dsim without front-end overhead"
        if own and met in ("ttft_ms", "e2e_ms"):
            mv = own["ttft" if met == "ttft_ms" else "e2e"]
            note = (
                "engine side: queue + prefill"
                + (" + decode" if met == "e2e_ms" else "")
                + " histogram means vs dsim without front-end overhead"
            )
        rows.append(
            {"metric": f"server.{met}.mean", "measured": mv, "predicted": pv, "error": _err(pv, mv), "note": note}
        )
    if pred.get("prefix_cache_hit_rate") is not None:
        mv = meas_stats.get("prefix_cache_hit_rate")
        pv = pred["prefix_cache_hit_rate"]
        rows.append(
            {
                "metric": "prefix_cache_hit_rate",
                "measured": mv,
                "predicted": pv,
                "error": (pv - mv) if mv is not None else None,
                "note": "prompt tokens served from the prefix cache / prompt tokens (error: the difference)",
            }
        )
    if pred.get("_spec_k"):
        # dsim drafts every step: its acceptance length is tokens per decode step
        tps = pred.get("acceptance_length")
        rows.append(
            {
                "metric": "tokens_per_decode_step",
                "measured": noise.tokens_per_decode_step(meas_stats),
                "predicted": tps,
                "error": None,
                "note": "1 + accepted / decode steps",
            }
        )
        rows[-1]["error"] = _err(tps, rows[-1]["measured"])
        # vLLM's acceptance length counts per draft: steps without a draft (a proposer without a
        # match) do not count; predicted from dsim's per step through the calibrated drafted fraction
        frac = pred.get("_drafted_fraction")
        K = int(pred["_spec_k"])
        if tps is not None and frac:
            # a drafted step accepts at most K: the share of drafted steps is at least
            # (tokens per step - 1) / K, whatever fraction the calibration saw
            frac = max(float(frac), (tps - 1) / K)
        pv = min(1 + (tps - 1) / frac, K + 1.0) if tps is not None and frac else None
        mv = (meas_stats.get("spec") or {}).get("acceptance_length")
        rows.append(
            {
                "metric": "acceptance_length",
                "measured": mv,
                "predicted": pv,
                "error": _err(pv, mv),
                "note": "vLLM's: 1 + accepted / drafts",
            }
        )
    _judge(rows, gates, spread or {})
    return rows


SENSITIVITY_STEP = 0.05  # the step-cost change the sensitivity is measured with (+5%)


def add_sensitivity(rows: list[dict], rows_hi: list[dict], step: float = SENSITIVITY_STEP) -> None:
    """Each row's ``sensitivity``: the relative change of its prediction per relative change of the
    step cost, (predicted at cost x (1 + step) / predicted - 1) / step (1.0: the metric follows the
    step cost one for one, as TPOT does in a closed loop; about 2 for TPOT in an open loop near
    saturation, where a longer step keeps more requests in flight, which lengthens the steps
    again); and ``cost_error``: the step-cost error that would give the row's error at that
    sensitivity, error / sensitivity, so that closed- and open-loop errors read on one scale.
    Rows whose prediction does not move with the cost (tokens per step) get neither."""
    hi = {r["metric"]: r.get("predicted") for r in rows_hi}
    for r in rows:
        p, q = r.get("predicted"), hi.get(r["metric"])
        if not isinstance(p, (int, float)) or not isinstance(q, (int, float)) or not p:
            continue
        sens = (q / p - 1.0) / step
        if abs(sens) < 0.05:  # (does not follow the step cost)
            continue
        r["sensitivity"] = round(float(sens), 3)
        if r.get("error") is not None and r["metric"] != "prefix_cache_hit_rate":
            r["cost_error"] = round(float(r["error"] / sens), 4)


def check(
    measurements: Any,
    profile: str,
    acceptance: str | None,
    gates: dict | None = None,
    max_num_seqs: int | None = None,
    seed: int = 0,
    sensitivity: bool = True,
) -> dict:
    """Simulate the measured workload (several files: runs of one load, pooled; their spread
    measured) and compare. ``gates`` {metric: tolerance}, default DEFAULT_GATES. ``sensitivity``:
    simulate once more with every step priced SENSITIVITY_STEP higher and give each row its
    sensitivity to the step cost and the step-cost error that would explain its error
    (add_sensitivity)."""
    paths = (
        [measurements]
        if isinstance(measurements, (str, bytes)) or not hasattr(measurements, "__iter__")
        else list(measurements)
    )
    runs = [measure.read(p) for p in paths]
    m = measure.pool(runs, where="check")
    measurements = m.path
    stats = m.stats()
    stats["prefix_cache_hit_rate"] = prefix.hit_rate(m)
    spread = noise.spread([r.stats() for r in runs]) if len(runs) > 1 else {}
    gates = DEFAULT_GATES if gates is None else dict(gates)
    pred = simulate_measurement(m, profile, acceptance, max_num_seqs=max_num_seqs, seed=seed)
    rows = compare(stats, pred, gates, spread)
    if sensitivity:
        hi = simulate_measurement(
            m, profile, acceptance, max_num_seqs=max_num_seqs, seed=seed, cost_scale=1.0 + SENSITIVITY_STEP
        )
        add_sensitivity(rows, compare(stats, hi, {}, {}))
    gated = [r for r in rows if r["metric"] in gates]
    missing = [r["metric"] for r in gated if r["ok"] is None]
    host = [
        {
            "run": r.path,
            **((r.summary or {}).get("host_load") or {}),
            **({"interference": it} if (it := (r.summary or {}).get("interference")) else {}),
        }
        for r in runs
        if (r.summary or {}).get("host_load") or (r.summary or {}).get("interference")
    ]
    verdict = "pass" if gated and all(r["ok"] for r in gated) else "fail"
    return {
        "measurements": str(measurements),
        "profile": str(profile),
        "acceptance": acceptance,
        "load": m.header.get("load"),
        "requests_completed": stats.get("requests_completed"),
        "requests_failed": stats.get("requests_failed"),
        "complete": m.complete,
        "burst_requests": stats.get("burst_requests"),
        "timing_requests": stats.get("timing_requests"),
        "gates": gates,
        "assumed": pred.get("_assumed") or [],
        "runs": len(runs),
        # the host's load over each run and other work on the server's engine CPUs (hostcpu); a run during
        # which the load changed or other work took a share of those CPUs is named in load_warnings
        "host_load": host,
        "load_warnings": noise.load_flags(runs) + noise.interference_flags(runs),
        "rows": rows,
        "verdict": verdict,
        "failed_metrics": [r["metric"] for r in gated if r["ok"] is False],
        "missing_metrics": missing,
        "predicted_summary": {
            k: v
            for k, v in pred.items()
            if k
            in (
                "output_tok_s",
                "acceptance_length",
                "ttft_ms",
                "tpot_ms",
                "itl_ms",
                "e2e_ms",
                "requests_completed",
                "steps",
                "mean_batch_requests",
            )
        },
    }


def _fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def to_markdown(rep: dict) -> str:
    load = rep.get("load") or {}
    lines = [
        "# dsim check: predicted vs measured",
        "",
        f"- measurements: `{rep['measurements']}` ({rep.get('requests_completed')} completed, "
        f"{rep.get('requests_failed')} failed{'' if rep.get('complete', True) else ', partial run'})",
        f"- streams delivered in bursts (no per-token timing; left out of TTFT/TPOT/ITL, kept in "
        f"E2E and throughput): {rep.get('burst_requests') or 0} of {rep.get('requests_completed')}",
        f"- load: {load.get('mode')} (concurrency {load.get('concurrency')}, rate {load.get('rate')})",
        f"- profile: `{rep['profile']}`; acceptance: `{rep.get('acceptance')}`",
        *(f"- assumed: {a}" for a in rep.get("assumed") or []),
        *(
            (
                f"- host load (1-minute average, start -> end): {h['loadavg_1m'][0]:g} -> {h['loadavg_1m'][1]:g}"
                if h.get("loadavg_1m")
                else "- host load: not recorded"
            )
            + (" (changed)" if h.get("changed") else "")
            + (
                f"; other work on the engine CPUs: {h['interference']['others_share']:.1%} of their busy time"
                if h.get("interference")
                else ""
            )
            + (
                f", on the API server's: {h['interference']['front']['others_share']:.1%}"
                if (h.get("interference") or {}).get("front")
                else ""
            )
            for h in rep.get("host_load") or []
        ),
        *(f"- warning: {w}" for w in rep.get("load_warnings") or []),
        "- gated: "
        + (", ".join(f"{k} {v:.0%}" for k, v in rep["gates"].items()) or "nothing")
        + "; each against the larger of its tolerance and the measured spread"
        + (f" ({rep['runs']} runs)" if rep.get("runs", 1) > 1 else " (one run: no spread measured)"),
        "",
        "| metric | measured | predicted | error | tolerance | spread | ok | sensitivity | cost error |",
        "|---|---:|---:|---:|---:|---:|:-:|---:|---:|",
    ]
    pct = lambda v: "-" if v is None else f"{v:.0%}"  # noqa: E731
    for r in rep["rows"]:
        e = "-" if r["error"] is None else f"{r['error']:+.1%}"
        ok = "-" if r["ok"] is None else ("yes" if r["ok"] else "NO")
        sens = "-" if r.get("sensitivity") is None else f"{r['sensitivity']:.2f}"
        ce = "-" if r.get("cost_error") is None else f"{r['cost_error']:+.1%}"
        lines.append(
            f"| {r['metric']} | {_fmt(r['measured'])} | {_fmt(r['predicted'])} | {e} | {pct(r['tolerance'])} "
            f"| {pct(r.get('spread'))} | {ok} | {sens} | {ce} |"
        )
    if any(r.get("sensitivity") is not None for r in rep["rows"]):
        lines += [
            "",
            f"sensitivity: the prediction's relative change per relative change of the step cost (simulated "
            f"again with every step {SENSITIVITY_STEP:.0%} dearer); cost error: error / sensitivity, the step-cost "
            "error that would explain the row's error (an open loop near saturation doubles a cost error in TPOT)",
        ]
    why = []
    if rep["failed_metrics"]:
        why.append(f"outside tolerance: {', '.join(rep['failed_metrics'])}")
    if rep.get("missing_metrics"):
        why.append(f"not measured or not predicted: {', '.join(rep['missing_metrics'])}")
    lines += ["", f"**Verdict: {rep['verdict'].upper()}**" + (f" ({'; '.join(why)})" if why else "")]
    return "\n".join(lines) + "\n"
