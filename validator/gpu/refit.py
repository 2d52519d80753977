"""Refit a measured H200 profile from its raw sweep points with the current step model (no GPU).

    python3 -m validator.gpu.refit profiles/h200/h200-qwen3-8b.raw.json [more.raw.json ...]
    python3 -m validator.gpu.refit RAW [RAW ...] --context ctx-<model>.json [--context ...]
    python3 -m validator.gpu.refit --repredict REPLAY.json PROFILE.yaml OUT.json

With --context (context sweeps, scripts/context_sweep.py) the fit adds the per-request attention
terms (format 2: refit_attention); --repredict predicts a replay's measured rows again from a
profile (repredict).

For each RAW (written by `python3 -m validator.gpu.profile`), points that predate the prefill terms
get their decode tokens and prefill pairs from the sweep's seeded shapes (plan.sweep_plan: tail
points; every other swept step is decode only), the fit flags follow plan.FIT_EXCLUDE, and
plan.fit_step_model is run again. The YAML next to it (same stem) gets the new forward table, KV
slope, prefill_terms and fit residuals; everything measured (draft tables, provenance, checks) is
kept, and provenance.refit says what was redone, when and with which command. RAW is rewritten
with the points' terms and the new fit. Files are replaced atomically.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

import numpy as np
import yaml

from dsim.errors import InputError
from validator.gpu import plan as P

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
    from validator.gpu import plan as P

    new = P.profile_dict(
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
            p["dec"], p["pre"] = P.step_terms(s.q, s.ctx)
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


def context_points(paths: list[str]) -> list[dict]:
    """The points of context sweeps (scripts/context_sweep.py): spread and longpre points are
    fitted, the table anchors are not (they re-time the sweep's own steps: drift only). A point's
    time is the median of its reps: the sweep's timer took the upper middle rep of an even count,
    so a two-rep point (the long steps of a three-rep sweep) was its slower rep. A comma-joined
    entry (a.json,b.json,...) is one sweep timed in several processes (process_points)."""
    out = []
    for path in paths:
        parts = path.split(",")
        pts = process_points(parts) if len(parts) > 1 else json.loads(Path(path).read_text())["points"]
        name = ",".join(Path(x).name for x in parts)
        for p in pts:
            p = dict(p, fit=not p["tag"].startswith("anchor"), source=name)
            if p.get("reps"):
                p["ms"] = float(np.median(p["reps"]))
            out.append(p)
    return out


def fit_attention(points: list[dict], dims: dict, split: dict, knots: list[int] | None = None) -> tuple[dict, list]:
    """plan.fit_step_model with the attention terms at each (decode, prefill) occupancy in
    OCCUPANCIES; the one with the smallest mean over tags (but table) of the median residual wins.
    Returns (fit, [(occupancy, median residual %)...])."""
    best, tried = None, []
    grid = any(p.get("tag", "").startswith("rgrid") for p in points)  # the request terms need the grid
    for occ in OCCUPANCIES:
        a = P.attention_structure(dims, split, *occ)
        pts = [dict(p) for p in points]
        fit = P.fit_step_model(pts, attention=a, request_terms=grid, monotone=grid, knots=knots)
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


def refit_attention(raw_path: Path, ctx_paths: list[str], command: str) -> dict:
    """Refit a profile with the per-request attention terms (format 2) from its sweep points plus
    the context sweeps: the YAML next to RAW gets format_version 2, the attention section, the new
    forward table, KV slope and prefill_terms; RAW gets the context points and the fit."""
    raw = json.loads(raw_path.read_text())
    yaml_path = raw_path.with_name(raw_path.name.replace(".raw.json", ".yaml"))
    prof = yaml.safe_load(yaml_path.read_text())
    model = raw["model"]
    cfg = json.loads((Path(__file__).resolve().parents[2] / "profiles" / "models" / f"{model}.json").read_text())
    dims = P.model_dims(cfg)
    pts = [p for p in raw["points"]]
    point_terms(pts)
    point_shapes(pts, dims)
    for p in pts:
        p["fit"] = p["tag"] not in P.FIT_EXCLUDE
    ctx_paths = [c for c in ctx_paths if Path(json.loads(Path(c.split(",")[0]).read_text())["model"]).stem == model]
    if not ctx_paths:
        raise InputError(f"{raw_path}: no context sweep of {model} among --context")
    ctx = context_points(ctx_paths)
    split = dict(prof["provenance"]["attention_check"]["split"])
    split.setdefault("sms", raw.get("info", {}).get("sms", 132))
    allp = pts + ctx
    fit, tried = fit_attention(allp, dims, split, knots=P.table_knots(prof["capture_sizes"]))
    fit["kv_ms_per_ktok_by_window_n128"] = P.kv_slope_by_window(pts)
    fit["occupancy_tried"] = tried
    fit["anchor_drift"] = drift(pts, ctx)
    prov = dict(prof["provenance"])
    new = _refitted_profile(prof, prov, fit)
    prov["method"] = _with_note(prov.get("method", ""), ATTENTION_NOTE)
    prov["attention_fit"] = dict(
        date=dt.date.today().isoformat(),
        command=command,
        context_sweeps=[",".join(Path(x).name for x in c.split(",")) for c in ctx_paths],
        fitted_tags=sorted({p["tag"] for p in allp if p.get("fit", True) and p["tag"] not in P.FIT_EXCLUDE}),
        not_fitted_tags=sorted({p["tag"] for p in allp if not p.get("fit", True) or p["tag"] in P.FIT_EXCLUDE}),
        occupancy_tried=tried,
        anchor_drift=fit["anchor_drift"],
    )
    raw["points"] = pts
    raw["context_points"] = [p for p in allp if p.get("source")]
    raw["fit"] = fit
    P.write_text_atomic(yaml_path, P.dump_yaml(new))
    P.write_text_atomic(raw_path, json.dumps(raw, default=str))
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
    root = Path(__file__).resolve().parents[2]
    out = {}
    names = [Path(src).name for src in rep["logs"]]
    for src, res in rep["logs"].items():
        if only is not None and src != only:
            continue
        steps = P.read_steplog(root / src if not Path(src).is_absolute() else src)
        rows = res["rows"]
        if res.get("partial"):  # a replay cut short: its first len(rows) steps were timed
            steps = steps[: len(rows)]
        if len(steps) != len(rows):
            raise InputError(f"{replay_path}: {src} has {len(rows)} rows, the log {len(steps)} steps")
        new_rows = []
        for st, r in zip(steps, rows):
            shape = P.StepShape(tuple(st["q"]), tuple(st["ctx"]))
            if shape.n != r["n"] or shape.kv != r["kv"]:
                raise InputError(f"{replay_path}: {src} step {r.get('step')}: shape differs from the log")
            new_rows.append(dict(r, predicted_ms=P.predicted_step_ms(cost, shape), predicted_log_ms=r["predicted_ms"]))
        out[Path(src).name if names.count(Path(src).name) == 1 else src] = dict(
            summary=P.error_summary(new_rows), rows=new_rows
        )
    return out


def refit(raw_path: Path, command: str) -> dict:
    raw = json.loads(raw_path.read_text())
    yaml_path = raw_path.with_name(raw_path.name.replace(".raw.json", ".yaml"))
    prof = yaml.safe_load(yaml_path.read_text())
    pts = raw["points"]
    point_terms(pts)
    for p in pts:
        p["fit"] = p["tag"] not in P.FIT_EXCLUDE
    fit = P.fit_step_model(pts)
    fit["kv_ms_per_ktok_by_window_n128"] = P.kv_slope_by_window(pts)
    old = {"kv_ms_per_ktok": prof["kv_ms_per_ktok"], "fit": prof.get("fit")}
    prov = dict(prof["provenance"])
    new = _refitted_profile(prof, prov, fit)
    prov["method"] = _with_note(prov.get("method", ""), REFIT_NOTE)
    prov["refit"] = dict(
        date=dt.date.today().isoformat(),
        command=command,
        what=(
            "forward table, KV slope and prefill_terms refitted from the same measured points with "
            "decode tokens and prefill causal-attention pairs as terms (plan.fit_step_model); the "
            "single-chunk tail-prefill points are now fitted; draft tables, checks and the replay_check "
            "(made with the previous fit) unchanged"
        ),
        previous=dict(kv_ms_per_ktok=old["kv_ms_per_ktok"], residual_pct=(old["fit"] or {}).get("residual_pct")),
    )
    raw["fit"] = fit
    P.write_text_atomic(yaml_path, P.dump_yaml(new))
    P.write_text_atomic(raw_path, json.dumps(raw, default=str))
    return fit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("raw", nargs="*")
    ap.add_argument(
        "--context",
        action="append",
        default=[],
        help="context sweep JSON (scripts/context_sweep.py): refit with the attention terms; a.json,b.json,... "
        "is one sweep timed in several processes (each point: the median over processes of each one's median)",
    )
    ap.add_argument(
        "--repredict",
        nargs=3,
        action="append",
        default=[],
        metavar=("REPLAY", "PROFILE", "OUT"),
        help="predict a replay's rows again from PROFILE (shapes from its step logs), write OUT",
    )
    a = ap.parse_args(argv)
    command = P.repo_relative(
        "python3 -m validator.gpu.refit " + " ".join(a.raw + [f"--context {c}" for c in a.context])
    )
    try:
        for r in a.raw + [x for c in a.context for x in c.split(",")] + [x for t in a.repredict for x in t[:2]]:
            if not Path(r).exists():
                raise InputError(f"{r}: file not found")
        for r in a.raw:
            path = Path(r)
            fit = refit_attention(path, a.context, command) if a.context else refit(path, command)
            print(
                f"{path.name}: kv {fit['kv_ms_per_ktok']:.5f} ms/ktok, prefill_terms {fit.get('prefill_terms')}, "
                f"attention {fit.get('attention')}, residuals {json.dumps(fit['residual_pct']['by_tag'])}"
            )
        for rep, prof, out in a.repredict:
            res = repredict(Path(rep), Path(prof))
            P.write_text_atomic(out, json.dumps(dict(replay=Path(rep).name, profile=prof, logs=res), indent=1))
            for log, r in res.items():
                print(f"{log}: {json.dumps(r['summary'].get('all'))}")
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
