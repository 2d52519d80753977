"""Simulated seconds per wall-clock second, one 8-GPU node, closed loop, Azure conv lengths.

    python benchmarks/bench_speed.py [--requests-per-user 40]
    python benchmarks/bench_speed.py --ratio      # concurrency 256: dspark / none, CPU time, 3 pairs
    python benchmarks/bench_speed.py --floor      # concurrency 256: none, dspark, dspark floor

Runs the configurations side by side in one process (this machine is shared and noisy: compare
the ratios, not the absolute figures across runs). Targets: >= 1000x real time at
concurrency 256 with no speculation; dspark adaptive no worse than half of that.

Each figure is a run's steady speed: a tiny run of every configuration first pays the one-time
setup of a process (the confidence head's fit and the acceptance model's shifts, about 0.1 s,
cached for every later run of the process, as in a plan or sweep); that setup is printed apart.

--ratio: three interleaved (none, dspark adaptive) pairs at concurrency 256 timed with CPU time
(time.process_time, less sensitive to other jobs on the machine than wall time), and the median.

--floor: the engine's own share of a DSpark step. The same DSpark run with the acceptance draws
and the verify-budget policy's answer replaced by cached arrays (one per batch size), so what is
timed is scheduling, KV accounting, commit, completions and arrivals; CPU time (process_time),
three interleaved repetitions. (The cached draws change the run's dynamics a little: compare
the x-real-time figures, not the step counts.)
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


def closed_loop(C, per_user):
    w = load_workload("azure-conv", n=C * per_user)
    return dataclasses.replace(w, closed_loop_concurrency=C, arrival_s=np.zeros(len(w.arrival_s)))


def cpu_speed(w, prof, spec):
    """(x real time in CPU time, steps, simulated s) of one run."""
    t = time.process_time()
    s = simulate(SimConfig(workload=w, profile=prof, spec=spec)).summary
    return s["sim_time_s"] / (time.process_time() - t), s["steps"], s["sim_time_s"]


def one(C, spec, per_user, prof):
    w = closed_loop(C, per_user)
    t = time.perf_counter()
    s = simulate(SimConfig(workload=w, profile=prof, spec=spec)).summary
    wall = time.perf_counter() - t
    return {"concurrency": C, "method": spec.method + ("-adaptive" if spec.adaptive else ""),
            "sim_s": s["sim_time_s"], "wall_s": round(wall, 2), "x_real_time": round(s["sim_time_s"] / wall, 1),
            "steps": s["steps"], "us_per_step": round(wall / s["steps"] * 1e6, 1)}


def warm_up(prof) -> float:
    """One tiny run of every configuration: the process's one-time setup. Returns its seconds."""
    w = load_workload("azure-conv", n=16)
    t = time.perf_counter()
    for spec in (SpecConfig(), SpecConfig("mtp"), SpecConfig("dspark", adaptive=True)):
        simulate(SimConfig(workload=w, profile=prof, spec=spec))
    return time.perf_counter() - t


def ratio(per_user, prof, reps=3):
    w = closed_loop(256, per_user)
    rs = []
    for _ in range(reps):
        a = cpu_speed(w, prof, SpecConfig())[0]
        b, steps, sim_s = cpu_speed(w, prof, SpecConfig("dspark", adaptive=True))
        rs.append(b / a)
        print(f"C=256 x real time (CPU): none {a:7.1f}  dspark {b:6.1f} ({sim_s / b / steps * 1e6:.0f} us/step)"
              f"  ratio {b / a:.3f}", flush=True)
    print(f"median ratio {float(np.median(rs)):.3f}")


def floor(per_user, prof, reps=3):
    from dsim import policy as P
    from dsim import spec as S
    w = closed_loop(256, per_user)

    def run(spec):
        return cpu_speed(w, prof, spec)[0]

    orig_sample, orig_one = S.AcceptanceModel.sample_slots, P.VllmPolicy.one_step
    draws, wins = {}, {}

    def cached_sample(self, st, off, steps):
        key = (off.shape[1], steps)
        if key not in draws:
            draws[key] = orig_sample(self, st, off, steps)
        return draws[key]

    def cached_one_step(self, now, prev, *args, **kw):
        if now.shape[0] not in wins:
            wins[now.shape[0]] = orig_one(self, now, prev, *args, **kw)
        return wins[now.shape[0]]

    for _ in range(reps):
        none, dspark = run(SpecConfig()), run(SpecConfig("dspark", adaptive=True))
        S.AcceptanceModel.sample_slots, P.VllmPolicy.one_step = cached_sample, cached_one_step
        try:
            fl = run(SpecConfig("dspark", adaptive=True))
        finally:
            S.AcceptanceModel.sample_slots, P.VllmPolicy.one_step = orig_sample, orig_one
        print(f"C=256 x real time (CPU): none {none:7.1f}  dspark {dspark:6.1f} ({dspark / none:.3f})  "
              f"dspark engine floor {fl:6.1f} ({fl / none:.3f})", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests-per-user", type=int, default=40)
    ap.add_argument("--floor", action="store_true", help="the engine-only floor of a DSpark run (see above)")
    ap.add_argument("--ratio", action="store_true", help="dspark / none at 256, CPU time, 3 pairs (see above)")
    a = ap.parse_args()
    prof = load_profile()
    print(f"one-time setup of this process (head fit, acceptance shifts): {warm_up(prof):.2f} s", flush=True)
    if a.floor:
        return floor(a.requests_per_user, prof)
    if a.ratio:
        return ratio(a.requests_per_user, prof)
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
