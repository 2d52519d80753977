"""Refit a measured GPU profile from its raw sweep points with the current step model (no GPU).

    python3 -m validator.gpu.refit RAW [RAW ...] --stored-context --out DIR
    python3 -m validator.gpu.refit RAW [RAW ...] --context ctx-<model>.json [--context ...] --out DIR
    python3 -m validator.gpu.refit RAW --drop-attention --out DIR
    python3 -m validator.gpu.refit --repredict REPLAY.json PROFILE.yaml OUT.json

With --context (context sweeps: the profiler's context/ folder, or scripts/context_sweep.py) or
--stored-context (the sweeps in RAW's folder/context) the fit has the per-request attention terms
(format 2: refit_attention); --repredict predicts a replay's measured rows again from a profile
(repredict).

For each RAW (written by `python3 -m validator.gpu.profile`), points that predate the prefill terms
get their decode tokens and prefill pairs from the sweep's seeded shapes (plan.sweep_plan: tail
points; every other swept step is decode only), the fit flags follow plan.FIT_EXCLUDE, and
fit.fit_step_model is run again. The profile (the YAML next to RAW, same stem) gets the new forward
table, KV slope, prefill_terms and fit residuals; everything measured (draft tables, provenance,
checks) is kept, and provenance.refit says what was redone, when and with which command. The
profile and RAW (with the points' terms and the new fit) are written into --out DIR, or replaced
atomically with --in-place; one of the two is required. A profile with attention terms is not
refitted without its context sweeps (the terms and the new KV slope would both price attention)
unless --drop-attention makes it format 1.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from dsim.errors import InputError
from validator.gpu import plan as P
from validator.gpu.fit import attention_structure, fit_step_model, kv_slope_by_window, predicted_step_ms, step_terms
from validator.gpu.profile_files import dump_yaml, profile_dict, raw_of, repo_relative, write_text_atomic, yaml_of
from validator.gpu.steplog import error_summary, read_steplog

# appended to provenance.method (the line dsim prints for a profile): what the fit is now
REFIT_NOTE = (
    "; refit {date} (python3 -m validator.gpu.refit): step_ms = F(n) + kv term + a * decode tokens "
    "+ beta * prefill pairs, the table priced for decode tokens and (a, beta) as prefill_terms, "
    "tail-prefill points fitted"
)


def _with_note(method: str, note: str) -> str:
    """The provenance method line with today's ``note`` (a template with {date}) in place of an
    earlier one of the same note (any date): the line says what the fit is now."""
    mark = note.split("{date}")[0]
    if mark in method:
        method = method[: method.index(mark)]
    return method + note.format(date=dt.date.today().isoformat())


def _refitted_profile(prof: dict, prov: dict, fit: dict) -> dict:
    """prof rewritten around a new fit: its memory, capture sizes, drafter and CPU overhead kept,
    and its measured extras (replay_check ...) carried over."""
    new = profile_dict(
        name=prof["name"],
        provenance=prov,
        kv_cache_gib=prof["memory"]["kv_cache_gib"],
        kv_bytes_per_token=prof["memory"]["kv_bytes_per_token"],
        caps=prof["capture_sizes"],
        fit=fit,
        draft=prof.get("draft") or {},
        cpu_overhead_ms=prof["cpu_overhead_ms"],
    )
    for k, v in prof.items():
        new.setdefault(k, v)
    return new


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
OCCUPANCIES = ((1, 1), (1, 2), (2, 1), (2, 2), (3, 2), (4, 2), (2, 3), (4, 4))  # (decode, prefill) CTAs per SM


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


def fit_knots(caps: list[int], points: list[dict]) -> list[int]:
    """The forward table's knots for a fit: plan.table_knots (the capture and tail sizes) and the
    sizes above the capture limit where busy-decode steps were timed (plan.busy_plan). A saturated
    step between two tail sizes does not cost the line between them (Qwen3-14B on the H200: the
    7680-token busy steps sat 2.3 % under the line from 6144 to 8192), and that is where the
    default trace's steps run at high concurrency; a size with points of its own gets its own F."""
    top = max(int(c) for c in caps)
    busy = {int(p["n"]) for p in points if p.get("tag") == "busy-decode" and int(p["n"]) > top}
    return sorted(set(P.table_knots(caps)) | busy)


