"""Print the results of a GPU run compactly (one line per point or replayed step), so a run's figures
survive a lost file transfer: busy/context sweep files (scripts/context_sweep.py) as
`P <file> <i> <tag> n=<tokens> R=<requests> <rep>/<rep>/...` and replay files (validator.gpu.replay)
as `S <file> <log> <summary>` then `R <file> <log> <step> n=<tokens> <rep>/<rep>/... pred=<ms>`;
with `--compact` a replay file's log is one line, `C <file> <log> <tokens>:<rep>/<rep>/... ...` (one
field per step, reps to 0.1 ms), for a run whose output tail is shared.
`read_printed` parses such lines back (the reps of each point or step, in order), and
`--rebuild` writes the files again from a run's printed output: a busy sweep's points from
plan.busy_plan and the sweep's anchors (as context_sweep.py builds them, checked tag by tag), a
replay's rows from its step logs (checked step by step); times are each point's or step's median rep.

    python3 validator/gpu/scripts/print_results.py [--compact] FILE.json [FILE.json ...]
    python3 validator/gpu/scripts/print_results.py --rebuild OUTPUT.txt --out DIR [--dir STEPLOG_DIR]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]


def _reps(xs: list[float]) -> str:
    return "/".join(f"{x:.2f}" for x in xs)


def lines(path: Path, compact: bool = False) -> list[str]:
    """The compact lines of one result file (compact: one line per replayed log)."""
    d = json.loads(path.read_text())
    out = []
    if compact and "points" not in d:
        for log, res in (d.get("logs") or {}).items():
            steps = " ".join(
                f"{r['n']}:" + "/".join(f"{x:.1f}" for x in (r.get("reps_ms") or [r["measured_ms"]]))
                for r in res.get("rows", [])
            )
            out.append(f"C {path.name} {Path(log).name} {steps}")
        return out
    if "points" in d:
        for i, p in enumerate(d["points"]):
            out.append(f"P {path.name} {i} {p['tag']} n={p['n_real']} R={p['R']} {_reps(p.get('reps') or [p['ms']])}")
    for log, res in (d.get("logs") or {}).items():
        name = Path(log).name
        out.append(f"S {path.name} {name} {json.dumps(res.get('summary', {}).get('all', {}), separators=(',', ':'))}")
        for r in res.get("rows", []):
            out.append(
                f"R {path.name} {name} {r['step']} n={r['n']} {_reps(r.get('reps_ms') or [r['measured_ms']])}"
                f" pred={r['predicted_ms']:.2f}"
            )
    return out


def read_printed(text: str) -> dict[str, list[tuple[str, int, list[float]]]]:
    """{file: [(tag or log name, tokens, reps), ...]} from printed lines (other lines ignored)."""
    out: dict[str, list[tuple[str, int, list[float]]]] = {}
    for ln in text.splitlines():
        f = ln.split()
        if len(f) >= 6 and f[0] == "P":
            out.setdefault(f[1], []).append((f[3], int(f[4][2:]), [float(x) for x in f[6].split("/")]))
        elif len(f) >= 6 and f[0] == "R":
            out.setdefault(f[1], []).append((f[2], int(f[4][2:]), [float(x) for x in f[5].split("/")]))
        elif len(f) >= 4 and f[0] == "C":
            for step in f[3:]:
                n, reps = step.split(":")
                out.setdefault(f[1], []).append((f[2], int(n), [float(x) for x in reps.split("/")]))
    return out


def _busy_file(model: str, got: list[tuple[str, int, list[float]]]) -> dict:
    """A busy sweep file (context_sweep.py --plan busy) from its printed points."""
    sys.path.insert(0, str(ROOT))
    from validator.gpu import plan as P
    from validator.gpu.fit import step_terms
    from validator.gpu.refit_points import sweep_budget

    cfg = json.loads((ROOT / "profiles" / "models" / f"{model}.json").read_text())
    dims = P.model_dims(cfg)
    caps = P.vllm_capture_sizes(P.CAPTURE_LIMIT)
    tags = {t[len("anchor-") :] for t, _, _ in got if t.startswith("anchor-")}
    parts = [
        k
        for k, t in (("decode", "busy-decode"), ("short", "busy-short"), ("one", "busy-one"))
        if any(g[0] == t for g in got)
    ]
    sweep = P.sweep_plan(caps, P.tail_sizes(P.CAPTURE_LIMIT), kv_budget_tokens=sweep_budget(dims))
    anchors = [P.StepShape(s.q, s.ctx, "anchor-" + s.tag) for s in sweep if s.tag in tags and s.n in P.ANCHOR_N]
    shapes = anchors + P.busy_plan(parts=parts)
    points = []
    for shape, (tag, n, reps) in zip(shapes, got):
        if (shape.tag, shape.n) != (tag, n):
            raise ValueError(f"{model}: printed point {tag} n={n} is not the plan's {shape.tag} n={shape.n}")
        dec, pre = step_terms(shape.q, shape.ctx)
        points.append(
            dict(
                tag=tag,
                n=P.padded_tokens(shape.n, caps),
                n_real=shape.n,
                kv=shape.kv,
                R=shape.requests,
                dec=dec,
                pre=round(pre, 6),
                ms=statistics.median(reps),
                reps=reps,
                shape_q=list(shape.q),
                shape_ctx=list(shape.ctx),
                rebuilt_from_printed=True,
            )
        )
    return dict(model=f"profiles/models/{model}.json", points=points)


def _replay_file(model: str, got: list[tuple[str, int, list[float]]], steplog_dir: str) -> dict:
    """A replay file (validator.gpu.replay) from its printed steps and their step logs."""
    sys.path.insert(0, str(ROOT))
    from validator.gpu import plan as P
    from validator.gpu.steplog import concurrency_of, error_summary, read_steplog

    caps = P.vllm_capture_sizes(P.CAPTURE_LIMIT)
    logs: dict[str, dict] = {}
    for name in dict.fromkeys(g[0] for g in got):
        src = f"{steplog_dir}/{name}"
        steps = read_steplog(ROOT / src)
        mine = [g for g in got if g[0] == name]
        rows = []
        for st, (_, n, reps) in zip(steps, mine):
            shape = P.StepShape(tuple(st["q"]), tuple(st["ctx"]))
            if shape.n != n:
                raise ValueError(f"{name}: printed step n={n}, the log's n={shape.n}")
            rows.append(
                dict(
                    step=st.get("step"),
                    concurrency=concurrency_of(st),
                    n=shape.n,
                    n_pad=P.padded_tokens(shape.n, caps),
                    kv=shape.kv,
                    R=shape.requests,
                    measured_ms=statistics.median(reps),
                    reps_ms=reps,
                    predicted_ms=st["predicted_ms"],
                    predicted_log_ms=st["predicted_ms"],
                    rebuilt_from_printed=True,
                )
            )
        res: dict[str, Any] = dict(rows=rows, summary=error_summary(rows))
        if len(rows) < len(steps):
            res["partial"] = True
        logs[src] = res
    return dict(model=f"profiles/models/{model}.json", profile=f"profiles/h200/h200-{model}.yaml", logs=logs)


def rebuild(text: str, out: Path, steplog_dir: str) -> list[Path]:
    """Every busy-<model>-p<k>.json / check-<model>[-k].json printed in ``text``, written to ``out``."""
    written = []
    out.mkdir(parents=True, exist_ok=True)
    for fname, got in read_printed(text).items():
        stem = fname[: -len(".json")]
        if stem.startswith("busy-"):
            model = stem[len("busy-") :].rsplit("-p", 1)[0]
            d = _busy_file(model, got)
        else:
            model = stem[len("check-") :]
            if model.rsplit("-", 1)[-1].isdigit():  # check-<model>-<k>: the model's k-th replay process
                model = model.rsplit("-", 1)[0]
            d = _replay_file(model, got, steplog_dir)
        from dsim.outputs import write_file  # (dsim is on sys.path by now)

        write_file(out / fname, json.dumps(d, indent=1), "output")
        written.append(out / fname)
    return written


def main(argv: list[str] | None = None) -> int:
    argv = list(argv if argv is not None else sys.argv[1:])
    if argv and argv[0] == "--rebuild":
        import argparse

        ap = argparse.ArgumentParser()
        ap.add_argument("--rebuild", required=True)
        ap.add_argument("--out", required=True)
        ap.add_argument("--dir", default="archive/h200/steplogs-s1")
        ns = ap.parse_args(argv)
        for w in rebuild(Path(ns.rebuild).read_text(), Path(ns.out), ns.dir):
            print(w)
        return 0
    compact = "--compact" in argv
    for a in (x for x in argv if x != "--compact"):
        p = Path(a)
        if not p.is_file():
            continue
        try:
            print("\n".join(lines(p, compact)), flush=True)
        except (ValueError, KeyError) as e:  # a file cut mid-write: say so, print the rest
            print(f"X {p.name} unreadable: {e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
