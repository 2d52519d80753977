"""Are this tree's simulation results byte-identical to another commit's? The check behind every
speed change (docs/results/performance.md, "Results").

    python benchmarks/check_identical.py --base e6011ca             # every configuration
    python benchmarks/check_identical.py --base e6011ca --only c256  # those whose name contains c256
    python benchmarks/check_identical.py --base auto --ci            # what CI runs (.ci/run)

Each configuration runs in its own subprocess per tree (``python -m dsim``'s package of that tree
on sys.path, as bench_speed.py runs them) and prints one hash per part of the result: the summary
less its wall time, the request table, the step table, the ITL samples and the step shapes where
recorded. A configuration is identical when every part's hash is. Exit 1 on any difference, or
where this tree fails to run a configuration. A configuration on a public trace that is absent
(DSIM_TRACE_DIR, ../shared/traces) is skipped and counted as such.

``--base auto``: the merge base with origin/main (or main); where HEAD is on main itself (CI on a
clone of main), main's previous commit, HEAD~1 (a shallow clone is deepened by one commit for it);
with none of these the check is skipped, exit 0. ``--ci``: the CI_CONFIGS subset (a few minutes
on two cores), and a configuration the base cannot run (a module or an option it does not have
yet) is reported and not counted as a difference.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_speed import base_tree  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import dataclasses, hashlib, json, os
import numpy as np
from dsim.cost import load_profile
try:
    from dsim.engine.config import EngineConfig
except ImportError:  # a base commit from before the engine's modules (dsim/engine/replica.py) or the sub-packages
    try:
        from dsim.engine.replica import EngineConfig
    except ImportError:
        from dsim.engine import EngineConfig
from dsim.sim import SimConfig, SpecConfig, simulate
from dsim.workload import load_workload

def closed(trace, users, per_user):
    w = load_workload(trace, n=users * per_user)
    return dataclasses.replace(w, closed_loop_concurrency=users, arrival_s=np.zeros(len(w.arrival_s)))

cfg = {cfg}
res = simulate(cfg)
def h(x):
    return hashlib.sha256(x).hexdigest()[:16]
summ = {{k: v for k, v in res.summary.items() if "wall" not in k}}
# (a trace of the tree itself, traces/default.jsonl, is named by its path: the tree's own folder)
out = dict(summary=h(json.dumps(summ, sort_keys=True, default=str).replace(os.getcwd(), "TREE").encode()),
           requests=h(res.requests.to_csv().encode()))
if cfg.keep_steps:
    out["steps"] = h(res.steps.to_csv().encode())
if res.itl is not None:
    out["itl"] = h(b"".join(np.ascontiguousarray(a).tobytes() for a in res.itl))
if res.shapes is not None:
    out["shapes"] = h(repr(res.shapes).encode())
out["preemptions"] = int(res.summary.get("preemptions", 0))
print(json.dumps(out))
"""