def fit_attention(points: list[dict], dims: dict, split: dict, knots: list[int] | None = None) -> tuple[dict, list]:
    """fit.fit_step_model with the attention terms at each (decode, prefill) occupancy in
    OCCUPANCIES; the one with the smallest mean over tags (but table) of the median residual wins.
    Returns (fit, [(occupancy, median residual %)...])."""
    best, tried = None, []
    grid = any(p.get("tag", "").startswith("rgrid") for p in points)  # the request terms need the grid
    for occ in OCCUPANCIES:
        a = attention_structure(dims, split, *occ)
        pts = [dict(p) for p in points]
        fit = fit_step_model(pts, attention=a, request_terms=grid, monotone=grid, knots=knots)
        # (the table points are fitted exactly, one F per size: the terms are judged on the rest)
        by = {k: v for k, v in fit["residual_pct"]["by_tag"].items() if k != "table"}
        med = float(np.mean(list(by.values()))) if by else fit["residual_pct"]["median_abs"]
        tried.append((list(occ), round(med, 3)))
        if best is None or med < best[0]:
            best = (med, fit, pts)
    assert best is not None
    points[:] = best[2]
    return best[1], tried


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


def profile_paths(raw_path: Path, out_dir: Path | None = None) -> tuple[Path, Path, Path]:
    """(RAW's profile (profile_files.yaml_of: next to RAW, or the shipped one of an archived RAW), the YAML
    written, the RAW written): out_dir None writes both in place."""
    yaml_path = yaml_of(raw_path)
    if out_dir is None:
        return yaml_path, yaml_path, raw_path
    return yaml_path, Path(out_dir) / yaml_path.name, Path(out_dir) / raw_path.name


def raw_dims(raw: dict) -> dict:
    """The model dimensions a raw file was measured with: its own record (profiles measured since it
    was kept, the dry run's tiny model too), else its model config (raw["model_config"], else
    profiles/models/<model>.json)."""
    if raw.get("dims"):
        return dict(raw["dims"])
    root = Path(__file__).resolve().parents[2]
    cfg = Path(raw.get("model_config") or root / "profiles" / "models" / f"{raw['model']}.json")
    cfg = cfg if cfg.is_absolute() else root / cfg
    if not cfg.exists():
        raise InputError(f"model {raw['model']!r}: no model config {cfg} (the raw file names none)")
    return P.model_dims(json.loads(cfg.read_text()))


def refit_attention(raw_path: Path, ctx_paths: list[str], command: str, out_dir: Path | None = None) -> dict:
    """Refit a profile with the per-request attention terms (format 2) from its sweep points plus
    the context sweeps: the YAML next to RAW gets format_version 2, the attention section, the new
    forward table, KV slope and prefill_terms; RAW gets the context points and the fit. out_dir:
    write both there (same names) in place of RAW's folder."""
    raw = json.loads(raw_path.read_text())
    yaml_path, yaml_out, raw_out = profile_paths(raw_path, out_dir)
    prof = yaml.safe_load(yaml_path.read_text())
    model = raw["model"]
    dims = raw_dims(raw)
    pts = [p for p in raw["points"]]
    point_terms(pts)
    point_shapes(pts, dims)
    for p in pts:
        p["fit"] = p["tag"] not in P.FIT_EXCLUDE
    ctx_paths = [
        c for c in ctx_paths if Path(json.loads(Path(re.split("[,+#]", c)[0]).read_text())["model"]).stem == model
    ]
    if not ctx_paths:
        raise InputError(f"{raw_path}: no context sweep of {model} among --context")
    ctx = context_points(ctx_paths)
    anchor_drift = drift(pts, ctx)
    # the fit's copies: the stored sweep keeps its own times, so a refit pools from them again
    fit_pts = [dict(p) for p in pts]
    pooled = pool_table_points(fit_pts, ctx, max(int(c) for c in prof["capture_sizes"]))
    split = dict(prof["provenance"]["attention_check"]["split"])
    split.setdefault("sms", raw.get("info", {}).get("sms", 132))
    allp = fit_pts + ctx
    table_knots = P.table_knots(prof["capture_sizes"])
    knots = fit_knots(prof["capture_sizes"], allp)
    fit, tried = fit_attention(allp, dims, split, knots=knots)
    fit["kv_ms_per_ktok_by_window_n128"] = kv_slope_by_window(pts)
    fit["occupancy_tried"] = tried
    fit["anchor_drift"] = anchor_drift
    prov = dict(prof["provenance"])
    new = _refitted_profile(prof, prov, fit)
    prov["method"] = _with_note(prov.get("method", ""), ATTENTION_NOTE)
    prov["attention_fit"] = dict(
        date=dt.date.today().isoformat(),
        command=command,
        context_sweeps=[re.sub("[^,+#]*/", "", c) for c in ctx_paths],
        busy_knots=[k for k in knots if k not in table_knots],
        fitted_tags=sorted({p["tag"] for p in allp if p.get("fit", True) and p["tag"] not in P.FIT_EXCLUDE}),
        not_fitted_tags=sorted({p["tag"] for p in allp if not p.get("fit", True) or p["tag"] in P.FIT_EXCLUDE}),
        occupancy_tried=tried,
        anchor_drift=fit["anchor_drift"],
    )
    if pooled:
        prov["attention_fit"]["table_points_pooled_over_starts"] = pooled
    raw["points"] = pts
    raw["context_points"] = [p for p in allp if p.get("source")]
    raw["fit"] = fit
    write_text_atomic(yaml_out, dump_yaml(new))
    write_text_atomic(raw_out, json.dumps(raw, default=str))
    return fit


