"""Wall time of `dsim plan` for two methods (MTP-1, DSpark adaptive) on the full Azure conv trace.

Usage: python benchmarks/bench_plan.py [--sla p50=20ms] [--jobs N] [--profile]
Target: <= 60 s on a 2-core machine. --profile runs the plan with jobs=1 under cProfile and
prints the top functions by cumulative and by own time (where the engine spends it).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sla", default="p50=20ms")
    ap.add_argument("--trace", default="azure-conv")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--profile", action="store_true", help="cProfile a jobs=1 run instead")
    a = ap.parse_args()
    if a.profile:
        import cProfile
        import pstats
        from dsim.scenario import build_workload
        from dsim.cost import load_profile
        from dsim.plan import parse_sla, plan
        from dsim.plan_cli import parse_methods
        wls = {s: build_workload(a.trace, seed=s) for s in (0, 1, 2)}
        pr = cProfile.Profile()
        pr.enable()
        plan(wls, load_profile(None), parse_methods("mtp,dspark"), parse_sla(a.sla), jobs=1)
        pr.disable()
        st = pstats.Stats(pr)
        st.sort_stats("cumulative").print_stats(25)
        st.sort_stats("tottime").print_stats(25)
        return
    cmd = ["dsim", "plan", "--sla", a.sla, "--trace", a.trace]
    if a.jobs:
        cmd += ["--jobs", str(a.jobs)]
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t
    print(r.stdout)
    if r.returncode not in (0, 1):
        print(r.stderr, file=sys.stderr)
    print(f"bench_plan: `{' '.join(cmd)}` took {dt:.1f} s wall on {os.cpu_count()} CPU(s) "
          f"(target <= 60 s); exit code {r.returncode}")


if __name__ == "__main__":
    main()
