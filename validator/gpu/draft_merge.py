"""Drafter tables re-measured by `python3 -m validator.gpu.profile --draft-only`, checked and merged
into the shipped profiles (`python3 -m validator.gpu.refit --drafts`): each table the median over
processes, compared with the table it replaces, with the sentence the profiling docs quote.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from dsim.errors import InputError
from validator.gpu import plan as P
from validator.gpu.profile_files import dump_yaml, raw_of, write_text_atomic

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