ATTENTION_NOTE = (
    "; attention terms {date} (python3 -m validator.gpu.refit --context): step_ms = F(n) + kv term + "
    "a * decode tokens + per-request split-KV terms (wave capacity: the list-schedule makespan of the "
    "chunk CTAs over the SMs; chunk CTAs; merge cells; per request; schedule tail; once per step with "
    "decode requests) + wave-counted "
    "prefill pairs (format_version 2, attention section), F fitted at the capture and tail sizes "
    "(other sizes by linear interpolation, as read), fitted on the sweep plus a context sweep of "
    "unequal contexts and long cached prefixes and a request grid"
)


def repredict(replay_path: Path, profile_path: Path, only: str | None = None) -> dict:
    """A replay's rows (validator.gpu.replay output) predicted again from a profile, with each
    row's shape read from its step log: {log: {"summary": ..., "rows": [...]}}, log the step
    log's file name (its path as the replay names it where two of its logs share a name). The
    measured times are the replay's; only the predictions are new. only: that one log."""
    from dsim.cost import profile_from_dict

    cost = P.CostModel(profile_from_dict(yaml.safe_load(profile_path.read_text()), str(profile_path)))
    rep = json.loads(replay_path.read_text())
    out = {}
    names = [Path(src).name for src in rep["logs"]]
    for src, res in rep["logs"].items():
        if only is not None and src != only:
            continue
        new_rows = []
        for st, r in replay_steps(replay_path, src, res):
            shape = P.StepShape(tuple(st["q"]), tuple(st["ctx"]))
            new_rows.append(dict(r, predicted_ms=predicted_step_ms(cost, shape), predicted_log_ms=r["predicted_ms"]))
        out[Path(src).name if names.count(Path(src).name) == 1 else src] = dict(
            summary=error_summary(new_rows), rows=new_rows
        )
    return out


def refit(raw_path: Path, command: str, out_dir: Path | None = None, drop_attention: bool = False) -> dict:
    """The forward table, KV slope and prefill_terms refitted from RAW's sweep points alone (format 1).
    A profile with per-request attention terms (its attention section, fitted with context sweeps)
    is refused unless drop_attention: its terms priced the attention the new KV slope now prices
    too, so keeping them counts attention twice (+18 to +33 % median on the H200 profiles' held-out
    steps); drop_attention writes a format-1 profile without them and says so in provenance."""
    raw = json.loads(raw_path.read_text())
    yaml_path, yaml_out, raw_out = profile_paths(raw_path, out_dir)
    prof = yaml.safe_load(yaml_path.read_text())
    if prof.get("attention") and not drop_attention:
        found = stored_context(raw_path.parent, raw["model"])
        hint = (
            "--stored-context (found: " + ", ".join(Path(f).name for f in found) + ")"
            if found
            else "--context FILE ..."
        )
        raise InputError(
            f"{yaml_path}: has per-request attention terms (format {prof.get('format_version')}); a refit without "
            f"the context sweeps would keep them beside a KV slope that prices attention again (attention counted "
            f"twice): refit with {hint}, or pass --drop-attention for a format-1 profile without them"
        )
    if drop_attention:
        prof = {k: v for k, v in prof.items() if k not in ("attention", "format_version")}
    pts = raw["points"]
    point_terms(pts)
    for p in pts:
        p["fit"] = p["tag"] not in P.FIT_EXCLUDE
    fit = fit_step_model(pts)
    fit["kv_ms_per_ktok_by_window_n128"] = kv_slope_by_window(pts)
    old = {"kv_ms_per_ktok": prof["kv_ms_per_ktok"], "fit": prof.get("fit")}
    prov = dict(prof["provenance"])
    new = _refitted_profile(prof, prov, fit)
    prov["method"] = _with_note(prov.get("method", ""), REFIT_NOTE)
    prov["refit"] = dict(
        date=dt.date.today().isoformat(),
        command=command,
        what=(
            "forward table, KV slope and prefill_terms refitted from the same measured points with "
            "decode tokens and prefill causal-attention pairs as terms (fit.fit_step_model); the "
            "single-chunk tail-prefill points are now fitted; draft tables, checks and the replay_check "
            "(made with the previous fit) unchanged"
        ),
        previous=dict(kv_ms_per_ktok=old["kv_ms_per_ktok"], residual_pct=(old["fit"] or {}).get("residual_pct")),
    )
    if drop_attention:
        prov["attention_terms"] = (
            "dropped by the refit (--drop-attention): format 1, attention priced by the KV slope alone; "
            "provenance.attention_fit describes the terms this profile had"
        )
    raw["fit"] = fit
    write_text_atomic(yaml_out, dump_yaml(new))
    write_text_atomic(raw_out, json.dumps(raw, default=str))
    return fit


