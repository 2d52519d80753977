"""Simulated seconds per CPU second of `dsim simulate`, one 8-GPU node, closed loop, Azure conv
lengths: this tree side by side with another commit's code.

    python benchmarks/bench_speed.py                          # this tree only
    python benchmarks/bench_speed.py --base 4e28db9           # this tree vs commit 4e28db9
    python benchmarks/bench_speed.py --base 4e28db9 --reps 3 --concurrency 256 --requests-per-user 40

Each (tree, configuration) runs in its own subprocess (``python -m dsim``'s package of that
tree on sys.path), alternating trees and configurations, ``--reps`` times; a subprocess first
runs a tiny simulation of the configuration (process set-up: the head fit, the acceptance
shifts, loading the compiled kernels from numba's cache) and then times one run with CPU time
(time.process_time, less sensitive to other jobs on a shared machine than wall time). Printed:
x real time per run, the medians, and the ratios side by side (this tree / base, and each
method / no speculation in the same tree, and no speculation's CPU time / the method's for the same
requests). ``--base`` checks the commit out once with
``git worktree add`` under the system temp directory.

Targets (docs/results/performance.md): at concurrency 256, DSpark adaptive >= no speculation in the same
tree (ratio >= 1.0) and >= 5x the base (4e28db9); no speculation >= 3x the base.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHODS = {"none": "SpecConfig()", "mtp": "SpecConfig('mtp')", "dspark-adaptive": "SpecConfig('dspark', adaptive=True)"}

CHILD = r"""
import dataclasses, json, sys, time
import numpy as np
from dsim.cost import load_profile
from dsim.sim import SimConfig, SpecConfig, simulate
from dsim.workload import load_workload
C, per_user = {C}, {per_user}
spec = {spec}
prof = load_profile({profile!r})
simulate(SimConfig(workload=load_workload("azure-conv", n=16), profile=prof, spec=spec))
w = load_workload("azure-conv", n=C * per_user)
w = dataclasses.replace(w, closed_loop_concurrency=C, arrival_s=np.zeros(len(w.arrival_s)))
t = time.process_time()
s = simulate(SimConfig(workload=w, profile=prof, spec=spec)).summary
cpu = time.process_time() - t
print(json.dumps({{"sim_s": s["sim_time_s"], "cpu_s": cpu, "steps": s["steps"], "x": s["sim_time_s"] / cpu}}))
"""


def base_tree(commit: str) -> Path:
    """A checkout of ``commit`` (git worktree, made once)."""
    sha = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", commit], check=True, capture_output=True, text=True
    ).stdout.strip()
    path = Path(tempfile.gettempdir()) / f"dsim-base-{sha}"
    if not (path / "dsim").is_dir():
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), sha], check=True, capture_output=True
        )
    return path


# the profile docs/results/performance.md figures use; --profile another (e.g. a format-2 h200 profile)
PROFILE = "deepseek-v4-class-h200x8"


def run_one(tree: Path, C: int, per_user: int, method: str, profile: str = PROFILE) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    # the traces stay where this tree finds them (a checkout elsewhere has no ../shared)
    env.setdefault("DSIM_TRACE_DIR", str((ROOT / ".." / "shared" / "traces").resolve()))
    code = CHILD.format(C=C, per_user=per_user, spec=METHODS[method], profile=profile)
    r = subprocess.run([sys.executable, "-c", code], cwd=str(tree), env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"bench_speed: {tree}: {method}: {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default=None, help="a git commit to run side by side (e.g. 4e28db9)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[256])
    ap.add_argument("--requests-per-user", type=int, default=40)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--profile", default=PROFILE, help=f"profile name or path (default {PROFILE})")
    a = ap.parse_args()
    trees = {"this": ROOT}
    if a.base:
        trees["base"] = base_tree(a.base)
    res: dict = {}
    cpu: dict = {}  # CPU seconds per run: every method simulates the same requests
    for rep in range(a.reps):
        for C in a.concurrency:
            for m in a.methods:
                for name, tree in trees.items():
                    r = run_one(tree, C, a.requests_per_user, m, a.profile)
                    res.setdefault((name, C, m), []).append(r["x"])
                    cpu.setdefault((name, C, m), []).append(r["cpu_s"])
                    print(
                        f"rep {rep + 1} C={C:<4} {m:16} {name:5} {r['x']:8.1f} x real time "
                        f"({r['steps']} steps, {r['cpu_s'] / r['steps'] * 1e6:.0f} us/step)",
                        flush=True,
                    )
    print()
    med = {k: statistics.median(v) for k, v in res.items()}
    head = f"{'C':>4} {'method':16} " + " ".join(f"{n + ' x':>9}" for n in trees) + f" {'vs none':>8} {'per req':>8}"
    if a.base:
        head += f" {'this/base':>10}"
    print(head)
    for C in a.concurrency:
        for m in a.methods:
            line = f"{C:>4} {m:16} " + " ".join(f"{med[(n, C, m)]:9.1f}" for n in trees)
            none = med.get(("this", C, "none"))
            line += f" {med[('this', C, m)] / none:8.3f}" if none else f" {'':>8}"
            none_cpu = cpu.get(("this", C, "none"))
            line += (
                f" {statistics.median(none_cpu) / statistics.median(cpu[('this', C, m)]):8.3f}"
                if none_cpu
                else f" {'':>8}"
            )
            if a.base:
                line += f" {med[('this', C, m)] / med[('base', C, m)]:10.2f}"
            print(line)
    print(
        f"(medians of {a.reps} runs; 'vs none': this tree's method / its no-speculation speed, in simulated "
        "seconds per CPU second (the target's measure); 'per req': no speculation's CPU time / the method's, "
        "for the same requests)"
    )


if __name__ == "__main__":
    main()
