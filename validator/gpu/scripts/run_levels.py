"""The run-to-run level of the H200 executor from the stored records: every step or point timed in
more than one machine start (run), matched by shape (tokens, KV tokens, requests) across the stored
sweeps, context / grid / busy files and replays of one model, and each run's level on the steps
it shares with the others.

A record belongs to the run it was measured in (RUNS, as docs/user/gpu-profiling.md tells them: the
profile sweep, the context-sweep run with its held-out replays, the request-grid run with its check
replays, the busy run, the repeat run, the second checking set's runs A-E). Processes of one run
are combined by each step's median over processes (as the refit combines them). A step set is the
steps shared by two or more runs; a run's level is the median over those steps of its time over
the reference run's (the first run that has the step set, in RUNS order); the set's spread is
(max - min) / median of the levels, as validator.noise measures a metric's run-to-run spread.

A step's time: the executor's back-to-back reps of a large step fall on two levels (one rep in
three 5-7 % slower), and the median of an odd count is the majority (fast) level, the time a replay
reports; so each record's fast level is its reps' median for an odd count and its fastest rep for an
even one (a two-rep median mixes the levels; the busy and repeat runs kept two reps above the
capture limit). Where a record kept no reps its stored time is used, and the step set says so.

    python3 validator/gpu/scripts/run_levels.py [--min-tokens 6000] [--models qwen3-14b,...]
        [--add FILE.json:LABEL ...] [--json OUT.json] [--judge STEPLOG ...]

`--add` joins a new run's replay or sweep files (e.g. a device run's check-<model>.json, labelled E).
`--judge STEPLOG` (a step log as the replays name it, e.g.
archive/h200/steplogs-s1/default-c256-qwen3-14b.jsonl) applies the rule to one log: every run that
replayed it, its errors from the current profile (refit.repredict) per run and pooled (each step's
median over the runs), the spread of the runs' levels on it (all its steps), and each median and
p90 against the larger of the target (3 % / 6 %) and that spread.
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
H200 = ROOT / "archive" / "h200"  # the stored records (archive/MANIFEST.md)
PROFILES = ROOT / "profiles" / "h200"
MODELS = ("llama-3.1-8b", "qwen3-8b", "qwen3-14b", "qwen3-32b")

# (run label, what it was, record files relative to archive/h200 with {m} the model)
RUNS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("sweep", "profile sweep (points of h200-<model>.raw.json) and its in-process replay", ("h200-{m}.raw.json",)),
    ("replay", "fresh-process replay of the DSpark logs", ("replay/replay-{m}.json",)),
    ("context", "context-sweep run and held-out replays", ("context/ctx-{m}.json", "replay/heldout-{m}.json")),
    ("grid", "request-grid run and check replays", ("context/grid-{m}.json", "replay/check-{m}.json")),
    ("busy", "busy-step run", ("context/busy-{m}.json",)),
    ("repeat", "repeat run", ("context/busy-repeat-{m}.json", "replay/repeat-*-{m}.json")),
    ("A", "second checking set, run A", ("replay/s1-{m}.json",)),
    ("B", "second checking set, run B", ("replay/s1b-{m}.json",)),
    ("C", "second checking set, run C (three busy processes)", ("context/busy-{m}-p?.json", "replay/s1c-{m}.json")),
    ("D", "second checking set, run D", ("replay/s1d-{m}.json",)),
    (
        "E",
        "second checking set, run E (c256 logs; Qwen3-14B in two processes)",
        ("replay/s1e-{m}.json", "replay/s1e-{m}-?.json"),
    ),
)
RUNS += (
    ("s2", "the third checking log's run (seed 2) with its composition design", ("replay/s2-{m}.json",)),
    *(
        (
            f"start{k}",
            f"machine start {k} (start_levels.sh: busy-decode and tail steps, then the c256 logs)",
            (f"context/busy-{{m}}-start{k}.json", f"replay/start{k}-{{m}}.json"),
        )
        for k in range(1, 10)
    ),
)
# Qwen3-14B's profile sweep ran in the context-sweep run (context_and_heldout.sh, PROFILE_MODEL)
SAME_RUN = {("qwen3-14b", "sweep"): "context"}


class Timed(NamedTuple):
    """One step or point as one process timed it."""

    key: tuple[int, int, int]  # (real tokens, KV tokens, requests)
    tokens: int
    ms: float  # as stored (the record's own statistic)
    fast_ms: float | None  # the fast level (fast_level), None where the reps were not kept


def fast_level(reps: list[float]) -> float | None:
    """The majority level of a step's reps: the median of an odd count, the fastest of an even one."""
    if not reps:
        return None
    return statistics.median(reps) if len(reps) % 2 else min(reps)