# ---------------------------------------------------------------- drafter tables
DRAFT_WHAT = (
    "drafter tables re-measured at the drafter capture sizes (plan.DRAFT_REQUESTS: 1, 2, 4, 8-256 by 8, "
    "272-512 by 16; dsim reads the next size at or above a batch, the padded batch) by python3 -m "
    "validator.gpu.profile --draft-only in {processes} fresh processes (the target built with one layer: "
    "the drafters read its embedding, final norm, LM head and KV pool, never its layers); each size one "
    "CUDA graph, the median of {reps} replays per process, the table the median over the processes; "
    "forward table, attention terms, fit, checks and replay_check unchanged"
)


def _bad(path: Path, where: str, what: str) -> InputError:
    return InputError(f"{path}: {where}: {what}")


def _positive_times(v: Any, path: Path, where: str) -> list[float]:
    if not isinstance(v, list) or not v:
        raise _bad(path, where, "not a non-empty list of times")
    out = []
    for j, x in enumerate(v):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not np.isfinite(x) or x <= 0:
            raise _bad(path, f"{where}[{j}]", f"{x!r} is not a positive time (ms)")
        out.append(float(x))
    return out


def read_drafts(path: Path, allow_dry_run: bool = False) -> dict:
    """A --draft-only file (validator.gpu.profile --draft-only), checked: its model, and per kind
    the tables of the runs that timed every size of plan.DRAFT_REQUESTS (a run cut short times a
    prefix of them: its table is left out), the median over those runs per size. Returns dict(model,
    runs, tables={kind: dict(requests, ms, process_ms)}, cut={kind: runs cut short}). Bad input:
    InputError naming the file and the field."""
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(doc, dict) or doc.get("format") != P.DRAFT_FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise _bad(path, "format", f"{got!r}, not {P.DRAFT_FORMAT!r} (python3 -m validator.gpu.profile --draft-only)")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise _bad(path, "model", f"{model!r} is not a model name")
    runs = doc.get("runs")
    if not isinstance(runs, list) or not runs:
        raise _bad(path, "runs", "no run")
    grid = list(P.DRAFT_REQUESTS)
    per_kind: dict[str, list[list[float]]] = {}
    cut: dict[str, int] = {}
    for i, run in enumerate(runs):
        at = f"runs[{i}]"
        if not isinstance(run, dict):
            raise _bad(path, at, "not a mapping")
        if run.get("dry_run") and not allow_dry_run:
            raise _bad(path, f"{at}.dry_run", "a dry run (tiny CPU model, its numbers mean nothing); not merged")
        for key, want in (("context", P.DRAFT_CTX), ("block_k", P.BLOCK_K), ("block_layers", P.BLOCK_LAYERS)):
            if not run.get("dry_run") and run.get(key) != want:
                raise _bad(path, f"{at}.{key}", f"{run.get(key)!r}, the profiles' drafters have {want}")
        tables = run.get("tables")
        if not isinstance(tables, dict):
            raise _bad(path, f"{at}.tables", "not a mapping")
        for kind, t in tables.items():
            w = f"{at}.tables.{kind}"
            if kind not in P.DRAFT_ORDER:
                raise _bad(path, w, f"unknown drafter kind (known: {', '.join(P.DRAFT_ORDER)})")
            if not isinstance(t, dict):
                raise _bad(path, w, "not a mapping")
            reqs = t.get("requests")
            if reqs == [] and t.get("ms") == []:  # stopped before its first size
                cut[kind] = cut.get(kind, 0) + 1
                continue
            if not isinstance(reqs, list) or reqs != grid[: len(reqs)] or not reqs:
                raise _bad(
                    path, f"{w}.requests", f"not the drafter sizes {grid[:4]}...{grid[-1]} (plan.DRAFT_REQUESTS)"
                )
            ms = _positive_times(t.get("ms"), path, f"{w}.ms")
            if len(ms) != len(reqs):
                raise _bad(path, f"{w}.ms", f"has {len(ms)} values, requests has {len(reqs)} (one time per size)")
            if len(reqs) == len(grid) and t.get("complete", True):
                per_kind.setdefault(kind, []).append(ms)
            else:
                cut[kind] = cut.get(kind, 0) + 1
    if not per_kind:
        raise _bad(path, "runs", f"no drafter table timed at every size ({len(runs)} runs, all cut short)")
    out = {}
    for kind in P.DRAFT_ORDER:
        if kind in per_kind:
            a = np.array(per_kind[kind])
            out[kind] = dict(requests=grid, ms=[float(x) for x in np.median(a, axis=0)], process_ms=per_kind[kind])
    return dict(model=model, runs=runs, tables=out, cut=cut)


