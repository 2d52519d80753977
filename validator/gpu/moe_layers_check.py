"""Each measured `layer` record against the composer's ops for one layer of that kind, without a GPU.

    python3 -m validator.gpu.moe_layers_check LAYERS.json [...] --kernels h200-torch --out FILE.json

The composer's sum (dsim.profiling.forward.composed_layer_ms: the layer's ops priced from the kernel table with
communication at 0, the lockstep factor on the routed experts, the graph gap; no fitted glue) next to
the shard executor's measurement, shape by shape.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from dsim.errors import InputError
from dsim.outputs import write_file
from dsim.profiling.forward import composed_layer_ms
from dsim.profiling.kernel_tables import Roofline, load_kernel_table
from dsim.profiling.models import load_model
from dsim.profiling.pricer import Pricer
from dsim.profiling.topology import parse_topology


def check(paths: list[str], kernels: str) -> dict:
    tables = [load_kernel_table(k.strip()) for k in kernels.split(",") if k.strip()]
    rows = []
    for path in paths:
        for r in json.loads(Path(path).read_text())["records"]:
            model, topo = load_model(r["model"]), parse_topology(r["topology"])
            pricer = Pricer(tables, Roofline(hardware="h200"), frozenset({"comm"}))
            c = composed_layer_ms(model, topo, "h200", r, pricer)
            rows.append(
                dict(
                    model=r["model"],
                    topology=r["topology"],
                    attn_kind=r["attn_kind"],
                    batch=r["batch"],
                    q=r["q"],
                    kv=r["kv"],
                    measured_ms=r["ms"],
                    composed_ms=round(c, 5),
                    composed_minus_measured_pct=round((c / r["ms"] - 1) * 100, 1),
                )
            )
    summary = {}
    for m in sorted({r["model"] for r in rows}):
        e = np.array([r["composed_minus_measured_pct"] for r in rows if r["model"] == m])
        summary[m] = dict(
            records=len(e),
            median_abs_pct=round(float(np.median(np.abs(e))), 1),
            signed_mean_pct=round(float(e.mean()), 1),
        )
    return dict(
        method="each layer check record against the composer's ops for one layer of that kind (dsim.profiling.kernel_ops.layer_ops, "
        f"priced from {kernels} with communication at 0, lockstep factor on the routed experts, 4 us graph gap; no glue)",
        command="python3 -m validator.gpu.moe_layers_check " + " ".join(paths) + f" --kernels {kernels}",
        summary=summary,
        rows=rows,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m validator.gpu.moe_layers_check", description=__doc__.split("\n")[0])
    ap.add_argument("layers", nargs="+")
    ap.add_argument("--kernels", default="h200-torch")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    try:
        res = check(a.layers, a.kernels)
    except (InputError, OSError, KeyError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = json.dumps(res, indent=1)
    if a.out:
        write_file(a.out, text + "\n", "output")
    print(json.dumps(res["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
