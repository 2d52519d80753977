"""The held-out procedure: calibrate on one load and shape, predict loads and shapes the calibration
did not see, with the measured run-to-run spread next to each error.

    dsim validate heldout collect --launch "MODEL -- FLAGS" --out DIR [--rounds 6]
        [--plain-launch "MODEL -- FLAGS"]
    dsim validate heldout collect --server URL --out DIR [--plain-server URL]
    dsim validate heldout analyse DIR [--out REPORT.json]
    (or python -m validator.heldout ...)

``collect`` measures, interleaved in rounds (so every case sees the same background load): the
profile sweep (concurrency 1, 2, 4, 8 at the calibration shape, plus a 256:16 point at one request,
a 256:96 point at two and a 384:64 point at four, so prefill tokens, batch and context vary
apart; the rounds let the fit tell a term from the run-to-run noise), the calibration runs
(concurrency 2, prompt 64 / output 64) and the held-out cases (concurrency 1, 4, 8 at 64/64;
concurrency 4 at prompt 256 / output 128; Poisson arrivals at about two thirds of the
concurrency-8 throughput), and Poisson arrivals at 0.45 of it as a point of the profile's front
end only (an open loop's own line). ``analyse`` builds the profile from the sweep, calibrates on
every run at the calibration's load and shape only (the calibration runs and the sweep's
concurrency-2 runs: the median of their scales), and checks every held-out case (its rounds
pooled, their spread measured) against the gates (validator.compare.DEFAULT_GATES). No held-out
run enters the profile or the calibration.
With a server of the same model without speculation (``--plain-server`` / ``--plain-launch``,
measured after the speculative server's rounds, in rounds of its own: one and four streams, its
calibration point and eight streams), the profile's front end takes its one and four streams
(its own slope), the calibration its calibration runs (the machinery's cost from the
difference), and ``analyse`` checks its eight-stream case without speculation.
Noise is part of the result: a control point (the calibration's load and shape) is measured
before the first round and after the last, and ``analyse`` says whether it drifted by more than
that point's spread over the rounds (validator.noise.drift), and names every run during which the
host's load changed (validator.noise.load_flags).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from dsim.cost import save_profile
from dsim.errors import InputError
from validator import calibrate, compare, driver, launch, measure, noise, profile_server, traces

PROFILE = [("p-c1", 1, 64, 64), ("p-c2", 2, 64, 64), ("p-c4", 4, 64, 64), ("p-c8", 8, 64, 64)]
# points of other shapes, so prefill tokens, batch and context vary apart: a long prompt at one
# request (prefill tokens), a long prompt and output at two (context at two requests), a long
# prompt at four (context at four requests, six times the calibration shape's)
PROFILE_SHAPES = [("p-c1-256x16", 1, 256, 16), ("p-c2-256x96", 2, 256, 96), ("p-c4-384x64", 4, 384, 64)]
CALIBRATION = ("cal-c2", 2, 64, 64)
SWEEP_TWIN = "p-c2"  # the sweep's runs of the calibration's load and shape
HELD_OUT = [("c1", 1, 64, 64), ("c4", 4, 64, 64), ("c8", 8, 64, 64), ("c4-256x128", 4, 256, 128)]
RATE_CASE = "rate-0.66xc8"
# an open loop at a lower rate, a point of the profile's front end only: an open loop's requests
# come one at a time, and its front end gets its own line (calibrate.front_end_fit's open_loop)
OPEN_FRONT_END = ("p-rate-0.45xc8", 0.45)
# the same server without speculation: its calibration point (calibrated together with the
# speculative server's) and its held-out case
PLAIN_CALIBRATION = ("plain-cal-c2", 2, 64, 64)
PLAIN_HELD_OUT = ("plain-c8", 8, 64, 64)
# its own front end's points at one and four requests, so its slope is measured, not carried over
# from the speculative server (calibrate.front_end_fit); neither enters the calibration's scale
PLAIN_SWEEP = [("plain-p-c1", 1, 64, 64), ("plain-p-c4", 4, 64, 64)]
PLAIN_NAMES = (PLAIN_CALIBRATION[0], PLAIN_HELD_OUT[0])
# the control point: the calibration's load and shape measured once before the first round and
# once after the last; analyse flags the collection when it moved by more than that point's spread
# over the rounds (validator.noise.drift)
CONTROL = "control"


def _requests(c: int) -> int:
    return max(6, 3 * c)


# Six rounds by default: a case's pooled mean carries about 1/sqrt(rounds) of one run's noise,
# and on the 2-core VM a closed loop's mean TTFT at eight streams moved 20-45% between rounds
# (relative range): with three, the pooled mean's own 95% band was about as wide as its 15% gate.
ROUNDS = 6


def collect(url: str, out: Path, rounds: int = ROUNDS, cpus=None, header: dict | None = None, say=print) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    load0 = _loadavg()
    rate = open_rate = None
    t0 = time.monotonic()

    def control(when: str) -> None:
        _, c, i, o = CALIBRATION
        opts = driver.RunOptions(
            server=url, concurrency=c, progress=False, cpus=cpus, extra_header=dict(header or {}, case=CONTROL)
        )
        driver.run(traces.fixed(_requests(c), i, o), opts, out / f"{CONTROL}-{when}.jsonl")

    control("before")
    for r in range(rounds):
        cases = PROFILE + PROFILE_SHAPES + [CALIBRATION] + HELD_OUT
        for name, c, i, o in cases:
            opts = driver.RunOptions(
                server=url, concurrency=c, progress=False, cpus=cpus, extra_header=dict(header or {}, case=name)
            )
            s = driver.run(traces.fixed(_requests(c), i, o), opts, out / f"{name}-r{r}.jsonl")
            if name == "c8" and rate is None and s.get("request_s"):
                c8_rate = s["request_s"]
                rate = round(0.66 * c8_rate, 3)
                open_rate = round(OPEN_FRONT_END[1] * c8_rate, 3)
        for name, at, seed in ((RATE_CASE, rate, r), (OPEN_FRONT_END[0], open_rate, 1000 + r)):
            opts = driver.RunOptions(
                server=url, rate=at, seed=seed, progress=False, cpus=cpus, extra_header=dict(header or {}, case=name)
            )
            driver.run(traces.fixed(24, 64, 64), opts, out / f"{name}-r{r}.jsonl")
        say(f"round {r + 1}/{rounds} done ({time.monotonic() - t0:.0f} s)")
    control("after")
    info = {
        "rounds": rounds,
        "rate_req_s": rate,
        "front_end_rate_req_s": open_rate,
        "loadavg_before": load0,
        "loadavg_after": _loadavg(),
        "wall_s": round(time.monotonic() - t0, 1),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    (out / "collect.json").write_text(json.dumps(info, indent=1))
    return info


def collect_plain(url: str, out: Path, rounds: int = ROUNDS, cpus=None, header: dict | None = None, say=print) -> dict:
    """The server without speculation's rounds: its front end's points (PLAIN_SWEEP), its
    calibration point and its held-out case once a round, into ``out`` beside the speculative
    server's collection (collect.json gains ``plain_rounds``)."""
    t0 = time.monotonic()
    for r in range(rounds):
        for name, c, i, o in PLAIN_SWEEP + [PLAIN_CALIBRATION, PLAIN_HELD_OUT]:
            opts = driver.RunOptions(
                server=url, concurrency=c, progress=False, cpus=cpus, extra_header=dict(header or {}, case=name)
            )
            driver.run(traces.fixed(_requests(c), i, o), opts, out / f"{name}-r{r}.jsonl")
        say(f"plain round {r + 1}/{rounds} done ({time.monotonic() - t0:.0f} s)")
    info = json.loads((out / "collect.json").read_text()) if (out / "collect.json").exists() else {}
    info.update({"plain_rounds": rounds, "plain_wall_s": round(time.monotonic() - t0, 1)})
    (out / "collect.json").write_text(json.dumps(info, indent=1))
    return info