def _next_at_or_above(x: list[int], ms: list[float], R: int) -> float:
    """dsim's reading of a drafter table (CostModel.draft_table_ms) inside it: the running maximum
    at the next size at or above R."""
    acc = np.maximum.accumulate(np.asarray(ms, dtype=float))
    return float(acc[min(int(np.searchsorted(np.asarray(x), R, side="left")), len(x) - 1)])


def draft_comparison(old: dict, new: dict) -> dict:
    """The previous table against the new one for one kind: at the previous table's sizes (signed %,
    new over previous: the drift), and as dsim charges a batch of R = 1..max new size (previous over
    new: mean % more and the largest ratio, with its R)."""
    ox, oms = [int(r) for r in old["requests"]], [float(m) for m in old["ms"]]
    nx, nms = [int(r) for r in new["requests"]], [float(m) for m in new["ms"]]
    at = {r: m for r, m in zip(nx, nms)}
    d = [(at[r] / m - 1) * 100 for r, m in zip(ox, oms) if r in at]
    top = min(max(nx), max(ox))
    ratio = np.array([_next_at_or_above(ox, oms, R) / _next_at_or_above(nx, nms, R) for R in range(1, top + 1)])
    k = int(np.argmax(ratio))
    hi = [i for i, r in enumerate(nx) if r >= nx[-1] - 128]  # the last 128 requests: the slope dsim extrapolates
    fit_slope = float(np.polyfit([nx[i] for i in hi], [nms[i] for i in hi], 1)[0]) if len(hi) >= 2 else 0.0
    last_slope = (nms[-1] - nms[-2]) / (nx[-1] - nx[-2]) if len(nx) >= 2 else 0.0
    return dict(
        drift_at_previous_sizes_pct=dict(
            median=round(float(np.median(d)), 2) if d else None,
            max_abs=round(float(np.max(np.abs(d))), 2) if d else None,
            sizes=[r for r in ox if r in at],
        ),
        previous_over_new=dict(
            mean_pct=round(float(ratio.mean() - 1) * 100, 1),
            max_ratio=round(float(ratio[k]), 3),
            at_requests=k + 1,
            requests=f"1..{top}",
        ),
        slope_ms_per_request=dict(last=round(float(last_slope), 6), fitted_last_128=round(fit_slope, 6)),
    )


def _one(vals: list) -> Any:
    u = []
    for v in vals:
        if v not in u:
            u.append(v)
    return u[0] if len(u) == 1 else u


