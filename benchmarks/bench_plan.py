"""Wall time of `dsim plan` (MTP-1 and DSpark adaptive, full-hour Azure conv, seeds 0-2) and where
the time goes.

    python benchmarks/bench_plan.py [--sla p50=20ms] [--jobs N]
    python benchmarks/bench_plan.py --base 7c6f020 --reps 3   # side by side with another commit
    python benchmarks/bench_plan.py --profile default          # the plan's default profile
    python benchmarks/bench_plan.py --breakdown [--profile default]  # process start, kernels, workload, each simulation

Target (docs/performance.md): <= 20 s wall on a 2-core machine. --breakdown times, in one fresh
process: importing dsim, the first use of the compiled kernels (loaded from numba's on-disk cache;
compiled on a first run ever), loading the workload of each seed, and the six simulations the
plan's search runs at one node (CPU time each), so the plan's wall time can be read against them.
``--base`` runs the same command with another commit's code (a ``git worktree`` under the system
temp directory, as bench_speed does), alternating, ``--reps`` times each, and prints the medians
and their ratio: on a shared machine the ratio is the figure to read. ``--profile`` names the
profile (default: the pinned analytical one the recorded figures use; ``default``: the plan's own
default profile).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

BREAKDOWN = r"""
import time
t0 = time.perf_counter()
import dsim.sim  # noqa: F401
from dsim.cost import load_profile
from dsim.sim import SimConfig, SpecConfig, simulate
from dsim.workload import load_workload
t1 = time.perf_counter()
prof = load_profile({profile!r})  # None: the plan's default profile
tiny = load_workload("azure-conv", n=16)
for sc in (SpecConfig("mtp"), SpecConfig("dspark", adaptive=True)):
    simulate(SimConfig(workload=tiny, profile=prof, spec=sc))
t2 = time.perf_counter()
print(f"import dsim: {t1 - t0:.2f} s; kernels + head fit (first tiny runs): {t2 - t1:.2f} s")
for seed in (0, 1, 2):
    t = time.perf_counter()
    w = load_workload("azure-conv", mix="chat=0.6,code=0.2,math=0.2", seed=seed)
    tw = time.perf_counter() - t
    for name, sc in (("MTP-1", SpecConfig("mtp")), ("DSpark adaptive", SpecConfig("dspark", adaptive=True))):
        c = time.process_time()
        s = simulate(SimConfig(workload=w, profile=prof, spec=sc)).summary
        print(f"seed {seed}: workload {tw:.2f} s; {name:16} {time.process_time() - c:6.2f} s CPU, "
              f"{s['steps']} steps")
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sla", default="p50=20ms")
    ap.add_argument("--trace", default="azure-conv")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--breakdown", action="store_true", help="where the time goes (see above)")
    ap.add_argument("--profile", default="deepseek-v4-class-h200x8", help="profile name, or 'default'")
    ap.add_argument("--base", default=None, help="a git commit to run side by side")
    ap.add_argument("--reps", type=int, default=1)
    a = ap.parse_args()
    if a.breakdown:
        name = None if a.profile == "default" else a.profile
        code = BREAKDOWN.replace("{profile!r}", repr(name))
        trees = {"this": ROOT}
        if a.base:
            from bench_speed import base_tree

            trees["base"] = base_tree(a.base)
        for rep in range(a.reps):
            for tname, tree in trees.items():
                env = dict(os.environ, PYTHONPATH=str(tree))
                env.setdefault("DSIM_TRACE_DIR", str((ROOT / ".." / "shared" / "traces").resolve()))
                r = subprocess.run([sys.executable, "-c", code], cwd=str(tree), env=env, capture_output=True,
                                   text=True, check=True)
                for line in r.stdout.splitlines():
                    print(f"rep {rep + 1} {tname:5} {line}", flush=True)
        return
    cmd = [sys.executable, "-m", "dsim", "plan", "--sla", a.sla, "--trace", a.trace]
    if a.profile != "default":
        cmd += ["--profile", a.profile]
    if a.jobs:
        cmd += ["--jobs", str(a.jobs)]
    trees = {"this": ROOT}
    if a.base:
        from bench_speed import base_tree

        trees["base"] = base_tree(a.base)
    walls: dict = {name: [] for name in trees}
    for rep in range(a.reps):
        for name, tree in trees.items():
            env = dict(os.environ, PYTHONPATH=str(tree))
            env.setdefault("DSIM_TRACE_DIR", str((ROOT / ".." / "shared" / "traces").resolve()))
            t = time.perf_counter()
            r = subprocess.run(cmd, capture_output=True, text=True, cwd=str(tree), env=env)
            dt = time.perf_counter() - t
            if r.returncode not in (0, 1):
                raise SystemExit(f"bench_plan: {tree}: exit {r.returncode}: {r.stderr.strip().splitlines()[-1:]}")
            if rep == 0 and name == "this":
                print(r.stdout)
            walls[name].append(dt)
            print(f"rep {rep + 1} {name:5} {dt:6.1f} s wall (exit code {r.returncode})", flush=True)
    shown = " ".join(cmd[3:])
    med = {name: statistics.median(v) for name, v in walls.items()}
    print(f"bench_plan: `dsim {shown}`: {med['this']:.1f} s wall (median of {a.reps}) on {os.cpu_count()} "
          f"CPU(s) (target <= 20 s)")
    if a.base:
        print(f"bench_plan: base {a.base}: {med['base']:.1f} s; this / base wall time: {med['this'] / med['base']:.2f}")

if __name__ == "__main__":
    main()
