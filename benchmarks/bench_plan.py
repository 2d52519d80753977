"""Wall time of `dsim plan` (MTP-1 and DSpark adaptive, full-hour Azure conv, seeds 0-2) and where
the time goes.

    python benchmarks/bench_plan.py [--sla p50=20ms] [--jobs N]
    python benchmarks/bench_plan.py --base 7c6f020 --reps 3   # side by side with another commit
    python benchmarks/bench_plan.py --base /path/to/checkout  # ... or another checkout
    python benchmarks/bench_plan.py --profile default          # the plan's default profile
    python benchmarks/bench_plan.py --breakdown [--profile default]  # process start, kernels, workload, each simulation

Target (docs/results/performance.md): <= 20 s wall on a 2-core machine. Each run is one `dsim plan
--json` subprocess: printed are its wall time, the CPU time of the plan and its workers (user +
sys, resource.RUSAGE_CHILDREN), the critical path and a hash of its JSON output (less the trace's
path, which names the checkout's directory): the trees must print the same plan. The critical
path is the CPU time of the main process plus that of its busiest worker (each simulation is
timed inside its worker): the wall time on an otherwise idle machine, read off a shared one,
where the wall time is set by the other jobs. --breakdown times, in one fresh process: importing
dsim, the first use of the compiled kernels (loaded from numba's on-disk cache; compiled on a
first run ever), loading the workload of each seed, and the six simulations the plan's search
runs at one node (CPU time each), so the plan's wall time can be read against them.
``--base`` runs the same command with another commit's code (a ``git worktree`` under the system
temp directory, as bench_speed does) or with the checkout at a path, alternating, ``--reps``
times each, and prints the medians and their ratios: on a shared machine the ratio is the figure
to read. ``--profile`` names the profile (default: the pinned analytical one the recorded
figures use; ``default``: the plan's own default profile).
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
                r = subprocess.run(
                    [sys.executable, "-c", code], cwd=str(tree), env=env, capture_output=True, text=True, check=True
                )
                for line in r.stdout.splitlines():
                    print(f"rep {rep + 1} {tname:5} {line}", flush=True)
        return
    args = ["plan", "--sla", a.sla, "--trace", a.trace, "--json"]
    if a.profile != "default":
        args += ["--profile", a.profile]
    if a.jobs:
        args += ["--jobs", str(a.jobs)]
    trees = {"this": ROOT}
    if a.base:
        trees["base"] = checkout(a.base)
    runs: dict = {name: [] for name in trees}
    for rep in range(a.reps):
        for name, tree in trees.items():
            r = run_plan(tree, args)
            runs[name].append(r)
            print(
                f"rep {rep + 1} {name:5} {r['wall_s']:6.1f} s wall, {r['cpu_s']:5.1f} s CPU, critical path "
                f"{r['critical_s']:5.1f} s, load {r['load']:.1f}, plan {r['hash']} (exit {r['rc']})",
                flush=True,
            )
    shown = " ".join(args)
    med = {
        name: {k: statistics.median(x[k] for x in v) for k in ("wall_s", "cpu_s", "critical_s")}
        for name, v in runs.items()
    }
    m = med["this"]
    print(
        f"bench_plan: `dsim {shown}` on {os.cpu_count()} CPU(s), medians of {a.reps}: {m['wall_s']:.1f} s wall, "
        f"{m['cpu_s']:.1f} s CPU, critical path {m['critical_s']:.1f} s (target <= 20 s wall)"
    )
    if a.base:
        b = med["base"]
        print(
            f"bench_plan: base {a.base}: {b['wall_s']:.1f} s wall, {b['cpu_s']:.1f} s CPU, critical path "
            f"{b['critical_s']:.1f} s"
        )
        for k in ("wall_s", "cpu_s", "critical_s"):
            pairs = [x[k] / y[k] for x, y in zip(runs["this"], runs["base"])]
            print(
                f"bench_plan: this / base {k[:-2]:8}: per pair {', '.join(f'{q:.2f}' for q in pairs)}; "
                f"median {statistics.median(pairs):.2f}"
            )
        same = {x["hash"] for v in runs.values() for x in v}
        print(f"bench_plan: plans {'identical' if len(same) == 1 else 'DIFFER: ' + ', '.join(sorted(same))}")


# Runs `dsim plan` with each simulation timed in its worker (forked: the wrapper is inherited):
# the worker's process CPU time when its simulation ends, printed to stderr.
TIMED = r"""
import os, sys, time
import dsim.study.capacity as P
orig = P.run_point
def run_point(p, slos=(), keep=()):
    r = orig(p, slos, keep)
    sys.stderr.write(f"@sim {os.getpid()} {time.process_time():.3f}\n")
    return r
run_point.__module__, run_point.__qualname__ = "dsim.study.capacity", "run_point"
P.run_point = run_point
from dsim.cli.entry import main
sys.argv = ["dsim"] + sys.argv[1:]
try:
    main()
finally:
    sys.stderr.write(f"@main {time.process_time():.3f}\n")
"""


def checkout(base: str) -> Path:
    """A directory: that checkout; else a commit, checked out once (bench_speed.base_tree)."""
    if Path(base, "dsim").is_dir():
        return Path(base).resolve()
    from bench_speed import base_tree

    return base_tree(base)


def run_plan(tree: Path, args: list) -> dict:
    import hashlib
    import json
    import resource

    env = dict(os.environ, PYTHONPATH=str(tree))
    traces = (ROOT / ".." / "shared" / "traces").resolve()
    env.setdefault("DSIM_TRACE_DIR", str(traces))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", TIMED, *args], capture_output=True, text=True, cwd=str(tree), env=env)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode not in (0, 1):
        raise SystemExit(f"bench_plan: {tree}: exit {r.returncode}: {r.stderr.strip().splitlines()[-1:]}")
    worker: dict = {}
    main_cpu = 0.0
    for line in r.stderr.splitlines():
        f = line.split()
        if f and f[0] == "@sim":
            worker[f[1]] = max(worker.get(f[1], 0.0), float(f[2]))
        elif f and f[0] == "@main":
            main_cpu = float(f[1])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    out = json.loads(r.stdout)
    text = json.dumps(out, sort_keys=True).replace(str(traces) + "/", "")
    for d in {str(tree / ".." / "shared" / "traces"), str(Path(tree).parent / "shared" / "traces")}:
        text = text.replace(d + "/", "")
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "critical_s": main_cpu + max(worker.values(), default=0.0),
        "load": load,
        "rc": r.returncode,
        "hash": hashlib.sha256(text.encode()).hexdigest()[:12],
    }


if __name__ == "__main__":
    main()
