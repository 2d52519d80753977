"""Refit a measured H200 profile from its raw sweep points with the current step model (no GPU).

    python3 -m validator.gpu.refit profiles/h200/h200-qwen3-8b.raw.json [more.raw.json ...]

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

import yaml

from dsim.errors import InputError
from validator.gpu import plan as P

# appended to provenance.method (the line dsim prints for a profile): what the fit is now
REFIT_NOTE = (
    "; refit {date} (python3 -m validator.gpu.refit): step_ms = F(n) + kv term + a * decode tokens "
    "+ beta * prefill pairs, the table priced for decode tokens and (a, beta) as prefill_terms, "
    "tail-prefill points fitted"
)


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
    for k, v in prof.items():  # measured extras (replay_check ...) stay
        new.setdefault(k, v)
    # the method line says what the fit is now: an earlier refit's note (any date) is replaced
    method = prov.get("method", "")
    mark = REFIT_NOTE.split("{date}")[0]
    if mark in method:
        method = method[: method.index(mark)]
    prov["method"] = method + REFIT_NOTE.format(date=dt.date.today().isoformat())
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
    ap.add_argument("raw", nargs="+")
    a = ap.parse_args(argv)
    command = "python3 -m validator.gpu.refit " + " ".join(a.raw)
    try:
        for r in a.raw:
            path = Path(r)
            if not path.exists():
                raise InputError(f"{r}: file not found")
            fit = refit(path, command)
            print(
                f"{path.name}: kv {fit['kv_ms_per_ktok']:.5f} ms/ktok, prefill_terms {fit.get('prefill_terms')}, "
                f"residuals {json.dumps(fit['residual_pct']['by_tag'])}"
            )
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
