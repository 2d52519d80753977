"""Step logs of mixed DSpark workloads for the GPU step replay (target: median error <= 3% at
concurrency 1, 32 and 256; docs/user/gpu-profiling.md).

    python benchmarks/make_replay_steplogs.py            # writes archive/h200/steplogs/*.jsonl
    python benchmarks/make_replay_steplogs.py --models qwen3-8b --profile PATH.yaml --out DIR

For each measured H200 profile and each concurrency: `dsim simulate` closed loop on the default
(mixed math/code/chat) trace with DSpark adaptive, one GPU per replica, then every k-th of the
steady-state steps (running at least 0.9 C requests, past the first eighth) is kept, 24 per file. The
replayer runs these exact shapes on the GPU: python3 -m validator.gpu.replay FILE --model CONFIG.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("llama-3.1-8b", "qwen3-8b", "qwen3-32b")
CONCURRENCY = (1, 32, 256)
KEEP = 24


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--out", default=str(ROOT / "archive" / "h200" / "steplogs"))
    ap.add_argument(
        "--profile",
        default="h200-{model}",
        help="profile name or YAML path dsim simulates with ({model}: the model name)",
    )
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for model in a.models:
        for c in CONCURRENCY:
            with tempfile.TemporaryDirectory() as td:
                log = Path(td) / "steps.jsonl"
                cmd = [
                    sys.executable,
                    "-m",
                    "dsim",
                    "simulate",
                    "--profile",
                    a.profile.replace("{model}", model),
                    "--gpus-per-node",
                    "1",
                    "--method",
                    "dspark",
                    "--concurrency",
                    str(c),
                    "--requests",
                    str(max(8 * c, 40)),
                    "--seed",
                    "0",
                    "--quiet",
                    "--step-log",
                    str(log),
                ]
                subprocess.run(cmd, check=True, cwd=ROOT)
                rows = [json.loads(x) for x in log.read_text().splitlines()]
            # Steady state: steps that run (nearly) all C users, past warm-up and before the drain.
            # (a model whose KV cache cannot hold C users runs fewer: take its largest batches)
            full = min(c, max(len(r["q"]) for r in rows))
            mid = [r for r in rows if len(r["q"]) >= 0.9 * full]
            mid = mid[len(mid) // 8 :]
            stride = max(1, len(mid) // KEEP)
            keep = [dict(r, concurrency=c) for r in mid[::stride][:KEEP]]
            path = out / f"dspark-{model}-c{c}.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in keep))
            print(
                path,
                len(keep),
                "steps of",
                len(rows),
                "requests per step",
                min(len(r["q"]) for r in keep),
                "-",
                max(len(r["q"]) for r in keep),
                "tokens",
                min(sum(r["q"]) for r in keep),
                "-",
                max(sum(r["q"]) for r in keep),
            )


if __name__ == "__main__":
    main()
