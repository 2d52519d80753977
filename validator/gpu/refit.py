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

import numpy as np
import yaml

from dsim.errors import InputError
from validator.gpu import plan as P
from validator.gpu.draft_merge import draft_doc_sentence, draft_summary, merge_drafts
from validator.gpu.fit import attention_structure, fit_step_model, kv_slope_by_window, predicted_step_ms
from validator.gpu.profile_files import dump_yaml, profile_dict, repo_relative, write_text_atomic, yaml_of
from validator.gpu.refit_points import (
    context_points,
    drift,
    point_shapes,
    point_terms,
    pool_table_points,
    replay_steps,
    stored_context,
)
from validator.gpu.steplog import error_summary

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


OCCUPANCIES = ((1, 1), (1, 2), (2, 1), (2, 2), (3, 2), (4, 2), (2, 3), (4, 4))  # (decode, prefill) CTAs per SM


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
    from dsim.cost import CostModel, profile_from_dict

    cost = CostModel(profile_from_dict(yaml.safe_load(profile_path.read_text()), str(profile_path)))
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
