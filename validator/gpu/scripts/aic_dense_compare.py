"""The dense GEMMs of one decoder step as vLLM 0.24's kernels take them on a GPU (the H200 by
default), from AIConfigurator's silicon tables (dsim.profiling.aic_pricing; needs the aic extra), against the
executor's measured dense path on the same GPU (scripts/executor_check.py records, context-1 steps).

    python3 validator/gpu/scripts/aic_dense_compare.py [--model llama-3.1-8b] [--executor FILE] [--system h100_sxm]

Per step of n tokens: layers x (QKV, O, gate/up, down) + LM head, bf16, priced by AIC (CUDA-graph
GEMM rows). Printed per n: AIC's GEMM sum, the executor's eager and compiled times, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> None:
    from dsim.profiling.aic_pricing import AicTables
    from validator.gpu.plan import model_dims

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--executor", default=str(ROOT / "archive" / "h200" / "executor-llama-3.1-8b.json"))
    ap.add_argument("--system", default="h200_sxm", help="AIC's system (h100_sxm for archive/h100/executor-*.json)")
    a = ap.parse_args(argv)
    d = model_dims(json.loads((ROOT / "profiles" / "models" / f"{a.model}.json").read_text()))
    h, H, kv, hd, inter, V, L = (d[k] for k in ("hidden", "heads", "kv_heads", "head_dim", "inter", "vocab", "layers"))
    t = AicTables(a.system)
    gemms = [((H + 2 * kv) * hd, h), (h, H * hd), (2 * inter, h), (h, inter)]
    rows = json.loads(Path(a.executor).read_text())["rows"]
    meas = {(r["variant"], r["n"]): r for r in rows if r["step"] == "ctx1"}
    out = []
    for n in sorted({r["n"] for r in rows}):
        layer = sum(t.gemm(dict(dtype="bf16", m=n, n=o, k=i)).ms for o, i in gemms)
        head = t.gemm(dict(dtype="bf16", m=n, n=V, k=h)).ms
        aic = L * layer + head
        e, c = meas.get(("eager", n)), meas.get(("compiled", n))
        rec = dict(
            n=n,
            aic_gemm_ms=round(aic, 3),
            eager_ms=round(e["ms"], 3) if e else None,
            compiled_ms=round(c["ms"], 3) if c else None,
            eager_kernels_per_layer=e["kernels_per_layer"] if e else None,
            compiled_kernels_per_layer=c["kernels_per_layer"] if c else None,
        )
        out.append(rec)
        print(json.dumps(rec))


if __name__ == "__main__":
    main()