V4 = 'load_profile("deepseek-v4-class-h200x8")'
DEF = "load_profile(None)"
Q8 = 'load_profile("profiles/h200/h200-qwen3-8b.yaml")'
CONFIGS = {
    "c256-none": f"SimConfig(workload=closed('azure-conv', 256, 20), profile={V4})",
    "c256-mtp": f"SimConfig(workload=closed('azure-conv', 256, 20), profile={V4}, spec=SpecConfig('mtp'))",
    "c256-dspark": f"SimConfig(workload=closed('azure-conv', 256, 20), profile={V4}, "
    "spec=SpecConfig('dspark', adaptive=True))",
    "c64-eagle3-cap-accept": f"SimConfig(workload=closed('azure-conv', 64, 20), profile={V4}, "
    "spec=SpecConfig('eagle3', verify_mode='cap-accept'))",
    "c128-block": f"SimConfig(workload=closed('azure-conv', 128, 10), profile={V4}, spec=SpecConfig('block'))",
    "c128-dspark-paper-production": f"SimConfig(workload=closed('azure-conv', 128, 10), profile={V4}, "
    "spec=SpecConfig('dspark', adaptive=True, policy='paper-production'))",
    "c128-dspark-threshold-static": f"SimConfig(workload=closed('azure-conv', 128, 10), profile={V4}, "
    "spec=SpecConfig('dspark', adaptive=True, policy='threshold', verify_mode='static'))",
    "c512-none-async": f"SimConfig(workload=closed('azure-conv', 512, 6), profile={V4}, "
    "engine=EngineConfig(async_scheduling=True))",
    "open-default-mtp-2nodes": f"SimConfig(workload=load_workload('azure-conv', n=2500), profile={DEF}, "
    "nodes=2, spec=SpecConfig('mtp'))",
    "open-default-dspark": f"SimConfig(workload=load_workload('azure-conv', n=2500), profile={DEF}, "
    "spec=SpecConfig('dspark', adaptive=True))",
    "open-qwen3-8b-chunked-shapes": f"SimConfig(workload=load_workload('azure-conv', n=1500), profile={Q8}, "
    "gpus_per_node=1, spec=SpecConfig('mtp'), engine=EngineConfig(long_prefill_token_threshold=512, "
    "max_num_batched_tokens=2048, record_shapes=True))",
    "open-qwen3-8b-prefix": f"SimConfig(workload=load_workload('mooncake-conversation', n=800), profile={Q8}, "
    "gpus_per_node=1, spec=SpecConfig('dspark', adaptive=True), engine=EngineConfig(enable_prefix_caching=True))",
    "c256-none-no-steps": f"SimConfig(workload=closed('azure-conv', 256, 10), profile={V4}, keep_steps=False)",
    "c128-dspark-paper-sglang-fixed": None,  # (expanded below: one configuration a policy)
    "c256-none-budget-cut": f"SimConfig(workload=closed('azure-conv', 256, 8), profile={V4}, "
    "engine=EngineConfig(max_num_batched_tokens=384))",
    "c64-mtp-front-end-gaps": f"SimConfig(workload=closed('azure-conv', 64, 10), profile={V4}, "
    "spec=SpecConfig('mtp'), closed_loop_gap_ms=3.0, closed_loop_send_gap_ms=0.5)",
    "open-default-disaggregated-decode": f"SimConfig(workload=load_workload('azure-conv', n=2000), profile={DEF}, "
    "spec=SpecConfig('mtp'), engine=EngineConfig(kv_role='kv_consumer', remote_prefill_ms=20.0))",
    "open-qwen3-8b-prefix-none-2nodes": f"SimConfig(workload=load_workload('mooncake-conversation', n=800), "
    f"profile={Q8}, gpus_per_node=1, nodes=2, router='affinity', engine=EngineConfig(enable_prefix_caching=True))",
    # KV caches small enough to preempt
    "c256-none-preempt": f"SimConfig(workload=closed('azure-conv', 256, 8), "
    f"profile=dataclasses.replace({V4}, kv_cache_gib=3.0))",
    "c256-dspark-preempt": f"SimConfig(workload=closed('azure-conv', 256, 8), "
    f"profile=dataclasses.replace({V4}, kv_cache_gib=3.0), spec=SpecConfig('dspark', adaptive=True))",
    "c64-qwen3-8b-mtp-chunked-preempt": f"SimConfig(workload=closed('azure-conv', 64, 10), "
    f"profile=dataclasses.replace({Q8}, kv_cache_gib=0.6), gpus_per_node=1, spec=SpecConfig('mtp'), "
    "engine=EngineConfig(long_prefill_token_threshold=512))",
}


for _policy in ("paper", "sglang", "fixed"):
    CONFIGS[f"c128-dspark-{_policy}"] = (
        f"SimConfig(workload=closed('azure-conv', 128, 10), profile={V4}, "
        f"spec=SpecConfig('dspark', adaptive=True, policy='{_policy}'))"
    )
del CONFIGS["c128-dspark-paper-sglang-fixed"]
# dsim's embedded default trace (traces/default.jsonl): compared where the public traces are absent
CONFIGS["default-trace-mtp"] = f"SimConfig(workload=load_workload('default'), profile={DEF}, spec=SpecConfig('mtp'))"
CONFIGS["default-trace-dspark-closed"] = (
    f"SimConfig(workload=closed('default', 64, 8), profile={V4}, spec=SpecConfig('dspark', adaptive=True))"
)