def merge_drafts(path: Path, profile_dir: Path, command: str, allow_dry_run: bool = False, write: bool = True) -> dict:
    """The drafter tables of a --draft-only file (read_drafts) into its model's shipped profile,
    profile_dir/h200-<model>.yaml and its raw file (profile_files.raw_of): each kind timed at every size in at least one run
    replaces the profile's table of that kind (requests, ms: the median over runs, rounded as
    profile_files.profile_dict rounds); every other field stays as it was. provenance.draft_tables records
    the hardware, torch, dates, commands, processes and the comparison with the previous tables;
    the raw file keeps every run (reps, SM clocks) under "draft", with the tables before the first
    re-measurement as "previous". The runs must be of the profile's hardware and split-KV settings.
    write=False checks and returns the new files' text (files: [(path, text)]) without writing."""
    d = read_drafts(path, allow_dry_run)
    model = d["model"]
    yaml_path = profile_dir / f"h200-{model}.yaml"
    raw_path = raw_of(yaml_path)
    for f in (yaml_path, raw_path):
        if not f.exists():
            raise _bad(path, "model", f"{model!r}: no profile {f}")
    prof = yaml.safe_load(yaml_path.read_text())
    raw = json.loads(raw_path.read_text())
    prov = prof["provenance"]
    split = prov.get("attention_check", {}).get("split", {})
    for i, run in enumerate(d["runs"]):
        gpu = (run.get("info") or {}).get("gpu")
        if not run.get("dry_run") and gpu != prov["hardware"]:
            raise _bad(
                path,
                f"runs[{i}].info.gpu",
                f"{gpu!r}: the profile {yaml_path.name} was measured on {prov['hardware']!r}",
            )
        rs = run.get("split") or {}
        for k in ("fill", "balance", "min_chunk"):
            if k in split and rs.get(k) != split[k]:
                raise _bad(path, f"runs[{i}].split.{k}", f"{rs.get(k)!r}: the profile's executor ran {split[k]!r}")
    old_draft = dict(prof.get("draft") or {})
    previous = (raw.get("draft") or {}).get("previous") or {k: dict(v) for k, v in old_draft.items()}
    tables = d["tables"]
    new_draft = dict(old_draft)
    for kind, t in tables.items():
        new_draft[kind] = {"requests": [int(r) for r in t["requests"]], "ms": [round(float(m), 5) for m in t["ms"]]}
    prof["draft"] = new_draft
    runs = d["runs"]
    info = [r.get("info") or {} for r in runs]
    compare = {k: draft_comparison(previous[k], new_draft[k]) for k in tables if k in previous}
    record = dict(
        date=dt.date.today().isoformat(),
        what=DRAFT_WHAT.format(
            processes=_span([len(t["process_ms"]) for t in tables.values()], "d"),
            reps=_span([int(r.get("reps") or 0) for r in runs], "d"),
        ),
        kinds=list(tables),
        kept=[k for k in old_draft if k not in tables],
        measured=_one([r.get("date") for r in runs]),
        hardware=_one([i.get("gpu") for i in info]),
        driver=_one([i.get("driver") for i in info]),
        torch=_one([i.get("torch") for i in info]),
        cuda=_one([i.get("cuda") for i in info]),
        sms=_one([i.get("sms") for i in info]),
        command=_one([r.get("job") or r.get("command") for r in runs]),
        process_commands=_one([r.get("command") for r in runs]),
        merge_command=command,
        source=path.name,
        processes={k: len(t["process_ms"]) for k, t in tables.items()},
        runs_cut_short=d["cut"],
        reps=_one([r.get("reps") for r in runs]),
        context=_one([r.get("context") for r in runs]),
        split=_one([r.get("split") for r in runs]),
        previous_requests=_one([[int(x) for x in previous[k]["requests"]] for k in tables if k in previous]),
        compared=compare,
    )
    if any(r.get("dry_run") for r in runs):
        record["dry_run"] = True
    prov["draft_tables"] = record
    raw["draft"] = dict(
        merged=record["date"],
        command=command,
        source=path.name,
        tables={k: dict(t) for k, t in tables.items()},
        previous=previous,
        runs=runs,
    )
    files = [(yaml_path, dump_yaml(prof)), (raw_path, json.dumps(raw, default=str))]
    if write:
        for f, text in files:
            write_text_atomic(f, text)
    return dict(model=model, profile=str(yaml_path), record=record, draft=new_draft, previous=previous, files=files)


DOC_MODELS = {
    "llama-3.1-8b": "Llama-3.1-8B",
    "qwen3-8b": "Qwen3-8B",
    "qwen3-14b": "Qwen3-14B",
    "qwen3-32b": "Qwen3-32B",
}