def _plain(d: Path, name: str, r: int | None = None) -> list[str]:
    """The plain server's runs of case ``name`` (of round ``r``); [] in a collection without them."""
    return sorted(str(p) for p in d.glob(f"{name}-r{'*' if r is None else r}.jsonl"))


def _loadavg():
    try:
        return [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except (OSError, ValueError):
        return None


def _files(d: Path, name: str) -> list[str]:
    fs = sorted(str(p) for p in d.glob(f"{name}-r*.jsonl"))
    if not fs:
        raise InputError(f"{d}: no {name}-r*.jsonl (run collect first)")
    return fs


def analyse(d: Path, gates: dict | None = None) -> dict:
    """Profile from the sweep, calibration on the calibration runs, checks of the held-out cases."""
    if not d.is_dir():
        raise InputError(f"{d}: not a collection directory (dsim validate heldout collect --out {d})")
    work = d / "analysis"
    work.mkdir(exist_ok=True)
    levels: dict = {c: _files(d, n) for n, c, _, _ in PROFILE}
    # (collections made before a shape point was added lack it)
    levels.update({f"c{c} {i}:{o}": _files(d, n) for n, c, i, o in PROFILE_SHAPES if list(d.glob(f"{n}-r*.jsonl"))})
    m0 = measure.read(levels[1][0])
    prof = profile_server.profile_from_measurements(
        levels,
        hardware="cpu",
        server_flags=m0.header.get("server_flags"),
        input_len=64,
        output_len=64,
        front_end_files=[f for n, *_ in PLAIN_SWEEP for f in _plain(d, n)]
        + sorted(str(p) for p in d.glob(f"{OPEN_FRONT_END[0]}-r*.jsonl")),  # (older collections: none)
    )
    base = work / "profile.yaml"
    save_profile(prof, base)
    # every run of the calibration's load and shape: its own runs and the sweep's (both measured
    # in every round), so the median over the repeats (calibrate.repeat_scales) has twice as many
    # runs to leave a slow one out: in one collection here all three calibration runs came out
    # 10-35% slower than the sweep's runs of the same load in the same rounds
    cal_files = _files(d, CALIBRATION[0]) + _files(d, SWEEP_TWIN)
    cal = calibrate.calibrate(
        cal_files + _plain(d, PLAIN_CALIBRATION[0]), work / "cal", base_profile=str(base), name="cal"
    )
    rows = {}
    names = [CALIBRATION[0]] + [h[0] for h in HELD_OUT] + [RATE_CASE]
    names += [n for n in (PLAIN_CALIBRATION[0], PLAIN_HELD_OUT[0]) if _plain(d, n)]
    for name in names:
        # (the plain server's runs are checked without speculation)
        acc = None if name in PLAIN_NAMES else cal["acceptance_path"]
        rep = compare.check(_files(d, name), cal["profile_path"], acc, gates=gates)
        rows[name] = {
            "held_out": name not in (CALIBRATION[0], PLAIN_CALIBRATION[0]),
            "verdict": rep["verdict"],
            "errors": {r["metric"]: r["error"] for r in rep["rows"] if r["error"] is not None},
            "spread": {r["metric"]: r["spread"] for r in rep["rows"] if r.get("spread") is not None},
            "gated": {r["metric"]: r["ok"] for r in rep["rows"] if r["metric"] in rep["gates"]},
            # how strongly each prediction follows the step cost (compare.add_sensitivity)
            "sensitivity": {r["metric"]: r["sensitivity"] for r in rep["rows"] if r.get("sensitivity") is not None},
            "cost_error": {r["metric"]: r["cost_error"] for r in rep["rows"] if r.get("cost_error") is not None},
        }
    # the error's own spread: each round predicted from its own calibration runs alone and
    # compared with its own run of the case (round_errors); the pooled error is judged against the
    # larger of its target and that spread too (verdict_error_spread)
    per_round = round_errors(d, str(base), list(rows), gates, work)
    gate_map = gates or compare.DEFAULT_GATES
    for name, r in rows.items():
        pr = per_round.get(name) or {}
        r["round_errors"] = {m: [round(v, 4) for v in vals] for m, vals in pr.items()}
        r["error_spread"] = {m: sp for m, vals in pr.items() if (sp := error_spread(vals)) is not None}
        r["verdict_error_spread"] = judge(r["errors"], r["error_spread"], gate_map)
    info = json.loads((d / "collect.json").read_text()) if (d / "collect.json").exists() else {}
    fit = prof.extra["validator"]["fit"]
    # noise as a result: the control point's drift over the collection, and the runs during which
    # the host's load changed (collections made before these were recorded have neither)
    drift = None
    ctl = [d / f"{CONTROL}-{w}.jsonl" for w in ("before", "after")]
    if all(p.exists() for p in ctl):
        drift = noise.drift(
            measure.read(str(ctl[0])).stats(),
            measure.read(str(ctl[1])).stats(),
            [measure.read(f).stats() for f in cal_files],
        )
    load_flags = noise.load_flags([measure.read(str(p)) for p in sorted(d.glob("*.jsonl"))])
    return {
        "drift": drift,
        "load_changed": load_flags,
        "what": "calibrated on concurrency 2, prompt 64 / output 64 (the calibration runs and the sweep's runs of "
        "that load, the median of their scales); the other cases held out",
        "collect": info,
        "profile_fit": {
            k: fit[k]
            for k in (
                "cpu_overhead_ms",
                "ms_per_token",
                "ms_per_request",
                "ms_per_prefill",
                "kv_ms_per_ktok",
                "prefill_discount_ms_per_ktok",
                "identified",
                "not_identified",
                "warnings",
            )
        },
        "calibration_fit": cal["report"]["fit"],
        "calibration_warnings": cal["report"].get("warnings"),
        "gates": gates or compare.DEFAULT_GATES,
        "cases": rows,
    }


def _rounds(d: Path) -> list[int]:
    """The rounds every case of the collection has (NAME-rR.jsonl)."""
    names = [n for n, _, _, _ in PROFILE + [CALIBRATION] + HELD_OUT] + [RATE_CASE]
    have = [{int(p.stem.rsplit("-r", 1)[1]) for p in d.glob(f"{n}-r*.jsonl")} for n in names]
    return sorted(set.intersection(*have)) if have else []


def round_errors(d: Path, base: str, cases: list[str], gates: dict | None, work: Path) -> dict:
    """{case: {metric: [error of round r, ...]}}: round r calibrated on its own runs of the
    calibration's load and shape alone (its calibration run and the sweep's run of that load, the
    median of the two scales) and checked on the case's run of the same round. The pooled error's
    noise is that of the prediction (the calibration runs it was scaled to) and of the measurement
    together, and the two share each round's background: the spread of these errors measures it
    as it is, where the case's own spread over its runs counts the measurement's part alone."""
    out: dict = {}
    for r in _rounds(d):
        cal = calibrate.calibrate(
            [str(d / f"{CALIBRATION[0]}-r{r}.jsonl"), str(d / f"{SWEEP_TWIN}-r{r}.jsonl")]
            + _plain(d, PLAIN_CALIBRATION[0], r),
            work / f"cal-r{r}",
            base_profile=base,
            name=f"cal-r{r}",
        )
        for name in cases:
            f = d / f"{name}-r{r}.jsonl"
            if not f.exists():
                continue
            acc = None if name in PLAIN_NAMES else cal["acceptance_path"]
            rep = compare.check([str(f)], cal["profile_path"], acc, gates=gates, sensitivity=False)
            for row in rep["rows"]:
                if row["error"] is not None:
                    out.setdefault(name, {}).setdefault(row["metric"], []).append(float(row["error"]))
    return out


def error_spread(errors: list[float]) -> float | None:
    """(max - min) / median of 1 + error over the rounds (the spread of predicted / measured),
    as validator.noise.spread measures a metric's; None under two rounds."""
    if len(errors) < 2:
        return None
    import numpy as np

    a = 1.0 + np.asarray(errors, dtype=float)
    med = float(np.median(a))
    return round(float((a.max() - a.min()) / med), 4) if med > 0 else None


def judge(errors: dict, spread: dict, gates: dict) -> str:
    """ "pass" when every gated metric's error is inside the larger of its target and its spread
    (and at least one gated metric has an error), else "fail"."""
    ok = [abs(errors[m]) <= max(tol, spread.get(m) or 0.0) for m, tol in gates.items() if errors.get(m) is not None]
    return "pass" if ok and all(ok) else "fail"


def noise_lines(rep: dict) -> list[str]:
    """The collection's drift and load flags, one line each (empty when there is nothing to say)."""
    out = []
    dr = rep.get("drift")
    if dr:
        for met, v in dr["metrics"].items():
            sp = "-" if v["spread"] is None else f"{v['spread']:.0%}"
            out.append(
                f"control ({CALIBRATION[1]} requests, {CALIBRATION[2]}/{CALIBRATION[3]}) before -> after: {met} "
                f"{v['before']:.4g} -> {v['after']:.4g} ({v['change']:+.0%}; its spread over the rounds {sp})"
                + (": DRIFTED, the cases were measured on a machine whose speed moved" if v["drifted"] else "")
            )
    out += [f"warning: {w}" for w in rep.get("load_changed") or []]
    return out


def table(rep: dict) -> str:
    keys = ("tpot_ms.p50", "output_tok_s", "tpot_ms.p99", "e2e_ms.p99", "ttft_ms.mean", "tokens_per_decode_step")
    lines = [
        "| case | " + " | ".join(keys) + " | p50 TPOT sensitivity (cost error) | verdict | error's spread (verdict) |",
        "|---" * (len(keys) + 4) + "|",
    ]
    for name, r in rep["cases"].items():
        cells = []
        for k in keys:
            e, sp = r["errors"].get(k), r["spread"].get(k)
            cells.append("-" if e is None else f"{e:+.0%}" + (f" ({sp:.0%})" if sp is not None else ""))
        sens, ce = (r.get("sensitivity") or {}).get("tpot_ms.p50"), (r.get("cost_error") or {}).get("tpot_ms.p50")
        cells.append("-" if sens is None else f"{sens:.2f}" + ("" if ce is None else f" ({ce:+.0%})"))
        es = r.get("error_spread") or {}
        esc = "/".join("-" if es.get(k) is None else f"{es[k]:.0%}" for k in keys[:5])
        lines.append(
            f"| {name}{'' if r['held_out'] else ' (calibration)'} | "
            + " | ".join(cells)
            + f" | {r['verdict']} | {esc} ({r.get('verdict_error_spread', '-')}) |"
        )
    return "\n".join(lines + noise_lines(rep))


def fidelity_summary(rep: dict) -> dict:
    """One collection's held-out result in brief: when and under what load it was measured, the
    calibration (scale, the repeats' spread, the runs left out) and, per case, each gated metric's
    error, measured spread and verdict (what reports/validator-fidelity.json keeps)."""
    info, fit = rep.get("collect") or {}, rep.get("calibration_fit") or {}
    rp = fit.get("repeats") or {}
    cases = {}
    for name, r in rep["cases"].items():
        cases[name] = {
            "held_out": r["held_out"],
            "verdict": r["verdict"],
            "verdict_error_spread": r.get("verdict_error_spread"),
            **{
                m: {
                    "error": round(r["errors"][m], 4) if m in r["errors"] else None,
                    "spread": round(r["spread"][m], 4) if r["spread"].get(m) is not None else None,
                    "error_spread": (r.get("error_spread") or {}).get(m),
                    "ok": r["gated"].get(m),
                    "sensitivity": (r.get("sensitivity") or {}).get(m),
                }
                for m in rep["gates"]
            },
        }
    return {
        "date": info.get("date"),
        "rounds": info.get("rounds"),
        "loadavg_before": info.get("loadavg_before"),
        "loadavg_after": info.get("loadavg_after"),
        "rate_req_s": info.get("rate_req_s"),
        "calibration": {
            "scale": round(float(fit.get("scale") or 0.0), 4),
            "runs": len(rp.get("runs") or {}),
            "repeats_relative_spread": rp.get("relative_spread"),
            "runs_outside_the_others_spread": rp.get("outliers"),
        },
        "cases": cases,
    }


CLOSED_LOOP = [h[0] for h in HELD_OUT]


def across(reps: list[dict], metric: str = "tpot_ms.p50") -> dict:
    """One metric's held-out errors over several collections: per case their mean and standard
    deviation, and the closed-loop cases' errors split into a part common to one collection's
    cases (their mean: the calibration's level, which every case of the collection is scaled by)
    and each case's own part around it (what load and shape change), with the standard deviation
    of each over the collections. A model error of one load or shape shows as a case mean away
    from 0; noise in the calibration's level as a common part larger than the case's own part."""
    import numpy as np

    names = [
        n for n in CLOSED_LOOP + [RATE_CASE] if all(metric in r["cases"].get(n, {}).get("errors", {}) for r in reps)
    ]
    E = np.array([[r["cases"][n]["errors"][metric] for n in names] for r in reps], dtype=float)
    out: dict = {"metric": metric, "collections": len(reps)}
    if len(reps) < 2 or not names:
        return out
    out["cases"] = {
        n: {"mean": round(float(E[:, j].mean()), 4), "sd": round(float(E[:, j].std(ddof=1)), 4)}
        for j, n in enumerate(names)
    }
    cl = [j for j, n in enumerate(names) if n in CLOSED_LOOP]
    if len(cl) >= 2:
        common = E[:, cl].mean(axis=1)
        own = E[:, cl] - common[:, None]
        out["common_sd"] = round(float(common.std(ddof=1)), 4)
        out["own_sd"] = round(float(own.std(ddof=1)), 4)
        out["common"] = [round(float(x), 4) for x in common]
        out["own"] = {names[j]: [round(float(x), 4) for x in own[:, i]] for i, j in enumerate(cl)}
    return out


def across_table(a: dict) -> str:
    if "cases" not in a:
        return ""
    lines = [
        f"{a['metric']} over {a['collections']} collections: "
        + ", ".join(f"{n} {v['mean']:+.1%} (sd {v['sd']:.1%})" for n, v in a["cases"].items())
    ]
    if "common_sd" in a:
        lines.append(
            f"closed-loop cases: the part common to a collection sd {a['common_sd']:.1%}, "
            f"each case's own part sd {a['own_sd']:.1%}"
        )
    return "\n".join(lines)


def write_fidelity(path: Path, summaries: list[dict], gates: dict) -> None:
    """Merge the held-out summaries into the fidelity report at ``path`` (key ``heldout``; the
    live test's keys are kept)."""
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc["heldout"] = {
        "what": "calibrated on concurrency 2, prompt 64 / output 64 (the median scale over its repeats); checked on "
        "concurrency 1, 4, 8 (64/64), concurrency 4 at 256/128 and Poisson arrivals at 2/3 of the concurrency-8 "
        "throughput; each case pooled over the rounds, its spread = (max - min) / median over them",
        "targets": gates,
        "judged": "each gated error against the larger of its target and the case's measured spread (verdict), and "
        "against the larger of its target and the error's own spread over the rounds, each round predicted from its "
        "own calibration runs (verdict_error_spread)",
        "collections": summaries,
    }
    from dsim.outputs import write_file

    write_file(path, json.dumps(doc, indent=1, default=str) + "\n", parents=True)


def main(argv=None, prog: str = "python -m validator.heldout") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--server")
    c.add_argument("--launch")
    c.add_argument("--out", required=True)
    c.add_argument("--rounds", type=int, default=ROUNDS)
    c.add_argument("--plain-server", help="the same model's server without speculation, measured after")
    c.add_argument("--plain-launch", help="start it (serve's arguments) once the speculative server is stopped")
    a = sub.add_parser("analyse")
    a.add_argument("dirs", nargs="+", metavar="DIR")
    a.add_argument("--out", help="the full report as JSON (one DIR)")
    a.add_argument("--fidelity", help="merge each DIR's summary into this report (key heldout)")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "collect":
            if (args.server is None) == (args.launch is None):
                raise InputError("--server or --launch: give one")
            if args.plain_server is not None and args.plain_launch is not None:
                raise InputError("--plain-server or --plain-launch: give at most one")
            spec = launch.parse_launch(args.launch) if args.launch else None
            plain = launch.parse_launch(args.plain_launch) if args.plain_launch else None
            from dsim.outputs import staged_dir

            say = lambda m: print(m, file=sys.stderr)  # noqa: E731
            # the collection appears whole in --out, never merged into an earlier one's files
            with staged_dir(args.out) as stage:
                # each server in turn (one stopped before the next starts: they share the CPUs)
                for which, server, sp in (("spec", args.server, spec), ("plain", args.plain_server, plain)):
                    if server is None and sp is None:
                        continue
                    with launch.managed(sp, say) as run:
                        url = run.url if run else server
                        hdr = run.header() if run else {}
                        if sp is not None:
                            hdr["engine"] = {"max_num_seqs": launch.max_num_seqs(sp), "kind": sp.engine}
                        cpus = run.front_cpus if run else None
                        if which == "spec":
                            info = collect(url, stage, args.rounds, cpus, hdr, say=say)
                        else:
                            info = collect_plain(url, stage, args.rounds, cpus, hdr, say=say)
                print(json.dumps(info))
        else:
            if args.out and len(args.dirs) > 1:
                raise InputError("--out: one DIR (--fidelity takes several)")
            summaries, reps = [], []
            for d in args.dirs:
                rep = analyse(Path(d))
                print(f"{d}:\n{table(rep)}")
                summaries.append(fidelity_summary(rep))
                reps.append(rep)
                if args.out:
                    from dsim.outputs import write_file

                    write_file(args.out, json.dumps(rep, indent=1, default=str) + "\n")
            if len(reps) > 1:
                for met in rep["gates"]:
                    print(across_table(across(reps, met)))
            if args.fidelity:
                write_fidelity(Path(args.fidelity), summaries, rep["gates"])
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
