"""Step logs of workloads the H200 profiles are checked on but not fitted to, for the GPU replay.

    python3 validator/gpu/scripts/make_heldout_steplogs.py [--models M ...] [--cases C ...] [--out DIR]
    python3 validator/gpu/scripts/make_heldout_steplogs.py --seed 1 --later --cases all --out archive/h200/steplogs-s1

Each case is one `dsim simulate` run (one GPU per replica, seed 0) whose steady-state steps (running
at least 0.9 of the largest batch, past the first eighth) are sampled evenly (see sample_steady):

- mooncake-c16 / mooncake-c96: Mooncake's conversation trace (contexts up to ~122K tokens) with
  prefix caching, DSpark adaptive, closed loop at 16 / 96 users: long, unequal decode contexts and
  prefill chunks over long cached prefixes;
- azure-conv-c64: Azure LLM inference conversation trace, DSpark, 64 users (azure-conv-c32 /
  azure-conv-c128: the same at 32 / 128 users, made after the step model's request-count terms, to
  check them on logs never looked at);
- azure-code-c8: Azure code trace, no drafter, 8 users;
- default-c1 / c32 / c256: the default mixed trace, DSpark (as benchmarks/make_replay_steplogs.py).

--seed N --later: a second checking set from the same cases on other requests: seed N (DSpark's
acceptance draws, so other step compositions) and each case's later slice of its trace (the
second half of the Azure and Mooncake hours; the default trace from 24 s for c32, from 48 s for c1,
all of it for c256, whose 256 users need most of its 600 requests to reach a steady state).

The profile dsim schedules with is the model's shipped H200 profile (``h200-{model}``), or --profile.
Files: DIR/{case}-{model}.jsonl, one step per line (q, ctx per request; predicted_ms: dsim's cost).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
CASES: dict[str, dict[str, Any]] = {
    "mooncake-c16": dict(
        trace="mooncake-conversation", c=16, method="dspark", requests=160, prefix=True, pool=16, keep=12
    ),
    "mooncake-c96": dict(
        trace="mooncake-conversation", c=96, method="dspark", requests=320, prefix=True, pool=16, keep=12
    ),
    "azure-conv-c64": dict(trace="azure-conv", c=64, method="dspark", requests=320, prefix=False, pool=12, keep=10),
    "azure-conv-c32": dict(trace="azure-conv", c=32, method="dspark", requests=192, prefix=False, pool=12, keep=10),
    "azure-conv-c128": dict(trace="azure-conv", c=128, method="dspark", requests=512, prefix=False, pool=12, keep=10),
    "azure-code-c8": dict(trace="azure-code", c=8, method="none", requests=64, prefix=False, pool=12, keep=10),
    "default-c1": dict(trace="default", c=1, method="dspark", requests=40, prefix=False, pool=12, keep=12),
    "default-c32": dict(trace="default", c=32, method="dspark", requests=256, prefix=False, pool=12, keep=12),
    "default-c256": dict(trace="default", c=256, method="dspark", requests=2048, prefix=False, pool=12, keep=12),
}
# --later: the trace slice (START:END s) of each case's second checking set
LATER_WINDOW = {
    "mooncake": "1800:3600",
    "azure": "1800:3600",
    "default-c1": "48:100",
    "default-c32": "24:100",
    "default-c256": None,
}


def later_window(case: str) -> str | None:
    return LATER_WINDOW[case] if case in LATER_WINDOW else LATER_WINDOW[case.split("-")[0]]


MODELS = ("llama-3.1-8b", "qwen3-8b", "qwen3-14b", "qwen3-32b")


def sample_steady(rows: list[dict], pool: int, keep: int) -> list[dict]:
    """Every k-th steady-state step (at least 0.9 of the largest batch, past the first eighth), pool
    of them, then keep of those evenly spaced (first and last included)."""
    full = max(len(r["q"]) for r in rows)
    mid = [r for r in rows if len(r["q"]) >= 0.9 * full]
    mid = mid[len(mid) // 8 :]
    stride = max(1, len(mid) // pool)
    picked = mid[::stride][:pool]
    if len(picked) <= keep:
        return picked
    return [picked[i] for i in sorted({round(i * (len(picked) - 1) / (keep - 1)) for i in range(keep)})]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument(
        "--cases", nargs="+", default=[c for c in CASES if not c.startswith("default")], help="case names, or 'all'"
    )
    ap.add_argument("--seed", type=int, default=0, help="dsim's seed (default 0: the first checking set)")
    ap.add_argument("--later", action="store_true", help="each case's later trace slice (LATER_WINDOW)")
    ap.add_argument("--profile", default="h200-{model}", help="profile name or path ({model}: the model)")
    ap.add_argument("--out", default=str(ROOT / "archive" / "h200" / "steplogs"))
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = list(CASES) if a.cases == ["all"] else a.cases
    for model in a.models:
        for case in cases:
            cs = CASES[case]
            with tempfile.TemporaryDirectory() as td:
                log = Path(td) / "steps.jsonl"
                cmd = [sys.executable, "-m", "dsim", "simulate", "--trace", cs["trace"]]
                cmd += ["--profile", a.profile.replace("{model}", model), "--gpus-per-node", "1"]
                cmd += ["--method", cs["method"], "--concurrency", str(cs["c"]), "--requests", str(cs["requests"])]
                cmd += ["--seed", str(a.seed), "--quiet", "--step-log", str(log)]
                cmd += ["--prefix-caching"] if cs["prefix"] else []
                win = later_window(case) if a.later else None
                cmd += ["--window", win] if win else []
                subprocess.run(cmd, check=True, cwd=ROOT)
                rows = [json.loads(x) for x in log.read_text().splitlines()]
            tag = dict(seed=a.seed, window=win) if a.later or a.seed else {}
            keep = [dict(r, concurrency=cs["c"], case=case, **tag) for r in sample_steady(rows, cs["pool"], cs["keep"])]
            path = out / f"{case}-{model}.jsonl"
            from dsim.outputs import write_file  # (dsim is on sys.path by now)

            write_file(path, "".join(json.dumps(r) + "\n" for r in keep), "output")
            print(
                path,
                len(keep),
                "of",
                len(rows),
                "steps; tokens",
                min(sum(r["q"]) for r in keep),
                "-",
                max(sum(r["q"]) for r in keep),
                "; max context",
                max(max(r["ctx"]) for r in keep),
                flush=True,
            )


if __name__ == "__main__":
    main()