def record_steps(path: Path) -> list[Timed]:
    """Every timed step of a sweep/context file (points) or a replay file (rows; a raw.json's
    in-process replay too); a shape timed twice in one file is left out (not matchable)."""
    d = json.loads(path.read_text())
    out: list[Timed] = []
    for p in d.get("points") or []:
        reps = p.get("reps") or []
        n = int(p.get("n_real", p["n"]))
        out.append(Timed((n, int(p["kv"]), int(p["R"])), n, float(p["ms"]), fast_level(reps)))
    rows = [r for res in (d.get("logs") or {}).values() for r in res.get("rows", [])]
    rows += (d.get("replay") or {}).get("rows", []) if isinstance(d.get("replay"), dict) else []
    for r in rows:
        reps = r.get("reps_ms") or []
        n = int(r["n"])
        out.append(Timed((n, int(r["kv"]), int(r["R"])), n, float(r["measured_ms"]), fast_level(reps)))
    seen: dict[tuple[int, int, int], int] = {}
    for t in out:
        seen[t.key] = seen.get(t.key, 0) + 1
    return [t for t in out if seen[t.key] == 1]


def collect(model: str, added: list[tuple[Path, str]]) -> dict[str, list[list[Timed]]]:
    """{run: [one list of steps per process (record file)]} for one model, in RUNS order, added last."""
    runs: dict[str, list[list[Timed]]] = {}
    for label, _, patterns in RUNS:
        label = SAME_RUN.get((model, label), label)
        for pat in patterns:
            for f in sorted(glob.glob(str(H200 / pat.format(m=model)))):
                if f.endswith(".repredicted.json"):
                    continue
                runs.setdefault(label, []).append(record_steps(Path(f)))
    for path, label in added:
        d = json.loads(path.read_text())
        if Path(str(d.get("model", ""))).stem == model:
            runs.setdefault(label, []).append(record_steps(path))
    return runs


def combine(processes: list[list[Timed]]) -> dict[tuple[int, int, int], Timed]:
    """One run's steps: each shape's median over the processes that timed it (fast level: the
    median of the processes' fast levels, None if any process lacks its reps)."""
    by: dict[tuple[int, int, int], list[Timed]] = {}
    for proc in processes:
        for t in proc:
            by.setdefault(t.key, []).append(t)
    out = {}
    for k, ts in by.items():
        fast = [t.fast_ms for t in ts]
        out[k] = Timed(
            k,
            ts[0].tokens,
            statistics.median(t.ms for t in ts),
            statistics.median(f for f in fast if f is not None) if all(f is not None for f in fast) else None,
        )
    return out


def step_sets(runs: dict[str, dict[tuple[int, int, int], Timed]], min_tokens: int) -> list[dict[str, Any]]:
    """Groups of steps timed in the same two or more runs (at min_tokens or more), with each run's
    level against the group's first run and the spread."""
    groups: dict[tuple[str, ...], list[tuple[int, int, int]]] = {}
    keys = {k for steps in runs.values() for k, t in steps.items() if t.tokens >= min_tokens}
    for k in keys:
        having = tuple(r for r in runs if k in runs[r])
        if len(having) >= 2:
            groups.setdefault(having, []).append(k)
    out = []
    for having, ks in sorted(groups.items(), key=lambda g: (-len(g[1]), g[0])):
        ref = having[0]
        fast = all(runs[r][k].fast_ms is not None for r in having for k in ks)

        def t(r: str, k: tuple[int, int, int], fast: bool = fast) -> float:
            v = runs[r][k].fast_ms if fast else runs[r][k].ms
            return float(v)  # type: ignore[arg-type]

        levels = {r: statistics.median(t(r, k) / t(ref, k) for k in ks) for r in having}
        lv = list(levels.values())
        out.append(
            dict(
                runs=list(having),
                steps=len(ks),
                tokens=[min(runs[ref][k].tokens for k in ks), max(runs[ref][k].tokens for k in ks)],
                statistic="fast level" if fast else "stored (reps not kept)",
                levels=levels,
                spread=(max(lv) - min(lv)) / statistics.median(lv),
            )
        )
    return out


