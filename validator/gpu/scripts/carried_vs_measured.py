"""How well a kernel table carried to another GPU by the roofline ratio (dsim.profiling.kernel_tables
.carried_table, ``NAME@HW``) prices that GPU's own measurement of the same op records, per op kind.

    python3 validator/gpu/scripts/carried_vs_measured.py archive/kernels/h100-torch-partial/h100-torch.json \\
        --table h200-torch --source h200 --target h100

Prints, per op kind, the records compared and carried / measured (median, 10th and 90th percentile),
and the share within 10 %. Records under --min-ms (launch-bound, timer noise) are left out."""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from dsim.profiling.kernel_tables import carried_table, load_kernel_table  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("measured", help="a priced run (validator.gpu.moe_ops price --out) on the target GPU")
    ap.add_argument("--table", default="h200-torch", help="the source GPU's kernel table")
    ap.add_argument("--source", default="h200")
    ap.add_argument("--target", default="h100")
    ap.add_argument("--min-ms", type=float, default=0.005)
    a = ap.parse_args(argv)
    carried = carried_table(load_kernel_table(a.table), a.source, a.target)
    with open(a.measured) as f:
        measured = json.load(f)["records"]
    ratios: dict[str, list[float]] = defaultdict(list)
    for r in measured:
        c = carried.ms({k: v for k, v in r.items() if k not in ("ms", "note")})
        if c and r["ms"] > a.min_ms:
            ratios[r["op"]].append(c / r["ms"])
    print(f"{'op':14s} {'records':>7s}  carried/measured median  p10    p90    within 10 %")
    rows = sorted(ratios.items(), key=lambda kv: -len(kv[1])) + [("all", [x for v in ratios.values() for x in v])]
    for op, v in rows:
        x = np.array(v)
        q10, q50, q90 = np.percentile(x, [10, 50, 90])
        print(f"{op:14s} {len(x):7d}  {q50:23.3f}  {q10:.3f}  {q90:.3f}  {np.mean(np.abs(x - 1) < 0.1):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