# --ci: one configuration per step path and method family, and the default trace's (a few
# minutes on two cores, the base tree's kernel compile included)
CI_CONFIGS = (
    "c256-none",
    "c256-mtp",
    "c256-dspark",
    "c64-eagle3-cap-accept",
    "c128-block",
    "c512-none-async",
    "open-qwen3-8b-chunked-shapes",
    "open-qwen3-8b-prefix",
    "c256-dspark-preempt",
    "default-trace-mtp",
    "default-trace-dspark-closed",
)
# dsim.workload.resolve_trace's message for a public trace that is not there
TRACE_ABSENT = re.compile(r"trace '[^']+' not found")


def run(tree: Path, cfg: str) -> str:
    code = CHILD.format(cfg=cfg)
    env = dict(os.environ, PYTHONPATH=str(tree))
    env.setdefault("DSIM_TRACE_DIR", str((ROOT / ".." / "shared" / "traces").resolve()))
    # (in the tree's own directory: `python -c` puts the working directory first on sys.path, so
    # from ROOT every tree would import ROOT's dsim)
    r = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, env=env)
    if r.returncode:
        return "error: " + (r.stderr.strip().splitlines() or ["?"])[-1]
    return r.stdout.strip().splitlines()[-1]


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def commit_of(ref: str) -> str | None:
    r = git("rev-parse", "--verify", "-q", ref + "^{commit}")
    return r.stdout.strip() if r.returncode == 0 else None


def auto_base() -> tuple[str | None, str]:
    """The commit ``--base auto`` compares with, and why (None: no base in this clone)."""
    head = commit_of("HEAD")
    for ref in ("origin/main", "main"):
        if commit_of(ref):
            mb = git("merge-base", "HEAD", ref).stdout.strip()
            if mb and mb != head:
                return mb, f"the merge base of HEAD and {ref}"
            if mb == head:
                break  # HEAD is on main: main's previous commit
    if commit_of("HEAD~1") is None and git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        try:  # a shallow clone (CI's default depth 1): one more commit of history
            subprocess.run(["git", "-C", str(ROOT), "fetch", "-q", "--deepen=1"], capture_output=True, timeout=120)
        except subprocess.TimeoutExpired:
            pass
    prev = commit_of("HEAD~1")
    if prev:
        return prev, "HEAD~1 (HEAD is on main, or no main to branch from)"
    return None, "no commit before HEAD in this clone"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="commit to compare with, or auto (see above)")
    ap.add_argument("--only", default="", help="run the configurations whose name contains this")
    ap.add_argument("--ci", action="store_true", help="the CI subset; the base's own errors are not differences")
    a = ap.parse_args()
    commit, why = (a.base, "given") if a.base != "auto" else auto_base()
    if commit is None:
        print(f"check_identical: skipped: {why}")
        return 0
    print(f"check_identical: this tree vs {commit[:12]} ({why})", flush=True)
    base = base_tree(commit)
    counts = {"same": 0, "DIFFERENT": 0, "skipped": 0}
    t0 = time.monotonic()
    for name, cfg in CONFIGS.items():
        if (a.only and a.only not in name) or (a.ci and name not in CI_CONFIGS):
            continue
        this = run(ROOT, cfg)
        if this.startswith("error") and TRACE_ABSENT.search(this):
            verdict, note = "skipped", f"  ({this[len('error: ') :]})"
        else:
            other = run(base, cfg)
            if this == other and not this.startswith("error"):
                verdict, note = "same", ""
            elif a.ci and other.startswith("error") and not this.startswith("error"):
                verdict, note = "skipped", f"  (the base cannot run it: {other[len('error: ') :]})"
            else:
                verdict, note = "DIFFERENT", f"\n  this {this}\n  base {other}"
        counts[verdict] += 1
        print(f"{verdict:9s} {name}{note}", flush=True)
    print(", ".join(f"{n} {k}" for k, n in counts.items()) + f" in {time.monotonic() - t0:.0f} s")
    return 1 if counts["DIFFERENT"] else 0


if __name__ == "__main__":
    sys.exit(main())