def _span(vals: list[float], fmt: str) -> str:
    """'lo-hi' over the models ('lo to hi' where a sign is written), one value where they agree."""
    lo, hi = format(min(vals), fmt), format(max(vals), fmt)
    if lo == hi:
        return lo
    return f"{lo} to {hi}" if fmt.startswith("+") or min(vals) < 0 else f"{lo}-{hi}"


def draft_doc_sentence(results: list[dict]) -> str:
    """The comparison docs/user/gpu-profiling.md states (its Draft tables paragraph), from the merged
    profiles: what the previous (power-of-two) tables charged the DSpark drafter and MTP over the
    new ones, the largest ratio with its R and costs, and the drift at the previous sizes."""
    got = [r for r in results if "dspark" in r["record"]["compared"]]
    if not got:
        return ""
    c = {r["model"]: r["record"]["compared"] for r in got}
    ds = {m: v["dspark"]["previous_over_new"] for m, v in c.items()}
    top = max(ds, key=lambda m: ds[m]["max_ratio"])
    R = ds[top]["at_requests"]
    res = next(r for r in got if r["model"] == top)
    new, old = res["draft"]["dspark"], res["previous"]["dspark"]
    was = _next_at_or_above(old["requests"], old["ms"], R)
    now = _next_at_or_above(new["requests"], new["ms"], R)
    mtp = [v["mtp"]["previous_over_new"]["mean_pct"] for v in c.values() if "mtp" in v]
    drift = [v[k]["drift_at_previous_sizes_pct"] for v in c.values() for k in v]
    mtp_s = f" (MTP {_span(mtp, '.0f')} %)" if mtp else ""
    return (
        f"against the re-measured tables the earlier ones charged the DSpark drafter "
        f"{_span([v['mean_pct'] for v in ds.values()], '.0f')} % more on average over R = 1..512{mtp_s} and at most "
        f"{_span([v['max_ratio'] for v in ds.values()], '.2f')}x (R = {R}: {DOC_MODELS.get(top, top)} {was:.1f} ms "
        f"against {now:.1f} ms), on {len(ds)} models; at the earlier sizes the two agree within "
        f"{max(d['max_abs'] for d in drift):.1f} % (median {_span([d['median'] for d in drift], '+.1f')} %)."
    )


def draft_summary(res: dict) -> str:
    """One line per merged profile: kinds, processes, drift and what the previous tables charged."""
    rec = res["record"]
    parts = []
    for k, c in rec["compared"].items():
        po, dr, sl = c["previous_over_new"], c["drift_at_previous_sizes_pct"], c["slope_ms_per_request"]
        parts.append(
            f"{k}: previous {po['mean_pct']:+} % mean, {po['max_ratio']}x at R={po['at_requests']}; drift at the "
            f"previous sizes median {dr['median']:+} %, max {dr['max_abs']} %; last slope {sl['last']} ms/request "
            f"(fitted {sl['fitted_last_128']})"
        )
    kept = f", kept {rec['kept']}" if rec["kept"] else ""
    return f"{res['model']}: {rec['kinds']} from {rec['processes']} processes{kept}; " + "; ".join(parts)


