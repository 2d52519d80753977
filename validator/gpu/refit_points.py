"""The points a refit fits, gathered and pooled (no GPU): the terms and shapes of a raw sweep's points,
steps timed in several processes of one machine start (each point the median over processes) and in
several starts (one vote a start: run_points; a stored replay of the busy-decode step log votes as a
start), the context sweeps' points, the stored sweeps of a model (stored_context), and the drift of a
sweep's anchors from the profile sweep.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from dsim.errors import InputError
from validator.gpu import plan as P
from validator.gpu.fit import step_terms
from validator.gpu.profile_files import repo_relative
from validator.gpu.steplog import read_steplog


def point_terms(points: list[dict]) -> None:
    """dec / pre for points without them (raw files written before the prefill terms existed)."""
    tails = None
    for p in points:
        if "dec" in p and "pre" in p:
            continue
        if p["tag"].startswith("tail"):
            if tails is None:
                tails = {
                    (s.tag, s.n, s.requests): s
                    for s in P.sweep_plan(kv_budget_tokens=10**9)
                    if s.tag.startswith("tail")
                }
            s = tails.get((p["tag"], p["n_real"], p["R"]))
            if s is None or s.kv != p["kv"]:  # (the plan changed since the sweep)
                raise InputError(
                    f"point {p['tag']} n={p['n_real']} R={p['R']} kv={p['kv']}: not in the current sweep plan"
                )
            p["dec"], p["pre"] = step_terms(s.q, s.ctx)
        elif int(p.get("s", 1)) < P.PREFILL_MIN_Q:  # table, context, hetero: decode/verify only
            p["dec"], p["pre"] = int(p["n_real"]), 0.0
        else:
            raise InputError(f"point {p['tag']} n={p['n_real']}: a prefill-sized window outside the tails")
        p["pre"] = round(float(p["pre"]), 6)


POOL_GIB = 24.0  # the profiler's default --pool-gib: the sweep's KV budget follows from it


def sweep_budget(dims: dict, pool_gib: float = POOL_GIB) -> int:
    """The KV budget plan.sweep_plan ran with: 0.95 x the pool's tokens (model.Model.pool_tokens)."""
    per_tok = 2 * dims["kv_heads"] * dims["head_dim"] * 2
    return int(int(pool_gib * 2**30 // per_tok) * 0.95)


def point_shapes(points: list[dict], dims: dict) -> None:
    """shape_q / shape_ctx (query tokens and context per request) for points without them (raw files written before shapes were stored): the sweep
    plan is seeded, so point i is plan step i; each is checked against its recorded n, R and kv."""
    if all("shape_q" in p and "shape_ctx" in p for p in points):
        return
    plan = P.sweep_plan(kv_budget_tokens=sweep_budget(dims))
    if len(plan) != len(points):
        raise InputError(f"{len(points)} points, the current sweep plan has {len(plan)} steps")
    for p, s in zip(points, plan):
        if (p["tag"], int(p["n_real"]), int(p["R"]), int(p["kv"])) != (s.tag, s.n, s.requests, s.kv):
            raise InputError(f"point {p['tag']} n={p['n_real']} R={p['R']} kv={p['kv']}: not the plan's {s}")
        p["shape_q"], p["shape_ctx"] = list(s.q), list(s.ctx)


def process_points(paths: list[str]) -> list[dict]:
    """One sweep timed in several fresh processes (the same seeded plan, one file per process):
    each point's time is the median over processes of that process's median rep, its ``reps`` the
    per-process medians (``process_reps`` every process's reps). A point's level moves from one
    process to the next by more than its reps spread within one, so no single process sets it. A
    process cut short contributes the points it timed; the points must be the same steps, in the
    same order, in every file."""
    runs = [json.loads(Path(p).read_text())["points"] for p in paths]
    out = []
    for i in range(max(len(r) for r in runs)):
        have = [r[i] for r in runs if i < len(r)]
        key = {(p["tag"], tuple(p["shape_q"]), tuple(p["shape_ctx"])) for p in have}
        if len(key) != 1:
            raise InputError(f"{', '.join(paths)}: point {i} is not the same step in every process")
        meds = [float(np.median(p["reps"])) if p.get("reps") else float(p["ms"]) for p in have]
        out.append(
            dict(
                have[0],
                ms=float(np.median(meds)),
                reps=[round(m, 4) for m in meds],
                process_reps=[p.get("reps") for p in have],
                processes=len(have),
            )
        )
    return out


def _step_key(p: dict) -> tuple:
    return (p["tag"], tuple(p["shape_q"]), tuple(p["shape_ctx"]))


def replay_steps(replay_path: Path, src: str, res: dict) -> list[tuple[dict, dict]]:
    """(log step, replay row) pairs of one step log in a replay: the log's steps in order, the
    first len(rows) of them where the replay was cut short, each checked against its row's size
    and KV."""
    root = Path(__file__).resolve().parents[2]
    steps = read_steplog(root / src if not Path(src).is_absolute() else src)
    rows = res["rows"]
    if res.get("partial"):  # a replay cut short: its first len(rows) steps were timed
        steps = steps[: len(rows)]
    if len(steps) != len(rows):
        raise InputError(f"{replay_path}: {src} has {len(rows)} rows, the log {len(steps)} steps")
    for st, r in zip(steps, rows):
        shape = P.StepShape(tuple(st["q"]), tuple(st["ctx"]))
        if shape.n != r["n"] or shape.kv != r["kv"]:
            raise InputError(f"{replay_path}: {src} step {r.get('step')}: shape differs from the log")
    return list(zip(steps, rows))


def replay_points(spec: str) -> list[dict]:
    """A step log's steps in a replay (validator.gpu.replay output), ``REPLAY.json#LOG`` with LOG
    the log's path as the replay names it: one point per replayed step, its shape read from the
    log, its time the replay's (the median of its reps)."""
    path, _, log = spec.partition("#")
    rep = json.loads(Path(path).read_text())
    if log not in rep.get("logs", {}):
        raise InputError(f"{path}: no replay of {log}")
    return [
        dict(
            tag="replay",
            shape_q=list(st["q"]),
            shape_ctx=list(st["ctx"]),
            n=int(r["n"]),
            R=int(r["R"]),
            ms=float(r["measured_ms"]),
            reps=r.get("reps_ms") or [],
        )
        for st, r in replay_steps(Path(path), log, rep["logs"][log])
    ]


def _shape_key(p: dict) -> tuple:
    return (tuple(p["shape_q"]), tuple(p["shape_ctx"]))


def run_points(runs: list[list[str]]) -> list[dict]:
    """Steps timed in several machine starts (runs), each in one or more fresh processes: a
    point's time is the median over runs of each run's time (process_points over its processes,
    or its one file's median rep). The level of the largest steps moves between machine starts by
    about as much as the fidelity target (2-3 %; scripts/run_levels.py), more than between the
    processes of one start (1 %), so a run, not a process, is one vote. A run may also be a
    replay of the same steps written as a step log (``REPLAY.json#LOG``, replay_points): it votes
    only on steps some sweep run timed (a replay never adds a step to the fit). Points are
    matched by shape; one timed in only some runs takes those runs' median. ``run_ms`` keeps
    every run's time, ``runs`` how many timed it."""
    per_run, sweep_keys = [], []
    for paths in runs:
        if len(paths) == 1 and "#" in paths[0]:
            pts = replay_points(paths[0])
        elif len(paths) > 1:
            pts = process_points(paths)
        else:
            pts = [
                dict(p, ms=float(np.median(p["reps"])) if p.get("reps") else float(p["ms"]))
                for p in json.loads(Path(paths[0]).read_text())["points"]
            ]
        per_run.append({_shape_key(p): p for p in pts})
        if "#" not in paths[0]:
            sweep_keys += [k for k in per_run[-1] if k not in sweep_keys]
    out = []
    for k in sweep_keys:
        have = [run[k] for run in per_run if k in run]
        ms = [float(p["ms"]) for p in have]
        first = next(p for p in have if p["tag"] != "replay")
        out.append(dict(first, ms=float(np.median(ms)), reps=[round(m, 4) for m in ms], run_ms=ms, runs=len(have)))
    return out


def context_points(paths: list[str]) -> list[dict]:
    """The points of context sweeps (scripts/context_sweep.py): spread and longpre points are
    fitted, the table anchors are not (they re-time the sweep's own steps: drift only, except in a
    multi-start entry, see pool_table_points). A point's time is the median of its reps: the
    sweep's timer took the upper middle rep of an even count, so a two-rep point (the long steps of
    a three-rep sweep) was its slower rep. A comma-joined entry (a.json,b.json,...) is one sweep
    timed in several processes of one machine start (process_points); entries joined by '+'
    (a.json,b.json+c.json+d.json) are the same steps timed in several machine starts (run_points)."""
    out = []
    for path in paths:
        runs = [r.split(",") for r in path.split("+")]
        if len(runs) > 1:
            pts = run_points(runs)
        elif len(runs[0]) > 1:
            pts = process_points(runs[0])
        else:
            pts = json.loads(Path(path).read_text())["points"]
        name = "+".join(",".join(Path(x).name for x in r) for r in runs).replace(".json#profiles/", ".json#")
        for p in pts:
            p = dict(p, fit=not p["tag"].startswith("anchor"), source=name)
            if p.get("reps") and "run_ms" not in p:
                p["ms"] = float(np.median(p["reps"]))
            out.append(p)
    return out


def pool_table_points(pts: list[dict], ctx: list[dict], above: int) -> list[dict]:
    """The sweep's own steps above ``above`` tokens (the capture limit) re-timed as anchors in a
    multi-start entry: each such sweep point's time becomes the median over the sweep's run and
    the anchors' runs (the tail's level moves between machine starts; run_points). Below the
    capture limit the anchors stay drift checks. Returns one record per pooled point."""
    anchors = {}
    for a in ctx:
        if a["tag"].startswith("anchor-") and "run_ms" in a and a["n"] > above:
            anchors[(a["tag"][len("anchor-") :], tuple(a["shape_q"]), tuple(a["shape_ctx"]))] = a
    pooled = []
    for p in pts:
        anchor = anchors.get(_step_key(p)) if "shape_q" in p else None
        if anchor is None:
            continue
        ms = [float(p["ms"]), *anchor["run_ms"]]
        pooled.append(dict(tag=p["tag"], n=p["n"], sweep_ms=float(p["ms"]), run_ms=ms, ms=float(np.median(ms))))
        p["ms"], p["run_ms"] = float(np.median(ms)), ms
    return pooled


def busy_log(h200: Path, model: str) -> str:
    """The busy-decode steps written as a step log, as a replay names it (repository-relative)."""
    return repo_relative(str(Path(h200).resolve() / "steplogs" / f"busy-decode-{model}.jsonl"))


def voting_replays(h200: Path, model: str) -> list[Path]:
    """The stored replays of the busy-decode step log (replay/*-<model>.json naming it): each is one
    more machine start's vote on the busy steps (run_points)."""
    log = f'"{busy_log(h200, model)}"'
    return [f for f in sorted((Path(h200) / "replay").glob(f"*-{model}.json")) if log in f.read_text()]


def stored_context(h200: Path, model: str, leave_out: str | None = None) -> list[str]:
    """The --context entries of a model's stored sweeps in the measurements' folder h200 (archive/h200: what
    --stored-context and scripts/refit_h200.sh refit on): context/ctx- and grid-<model>.json; the
    busy steps as one entry pooled over machine starts, busy-<model>-p<k>.json (processes of one
    start) + busy-<model>-start<k>.json + the voting replays (REPLAY.json#LOG), or else
    busy-<model>.json. leave_out: a start's label whose files are left out (start<k>, or a
    voting replay's <label> of <label>-<model>.json; scripts/start_holdout.py)."""
    ctx = Path(h200) / "context"
    out = [str(ctx / f"{k}-{model}.json") for k in ("ctx", "grid") if (ctx / f"{k}-{model}.json").exists()]
    procs = ",".join(str(f) for f in sorted(ctx.glob(f"busy-{model}-p[0-9]*.json")))
    starts = [
        str(f) for f in sorted(ctx.glob(f"busy-{model}-start[0-9]*.json")) if f.stem != f"busy-{model}-{leave_out}"
    ]
    replays = [f"{f}#{busy_log(h200, model)}" for f in voting_replays(h200, model) if f.stem != f"{leave_out}-{model}"]
    if procs or starts:
        out.append("+".join(x for x in [procs, *starts, *replays] if x))
    elif (ctx / f"busy-{model}.json").exists():
        out.append(str(ctx / f"busy-{model}.json"))
    return out


def drift(points: list[dict], ctx: list[dict]) -> list[dict]:
    """Anchor points of a context sweep against the sweep's point of the same shape: signed %."""
    by = {(p["tag"], tuple(p["shape_q"]), tuple(p["shape_ctx"])): p for p in points if "shape_q" in p}
    out = []
    for c in ctx:
        if c["tag"].startswith("anchor-"):
            o = by.get((c["tag"][len("anchor-") :], tuple(c["shape_q"]), tuple(c["shape_ctx"])))
            if o:
                out.append(
                    dict(
                        n=c["n_real"],
                        sweep_ms=round(o["ms"], 4),
                        now_ms=round(c["ms"], 4),
                        drift_pct=round((c["ms"] / o["ms"] - 1) * 100, 2),
                    )
                )
    return out