def process_levels(processes: list[list[Timed]], min_tokens: int) -> tuple[float, int, int] | None:
    """Within one run: (max - min) / median of its records' levels on the steps they share (at
    min_tokens or more; the records that share steps with the first such record), with the number
    of those records and steps; None where no two records timed the same step."""
    maps = [{t.key: t for t in p if t.tokens >= min_tokens} for p in processes]
    for i, ref in enumerate(maps):
        group = [m for m in maps[i:] if set(m) & set(ref)]
        if len(group) < 2:
            continue
        common = set.intersection(*(set(m) for m in group))

        def t(x: Timed) -> float:
            return x.fast_ms if x.fast_ms is not None else x.ms

        lv = [statistics.median(t(m[k]) / t(ref[k]) for k in common) for m in group]
        return (max(lv) - min(lv)) / statistics.median(lv), len(group), len(common)
    return None


TARGET_MEDIAN_PCT, TARGET_P90_PCT = 3.0, 6.0  # the replay targets


def _errors(pred_meas: list[tuple[float, float]]) -> dict[str, float]:
    e = [100 * (p - m) / m for p, m in pred_meas]
    a = sorted(abs(x) for x in e)
    return dict(median=statistics.median(a), p90=float(np.percentile(a, 90)), signed_mean=statistics.fmean(e))


STATISTICS = ("median", "mean")


def measured_ms(row: dict[str, Any], statistic: str) -> float:
    """A replayed step's measured time: ``median`` the record's own (the median of its reps: an odd
    count's fast level), ``mean`` the mean of its reps where they were kept, what an engine running
    such steps back to back pays (one rep in three of a 6-8K-token step is 5-7 % slower)."""
    reps = row.get("reps_ms") or []
    return statistics.fmean(reps) if statistic == "mean" and reps else float(row["measured_ms"])


