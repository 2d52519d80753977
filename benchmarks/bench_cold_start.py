"""Cold start of the quick-start plan: `dsim plan --sla p50=20ms` on an empty numba cache (a first
run ever: every kernel compiled), then once more on the cache it filled (a later run).

    python benchmarks/bench_cold_start.py                      # this tree, one cold + one warm run
    python benchmarks/bench_cold_start.py --base main --reps 2  # side by side with another commit

Target (docs/results/performance.md): the cold run <= 60 s wall on a 2-core machine. Each run is one
subprocess with NUMBA_CACHE_DIR pointing at a fresh empty directory (numba then neither reads nor
writes the checkout's dsim/__pycache__); printed are its wall time, the CPU time of the plan and
its workers (user + sys), its peak RSS (the largest of the process and its workers,
os.wait4's ru_maxrss), the load average when it started, how many lines it wrote to stderr
(the compile announcement) and a hash of its JSON output less the trace's path (the trees must
print the same plan). A kernel still compiling in a background process when the command ends
(dsim.engine.background_compile) is waited for before the next run, and how long after the command it
ended is printed; its CPU time and memory are not in the figures. ``--base`` runs another
commit (a ``git worktree`` under the system temp directory, as bench_speed does) or checkout,
alternating with this tree ``--reps`` times: on a shared machine read the ratios of pairs, not
the absolute figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_plan import checkout  # noqa: E402


def run(tree: Path, args: list[str], cache: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), NUMBA_CACHE_DIR=str(cache))
    load = os.getloadavg()[0]
    t = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen([sys.executable, "-m", "dsim", *args], cwd=str(tree), env=env, stdout=out, stderr=err)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if p.returncode not in (0, 1):
        raise SystemExit(f"bench_cold_start: {tree}: exit {p.returncode}: {stderr.strip().splitlines()[-1:]}")
    text = json.dumps(json.loads(stdout), sort_keys=True).replace(str(tree), "TREE")
    return {
        "wall_s": wall,
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "rss_gb": ru.ru_maxrss / 2**20,  # (KiB on Linux)
        "load": load,
        "stderr_lines": len(stderr.splitlines()),
        "hash": hashlib.sha256(text.encode()).hexdigest()[:12],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sla", default="p50=20ms")
    ap.add_argument("--base", default=None, help="a git commit or a checkout to run side by side")
    ap.add_argument("--reps", type=int, default=1)
    a = ap.parse_args()
    args = ["plan", "--sla", a.sla, "--json"]
    trees = {"this": ROOT}
    if a.base:
        trees["base"] = checkout(a.base)
    runs: dict = {name: [] for name in trees}
    for rep in range(a.reps):
        for name, tree in trees.items():
            cache = Path(tempfile.mkdtemp(prefix="dsim-numba-cache-"))
            try:
                for state in ("cold", "warm"):
                    r = run(tree, args, cache)
                    runs[name].append((state, r))
                    # a kernel compiling in a background process after the command ended
                    # (dsim.engine.background_compile): its CPU time is not in the figures; waited for
                    t = time.perf_counter()
                    while list(cache.rglob("*.compiling")) and time.perf_counter() - t < 600:
                        time.sleep(0.5)
                    after = time.perf_counter() - t
                    print(
                        f"rep {rep + 1} {name:5} {state}: {r['wall_s']:6.1f} s wall, {r['cpu_s']:6.1f} s CPU, "
                        f"peak RSS {r['rss_gb']:.2f} GB, load {r['load']:.1f}, {r['stderr_lines']} stderr lines, "
                        f"plan {r['hash']}"
                        + (f"; background compile ended {after:.1f} s later" if after > 0.5 else ""),
                        flush=True,
                    )
            finally:
                shutil.rmtree(cache, ignore_errors=True)
    shown = " ".join(args)
    for state in ("cold", "warm"):
        med = {
            name: {k: statistics.median(r[k] for s, r in v if s == state) for k in ("wall_s", "cpu_s", "rss_gb")}
            for name, v in runs.items()
        }
        for name, m in med.items():
            print(
                f"bench_cold_start: `dsim {shown}` {state} ({name}), {os.cpu_count()} CPU(s), medians of {a.reps}: "
                f"{m['wall_s']:.1f} s wall, {m['cpu_s']:.1f} s CPU, peak RSS {m['rss_gb']:.2f} GB"
                + (" (target <= 60 s wall)" if state == "cold" and name == "this" else "")
            )
        if a.base:
            for k in ("wall_s", "cpu_s", "rss_gb"):
                pairs = [x[k] / y[k] for (s, x), (_, y) in zip(runs["this"], runs["base"]) if s == state]
                print(
                    f"bench_cold_start: {state} this / base {k[:-2]:6}: per pair "
                    f"{', '.join(f'{q:.2f}' for q in pairs)}; median {statistics.median(pairs):.2f}"
                )
    same = {r["hash"] for v in runs.values() for _, r in v}
    print(f"bench_cold_start: plans {'identical' if len(same) == 1 else 'DIFFER: ' + ', '.join(sorted(same))}")


if __name__ == "__main__":
    main()
