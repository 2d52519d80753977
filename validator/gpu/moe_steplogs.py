"""Step logs for the MoE shard replay: dsim's own DSpark steps on a composed shard-check profile.

    python3 -m validator.gpu.moe_steplogs --profile SHARD_CHECK.yaml --out DIR [--prefix dspark-v4f]

One attention rank (dsim's replica of a dp profile is one GPU): `dsim simulate --gpus-per-node 1
--method dspark` closed loop at concurrency 1, 32 and 256 on the default trace, and 32 users on
mooncake-conversation (long contexts, 1K-90K tokens); of the steady-state steps (running at least
0.9 C requests, past the first eighth of them) every k-th is kept, 16 per file. The shard executor
(`python3 -m validator.gpu.moe_shard replay`) runs these exact shapes; `validator.gpu.shard_repredict`
prices them again with any profile.

    python3 -m validator.gpu.moe_steplogs --design prefill --out DIR

writes `prefill-design.jsonl` instead: fixed step shapes that separate what a prompt chunk costs alone,
beside a few or many decode/verify requests, and split into several chunks (a design set for the
prefill terms, not a replay of dsim's steps).

    python3 -m validator.gpu.moe_steplogs --design pool --out DIR

writes `pool-design.jsonl`: decode-only steps in sets that differ only in how many compressed-cache
blocks their requests complete (``pool_design_steps``), the design set of a profile's ``block_pool``
term (``validator.gpu.shard_repredict fit-pool``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from dsim.outputs import write_file

WORKLOADS = (
    ("c1", "default", 1),
    ("c32", "default", 32),
    ("c256", "default", 256),
    ("long", "mooncake-conversation", 32),
)
KEEP = 16


def steplog(profile: str, trace: str, concurrency: int, seed: int = 0) -> list[dict]:
    with tempfile.TemporaryDirectory() as td:
        log = Path(td) / "steps.jsonl"
        cmd = [
            sys.executable, "-m", "dsim", "simulate", "--profile", profile, "--trace", trace,
            "--gpus-per-node", "1", "--method", "dspark", "--concurrency", str(concurrency),
            "--requests", str(max(8 * concurrency, 40)), "--seed", str(seed), "--quiet", "--step-log", str(log),
        ]  # fmt: skip
        subprocess.run(cmd, check=True)
        rows = [json.loads(x) for x in log.read_text().splitlines()]
    full = min(concurrency, max(len(r["q"]) for r in rows))
    mid = [r for r in rows if len(r["q"]) >= 0.9 * full]
    mid = mid[len(mid) // 8 :]
    stride = max(1, len(mid) // KEEP)
    return [dict(r, concurrency=concurrency, trace=trace) for r in mid[::stride][:KEEP]]


def prefill_design_steps(seed: int = 0) -> list[dict]:
    """Prompt chunks (query tokens, cached tokens) alone, beside 32 verify requests of 7 tokens, and beside
    232 of 6 (contexts 300-3,500, seeded), whole and split into chunks of the same total; cheapest first."""
    import numpy as np

    rng = np.random.default_rng(seed)
    d32 = [(7, int(c)) for c in rng.integers(300, 3500, 32)]
    d232 = [(6, int(c)) for c in rng.integers(300, 3500, 232)]
    shapes = [
        ("P512", [], [(512, 0)]),
        ("P2048", [], [(2048, 0)]),
        ("4xP512", [], [(512, 0)] * 4),
        ("D32", d32, []),
        ("D32+P256", d32, [(256, 0)]),
        ("D32+P1024", d32, [(1024, 0)]),
        ("D32+P2048", d32, [(2048, 0)]),
        ("D32+4xP512", d32, [(512, 0)] * 4),
        ("D32+P2048@4096", d32, [(2048, 4096)]),
        ("D232", d232, []),
        ("D232+P1536", d232, [(1536, 0)]),
        ("D232+6xP1024", d232, [(1024, 0)] * 6),
    ]
    return [
        dict(step=i, shape=name, q=[q for q, _ in dec + ch], ctx=[c for _, c in dec + ch], concurrency=len(dec) or None)
        for i, (name, dec, ch) in enumerate(shapes)
    ]


POOL_BASE_OFFSET = 100  # a context's position in its 128-token block: 100 + q < 128 completes none


def pool_design_steps(seed: int = 0) -> list[dict]:
    """Decode-only steps that differ only in the compressed-cache blocks their requests complete.

    Every request of a set has the same query tokens q and a context (b x 128 + offset), its block
    b drawn once per batch size (2-27: contexts of 356-3,583 tokens; 38-40 for the long set) and
    shared by the set, so the steps of a set read the same KV within 27 tokens a request. Offset
    100 completes no block of 128 for q <= 27 and, for q = 1 or 2, none of 4 (from q = 4 every
    request completes blocks of 4, as the kernel table's records do); 124 with q = 8 completes one
    block of 128; with q = 1, 103 completes one block of 4 and 127 one of each; with q = 2, 102 one
    of 4. ``shape`` names the set (B requests x q tokens, L: the long contexts) and which requests
    complete what (``n``: none, ``h<k>``: k requests a block of 128, ``c<k>``: k requests one of 4
    only)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    steps: list[dict] = []

    def add(name: str, q: int, blocks: list[int], offs: list[int]) -> None:
        ctx = [b * 128 + o for b, o in zip(blocks, offs)]
        steps.append(dict(step=len(steps), shape=name, q=[q] * len(ctx), ctx=ctx, concurrency=len(ctx)))

    def sets(B: int, q: int, variants: list[tuple[str, int, int]], long: bool = False) -> None:
        blocks = [int(b) for b in rng.integers(38, 41, B)] if long else [int(b) for b in rng.integers(2, 28, B)]
        for tag, k, off in variants:
            offs = [off] * k + [POOL_BASE_OFFSET] * (B - k)
            add(f"B{B}q{q}{'L' if long else ''}-{tag}", q, blocks, offs)

    n = ("n", 0, POOL_BASE_OFFSET)
    sets(1, 8, [n, ("h1", 1, 124)])
    sets(1, 8, [n, ("h1", 1, 124)], long=True)
    sets(8, 8, [n, ("h1", 1, 124), ("h8", 8, 124)])
    sets(32, 8, [n, ("h1", 1, 124), ("h4", 4, 124), ("h32", 32, 124)])
    sets(256, 8, [n, ("h16", 16, 124), ("h256", 256, 124)])
    sets(1, 1, [n, ("c1", 1, 103), ("h1", 1, 127)])
    sets(8, 1, [n, ("c1", 1, 103), ("c8", 8, 103), ("h1", 1, 127)])
    sets(32, 1, [n, ("c1", 1, 103), ("c32", 32, 103), ("h1", 1, 127)])
    sets(256, 1, [n, ("c1", 1, 103), ("c64", 64, 103), ("h2", 2, 127)])
    sets(32, 2, [n, ("c32", 32, 102)])
    return steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m validator.gpu.moe_steplogs", description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default=None, help="the shard-check profile the steps are simulated on")
    ap.add_argument("--design", choices=("prefill", "pool"), default=None, help="write a fixed design set instead")
    ap.add_argument("--out", required=True)
    ap.add_argument("--prefix", default="dspark-v4f")
    ap.add_argument("--seed", type=int, default=0, help="simulation seed (another seed: another slice of the trace)")
    ap.add_argument("--only", default="", help="comma-separated workload tags to write (default: all)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.design:
        path = out / f"{a.design}-design.jsonl"
        steps = prefill_design_steps(a.seed) if a.design == "prefill" else pool_design_steps(a.seed)
        write_file(path, "".join(json.dumps(r) + "\n" for r in steps), "output")
        print(path, len(steps), "steps")
        return 0
    if not a.profile:
        print("error: --profile: required (or --design prefill|pool)", file=sys.stderr)
        return 2
    only = set(filter(None, a.only.split(",")))
    for tag, trace, c in WORKLOADS:
        if only and tag not in only:
            continue
        keep = steplog(a.profile, trace, c, seed=a.seed)
        path = out / f"{a.prefix}-{tag}.jsonl"
        write_file(path, "".join(json.dumps(r) + "\n" for r in keep), "output")
        print(path, len(keep), "steps; tokens", min(sum(r["q"]) for r in keep), "-", max(sum(r["q"]) for r in keep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
