"""Wall time of `dsim plan` (MTP-1 and DSpark adaptive, full-hour Azure conv, seeds 0-2) and where
the time goes.

    python benchmarks/bench_plan.py [--sla p50=20ms] [--jobs N]
    python benchmarks/bench_plan.py --breakdown     # process start, kernels, workload, each simulation

Target (docs/performance.md): <= 20 s wall on a 2-core machine. --breakdown times, in one fresh
process: importing dsim, the first use of the compiled kernels (loaded from numba's on-disk cache;
compiled on a first run ever), loading the workload of each seed, and the six simulations the
plan's search runs at one node (CPU time each), so the plan's wall time can be read against them.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

BREAKDOWN = r"""
import time
t0 = time.perf_counter()
import dsim.sim  # noqa: F401
from dsim.cost import load_profile
from dsim.sim import SimConfig, SpecConfig, simulate
from dsim.workload import load_workload
t1 = time.perf_counter()
prof = load_profile("deepseek-v4-class-h200x8")  # the profile docs/performance.md figures use
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
    a = ap.parse_args()
    if a.breakdown:
        subprocess.run([sys.executable, "-c", BREAKDOWN], check=True)
        return
    cmd = [sys.executable, "-m", "dsim", "plan", "--sla", a.sla, "--trace", a.trace, "--profile", "deepseek-v4-class-h200x8"]
    if a.jobs:
        cmd += ["--jobs", str(a.jobs)]
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t
    print(r.stdout)
    if r.returncode not in (0, 1):
        print(r.stderr, file=sys.stderr)
    print(f"bench_plan: `dsim plan --sla {a.sla} --trace {a.trace}` took {dt:.1f} s wall on {os.cpu_count()} "
          f"CPU(s) (target <= 20 s); exit code {r.returncode}")


if __name__ == "__main__":
    main()
