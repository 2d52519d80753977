"""Simulated seconds per wall-clock second, one 8-GPU node, closed loop, Azure conv lengths.

    python benchmarks/bench_speed.py [--requests-per-user 40]

Runs the configurations side by side in one process (this machine is shared and noisy: compare
the ratios, not the absolute figures across runs). Issue targets: >= 1000x real time at
concurrency 256 with no speculation; dspark adaptive no worse than half of that.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np

from dsim.cost import load_profile
from dsim.sim import SimConfig, SpecConfig, simulate
from dsim.workload import load_workload


def one(C, spec, per_user, prof):
    w = load_workload("azure-conv", n=C * per_user)
    w = dataclasses.replace(w, closed_loop_concurrency=C, arrival_s=np.zeros(len(w.arrival_s)))
    t = time.perf_counter()
    s = simulate(SimConfig(workload=w, profile=prof, spec=spec)).summary
    wall = time.perf_counter() - t
    return {"concurrency": C, "method": spec.method + ("-adaptive" if spec.adaptive else ""),
            "sim_s": s["sim_time_s"], "wall_s": round(wall, 2), "x_real_time": round(s["sim_time_s"] / wall, 1),
            "steps": s["steps"], "us_per_step": round(wall / s["steps"] * 1e6, 1)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests-per-user", type=int, default=40)
    a = ap.parse_args()
    prof = load_profile()
    rows = []
    for C in (64, 256):
        for spec in (SpecConfig(), SpecConfig("mtp"), SpecConfig("dspark", adaptive=True)):
            rows.append(one(C, spec, a.requests_per_user, prof))
            print(json.dumps(rows[-1]), flush=True)
    print(f"{'C':>4} {'method':16} {'sim s':>8} {'wall s':>7} {'x real':>7} {'us/step':>8}")
    for r in rows:
        print(f"{r['concurrency']:>4} {r['method']:16} {r['sim_s']:8.1f} {r['wall_s']:7.2f} {r['x_real_time']:7.1f} {r['us_per_step']:8.1f}")


if __name__ == "__main__":
    main()
