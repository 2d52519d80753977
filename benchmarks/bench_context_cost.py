"""What the per-request attention terms cost the engine: CPU microseconds per engine step of
`dsim simulate` on one H200 replica, side by side in one run (per step: the two profiles' steps
differ in length, so their simulated spans differ too):

- this tree with a format-1 profile (no attention terms: one flag test per step) against another
  commit's code with the same profile (--base, e.g. the commit before the terms);
- this tree with the format-2 profile (the terms priced on every step) against the same tree with
  the same profile less its attention section (format 1).

    python benchmarks/bench_context_cost.py --base 7c6f020 [--reps 3] [--concurrency 64]

Each (tree, profile) runs in its own subprocess, alternating, --reps times: a tiny warm-up
simulation, then one timed run (time.process_time). Workload: Mooncake conversation requests,
prefix caching, DSpark adaptive, closed loop. Printed: medians and the ratios.
(The format-2 run's steps cost more, so its steps and their mix differ from format 1's a little.)
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

import yaml

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import dataclasses, json, time
import numpy as np
from dsim.cost import load_profile
from dsim.engine.config import EngineConfig
from dsim.sim import SimConfig, SpecConfig, simulate
from dsim.workload import load_workload
prof = load_profile({profile!r})
eng = dataclasses.replace(EngineConfig(), enable_prefix_caching=True)
spec = SpecConfig("dspark", adaptive=True)
def run(n, C):
    w = load_workload("mooncake-conversation", n=n)
    w = dataclasses.replace(w, closed_loop_concurrency=C, arrival_s=np.zeros(len(w.arrival_s)))
    return simulate(SimConfig(workload=w, profile=prof, spec=spec, engine=eng, gpus_per_node=1))
run(8, 4)
t = time.process_time()
s = run({n}, {C}).summary
cpu = time.process_time() - t
print(json.dumps({{"sim_s": s["sim_time_s"], "cpu_s": cpu, "steps": s["steps"], "us_per_step": cpu / s["steps"] * 1e6}}))
"""


def child(tree: Path, profile: str, n: int, C: int) -> dict:
    code = CHILD.format(profile=profile, n=n, C=C)
    env = dict(os.environ, DSIM_TRACE_DIR=os.environ.get("DSIM_TRACE_DIR", str(ROOT.parent / "shared" / "traces")))
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, env=env)
    if out.returncode:
        raise RuntimeError(f"{tree}: {out.stderr.strip()[-600:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="commit to compare with (checked out under the temp dir)")
    ap.add_argument("--profile", default=str(ROOT / "profiles" / "h200" / "h200-llama-3.1-8b.yaml"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--requests", type=int, default=320)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as td:
        base = Path(td) / "base"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(base), a.base], cwd=ROOT, check=True, capture_output=True
        )
        try:
            d = yaml.safe_load(Path(a.profile).read_text())
            v1 = Path(td) / "format1.yaml"
            d1 = {k: v for k, v in d.items() if k not in ("format_version", "attention")}
            v1.write_text(yaml.safe_dump(d1, sort_keys=False))
            runs = {
                "base, format 1": (base, str(v1)),
                "tree, format 1": (ROOT, str(v1)),
                "tree, format 2": (ROOT, a.profile),
            }
            if "attention" not in d:
                runs.pop("tree, format 2")
            res: dict[str, list] = {k: [] for k in runs}
            for _ in range(a.reps):
                for k, (tree, prof) in runs.items():
                    r = child(tree, prof, a.requests, a.concurrency)
                    res[k].append(r["us_per_step"])
                    print(f"  {k}: {r['us_per_step']:.1f} CPU us per step ({r['steps']} steps)", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    print(json.dumps({"median_cpu_us_per_step": med}, indent=1))
    print(f"CPU per step, tree / base (format 1): {med['tree, format 1'] / med['base, format 1']:.3f}")
    if "tree, format 2" in med:
        print(f"CPU per step, format 2 / format 1 (tree): {med['tree, format 2'] / med['tree, format 1']:.3f}")


if __name__ == "__main__":
    main()