def judge(
    steplog: str, models: list[str], added: list[tuple[Path, str]], statistic: str = "median"
) -> dict[str, Any] | None:
    """The rule on one step log: per run and pooled errors from the current profile, the runs'
    spread on the log's steps, and each statistic against max(target, spread); ``statistic``:
    what a step's measured time is (measured_ms)."""
    sys.path.insert(0, str(ROOT))
    from dsim.errors import InputError
    from validator.gpu import refit as RF

    files: list[tuple[Path, str]] = []
    for m in models:
        for label, _, patterns in RUNS:
            label = SAME_RUN.get((m, label), label)
            for pat in patterns:
                for name in sorted(glob.glob(str(H200 / pat.format(m=m)))):
                    if not name.endswith(".repredicted.json") and "logs" in json.loads(Path(name).read_text()):
                        files.append((Path(name), label))
    files += added
    per_run: dict[str, list[dict[int, tuple[float, float]]]] = {}
    model = None
    for f, label in files:
        d = json.loads(f.read_text())
        if steplog not in (d.get("logs") or {}):
            continue
        model = Path(str(d["model"])).stem
        try:
            (res,) = RF.repredict(f, PROFILES / f"h200-{model}.yaml", only=steplog).values()
        except InputError as e:  # a record that does not match its log (e.g. a dry run's): left out, said
            print(f"run_levels: --judge: {f.name} left out: {e}", file=sys.stderr)
            continue
        per_run.setdefault(label, []).append(
            {r["step"]: (r["predicted_ms"], measured_ms(r, statistic)) for r in res["rows"]}
        )
    if not per_run:
        return None
    runs = {}
    for label, procs in per_run.items():  # processes of a run: each step's median
        steps = set.union(*(set(p) for p in procs))  # a process cut short counts where it timed
        have = {k: [p[k] for p in procs if k in p] for k in steps}
        runs[label] = {k: (v[0][0], statistics.median(x[1] for x in v)) for k, v in have.items()}
    common = set.intersection(*(set(r) for r in runs.values()))
    if not common:
        return None
    ref = next(iter(runs))
    levels = {r: statistics.median(runs[r][k][1] / runs[ref][k][1] for k in common) for r in runs}
    lv = list(levels.values())
    spread_pct = 100 * (max(lv) - min(lv)) / statistics.median(lv) if len(lv) > 1 else 0.0
    lim_med, lim_p90 = max(TARGET_MEDIAN_PCT, spread_pct), max(TARGET_P90_PCT, spread_pct)
    out: dict[str, Any] = dict(steplog=steplog, model=model, statistic=statistic, levels=levels, spread_pct=spread_pct)
    out["limits_pct"] = dict(median=lim_med, p90=lim_p90)
    out["runs"] = {r: _errors(list(v.values())) for r, v in runs.items()}
    pooled = [(runs[ref][k][0], statistics.median(runs[r][k][1] for r in runs)) for k in sorted(common)]
    out["runs"]["pooled"] = _errors(pooled)
    for v in out["runs"].values():
        v["meets"] = v["median"] <= lim_med and v["p90"] <= lim_p90
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--min-tokens", type=int, default=6000, help="steps of at least this many real tokens")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--add", action="append", default=[], metavar="FILE.json:LABEL", help="a new run's record")
    ap.add_argument("--json", default=None, help="write the step sets here")
    ap.add_argument("--judge", action="append", default=[], metavar="STEPLOG", help="the rule on one log")
    ap.add_argument(
        "--statistic",
        choices=STATISTICS,
        default="median",
        help="--judge: a step's measured time, the median of its reps (the record's) or their mean (back to back)",
    )
    a = ap.parse_args(argv)
    added = []
    for spec in a.add:
        path, sep, label = spec.rpartition(":")
        if not sep or not label or not Path(path).is_file():
            print(f"run_levels: --add {spec}: expected FILE.json:LABEL with FILE an existing file", file=sys.stderr)
            return 2
        added.append((Path(path), label))
    result: dict[str, Any] = {"min_tokens": a.min_tokens, "models": {}}
    for m in a.models.split(","):
        if m not in MODELS:
            print(f"run_levels: --models: unknown model {m} (known: {', '.join(MODELS)})", file=sys.stderr)
            return 2
        raw = collect(m, added)
        runs = {r: combine(p) for r, p in raw.items()}
        sets = step_sets(runs, a.min_tokens)
        within = {r: process_levels(p, a.min_tokens) for r, p in raw.items()}
        result["models"][m] = dict(step_sets=sets, within_run_process_spread=within)
        for s in sets:
            lv = " ".join(f"{r} {v:.4f}" for r, v in s["levels"].items())
            print(
                f"{m} steps={s['steps']} n={s['tokens'][0]}-{s['tokens'][1]} ({s['statistic']}) levels: {lv} "
                f"spread {100 * s['spread']:.1f}%"
            )
        for r, v in within.items():
            if v is not None:
                print(f"{m} within run {r}: {v[1]} records sharing {v[2]} steps, spread {100 * v[0]:.1f}%")
    result["judged"] = []
    for lg in a.judge:
        j = judge(lg, a.models.split(","), added, a.statistic)
        if j is None:
            print(f"run_levels: --judge {lg}: no steps of this log replayed in every run", file=sys.stderr)
            return 2
        result["judged"].append(j)
        print(
            f"{Path(lg).parent.name}/{Path(lg).name} ({a.statistic} of the reps): run spread {j['spread_pct']:.1f}% (levels "
            + ", ".join(f"{r} {v:.4f}" for r, v in j["levels"].items())
            + f"); limits median {j['limits_pct']['median']:.1f}% p90 {j['limits_pct']['p90']:.1f}%"
        )
        for r, v in j["runs"].items():
            print(
                f"  {r}: {v['median']:.2f} / {v['p90']:.2f} % (signed {v['signed_mean']:+.2f}) "
                + ("meets" if v["meets"] else "misses")
            )
    if a.json:
        from dsim.outputs import write_file  # (dsim is on sys.path by now)

        write_file(a.json, json.dumps(result, indent=1) + "\n", "output")
    return 0


if __name__ == "__main__":
    sys.exit(main())