def output_dir(raws: list[str], out: str, in_place: bool) -> Path | None:
    """Where a refit writes (None: in place), checked before anything is read: a refit replaces a
    profile only when asked to (--in-place), else writes into --out, which must not be a RAW's own
    folder."""
    if not raws:
        return None
    if in_place and out:
        raise InputError("--out and --in-place: pass one")
    if in_place:
        return None
    if not out:
        raise InputError(
            f"{raws[0]}: a refit rewrites the profile next to it and the raw file; pass --out DIR to write new "
            "files there, or --in-place to replace them"
        )
    d = Path(out)
    for r in raws:
        if d.exists() and d.resolve() == Path(r).resolve().parent:
            raise InputError(f"--out {out}: the folder of {r}, whose files would be replaced; pass --in-place for that")
    return d  # (created by the first write: nothing is made for a refit that stops)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("raw", nargs="*")
    ap.add_argument(
        "--context",
        action="append",
        default=[],
        help="context sweep JSON (scripts/context_sweep.py): refit with the attention terms; a.json,b.json,... "
        "is one sweep timed in several processes (each point: the median over processes of each one's median); "
        "a.json,b.json+c.json+d.json the same steps timed in several machine starts (each point: the median "
        "over starts), whose anchors above the capture limit are pooled with the sweep's own points; a start may "
        "be a replay of the same steps as a step log, REPLAY.json#LOG",
    )
    ap.add_argument(
        "--stored-context",
        action="store_true",
        help="refit each RAW on its model's stored sweeps next to it (context/ctx-, grid-, busy-<model>*.json and "
        "the replays of the busy-decode step log: stored_context), as --context entries",
    )
    ap.add_argument(
        "--repredict",
        nargs=3,
        action="append",
        default=[],
        metavar=("REPLAY", "PROFILE", "OUT"),
        help="predict a replay's rows again from PROFILE (shapes from its step logs), write OUT",
    )
    ap.add_argument(
        "--drafts",
        action="append",
        default=[],
        metavar="DRAFTS.json",
        help="a drafter-table file (python3 -m validator.gpu.profile --draft-only): its tables replace the "
        "drafter tables of its model's profile in --profiles (repeatable; nothing else changes)",
    )
    ap.add_argument(
        "--out",
        default="",
        metavar="DIR",
        help="write each refitted profile and raw file into DIR (same names); RAW's own files are left as they are",
    )
    ap.add_argument(
        "--in-place",
        action="store_true",
        help="replace the YAML next to each RAW and RAW itself (a refit needs --out or --in-place)",
    )
    ap.add_argument(
        "--drop-attention",
        action="store_true",
        help="refit a profile with per-request attention terms without --context: write it as format 1, the terms "
        "dropped (without this flag such a refit is refused: the terms and the new KV slope would both price attention)",
    )
    ap.add_argument("--profiles", default="profiles/h200", help="--drafts: the profiles' folder (h200-<model>.yaml)")
    ap.add_argument("--allow-dry-run", action="store_true", help="--drafts: merge dry-run files too (tests)")
    a = ap.parse_args(argv)
    if a.stored_context:
        try:
            for r in a.raw:
                a.context += stored_context(Path(r).parent, json.loads(Path(r).read_text())["model"])
        except (OSError, ValueError, KeyError) as e:
            print(f"error: --stored-context: {e}", file=sys.stderr)
            return 2
    if a.drafts:
        command = repo_relative(
            "python3 -m validator.gpu.refit "
            + " ".join(f"--drafts {x}" for x in a.drafts)
            + (f" --profiles {a.profiles}" if a.profiles != "profiles/h200" else "")
        )
    else:
        command = repo_relative(
            "python3 -m validator.gpu.refit "
            + " ".join(
                a.raw
                + [f"--context {c}" for c in a.context]
                + (["--drop-attention"] if a.drop_attention else [])
                + ([f"--out {a.out}"] if a.out else ["--in-place"] if a.in_place else [])
            )
        )
    try:
        for r in (
            a.raw
            + [x.partition("#")[0] for c in a.context for x in re.split("[,+]", c)]
            + [x for t in a.repredict for x in t[:2]]
            + a.drafts
        ):
            if not Path(r).exists():
                raise InputError(f"{r}: file not found")
        out_dir = output_dir(a.raw, a.out, a.in_place)
        # every file checked before any profile is written
        merged = [merge_drafts(Path(f), Path(a.profiles), command, a.allow_dry_run, write=False) for f in a.drafts]
        models = [r["model"] for r in merged]
        for f, m in zip(a.drafts, models):
            if models.count(m) > 1:
                raise InputError(f"{f}: model {m!r}: another --drafts file is of the same model (one file per model)")
        for res in merged:
            for f, text in res["files"]:
                write_text_atomic(f, text)
            print(draft_summary(res))
        sentence = draft_doc_sentence(merged)
        if sentence:
            print(f"doc: {sentence}")
        for r in a.raw:
            path = Path(r)
            if a.context:
                fit = refit_attention(path, a.context, command, out_dir)
            else:
                fit = refit(path, command, out_dir, a.drop_attention)
            print(
                f"{path.name}: kv {fit['kv_ms_per_ktok']:.5f} ms/ktok, prefill_terms {fit.get('prefill_terms')}, "
                f"attention {fit.get('attention')}, residuals {json.dumps(fit['residual_pct']['by_tag'])}"
            )
        for rep, prof, out in a.repredict:
            res = repredict(Path(rep), Path(prof))
            write_text_atomic(out, json.dumps(dict(replay=Path(rep).name, profile=prof, logs=res), indent=1))
            for log, r in res.items():
                print(f"{log}: {json.dumps(r['summary'].get('all'))}")
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
